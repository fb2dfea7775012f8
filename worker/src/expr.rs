//! CEL expressions over records: compiled once at start, evaluated per record.
//!
//! Records are JSON (`serde_json::Value`); an expression sees `key`, `value` and
//! `timestamp` (epoch milliseconds). This module owns the conversion between JSON and CEL
//! values and nothing else: no state, no Kafka.

use std::collections::HashMap;
use std::sync::Arc;

use cel::objects::{Key, Map};
use cel::{Context, Program, Value};
use oxbow_crds::cel_cost::{self, Cost};
use serde_json::Value as Json;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ExprError {
    /// The parser's report spans lines (the expression, a caret); its first line says it.
    #[error(
        "{path}: failed to compile CEL expression {expr:?}: {}",
        first_line(source)
    )]
    Compile {
        path: String,
        expr: String,
        #[source]
        source: Arc<cel::ParseErrors>,
    },
    /// Boxed: CEL's error holds values, and every record's result carries the size.
    #[error("failed to evaluate {path} ({expr:?}): {source}")]
    Evaluate {
        path: String,
        expr: String,
        #[source]
        source: Box<cel::ExecutionError>,
    },
    /// A plain selection (`value.a.b`, read without CEL) met a value that is not a map.
    #[error("failed to evaluate {path} ({expr:?}): cannot select field {field:?} from {from}")]
    Select {
        path: String,
        expr: String,
        field: String,
        from: &'static str,
    },
    #[error(
        "CostExceeded: {path} ({expr:?}) would cost {cost} units on this record (its largest list or string has {size} elements), over the per-record budget of {budget}"
    )]
    CostExceeded {
        path: String,
        expr: String,
        cost: u64,
        size: u64,
        budget: u64,
    },
    #[error("{path} ({expr:?}) returned {got}, expected {want}")]
    Type {
        path: String,
        expr: String,
        got: String,
        want: &'static str,
    },
}

/// The first line of a multi-line report.
fn first_line(e: &impl std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .next()
        .unwrap_or("syntax error")
        .to_string()
}

/// The stdlib environment shared by every evaluation: building it is not free, so the
/// worker builds it once and gives each record a child scope.
#[derive(Default)]
pub struct Env {
    root: Context<'static, 'static>,
}

/// What an expression sees.
pub struct Input<'a> {
    pub key: &'a Json,
    pub value: &'a Json,
    pub timestamp: i64,
}

/// A compiled expression with the field path it came from (for error messages).
#[derive(Clone)]
pub struct Expr {
    path: String,
    source: String,
    program: Arc<Program>,
    /// `value.a.b` or `key.a`: a plain field selection, answered straight from the JSON
    /// without converting the record to CEL (most groupBy, sum and timestamp
    /// expressions). Same results and errors as CEL's field selection.
    selection: Option<(Var, Vec<String>)>,
    /// What one evaluation may cost, by the size of the record (see `cel_cost`).
    cost: Arc<Cost>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Var {
    Key,
    Value,
}

/// Recognises `value`, `key`, `value.a.b`, … (identifiers only, no spaces inside).
pub(crate) fn selection(source: &str) -> Option<(Var, Vec<String>)> {
    let mut parts = source.trim().split('.');
    let var = match parts.next()? {
        "value" => Var::Value,
        "key" => Var::Key,
        _ => return None,
    };
    let fields: Vec<String> = parts.map(str::to_string).collect();
    let ident = |f: &String| {
        let mut c = f.chars();
        c.next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    // CEL reserved words are not field names in dot syntax.
    let reserved = [
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
        "true",
        "false",
        "null",
    ];
    if fields
        .iter()
        .all(|f| ident(f) && !reserved.contains(&f.as_str()))
    {
        Some((var, fields))
    } else {
        None
    }
}

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Expr({}: {:?})", self.path, self.source)
    }
}

impl Expr {
    /// Compiles `source`; the error names the field path and the position CEL reports.
    pub fn compile(path: impl Into<String>, source: &str) -> Result<Self, ExprError> {
        let path = path.into();
        match Program::compile(source) {
            Ok(p) => Ok(Self {
                path,
                source: source.to_string(),
                cost: Arc::new(cel_cost::estimate(&p)),
                program: Arc::new(p),
                selection: selection(source),
            }),
            Err(e) => Err(ExprError::Compile {
                path,
                expr: source.to_string(),
                source: Arc::new(e),
            }),
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether an evaluation's cost is checked against the size of the record (key, value
    /// or `other`): then a smaller record may pass where a larger one is refused.
    pub(crate) fn cost_depends_on_size(&self) -> bool {
        self.selection.is_none() && self.cost.degree() > 0
    }

    fn eval(&self, env: &Env, input: &Input<'_>) -> Result<Value, ExprError> {
        self.eval_with(env, input, None)
    }

    /// Evaluates with `other` (a joined table row, or null) in scope as well.
    pub fn json_with_other(
        &self,
        env: &Env,
        input: &Input<'_>,
        other: &Json,
    ) -> Result<Json, ExprError> {
        let v = self.eval_with(env, input, Some(other))?;
        v.json()
            .map_err(|_| self.type_error(&v, "a JSON-representable value"))
    }

    fn eval_with(
        &self,
        env: &Env,
        input: &Input<'_>,
        other: Option<&Json>,
    ) -> Result<Value, ExprError> {
        if let Some((var, fields)) = &self.selection {
            let mut v = match var {
                Var::Key => input.key,
                Var::Value => input.value,
            };
            for f in fields {
                v = match v {
                    // What CEL answers for a missing key, so both paths fail alike.
                    Json::Object(o) => o.get(f).ok_or_else(|| ExprError::Evaluate {
                        path: self.path.clone(),
                        expr: self.source.clone(),
                        source: Box::new(cel::ExecutionError::NoSuchKey(Arc::new(f.clone()))),
                    })?,
                    other => {
                        return Err(ExprError::Select {
                            path: self.path.clone(),
                            expr: self.source.clone(),
                            field: f.clone(),
                            from: kind(other),
                        });
                    }
                };
            }
            return Ok(to_cel(v));
        }
        self.check_cost(input, other)?;
        let mut ctx = env.root.new_inner_scope();
        ctx.add_variable_from_value("key", to_cel(input.key));
        ctx.add_variable_from_value("value", to_cel(input.value));
        ctx.add_variable_from_value("timestamp", Value::Int(input.timestamp));
        if let Some(o) = other {
            ctx.add_variable_from_value("other", to_cel(o));
        }
        self.program
            .execute(&ctx)
            .map_err(|source| ExprError::Evaluate {
                path: self.path.clone(),
                expr: self.source.clone(),
                source: Box::new(source),
            })
    }

    /// Refuses, before any work, an evaluation whose cost for this record's sizes is
    /// over the budget. Only expressions whose cost depends on the record look at it.
    fn check_cost(&self, input: &Input<'_>, other: Option<&Json>) -> Result<(), ExprError> {
        if self.cost.degree() == 0 {
            return Ok(());
        }
        let size = [Some(input.key), Some(input.value), other]
            .into_iter()
            .flatten()
            .map(cel_cost::size_of)
            .max()
            .unwrap_or(1);
        let cost = self.cost.at(size);
        if cost > cel_cost::BUDGET {
            return Err(ExprError::CostExceeded {
                path: self.path.clone(),
                expr: self.source.clone(),
                cost,
                size,
                budget: cel_cost::BUDGET,
            });
        }
        Ok(())
    }

    fn type_error(&self, got: &Value, want: &'static str) -> ExprError {
        ExprError::Type {
            path: self.path.clone(),
            expr: self.source.clone(),
            got: format!("{:?}", got.type_of()),
            want,
        }
    }

    pub fn json(&self, env: &Env, input: &Input<'_>) -> Result<Json, ExprError> {
        let v = self.eval(env, input)?;
        v.json()
            .map_err(|_| self.type_error(&v, "a JSON-representable value"))
    }

    pub fn bool(&self, env: &Env, input: &Input<'_>) -> Result<bool, ExprError> {
        match self.eval(env, input)? {
            Value::Bool(b) => Ok(b),
            other => Err(self.type_error(&other, "bool")),
        }
    }

    pub fn number(&self, env: &Env, input: &Input<'_>) -> Result<f64, ExprError> {
        match self.eval(env, input)? {
            Value::Int(i) => Ok(i as f64),
            Value::UInt(u) => Ok(u as f64),
            Value::Float(f) if f.is_finite() => Ok(f),
            other => Err(self.type_error(&other, "a finite number")),
        }
    }

    /// A string key: strings as they are, integers and bools in their decimal form.
    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn key(&self, env: &Env, input: &Input<'_>) -> Result<String, ExprError> {
        match self.eval(env, input)? {
            Value::String(s) => Ok(s.to_string()),
            Value::Int(i) => Ok(i.to_string()),
            Value::UInt(u) => Ok(u.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            other => Err(self.type_error(&other, "a string (or integer) key")),
        }
    }

    pub fn list(&self, env: &Env, input: &Input<'_>) -> Result<Vec<Json>, ExprError> {
        match self.eval(env, input)? {
            Value::List(l) => l
                .iter()
                .map(|v| {
                    v.json()
                        .map_err(|_| self.type_error(v, "JSON-representable elements"))
                })
                .collect(),
            other => Err(self.type_error(&other, "a list")),
        }
    }

    /// Epoch milliseconds from an integer or an RFC 3339 string.
    pub fn timestamp(&self, env: &Env, input: &Input<'_>) -> Result<i64, ExprError> {
        match self.eval(env, input)? {
            Value::Int(i) => Ok(i),
            Value::UInt(u) => {
                i64::try_from(u).map_err(|_| self.type_error(&Value::UInt(u), "epoch milliseconds"))
            }
            Value::Float(f) if f.is_finite() => Ok(f as i64),
            Value::String(s) => chrono_millis(&s).ok_or_else(|| {
                self.type_error(
                    &Value::String(s.clone()),
                    "epoch milliseconds or an RFC 3339 timestamp",
                )
            }),
            Value::Timestamp(t) => Ok(t.timestamp_millis()),
            other => Err(self.type_error(&other, "epoch milliseconds or an RFC 3339 timestamp")),
        }
    }
}

fn chrono_millis(s: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp_millis())
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a bool",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "a map",
    }
}

/// JSON → CEL. Integers stay integers (so `value.count > 5` compares as ints); other
/// numbers become doubles.
pub fn to_cel(v: &Json) -> Value {
    match v {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::UInt(u)
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::String(Arc::new(s.clone())),
        Json::Array(a) => Value::List(Arc::new(a.iter().map(to_cel).collect())),
        Json::Object(o) => {
            let map: HashMap<Key, Value> = o
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            Value::Map(Map { map: Arc::new(map) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input<'a>(key: &'a Json, value: &'a Json) -> Input<'a> {
        Input {
            key,
            value,
            timestamp: 1000,
        }
    }

    #[test]
    fn a_compile_error_names_the_field_and_the_position() {
        let err =
            Expr::compile("spec.steps[1].filter.cel", "value.amount >").expect_err("syntax error");
        let msg = err.to_string();
        assert!(
            msg.starts_with("spec.steps[1].filter.cel: failed to compile CEL expression"),
            "{msg}"
        );
        assert!(
            msg.contains("line") || msg.contains(':'),
            "position missing: {msg}"
        );
    }

    #[test]
    fn a_record_too_large_for_a_nested_comprehension_is_refused_before_any_work() {
        let env = Env::default();
        let e = Expr::compile(
            "spec.steps[0].filter.cel",
            "value.a.all(i, value.a.exists(j, j == i))",
        )
        .expect("compiles");
        let k = json!("k");
        let small = json!({"a": [1, 2, 3]});
        assert_eq!(e.bool(&env, &input(&k, &small)).ok(), Some(true));
        let big = json!({"a": (0..20_000).collect::<Vec<_>>()});
        let err = e.bool(&env, &input(&k, &big)).expect_err("over budget");
        assert!(
            matches!(err, ExprError::CostExceeded { size: 20_000, .. }),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("CostExceeded: spec.steps[0].filter.cel")
        );
    }

    #[test]
    fn expressions_see_key_value_and_timestamp() {
        let env = Env::default();
        let k = json!("u1");
        let v = json!({"amount": 120, "tags": ["a", "b"]});
        let e = Expr::compile(
            "p",
            "value.amount > 100 && key == 'u1' && timestamp == 1000",
        )
        .expect("compiles");
        assert!(e.bool(&env, &input(&k, &v)).expect("evaluates"));
        let m = Expr::compile("p", "{'user': key, 'double': value.amount * 2}").expect("compiles");
        assert_eq!(
            m.json(&env, &input(&k, &v)).expect("evaluates"),
            json!({"user": "u1", "double": 240})
        );
        let l = Expr::compile("p", "value.tags").expect("compiles");
        assert_eq!(
            l.list(&env, &input(&k, &v)).expect("evaluates"),
            vec![json!("a"), json!("b")]
        );
    }

    #[test]
    fn a_missing_field_is_an_evaluation_error_not_a_panic() {
        let env = Env::default();
        let k = json!(null);
        let v = json!({"a": 1});
        let e = Expr::compile("spec.steps[0].map.value", "value.b + 1").expect("compiles");
        let err = e.json(&env, &input(&k, &v)).expect_err("no such key");
        assert!(err.to_string().contains("spec.steps[0].map.value"), "{err}");
    }

    #[test]
    fn a_wrong_result_type_is_reported_with_what_was_expected() {
        let env = Env::default();
        let k = json!(null);
        let v = json!({"a": "x"});
        let e = Expr::compile("spec.steps[0].filter.cel", "value.a").expect("compiles");
        let err = e.bool(&env, &input(&k, &v)).expect_err("not a bool");
        assert!(err.to_string().contains("expected bool"), "{err}");
    }

    #[test]
    fn field_selections_answer_like_cel_without_converting_the_record() {
        let env = Env::default();
        let k = json!("u1");
        let v = json!({"a": {"b": 7}, "s": "x", "f": 1.5, "n": null});
        for src in [
            "value.a.b",
            "value.s",
            "value.f",
            "value.a",
            "key",
            "value.n",
        ] {
            let fast = Expr::compile("p", src).expect("compiles");
            assert!(fast.selection.is_some(), "{src} takes the fast path");
            let mut slow = fast.clone();
            slow.selection = None;
            assert_eq!(
                fast.json(&env, &input(&k, &v)).ok(),
                slow.json(&env, &input(&k, &v)).ok(),
                "{src}"
            );
        }
        for src in ["value.missing", "value.s.x", "value.n.x"] {
            let fast = Expr::compile("p", src).expect("compiles");
            assert!(
                fast.json(&env, &input(&k, &v)).is_err(),
                "{src} is an error"
            );
            let mut slow = fast.clone();
            slow.selection = None;
            assert!(
                slow.json(&env, &input(&k, &v)).is_err(),
                "{src} is an error in CEL too"
            );
        }
        assert!(
            Expr::compile("p", "value.a.b + 1")
                .expect("compiles")
                .selection
                .is_none()
        );
        assert!(
            Expr::compile("p", "value.in").is_err()
                || Expr::compile("p", "value.in")
                    .expect("c")
                    .selection
                    .is_none()
        );
    }

    #[test]
    fn timestamps_accept_epoch_millis_and_rfc3339() {
        let env = Env::default();
        let k = json!(null);
        let v = json!({"ts": 1700000000000_i64, "at": "2024-01-01T00:00:01Z"});
        let a = Expr::compile("p", "value.ts").expect("compiles");
        assert_eq!(
            a.timestamp(&env, &input(&k, &v)).expect("ok"),
            1_700_000_000_000
        );
        let b = Expr::compile("p", "value.at").expect("compiles");
        assert_eq!(
            b.timestamp(&env, &input(&k, &v)).expect("ok"),
            1_704_067_201_000
        );
    }
}
