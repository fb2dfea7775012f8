//! The `aggregate` step: running or windowed aggregation per group key, emitted on every
//! update or once per window when it closes (`onWindowClose`).
//!
//! Owns: the Aggregate processor: compiling its fields, folding a record into its
//! group's windows, closing and purging windows as stream time moves, and its due index.
//! Must not touch: the accumulators' arithmetic (`accumulators.rs`), the window rules
//! (`window.rs`) or the store's bytes (`keys.rs`).

use oxbow_crds::{AggregateStep, Emit, StoreName};
use serde_json::{Value as Json, json};

use super::accumulators::{Acc, AggKind, AggState, WindowAgg};
use super::window::{Window, WindowRules, Windows};
use super::{CompileError, advance_stream_time, encoding, input, keys};
use crate::expr::Expr;
use crate::processor::{Context, Processor, Record, StepError};

#[derive(Clone)]
pub(super) struct Aggregate {
    name: String,
    store: StoreName,
    group_by: Expr,
    rules: Option<WindowRules>,
    fields: Vec<(String, AggKind, Option<Expr>)>,
    emit: Emit,
    /// No window is due before this (its due index is in the store,
    /// `keys::window_due_key`):
    /// a record that moves stream time below it reads no index. `i64::MIN` when not
    /// known, so the next record looks.
    due_hint: i64,
}

/// Due groups read from the index at a time.
const DUE_BATCH: usize = 1_000;

/// One output field of the spec: its kind and, but for `count`, its expression.
fn compile_field(
    fp: &str,
    f: &oxbow_crds::AggregateField,
) -> Result<(AggKind, Option<Expr>), CompileError> {
    Ok(if f.count.is_some() {
        (AggKind::Count, None)
    } else if let Some(e) = &f.sum {
        (AggKind::Sum, Some(Expr::compile(format!("{fp}.sum"), e)?))
    } else if let Some(e) = &f.min {
        (AggKind::Min, Some(Expr::compile(format!("{fp}.min"), e)?))
    } else if let Some(e) = &f.max {
        (AggKind::Max, Some(Expr::compile(format!("{fp}.max"), e)?))
    } else if let Some(e) = &f.avg {
        (AggKind::Avg, Some(Expr::compile(format!("{fp}.avg"), e)?))
    } else if let Some(e) = &f.last {
        (AggKind::Last, Some(Expr::compile(format!("{fp}.last"), e)?))
    } else {
        return Err(CompileError::Invalid {
            path: fp.to_string(),
            message: "an aggregate field is one of count, sum, min, max, avg or last".into(),
        });
    })
}

impl Aggregate {
    pub(super) fn compile(p: &str, name: String, a: &AggregateStep) -> Result<Self, CompileError> {
        let rules = a
            .window
            .as_ref()
            .map(WindowRules::from_spec)
            .transpose()
            .map_err(|source| CompileError::Window {
                path: format!("{p}.aggregate.window"),
                source,
            })?;
        let mut fields = Vec::new();
        for (fname, f) in &a.fields {
            let fp = format!("{p}.aggregate.fields.{fname}");
            let (kind, e) = compile_field(&fp, f)?;
            if ["key", "windowStart", "windowEnd"].contains(&fname.as_str()) {
                return Err(CompileError::Invalid {
                    path: fp,
                    message: format!("{fname:?} is reserved in the aggregate's output record"),
                });
            }
            fields.push((fname.clone(), kind, e));
        }
        if a.emit == Emit::OnWindowClose && rules.is_none() {
            return Err(CompileError::Invalid {
                path: format!("{p}.aggregate.emit"),
                message: "onWindowClose needs a window".into(),
            });
        }
        Ok(Self {
            name,
            store: StoreName(a.store.clone()),
            group_by: Expr::compile(format!("{p}.aggregate.groupBy"), &a.group_by)?,
            rules,
            fields,
            emit: a.emit,
            due_hint: i64::MIN,
        })
    }

    /// An unwindowed aggregate's state of `group`.
    fn load(&self, ctx: &Context<'_>, group: &str) -> Result<AggState, StepError> {
        match ctx.get(&self.store, &keys::aggregate_key(group))? {
            Some(b) => encoding::decode_state(&b)
                .map_err(|e| self.undecodable(format!("the state of group {group:?}"), e)),
            None => Ok(AggState::default()),
        }
    }

    fn save(&self, ctx: &mut Context<'_>, group: &str, s: &AggState) {
        let bytes = encoding::encode_state(s, ctx.store_encoding());
        ctx.put(&self.store, &keys::aggregate_key(group), bytes);
    }

    /// One window's row (`keys::window_key`), if stored.
    fn get_window(&self, ctx: &Context<'_>, key: &[u8]) -> Result<Option<WindowAgg>, StepError> {
        ctx.get(&self.store, key)?
            .map(|b| {
                encoding::decode_window(&b).map_err(|e| self.undecodable("a window".into(), e))
            })
            .transpose()
    }

    fn put_window(&self, ctx: &mut Context<'_>, key: &[u8], w: &WindowAgg) {
        let bytes = encoding::encode_window(w, ctx.store_encoding());
        ctx.put(&self.store, key, bytes);
    }

    /// State the task cannot go on without: it stops (`StoreError::Decode`).
    fn undecodable(&self, what: String, source: encoding::DecodeError) -> StepError {
        StepError::State(crate::store::StoreError::Decode {
            store: self.store.0.clone(),
            what,
            source,
        })
    }

    /// Every window row of `group`, in start order: (row key, window).
    fn group_windows(
        &self,
        ctx: &Context<'_>,
        group: &str,
    ) -> Result<Vec<(Vec<u8>, WindowAgg)>, StepError> {
        let prefix = keys::window_group_prefix(group);
        let end = keys::prefix_end(&prefix).unwrap_or_default();
        let mut from = prefix.clone();
        let mut out = Vec::new();
        loop {
            let rows = ctx.range(&self.store, &from, &end, DUE_BATCH)?;
            let full = rows.len() == DUE_BATCH;
            for (k, v) in rows {
                let w = encoding::decode_window(&v)
                    .map_err(|e| self.undecodable(format!("a window of group {group:?}"), e))?;
                from = [k.as_slice(), &[0]].concat();
                out.push((k, w));
            }
            if !full {
                return Ok(out);
            }
        }
    }

    fn output(&self, group: &str, w: &WindowAgg, ts: i64) -> Record {
        let mut v = serde_json::Map::new();
        v.insert("key".into(), json!(group));
        if self.rules.is_some() {
            v.insert("windowStart".into(), json!(w.start));
            v.insert("windowEnd".into(), json!(w.end));
        }
        for ((name, _, _), acc) in self.fields.iter().zip(&w.acc) {
            v.insert(name.clone(), acc.result());
        }
        Record {
            key: json!(group),
            value: Json::Object(v),
            timestamp: ts,
        }
    }

    /// When a window needs attention next: to close it (onWindowClose, not yet sent) or
    /// to purge it.
    fn window_due(&self, rules: &WindowRules, w: &WindowAgg) -> i64 {
        if self.emit == Emit::OnWindowClose && !w.emitted {
            w.end.saturating_add(rules.grace)
        } else {
            w.start
                .saturating_add(rules.retention.max(w.end - w.start + rules.grace))
        }
    }

    /// Stores a window and indexes when it is due. Its due time only changes when it is
    /// emitted, so an update of a stored window leaves the index as it is.
    fn store_window(
        &mut self,
        ctx: &mut Context<'_>,
        rules: &WindowRules,
        key: &[u8],
        w: &WindowAgg,
        new: bool,
    ) {
        self.put_window(ctx, key, w);
        if new {
            let due = self.window_due(rules, w);
            ctx.put(&self.store, &keys::window_due_key(due, key), Vec::new());
            self.due_hint = self.due_hint.min(due);
        }
    }

    /// Drops a stored window and its index entry.
    fn drop_window(
        &mut self,
        ctx: &mut Context<'_>,
        rules: &WindowRules,
        key: &[u8],
        w: &WindowAgg,
    ) {
        ctx.delete(&self.store, key);
        ctx.delete(
            &self.store,
            &keys::window_due_key(self.window_due(rules, w), key),
        );
    }

    /// One due window: emits it if `stream_time` closed it (onWindowClose), purges it if
    /// expired, or indexes when it is due next.
    fn close_window(
        &mut self,
        ctx: &mut Context<'_>,
        rules: &WindowRules,
        key: &[u8],
        stream_time: i64,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let (Some((group, _, _)), Some(mut w)) =
            (keys::split_window_key(key), self.get_window(ctx, key)?)
        else {
            return Ok(());
        };
        let win = Window {
            start: w.start,
            end: w.end,
        };
        let mut changed = false;
        if self.emit == Emit::OnWindowClose && !w.emitted && rules.is_closed(win, stream_time) {
            w.emitted = true;
            changed = true;
            let group = String::from_utf8_lossy(group).into_owned();
            out.push(self.output(&group, &w, w.end.saturating_sub(1)));
        }
        if rules.is_expired(win, stream_time) {
            ctx.delete(&self.store, key);
            return Ok(());
        }
        if changed {
            self.put_window(ctx, key, &w);
        }
        let due = self.window_due(rules, &w);
        ctx.put(&self.store, &keys::window_due_key(due, key), Vec::new());
        self.due_hint = self.due_hint.min(due);
        Ok(())
    }

    /// Emits windows closed by `stream_time` and purges expired ones: the windows whose
    /// due index entry is at or before it.
    fn advance(
        &mut self,
        ctx: &mut Context<'_>,
        stream_time: i64,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let Some(rules) = self.rules else {
            return Ok(());
        };
        if stream_time < self.due_hint {
            return Ok(());
        }
        let upto = keys::window_due_bound(stream_time.saturating_add(1));
        // No entry is due before the hint (it is the earliest, lowered by every new
        // entry). Seeking from it, not from the index's start, matters: every purged
        // entry leaves a tombstone there until a compaction, and a seek from the start
        // stepped over all of them, once per window boundary (a third of W1's CPU).
        let mut from = if self.due_hint > i64::MIN {
            keys::window_due_bound(self.due_hint)
        } else {
            keys::WINDOW_DUE_PREFIX.to_vec()
        };
        loop {
            let due = ctx.range(&self.store, &from, &upto, DUE_BATCH)?;
            for (k, _) in &due {
                if let Some((_, row)) = keys::split_window_due_key(k) {
                    ctx.delete(&self.store, k);
                    self.close_window(ctx, &rules, &row, stream_time, out)?;
                }
            }
            // What a window is due at next is after `stream_time`: the loop ends.
            if due.len() < DUE_BATCH {
                break;
            }
            // A window put back is due after `stream_time`, past `upto`: the next
            // batch starts after this one.
            if let Some((last, _)) = due.last() {
                from = [last.as_slice(), &[0]].concat();
            }
        }
        // Every entry before `upto` is gone: the earliest left (this record's own
        // writes included) is the new hint.
        let end = keys::prefix_end(keys::WINDOW_DUE_PREFIX).unwrap_or_default();
        let first = ctx.range(&self.store, &upto, &end, 1)?;
        self.due_hint = first
            .first()
            .and_then(|(k, _)| keys::split_window_due_key(k))
            .map_or(i64::MAX, |(at, _)| at);
        Ok(())
    }

    /// Converts a store from before window rows (every window of a key in one `k`
    /// value, a per-key due index): one scan, once.
    fn migrate_to_window_rows(
        &mut self,
        ctx: &mut Context<'_>,
        rules: &WindowRules,
    ) -> Result<(), StepError> {
        let mut groups = Vec::new();
        let mut stale = Vec::new();
        ctx.scan(&self.store, &mut |k, v| {
            if let Some(g) = keys::user_key(k) {
                if let Ok(s) = encoding::decode_state(v) {
                    groups.push((String::from_utf8_lossy(g).into_owned(), s));
                }
                stale.push(k.to_vec());
            } else if k.starts_with(keys::DUE_PREFIX) || k == keys::DUE_INDEX_MARK {
                stale.push(k.to_vec());
            }
            Ok(())
        })?;
        if !groups.is_empty() {
            tracing::info!(step = %self.name, groups = groups.len(), "converting a windowed aggregate store to one row per window");
        }
        for k in stale {
            ctx.delete(&self.store, &k);
        }
        for (group, s) in groups {
            for w in s.windows {
                let key = keys::window_key(&group, w.start, w.end);
                self.store_window(ctx, rules, &key, &w, true);
            }
        }
        ctx.put(&self.store, keys::WINDOW_ROWS_MARK, Vec::new());
        Ok(())
    }

    /// The record's value for each field, in field order. Every expression is evaluated
    /// before any is checked, so an evaluation error wins over a type error.
    fn values(&self, ctx: &Context<'_>, r: &Record) -> Result<Vec<Json>, StepError> {
        let mut values = Vec::with_capacity(self.fields.len());
        for (_, _, e) in &self.fields {
            values.push(match e {
                Some(e) => e.json(ctx.env(), &input(r))?,
                None => Json::Null,
            });
        }
        for ((name, kind, e), v) in self.fields.iter().zip(&values) {
            if matches!(
                kind,
                AggKind::Sum | AggKind::Min | AggKind::Max | AggKind::Avg
            ) && !v.is_number()
            {
                let path = e
                    .as_ref()
                    .map(|e| e.path().to_string())
                    .unwrap_or_else(|| name.clone());
                return Err(StepError::invalid(format!(
                    "{path} returned {v}, expected a number"
                )));
            }
        }
        Ok(values)
    }

    /// Fresh accumulators holding one record's `values`.
    fn new_acc(&self, values: &[Json], ts: i64) -> Vec<Acc> {
        self.fields
            .iter()
            .zip(values)
            .map(|((_, k, _), v)| {
                let mut a = Acc::new(*k);
                a.add(v, ts);
                a
            })
            .collect()
    }

    /// No window: one running aggregate per group, emitted on every record.
    fn process_unwindowed(
        &self,
        ctx: &mut Context<'_>,
        group: &str,
        values: &[Json],
        ts: i64,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let mut s = self.load(ctx, group)?;
        if s.windows.is_empty() {
            s.windows.push(WindowAgg {
                start: 0,
                end: 0,
                emitted: false,
                acc: self.new_acc(values, ts),
            });
        } else {
            for (a, v) in s.windows[0].acc.iter_mut().zip(values) {
                a.add(v, ts);
            }
        }
        out.push(self.output(group, &s.windows[0], ts));
        self.save(ctx, group, &s);
        Ok(())
    }

    /// Tumbling and hopping windows: adds the record to each of its open windows (one
    /// row each) and returns them.
    fn add_to_windows(
        &mut self,
        ctx: &mut Context<'_>,
        rules: &WindowRules,
        group: &str,
        values: &[Json],
        ts: i64,
        stream_time: i64,
    ) -> Result<Vec<WindowAgg>, StepError> {
        let mut touched = Vec::new();
        for win in rules.assign(ts) {
            if rules.is_closed(win, stream_time) {
                continue; // late: this window is final
            }
            let key = keys::window_key(group, win.start, win.end);
            let (w, new) = match self.get_window(ctx, &key)? {
                Some(mut w) => {
                    for (a, v) in w.acc.iter_mut().zip(values) {
                        a.add(v, ts);
                    }
                    (w, false)
                }
                None => (
                    WindowAgg {
                        start: win.start,
                        end: win.end,
                        emitted: false,
                        acc: self.new_acc(values, ts),
                    },
                    true,
                ),
            };
            self.store_window(ctx, rules, &key, &w, new);
            touched.push(w);
        }
        Ok(touched)
    }

    /// Session windows: merges the record with every open session of its group it is
    /// within `gap` of, and returns the session that now holds it (none when late).
    #[allow(clippy::too_many_arguments)]
    fn add_to_session(
        &mut self,
        ctx: &mut Context<'_>,
        rules: &WindowRules,
        gap: i64,
        group: &str,
        values: &[Json],
        ts: i64,
        stream_time: i64,
    ) -> Result<Vec<WindowAgg>, StepError> {
        let own = Window {
            start: ts,
            end: ts.saturating_add(gap),
        };
        if rules.is_closed(own, stream_time) {
            return Ok(Vec::new());
        }
        let mut merged = WindowAgg {
            start: own.start,
            end: own.end,
            emitted: false,
            acc: self.new_acc(values, ts),
        };
        for (key, w) in self.group_windows(ctx, group)? {
            let open = !rules.is_closed(
                Window {
                    start: w.start,
                    end: w.end,
                },
                stream_time,
            );
            let near = ts <= w.end && ts.saturating_add(gap) >= w.start;
            if open && near && !w.emitted {
                merged.start = merged.start.min(w.start);
                merged.end = merged.end.max(w.end);
                for (a, b) in merged.acc.iter_mut().zip(&w.acc) {
                    a.merge(b);
                }
                self.drop_window(ctx, rules, &key, &w);
            }
        }
        let key = keys::window_key(group, merged.start, merged.end);
        self.store_window(ctx, rules, &key, &merged, true);
        Ok(vec![merged])
    }
}

impl Processor for Aggregate {
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
        // The windows and their due index live in the store: nothing to rebuild,
        // unless the store is from before window rows.
        self.due_hint = i64::MIN;
        if let Some(rules) = self.rules
            && ctx.get(&self.store, keys::WINDOW_ROWS_MARK)?.is_none()
        {
            self.migrate_to_window_rows(ctx, &rules)?;
        }
        Ok(())
    }
    fn end_record(&mut self, committed: bool) {
        if !committed {
            // The record's index reads and writes are gone: look again next time.
            self.due_hint = i64::MIN;
        }
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let group = self.group_by.key(ctx.env(), &input(&r))?;
        let values = self.values(ctx, &r)?;
        let Some(rules) = self.rules else {
            return self.process_unwindowed(ctx, &group, &values, r.timestamp, out);
        };
        if !keys::windowable_group(&group) {
            return Err(StepError::invalid(format!(
                "{}: the group key {group:?} contains a NUL character, which a windowed aggregate cannot store",
                self.name
            )));
        }
        let stream_time = advance_stream_time(ctx, &self.store, r.timestamp, i64::MIN)?;
        self.advance(ctx, stream_time, out)?;
        let touched = match rules.windows {
            Windows::Tumbling { .. } | Windows::Hopping { .. } => {
                self.add_to_windows(ctx, &rules, &group, &values, r.timestamp, stream_time)?
            }
            Windows::Session { gap } => {
                self.add_to_session(ctx, &rules, gap, &group, &values, r.timestamp, stream_time)?
            }
        };
        if touched.is_empty() {
            // Every window of this record is closed: late beyond grace, dropped.
            crate::metrics::late_record();
            tracing::debug!(step = %self.name, group = %group, ts = r.timestamp, stream_time, "late record dropped");
            return Ok(());
        }
        if self.emit == Emit::OnUpdate {
            for w in &touched {
                out.push(self.output(&group, w, r.timestamp));
            }
        }
        Ok(())
    }
}
