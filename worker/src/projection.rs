//! Which fields of a source record's JSON value the app can see: decoding only those
//! skips building strings, numbers and maps nobody reads (most of the decoding cost of a
//! wide record).
//!
//! Owns: the decision, a pure function of the spec ([`plan`]). Must not touch decoding
//! (that is [`crate::decode`]) or evaluating expressions (that is [`crate::expr`]).
//!
//! The rule is conservative: a projection is planned only when every expression that can
//! see the source value is a plain field selection (`value.a.b`) or does not mention
//! `value` at all (and its cost does not grow with the record), and the value is replaced
//! (by an `aggregate`, a `map` with a `value`, or a `flatMap`) before any step or sink
//! that passes it on whole. Anything else decodes the whole value, as before. The same
//! selections then find the same fields and fail on the same missing ones: results,
//! errors and dead letters (which carry the record's original bytes) are unchanged.

use std::collections::BTreeMap;

use oxbow_crds::{RecordFormat, StreamAppSpec};
use serde_json::Value as Json;

use crate::expr::{Expr, Var};

/// The fields to keep inside an object: by name, what to keep of that field's value
/// (`None`: all of it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields(pub BTreeMap<String, Option<Fields>>);

impl Fields {
    /// Keeps the field at `path` (and everything under it).
    fn keep(&mut self, path: &[String]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        match self.0.get_mut(first) {
            // Already kept whole.
            Some(None) => {}
            Some(Some(inner)) if !rest.is_empty() => inner.keep(rest),
            _ if rest.is_empty() => {
                self.0.insert(first.clone(), None);
            }
            _ => {
                let mut inner = Fields::default();
                inner.keep(rest);
                self.0.insert(first.clone(), Some(inner));
            }
        }
    }

    /// The dotted paths kept, for the log line at start.
    pub fn paths(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, inner) in &self.0 {
            match inner {
                None => out.push(name.clone()),
                Some(f) => out.extend(f.paths().into_iter().map(|p| format!("{name}.{p}"))),
            }
        }
        out
    }
}

/// How a stage-0 task decodes source values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Only these fields (the value is a JSON object; anything else is kept whole).
    Project(Fields),
    /// All of it, and why.
    Whole(String),
}

/// The plan for `spec`'s source values.
pub fn plan(spec: &StreamAppSpec) -> Plan {
    if spec.source.value_format != RecordFormat::Json {
        return Plan::Whole("the source values are not JSON".into());
    }
    // Every expression evaluated while the record's value is still the source's.
    let mut exprs: Vec<String> = Vec::new();
    exprs.extend(spec.source.timestamp.iter().cloned());
    exprs.extend(spec.source.partitioned_by.iter().cloned());
    let mut replaced = false;
    for (i, step) in spec.steps.iter().enumerate() {
        let label = oxbow_crds::validate::step_label(i, step);
        let mut doc = serde_json::to_value(step).unwrap_or(Json::Null);
        if let Json::Object(o) = &mut doc {
            o.remove("name");
        }
        strings(&doc, &mut exprs);
        if step.filter.is_some() || step.dedupe.is_some() {
            continue;
        }
        if let Some(m) = &step.map {
            if m.value.is_some() {
                replaced = true;
                break;
            }
            continue;
        }
        if step.flat_map.is_some() || step.aggregate.is_some() {
            replaced = true;
            break;
        }
        return Plan::Whole(format!("step {label} passes the source value on whole"));
    }
    if !replaced {
        return Plan::Whole("the source value reaches the sink".into());
    }
    let mut fields = Fields::default();
    for e in &exprs {
        match selection_or_reason(e) {
            Ok(Some(path)) if path.is_empty() => {
                return Plan::Whole(format!("expression {e:?} reads the whole value"));
            }
            Ok(Some(path)) => fields.keep(&path),
            Ok(None) => {}
            Err(reason) => return Plan::Whole(format!("expression {e:?} {reason}")),
        }
    }
    Plan::Project(fields)
}

/// For a string of the spec that may be an expression: the value path it selects, none,
/// or why it needs the whole value.
fn selection_or_reason(s: &str) -> Result<Option<Vec<String>>, &'static str> {
    if let Some((var, path)) = crate::expr::selection(s) {
        return Ok((var == Var::Value).then_some(path));
    }
    if mentions_value(s) {
        return Err("reads the value beyond plain field selections");
    }
    // Not an expression at all (a store name, a duration), or one that cannot compile:
    // the app refuses to start on the latter anyway.
    match Expr::compile("projection", s) {
        Ok(e) if e.cost_depends_on_size() => {
            Err("has a cost checked against the size of the record, value included")
        }
        _ => Ok(None),
    }
}

/// Whether `s` has the identifier `value` anywhere (in a string literal too: erring on
/// the side of decoding everything).
fn mentions_value(s: &str) -> bool {
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|t| t == "value")
}

fn strings(v: &Json, out: &mut Vec<String>) {
    match v {
        Json::String(s) => out.push(s.clone()),
        Json::Array(a) => a.iter().for_each(|v| strings(v, out)),
        Json::Object(o) => o.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> StreamAppSpec {
        let head = "kafka: {bootstrapServers: k:9092}\nsource: {topics: [in], timestamp: value.ts}\nsink: {topic: out}\n";
        serde_yaml::from_str(&format!("{head}{yaml}")).expect("spec")
    }

    fn kept(p: &Plan) -> Vec<String> {
        match p {
            Plan::Project(f) => f.paths(),
            Plan::Whole(why) => panic!("expected a projection, got the whole value: {why}"),
        }
    }

    fn whole(p: &Plan) -> &str {
        match p {
            Plan::Whole(why) => why,
            Plan::Project(f) => panic!("expected the whole value, got {:?}", f.paths()),
        }
    }

    #[test]
    fn a_windowed_aggregate_of_selected_fields_decodes_only_those_fields() {
        let p = plan(&spec(
            "steps:\n- aggregate: {store: s, groupBy: value.user, window: {tumbling: 10m}, fields: {n: {count: {}}, total: {sum: value.amount}}}\n",
        ));
        assert_eq!(kept(&p), ["amount", "ts", "user"]);
    }

    #[test]
    fn filters_and_dedupes_before_the_aggregate_add_their_fields() {
        let p = plan(&spec(
            "steps:\n- filter: {cel: value.ok}\n- dedupe: {store: d, id: value.tx.id, within: 1h}\n- aggregate: {store: s, groupBy: key, fields: {total: {sum: value.amount}}}\n- filter: {cel: 'value.total > 3 && value.whatever == 1'}\n",
        ));
        assert_eq!(kept(&p), ["amount", "ok", "ts", "tx.id"]);
    }

    #[test]
    fn a_field_and_a_field_under_it_keep_the_outer_one_whole() {
        let mut f = Fields::default();
        f.keep(&["a".into(), "b".into()]);
        f.keep(&["a".into()]);
        f.keep(&["a".into(), "c".into()]);
        f.keep(&["x".into(), "y".into()]);
        f.keep(&["x".into(), "z".into()]);
        assert_eq!(f.paths(), ["a", "x.y", "x.z"]);
    }

    #[test]
    fn a_value_that_reaches_the_sink_or_a_to_step_is_decoded_whole() {
        assert!(whole(&plan(&spec("steps:\n- filter: {cel: value.ok}\n"))).contains("sink"));
        assert!(whole(&plan(&spec("steps:\n- to: {topic: other}\n- aggregate: {store: s, groupBy: key, fields: {n: {count: {}}}}\n"))).contains("to-0"));
    }

    #[test]
    fn an_expression_that_reads_the_value_beyond_selections_decodes_it_whole() {
        let p = plan(&spec(
            "steps:\n- filter: {cel: 'value.amount > 3 || size(value) > 2'}\n- aggregate: {store: s, groupBy: key, fields: {n: {count: {}}}}\n",
        ));
        assert!(whole(&p).contains("beyond plain field selections"), "{p:?}");
        let p = plan(&spec("steps:\n- map: {value: value}\n"));
        assert!(whole(&p).contains("whole value"), "{p:?}");
    }

    #[test]
    fn a_cost_that_grows_with_the_record_keeps_the_value_whole_even_without_reading_it() {
        let p = plan(&spec(
            "steps:\n- filter: {cel: 'key.split(\",\").exists(x, x == \"a\")'}\n- aggregate: {store: s, groupBy: key, fields: {n: {count: {}}}}\n",
        ));
        assert!(whole(&p).contains("cost"), "{p:?}");
    }

    #[test]
    fn a_map_that_replaces_the_value_ends_what_must_be_kept() {
        let p = plan(&spec(
            "steps:\n- map: {key: value.user, value: '{\"a\": value.a}'}\n- filter: {cel: 'size(value) > 0'}\n",
        ));
        // `{"a": value.a}` is not a plain selection: whole.
        assert!(matches!(p, Plan::Whole(_)));
        let p = plan(&spec(
            "steps:\n- map: {key: value.user}\n- flatMap: {cel: value.items}\n",
        ));
        assert_eq!(kept(&p), ["items", "ts", "user"]);
    }

    #[test]
    fn string_sources_are_never_projected() {
        let mut s =
            spec("steps:\n- aggregate: {store: s, groupBy: key, fields: {n: {count: {}}}}\n");
        s.source.value_format = RecordFormat::String;
        assert!(whole(&plan(&s)).contains("not JSON"));
    }
}
