//! Timestamp-ordered merging of a task's input partitions, for the stages whose
//! stream–stream joins read a second topic (Kafka Streams' record choosing across a
//! task's partitions, with `max.task.idle.ms`).
//!
//! A join's result depends on the order its two sides arrive in: the stream time, and
//! so what is late and when a window closes, moves with every record. The consumer
//! hands over one partition's fetch after the other, so after a restart with a backlog
//! one side could run minutes ahead and make the other side late. A merged task
//! therefore buffers what the consumer hands it per input topic and always processes
//! the buffered record with the smallest Kafka timestamp. While an input has nothing
//! buffered it waits (Kafka Streams' `max.task.idle.ms = 0`):
//! - however long it takes, while the consumer's statistics show that input has records
//!   (or transaction markers) not yet handed over, or its fetch has not started or
//!   answered yet: going on would make those records late, and the result would depend
//!   on how fast each partition happened to be fetched;
//! - not at all once statistics taken since the wait began show it caught up: a quiet
//!   input must not stop the other;
//! - for at most [`MAX_IDLE`] when nothing newer is known.
//!
//! Pure: no Kafka, no clock of its own (the caller passes `now`). Owns: the per-input
//! queues and the idle rule. Must not touch: what a record means (the task) or offsets
//! (a buffered record is not processed, so its offset is not committed).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::replay::Origin;
use crate::task::SourceMessage;

/// How long a merged task waits for an input with nothing buffered.
pub const MAX_IDLE: Duration = Duration::from_millis(500);

/// Records a task may buffer while it waits for an input: beyond this the inputs it
/// holds records of are paused (an awaited partition whose leader is away must not
/// fill the worker's memory with the other's backlog), and resumed below half of it.
pub const MAX_BUFFERED: usize = 20_000;

/// A change of which inputs the consumer fetches for the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flow {
    Pause(Vec<String>),
    Resume(Vec<String>),
}

/// A record the consumer handed over, owned while it waits for its turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Buffered {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp: Option<i64>,
    pub record_key: Option<Vec<u8>>,
    pub origin: Option<Origin>,
}

impl Buffered {
    pub fn message(&self) -> SourceMessage<'_> {
        SourceMessage {
            topic: &self.topic,
            partition: self.partition,
            offset: self.offset,
            key: self.key.as_deref(),
            value: self.value.as_deref(),
            timestamp: self.timestamp,
            record_key: self.record_key.as_deref(),
        }
    }
}

/// What the consumer's statistics last said about one input partition of a task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fetched {
    /// When the statistics were taken.
    pub at: Instant,
    /// Whether the partition is being fetched and a fetch has answered (`end` is known).
    pub fetching: bool,
    /// The offset after the last record or transaction marker handed over; negative
    /// when nothing was yet.
    pub app_offset: i64,
    /// The end as of the last fetch: the last stable offset under `read_committed`,
    /// else the high watermark; negative when unknown.
    pub end: i64,
}

/// Why a task may or may not take the next record while an input has nothing buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Empty {
    /// Records are known to be on their way: wait for them.
    Behind,
    /// Known to have nothing more, as of statistics taken during this wait.
    CaughtUp,
    /// Nothing known since the wait began: wait up to [`MAX_IDLE`].
    Unknown,
}

/// The queues of one task, one per input topic, in the stage's input order.
#[derive(Debug, Default)]
pub struct Merge {
    /// One queue per entry of `inputs`, in the same order.
    queues: Vec<VecDeque<Buffered>>,
    inputs: Vec<String>,
    /// Per input: the offset after the last record pushed, or where it was assigned
    /// (`None`: not known).
    next: Vec<Option<i64>>,
    /// Since when some input has had nothing buffered while another had.
    waiting_since: Option<Instant>,
    /// The input the last wait was for, while it is known to be behind.
    behind: Option<usize>,
    /// The inputs paused because too much was buffered (see [`MAX_BUFFERED`]).
    paused: Vec<String>,
}

impl Merge {
    /// `starts`: where each input was assigned (absent: not known; such an input is
    /// waited for by the idle rule until its first record).
    pub fn new(inputs: &[String], starts: &BTreeMap<String, i64>) -> Self {
        Self {
            queues: inputs.iter().map(|_| VecDeque::new()).collect(),
            next: inputs.iter().map(|t| starts.get(t).copied()).collect(),
            inputs: inputs.to_vec(),
            waiting_since: None,
            behind: None,
            paused: Vec::new(),
        }
    }

    /// Whether the consumer should pause the inputs the task holds records of (it waits
    /// for another with [`MAX_BUFFERED`] records buffered), or resume them (below half).
    pub fn flow(&mut self) -> Option<Flow> {
        if self.paused.is_empty()
            && self.len() >= MAX_BUFFERED
            && self.queues.iter().any(VecDeque::is_empty)
        {
            self.paused = self
                .inputs
                .iter()
                .zip(&self.queues)
                .filter(|(_, q)| !q.is_empty())
                .map(|(t, _)| t.clone())
                .collect();
            return Some(Flow::Pause(self.paused.clone()));
        }
        if !self.paused.is_empty() && self.len() <= MAX_BUFFERED / 2 {
            return Some(Flow::Resume(std::mem::take(&mut self.paused)));
        }
        None
    }

    /// Whether records of `topic` are merged (a table's rows are not: they are applied
    /// as they come).
    pub fn reads(&self, topic: &str) -> bool {
        self.inputs.iter().any(|t| t == topic)
    }

    pub fn push(&mut self, b: Buffered) {
        if let Some(i) = self.inputs.iter().position(|t| *t == b.topic) {
            self.next[i] = Some(b.offset + 1);
            self.queues[i].push_back(b);
        }
    }

    pub fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The input a task has been waiting for, and for how long, while that input is
    /// known to have records not yet handed over.
    pub fn stalled(&self, now: Instant) -> Option<(&str, Duration)> {
        let i = self.behind?;
        let since = self.waiting_since?;
        Some((self.inputs[i].as_str(), now.duration_since(since)))
    }

    /// Input `i`, with nothing buffered, in a wait that began at `since`.
    fn empty(&self, i: usize, since: Instant, fetched: Option<Fetched>) -> Empty {
        let Some(f) = fetched else {
            return Empty::Unknown;
        };
        if !f.fetching || f.end < 0 {
            return Empty::Behind;
        }
        let known = self.next[i].map(|n| n.max(f.app_offset));
        let Some(position) = known.or((f.app_offset >= 0).then_some(f.app_offset)) else {
            return Empty::Unknown;
        };
        match (position < f.end, f.at >= since) {
            (true, _) => Empty::Behind,
            (false, true) => Empty::CaughtUp,
            (false, false) => Empty::Unknown,
        }
    }

    /// The next record to process, if its turn has come: the smallest timestamp among
    /// the queues' heads (the first input on a tie), once no empty input is awaited
    /// (see the module docs). `fetched` gives an input topic's statistics for this
    /// task's partition.
    pub fn next(
        &mut self,
        now: Instant,
        fetched: &dyn Fn(&str) -> Option<Fetched>,
    ) -> Option<Buffered> {
        if self.is_empty() {
            self.waiting_since = None;
            self.behind = None;
            return None;
        }
        if self.queues.iter().any(VecDeque::is_empty) {
            let since = *self.waiting_since.get_or_insert(now);
            let mut idle = false;
            for (i, _) in self.queues.iter().enumerate().filter(|(_, q)| q.is_empty()) {
                match self.empty(i, since, fetched(&self.inputs[i])) {
                    Empty::Behind => {
                        self.behind = Some(i);
                        return None;
                    }
                    Empty::Unknown => idle = true,
                    Empty::CaughtUp => {}
                }
            }
            self.behind = None;
            if idle && now.duration_since(since) < MAX_IDLE {
                return None;
            }
            // The wait stays open while the input is empty: once it has been waited
            // for, the other input's buffered records do not each wait again.
        } else {
            self.waiting_since = None;
            self.behind = None;
        }
        let (i, _) = self
            .queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| q.front().map(|b| (i, b.timestamp.unwrap_or(i64::MIN))))
            .min_by_key(|&(i, ts)| (ts, i))?;
        self.queues[i].pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(topic: &str, offset: i64, ts: i64) -> Buffered {
        Buffered {
            topic: topic.into(),
            partition: 0,
            offset,
            key: None,
            value: None,
            timestamp: Some(ts),
            record_key: None,
            origin: None,
        }
    }

    /// No statistics: the idle rule alone.
    fn unknown(_: &str) -> Option<Fetched> {
        None
    }

    fn drain(m: &mut Merge, now: Instant) -> Vec<(String, i64)> {
        drain_with(m, now, &unknown)
    }

    fn drain_with(
        m: &mut Merge,
        now: Instant,
        fetched: &dyn Fn(&str) -> Option<Fetched>,
    ) -> Vec<(String, i64)> {
        std::iter::from_fn(|| m.next(now, fetched))
            .map(|b| (b.topic, b.offset))
            .collect()
    }

    #[test]
    fn records_come_out_in_timestamp_order_across_inputs() {
        let mut m = Merge::new(&["a".into(), "b".into()], &BTreeMap::new());
        let t0 = Instant::now();
        for (o, ts) in [(0, 10), (1, 30), (2, 50)] {
            m.push(rec("a", o, ts));
        }
        for (o, ts) in [(0, 20), (1, 30), (2, 40)] {
            m.push(rec("b", o, ts));
        }
        // Once "b" is drained, "a" waits for it.
        assert_eq!(
            drain(&mut m, t0),
            vec![
                ("a".into(), 0),
                ("b".into(), 0),
                ("a".into(), 1),
                ("b".into(), 1),
                ("b".into(), 2)
            ]
        );
        assert_eq!(m.len(), 1, "a@2 waits for b");
        assert_eq!(drain(&mut m, t0 + MAX_IDLE / 2), vec![]);
        assert_eq!(drain(&mut m, t0 + MAX_IDLE), vec![("a".into(), 2)]);
    }

    fn fetched(at: Instant, app_offset: i64, end: i64) -> Fetched {
        Fetched {
            at,
            fetching: true,
            app_offset,
            end,
        }
    }

    #[test]
    fn an_input_with_records_not_yet_handed_over_holds_the_other_back_however_long() {
        // After a restart on a busy machine one input's first fetch can come seconds
        // after the other's: going on without it makes its records late.
        let starts = BTreeMap::from([("a".to_string(), 0), ("b".to_string(), 0)]);
        let mut m = Merge::new(&["a".into(), "b".into()], &starts);
        let t0 = Instant::now();
        m.push(rec("a", 0, 100));
        let behind = |t: &str| (t == "b").then(|| fetched(t0, -1, 5));
        assert_eq!(m.next(t0, &behind), None);
        let much_later = t0 + MAX_IDLE * 100;
        assert_eq!(m.next(much_later, &behind), None, "b has 5 records to come");
        assert_eq!(
            m.stalled(much_later).map(|(t, _)| t.to_string()),
            Some("b".to_string())
        );
        // Not yet fetched at all (the fetch is starting): the same.
        let starting = |t: &str| {
            (t == "b").then(|| Fetched {
                fetching: false,
                end: -1,
                ..fetched(t0, -1, -1)
            })
        };
        assert_eq!(m.next(much_later, &starting), None);
        // The first of its records arrives: it goes first; then b is awaited again, for
        // the four still to come.
        m.push(rec("b", 0, 50));
        assert_eq!(
            drain_with(&mut m, much_later, &behind),
            vec![("b".into(), 0)]
        );
        // Caught up at last: a goes on.
        let caught_up = |t: &str| (t == "b").then(|| fetched(much_later, -1, 1));
        assert_eq!(
            drain_with(&mut m, much_later, &caught_up),
            vec![("a".into(), 0)]
        );
    }

    #[test]
    fn an_input_known_to_be_caught_up_does_not_hold_the_other_back() {
        let mut starts = BTreeMap::new();
        starts.insert("b".to_string(), 7);
        let mut m = Merge::new(&["a".into(), "b".into()], &starts);
        let t0 = Instant::now();
        m.push(rec("a", 0, 100));
        // Statistics from before the wait began prove nothing about now.
        let stale = |t: &str| (t == "b").then(|| fetched(t0, -1, 7));
        assert_eq!(m.next(t0 + Duration::from_millis(1), &stale), None);
        // Fresh ones: b was assigned at its end (7), nothing to come.
        let fresh = |t: &str| (t == "b").then(|| fetched(t0 + Duration::from_millis(2), -1, 7));
        assert_eq!(
            m.next(t0 + Duration::from_millis(3), &fresh)
                .map(|b| b.offset),
            Some(0)
        );
        // A transaction marker after b's last record: the app offset passed it.
        m.push(rec("b", 7, 150));
        m.push(rec("a", 1, 200));
        let marker = |t: &str| (t == "b").then(|| fetched(t0 + MAX_IDLE, 9, 9));
        assert_eq!(
            drain_with(&mut m, t0 + MAX_IDLE, &marker),
            vec![("b".into(), 7), ("a".into(), 1)]
        );
    }

    #[test]
    fn an_input_whose_start_is_unknown_is_waited_for_by_the_idle_rule_until_its_first_record() {
        let mut m = Merge::new(&["a".into(), "b".into()], &BTreeMap::new());
        let t0 = Instant::now();
        m.push(rec("a", 0, 100));
        // Fresh statistics, caught up by their figures, but where b started is unknown.
        let looks_caught_up = |t: &str| (t == "b").then(|| fetched(t0, -1, 3));
        assert_eq!(m.next(t0, &looks_caught_up), None);
        assert_eq!(
            m.next(t0 + MAX_IDLE, &looks_caught_up).map(|b| b.offset),
            Some(0)
        );
    }

    #[test]
    fn a_task_waiting_with_too_much_buffered_pauses_the_full_input_until_it_drains() {
        let starts = BTreeMap::from([("a".to_string(), 0), ("b".to_string(), 0)]);
        let mut m = Merge::new(&["a".into(), "b".into()], &starts);
        let t0 = Instant::now();
        let behind = |t: &str| (t == "b").then(|| fetched(t0, -1, 5));
        for o in 0..MAX_BUFFERED as i64 - 1 {
            m.push(rec("a", o, o));
        }
        assert_eq!(m.flow(), None, "below the limit");
        m.push(rec("a", MAX_BUFFERED as i64, 0));
        assert_eq!(m.flow(), Some(Flow::Pause(vec!["a".into()])));
        assert_eq!(m.flow(), None, "paused once");
        // b's records arrive: the merge drains a, and a resumes below half.
        m.push(rec("b", 0, i64::MAX));
        let mut resumed = None;
        while m.next(t0, &behind).is_some() {
            if let Some(f) = m.flow() {
                resumed = Some((f, m.len()));
                break;
            }
        }
        assert_eq!(
            resumed,
            Some((Flow::Resume(vec!["a".into()]), MAX_BUFFERED / 2))
        );
    }

    #[test]
    fn a_quiet_input_holds_the_other_back_for_at_most_the_idle_time() {
        let mut m = Merge::new(&["a".into(), "b".into()], &BTreeMap::new());
        let t0 = Instant::now();
        m.push(rec("a", 0, 100));
        assert_eq!(m.next(t0, &unknown), None);
        assert_eq!(m.next(t0 + Duration::from_millis(499), &unknown), None);
        assert_eq!(m.next(t0 + MAX_IDLE, &unknown).map(|b| b.offset), Some(0));
        // A record on the quiet input ends the wait: order is by timestamp again.
        m.push(rec("a", 1, 300));
        m.push(rec("b", 0, 200));
        let later = t0 + MAX_IDLE * 3;
        assert_eq!(drain(&mut m, later)[0], ("b".into(), 0));
    }
}
