//! What the worker reports about itself (`/v1/status`, `/readyz`), shared between the
//! engine thread (the only writer) and the HTTP server. If the engine panics while
//! holding the lock, the mutex is poisoned and readers report the worker as failed
//! rather than serving a half-written status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use oxbow_crds::assignment::TaskPlacement;
use oxbow_crds::{TaskId, WorkerState};
use serde::Serialize;

use crate::store::TaskDb;

/// What a task is on this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// Processes the task's source partitions and owns its output.
    #[default]
    Active,
    /// Applies the task's changelog to a local copy of its state, ready for promotion.
    Standby,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TaskState {
    Starting,
    Restoring,
    Running,
    Failed,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreProgress {
    /// upToDate, tail or full (with the reason).
    pub mode: String,
    pub restored: u64,
    /// Changelog records skipped because their source records were not committed.
    pub skipped: u64,
    pub total: u64,
    pub remaining: u64,
    pub records_per_second: f64,
    pub seconds: f64,
    /// SST files ingested (bulk load of an empty store).
    pub ingested_files: u64,
    /// Per source topic, the highest source offset a restored changelog record names
    /// (`oxbow.source`): where the state's work ends when Kafka has no offsets.
    #[serde(skip)]
    pub sources_seen: BTreeMap<String, i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    pub task: TaskId,
    pub role: Role,
    pub state: TaskState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreProgress>,
    /// Source records not yet processed (active tasks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
    /// Changelog records the local state is behind (standbys; restoring actives).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_lag: Option<i64>,
    /// Next source offset per topic.
    pub positions: BTreeMap<String, i64>,
    /// The processing thread that runs this active task (`--threads` above 1; a task
    /// that merges two streams runs on the loop's thread and has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<u32>,
    pub processed: u64,
    pub dead_letters: u64,
    pub skipped: u64,
    /// Repartition records dropped as an upstream replay ([`crate::engine::replay`]).
    pub replays_dropped: u64,
    pub commits: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Digest of each store's committed content (see `TaskDb::digest`), when asked for.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub digests: BTreeMap<String, String>,
}

impl TaskStatus {
    pub fn new(task: TaskId) -> Self {
        Self {
            task,
            role: Role::Active,
            state: TaskState::Starting,
            restore: None,
            lag: None,
            state_lag: None,
            positions: BTreeMap::new(),
            thread: None,
            processed: 0,
            dead_letters: 0,
            skipped: 0,
            replays_dropped: 0,
            commits: 0,
            last_error: None,
            digests: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerStatus {
    pub application_id: String,
    pub instance: u32,
    pub instances: u32,
    pub guarantee: String,
    /// Starting, Restoring, Running, Stopping or Failed.
    pub state: WorkerState,
    /// The assignment generation applied (0 standalone).
    pub generation: i64,
    /// Tasks assigned active here that wait for their previous owner to let go (they
    /// run as standbys meanwhile). The worker is not ready while any wait.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waiting_for_release: Vec<TaskId>,
    pub tasks: Vec<TaskStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// Where each task lives, for routing queries: from the operator's assignment and the
/// pods' status entries, or (standalone) from `--peers`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Routing {
    /// This pod's name (`POD_NAME`), or `instance-N` standalone.
    pub me: String,
    /// The source partition count; 0 until known.
    pub task_count: u32,
    /// The assignment generation this worker runs.
    pub generation: i64,
    pub placements: BTreeMap<TaskId, TaskPlacement>,
    /// Pod name → `host:port` of its HTTP server.
    pub addresses: BTreeMap<String, String>,
}

/// The tasks this worker should hold, from the operator's assignment (or the standalone
/// rule). Written by the coordinator, applied by the engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    pub generation: i64,
    pub active: BTreeSet<TaskId>,
    pub standby: BTreeSet<TaskId>,
    /// Active tasks another live pod still reports as its own: started only once it
    /// lets go (or after a hand-over timeout, when fencing must do). Meanwhile they are
    /// kept warm as standbys.
    pub held_elsewhere: BTreeSet<TaskId>,
}

/// The reason of a warning event a worker raises on its StreamApp (the operator
/// publishes it); the variant's name is the event's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum NoticeReason {
    /// A task's state directory was corrupt or another task's, and was moved aside.
    StateQuarantined,
}

#[derive(Default)]
pub struct Shared {
    desired: Mutex<Option<Desired>>,
    reporting_closed: AtomicBool,
    desired_version: AtomicU64,
    status: Mutex<WorkerStatus>,
    stop: AtomicBool,
    /// The open state of every task on this worker (active or standby), for queries.
    /// Entries appear once a task's store is open and go before it is closed.
    pub dbs: RwLock<BTreeMap<TaskId, Arc<TaskDb>>>,
    pub routing: RwLock<Routing>,
    /// The global tables, once loaded, for queries: every worker holds them whole.
    pub globals: RwLock<Option<Arc<dyn crate::processor::Lookups>>>,
    /// The processing loop's beats, for `/healthz` and the coordinator's heartbeat.
    pub liveness: crate::liveness::Liveness,
    /// At-least-once fencing: renewed by every status write the API server accepts.
    pub lease: crate::lease::Lease,
    /// Warnings for the StreamApp's events (reason, message), published by the
    /// coordinator when there is one.
    pub notices: Mutex<Vec<(String, String)>>,
}

impl Shared {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
    /// Changes the status under the lock.
    pub fn update(&self, f: impl FnOnce(&mut WorkerStatus)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }
    pub fn task(&self, task: TaskId, f: impl FnOnce(&mut TaskStatus)) {
        self.update(|s| {
            if let Some(t) = s.tasks.iter_mut().find(|t| t.task == task) {
                f(t);
            }
        });
    }
    /// A copy of the status; `None` if the engine panicked mid-update.
    pub fn snapshot(&self) -> Option<WorkerStatus> {
        self.status.lock().ok().map(|s| s.clone())
    }
    /// Ready: running, with every active task restored and running. Standbys do not
    /// gate readiness: they serve no traffic and catch up in the background.
    pub fn ready(&self) -> bool {
        self.snapshot().is_some_and(|s| {
            s.state == WorkerState::Running
                && s.waiting_for_release.is_empty()
                && s.tasks
                    .iter()
                    .filter(|t| t.role == Role::Active)
                    .all(|t| t.state == TaskState::Running)
        })
    }
    /// Publishes what the worker should hold; the engine picks it up in its loop.
    pub fn set_desired(&self, d: Desired) {
        if let Ok(mut cur) = self.desired.lock()
            && cur.as_ref() != Some(&d)
        {
            *cur = Some(d);
            self.desired_version.fetch_add(1, Ordering::SeqCst);
        }
    }
    /// The desired state if it changed since `seen` (which is updated).
    pub fn desired_since(&self, seen: &mut u64) -> Option<Desired> {
        let v = self.desired_version.load(Ordering::SeqCst);
        if v == *seen {
            return None;
        }
        *seen = v;
        self.desired.lock().ok().and_then(|d| d.clone())
    }
    /// No status entry is written after this but the final one.
    pub fn close_reporting(&self) {
        self.reporting_closed.store(true, Ordering::SeqCst);
    }
    pub fn reporting_closed(&self) -> bool {
        self.reporting_closed.load(Ordering::SeqCst)
    }
    /// The latest desired state, without marking it seen.
    pub fn desired_peek(&self) -> Option<Desired> {
        self.desired.lock().ok().and_then(|d| d.clone())
    }
    /// Whether a newer desired state than `seen` was published.
    pub fn desired_changed(&self, seen: u64) -> bool {
        self.desired_version.load(Ordering::SeqCst) != seen
    }
    /// Adds or replaces a task's entry.
    pub fn put_task(&self, t: TaskStatus) {
        self.update(|s| {
            s.tasks.retain(|x| x.task != t.task);
            s.tasks.push(t);
            s.tasks.sort_by_key(|x| x.task);
        });
    }
    pub fn remove_task(&self, task: TaskId) {
        self.update(|s| s.tasks.retain(|x| x.task != task));
    }
    /// Queues a warning event for the StreamApp.
    pub fn notice(&self, reason: NoticeReason, message: String) {
        if let Ok(mut n) = self.notices.lock() {
            n.push((<&str>::from(reason).to_string(), message));
        }
    }
    /// Takes the queued warnings.
    pub fn take_notices(&self) -> Vec<(String, String)> {
        self.notices
            .lock()
            .map(|mut n| std::mem::take(&mut *n))
            .unwrap_or_default()
    }
    /// The open store of a task, if this worker holds it.
    pub fn db(&self, task: TaskId) -> Option<Arc<TaskDb>> {
        self.dbs.read().ok()?.get(&task).cloned()
    }
    pub fn routing(&self) -> Routing {
        self.routing.read().map(|r| r.clone()).unwrap_or_default()
    }
}
