//! The worker's Prometheus metrics. One process-wide set: the engine thread updates
//! them, `/metrics` encodes them. Labels are the task (and store); record counts are
//! counters, restore progress and store sizes gauges.
//!
//! A gauge keeps the last value set, so a task's gauges are removed when the task
//! leaves the pod ([`forget_task`], [`RestoreGauges`]): otherwise the pod would go on
//! reporting the lag and restore of a task another pod now runs, and sums over pods
//! would count it twice. Counters stay: they only grow, and `rate()` over them is right
//! whichever pod runs the task.

use std::sync::LazyLock;

use oxbow_crds::{StoreName, TaskId};

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuarantineLabel {
    pub task: String,
    /// `unreadable`, `foreign` or `bad_identity`.
    pub reason: String,
}

pub struct Metrics {
    pub records_in: Family<TaskLabel, Counter>,
    pub records_out: Family<TaskLabel, Counter>,
    pub dead_letters: Family<TaskLabel, Counter>,
    pub skipped: Family<TaskLabel, Counter>,
    pub replays_dropped: Family<TaskLabel, Counter>,
    pub late_dropped: Counter,
    pub commits: Family<TaskLabel, Counter>,
    pub commit_seconds: Histogram,
    pub restore_restored: Family<TaskLabel, Gauge>,
    pub restore_remaining: Family<TaskLabel, Gauge>,
    pub restore_rate: Family<TaskLabel, Gauge>,
    pub store_bytes: Family<StoreLabel, Gauge>,
    pub lag: Family<TaskLabel, Gauge>,
    pub state_quarantined: Family<QuarantineLabel, Counter>,
    registry: Registry,
}

pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut registry = Registry::with_prefix("oxbow_worker");
    let m = Metrics {
        records_in: Family::default(),
        records_out: Family::default(),
        dead_letters: Family::default(),
        skipped: Family::default(),
        replays_dropped: Family::default(),
        late_dropped: Counter::default(),
        commits: Family::default(),
        commit_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
        restore_restored: Family::default(),
        restore_remaining: Family::default(),
        restore_rate: Family::default(),
        store_bytes: Family::default(),
        lag: Family::default(),
        state_quarantined: Family::default(),
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
        "repartition_replays_dropped",
        "Repartition records an upstream task wrote again after a restart (at-least-once), dropped as already processed",
        m.replays_dropped.clone(),
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
    registry.register(
        "state_quarantined",
        "Task state directories moved aside (unreadable or another task's) and restored from the changelog",
        m.state_quarantined.clone(),
    );
    Metrics { registry, ..m }
});

pub fn task(t: TaskId) -> TaskLabel {
    TaskLabel {
        task: t.to_string(),
    }
}

pub fn store(t: TaskId, s: &StoreName) -> StoreLabel {
    StoreLabel {
        task: t.to_string(),
        store: s.0.clone(),
    }
}

/// Removes the gauges of a task this pod no longer runs (released, dropped as a standby,
/// or promoted: the active's gauges are set afresh).
pub fn forget_task(t: TaskId, stores: &[StoreName]) {
    let label = task(t);
    METRICS.lag.remove(&label);
    forget_restore(&label);
    for s in stores {
        METRICS.store_bytes.remove(&store(t, s));
    }
}

fn forget_restore(label: &TaskLabel) {
    METRICS.restore_restored.remove(label);
    METRICS.restore_remaining.remove(label);
    METRICS.restore_rate.remove(label);
}

/// The restore gauges of one task for the length of a restore. Dropped before
/// [`RestoreGauges::finish`] (a failure, SIGTERM, the task assigned elsewhere
/// meanwhile), it removes them: an alert on records left to restore must not fire for
/// a restore nobody runs any more.
pub struct RestoreGauges {
    label: TaskLabel,
    finished: bool,
}

impl RestoreGauges {
    pub fn start(t: TaskId) -> Self {
        Self {
            label: task(t),
            finished: false,
        }
    }

    pub fn set(&self, restored: u64, remaining: u64, records_per_second: f64) {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        METRICS
            .restore_restored
            .get_or_create(&self.label)
            .set(clamp(restored));
        METRICS
            .restore_remaining
            .get_or_create(&self.label)
            .set(clamp(remaining));
        METRICS
            .restore_rate
            .get_or_create(&self.label)
            .set(records_per_second as i64);
    }

    /// The restore completed: its figures stay, with nothing remaining, while the task
    /// runs here.
    pub fn finish(mut self, restored: u64, records_per_second: f64) {
        self.set(restored, 0, records_per_second);
        self.finished = true;
    }
}

impl Drop for RestoreGauges {
    fn drop(&mut self) {
        if !self.finished {
            forget_restore(&self.label);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    // The registry is process-wide and tests run in parallel: each test uses task ids
    // of its own.

    /// The encoded series that carry this task's label.
    fn series_of(t: u32) -> Vec<String> {
        let needle = format!("task=\"0_{t}\"");
        encode()
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains(&needle))
            .map(str::to_string)
            .collect()
    }

    fn gauges_of(t: u32) -> Vec<String> {
        series_of(t)
            .into_iter()
            .filter(|l| {
                ["lag_records", "store_bytes", "restore_"]
                    .iter()
                    .any(|g| l.starts_with(&format!("oxbow_worker_{g}")))
            })
            .collect()
    }

    fn run_task(t: u32, stores: &[StoreName]) {
        let id = TaskId::new(0, t);
        METRICS.lag.get_or_create(&task(id)).set(42);
        METRICS.records_in.get_or_create(&task(id)).inc();
        for s in stores {
            METRICS.store_bytes.get_or_create(&store(id, s)).set(1000);
        }
        RestoreGauges::start(id).finish(10, 5.0);
    }

    #[test]
    fn a_closed_tasks_gauges_disappear_from_the_scrape_and_its_counters_stay() {
        let stores = [StoreName("seen".into()), StoreName("per-user".into())];
        run_task(9001, &stores);
        run_task(9002, &stores);
        assert_eq!(gauges_of(9001).len(), 6, "{:?}", gauges_of(9001));

        forget_task(TaskId::new(0, 9001), &stores);

        assert_eq!(gauges_of(9001), Vec::<String>::new());
        assert!(
            series_of(9001)
                .iter()
                .any(|l| l.starts_with("oxbow_worker_records_in_total")),
            "{:?}",
            series_of(9001)
        );
        assert_eq!(gauges_of(9002).len(), 6, "another task's gauges stay");
    }

    #[test]
    fn a_restore_that_stops_early_leaves_no_restore_series() {
        let gauges = RestoreGauges::start(TaskId::new(0, 9003));
        gauges.set(100, 900, 50.0);
        assert!(
            series_of(9003)
                .iter()
                .any(|l| l == "oxbow_worker_restore_remaining_records{task=\"0_9003\"} 900"),
            "{:?}",
            series_of(9003)
        );
        // What an early return (an error, a stop, the task moving away) does.
        drop(gauges);
        assert_eq!(series_of(9003), Vec::<String>::new());
    }

    #[test]
    fn a_finished_restore_reports_nothing_remaining() {
        let gauges = RestoreGauges::start(TaskId::new(0, 9004));
        gauges.set(100, 900, 50.0);
        gauges.finish(1000, 80.0);
        let series = series_of(9004);
        assert!(
            series.contains(&"oxbow_worker_restore_remaining_records{task=\"0_9004\"} 0".into())
                && series.contains(
                    &"oxbow_worker_restore_restored_records{task=\"0_9004\"} 1000".into()
                ),
            "{series:?}"
        );
    }
}
