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
use super::{CompileError, advance_stream_time, input, keys};
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
    /// No group is due before this (its due index is in the store, `keys::due_key`):
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
            .map_err(|e| CompileError::Invalid {
                path: format!("{p}.aggregate.window"),
                message: e.to_string(),
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

    fn load(&self, ctx: &Context<'_>, group: &str) -> Result<AggState, StepError> {
        match ctx.get(&self.store, &keys::aggregate_key(group))? {
            Some(b) => serde_json::from_slice(&b).map_err(|e| {
                StepError::Record(format!(
                    "failed to decode aggregate state of {group:?}: {e}"
                ))
            }),
            None => Ok(AggState::default()),
        }
    }

    fn save(&self, ctx: &mut Context<'_>, group: &str, s: &AggState) {
        if s.windows.is_empty() {
            ctx.delete(&self.store, &keys::aggregate_key(group));
        } else {
            // Serializing plain data into a Vec cannot fail.
            let bytes = serde_json::to_vec(s).unwrap_or_default();
            ctx.put(&self.store, &keys::aggregate_key(group), bytes);
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

    /// The next time this key needs attention: a window to close (onWindowClose) or to
    /// purge.
    fn next_due(&self, s: &AggState) -> Option<i64> {
        let rules = self.rules?;
        s.windows
            .iter()
            .map(|w| {
                let win = Window {
                    start: w.start,
                    end: w.end,
                };
                let close = w.end.saturating_add(rules.grace);
                let expire = w
                    .start
                    .saturating_add(rules.retention.max(w.end - w.start + rules.grace));
                if self.emit == Emit::OnWindowClose && !w.emitted {
                    let _ = win;
                    close
                } else {
                    expire
                }
            })
            .min()
    }

    /// Moves a group's due index entry from `old` to `new` (either may be none).
    fn reindex(&mut self, ctx: &mut Context<'_>, group: &str, old: Option<i64>, new: Option<i64>) {
        if old == new {
            return;
        }
        if let Some(o) = old {
            ctx.delete(&self.store, &keys::due_key(o, group));
        }
        if let Some(n) = new {
            ctx.put(&self.store, &keys::due_key(n, group), Vec::new());
            self.due_hint = self.due_hint.min(n);
        }
    }

    /// One due group: emits its windows closed by `stream_time` (onWindowClose), purges
    /// the expired ones, and indexes when it is due next.
    fn close_due(
        &mut self,
        ctx: &mut Context<'_>,
        rules: &WindowRules,
        group: &str,
        stream_time: i64,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let mut s = self.load(ctx, group)?;
        for w in &mut s.windows {
            let win = Window {
                start: w.start,
                end: w.end,
            };
            if self.emit == Emit::OnWindowClose && !w.emitted && rules.is_closed(win, stream_time) {
                w.emitted = true;
                out.push(self.output(group, w, w.end.saturating_sub(1)));
            }
        }
        s.windows.retain(|w| {
            !rules.is_expired(
                Window {
                    start: w.start,
                    end: w.end,
                },
                stream_time,
            )
        });
        self.save(ctx, group, &s);
        if let Some(next) = self.next_due(&s) {
            ctx.put(&self.store, &keys::due_key(next, group), Vec::new());
        }
        Ok(())
    }

    /// Emits windows closed by `stream_time` and purges expired ones: the groups whose
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
        let upto = keys::due_bound(stream_time.saturating_add(1));
        loop {
            let due = ctx.range(&self.store, keys::DUE_PREFIX, &upto, DUE_BATCH)?;
            for (k, _) in &due {
                if let Some((_, group)) = keys::split_due_key(k) {
                    let group = String::from_utf8_lossy(group).into_owned();
                    ctx.delete(&self.store, k);
                    self.close_due(ctx, &rules, &group, stream_time, out)?;
                }
            }
            // What a group is due at next is after `stream_time`: the loop ends.
            if due.len() < DUE_BATCH {
                break;
            }
        }
        // The earliest entry left (this record's own writes included) is the new hint.
        let end = keys::prefix_end(keys::DUE_PREFIX).unwrap_or_default();
        let first = ctx.range(&self.store, keys::DUE_PREFIX, &end, 1)?;
        self.due_hint = first
            .first()
            .and_then(|(k, _)| keys::split_due_key(k))
            .map_or(i64::MAX, |(at, _)| at);
        Ok(())
    }

    /// Builds the due index of a store written before it existed: one scan, once.
    fn migrate_due_index(&mut self, ctx: &mut Context<'_>) -> Result<(), StepError> {
        let mut entries = Vec::new();
        let this = &*self;
        ctx.scan(&self.store, &mut |k, v| {
            if let Some(g) = keys::user_key(k)
                && let Ok(s) = serde_json::from_slice::<AggState>(v)
                && let Some(at) = this.next_due(&s)
            {
                entries.push(keys::due_key(at, &String::from_utf8_lossy(g)));
            }
            Ok(())
        })?;
        if !entries.is_empty() {
            tracing::info!(step = %self.name, groups = entries.len(), "built the due index of a store from before it existed");
        }
        for k in entries {
            ctx.put(&self.store, &k, Vec::new());
        }
        ctx.put(&self.store, keys::DUE_INDEX_MARK, Vec::new());
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
                return Err(StepError::Record(format!(
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

    /// Tumbling and hopping windows: adds the record to each of its open windows and
    /// returns their indexes in `s.windows`.
    fn add_to_windows(
        &self,
        rules: &WindowRules,
        s: &mut AggState,
        values: &[Json],
        ts: i64,
        stream_time: i64,
    ) -> Vec<usize> {
        let mut touched = Vec::new();
        for win in rules.assign(ts) {
            if rules.is_closed(win, stream_time) {
                continue; // late: this window is final
            }
            let idx = match s
                .windows
                .iter()
                .position(|w| w.start == win.start && w.end == win.end)
            {
                Some(i) => {
                    for (a, v) in s.windows[i].acc.iter_mut().zip(values) {
                        a.add(v, ts);
                    }
                    i
                }
                None => {
                    s.windows.push(WindowAgg {
                        start: win.start,
                        end: win.end,
                        emitted: false,
                        acc: self.new_acc(values, ts),
                    });
                    s.windows.len() - 1
                }
            };
            touched.push(idx);
        }
        touched
    }

    /// Session windows: merges the record with every open session it is within `gap` of
    /// and returns the index of the session that now holds it (none when it is late).
    fn add_to_session(
        &self,
        rules: &WindowRules,
        gap: i64,
        s: &mut AggState,
        values: &[Json],
        ts: i64,
        stream_time: i64,
    ) -> Vec<usize> {
        let own = Window {
            start: ts,
            end: ts.saturating_add(gap),
        };
        if rules.is_closed(own, stream_time) {
            return Vec::new();
        }
        let mut merged = WindowAgg {
            start: own.start,
            end: own.end,
            emitted: false,
            acc: self.new_acc(values, ts),
        };
        let mut keep = Vec::new();
        for w in std::mem::take(&mut s.windows) {
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
            } else {
                keep.push(w);
            }
        }
        keep.push(merged);
        keep.sort_by_key(|w| w.start);
        s.windows = keep;
        s.windows
            .iter()
            .position(|w| w.start <= ts && ts < w.end)
            .into_iter()
            .collect()
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
        // The due index lives in the store: nothing to rebuild, unless the store is
        // from before it.
        self.due_hint = i64::MIN;
        if self.rules.is_some() && ctx.get(&self.store, keys::DUE_INDEX_MARK)?.is_none() {
            self.migrate_due_index(ctx)?;
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
        let stream_time = advance_stream_time(ctx, &self.store, r.timestamp, i64::MIN)?;
        self.advance(ctx, stream_time, out)?;
        let mut s = self.load(ctx, &group)?;
        let was_due = self.next_due(&s);
        let touched = match rules.windows {
            Windows::Tumbling { .. } | Windows::Hopping { .. } => {
                self.add_to_windows(&rules, &mut s, &values, r.timestamp, stream_time)
            }
            Windows::Session { gap } => {
                self.add_to_session(&rules, gap, &mut s, &values, r.timestamp, stream_time)
            }
        };
        if touched.is_empty() {
            // Every window of this record is closed: late beyond grace, dropped.
            crate::metrics::late_record();
            tracing::debug!(step = %self.name, group = %group, ts = r.timestamp, stream_time, "late record dropped");
            return Ok(());
        }
        if self.emit == Emit::OnUpdate {
            for i in &touched {
                out.push(self.output(&group, &s.windows[*i], r.timestamp));
            }
        }
        let due = self.next_due(&s);
        self.reindex(ctx, &group, was_due, due);
        self.save(ctx, &group, &s);
        Ok(())
    }
}
