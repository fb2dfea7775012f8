//! The built-in steps (`filter`, `map`, `flatMap`, `dedupe`, `aggregate`, `batch`) as
//! [`Processor`]s, compiled from the spec once and instantiated per task.
//!
//! Store layouts (keys are bytes in the step's column family):
//! - dedupe: `k<id>` → first-seen event time (8 bytes, big-endian).
//! - aggregate: `k<group key>` → JSON [`AggState`]; `m:stream-time` → stream time.
//! - batch: `h<group>` → JSON [`OpenBatch`]; `r<group>\0<seq:be32>` → a buffered record.
//!
//! In-memory indexes (what is due to close, expire or time out) are hints rebuilt in
//! `init` and checked against the store before acting, so an aborted record or a crash
//! can only make them stale, never make state wrong.

use std::collections::{BTreeMap, BTreeSet};

use oxbow_crds::duration::parse_duration;
use oxbow_crds::{AggregateStep, BatchStep, DedupeStep, Emit, StoreName, StreamAppSpec};
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

use crate::expr::{Expr, ExprError, Input};
use crate::processor::{Context, Processor, ProcessorFactory, Record, StepError};
use crate::window::{Window, WindowRules, Windows};

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Expression(#[from] ExprError),
    #[error("{path}: failed to read duration: {message}")]
    Duration { path: String, message: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

fn millis(path: &str, s: &str) -> Result<i64, CompileError> {
    parse_duration(s)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .map_err(|e| CompileError::Duration {
            path: path.into(),
            message: e.to_string(),
        })
}

fn input(r: &Record) -> Input<'_> {
    Input {
        key: &r.key,
        value: &r.value,
        timestamp: r.timestamp,
    }
}

/// Compiles every step of the spec into a processor factory, in order. A bad expression
/// or duration fails here, at start, naming the field.
pub fn compile(spec: &StreamAppSpec) -> Result<Vec<ProcessorFactory>, CompileError> {
    let mut out: Vec<ProcessorFactory> = Vec::new();
    for (i, step) in spec.steps.iter().enumerate() {
        let p = format!("spec.steps[{i}]");
        let name = oxbow_crds::validate::step_label(i, step);
        if let Some(f) = &step.filter {
            let proc = Filter {
                name,
                cel: Expr::compile(format!("{p}.filter.cel"), &f.cel)?,
            };
            out.push(std::sync::Arc::new(move |_| Box::new(proc.clone())));
        } else if let Some(m) = &step.map {
            let proc = Map {
                name,
                key: m
                    .key
                    .as_deref()
                    .map(|e| Expr::compile(format!("{p}.map.key"), e))
                    .transpose()?,
                value: m
                    .value
                    .as_deref()
                    .map(|e| Expr::compile(format!("{p}.map.value"), e))
                    .transpose()?,
            };
            out.push(std::sync::Arc::new(move |_| Box::new(proc.clone())));
        } else if let Some(f) = &step.flat_map {
            let proc = FlatMap {
                name,
                cel: Expr::compile(format!("{p}.flatMap.cel"), &f.cel)?,
            };
            out.push(std::sync::Arc::new(move |_| Box::new(proc.clone())));
        } else if let Some(d) = &step.dedupe {
            let proc = Dedupe::compile(&p, name, d)?;
            out.push(std::sync::Arc::new(move |_| Box::new(proc.clone())));
        } else if let Some(a) = &step.aggregate {
            let proc = Aggregate::compile(&p, name, a)?;
            out.push(std::sync::Arc::new(move |_| Box::new(proc.clone())));
        } else if let Some(b) = &step.batch {
            let proc = Batch::compile(&p, name, b, spec.source.topics.len() > 1)?;
            out.push(std::sync::Arc::new(move |_| Box::new(proc.clone())));
        } else {
            return Err(CompileError::Invalid {
                path: p,
                message: "a step must set one of filter, map, flatMap, dedupe, aggregate or batch"
                    .into(),
            });
        }
    }
    Ok(out)
}

#[derive(Clone)]
struct Filter {
    name: String,
    cel: Expr,
}

impl Processor for Filter {
    fn name(&self) -> &str {
        &self.name
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        if self.cel.bool(ctx.env(), &input(&r))? {
            out.push(r);
        }
        Ok(())
    }
}

#[derive(Clone)]
struct Map {
    name: String,
    key: Option<Expr>,
    value: Option<Expr>,
}

impl Processor for Map {
    fn name(&self) -> &str {
        &self.name
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let key = match &self.key {
            Some(e) => Json::String(e.key(ctx.env(), &input(&r))?),
            None => r.key.clone(),
        };
        let value = match &self.value {
            Some(e) => e.json(ctx.env(), &input(&r))?,
            None => r.value.clone(),
        };
        out.push(Record {
            key,
            value,
            timestamp: r.timestamp,
        });
        Ok(())
    }
}

#[derive(Clone)]
struct FlatMap {
    name: String,
    cel: Expr,
}

impl Processor for FlatMap {
    fn name(&self) -> &str {
        &self.name
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        for value in self.cel.list(ctx.env(), &input(&r))? {
            out.push(Record {
                key: r.key.clone(),
                value,
                timestamp: r.timestamp,
            });
        }
        Ok(())
    }
}

/// First occurrence of an id within `within` (event time) passes.
#[derive(Clone)]
struct Dedupe {
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
    fn compile(p: &str, name: String, d: &DedupeStep) -> Result<Self, CompileError> {
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
}

fn be_i64(v: &[u8]) -> Option<i64> {
    <[u8; 8]>::try_from(v).ok().map(i64::from_be_bytes)
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
            if let (Some(id), Some(seen)) = (k.strip_prefix(b"k"), be_i64(v)) {
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
        let key = [b"k".as_slice(), id.as_bytes()].concat();
        let seen = ctx.get(&self.store, &key)?.as_deref().and_then(be_i64);
        self.stream_time = advance_stream_time(ctx, &self.store, r.timestamp, self.stream_time)?;
        // Forget ids that fell out of the window: the store stays bounded.
        while let Some((at, old)) = self.expiry.first().cloned() {
            if at >= self.stream_time {
                break;
            }
            self.expiry.pop_first();
            self.undo.push((at, old.clone()));
            let k = [b"k".as_slice(), old.as_bytes()].concat();
            if let Some(t) = ctx.get(&self.store, &k)?.as_deref().and_then(be_i64)
                && t.saturating_add(self.within) < self.stream_time
                && old != id
            {
                ctx.delete(&self.store, &k);
            }
        }
        match seen {
            Some(t) if r.timestamp.abs_diff(t) <= self.within.unsigned_abs() => Ok(()),
            _ => {
                ctx.put(&self.store, &key, r.timestamp.to_be_bytes().to_vec());
                self.expiry
                    .insert((r.timestamp.saturating_add(self.within), id));
                out.push(r);
                Ok(())
            }
        }
    }
}

/// One aggregation's accumulator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "k")]
pub enum Acc {
    Count {
        n: i64,
    },
    Sum {
        int: i64,
        float: f64,
        is_float: bool,
    },
    Min {
        v: Option<f64>,
        is_float: bool,
    },
    Max {
        v: Option<f64>,
        is_float: bool,
    },
    Avg {
        sum: f64,
        n: i64,
    },
    Last {
        v: Json,
        ts: i64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AggKind {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    Last,
}

fn num_json(v: f64, is_float: bool) -> Json {
    if !is_float && v.fract() == 0.0 && v.abs() < 9.0e15 {
        json!(v as i64)
    } else {
        json!(v)
    }
}

impl Acc {
    fn new(kind: AggKind) -> Self {
        match kind {
            AggKind::Count => Acc::Count { n: 0 },
            AggKind::Sum => Acc::Sum {
                int: 0,
                float: 0.0,
                is_float: false,
            },
            AggKind::Min => Acc::Min {
                v: None,
                is_float: false,
            },
            AggKind::Max => Acc::Max {
                v: None,
                is_float: false,
            },
            AggKind::Avg => Acc::Avg { sum: 0.0, n: 0 },
            AggKind::Last => Acc::Last {
                v: Json::Null,
                ts: i64::MIN,
            },
        }
    }

    fn add(&mut self, x: &Json, ts: i64) {
        let f = x.as_f64().unwrap_or(0.0);
        let float = !(x.is_i64() || x.is_u64());
        match self {
            Acc::Count { n } => *n += 1,
            Acc::Sum {
                int,
                float: fl,
                is_float,
            } => {
                if float {
                    *is_float = true;
                    *fl += f;
                } else {
                    *int = int.wrapping_add(x.as_i64().unwrap_or(f as i64));
                }
            }
            Acc::Min { v, is_float } => {
                *is_float |= float;
                *v = Some(v.map_or(f, |m| m.min(f)));
            }
            Acc::Max { v, is_float } => {
                *is_float |= float;
                *v = Some(v.map_or(f, |m| m.max(f)));
            }
            Acc::Avg { sum, n } => {
                *sum += f;
                *n += 1;
            }
            Acc::Last { v, ts: t } => {
                if ts >= *t {
                    *v = x.clone();
                    *t = ts;
                }
            }
        }
    }

    /// Session merge.
    fn merge(&mut self, other: &Acc) {
        match (self, other) {
            (Acc::Count { n }, Acc::Count { n: m }) => *n += m,
            (
                Acc::Sum {
                    int,
                    float,
                    is_float,
                },
                Acc::Sum {
                    int: i2,
                    float: f2,
                    is_float: b2,
                },
            ) => {
                *int = int.wrapping_add(*i2);
                *float += f2;
                *is_float |= b2;
            }
            (
                Acc::Min { v, is_float },
                Acc::Min {
                    v: v2,
                    is_float: b2,
                },
            ) => {
                *is_float |= b2;
                *v = match (*v, *v2) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            (
                Acc::Max { v, is_float },
                Acc::Max {
                    v: v2,
                    is_float: b2,
                },
            ) => {
                *is_float |= b2;
                *v = match (*v, *v2) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
            }
            (Acc::Avg { sum, n }, Acc::Avg { sum: s2, n: n2 }) => {
                *sum += s2;
                *n += n2;
            }
            (Acc::Last { v, ts }, Acc::Last { v: v2, ts: t2 }) if *t2 >= *ts => {
                *v = v2.clone();
                *ts = *t2;
            }
            _ => {}
        }
    }

    /// The field's value as emitted (and as queries answer it).
    pub(crate) fn result(&self) -> Json {
        match self {
            Acc::Count { n } => json!(n),
            Acc::Sum {
                int,
                float,
                is_float,
            } => {
                if *is_float {
                    json!(*float + *int as f64)
                } else {
                    json!(int)
                }
            }
            Acc::Min { v, is_float } | Acc::Max { v, is_float } => {
                v.map_or(Json::Null, |v| num_json(v, *is_float))
            }
            Acc::Avg { sum, n } => {
                if *n == 0 {
                    Json::Null
                } else {
                    json!(sum / *n as f64)
                }
            }
            Acc::Last { v, .. } => v.clone(),
        }
    }
}

/// One window's (or the unwindowed) aggregate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowAgg {
    pub start: i64,
    pub end: i64,
    /// `onWindowClose` already sent this window's final record.
    #[serde(default)]
    pub emitted: bool,
    pub acc: Vec<Acc>,
}

/// Everything the aggregate store holds for one group key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct AggState {
    pub windows: Vec<WindowAgg>,
}

#[derive(Clone)]
struct Aggregate {
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

const STREAM_TIME: &[u8] = b"m:stream-time";

/// Moves a step's stream time (the largest event time it has seen) to `ts` if later and
/// returns it. It lives in the step's store, so an aborted record cannot move it and a
/// restore finds it again; `fallback` serves state written before it was stored.
fn advance_stream_time(
    ctx: &mut Context<'_>,
    store: &StoreName,
    ts: i64,
    fallback: i64,
) -> Result<i64, StepError> {
    let prev = ctx
        .get(store, STREAM_TIME)?
        .as_deref()
        .and_then(be_i64)
        .unwrap_or(fallback);
    let now = prev.max(ts);
    if now != prev {
        ctx.put(store, STREAM_TIME, now.to_be_bytes().to_vec());
    }
    Ok(now)
}

impl Aggregate {
    fn compile(p: &str, name: String, a: &AggregateStep) -> Result<Self, CompileError> {
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
            let (kind, e) = if f.count.is_some() {
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
                    path: fp,
                    message: "an aggregate field is one of count, sum, min, max, avg or last"
                        .into(),
                });
            };
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

    fn key(group: &str) -> Vec<u8> {
        [b"k".as_slice(), group.as_bytes()].concat()
    }

    fn load(&self, ctx: &Context<'_>, group: &str) -> Result<AggState, StepError> {
        match ctx.get(&self.store, &Self::key(group))? {
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
            ctx.delete(&self.store, &Self::key(group));
        } else {
            // Serializing plain data into a Vec cannot fail.
            let bytes = serde_json::to_vec(s).unwrap_or_default();
            ctx.put(&self.store, &Self::key(group), bytes);
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
            if let Some(g) = k.strip_prefix(b"k")
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
        let mut values = Vec::with_capacity(self.fields.len());
        for (_, _, e) in &self.fields {
            values.push(match e {
                Some(e) => e.json(ctx.env(), &input(&r))?,
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
        let kinds: Vec<AggKind> = self.fields.iter().map(|(_, k, _)| *k).collect();
        let new_acc = |ts: i64| -> Vec<Acc> {
            kinds
                .iter()
                .zip(&values)
                .map(|(k, v)| {
                    let mut a = Acc::new(*k);
                    a.add(v, ts);
                    a
                })
                .collect()
        };
        let Some(rules) = self.rules else {
            let mut s = self.load(ctx, &group)?;
            if s.windows.is_empty() {
                s.windows.push(WindowAgg {
                    start: 0,
                    end: 0,
                    emitted: false,
                    acc: new_acc(r.timestamp),
                });
            } else {
                for (a, v) in s.windows[0].acc.iter_mut().zip(&values) {
                    a.add(v, r.timestamp);
                }
            }
            out.push(self.output(&group, &s.windows[0], r.timestamp));
            self.save(ctx, &group, &s);
            return Ok(());
        };
        let stream_time = advance_stream_time(ctx, &self.store, r.timestamp, i64::MIN)?;
        self.advance(ctx, stream_time, out)?;
        let mut s = self.load(ctx, &group)?;
        let mut touched: Vec<usize> = Vec::new();
        match rules.windows {
            Windows::Tumbling { .. } | Windows::Hopping { .. } => {
                for win in rules.assign(r.timestamp) {
                    if rules.is_closed(win, stream_time) {
                        continue; // late: this window is final
                    }
                    let idx = match s
                        .windows
                        .iter()
                        .position(|w| w.start == win.start && w.end == win.end)
                    {
                        Some(i) => {
                            for (a, v) in s.windows[i].acc.iter_mut().zip(&values) {
                                a.add(v, r.timestamp);
                            }
                            i
                        }
                        None => {
                            s.windows.push(WindowAgg {
                                start: win.start,
                                end: win.end,
                                emitted: false,
                                acc: new_acc(r.timestamp),
                            });
                            s.windows.len() - 1
                        }
                    };
                    touched.push(idx);
                }
            }
            Windows::Session { gap } => {
                let own = Window {
                    start: r.timestamp,
                    end: r.timestamp.saturating_add(gap),
                };
                if !rules.is_closed(own, stream_time) {
                    // Merge every open session this record is within `gap` of.
                    let mut merged = WindowAgg {
                        start: own.start,
                        end: own.end,
                        emitted: false,
                        acc: new_acc(r.timestamp),
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
                        let near =
                            r.timestamp <= w.end && r.timestamp.saturating_add(gap) >= w.start;
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
                    if let Some(i) = s
                        .windows
                        .iter()
                        .position(|w| w.start <= r.timestamp && r.timestamp < w.end)
                    {
                        touched.push(i);
                    }
                }
            }
        }
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

#[derive(Clone)]
struct Batch {
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

/// Separates the user's group from the topic in the internal batch key.
const TOPIC_SEPARATOR: char = '\u{1f}';

/// librdkafka's default `message.max.bytes` (the broker's is slightly larger): a batch
/// record larger than this cannot be produced.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 1_000_000;

impl Batch {
    fn compile(
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

    fn header_key(group: &str) -> Vec<u8> {
        [b"h".as_slice(), group.as_bytes()].concat()
    }

    fn record_key(group: &str, seq: u32) -> Vec<u8> {
        [b"r".as_slice(), group.as_bytes(), b"\0", &seq.to_be_bytes()].concat()
    }

    fn header(&self, ctx: &Context<'_>, group: &str) -> Result<Option<OpenBatch>, StepError> {
        match ctx.get(&self.store, &Self::header_key(group))? {
            Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                StepError::Record(format!("failed to decode open batch {group:?}: {e}"))
            }),
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
            let k = Self::record_key(group, seq);
            let v = ctx.get(&self.store, &k)?.ok_or_else(|| {
                StepError::Record(format!("batch {group:?} lost record {seq} of {}", h.count))
            })?;
            records.push(
                serde_json::from_slice::<Json>(&v).map_err(|e| {
                    StepError::Record(format!("failed to decode batched record: {e}"))
                })?,
            );
            ctx.delete(&self.store, &k);
        }
        ctx.delete(&self.store, &Self::header_key(group));
        if let Some(at) = self.open.remove(group) {
            self.undo.push((group.to_string(), at));
        }
        let batch_id = format!(
            "{}-{}-{}-{}",
            h.topic, h.partition, h.first_offset, h.last_offset
        );
        out.push(Record {
            key: match group.split(TOPIC_SEPARATOR).next().unwrap_or_default() {
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
            if let Some(g) = k.strip_prefix(b"h")
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
            StepError::Record("batch needs a source record (it cannot follow a punctuation)".into())
        })?;
        let group = if self.per_topic {
            format!("{group}{TOPIC_SEPARATOR}{}", src.topic)
        } else {
            group
        };
        let item =
            json!({"key": r.key, "value": r.value, "offset": src.offset, "timestamp": r.timestamp});
        let bytes = serde_json::to_vec(&item).unwrap_or_default();
        let mut h = match self.header(ctx, &group)? {
            Some(h) => h,
            None => OpenBatch {
                topic: src.topic.clone(),
                partition: src.partition,
                first_offset: src.offset,
                last_offset: src.offset,
                count: 0,
                opened_at: ctx.now_ms(),
                bytes: 0,
            },
        };
        // Close early rather than build a record the broker would refuse.
        let limit = self.max_bytes.saturating_sub(4096);
        if h.count > 0 && h.bytes + bytes.len() as u64 > limit {
            tracing::warn!(step = %self.name, group = %group, count = h.count, bytes = h.bytes,
                "closing batch early: one more record would exceed max.message.bytes ({})", self.max_bytes);
            let full = h.clone();
            self.close(ctx, &group, &full, out)?;
            h = OpenBatch {
                topic: src.topic.clone(),
                partition: src.partition,
                first_offset: src.offset,
                last_offset: src.offset,
                count: 0,
                opened_at: ctx.now_ms(),
                bytes: 0,
            };
        } else if !self.warned && h.bytes + bytes.len() as u64 > limit * 8 / 10 {
            self.warned = true;
            tracing::warn!(step = %self.name, group = %group, bytes = h.bytes,
                "batch is above 80% of max.message.bytes ({}); lower size or the batches will be closed early", self.max_bytes);
        }
        ctx.put(
            &self.store,
            &Self::record_key(&group, h.count),
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
            ctx.put(&self.store, &Self::header_key(&group), hb);
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
