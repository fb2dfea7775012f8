//! Timestamp-ordered merging of a task's input partitions, for the stages whose
//! stream–stream joins read a second topic (Kafka Streams' record choosing across a
//! task's partitions, with `max.task.idle.ms`).
//!
//! A join's result depends on the order its two sides arrive in: the stream time, and
//! so what is late and when a window closes, moves with every record. The consumer
//! hands over one partition's fetch after the other, so after a restart with a backlog
//! one side could run minutes ahead and make the other side late. A merged task
//! therefore buffers what the consumer hands it per input topic and always processes
//! the buffered record with the smallest Kafka timestamp, waiting while an input has
//! nothing buffered, for at most [`MAX_IDLE`]: then it goes on with what it has (a
//! quiet input must not stop the other).
//!
//! Pure: no Kafka, no clock of its own (the caller passes `now`). Owns: the per-input
//! queues and the idle rule. Must not touch: what a record means (the task) or offsets
//! (a buffered record is not processed, so its offset is not committed).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::replay::Origin;
use crate::task::SourceMessage;

/// How long a merged task waits for an input with nothing buffered.
pub const MAX_IDLE: Duration = Duration::from_millis(500);

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

/// The queues of one task, one per input topic, in the stage's input order.
#[derive(Debug, Default)]
pub struct Merge {
    /// One queue per entry of `inputs`, in the same order.
    queues: Vec<VecDeque<Buffered>>,
    inputs: Vec<String>,
    /// Since when some input has had nothing buffered while another had.
    waiting_since: Option<Instant>,
}

impl Merge {
    pub fn new(inputs: &[String]) -> Self {
        Self {
            queues: inputs.iter().map(|_| VecDeque::new()).collect(),
            inputs: inputs.to_vec(),
            waiting_since: None,
        }
    }

    /// Whether records of `topic` are merged (a table's rows are not: they are applied
    /// as they come).
    pub fn reads(&self, topic: &str) -> bool {
        self.inputs.iter().any(|t| t == topic)
    }

    pub fn push(&mut self, b: Buffered) {
        if let Some(i) = self.inputs.iter().position(|t| *t == b.topic) {
            self.queues[i].push_back(b);
        }
    }

    pub fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next record to process, if its turn has come: the smallest timestamp among
    /// the queues' heads (the first input on a tie), once every input has one or the
    /// empty ones have been waited for [`MAX_IDLE`].
    pub fn next(&mut self, now: Instant) -> Option<Buffered> {
        if self.is_empty() {
            self.waiting_since = None;
            return None;
        }
        if self.queues.iter().any(VecDeque::is_empty) {
            let since = *self.waiting_since.get_or_insert(now);
            if now.duration_since(since) < MAX_IDLE {
                return None;
            }
        } else {
            self.waiting_since = None;
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

    fn drain(m: &mut Merge, now: Instant) -> Vec<(String, i64)> {
        std::iter::from_fn(|| m.next(now))
            .map(|b| (b.topic, b.offset))
            .collect()
    }

    #[test]
    fn records_come_out_in_timestamp_order_across_inputs() {
        let mut m = Merge::new(&["a".into(), "b".into()]);
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

    #[test]
    fn a_quiet_input_holds_the_other_back_for_at_most_the_idle_time() {
        let mut m = Merge::new(&["a".into(), "b".into()]);
        let t0 = Instant::now();
        m.push(rec("a", 0, 100));
        assert_eq!(m.next(t0), None);
        assert_eq!(m.next(t0 + Duration::from_millis(499)), None);
        assert_eq!(m.next(t0 + MAX_IDLE).map(|b| b.offset), Some(0));
        // A record on the quiet input ends the wait: order is by timestamp again.
        m.push(rec("a", 1, 300));
        m.push(rec("b", 0, 200));
        let later = t0 + MAX_IDLE * 3;
        assert_eq!(drain(&mut m, later)[0], ("b".into(), 0));
    }
}
