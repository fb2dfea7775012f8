//! The aggregate step's accumulators and the state it stores per group key.
//!
//! Owns: [`Acc`] (one field's running value: add, session merge, result), the field
//! kinds, and [`AggState`]/[`WindowAgg`], what an aggregate store holds. Their serde
//! shape is the JSON store encoding, which stores written before the binary one still
//! hold (`encoding.rs` reads and writes both): change it only compatibly. Must not touch:
//! windows' timing rules (`window.rs`) or the store (`aggregate.rs` loads and saves).

use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

/// One aggregation's accumulator. Stored as a JSON object tagged by `k`; it is read
/// through [`AccFields`] (see its `Deserialize`).
#[derive(Debug, Clone, PartialEq, Serialize)]
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

/// Every field any stored [`Acc`] has, read in one pass. serde's internally tagged
/// enums buffer each object into an intermediate tree to find the tag first: with the
/// aggregate's windows read back on every record, that was about a tenth of a
/// windowed aggregate's CPU. The stored format is unchanged.
#[derive(Deserialize)]
struct AccFields {
    k: AggKind,
    n: Option<i64>,
    int: Option<i64>,
    float: Option<f64>,
    is_float: Option<bool>,
    sum: Option<f64>,
    /// A min or max (a number, or null before the first input), or the last value.
    v: Option<Json>,
    ts: Option<i64>,
}

impl<'de> Deserialize<'de> for Acc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let f = AccFields::deserialize(d)?;
        let need =
            |v: Option<i64>, name: &'static str| v.ok_or_else(|| D::Error::missing_field(name));
        let need_f =
            |v: Option<f64>, name: &'static str| v.ok_or_else(|| D::Error::missing_field(name));
        let flag = |v: Option<bool>| v.ok_or_else(|| D::Error::missing_field("is_float"));
        let number = |v: Option<Json>| match v {
            None | Some(Json::Null) => Ok(None),
            Some(x) => x
                .as_f64()
                .map(Some)
                .ok_or_else(|| D::Error::custom(format!("v is not a number: {x}"))),
        };
        Ok(match f.k {
            AggKind::Count => Acc::Count { n: need(f.n, "n")? },
            AggKind::Sum => Acc::Sum {
                int: need(f.int, "int")?,
                float: need_f(f.float, "float")?,
                is_float: flag(f.is_float)?,
            },
            AggKind::Min => Acc::Min {
                v: number(f.v)?,
                is_float: flag(f.is_float)?,
            },
            AggKind::Max => Acc::Max {
                v: number(f.v)?,
                is_float: flag(f.is_float)?,
            },
            AggKind::Avg => Acc::Avg {
                sum: need_f(f.sum, "sum")?,
                n: need(f.n, "n")?,
            },
            AggKind::Last => Acc::Last {
                v: f.v.unwrap_or(Json::Null),
                ts: need(f.ts, "ts")?,
            },
        })
    }
}

/// The spec's kind of an aggregate field: which [`Acc`] it starts. Also the tag `k` of a
/// stored [`Acc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> Vec<Acc> {
        vec![
            Acc::Count { n: 3 },
            Acc::Sum {
                int: 7,
                float: 0.5,
                is_float: true,
            },
            Acc::Min {
                v: None,
                is_float: false,
            },
            Acc::Max {
                v: Some(-2.25),
                is_float: true,
            },
            Acc::Avg { sum: 9.0, n: 4 },
            Acc::Last {
                v: json!({"a": [1, "x"]}),
                ts: 12,
            },
            Acc::Last {
                v: Json::Null,
                ts: i64::MIN,
            },
        ]
    }

    #[test]
    fn every_accumulator_reads_back_what_was_stored() {
        for acc in every_kind() {
            let stored = serde_json::to_string(&acc).expect("serializes");
            let back: Acc = serde_json::from_str(&stored).expect("reads back");
            assert_eq!(back, acc, "{stored}");
        }
    }

    #[test]
    fn the_stored_format_is_the_tagged_object_it_always_was() {
        let stored = r#"{"start":0,"end":0,"emitted":false,"acc":[{"k":"count","n":1},{"k":"sum","int":2,"float":0.0,"is_float":false},{"k":"min","v":3,"is_float":false},{"k":"max","v":null,"is_float":false},{"k":"avg","sum":1.5,"n":2},{"k":"last","v":"x","ts":5}]}"#;
        let w: WindowAgg = serde_json::from_str(stored).expect("reads");
        assert_eq!(
            w.acc,
            vec![
                Acc::Count { n: 1 },
                Acc::Sum {
                    int: 2,
                    float: 0.0,
                    is_float: false
                },
                Acc::Min {
                    v: Some(3.0),
                    is_float: false
                },
                Acc::Max {
                    v: None,
                    is_float: false
                },
                Acc::Avg { sum: 1.5, n: 2 },
                Acc::Last {
                    v: json!("x"),
                    ts: 5
                },
            ]
        );
        assert_eq!(
            serde_json::to_string(&w).expect("writes"),
            stored.replace(":3,", ":3.0,")
        );
    }

    #[test]
    fn a_stored_accumulator_missing_a_field_or_with_an_unknown_kind_is_an_error() {
        for bad in [
            r#"{"k":"count"}"#,
            r#"{"k":"sum","int":1,"float":0.0}"#,
            r#"{"k":"min","v":"x","is_float":false}"#,
            r#"{"k":"median","n":1}"#,
            r#"{"n":1}"#,
        ] {
            let err = serde_json::from_str::<Acc>(bad).expect_err(bad);
            assert!(!err.to_string().is_empty(), "{bad}");
        }
    }
}
