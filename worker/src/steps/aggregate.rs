//! The `aggregate` step: running or windowed aggregation per group key, emitted on every
//! update or once per window when it closes (`onWindowClose`).
//!
//! Owns: the Aggregate processor: compiling its fields, folding a record into its
//! group's windows, closing and purging windows as stream time moves, and its due index.
//! Must not touch: the accumulators' arithmetic (`accumulators.rs`), the window rules
//! (`window.rs`) or the store's bytes (`keys.rs`).

use std::collections::BTreeSet;

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
    /// (due time, group key): when a key's next window closes or expires.
    due: BTreeSet<(i64, String)>,
    undo: Vec<(i64, String)>,
}

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
            due: BTreeSet::new(),
            undo: Vec::new(),
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

    /// Emits windows closed by `stream_time` and purges expired ones.
    fn advance(
        &mut self,
        ctx: &mut Context<'_>,
        stream_time: i64,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let Some(rules) = self.rules else {
            return Ok(());
        };
        while let Some((at, group)) = self.due.first().cloned() {
            if at > stream_time {
                break;
            }
            self.due.pop_first();
            self.undo.push((at, group.clone()));
            let mut s = self.load(ctx, &group)?;
            for w in &mut s.windows {
                let win = Window {
                    start: w.start,
                    end: w.end,
                };
                if self.emit == Emit::OnWindowClose
                    && !w.emitted
                    && rules.is_closed(win, stream_time)
                {
                    w.emitted = true;
                    let rec = self.output(&group, w, w.end.saturating_sub(1));
                    out.push(rec);
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
            self.save(ctx, &group, &s);
            if let Some(next) = self.next_due(&s) {
                self.due.insert((next, group));
            }
        }
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
        let mut due = BTreeSet::new();
        let this = &*self;
        ctx.scan(&self.store, &mut |k, v| {
            if let Some(g) = keys::user_key(k)
                && let Ok(s) = serde_json::from_slice::<AggState>(v)
                && let Some(at) = this.next_due(&s)
            {
                due.insert((at, String::from_utf8_lossy(g).into_owned()));
            }
            Ok(())
        })?;
        self.due = due;
        Ok(())
    }
    fn end_record(&mut self, committed: bool) {
        let undo = std::mem::take(&mut self.undo);
        if !committed {
            self.due.extend(undo);
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
        if let Some(at) = self.next_due(&s) {
            self.due.insert((at, group.clone()));
        }
        self.save(ctx, &group, &s);
        Ok(())
    }
}
