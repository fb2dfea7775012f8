//! Prometheus metrics of the operator: reconciliations, failures by error variant,
//! reconcile duration, and the requests it sends to the Kubernetes API.

use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

/// A request to the Kubernetes API by kind: the HTTP method, or `watch` for a GET that
/// opens a watch (long-lived, so counted apart from reads).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequestLabels {
    pub verb: String,
}

impl ApiRequestLabels {
    /// The label of a request with this method and query string.
    pub fn of(method: &str, query: Option<&str>) -> Self {
        let watch =
            query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        let verb = if watch && method == "GET" {
            "watch".to_string()
        } else {
            method.to_ascii_lowercase()
        };
        Self { verb }
    }
}

/// Counts requests to the Kubernetes API; a layer on the client's stack feeds it (see
/// [`count_api_requests`]), so every request the operator sends is in it.
pub type ApiRequests = Family<ApiRequestLabels, Counter>;

/// A layer for kube's `ClientBuilder` that counts each request in `requests`.
pub fn count_api_requests(
    requests: ApiRequests,
) -> tower::util::MapRequestLayer<
    impl Fn(http::Request<kube::client::Body>) -> http::Request<kube::client::Body> + Clone,
> {
    tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        requests
            .get_or_create(&ApiRequestLabels::of(
                req.method().as_str(),
                req.uri().query(),
            ))
            .inc();
        req
    })
}

pub struct Metrics {
    pub reconciliations: Counter,
    pub failures: Family<ErrorLabels, Counter>,
    pub duration: Histogram,
    registry: Mutex<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        let reconciliations = Counter::default();
        let failures = Family::<ErrorLabels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let mut registry = Registry::with_prefix("oxbow_operator");
        registry.register(
            "reconciliations",
            "StreamApp reconciliations started",
            reconciliations.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Failed reconciliations by error variant",
            failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconciliation",
            duration.clone(),
        );
        Self {
            reconciliations,
            failures,
            duration,
            registry: Mutex::new(registry),
        }
    }
}

impl Metrics {
    pub fn start(&self) -> ReconcileTimer<'_> {
        self.reconciliations.inc();
        ReconcileTimer {
            metrics: self,
            start: Instant::now(),
        }
    }

    pub fn failed(&self, variant: &str) {
        self.failures
            .get_or_create(&ErrorLabels {
                error: variant.into(),
            })
            .inc();
    }

    /// Exposes the API request counts of the client the operator was built with.
    pub fn register_api_requests(&self, requests: ApiRequests) {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        registry.register(
            "api_requests",
            "Requests sent to the Kubernetes API, by verb (watch: a GET that opens a watch)",
            requests,
        );
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out = "# failed to encode metrics\n".into();
        }
        out
    }
}

/// Observes the reconcile duration when dropped.
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .duration
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_with_watch_true_counts_as_a_watch_and_other_verbs_by_method() {
        assert_eq!(
            ApiRequestLabels::of("GET", Some("labelSelector=a&watch=true")).verb,
            "watch"
        );
        assert_eq!(ApiRequestLabels::of("GET", Some("watch=false")).verb, "get");
        assert_eq!(ApiRequestLabels::of("GET", None).verb, "get");
        assert_eq!(
            ApiRequestLabels::of("PATCH", Some("fieldManager=x")).verb,
            "patch"
        );
    }

    #[test]
    fn api_request_counts_appear_in_the_exposition_once_registered() {
        let metrics = Metrics::default();
        let requests = ApiRequests::default();
        metrics.register_api_requests(requests.clone());
        requests
            .get_or_create(&ApiRequestLabels::of("PATCH", None))
            .inc();
        let text = metrics.encode();
        assert!(
            text.contains("oxbow_operator_api_requests_total{verb=\"patch\"} 1"),
            "no patch count in {text}"
        );
    }
}
