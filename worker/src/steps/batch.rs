//! The `batch` step: groups records into batches that every consumer sees identically,
//! closed at `size`, after `maxWait`, or early before a batch outgrows what the broker
//! accepts.
//!
//! Owns: the Batch processor, [`OpenBatch`] (the JSON header of a batch being filled,
//! which the queries also show), and its maxWait index. Must not touch: the store's
//! bytes by hand; header and record keys are built by [`super::keys`].

use std::collections::BTreeMap;

use oxbow_crds::{BatchStep, StoreName};
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

use super::{CompileError, input, keys, millis};
use crate::decode::{DecodeError, unreadable};
use crate::expr::Expr;
use crate::processor::{Context, Processor, Record, SourcePos, StepError};

/// The batch being filled for one group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenBatch {
    pub topic: String,
    pub partition: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub count: u32,
    /// Wall clock when the first record arrived (for maxWait).
    pub opened_at: i64,
    /// Serialized size of the records so far.
    pub bytes: u64,
}

impl OpenBatch {
    /// An empty batch that `src` opens at wall-clock time `now`.
    fn open(src: &SourcePos, now: i64) -> Self {
        Self {
            topic: src.topic.clone(),
            partition: src.partition,
            first_offset: src.offset,
            last_offset: src.offset,
            count: 0,
            opened_at: now,
            bytes: 0,
        }
    }
}

#[derive(Clone)]
pub(super) struct Batch {
    name: String,
    store: StoreName,
    size: u32,
    max_wait: i64,
    group_by: Option<Expr>,
    max_bytes: u64,
    /// group → opened_at: hint for maxWait.
    open: BTreeMap<String, i64>,
    warned: bool,
    undo: Vec<(String, i64)>,
    /// Several source topics: one open batch per topic (and group), so a batch id's
    /// offsets always belong to one topic.
    per_topic: bool,
}

/// librdkafka's default `message.max.bytes` (the broker's is slightly larger): a batch
/// record larger than this cannot be produced.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 1_000_000;

impl Batch {
    pub(super) fn compile(
        p: &str,
        name: String,
        b: &BatchStep,
        per_topic: bool,
    ) -> Result<Self, CompileError> {
        Ok(Self {
            name,
            store: StoreName(b.store.clone()),
            size: u32::try_from(b.size.max(1)).unwrap_or(1),
            max_wait: millis(&format!("{p}.batch.maxWait"), &b.max_wait)?,
            group_by: b
                .group_by
                .as_deref()
                .map(|e| Expr::compile(format!("{p}.batch.groupBy"), e))
                .transpose()?,
            max_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            open: BTreeMap::new(),
            warned: false,
            undo: Vec::new(),
            per_topic,
        })
    }

    fn header(&self, ctx: &Context<'_>, group: &str) -> Result<Option<OpenBatch>, StepError> {
        match ctx.get(&self.store, &keys::header_key(group))? {
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| unreadable(format!("open batch {group:?}"), DecodeError::Json(e))),
            None => Ok(None),
        }
    }

    /// Emits and clears the group's open batch.
    fn close(
        &mut self,
        ctx: &mut Context<'_>,
        group: &str,
        h: &OpenBatch,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let mut records = Vec::with_capacity(h.count as usize);
        for seq in 0..h.count {
            let k = keys::record_key(group, seq);
            let v = ctx.get(&self.store, &k)?.ok_or_else(|| {
                StepError::invalid(format!("batch {group:?} lost record {seq} of {}", h.count))
            })?;
            records.push(
                serde_json::from_slice::<Json>(&v)
                    .map_err(|e| unreadable("a batched record", DecodeError::Json(e)))?,
            );
            ctx.delete(&self.store, &k);
        }
        ctx.delete(&self.store, &keys::header_key(group));
        if let Some(at) = self.open.remove(group) {
            self.undo.push((group.to_string(), at));
        }
        let batch_id = format!(
            "{}-{}-{}-{}",
            h.topic, h.partition, h.first_offset, h.last_offset
        );
        out.push(Record {
            key: match keys::split_topic_group(group).0 {
                "" => json!(batch_id),
                g => json!(g),
            },
            value: json!({
                "batchId": batch_id,
                "topic": h.topic,
                "partition": h.partition,
                "firstOffset": h.first_offset,
                "lastOffset": h.last_offset,
                "records": records,
            }),
            timestamp: ctx.now_ms(),
        });
        Ok(())
    }

    /// The group's open batch with room for one more record of `bytes` bytes: the
    /// current one, a new one, or (when the record would not fit) a new one after
    /// closing the full one rather than build a record the broker would refuse.
    fn batch_for(
        &mut self,
        ctx: &mut Context<'_>,
        group: &str,
        src: &SourcePos,
        bytes: u64,
        out: &mut Vec<Record>,
    ) -> Result<OpenBatch, StepError> {
        let h = match self.header(ctx, group)? {
            Some(h) => h,
            None => OpenBatch::open(src, ctx.now_ms()),
        };
        let limit = self.max_bytes.saturating_sub(4096);
        if h.count > 0 && h.bytes + bytes > limit {
            tracing::warn!(step = %self.name, group = %group, count = h.count, bytes = h.bytes,
                "closing batch early: one more record would exceed max.message.bytes ({})", self.max_bytes);
            self.close(ctx, group, &h, out)?;
            return Ok(OpenBatch::open(src, ctx.now_ms()));
        }
        if !self.warned && h.bytes + bytes > limit * 8 / 10 {
            self.warned = true;
            tracing::warn!(step = %self.name, group = %group, bytes = h.bytes,
                "batch is above 80% of max.message.bytes ({}); lower size or the batches will be closed early", self.max_bytes);
        }
        Ok(h)
    }
}

impl Processor for Batch {
    fn name(&self) -> &str {
        &self.name
    }
    fn emits(&self) -> bool {
        true
    }
    fn stores(&self) -> Vec<StoreName> {
        vec![self.store.clone()]
    }
    fn init(&mut self, ctx: &mut Context<'_>) -> Result<(), StepError> {
        let mut open = BTreeMap::new();
        ctx.scan(&self.store, &mut |k, v| {
            if let Some(g) = keys::header_group(k)
                && let Ok(h) = serde_json::from_slice::<OpenBatch>(v)
            {
                open.insert(String::from_utf8_lossy(g).into_owned(), h.opened_at);
            }
            Ok(())
        })?;
        self.open = open;
        Ok(())
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let group = match &self.group_by {
            Some(e) => e.key(ctx.env(), &input(&r))?,
            None => String::new(),
        };
        let src = ctx.source().cloned().ok_or_else(|| {
            StepError::invalid("batch needs a source record (it cannot follow a punctuation)")
        })?;
        let group = if self.per_topic {
            keys::topic_group(&group, &src.topic)
        } else {
            group
        };
        let item =
            json!({"key": r.key, "value": r.value, "offset": src.offset, "timestamp": r.timestamp});
        let bytes = serde_json::to_vec(&item).unwrap_or_default();
        let mut h = self.batch_for(ctx, &group, &src, bytes.len() as u64, out)?;
        ctx.put(
            &self.store,
            &keys::record_key(&group, h.count),
            bytes.clone(),
        );
        h.count += 1;
        h.last_offset = src.offset;
        h.bytes += bytes.len() as u64;
        if h.count >= self.size {
            self.close(ctx, &group, &h, out)?;
        } else {
            self.open.insert(group.clone(), h.opened_at);
            let hb = serde_json::to_vec(&h).unwrap_or_default();
            ctx.put(&self.store, &keys::header_key(&group), hb);
        }
        Ok(())
    }
    fn end_record(&mut self, committed: bool) {
        let undo = std::mem::take(&mut self.undo);
        if !committed {
            self.open.extend(undo);
        }
    }
    fn punctuate(&mut self, ctx: &mut Context<'_>, out: &mut Vec<Record>) -> Result<(), StepError> {
        let now = ctx.now_ms();
        let due: Vec<String> = self
            .open
            .iter()
            .filter(|(_, at)| now.saturating_sub(**at) >= self.max_wait)
            .map(|(g, _)| g.clone())
            .collect();
        for g in due {
            match self.header(ctx, &g)? {
                Some(h) if now.saturating_sub(h.opened_at) >= self.max_wait => {
                    self.close(ctx, &g, &h, out)?
                }
                Some(h) => {
                    self.open.insert(g, h.opened_at);
                }
                None => {
                    self.open.remove(&g);
                }
            }
        }
        Ok(())
    }
}
