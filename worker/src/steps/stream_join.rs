//! The `join` step with a stream: a windowed stream–stream join (Kafka Streams'
//! `KStream#join(KStream, JoinWindows)`). Records of this side reach it through the
//! steps before it; records of the other stream enter the steps here (the task starts
//! them at this step). Two records join when their join keys are equal and their event
//! times are at most `within` apart.
//!
//! Semantics, all in event time against one stream time per task (the largest event
//! time either side has shown):
//! - a record more than `grace` behind the stream time is late: dropped and counted;
//! - every other record is matched against the other side's buffered records of its
//!   key, one result per match, with the later of the two event times;
//! - it is then buffered until the stream time passes `t + within + grace`: after that
//!   no record that is not late can match it. Leaving the buffer unmatched, a record of
//!   the left side (`left`, `outer`) or of the right side (`outer`) goes on with the
//!   missing side null. An unmatched result is therefore final: a record never yields
//!   both an unmatched result and a match.
//!
//! Store layout ([`keys`]): `b<side><join key>` → JSON list of the side's buffered
//! records of that key, and the stream time. Every write is in the record's unit of
//! work, so the changelog and a restore see exactly what was committed.
//!
//! Owns: the join's buffers and its close index. Must not touch: the other stream's
//! offsets or decoding (the task does both).

use std::collections::BTreeSet;

use oxbow_crds::{JoinStep, JoinStream, JoinType, StoreName};
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

use super::{CompileError, input, keys, millis};
use crate::decode::{DecodeError, unreadable};
use crate::expr::{Expr, Input};
use crate::processor::{Context, Processor, Record, StepError};

use keys::JoinSide as Side;

/// A buffered record of one side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Buffered {
    /// Event time.
    t: i64,
    /// The value (`value` of that side).
    v: Json,
    /// Whether it has joined at least once.
    m: bool,
}

#[derive(Clone)]
pub(super) struct StreamJoin {
    name: String,
    store: StoreName,
    /// The other stream's topic: a record from it is the right side.
    other_topic: String,
    key: Expr,
    join_type: JoinType,
    within: i64,
    grace: i64,
    value: Option<Expr>,
    /// (closes after, side, join key): which buffers to look at as the stream time
    /// moves. A hint: checked against the store, rebuilt in `init`.
    closing: BTreeSet<(i64, Side, String)>,
    undo: Vec<(i64, Side, String)>,
}

impl StreamJoin {
    pub(super) fn compile(
        path: &str,
        name: String,
        store: StoreName,
        j: &JoinStep,
        stream: &JoinStream,
    ) -> Result<Self, CompileError> {
        let within = j.within.as_deref().ok_or_else(|| CompileError::Invalid {
            path: format!("{path}.join.within"),
            message: "a stream–stream join needs within".into(),
        })?;
        Ok(Self {
            name,
            store,
            other_topic: stream.topic.clone(),
            key: Expr::compile(format!("{path}.join.key"), &j.key)?,
            join_type: j.join_type,
            within: millis(&format!("{path}.join.within"), within)?,
            grace: j
                .grace
                .as_deref()
                .map(|g| millis(&format!("{path}.join.grace"), g))
                .transpose()?
                .unwrap_or(0),
            value: j
                .value
                .as_deref()
                .map(|e| Expr::compile(format!("{path}.join.value"), e))
                .transpose()?,
            closing: BTreeSet::new(),
            undo: Vec::new(),
        })
    }

    /// The instant after which a record of time `t` can no longer join.
    fn closes_after(&self, t: i64) -> i64 {
        t.saturating_add(self.within).saturating_add(self.grace)
    }

    /// Whether an unmatched record of `side` goes on when it leaves the buffer.
    fn emits_unmatched(&self, side: Side) -> bool {
        match (self.join_type, side) {
            (JoinType::Outer, _) | (JoinType::Left, Side::Left) => true,
            (JoinType::Inner, _) | (JoinType::Left, Side::Right) => false,
        }
    }

    fn load(
        ctx: &Context<'_>,
        store: &StoreName,
        side: Side,
        key: &str,
    ) -> Result<Vec<Buffered>, StepError> {
        match ctx.get(store, &keys::join_buffer_key(side, key))? {
            None => Ok(Vec::new()),
            Some(b) => serde_json::from_slice(&b).map_err(|e| {
                unreadable(
                    format!("the join buffer of key {key:?}"),
                    DecodeError::Json(e),
                )
            }),
        }
    }

    fn save(ctx: &mut Context<'_>, store: &StoreName, side: Side, key: &str, b: &[Buffered]) {
        let k = keys::join_buffer_key(side, key);
        match b.is_empty() {
            true => ctx.delete(store, &k),
            false => ctx.put(store, &k, serde_json::to_vec(b).unwrap_or_default()),
        }
    }

    /// One result: `left` and `right` are the two sides' values (null when missing).
    fn result(
        &self,
        ctx: &Context<'_>,
        key: &str,
        left: &Json,
        right: &Json,
        timestamp: i64,
    ) -> Result<Record, StepError> {
        let k = Json::String(key.to_string());
        let value = match &self.value {
            Some(e) => {
                let i = Input {
                    key: &k,
                    value: left,
                    timestamp,
                };
                e.json_with_other(ctx.env(), &i, right)?
            }
            None => json!({ "value": left, "other": right }),
        };
        Ok(Record {
            key: k,
            value,
            timestamp,
        })
    }

    /// Drops every buffered record the stream time `now` has closed, sending on the
    /// unmatched ones the join type keeps.
    fn close(
        &mut self,
        ctx: &mut Context<'_>,
        now: i64,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        while let Some(first) = self.closing.first().cloned() {
            if first.0 >= now {
                break;
            }
            self.closing.pop_first();
            let (_, side, key) = &first;
            let buffered = Self::load(ctx, &self.store, *side, key)?;
            let (gone, kept): (Vec<_>, Vec<_>) = buffered
                .into_iter()
                .partition(|b| self.closes_after(b.t) < now);
            if !gone.is_empty() {
                Self::save(ctx, &self.store, *side, key, &kept);
            }
            if self.emits_unmatched(*side) {
                for b in gone.iter().filter(|b| !b.m) {
                    let r = match side {
                        Side::Left => self.result(ctx, key, &b.v, &Json::Null, b.t)?,
                        Side::Right => self.result(ctx, key, &Json::Null, &b.v, b.t)?,
                    };
                    out.push(r);
                }
            }
            self.undo.push(first);
        }
        Ok(())
    }
}

impl Processor for StreamJoin {
    fn name(&self) -> &str {
        &self.name
    }
    fn stores(&self) -> Vec<StoreName> {
        vec![self.store.clone()]
    }
    /// Results are built from the buffers: a later step failing on one dead-letters
    /// that result alone.
    fn emits(&self) -> bool {
        true
    }
    fn init(&mut self, ctx: &mut Context<'_>) -> Result<(), StepError> {
        let mut closing = BTreeSet::new();
        let mut bad = None;
        ctx.scan(&self.store, &mut |k, v| {
            let Some((side, key)) = keys::parse_join_buffer_key(k) else {
                return Ok(());
            };
            match serde_json::from_slice::<Vec<Buffered>>(v) {
                Ok(list) => {
                    for b in list {
                        closing.insert((self.closes_after(b.t), side, key.clone()));
                    }
                }
                Err(e) => bad = Some((key.clone(), e)),
            }
            Ok(())
        })?;
        if let Some((key, e)) = bad {
            return Err(unreadable(
                format!("the join buffer of key {key:?}"),
                DecodeError::Json(e),
            ));
        }
        self.closing = closing;
        Ok(())
    }
    fn end_record(&mut self, committed: bool) {
        let undo = std::mem::take(&mut self.undo);
        if !committed {
            self.closing.extend(undo);
        }
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let side = match ctx.source() {
            Some(s) if s.topic == self.other_topic => Side::Right,
            _ => Side::Left,
        };
        let key = match side {
            Side::Left => self.key.key(ctx.env(), &input(&r))?,
            Side::Right => match &r.key {
                Json::String(s) => s.clone(),
                _ => {
                    return Err(StepError::invalid(format!(
                        "a record of stream {:?} without a string key: the other stream must be keyed by the join key",
                        self.other_topic
                    )));
                }
            },
        };
        let before = ctx
            .get(&self.store, keys::STREAM_TIME)?
            .as_deref()
            .and_then(keys::decode_time);
        if before.is_some_and(|st| r.timestamp.saturating_add(self.grace) < st) {
            crate::metrics::late_record();
            tracing::debug!(step = %self.name, key = %key, ts = r.timestamp, "late record dropped");
            return Ok(());
        }
        // One read of the stored stream time serves both the late check and the advance.
        let now = before.map_or(r.timestamp, |st| st.max(r.timestamp));
        if before != Some(now) {
            ctx.put(&self.store, keys::STREAM_TIME, keys::encode_time(now));
        }
        let other_side = side.other();
        let mut others = Self::load(ctx, &self.store, other_side, &key)?;
        let mut matched = false;
        for o in others
            .iter_mut()
            .filter(|o| o.t.abs_diff(r.timestamp) <= self.within.unsigned_abs())
        {
            let at = o.t.max(r.timestamp);
            let res = match side {
                Side::Left => self.result(ctx, &key, &r.value, &o.v, at)?,
                Side::Right => self.result(ctx, &key, &o.v, &r.value, at)?,
            };
            out.push(res);
            o.m = true;
            matched = true;
        }
        if matched {
            Self::save(ctx, &self.store, other_side, &key, &others);
        }
        let mut mine = Self::load(ctx, &self.store, side, &key)?;
        mine.push(Buffered {
            t: r.timestamp,
            v: r.value,
            m: matched,
        });
        Self::save(ctx, &self.store, side, &key, &mine);
        self.closing
            .insert((self.closes_after(r.timestamp), side, key));
        self.close(ctx, now, out)
    }
}
