//! The `dedupe` step: the first occurrence of an id within `within` (event time) passes,
//! repeats are dropped.
//!
//! Owns: the dedupe processor and its expiry index. Must not touch: the store's bytes
//! by hand; keys and marks are built by [`super::keys`].

use std::collections::BTreeSet;

use oxbow_crds::{DedupeStep, StoreName};

use super::{CompileError, advance_stream_time, input, keys, millis};
use crate::expr::Expr;
use crate::processor::{Context, Processor, Record, StepError};

/// First occurrence of an id within `within` (event time) passes.
#[derive(Clone)]
pub(super) struct Dedupe {
    name: String,
    store: StoreName,
    id: Expr,
    within: i64,
    /// (forget at, id): hint for purging.
    expiry: BTreeSet<(i64, String)>,
    stream_time: i64,
    undo: Vec<(i64, String)>,
}

impl Dedupe {
    pub(super) fn compile(p: &str, name: String, d: &DedupeStep) -> Result<Self, CompileError> {
        Ok(Self {
            name,
            store: StoreName(d.store.clone()),
            id: Expr::compile(format!("{p}.dedupe.id"), &d.id)?,
            within: millis(&format!("{p}.dedupe.within"), &d.within)?,
            expiry: BTreeSet::new(),
            stream_time: i64::MIN,
            undo: Vec::new(),
        })
    }

    /// Forgets ids that fell out of the window, so the store stays bounded. `current` is
    /// the id being processed: its mark is about to be read or rewritten, never deleted.
    fn forget_expired(&mut self, ctx: &mut Context<'_>, current: &str) -> Result<(), StepError> {
        while let Some((at, old)) = self.expiry.first().cloned() {
            if at >= self.stream_time {
                break;
            }
            self.expiry.pop_first();
            self.undo.push((at, old.clone()));
            let k = keys::dedupe_key(&old);
            if let Some(t) = ctx
                .get(&self.store, &k)?
                .as_deref()
                .and_then(keys::decode_time)
                && t.saturating_add(self.within) < self.stream_time
                && old != current
            {
                ctx.delete(&self.store, &k);
            }
        }
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
        let (mut expiry, mut st) = (BTreeSet::new(), i64::MIN);
        let within = self.within;
        ctx.scan(&self.store, &mut |k, v| {
            if let (Some(id), Some(seen)) = (keys::user_key(k), keys::decode_time(v)) {
                expiry.insert((
                    seen.saturating_add(within),
                    String::from_utf8_lossy(id).into_owned(),
                ));
                st = st.max(seen);
            }
            Ok(())
        })?;
        self.expiry = expiry;
        self.stream_time = st;
        Ok(())
    }
    fn end_record(&mut self, committed: bool) {
        let undo = std::mem::take(&mut self.undo);
        if !committed {
            self.expiry.extend(undo);
        }
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
        self.forget_expired(ctx, &id)?;
        match seen {
            Some(t) if r.timestamp.abs_diff(t) <= self.within.unsigned_abs() => Ok(()),
            _ => {
                ctx.put(&self.store, &key, keys::encode_time(r.timestamp));
                self.expiry
                    .insert((r.timestamp.saturating_add(self.within), id));
                out.push(r);
                Ok(())
            }
        }
    }
}
