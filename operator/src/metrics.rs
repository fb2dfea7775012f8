//! Prometheus metrics of the operator: reconciliations, failures by error variant and
//! reconcile duration.

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
