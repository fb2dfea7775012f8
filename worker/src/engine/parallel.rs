//! Processing threads (`--threads N`, N > 1): each thread has a consumer of its own,
//! which reads the input partitions of the active tasks placed on it, and runs those
//! tasks' records in their order. What a record means is unchanged ([`crate::task`]);
//! only which core runs it.
//!
//! Why a consumer per thread: one consumer hands over records a partition at a time (a
//! fetch's whole share of one partition), so a loop that spread what one consumer
//! polled over threads nearly always held one task's records. With a consumer per
//! thread each fetches for its own tasks, as Kafka Streams' stream threads do.
//!
//! Why turns: each loop turn, after the main consumer's records (global tables,
//! standbys, merged tasks, which stay on the loop's thread), every thread polls its
//! consumer for up to [`MAX_POLL`] records and runs them; the turn ends when all are
//! done. The loop keeps the assignment, the restores' hand-over, the standbys and the
//! commit order as they were, and a turn never ends with a record half done, so every
//! commit, hand-over and punctuation sees each task at a record boundary. Outputs are
//! sent and outcomes counted on the loop's thread after the turn, in each task's record
//! order, so the producers and the transactions stay where the commit is.
//!
//! Why a queue per partition: librdkafka bounds a consumer's prefetch
//! (`queued.min.messages`, `queued.max.messages.kbytes`) over everything in the queue
//! its partitions forward to. With one shared queue the partition whose fetch came
//! first refilled it each time the bound freed up, and the consumer's other partitions
//! waited until that one was read to its end: a backlogged task starved the others on
//! its thread. Each partition's records are split into a queue of their own, so each
//! has its own bound and a turn takes from every queue in rotation.
//!
//! Owns: which thread's consumer reads a task (`home`), the partition queues, and one
//! turn's run. It must not commit, send or decide a record's outcome.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use oxbow_crds::{ProcessingGuarantee, TaskId};
use rdkafka::TopicPartitionList;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::Producer;

use super::kafka::{ConsumerCtx, KProducer, MainConsumer, Producers, poll_now, task_consumer};
use super::outputs::{Sender, send_outputs};
use super::run::record_outcome;
use super::wake::Wake;
use super::{Engine, EngineError};
use crate::config::App;
use crate::expr::Env;
use crate::metrics::{METRICS, task as task_label};
use crate::task::{Outcome, Task};

/// The most records one thread polls and runs in a turn: at about 15 µs a record, a
/// turn stays near 15 ms, well inside a commit interval, so the loop's other work
/// (commits, reports, the liveness beat) comes often enough.
pub(super) const MAX_POLL: usize = 1024;

/// The most records a turn takes from one partition's queue before the next queue's
/// turn: a partition with a backlog cannot hold the others for a whole turn.
const PER_QUEUE: usize = 128;

/// A processing thread's consumer and the queues split off it, one per input
/// partition assigned to it.
pub(super) struct Poller {
    pub(super) consumer: Arc<MainConsumer>,
    queues: BTreeMap<(String, i32), PartitionQueue<ConsumerCtx>>,
    /// Partitions assigned since the last turn, split off at its start.
    assigned: Vec<(String, i32)>,
    /// Which queue a turn starts with; it moves on every turn.
    next: usize,
    /// Raised by the consumer's queue and each partition's when something arrives.
    wake: Arc<Wake>,
}

impl Poller {
    fn new(mut consumer: MainConsumer, wake: &Arc<Wake>) -> Self {
        consumer.set_nonempty_callback(wake.callback());
        Self {
            consumer: Arc::new(consumer),
            queues: BTreeMap::new(),
            assigned: Vec::new(),
            next: 0,
            wake: wake.clone(),
        }
    }

    /// Notes partitions just assigned to the consumer, to split off at the next turn,
    /// before their first fetch lands in the consumer's queue: one fetch there can hold
    /// a partition's share of a whole megabyte, which the other partitions' records
    /// would wait behind (the turn reads the consumer's queue first).
    pub(super) fn assigned(&mut self, tpl: &TopicPartitionList) {
        for e in tpl.elements() {
            self.assigned.push((e.topic().to_string(), e.partition()));
        }
    }

    /// Forgets the queues of partitions no longer assigned to the consumer. A queue
    /// dropped while its partition is assigned would keep the partition's records
    /// from the consumer's own queue; once unassigned, a new assignment forwards the
    /// partition to the consumer's queue again, where the next turn splits it off anew.
    pub(super) fn forget(&mut self, tpl: &TopicPartitionList) {
        for e in tpl.elements() {
            self.queues.remove(&(e.topic().to_string(), e.partition()));
        }
    }

    /// Gives `(topic, partition)` a queue of its own. librdkafka forwards a partition
    /// to the consumer's queue when its fetching starts, on its own thread after an
    /// assignment; a split made before that is undone, so a partition whose records
    /// come through the consumer's queue is split again. Records already there stay
    /// there: the turn reads the partitions' queues only once the consumer's is empty,
    /// so a partition's records keep their order.
    fn split(&mut self, topic: &str, partition: i32) {
        // The old handle goes first: a handle's drop disables the wake callback of the
        // partition's queue, which the new handle shares with it.
        let key = (topic.to_string(), partition);
        self.queues.remove(&key);
        if let Some(mut q) = self.consumer.split_partition_queue(topic, partition) {
            q.set_nonempty_callback(self.wake.callback());
            self.queues.insert(key, q);
        }
    }
}

/// The producer a task's outputs go out with on its thread: the worker's shared one
/// (at least once), or the task's own with whether its transaction has begun.
enum TaskProducer<'a> {
    Shared(&'a KProducer),
    Transactional(&'a mut (KProducer, bool)),
}

impl TaskProducer<'_> {
    /// The producer, in a transaction (begun here if this is the task's first output
    /// since its last commit).
    fn ready(&mut self, id: TaskId) -> Result<&KProducer, EngineError> {
        match self {
            TaskProducer::Shared(p) => Ok(p),
            TaskProducer::Transactional(entry) => {
                let (p, in_txn) = &mut **entry;
                if !*in_txn {
                    p.begin_transaction()
                        .map_err(|source| EngineError::Commit { task: id, source })?;
                    *in_txn = true;
                }
                Ok(p)
            }
        }
    }
}

/// The thread whose consumer takes a new task: the one with the fewest tasks (the
/// lowest number on a tie), so a pod's tasks spread evenly over its threads.
pub(super) fn least_loaded(homes: &BTreeMap<TaskId, usize>, threads: usize) -> usize {
    let mut load = vec![0usize; threads.max(1)];
    for k in homes.values() {
        if let Some(l) = load.get_mut(*k) {
            *l += 1;
        }
    }
    (0..load.len()).min_by_key(|k| (load[*k], *k)).unwrap_or(0)
}

impl Engine {
    /// The consumer that reads task `id`'s inputs: its thread's, or the main one.
    pub(super) fn consumer_for(&self, id: TaskId) -> &MainConsumer {
        self.home
            .get(&id)
            .and_then(|k| self.pollers.get(*k))
            .map_or(&self.consumer, |p| &*p.consumer)
    }

    /// Places a starting task on a thread, if it runs on one: a task whose stage
    /// merges two streams stays on the main consumer, where its inputs take their turn
    /// in timestamp order. A thread's consumer is created when it gets its first task,
    /// so a pod with fewer tasks than threads has no idle clients. With one thread its
    /// consumer's turn runs on the loop's thread. Returns the thread.
    pub(super) fn place(&mut self, id: TaskId) -> Result<Option<usize>, EngineError> {
        if self
            .app
            .topology
            .stage(id.stage)
            .is_none_or(|s| !s.streams.is_empty())
        {
            return Ok(None);
        }
        let slots = (self.pollers.len() + 1).min(self.threads.max(1));
        let k = least_loaded(&self.home, slots);
        if k == self.pollers.len() {
            self.pollers.push(Poller::new(
                task_consumer(&self.app, &self.fetch_watch)?,
                &self.wake,
            ));
        }
        self.home.insert(id, k);
        self.shared.task(id, |t| t.thread = Some(k as u32));
        Ok(Some(k))
    }

    /// One turn of the processing threads: each polls its consumer, runs what it got
    /// and sends the outputs, each task's in record order. Returns how many records the
    /// threads polled.
    pub(super) fn run_threads(&mut self) -> Result<usize, EngineError> {
        if self.pollers.is_empty() {
            return Ok(0);
        }
        let (shared_producer, mut own) = match &mut self.producers {
            Producers::Shared(p) => (Some(&*p), BTreeMap::new()),
            Producers::Transactional(m) => (None, m.iter_mut().map(|(id, e)| (*id, e)).collect()),
        };
        let mut groups: Vec<BTreeMap<TaskId, (&mut Task, TaskProducer<'_>)>> =
            self.pollers.iter().map(|_| BTreeMap::new()).collect();
        for (id, task) in self.tasks.iter_mut() {
            let Some(g) = self.home.get(id).and_then(|k| groups.get_mut(*k)) else {
                continue;
            };
            let producer = match (shared_producer, own.remove(id)) {
                (Some(p), _) => TaskProducer::Shared(p),
                (None, Some(e)) => TaskProducer::Transactional(e),
                (None, None) => {
                    return Err(EngineError::Inconsistent {
                        task: *id,
                        what: "no producer for task",
                    });
                }
            };
            g.insert(*id, (task, producer));
        }
        let cx = Turn {
            app: &self.app,
            env: &self.env,
            stages: &self.input_stage,
            sender: Sender {
                sink: self.sink_topic.as_deref(),
                dlq: self.dlq_topic.as_deref(),
                limits: &self.limits,
                policy: self.app.manifest.spec.errors.policy,
                shared: &self.shared,
            },
        };
        let cx = &cx;
        let results: Vec<Result<usize, EngineError>> = std::thread::scope(|scope| {
            let mut work = self.pollers.iter_mut().zip(groups);
            let mine = work.next();
            let handles: Vec<_> = work
                .map(|(poller, tasks)| {
                    std::thread::Builder::new()
                        .name("oxbow-process".into())
                        .spawn_scoped(scope, move || run_turn(poller, tasks, cx))
                        .expect("spawn a processing thread")
                })
                .collect();
            let mut results: Vec<_> = mine
                .map(|(poller, tasks)| run_turn(poller, tasks, cx))
                .into_iter()
                .collect();
            for h in handles {
                results.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            }
            results
        });
        let mut polled = 0;
        for r in results {
            polled += r?;
        }
        Ok(polled)
    }
}

/// What every thread of a turn reads.
struct Turn<'a> {
    app: &'a App,
    env: &'a Env,
    stages: &'a HashMap<String, u32>,
    sender: Sender<'a>,
}

/// Runs up to [`MAX_POLL`] records of one thread's consumer, each through its task as
/// the loop runs one record: processed, counted, its outputs sent. First what is in the
/// consumer's own queue (events, and records of partitions not split off yet), then
/// the partitions' queues in rotation, at most [`PER_QUEUE`] records from each at a
/// time. A task that has failed (`errors.policy: fail`) processes none after its
/// failing record.
fn run_turn(
    poller: &mut Poller,
    mut tasks: BTreeMap<TaskId, (&mut Task, TaskProducer<'_>)>,
    cx: &Turn<'_>,
) -> Result<usize, EngineError> {
    for (topic, partition) in std::mem::take(&mut poller.assigned) {
        poller.split(&topic, partition);
    }
    let mut polled = 0;
    let mut out = Vec::new();
    let mut unsplit = BTreeSet::new();
    let consumer = poller.consumer.clone();
    let mut drained = false;
    while polled < MAX_POLL {
        let Some(polled_one) = poll_now(&consumer) else {
            drained = true;
            break;
        };
        // Errors count too: a broker that keeps failing cannot hold the turn.
        polled += 1;
        if let Ok(m) = &polled_one {
            // Looked up before inserting: no String per record of a partition whose
            // old records are still draining from the consumer's queue.
            if !unsplit
                .iter()
                .any(|(t, p): &(String, i32)| t == m.topic() && *p == m.partition())
            {
                unsplit.insert((m.topic().to_string(), m.partition()));
            }
        }
        run_one(polled_one, &consumer, &mut tasks, cx, &mut out)?;
    }
    for (topic, partition) in unsplit {
        poller.split(&topic, partition);
    }
    if !drained || poller.queues.is_empty() {
        return Ok(polled);
    }
    let queues: Vec<&PartitionQueue<ConsumerCtx>> = poller.queues.values().collect();
    let start = poller.next % queues.len();
    poller.next = poller.next.wrapping_add(1);
    let mut progress = true;
    while progress && polled < MAX_POLL {
        progress = false;
        for q in queues[start..].iter().chain(&queues[..start]) {
            let mut taken = 0;
            while taken < PER_QUEUE && polled < MAX_POLL {
                let Some(polled_one) = q.poll(Duration::ZERO) else {
                    break;
                };
                taken += 1;
                polled += 1;
                run_one(polled_one, &consumer, &mut tasks, cx, &mut out)?;
            }
            progress |= taken > 0;
        }
    }
    Ok(polled)
}

/// One polled record (or error) through its task.
fn run_one(
    polled_one: KafkaResult<BorrowedMessage<'_>>,
    consumer: &MainConsumer,
    tasks: &mut BTreeMap<TaskId, (&mut Task, TaskProducer<'_>)>,
    cx: &Turn<'_>,
    out: &mut Vec<crate::task::Output>,
) -> Result<(), EngineError> {
    let (app, shared) = (cx.app, cx.sender.shared);
    let alos = app.guarantee == ProcessingGuarantee::AtLeastOnce;
    let m = match polled_one {
        Err(e) => {
            // Broker restarts and the like: librdkafka reconnects by itself.
            tracing::warn!(error = %e, "consumer error");
            return Ok(());
        }
        Ok(m) => m,
    };
    let Some(stage) = cx.stages.get(m.topic()) else {
        return Ok(());
    };
    let id = TaskId::new(*stage, m.partition() as u32);
    // Records of a task released since they were fetched are dropped: its next
    // owner reads them again from its committed offsets.
    let Some((task, producer)) = tasks.get_mut(&id) else {
        return Ok(());
    };
    if task.failed.is_some() {
        return Ok(());
    }
    METRICS.records_in.get_or_create(&task_label(id)).inc();
    let (msg, origin) = super::run::source_message(&m, id, alos);
    out.clear();
    let Some(outcome) = super::run::process_input(task, app, cx.env, shared, &msg, origin, out)?
    else {
        return Ok(());
    };
    record_outcome(shared, consumer, app, id, &outcome);
    if out.is_empty() {
        return Ok(());
    }
    let from = alos.then_some((m.topic(), m.partition(), m.offset()));
    if let Some(why) = send_outputs(&cx.sender, producer.ready(id)?, id, out, from)? {
        record_outcome(shared, consumer, app, id, &Outcome::Failed(why));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::least_loaded;
    use oxbow_crds::TaskId;
    use std::collections::BTreeMap;

    #[test]
    fn a_new_task_goes_to_the_thread_with_the_fewest_tasks() {
        let mut homes = BTreeMap::new();
        for (p, k) in [(0, 0), (1, 1), (2, 0)] {
            homes.insert(TaskId::new(0, p), k);
        }
        assert_eq!(least_loaded(&homes, 2), 1);
        assert_eq!(least_loaded(&homes, 3), 2, "an empty thread first");
    }

    #[test]
    fn tasks_placed_one_by_one_spread_evenly_over_the_threads() {
        let mut homes = BTreeMap::new();
        for p in 0..8 {
            let k = least_loaded(&homes, 3);
            homes.insert(TaskId::new(0, p), k);
        }
        let mut per_thread = [0; 3];
        for k in homes.values() {
            per_thread[*k] += 1;
        }
        assert_eq!(per_thread, [3, 3, 2]);
    }
}
