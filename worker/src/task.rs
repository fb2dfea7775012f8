//! One task: a partition number of the source topics, its stores, its processors and its
//! unit of work. Turns a source record into outputs (sink records or a dead letter) and,
//! at commit, into changelog records plus one WriteBatch. No Kafka I/O here: the engine
//! sends what this returns.

use std::collections::BTreeMap;
use std::sync::Arc;

use oxbow_crds::{ErrorPolicy, Partitioner, TaskId};
use serde_json::Value as Json;

use crate::config::App;
pub use crate::decode::decode;
use crate::decode::{decode_join_stream, decode_repartitioned, event_time, undecodable};
use crate::engine::replay::Marks;
use crate::expr::{Env, Input};
use crate::overlay::Overlay;
use crate::processor::{Context, Lookups, Processor, Record, SourcePos, StepError, ToRecord};
use crate::query::partition_for;
use crate::store::{StoreError, TaskDb};

/// Changelog header carrying the source positions that produced a unit of work's
/// records: `topic:offset[,topic:offset]`, the last offset processed per topic.
pub const SOURCE_HEADER: &str = "oxbow.source";

/// Repartition record header carrying the record's own key as JSON: the Kafka key of a
/// repartition record is the next stage's key, which the record's key need not be.
pub const KEY_HEADER: &str = "oxbow.key";

/// The error-policy reason of a record whose partition breaks `source.partitionedBy`.
pub const NOT_PARTITIONED_AS_DECLARED: &str = "NotPartitionedAsDeclared";

/// 9999-12-31T23:59:59.999Z: the largest event time accepted.
pub const MAX_TIMESTAMP: i64 = 253_402_300_799_999;

/// A record read from a source topic.
pub struct SourceMessage<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub timestamp: Option<i64>,
    /// Stage > 0: the record's own key as JSON ([`KEY_HEADER`]).
    pub record_key: Option<&'a [u8]>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Sink {
        key: Option<Vec<u8>>,
        value: Vec<u8>,
        timestamp: i64,
    },
    /// To the next stage: keyed by its key, to the partition murmur2 gives that key.
    Repartition {
        topic: Arc<str>,
        partition: i32,
        key: Vec<u8>,
        /// The record's value as JSON.
        value: Vec<u8>,
        /// The record's key as JSON ([`KEY_HEADER`]).
        record_key: Vec<u8>,
        timestamp: i64,
    },
    /// From a `to` step: to a topic of its choosing.
    To(ToRecord),
    /// The original bytes with the reason in headers.
    DeadLetter {
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<(&'static str, String)>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Processed,
    DeadLettered,
    Skipped,
    /// `errors.policy: fail`: the task stops before this record.
    Failed(String),
}

/// What a commit writes: changelog records, the WriteBatch, the positions.
pub struct Commit {
    pub writes: Vec<crate::overlay::Write>,
    pub source_header: String,
    pub positions: BTreeMap<String, i64>,
    /// Stage > 0 under at-least-once: the replay marks at `positions`.
    pub marks: Marks,
}

pub struct Task {
    pub id: TaskId,
    /// Partitions of every stage (the source partition count).
    partitions: u32,
    /// The next stage's repartition topic, when this stage is not the last.
    next_topic: Option<Arc<str>>,
    /// Shared with query readers; only the engine writes.
    pub db: Arc<TaskDb>,
    overlay: Overlay,
    processors: Vec<Box<dyn Processor>>,
    lookups: Arc<dyn Lookups>,
    /// The topics of the co-partitioned tables this task keeps, with their stores.
    tables: Vec<(String, oxbow_crds::StoreName)>,
    /// Next offset per source topic.
    pub positions: BTreeMap<String, i64>,
    /// Something happened since the last commit (records, punctuation output).
    pub uncommitted: u64,
    /// Stage > 0 under at-least-once: the highest origin processed per upstream
    /// partition ([`crate::engine::replay`]).
    pub marks: Marks,
    pub failed: Option<String>,
    /// How the steps write their stores' values (`App::store_encoding`).
    encoding: oxbow_crds::StoreEncoding,
}

impl Task {
    pub fn new(
        app: &App,
        id: TaskId,
        partitions: u32,
        db: Arc<TaskDb>,
        processors: Vec<Box<dyn Processor>>,
        lookups: Arc<dyn Lookups>,
    ) -> Self {
        Self {
            id,
            partitions,
            next_topic: app.next_stage_topic(id.stage).map(Arc::from),
            encoding: app.store_encoding,
            db,
            overlay: Overlay::default(),
            processors,
            lookups,
            tables: app
                .stage_tables(id.stage)
                .iter()
                .map(|(s, t)| (t.clone(), s.clone()))
                .collect(),
            positions: BTreeMap::new(),
            uncommitted: 0,
            marks: Marks::default(),
            failed: None,
        }
    }

    /// After restore: processors rebuild their in-memory hints from the stores.
    pub fn init(&mut self, env: &Env) -> Result<(), StepError> {
        let mut sends = Vec::new();
        let mut ctx = Context {
            task: self.id,
            overlay: &mut self.overlay,
            db: &self.db,
            env,
            source: None,
            now_ms: now_ms(),
            lookups: &*self.lookups,
            sends: &mut sends,
            encoding: self.encoding,
        };
        for p in &mut self.processors {
            p.init(&mut ctx)?;
        }
        // What a step wrote while starting (a migrated index) is a unit of work of its
        // own: a first record that fails must not take it away.
        if self.overlay.has_scope() {
            self.overlay.commit_record();
            self.uncommitted += 1;
        }
        Ok(())
    }

    pub fn process(
        &mut self,
        app: &App,
        env: &Env,
        msg: &SourceMessage<'_>,
        now: i64,
        out: &mut Vec<Output>,
    ) -> Result<Outcome, StoreError> {
        let source = SourcePos {
            topic: msg.topic.to_string(),
            partition: msg.partition,
            offset: msg.offset,
        };
        let mut produced = Vec::new();
        let result = self.run(app, env, msg, source, now, &mut produced);
        let outcome = match result {
            Ok(()) => {
                self.overlay.commit_record();
                self.processors.iter_mut().for_each(|p| p.end_record(true));
                out.extend(produced);
                Outcome::Processed
            }
            Err((step, e)) => {
                self.overlay.abort_record();
                self.processors.iter_mut().for_each(|p| p.end_record(false));
                let message = match e {
                    StepError::State(e) => return Err(e),
                    StepError::Record(e) => e.to_string(),
                };
                match app.manifest.spec.errors.policy {
                    ErrorPolicy::DeadLetter => {
                        out.push(Output::DeadLetter {
                            key: msg.key.map(<[u8]>::to_vec),
                            value: msg.value.map(<[u8]>::to_vec),
                            headers: vec![
                                ("oxbow.error", message),
                                ("oxbow.step", step),
                                ("oxbow.topic", msg.topic.to_string()),
                                ("oxbow.partition", msg.partition.to_string()),
                                ("oxbow.offset", msg.offset.to_string()),
                            ],
                        });
                        Outcome::DeadLettered
                    }
                    ErrorPolicy::Skip => {
                        tracing::warn!(task = %self.id, topic = msg.topic, offset = msg.offset, step = %step, error = %message, "skipping record");
                        Outcome::Skipped
                    }
                    ErrorPolicy::Fail => {
                        let m = format!(
                            "record {}/{}@{} failed in step {step}: {message}",
                            msg.topic, msg.partition, msg.offset
                        );
                        self.failed = Some(m.clone());
                        return Ok(Outcome::Failed(m));
                    }
                }
            }
        };
        self.positions.insert(msg.topic.to_string(), msg.offset + 1);
        self.uncommitted += 1;
        Ok(outcome)
    }

    /// Runs every step; on failure returns the step's name with the error.
    fn run(
        &mut self,
        app: &App,
        env: &Env,
        msg: &SourceMessage<'_>,
        source: SourcePos,
        now: i64,
        produced: &mut Vec<Output>,
    ) -> Result<(), (String, StepError)> {
        if let Some((_, store)) = self.tables.iter().find(|(t, _)| t == msg.topic) {
            // A table row: the latest value per key, a tombstone deletes. Stored as the
            // topic has it; joins decode it.
            let Some(key) = msg.key else {
                return Err((
                    format!("table-{store}"),
                    StepError::invalid("a table row without a key"),
                ));
            };
            match msg.value {
                Some(v) => self.overlay.put(store, key, v.to_vec()),
                None => self.overlay.delete(store, key),
            }
            return Ok(());
        }
        // A joined stream's records enter the steps at their join.
        let (from, (key, value, timestamp)) = match app.join_streams.get(msg.topic) {
            Some(j) => (
                j.step,
                decode_join_stream(j, env, msg, now, self.partitions)?,
            ),
            None if self.id.stage == 0 => (0, self.decode_source(app, env, msg, now)?),
            None => (0, decode_repartitioned(msg, now)?),
        };
        let records = vec![(
            Record {
                key,
                value,
                timestamp,
            },
            false,
        )];
        let mut sends = Vec::new();
        let mut ctx = Context {
            task: self.id,
            overlay: &mut self.overlay,
            db: &self.db,
            env,
            source: Some(source),
            now_ms: now,
            lookups: &*self.lookups,
            sends: &mut sends,
            encoding: self.encoding,
        };
        let isolate = app.manifest.spec.errors.policy != ErrorPolicy::Fail;
        let mut dead = Vec::new();
        let records = run_steps(
            &mut self.processors,
            from,
            &mut ctx,
            records,
            isolate,
            &mut dead,
        )?;
        let src = ctx.source.clone();
        produced.extend(sends.into_iter().map(Output::To));
        Self::emit_to(
            self.next_topic.as_ref(),
            self.partitions,
            self.id.stage,
            app,
            env,
            records,
            isolate,
            &mut dead,
            produced,
        )?;
        dead_emissions(self.id, app, dead, src.as_ref(), produced);
        Ok(())
    }

    /// Wall-clock work of every processor (batch `maxWait`), as its own unit of work.
    pub fn punctuate(
        &mut self,
        app: &App,
        env: &Env,
        now: i64,
        out: &mut Vec<Output>,
    ) -> Result<(), StoreError> {
        let mut produced = Vec::new();
        let mut sends = Vec::new();
        let mut ctx = Context {
            task: self.id,
            overlay: &mut self.overlay,
            db: &self.db,
            env,
            source: None,
            now_ms: now,
            lookups: &*self.lookups,
            sends: &mut sends,
            encoding: self.encoding,
        };
        let mut result = Ok(());
        let isolate = app.manifest.spec.errors.policy != ErrorPolicy::Fail;
        let mut dead = Vec::new();
        for i in 0..self.processors.len() {
            let mut emitted = Vec::new();
            let r = self.processors[i]
                .punctuate(&mut ctx, &mut emitted)
                .map_err(|e| (self.processors[i].name().to_string(), e))
                .and_then(|()| {
                    let flow = emitted.into_iter().map(|r| (r, true)).collect();
                    run_steps(
                        &mut self.processors,
                        i + 1,
                        &mut ctx,
                        flow,
                        isolate,
                        &mut dead,
                    )
                })
                .and_then(|recs| {
                    Self::emit_to(
                        self.next_topic.as_ref(),
                        self.partitions,
                        self.id.stage,
                        app,
                        env,
                        recs,
                        isolate,
                        &mut dead,
                        &mut produced,
                    )
                });
            if r.is_err() {
                result = r;
                break;
            }
        }
        drop(ctx);
        produced.extend(sends.into_iter().map(Output::To));
        dead_emissions(self.id, app, dead, None, &mut produced);
        match result {
            Ok(()) => {
                let any = self.overlay.has_scope() || !produced.is_empty();
                self.overlay.commit_record();
                self.processors.iter_mut().for_each(|p| p.end_record(true));
                if any {
                    self.uncommitted += 1;
                }
                out.extend(produced);
                Ok(())
            }
            Err((step, e)) => {
                self.overlay.abort_record();
                self.processors.iter_mut().for_each(|p| p.end_record(false));
                match e {
                    StepError::State(e) => Err(e),
                    StepError::Record(e) => {
                        tracing::error!(task = %self.id, step = %step, error = %e, "punctuation failed; its changes were dropped");
                        Ok(())
                    }
                }
            }
        }
    }

    /// A stage-0 record: decoded with the source formats, its event time from
    /// `source.timestamp`, and its partition checked against `source.partitionedBy`.
    fn decode_source(
        &self,
        app: &App,
        env: &Env,
        msg: &SourceMessage<'_>,
        now: i64,
    ) -> Result<(Json, Json, i64), (String, StepError)> {
        let spec = &app.manifest.spec;
        let key = decode(msg.key, spec.source.key_format)
            .map_err(|e| ("deserialize".to_string(), undecodable("key", e)))?;
        let value = match &app.source_fields {
            Some(fields) => crate::decode::decode_projected(msg.value, fields),
            None => decode(msg.value, spec.source.value_format),
        }
        .map_err(|e| ("deserialize".to_string(), undecodable("value", e)))?;
        let kafka_ts = msg.timestamp.unwrap_or(now);
        let input = Input {
            key: &key,
            value: &value,
            timestamp: kafka_ts,
        };
        if let Some(e) = &app.partitioned_by {
            let k = e
                .key(env, &input)
                .map_err(|e| ("partitionedBy".to_string(), StepError::from(e)))?;
            let want = partition_for(spec.source.partitioner, k.as_bytes(), self.partitions);
            if want != Some(msg.partition as u32) {
                return Err((
                    "partitionedBy".to_string(),
                    StepError::invalid(format!(
                        "{NOT_PARTITIONED_AS_DECLARED}: source.partitionedBy {:?} gives {k:?}, which the {:?} partitioner puts in partition {}, but the record is in partition {}; fix the producer, or remove partitionedBy so the app repartitions",
                        e.source(),
                        spec.source.partitioner,
                        want.map_or("?".into(), |p| p.to_string()),
                        msg.partition
                    )),
                ));
            }
        }
        let timestamp = event_time(app.timestamp.as_ref(), env, &input)?;
        Ok((key, value, timestamp))
    }

    /// The records that reached the end of this stage: to the next stage's repartition
    /// topic, or to the sink.
    #[allow(clippy::too_many_arguments)]
    fn emit_to(
        next_topic: Option<&Arc<str>>,
        partitions: u32,
        stage: u32,
        app: &App,
        env: &Env,
        records: Flow,
        isolate: bool,
        dead: &mut Vec<DeadEmission>,
        out: &mut Vec<Output>,
    ) -> Result<(), (String, StepError)> {
        let Some(topic) = next_topic else {
            return sink(app, env, records, isolate, dead, out);
        };
        let Some(key_expr) = app
            .stage_keys
            .get(stage as usize + 1)
            .and_then(Option::as_ref)
        else {
            return sink(app, env, records, isolate, dead, out);
        };
        let step = match app.topology.next(stage).map(|s| &s.input) {
            Some(oxbow_crds::topology::StageInput::Repartition { step, .. }) => step.clone(),
            _ => "repartition".to_string(),
        };
        for (r, emitted) in records {
            let k = key_expr.key(env, &input_of(&r));
            match k {
                Ok(k) => {
                    let partition = partition_for(Partitioner::Murmur2, k.as_bytes(), partitions)
                        .unwrap_or(0) as i32;
                    out.push(Output::Repartition {
                        topic: topic.clone(),
                        partition,
                        key: k.into_bytes(),
                        value: serde_json::to_vec(&r.value).unwrap_or_default(),
                        record_key: serde_json::to_vec(&r.key).unwrap_or_default(),
                        timestamp: r.timestamp,
                    });
                }
                Err(e) if emitted && isolate => dead.push(DeadEmission {
                    step: step.clone(),
                    error: e.to_string(),
                    record: r,
                }),
                Err(e) => return Err((step.clone(), StepError::from(e))),
            }
        }
        Ok(())
    }

    /// Drains the unit of work for a commit.
    pub fn take_commit(&mut self) -> Commit {
        self.uncommitted = 0;
        let source_header = self
            .positions
            .iter()
            .map(|(t, next)| format!("{t}:{}", next - 1))
            .collect::<Vec<_>>()
            .join(",");
        Commit {
            writes: self.overlay.drain(),
            source_header,
            positions: self.positions.clone(),
            marks: self.marks.clone(),
        }
    }

    /// Passes over a record an upstream replay wrote again ([`crate::engine::replay`]): it was
    /// processed before, so only the position moves.
    pub fn skip_replayed(&mut self, msg: &SourceMessage<'_>) {
        self.positions.insert(msg.topic.to_string(), msg.offset + 1);
        self.uncommitted += 1;
    }
}

/// Emitted records that a later step failed on go to the error policy one by one (the
/// DLQ gets the emitted record as JSON, flagged `oxbow.emitted`), while the unit of
/// work that emitted them commits.
fn dead_emissions(
    task: TaskId,
    app: &App,
    dead: Vec<DeadEmission>,
    source: Option<&SourcePos>,
    out: &mut Vec<Output>,
) {
    for d in dead {
        if app.manifest.spec.errors.policy == ErrorPolicy::DeadLetter {
            let mut headers = vec![
                ("oxbow.error", d.error),
                ("oxbow.step", d.step),
                ("oxbow.emitted", "true".to_string()),
            ];
            if let Some(s) = source {
                headers.push(("oxbow.topic", s.topic.clone()));
                headers.push(("oxbow.partition", s.partition.to_string()));
                headers.push(("oxbow.offset", s.offset.to_string()));
            }
            crate::metrics::METRICS
                .dead_letters
                .get_or_create(&crate::metrics::task(task))
                .inc();
            out.push(Output::DeadLetter {
                key: encode_key(&d.record.key),
                value: Some(serde_json::to_vec(&d.record.value).unwrap_or_default()),
                headers,
            });
        } else {
            crate::metrics::METRICS
                .skipped
                .get_or_create(&crate::metrics::task(task))
                .inc();
            tracing::warn!(task = %task, step = %d.step, error = %d.error, "skipping an emitted record");
        }
    }
}

/// A record emitted by a stateful step that a later step (or the sink) failed on.
pub struct DeadEmission {
    pub step: String,
    pub error: String,
    pub record: Record,
}

/// Records in flight, each flagged if a stateful step emitted it (see
/// [`Processor::emits`]).
type Flow = Vec<(Record, bool)>;

fn run_steps(
    processors: &mut [Box<dyn Processor>],
    from: usize,
    ctx: &mut Context<'_>,
    mut records: Flow,
    isolate: bool,
    dead: &mut Vec<DeadEmission>,
) -> Result<Flow, (String, StepError)> {
    let mut produced = Vec::new();
    for p in processors.iter_mut().skip(from) {
        let mut next = Vec::with_capacity(records.len());
        let emits = p.emits();
        for (r, emitted) in records {
            let keep = (emitted && isolate).then(|| r.clone());
            match p.process(ctx, r, &mut produced) {
                Ok(()) => next.extend(produced.drain(..).map(|o| (o, emitted || emits))),
                Err(StepError::Record(error)) if keep.is_some() => {
                    let error = error.to_string();
                    produced.clear();
                    if let Some(record) = keep {
                        dead.push(DeadEmission {
                            step: p.name().to_string(),
                            error,
                            record,
                        });
                    }
                }
                Err(e) => return Err((p.name().to_string(), e)),
            }
        }
        records = next;
        if records.is_empty() {
            break;
        }
    }
    Ok(records)
}

fn sink(
    app: &App,
    env: &Env,
    records: Flow,
    isolate: bool,
    dead: &mut Vec<DeadEmission>,
    out: &mut Vec<Output>,
) -> Result<(), (String, StepError)> {
    if app.manifest.spec.sink.is_none() {
        return Ok(());
    }
    for (r, emitted) in records {
        match sink_one(app, env, &r) {
            Ok(o) => out.push(o),
            Err(StepError::Record(error)) if emitted && isolate => dead.push(DeadEmission {
                step: "sink".into(),
                error: error.to_string(),
                record: r,
            }),
            Err(e) => return Err(("sink".into(), e)),
        }
    }
    Ok(())
}

fn sink_one(app: &App, env: &Env, r: &Record) -> Result<Output, StepError> {
    let input = Input {
        key: &r.key,
        value: &r.value,
        timestamp: r.timestamp,
    };
    let key = match &app.sink_key {
        Some(e) => Json::String(e.key(env, &input)?),
        None => r.key.clone(),
    };
    let value = match &app.sink_value {
        Some(e) => e.json(env, &input)?,
        None => r.value.clone(),
    };
    Ok(Output::Sink {
        key: encode_key(&key),
        value: serde_json::to_vec(&value).unwrap_or_default(),
        timestamp: r.timestamp,
    })
}

fn input_of(r: &Record) -> Input<'_> {
    Input {
        key: &r.key,
        value: &r.value,
        timestamp: r.timestamp,
    }
}

/// Keys: strings as their bytes, null as no key, anything else as JSON text.
pub fn encode_key(key: &Json) -> Option<Vec<u8>> {
    match key {
        Json::Null => None,
        Json::String(s) => Some(s.as_bytes().to_vec()),
        other => Some(serde_json::to_vec(other).unwrap_or_default()),
    }
}

/// Parses [`SOURCE_HEADER`].
pub fn parse_source_header(h: &str) -> Option<BTreeMap<String, i64>> {
    h.split(',')
        .filter(|s| !s.is_empty())
        .map(|p| {
            let (t, o) = p.rsplit_once(':')?;
            Some((t.to_string(), o.parse().ok()?))
        })
        .collect()
}

/// Restore filter: a changelog record is applied only if every source offset that
/// produced its unit of work is below the committed offset, i.e. that unit committed.
pub fn produced_by_committed_work(
    header: Option<&BTreeMap<String, i64>>,
    committed: &BTreeMap<String, i64>,
    known_topics: &[String],
) -> bool {
    match header {
        // Records without the header (written by other tools) are trusted.
        None => true,
        // The committed map holds an entry per current source topic that has a
        // committed offset; a header may also name topics since removed from the spec,
        // which say nothing about the current offsets.
        Some(h) => h
            .iter()
            .filter(|(t, _)| known_topics.contains(t))
            .all(|(t, o)| {
                crate::engine::restore::apply_changelog_record(Some(*o), committed.get(t).copied())
            }),
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxbow_crds::RecordFormat;

    #[test]
    fn the_source_header_round_trips_and_filters_uncommitted_work() {
        let h = parse_source_header("in:41,other:9").expect("parses");
        let topics = vec!["in".to_string(), "other".to_string()];
        let committed = BTreeMap::from([("in".to_string(), 42), ("other".to_string(), 10)]);
        assert!(produced_by_committed_work(Some(&h), &committed, &topics));
        let behind = BTreeMap::from([("in".to_string(), 41), ("other".to_string(), 10)]);
        assert!(
            !produced_by_committed_work(Some(&h), &behind, &topics),
            "offset 41 not committed"
        );
        assert!(
            !produced_by_committed_work(Some(&h), &BTreeMap::new(), &topics),
            "nothing committed"
        );
        assert!(produced_by_committed_work(None, &BTreeMap::new(), &topics));
        assert_eq!(parse_source_header("in:x"), None);
        // A topic removed from the spec no longer vetoes its records.
        let only_in = vec!["in".to_string()];
        let committed_in = BTreeMap::from([("in".to_string(), 42)]);
        assert!(produced_by_committed_work(
            Some(&h),
            &committed_in,
            &only_in
        ));
    }

    #[test]
    fn malformed_json_is_a_decode_error_and_missing_values_are_null() {
        assert!(decode(Some(b"{\"a\":"), RecordFormat::Json).is_err());
        assert_eq!(decode(None, RecordFormat::Json).ok(), Some(Json::Null));
        assert_eq!(
            decode(Some(b"k1"), RecordFormat::String).ok(),
            Some(Json::String("k1".into()))
        );
        assert!(decode(Some(&[0xff, 0xfe]), RecordFormat::String).is_err());
    }
}
