//! The aggregate step's accumulators and the state it stores per group key.
//!
//! Owns: [`Acc`] (one field's running value: add, session merge, result), the field
//! kinds, and [`AggState`]/[`WindowAgg`], the JSON an aggregate store holds (the queries
//! read it too, so its serde shape is a stored format: change it only compatibly). Must
//! not touch: windows' timing rules (`window.rs`) or the store (`aggregate.rs` loads and
//! saves).

use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

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

/// The spec's kind of an aggregate field: which [`Acc`] it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AggKind {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    Last,
}

/// A min or max as JSON: an integer while every input was one (and it fits exactly).
fn num_json(v: f64, is_float: bool) -> Json {
    if !is_float && v.fract() == 0.0 && v.abs() < 9.0e15 {
        json!(v as i64)
    } else {
        json!(v)
    }
}

impl Acc {
    pub(crate) fn new(kind: AggKind) -> Self {
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

    pub(crate) fn add(&mut self, x: &Json, ts: i64) {
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
    pub(crate) fn merge(&mut self, other: &Acc) {
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
