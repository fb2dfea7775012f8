//! The worker's Prometheus metrics. One process-wide set: the engine thread updates
//! them, `/metrics` encodes them. Labels are the task (and store); record counts are
//! counters, restore progress and store sizes gauges.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabel {
    pub task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabel {
    pub task: String,
    pub store: String,
}

pub struct Metrics {
    pub records_in: Family<TaskLabel, Counter>,
    pub records_out: Family<TaskLabel, Counter>,
    pub dead_letters: Family<TaskLabel, Counter>,
    pub skipped: Family<TaskLabel, Counter>,
    pub late_dropped: Counter,
    pub commits: Family<TaskLabel, Counter>,
    pub commit_seconds: Histogram,
    pub restore_restored: Family<TaskLabel, Gauge>,
    pub restore_remaining: Family<TaskLabel, Gauge>,
    pub restore_rate: Family<TaskLabel, Gauge>,
    pub store_bytes: Family<StoreLabel, Gauge>,
    pub lag: Family<TaskLabel, Gauge>,
    registry: Registry,
}

pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut registry = Registry::with_prefix("oxbow_worker");
    let m = Metrics {
        records_in: Family::default(),
        records_out: Family::default(),
        dead_letters: Family::default(),
        skipped: Family::default(),
        late_dropped: Counter::default(),
        commits: Family::default(),
        commit_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
        restore_restored: Family::default(),
        restore_remaining: Family::default(),
        restore_rate: Family::default(),
        store_bytes: Family::default(),
        lag: Family::default(),
        registry: Registry::default(),
    };
    registry.register("records_in", "Source records read", m.records_in.clone());
    registry.register(
        "records_out",
        "Records produced to the sink",
        m.records_out.clone(),
    );
    registry.register(
        "dead_letters",
        "Records sent to the dead-letter topic",
        m.dead_letters.clone(),
    );
    registry.register(
        "skipped",
        "Records dropped by the skip error policy",
        m.skipped.clone(),
    );
    registry.register(
        "late_records_dropped",
        "Records whose every window had closed",
        m.late_dropped.clone(),
    );
    registry.register("commits", "Units of work committed", m.commits.clone());
    registry.register(
        "commit_seconds",
        "Time to commit a unit of work (Kafka and RocksDB)",
        m.commit_seconds.clone(),
    );
    registry.register(
        "restore_restored_records",
        "Changelog records restored in the current restore",
        m.restore_restored.clone(),
    );
    registry.register(
        "restore_remaining_records",
        "Changelog records left to restore",
        m.restore_remaining.clone(),
    );
    registry.register(
        "restore_records_per_second",
        "Restore rate",
        m.restore_rate.clone(),
    );
    registry.register(
        "store_bytes",
        "Estimated live bytes per store",
        m.store_bytes.clone(),
    );
    registry.register(
        "lag_records",
        "Source records not yet processed",
        m.lag.clone(),
    );
    Metrics { registry, ..m }
});

pub fn task(t: oxbow_crds::TaskId) -> TaskLabel {
    TaskLabel {
        task: t.to_string(),
    }
}

pub fn late_record() {
    METRICS.late_dropped.inc();
}

pub fn encode() -> String {
    let mut s = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut s, &METRICS.registry);
    s
}
