//! Sending a task's outputs: sink, `to`, repartition and dead-letter records, each
//! checked against its topic's size limit first ([`super::oversize`]), so one record
//! that cannot be produced becomes that record's error instead of stopping the task.
//!
//! Owns the shape of what is sent (headers, partitions); it must not decide when to
//! commit (the run loop and `commit` do).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};

use super::kafka::{KProducer, send};
use super::oversize::{self, Limits, TooLarge};
use super::replay::{ORIGIN_HEADER, Origin};
use super::{Engine, EngineError};
use crate::metrics::{METRICS, task as task_label};
use crate::task::{KEY_HEADER, Outcome, Output};
use oxbow_crds::TaskId;

/// One record about to be sent.
struct Record<'a> {
    topic: &'a str,
    partition: Option<i32>,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers: Vec<(&'static str, &'a [u8])>,
    timestamp: Option<i64>,
}

/// Sends `r` unless it is over its topic's limit. `Some(size)`: not sent, too large
/// (by the limits read at start, or as librdkafka found at send time).
fn send_within(
    p: &KProducer,
    limits: &Limits,
    r: &Record<'_>,
) -> Result<Option<usize>, EngineError> {
    let size = oversize::record_size(r.key, r.value, &r.headers);
    if size > limits.of(r.topic) {
        return Ok(Some(size));
    }
    let headers = (!r.headers.is_empty()).then(|| {
        r.headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: Some(*v),
            })
        })
    });
    match send(
        p,
        r.topic,
        r.partition,
        r.key,
        r.value,
        headers,
        r.timestamp,
    ) {
        Ok(()) => Ok(None),
        Err(EngineError::Produce {
            source: KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
            ..
        }) => Ok(Some(size)),
        Err(e) => Err(e),
    }
}

/// Sends a dead letter, truncated when it is over the dead-letter topic's limit.
fn send_dead_letter(
    p: &KProducer,
    limits: &Limits,
    topic: &str,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&'static str, String)],
) -> Result<(), EngineError> {
    let cut = oversize::truncated(key, value, headers, limits.of(topic));
    let (key, value, headers) = match &cut {
        Some((k, v, h)) => (k.as_deref(), v.as_deref(), h.as_slice()),
        None => (key, value, headers),
    };
    let r = Record {
        topic,
        partition: None,
        key,
        value,
        headers: headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect(),
        timestamp: None,
    };
    match send_within(p, limits, &r)? {
        None => Ok(()),
        Some(size) => {
            tracing::error!(%topic, size, "a truncated dead letter is still too large");
            Err(EngineError::Produce {
                topic: topic.into(),
                source: KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
            })
        }
    }
}

/// What became of the outputs of one input.
#[derive(Default)]
struct Sent {
    sent: u64,
    diverted: u64,
    skipped: u64,
    failed: Option<String>,
}

/// What a task's outputs are sent with besides its producer: the topics, their size
/// limits and the error policy, and where the counts go. Shared by the loop's thread
/// and the processing threads.
pub(super) struct Sender<'a> {
    pub(super) sink: Option<&'a str>,
    pub(super) dlq: Option<&'a str>,
    pub(super) limits: &'a Limits,
    pub(super) policy: oxbow_crds::ErrorPolicy,
    pub(super) shared: &'a crate::status::Shared,
}

impl Engine {
    pub(super) fn sender(&self) -> Sender<'_> {
        Sender {
            sink: self.sink_topic.as_deref(),
            dlq: self.dlq_topic.as_deref(),
            limits: &self.limits,
            policy: self.app.manifest.spec.errors.policy,
            shared: &self.shared,
        }
    }

    /// Sends a task's outputs with its producer (see [`send_outputs`]); an output that
    /// fails the task (`errors.policy: fail`, too large) fails it here.
    pub(super) fn send_outputs(
        &mut self,
        id: TaskId,
        out: &[Output],
        from: Option<(&str, i32, i64)>,
    ) -> Result<(), EngineError> {
        if out.is_empty() {
            return Ok(());
        }
        self.producer_for(id)?;
        let p = match &self.producers {
            super::kafka::Producers::Shared(p) => p,
            super::kafka::Producers::Transactional(m) => &m[&id].0,
        };
        if let Some(why) = send_outputs(&self.sender(), p, id, out, from)? {
            self.record_outcome(id, "", &Outcome::Failed(why))?;
        }
        Ok(())
    }
}

/// Sends a task's outputs. `from` is the input record they came from (topic,
/// partition, offset) under at-least-once: its repartitioned outputs carry it as
/// their origin, so the next stage can drop them when a replay writes them again.
/// `Some(why)`: an output failed the task (`errors.policy: fail`); the outputs after it
/// were not sent.
pub(super) fn send_outputs(
    s: &Sender<'_>,
    p: &KProducer,
    id: TaskId,
    out: &[Output],
    from: Option<(&str, i32, i64)>,
) -> Result<Option<String>, EngineError> {
    let (sink, dlq, limits) = (s.sink, s.dlq, s.limits);
    let mut done = Sent::default();
    let mut index = 0u32;
    // The origin header's text: records borrow their headers.
    let mut origin: String;
    for o in out {
        let record = match o {
            Output::Sink {
                key,
                value,
                timestamp,
            } => match sink {
                Some(topic) => Record {
                    topic,
                    partition: None,
                    key: key.as_deref(),
                    value: Some(value),
                    headers: vec![],
                    timestamp: Some(*timestamp),
                },
                None => continue,
            },
            Output::Repartition {
                topic,
                partition,
                key,
                value,
                record_key,
                timestamp,
            } => {
                let mut headers = vec![(KEY_HEADER, record_key.as_slice())];
                if let Some((t, partition, offset)) = from {
                    origin = Origin::header(t, partition, offset, index);
                    index += 1;
                    headers.push((ORIGIN_HEADER, origin.as_bytes()));
                }
                Record {
                    topic,
                    partition: Some(*partition),
                    key: Some(key),
                    value: Some(value),
                    headers,
                    timestamp: Some(*timestamp),
                }
            }
            Output::To(r) => Record {
                topic: &r.topic,
                partition: None,
                key: r.key.as_deref(),
                value: Some(&r.value),
                headers: vec![],
                timestamp: Some(r.timestamp),
            },
            Output::DeadLetter {
                key,
                value,
                headers,
            } => {
                if let Some(topic) = dlq {
                    send_dead_letter(p, limits, topic, key.as_deref(), value.as_deref(), headers)?;
                }
                continue;
            }
        };
        let Some(size) = send_within(p, limits, &record)? else {
            done.sent += 1;
            continue;
        };
        if too_large(s, p, id, &record, size, from, &mut done)? {
            break;
        }
    }
    count(s, id, &done);
    Ok(done.failed)
}

/// An output too large to produce, handled as the error policy says: dead-lettered
/// (with its origin under at-least-once), skipped, or failing the task (`true`: send
/// nothing more).
fn too_large(
    s: &Sender<'_>,
    p: &KProducer,
    id: TaskId,
    record: &Record<'_>,
    size: usize,
    from: Option<(&str, i32, i64)>,
    done: &mut Sent,
) -> Result<bool, EngineError> {
    match oversize::too_large(s.policy, record.topic, size, s.limits.of(record.topic)) {
        TooLarge::DeadLetter(mut headers) => {
            if let Some((t, partition, offset)) = from {
                headers.push(("oxbow.topic", t.into()));
                headers.push(("oxbow.partition", partition.to_string()));
                headers.push(("oxbow.offset", offset.to_string()));
            }
            if let Some(topic) = s.dlq {
                send_dead_letter(p, s.limits, topic, record.key, record.value, &headers)?;
            }
            tracing::warn!(task = %id, topic = record.topic, size, "an output too large to produce was dead-lettered");
            done.diverted += 1;
        }
        TooLarge::Skip(why) => {
            tracing::warn!(task = %id, error = %why, "skipping an output too large to produce");
            done.skipped += 1;
        }
        TooLarge::Fail(why) => {
            done.failed = Some(why);
            return Ok(true);
        }
    }
    Ok(false)
}

/// What a task's outputs did, into the metrics and its status entry.
fn count(s: &Sender<'_>, id: TaskId, done: &Sent) {
    let label = task_label(id);
    METRICS.records_out.get_or_create(&label).inc_by(done.sent);
    if done.diverted > 0 {
        METRICS
            .dead_letters
            .get_or_create(&label)
            .inc_by(done.diverted);
        s.shared.task(id, |t| t.dead_letters += done.diverted);
    }
    if done.skipped > 0 {
        METRICS.skipped.get_or_create(&label).inc_by(done.skipped);
        s.shared.task(id, |t| t.skipped += done.skipped);
    }
}
