//! The processing loop: poll, route a record to its standby or active task, send what
//! the task returns, punctuate, and the periodic work (commits, purges, standby
//! checkpoints, reports) that must run however busy the consumer is.
//!
//! It must not change what a record means (that is [`crate::task`]) nor the order of
//! a commit (that is `commit`).

use std::time::{Duration, Instant};

use oxbow_crds::{ProcessingGuarantee, TaskId};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::TopicPartitionList;

use super::kafka::{KProducer, Producers, header};
use super::merge::{Buffered, Flow};
use super::replay::{Admission, ORIGIN_HEADER, Origin};
use super::standby::{STANDBY_BATCH, apply_standby_record};
use super::{Engine, EngineError};
use crate::metrics::{METRICS, task as task_label};
use crate::status::TaskState;
use crate::task::{KEY_HEADER, Outcome, Output, SourceMessage, now_ms};

/// A task commits early when this many records are pending, whatever the interval.
const MAX_UNCOMMITTED: u64 = 50_000;
/// Every task commits its position at least this often, even when idle.
const OFFSET_REFRESH: Duration = Duration::from_secs(60);

/// When the loop last did each of its periodic jobs.
struct Timers {
    commit: Instant,
    punctuate: Instant,
    report: Instant,
    refresh: Instant,
    desired_check: Instant,
    standby_flush: Instant,
    stalled: Instant,
}

/// The longest an idle loop waits for a queue to wake it: its timers (commits,
/// punctuation, reports) run at least this often.
const IDLE_WAIT: Duration = Duration::from_millis(5);

/// How long a merged task waits on an input before the wait is logged (and how often).
const STALLED_WARNING: Duration = Duration::from_secs(30);

/// Where the next commit interval starts, for a commit that ran from `started` to
/// `ended`: its start, so commits come every interval as the user set it (a record
/// waits half an interval for its commit on average, not half of the interval plus
/// the commit's round trips). A commit slower than half the interval leaves at least
/// that half to processing before the next, so a slow broker cannot make the loop
/// commit back to back.
fn next_commit_base(started: Instant, ended: Instant, interval: Duration) -> Instant {
    started.max(ended.checked_sub(interval / 2).unwrap_or(started))
}

impl Timers {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            commit: now,
            punctuate: now,
            report: now,
            refresh: now,
            desired_check: now,
            standby_flush: now,
            stalled: now,
        }
    }
}

impl Engine {
    /// Processes until asked to stop, then commits and returns.
    pub fn run(mut self) -> Result<(), EngineError> {
        let mut timers = Timers::new();
        let mut out = Vec::new();
        let mut busy = false;
        while !self.shared.stopping() {
            // The one place the engine says it is alive: a loop that stops turning,
            // whatever it blocks on, fails /healthz and stops the status heartbeat.
            self.shared.liveness.beat();
            // A batch restoring beside the loop is looked at every turn (a finished one
            // starts at once); a new assignment every 200 ms.
            if self.restoring.is_some()
                || timers.desired_check.elapsed() >= Duration::from_millis(200)
            {
                timers.desired_check = Instant::now();
                match self.apply_desired() {
                    // SIGTERM during a restore: commit what runs, below, and exit.
                    Err(EngineError::Stopped) => break,
                    r => r?,
                }
            }
            // Up to a turn's worth of the main consumer's records (global tables,
            // standbys, merged tasks), then the threads' turn (`parallel`); with no
            // task on a thread yet, one record. After an idle turn the loop waits until
            // any of its queues has something (`wake`), not in one consumer's poll:
            // records arriving in another queue would wait out that poll.
            if !busy {
                self.wake.wait(IDLE_WAIT);
            }
            let mut polled = 0;
            // A clone to poll through: the record it returns borrows it, not the engine.
            let consumer = self.consumer.clone();
            loop {
                // No `continue` below: the periodic work after this loop (commits,
                // standby flushes, reports) must run however busy the consumer is.
                match super::kafka::poll_now(&consumer) {
                    Some(Ok(m)) => self.main_record(&m, &mut out)?,
                    Some(Err(e)) => {
                        // Broker restarts and the like: librdkafka reconnects by itself.
                        tracing::warn!(error = %e, "consumer error");
                    }
                    None => break,
                }
                polled += 1;
                if self.pollers.is_empty() || polled >= super::parallel::MAX_POLL {
                    break;
                }
            }
            // A queue read only in part raises no flag: the next turn must not wait.
            busy = polled + self.run_threads()? > 0;
            self.periodic(&mut timers, &mut out)?;
        }
        self.shut_down()
    }

    /// One record of the main consumer: a global table's row, a standby's changelog
    /// record, or an input of a task on the main consumer (a merged task's, buffered
    /// for its turn; any other's, processed).
    fn main_record(
        &mut self,
        m: &rdkafka::message::BorrowedMessage<'_>,
        out: &mut Vec<Output>,
    ) -> Result<(), EngineError> {
        if let Some(g) = self.lookups.by_topic(m.topic()) {
            g.apply(m.partition(), m.offset(), m.key(), m.payload())
                .map_err(|source| EngineError::GlobalTable {
                    table: g.store.0.clone(),
                    source,
                })?;
            return Ok(());
        }
        if let Some(store) = self.changelogs.get(m.topic()).cloned()
        // A table's topic is its store's changelog for a standby, and
        // an input of the active that keeps it.
        && !self.tasks.contains_key(&TaskId::new(
            self.stage_of_changelog(&store),
            m.partition() as u32,
        )) {
            let id = TaskId::new(self.stage_of_changelog(&store), m.partition() as u32);
            apply_standby_record(
                &mut self.standbys,
                self.app.guarantee == ProcessingGuarantee::AtLeastOnce,
                self.app.inputs(id.stage),
                id,
                store,
                m,
            );
            // A standby catching up a long changelog writes as it goes:
            // its buffer stays bounded whatever the commit interval.
            if self
                .standbys
                .get(&id)
                .is_some_and(|sb| sb.pending.len() >= STANDBY_BATCH)
            {
                self.flush_standby(id)?;
            }
            return Ok(());
        }
        let Some(stage) = self.input_stage.get(m.topic()) else {
            return Ok(());
        };
        let id = TaskId::new(*stage, m.partition() as u32);
        let Some(task) = self.tasks.get_mut(&id) else {
            return Ok(());
        };
        if task.failed.is_some() {
            return Ok(());
        }
        METRICS.records_in.get_or_create(&task_label(id)).inc();
        let alos = self.app.guarantee == ProcessingGuarantee::AtLeastOnce;
        let (msg, origin) = source_message(m, id, alos);
        if let Some(merge) = self.merges.get_mut(&id)
            && merge.reads(msg.topic)
        {
            // Its turn comes in timestamp order with the task's other inputs.
            merge.push(buffered(&msg, origin));
            self.drain_merged(id, out)?;
            return Ok(());
        }
        out.clear();
        let Some(outcome) =
            process_input(task, &self.app, &self.env, &self.shared, &msg, origin, out)?
        else {
            return Ok(());
        };
        self.finish_input(id, (m.topic(), m.partition(), m.offset()), &outcome, out)?;
        Ok(())
    }

    /// Stopping (SIGTERM): commit what runs and flush the standbys, so the next owner of
    /// each task starts from here.
    fn shut_down(&mut self) -> Result<(), EngineError> {
        self.abandon_restore();
        tracing::info!("stopping: committing the current unit of work");
        self.shared
            .update(|s| s.state = oxbow_crds::WorkerState::Stopping);
        self.commit_all()?;
        let standbys: Vec<TaskId> = self.standbys.keys().copied().collect();
        for t in standbys {
            self.flush_standby(t)?;
        }
        self.report();
        // Everything is committed: the last status entry says so, and the next owner of
        // each task need not wait for a release it would otherwise never see.
        self.shared.update(|s| s.tasks.clear());
        Ok(())
    }

    /// The work the loop does on timers rather than per record: punctuation, commits,
    /// purges, standby checkpoints and reports.
    fn periodic(&mut self, timers: &mut Timers, out: &mut Vec<Output>) -> Result<(), EngineError> {
        // One clock read for every timer below: this runs once per record.
        let now = Instant::now();
        // Before anything is committed: a worker that can no longer prove it owns its
        // tasks stops here, with its uncommitted work left for the next owner.
        if self.lease_fences
            && let crate::lease::LeaseVerdict::Lapsed { since } = self.shared.lease.verdict()
        {
            return Err(EngineError::LeaseLapsed { since });
        }
        // A merged task waiting on an input goes on once it is caught up or has been
        // waited for long enough.
        let waiting: Vec<TaskId> = self
            .merges
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in waiting {
            self.drain_merged(id, out)?;
        }
        if now.saturating_duration_since(timers.stalled) >= STALLED_WARNING {
            timers.stalled = now;
            for (id, m) in &self.merges {
                if let Some((input, waited)) = m.stalled(now).filter(|(_, w)| *w >= STALLED_WARNING)
                {
                    tracing::warn!(task = %id, input, waited_seconds = waited.as_secs(),
                        "the task waits for records of an input that the consumer has not handed over yet; its other inputs wait with it (timestamp order)");
                }
            }
        }
        if now.saturating_duration_since(timers.punctuate) >= Duration::from_millis(100) {
            timers.punctuate = now;
            let ids: Vec<TaskId> = self.tasks.keys().copied().collect();
            for id in ids {
                out.clear();
                if let Some(task) = self.tasks.get_mut(&id)
                    && task.failed.is_none()
                {
                    task.punctuate(&self.app, &self.env, now_ms(), out)?;
                }
                // Not tied to one input record: no origin, never dropped as a replay.
                self.send_outputs(id, out, None)?;
            }
        }
        if now.saturating_duration_since(timers.refresh) >= OFFSET_REFRESH {
            // An idle partition's offsets would expire (offsets.retention.minutes)
            // without a commit: commit every task's position now and then.
            timers.refresh = now;
            for t in self
                .tasks
                .values_mut()
                .filter(|t| t.failed.is_none() && !t.positions.is_empty())
            {
                t.uncommitted = t.uncommitted.max(1);
            }
        }
        let pending = self
            .tasks
            .values()
            .map(|t| t.uncommitted)
            .max()
            .unwrap_or(0);
        if now.saturating_duration_since(timers.commit) >= self.app.commit_interval
            || pending >= MAX_UNCOMMITTED
        {
            self.commit_all()?;
            timers.commit = next_commit_base(now, Instant::now(), self.app.commit_interval);
        }
        if now.saturating_duration_since(self.last_purge) >= self.purge_interval {
            self.purge_repartitions();
        }
        if now.saturating_duration_since(timers.standby_flush) >= Duration::from_millis(500) {
            timers.standby_flush = now;
            self.flush_standbys()?;
        }
        if now.saturating_duration_since(timers.report) >= Duration::from_secs(2) {
            timers.report = now;
            self.report();
        }
        Ok(())
    }

    /// Processes the buffered records of a merged task whose turn has come, then pauses
    /// or resumes its inputs as its buffer stands.
    fn drain_merged(&mut self, id: TaskId, out: &mut Vec<Output>) -> Result<(), EngineError> {
        let r = self.process_merged(id, out);
        self.merge_flow(id);
        r
    }

    fn process_merged(&mut self, id: TaskId, out: &mut Vec<Output>) -> Result<(), EngineError> {
        let partition = id.kafka_partition();
        loop {
            let watch = &self.fetch_watch;
            let fetched = |topic: &str| watch.get(topic, partition);
            let Some(b) = self
                .merges
                .get_mut(&id)
                .and_then(|m| m.next(Instant::now(), &fetched))
            else {
                return Ok(());
            };
            let Some(task) = self.tasks.get_mut(&id).filter(|t| t.failed.is_none()) else {
                return Ok(());
            };
            out.clear();
            let msg = b.message();
            let Some(outcome) = process_input(
                task,
                &self.app,
                &self.env,
                &self.shared,
                &msg,
                b.origin.clone(),
                out,
            )?
            else {
                continue;
            };
            self.finish_input(id, (&b.topic, b.partition, b.offset), &outcome, out)?;
        }
    }

    /// Pauses or resumes a merged task's inputs as its buffer fills and drains.
    fn merge_flow(&mut self, id: TaskId) {
        let Some(flow) = self.merges.get_mut(&id).and_then(|m| m.flow()) else {
            return;
        };
        let (topics, pause) = match flow {
            Flow::Pause(t) => (t, true),
            Flow::Resume(t) => (t, false),
        };
        let mut tpl = TopicPartitionList::new();
        for t in &topics {
            tpl.add_partition(t, id.kafka_partition());
        }
        let failed = self.tasks.get(&id).is_none_or(|t| t.failed.is_some());
        let r = match (pause, failed) {
            (true, _) => self.consumer.pause(&tpl),
            // A failed task stays paused (errors.policy: fail).
            (false, true) => Ok(()),
            (false, false) => self.consumer.resume(&tpl),
        };
        match r {
            Ok(()) => tracing::info!(task = %id, inputs = ?topics, paused = pause,
                "merged inputs {} (buffered records while waiting for another input)",
                if pause { "paused" } else { "resumed" }),
            Err(e) => {
                tracing::warn!(task = %id, error = %e, "could not pause or resume merged inputs")
            }
        }
    }

    /// After a record was processed: its outcome counted, its outputs sent.
    pub(super) fn finish_input(
        &mut self,
        id: TaskId,
        (topic, partition, offset): (&str, i32, i64),
        outcome: &Outcome,
        out: &[Output],
    ) -> Result<(), EngineError> {
        self.record_outcome(id, topic, outcome)?;
        let alos = self.app.guarantee == ProcessingGuarantee::AtLeastOnce;
        self.send_outputs(id, out, alos.then_some((topic, partition, offset)))
    }

    pub(super) fn record_outcome(
        &mut self,
        id: TaskId,
        _topic: &str,
        outcome: &Outcome,
    ) -> Result<(), EngineError> {
        record_outcome(&self.shared, self.consumer_for(id), &self.app, id, outcome);
        Ok(())
    }

    pub(super) fn producer_for(&mut self, id: TaskId) -> Result<&KProducer, EngineError> {
        match &mut self.producers {
            Producers::Shared(p) => Ok(p),
            Producers::Transactional(m) => {
                let (p, in_txn) = m.get_mut(&id).ok_or_else(|| EngineError::Inconsistent {
                    task: id,
                    what: "no producer for task",
                })?;
                if !*in_txn {
                    p.begin_transaction()
                        .map_err(|source| EngineError::Commit { task: id, source })?;
                    *in_txn = true;
                }
                Ok(p)
            }
        }
    }

    pub(super) fn report(&mut self) {
        for (id, task) in &self.tasks {
            let mut lag = 0;
            for topic in self.app.inputs(id.stage) {
                if let Ok((_, high)) =
                    self.side
                        .fetch_watermarks(topic, id.kafka_partition(), Duration::from_secs(2))
                {
                    let pos = task.positions.get(topic).copied().unwrap_or(0);
                    lag += (high - pos).max(0);
                }
            }
            METRICS.lag.get_or_create(&task_label(*id)).set(lag);
            for s in task.db.stores() {
                METRICS
                    .store_bytes
                    .get_or_create(&crate::metrics::store(*id, s))
                    .set(task.db.size_bytes(s) as i64);
            }
            self.shared.task(*id, |t| t.lag = Some(lag));
        }
        for (id, sb) in &self.standbys {
            let mut lag = 0;
            for (store, next) in &sb.next {
                let topic = self.app.store_topic(store);
                if let Ok((_, high)) =
                    self.side
                        .fetch_watermarks(&topic, id.kafka_partition(), Duration::from_secs(2))
                {
                    lag += (high - next).max(0);
                }
            }
            // Under exactly-once the log end includes transaction markers, which are
            // never delivered: a caught-up standby may show a few records of lag.
            self.shared.task(*id, |t| t.state_lag = Some(lag));
        }
    }
}

/// Counts what became of a record; a failed task (`errors.policy: fail`) has its inputs
/// paused on `consumer`, the one that reads them.
pub(super) fn record_outcome(
    shared: &crate::status::Shared,
    consumer: &super::kafka::MainConsumer,
    app: &crate::config::App,
    id: TaskId,
    outcome: &Outcome,
) {
    match outcome {
        Outcome::Processed => shared.task(id, |t| t.processed += 1),
        Outcome::DeadLettered => {
            METRICS.dead_letters.get_or_create(&task_label(id)).inc();
            shared.task(id, |t| t.dead_letters += 1);
        }
        Outcome::Skipped => {
            METRICS.skipped.get_or_create(&task_label(id)).inc();
            shared.task(id, |t| t.skipped += 1);
        }
        Outcome::Failed(m) => {
            tracing::error!(task = %id, error = %m, "task failed (errors.policy: fail); its partitions are paused");
            let _ = consumer.pause(&super::assign::source_tpl(app, id));
            shared.task(id, |t| {
                t.state = TaskState::Failed;
                t.last_error = Some(oxbow_crds::redact::scrub(m));
            });
        }
    }
}

/// A consumed record as a task reads it, and under at-least-once (`alos`) the origin a
/// later stage's record carries (`replay`).
pub(super) fn source_message<'a, M: Message>(
    m: &'a M,
    id: TaskId,
    alos: bool,
) -> (SourceMessage<'a>, Option<Origin>) {
    let origin = (alos && id.stage > 0)
        .then(|| header(m, ORIGIN_HEADER))
        .flatten()
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(Origin::parse);
    let msg = SourceMessage {
        topic: m.topic(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key(),
        value: m.payload(),
        timestamp: m.timestamp().to_millis(),
        record_key: (id.stage > 0).then(|| header(m, KEY_HEADER)).flatten(),
    };
    (msg, origin)
}

/// A record as the merge keeps it until its turn.
fn buffered(msg: &SourceMessage<'_>, origin: Option<Origin>) -> Buffered {
    Buffered {
        topic: msg.topic.to_string(),
        partition: msg.partition,
        offset: msg.offset,
        key: msg.key.map(<[u8]>::to_vec),
        value: msg.value.map(<[u8]>::to_vec),
        timestamp: msg.timestamp,
        record_key: msg.record_key.map(<[u8]>::to_vec),
        origin,
    }
}

/// Runs one input record through its task, unless it is a replay the task has already
/// processed (then `None`).
pub(super) fn process_input(
    task: &mut crate::task::Task,
    app: &crate::config::App,
    env: &crate::expr::Env,
    shared: &crate::status::Shared,
    msg: &SourceMessage<'_>,
    origin: Option<Origin>,
    out: &mut Vec<Output>,
) -> Result<Option<Outcome>, EngineError> {
    let id = task.id;
    if let Some(o) = &origin
        && task.marks.admit(o) == Admission::Replayed
    {
        task.skip_replayed(msg);
        METRICS.replays_dropped.get_or_create(&task_label(id)).inc();
        shared.task(id, |t| t.replays_dropped += 1);
        return Ok(None);
    }
    Ok(Some(task.process(app, env, msg, now_ms(), out)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_commit_interval_runs_from_the_start_of_a_quick_commit() {
        let start = Instant::now();
        let interval = Duration::from_millis(100);
        let end = start + Duration::from_millis(30);
        assert_eq!(next_commit_base(start, end, interval), start);
    }

    #[test]
    fn a_slow_commit_leaves_half_an_interval_to_processing_before_the_next() {
        let start = Instant::now();
        let interval = Duration::from_millis(100);
        let end = start + Duration::from_millis(400);
        let base = next_commit_base(start, end, interval);
        assert_eq!(base + interval, end + interval / 2);
    }
}
