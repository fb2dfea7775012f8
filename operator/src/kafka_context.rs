//! What a Kafka client's failed request does not say: librdkafka reports a refused
//! authentication or a failed TLS handshake to the client's error callback, and the
//! request that needed the connection then fails only with a timeout or "all brokers
//! down". This context remembers the last such problem, so the operator can tell the
//! user which one it is (a wrong password, an untrusted certificate) instead of
//! "unreachable".
//!
//! It owns the classification (pure) and the memory of the last problem; it performs
//! no I/O and must not retry anything (librdkafka's reconnect backoff does).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// A connection problem that retrying with the same configuration will not fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionProblem {
    /// SASL refused: wrong mechanism, user or password.
    Authentication(String),
    /// The TLS handshake failed: the broker's certificate is not trusted or does not
    /// match its address, or the broker refused the client's certificate.
    Tls(String),
}

/// The problem an error callback reports, if it is one of the above.
pub fn classify(code: Option<RDKafkaErrorCode>, reason: &str) -> Option<ConnectionProblem> {
    match code {
        Some(RDKafkaErrorCode::Authentication)
        | Some(RDKafkaErrorCode::SaslAuthenticationFailed) => {
            Some(ConnectionProblem::Authentication(reason.to_string()))
        }
        Some(RDKafkaErrorCode::SSL) => Some(ConnectionProblem::Tls(reason.to_string())),
        // A broker that refuses the client certificate sends a TLS alert after the
        // handshake; librdkafka reports it as a transport error quoting OpenSSL.
        _ if [
            "SSL handshake failed",
            "SSL transport error",
            "SSL routines",
            "SSL alert",
        ]
        .iter()
        .any(|w| reason.contains(w)) =>
        {
            Some(ConnectionProblem::Tls(reason.to_string()))
        }
        _ => None,
    }
}

/// How long a reported problem explains a failed request.
const RECENT: Duration = Duration::from_secs(120);

/// The client context of the operator's Kafka clients.
#[derive(Default)]
pub struct ConnectionContext {
    last: Mutex<Option<(Instant, ConnectionProblem)>>,
}

impl ConnectionContext {
    /// The last problem reported within the last two minutes.
    pub fn recent_problem(&self) -> Option<ConnectionProblem> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref()
            .filter(|(at, _)| at.elapsed() < RECENT)
            .map(|(_, p)| p.clone())
    }
}

impl ClientContext for ConnectionContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(error = %error, reason, "Kafka client error");
        if let Some(p) = classify(error.rdkafka_error_code(), reason) {
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), p));
        }
    }
}

impl ConsumerContext for ConnectionContext {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_sasl_login_is_an_authentication_problem() {
        let r = "SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512";
        assert_eq!(
            classify(Some(RDKafkaErrorCode::Authentication), r),
            Some(ConnectionProblem::Authentication(r.into()))
        );
    }

    #[test]
    fn a_failed_handshake_is_a_tls_problem_whatever_the_code() {
        let r = "ssl://127.0.0.1:19095/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed";
        assert_eq!(
            classify(Some(RDKafkaErrorCode::SSL), r),
            Some(ConnectionProblem::Tls(r.into()))
        );
        // What librdkafka 2.12 reports when the broker refuses the client certificate.
        let refused = "ssl://127.0.0.1:19095/bootstrap: Receive failed: error:0A000412:SSL routines::sslv3 alert bad certificate: SSL alert number 42 (after 5ms in state APIVERSION_QUERY)";
        assert_eq!(
            classify(Some(RDKafkaErrorCode::BrokerTransportFailure), refused),
            Some(ConnectionProblem::Tls(refused.into()))
        );
    }

    #[test]
    fn a_broker_that_is_down_is_neither() {
        assert_eq!(
            classify(
                Some(RDKafkaErrorCode::BrokerTransportFailure),
                "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused"
            ),
            None
        );
        assert_eq!(
            classify(
                Some(RDKafkaErrorCode::AllBrokersDown),
                "1/1 brokers are down"
            ),
            None
        );
    }
}
