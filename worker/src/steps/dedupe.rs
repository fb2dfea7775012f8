//! The `dedupe` step: the first occurrence of an id within `within` (event time) passes,
//! repeats are dropped.
//!
//! Expired ids are forgotten by a sweep that walks the store's committed ids a batch at
//! each punctuation and wraps around, so the store stays bounded while the memory held
//! for it is one cursor: no index of every live id, and no scan of the store when a
//! task starts. A mark the sweep has not reached yet changes no answer (an id is a
//! repeat only within `within` of its mark), it only takes space a little longer.
//!
//! Owns: the dedupe processor and its sweep. Must not touch: the store's bytes by hand;
//! keys and marks are built by [`super::keys`].

use oxbow_crds::{DedupeStep, StoreName};

use super::{CompileError, advance_stream_time, input, keys, millis};
use crate::expr::Expr;
use crate::processor::{Context, Processor, Record, StepError};

/// Ids looked at per punctuation (every 100 ms): about 10 000 a second per task, so a
/// million live ids are all visited within two minutes.
const SWEEP_BATCH: usize = 1_000;

/// First occurrence of an id within `within` (event time) passes.
#[derive(Clone)]
pub(super) struct Dedupe {
    name: String,
    store: StoreName,
    id: Expr,
    within: i64,
    stream_time: i64,
    /// The next key the sweep looks at.
    sweep_from: Vec<u8>,
}

impl Dedupe {
    pub(super) fn compile(p: &str, name: String, d: &DedupeStep) -> Result<Self, CompileError> {
        Ok(Self {
            name,
            store: StoreName(d.store.clone()),
            id: Expr::compile(format!("{p}.dedupe.id"), &d.id)?,
            within: millis(&format!("{p}.dedupe.within"), &d.within)?,
            stream_time: i64::MIN,
            sweep_from: keys::KEY_PREFIX.to_vec(),
        })
    }

    /// Deletes the marks among the next [`SWEEP_BATCH`] ids that fell out of the window,
    /// judged on their current value (a mark rewritten since its commit is kept).
    fn sweep(&mut self, ctx: &mut Context<'_>) -> Result<(), StepError> {
        let stream_time = ctx
            .get(&self.store, keys::STREAM_TIME)?
            .as_deref()
            .and_then(keys::decode_time)
            .unwrap_or(self.stream_time);
        let batch = ctx.committed_from(&self.store, &self.sweep_from, SWEEP_BATCH)?;
        let mut next = keys::KEY_PREFIX.to_vec();
        for (k, _) in &batch {
            if keys::user_key(k).is_none() {
                // Past the ids (`m:…` sorts after `k…`): wrap around.
                break;
            }
            let expired = ctx
                .get(&self.store, k)?
                .as_deref()
                .and_then(keys::decode_time)
                .is_some_and(|t| t.saturating_add(self.within) < stream_time);
            if expired {
                ctx.delete(&self.store, k);
            }
            next = [k.as_slice(), &[0]].concat();
        }
        self.sweep_from = if batch.len() < SWEEP_BATCH || keys::user_key(&next).is_none() {
            keys::KEY_PREFIX.to_vec()
        } else {
            next
        };
        Ok(())
    }
}

impl Processor for Dedupe {
    fn name(&self) -> &str {
        &self.name
    }
    fn stores(&self) -> Vec<StoreName> {
        vec![self.store.clone()]
    }
    fn init(&mut self, ctx: &mut Context<'_>) -> Result<(), StepError> {
        // The stream time is stored with the marks: one read, not a scan of the store.
        self.stream_time = ctx
            .get(&self.store, keys::STREAM_TIME)?
            .as_deref()
            .and_then(keys::decode_time)
            .unwrap_or(i64::MIN);
        self.sweep_from = keys::KEY_PREFIX.to_vec();
        Ok(())
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let id = self.id.key(ctx.env(), &input(&r))?;
        let key = keys::dedupe_key(&id);
        let seen = ctx
            .get(&self.store, &key)?
            .as_deref()
            .and_then(keys::decode_time);
        self.stream_time = advance_stream_time(ctx, &self.store, r.timestamp, self.stream_time)?;
        match seen {
            Some(t) if r.timestamp.abs_diff(t) <= self.within.unsigned_abs() => Ok(()),
            _ => {
                ctx.put(&self.store, &key, keys::encode_time(r.timestamp));
                out.push(r);
                Ok(())
            }
        }
    }
    fn punctuate(
        &mut self,
        ctx: &mut Context<'_>,
        _out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        self.sweep(ctx)
    }
}
