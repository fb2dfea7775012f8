//! The StreamApp's status: what the operator observes (conditions, phase, restoration,
//! topics) and each worker pod's own entry (`instances`). Its doc comments are the
//! CRD's field descriptions.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state. The operator writes everything but `instances`, whose entries each
/// worker pod writes itself.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct StreamAppStatus {
    /// The generation the operator last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The application id in force, recorded at the first reconciliation so a later
    /// change of the default never renames a running app's topics and group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_id: Option<String>,
    /// Ready, Reconciling, Stalled (kstatus) and the detail conditions TopicsReady,
    /// TasksAssigned, WorkloadReady, Restored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Pending, Provisioning, Restoring, Running, Degraded or Failed: for humans; tools
    /// should read conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Worker pods that exist.
    #[serde(default)]
    pub replicas: i32,
    /// Worker pods that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Label selector of the worker pods (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Tasks over all stages: the partition count of the source topics times the
    /// stages (one more per repartition topic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<i32>,
    /// Summed consumer lag over all active tasks, from the workers' reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
    /// The restore in progress over all workers, present while any task restores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restoration: Option<RestorationStatus>,
    /// What each store's data means (`oxbow_crds::layouts`), as last rolled out: a spec
    /// that would read a store's data as something else is refused
    /// (`IncompatibleStateChange`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub store_layouts: BTreeMap<String, String>,
    /// How the workers now write the aggregate stores' values: `binary` for an app
    /// created under this operator, `json` for an app an earlier one ran until every pod
    /// runs a worker that reads both (the operator then moves it on by itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_encoding: Option<StoreEncoding>,
    /// One entry per worker pod, written by that pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["pod".into()]))]
    pub instances: Vec<InstanceStatus>,
    /// The changelog and dead-letter topics and how they compare with the spec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub topics: Vec<TopicStatus>,
}

/// How a worker writes the values of its aggregate stores (and so their changelogs).
/// Every worker since the binary encoding reads both; workers before it read `json`
/// alone, which is why it is the worker's default and the operator chooses.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum StoreEncoding {
    /// JSON text: what every earlier worker wrote and reads.
    #[default]
    Json,
    /// A versioned binary layout: smaller and cheaper to read and write.
    Binary,
}

impl StoreEncoding {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreEncoding::Json => "json",
            StoreEncoding::Binary => "binary",
        }
    }
}

impl std::str::FromStr for StoreEncoding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "json" => Ok(StoreEncoding::Json),
            "binary" => Ok(StoreEncoding::Binary),
            other => Err(format!("unknown store encoding {other:?} (json or binary)")),
        }
    }
}

impl std::fmt::Display for StoreEncoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    Pending,
    Provisioning,
    Restoring,
    Running,
    Degraded,
    Failed,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestorationStatus {
    /// Changelog records restored so far, summed over the restoring workers.
    pub restored_records: i64,
    /// Changelog records the running restores must read in all.
    pub total_records: i64,
    /// e.g. "87%", for the printer column.
    pub percent: String,
    /// Combined restore rate of the workers, in changelog records per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_per_second: Option<i64>,
    /// Estimated seconds until the restores finish: the records still to restore over
    /// the combined rate; absent until a rate is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<i64>,
    /// Tasks being restored or waiting to be, over all workers.
    pub tasks_restoring: i32,
}

/// A worker's state as its report and `status.instances[].state` name it. The wire
/// form stays a string (the CRD schema and older readers are unchanged); both sides
/// compare through this type.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WorkerState {
    /// Connecting, checking topics, waiting for its first assignment.
    #[default]
    Starting,
    /// At least one active task restores its state.
    Restoring,
    Running,
    /// Asked to stop: committing its last unit of work.
    Stopping,
    /// A task or the engine failed.
    Failed,
}

impl WorkerState {
    pub const ALL: [WorkerState; 5] = [
        Self::Starting,
        Self::Restoring,
        Self::Running,
        Self::Stopping,
        Self::Failed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "Starting",
            Self::Restoring => "Restoring",
            Self::Running => "Running",
            Self::Stopping => "Stopping",
            Self::Failed => "Failed",
        }
    }

    /// `None` for a name this version does not know (a newer worker's).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.as_str() == s)
    }
}

impl std::fmt::Display for WorkerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// The worker pod this entry belongs to (it writes the entry itself).
    pub pod: String,
    /// Starting, Restoring, Running, Stopping or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// host:port for queries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Tasks this pod processes, as `<stage>_<partition>` (`0_3`: partition 3 of the
    /// source topics; `1_3`: partition 3 of the first repartition topic).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active_tasks: Vec<String>,
    /// Tasks whose state this pod keeps warm from the changelogs, ready to take over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub standby_tasks: Vec<String>,
    /// Changelog records still to restore before the active tasks can run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_remaining: Option<i64>,
    /// Changelog records restored so far in the current restore (with `restoreTotal`,
    /// the percentage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<i64>,
    /// Changelog records the current restore reads in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_total: Option<i64>,
    /// Records per second of the current restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_rate: Option<i64>,
    /// Consumer lag summed over the active tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
    /// Per task held here (active or standby, keyed by task id): changelog records the
    /// local state is behind. The operator moves an active only to a copy within the
    /// warm-up bound.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub state_lag: BTreeMap<String, i64>,
    /// The task assignment generation this pod has applied; the operator waits for
    /// every pod to acknowledge one before it hands a task to a new owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment_generation: Option<i64>,
    /// The pod's last processing error (a failed task names its error here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the pod last wrote this entry (RFC 3339); a silent pod loses its tasks
    /// after the operator's failover timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
}

impl InstanceStatus {
    /// The reported state, if this version knows its name.
    pub fn worker_state(&self) -> Option<WorkerState> {
        self.state.as_deref().and_then(WorkerState::parse)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopicStatus {
    /// The Kafka topic.
    pub name: String,
    /// changelog or deadLetter.
    pub role: String,
    /// The state store a changelog belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// Partitions the topic has.
    #[serde(default)]
    pub partitions: i32,
    /// Exists with the wanted partitions and config.
    pub ready: bool,
    /// Settings that differ from the spec, as `key: actual (want wanted)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<String>,
    /// What the operator last did to the topic: created, grown, corrected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_state_reads_back_from_its_name_and_an_unknown_name_is_none() {
        for w in WorkerState::ALL {
            assert_eq!(WorkerState::parse(w.as_str()), Some(w));
            let json = serde_json::to_string(&w).expect("serializes");
            assert_eq!(
                json,
                format!("\"{w}\""),
                "the wire name is the display name"
            );
        }
        let mut i = InstanceStatus::default();
        assert_eq!(i.worker_state(), None);
        i.state = Some("Hibernating".into());
        assert_eq!(i.worker_state(), None);
        i.state = Some("Restoring".into());
        assert_eq!(i.worker_state(), Some(WorkerState::Restoring));
    }
}
