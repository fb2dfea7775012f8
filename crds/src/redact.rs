//! Which Kafka client values are secret, and their removal from text that leaves the
//! process (errors, conditions, events, `lastError`, log lines). librdkafka quotes a
//! refused property's value in its error, so any error text built from a client
//! configuration can carry a password or a private key.
//!
//! The rule: every value that came from the Secret of `spec.kafka.secretRef` is secret,
//! and so is any value of a property whose name marks it as sensitive, wherever it was
//! set. The few properties whose values are enumerations that name no secret
//! (`security.protocol`, `sasl.mechanism`, …) stay visible even from the Secret:
//! redacting "SSL" or "PLAIN" would mangle every message and hide nothing.
//!
//! This module owns that rule and the text substitution; it performs no I/O.

use std::collections::BTreeMap;

/// What a secret value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Properties whose values are enumerations, never secrets.
const PUBLIC_ENUMS: &[&str] = &[
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "ssl.endpoint.identification.algorithm",
    "sasl.oauthbearer.method",
];

fn is_public_enum(name: &str) -> bool {
    PUBLIC_ENUMS.contains(&name.to_ascii_lowercase().as_str())
}

/// Whether a property's name marks its value as sensitive: `*.password`, `*.key*`,
/// `sasl.*`, `ssl.*.pem`, `*secret*`, `*token*`.
pub fn is_sensitive(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    if is_public_enum(&n) {
        return false;
    }
    n.ends_with(".password")
        || n.contains(".key")
        || n.starts_with("sasl.")
        || (n.starts_with("ssl.") && n.ends_with(".pem"))
        || n.contains("secret")
        || n.contains("token")
}

/// The secret values of one client configuration, to remove from text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    /// Longest first, so a value that contains another is replaced whole.
    secrets: Vec<String>,
}

impl Redactor {
    /// `properties`: every property in effect; `from_secret`: the names that came from
    /// the Secret.
    pub fn new<'a>(
        properties: &BTreeMap<String, String>,
        from_secret: impl IntoIterator<Item = &'a String>,
    ) -> Self {
        let from_secret: Vec<&String> = from_secret.into_iter().collect();
        let mut secrets: Vec<String> = Vec::new();
        for (name, value) in properties {
            let secret =
                is_sensitive(name) || (from_secret.contains(&name) && !is_public_enum(name));
            if !secret {
                continue;
            }
            secrets.push(value.clone());
            // A PEM value (or any multi-line one) may be quoted in part: each line of
            // substance is secret on its own.
            secrets.extend(
                value
                    .lines()
                    .map(str::trim)
                    .filter(|l| l.len() >= 16 && !l.starts_with("-----"))
                    .map(str::to_string),
            );
        }
        // An empty or one-character value would redact half of every message.
        secrets.retain(|s| s.trim().len() >= 2);
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Self { secrets }
    }

    /// `text` with every secret value replaced by [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn names_that_mark_a_value_sensitive_are_recognised() {
        for n in [
            "sasl.password",
            "sasl.username",
            "sasl.jaas.config",
            "ssl.key.password",
            "ssl.key.pem",
            "ssl.keystore.password",
            "ssl.certificate.pem",
            "sasl.oauthbearer.client.secret",
            "my.token.value",
        ] {
            assert!(is_sensitive(n), "{n}");
        }
        for n in [
            "security.protocol",
            "sasl.mechanism",
            "bootstrap.servers",
            "linger.ms",
            "ssl.ca.location",
        ] {
            assert!(!is_sensitive(n), "{n}");
        }
    }

    #[test]
    fn a_refused_value_quoted_by_librdkafka_is_redacted() {
        let p = props(&[("sasl.password", "hunter2-sentinel"), ("linger.ms", "5")]);
        let r = Redactor::new(&p, []);
        let msg = r#"Invalid value "hunter2-sentinel" for configuration property "sasl.password""#;
        assert_eq!(
            r.redact(msg),
            r#"Invalid value "[redacted]" for configuration property "sasl.password""#
        );
    }

    #[test]
    fn every_value_from_the_secret_is_secret_but_enumerations_stay_readable() {
        let p = props(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("client.rack", "rack-with-a-secret-name"),
        ]);
        let names: Vec<String> = p.keys().cloned().collect();
        let r = Redactor::new(&p, &names);
        assert_eq!(
            r.redact("SASL_SSL with SCRAM-SHA-512 from rack-with-a-secret-name"),
            "SASL_SSL with SCRAM-SHA-512 from [redacted]"
        );
    }

    #[test]
    fn a_line_of_a_private_key_quoted_alone_is_redacted() {
        let pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDWIT257Ma28\nAbCdEfGhIjKlMnOpQrStUvWxYz0123456789\n-----END PRIVATE KEY-----";
        let r = Redactor::new(&props(&[("ssl.key.pem", pem)]), []);
        assert_eq!(
            r.redact("bad key near MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDWIT257Ma28"),
            "bad key near [redacted]"
        );
        assert_eq!(r.redact(pem), "[redacted]");
        assert_eq!(
            r.redact("-----BEGIN PRIVATE KEY-----"),
            "-----BEGIN PRIVATE KEY-----"
        );
    }
}
