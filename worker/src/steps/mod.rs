//! The built-in steps (`filter`, `map`, `flatMap`, `dedupe`, `aggregate`, `batch`,
//! `join`, `to`) as
//! [`Processor`]s, compiled from the spec once and instantiated per task.
//!
//! Owns: compiling the spec's steps ([`compile`]), each step's processing (one file per
//! step), the aggregate's accumulators and windows, and the byte layout of every
//! built-in store ([`keys`], shared with the queries). Must not touch: Kafka, commits or
//! the stores directly; a step reads and writes only through its [`Context`], so the
//! engine decides what is committed.
//!
//! In-memory indexes (what is due to close, expire or time out) are hints rebuilt in
//! `init` and checked against the store before acting, so an aborted record or a crash
//! can only make them stale, never make state wrong.

mod accumulators;
mod aggregate;
mod batch;
mod dedupe;
pub mod encoding;
mod filter;
mod join;
pub mod keys;
mod map;
mod stream_join;
mod to;
pub mod window;

use oxbow_crds::duration::parse_duration;
use oxbow_crds::{StoreName, StreamAppSpec};

use crate::expr::{Expr, ExprError, Input};
use crate::processor::{Context, Processor, ProcessorFactory, Record, StepError};

pub use accumulators::{Acc, AggState, WindowAgg};
pub use batch::{DEFAULT_MAX_MESSAGE_BYTES, OpenBatch};

use aggregate::Aggregate;
use batch::Batch;
use dedupe::Dedupe;
use filter::Filter;
use join::Join;
use map::{FlatMap, Map};
use stream_join::StreamJoin;
use to::To;

pub use to::OUTPUT_TOPIC_MISSING;

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Expression(#[from] ExprError),
    #[error("{path}: failed to read duration: {source}")]
    Duration {
        path: String,
        #[source]
        source: oxbow_crds::duration::DurationError,
    },
    #[error("{path}: {source}")]
    Window {
        path: String,
        #[source]
        source: window::WindowError,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// A spec duration in milliseconds, the error naming the field.
fn millis(path: &str, s: &str) -> Result<i64, CompileError> {
    parse_duration(s)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .map_err(|source| CompileError::Duration {
            path: path.into(),
            source,
        })
}

/// What a step's CEL expressions see of a record.
fn input(r: &Record) -> Input<'_> {
    Input {
        key: &r.key,
        value: &r.value,
        timestamp: r.timestamp,
    }
}

/// A factory handing each task its own copy of a compiled step.
fn factory<P: Processor + Clone + Sync + 'static>(proc: P) -> ProcessorFactory {
    std::sync::Arc::new(move |_| Box::new(proc.clone()))
}

/// Compiles every step of the spec into a processor factory, in order. A bad expression
/// or duration fails here, at start, naming the field.
pub fn compile(spec: &StreamAppSpec) -> Result<Vec<ProcessorFactory>, CompileError> {
    let mut out: Vec<ProcessorFactory> = Vec::new();
    for (i, step) in spec.steps.iter().enumerate() {
        let p = format!("spec.steps[{i}]");
        let name = oxbow_crds::validate::step_label(i, step);
        if let Some(f) = &step.filter {
            out.push(factory(Filter {
                name,
                cel: Expr::compile(format!("{p}.filter.cel"), &f.cel)?,
            }));
        } else if let Some(m) = &step.map {
            out.push(factory(Map {
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
            }));
        } else if let Some(f) = &step.flat_map {
            out.push(factory(FlatMap {
                name,
                cel: Expr::compile(format!("{p}.flatMap.cel"), &f.cel)?,
            }));
        } else if let Some(d) = &step.dedupe {
            out.push(factory(Dedupe::compile(&p, name, d)?));
        } else if let Some(a) = &step.aggregate {
            out.push(factory(Aggregate::compile(&p, name, a)?));
        } else if let Some(b) = &step.batch {
            let per_topic = spec.source.topics.len() > 1;
            out.push(factory(Batch::compile(&p, name, b, per_topic)?));
        } else if let Some((j, stream)) = step
            .join
            .as_ref()
            .and_then(|j| Some((j, j.stream.as_ref()?)))
        {
            let store = oxbow_crds::validate::join_store(step).expect("a stream join has a store");
            out.push(factory(StreamJoin::compile(&p, name, store, j, stream)?));
        } else if let Some(j) = &step.join {
            let table = oxbow_crds::topology::joined_table(spec, step).ok_or_else(|| {
                CompileError::Invalid {
                    path: format!("{p}.join.table"),
                    message: format!(
                        "table {:?} is not declared in spec.tables",
                        j.table.as_deref().unwrap_or_default()
                    ),
                }
            })?;
            out.push(factory(Join::compile(&p, name, j, table)?));
        } else if let Some(t) = &step.to {
            out.push(factory(To::compile(&p, name, t)?));
        } else {
            return Err(CompileError::Invalid {
                path: p,
                message: "a step must set one of filter, map, flatMap, dedupe, aggregate, batch, join or to".into(),
            });
        }
    }
    Ok(out)
}

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
        .get(store, keys::STREAM_TIME)?
        .as_deref()
        .and_then(keys::decode_time)
        .unwrap_or(fallback);
    let now = prev.max(ts);
    if now != prev {
        ctx.put(store, keys::STREAM_TIME, keys::encode_time(now));
    }
    Ok(now)
}
