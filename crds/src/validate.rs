//! Checks on a `StreamApp` that the API server's schema cannot make.
//!
//! Pure: CEL syntax, store uniqueness and durations need only the spec; co-partitioning
//! needs the source topics' partition counts, which the caller reads beforehand. Every
//! problem is reported (not only the first) with the field path it concerns.

use std::collections::BTreeMap;

use crate::duration::parse_duration;
use crate::names::StoreName;
use crate::streamapp::{Step, StreamAppSpec};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("{path}: failed to parse CEL expression {expr:?}: {message}")]
    InvalidExpression {
        path: String,
        expr: String,
        message: String,
    },
    #[error("{path}: {message}")]
    InvalidDuration { path: String, message: String },
    #[error(
        "store {store:?} is used by {first} and {second}: each stateful step needs its own store"
    )]
    DuplicateStore {
        store: String,
        first: String,
        second: String,
    },
    #[error(
        "spec.stores.{store}: no step uses store {store:?} (each key of stores must be the store of a dedupe, aggregate or batch step)"
    )]
    UnusedStoreSettings { store: String },
    #[error("source topics do not exist: {}", topics.join(", "))]
    SourceTopicsMissing { topics: Vec<String> },
    #[error(
        "source topics are not co-partitioned: {}; every source topic needs the same partition count",
        describe_counts(counts)
    )]
    NotCoPartitioned { counts: BTreeMap<String, i32> },
}

impl ValidationError {
    /// A short CamelCase reason for conditions and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidExpression { .. } => "InvalidExpression",
            Self::InvalidDuration { .. } => "InvalidDuration",
            Self::DuplicateStore { .. } => "DuplicateStore",
            Self::UnusedStoreSettings { .. } => "UnusedStoreSettings",
            Self::SourceTopicsMissing { .. } => "SourceTopicsMissing",
            Self::NotCoPartitioned { .. } => "SourceTopicsNotCoPartitioned",
        }
    }
}

fn describe_counts(counts: &BTreeMap<String, i32>) -> String {
    counts
        .iter()
        .map(|(t, n)| format!("{t} has {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The step's kind and the name used for it in messages (`name` or `<kind>-<index>`).
pub fn step_label(index: usize, step: &Step) -> String {
    step.name
        .clone()
        .unwrap_or_else(|| format!("{}-{index}", step_kind(step)))
}

pub fn step_kind(step: &Step) -> &'static str {
    if step.filter.is_some() {
        "filter"
    } else if step.map.is_some() {
        "map"
    } else if step.flat_map.is_some() {
        "flatMap"
    } else if step.dedupe.is_some() {
        "dedupe"
    } else if step.aggregate.is_some() {
        "aggregate"
    } else if step.batch.is_some() {
        "batch"
    } else {
        "unknown"
    }
}

/// The store of a stateful step.
pub fn step_store(step: &Step) -> Option<StoreName> {
    step.dedupe
        .as_ref()
        .map(|d| d.store.clone())
        .or_else(|| step.aggregate.as_ref().map(|a| a.store.clone()))
        .or_else(|| step.batch.as_ref().map(|b| b.store.clone()))
        .map(StoreName)
}

/// Every store the steps use, in step order.
pub fn stores(spec: &StreamAppSpec) -> Vec<StoreName> {
    spec.steps.iter().filter_map(step_store).collect()
}

/// Every CEL expression in the spec with its field path.
pub fn expressions(spec: &StreamAppSpec) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut push = |path: String, e: &Option<String>| {
        if let Some(e) = e {
            out.push((path, e.clone()));
        }
    };
    push("spec.source.timestamp".into(), &spec.source.timestamp);
    for (i, s) in spec.steps.iter().enumerate() {
        let p = format!("spec.steps[{i}]");
        if let Some(f) = &s.filter {
            push(format!("{p}.filter.cel"), &Some(f.cel.clone()));
        }
        if let Some(m) = &s.map {
            push(format!("{p}.map.key"), &m.key);
            push(format!("{p}.map.value"), &m.value);
        }
        if let Some(f) = &s.flat_map {
            push(format!("{p}.flatMap.cel"), &Some(f.cel.clone()));
        }
        if let Some(d) = &s.dedupe {
            push(format!("{p}.dedupe.id"), &Some(d.id.clone()));
        }
        if let Some(a) = &s.aggregate {
            push(format!("{p}.aggregate.groupBy"), &Some(a.group_by.clone()));
            for (name, f) in &a.fields {
                for (kind, e) in [
                    ("sum", &f.sum),
                    ("min", &f.min),
                    ("max", &f.max),
                    ("avg", &f.avg),
                    ("last", &f.last),
                ] {
                    push(format!("{p}.aggregate.fields.{name}.{kind}"), e);
                }
            }
        }
        if let Some(b) = &s.batch {
            push(format!("{p}.batch.groupBy"), &b.group_by);
        }
    }
    if let Some(sink) = &spec.sink {
        push("spec.sink.key".into(), &sink.key);
        push("spec.sink.value".into(), &sink.value);
    }
    out
}

/// Every duration in the spec with its field path.
fn durations(spec: &StreamAppSpec) -> Vec<(String, String)> {
    let mut out = vec![(
        "spec.commitInterval".to_string(),
        spec.commit_interval.clone(),
    )];
    for (i, s) in spec.steps.iter().enumerate() {
        let p = format!("spec.steps[{i}]");
        if let Some(d) = &s.dedupe {
            out.push((format!("{p}.dedupe.within"), d.within.clone()));
        }
        if let Some(b) = &s.batch {
            out.push((format!("{p}.batch.maxWait"), b.max_wait.clone()));
        }
        if let Some(w) = s.aggregate.as_ref().and_then(|a| a.window.as_ref()) {
            let opt = [
                ("tumbling", &w.tumbling),
                ("grace", &w.grace),
                ("retention", &w.retention),
            ];
            for (k, v) in opt {
                if let Some(v) = v {
                    out.push((format!("{p}.aggregate.window.{k}"), v.clone()));
                }
            }
            if let Some(h) = &w.hopping {
                out.push((format!("{p}.aggregate.window.hopping.size"), h.size.clone()));
                out.push((
                    format!("{p}.aggregate.window.hopping.advance"),
                    h.advance.clone(),
                ));
            }
            if let Some(sw) = &w.session {
                out.push((format!("{p}.aggregate.window.session.gap"), sw.gap.clone()));
            }
        }
    }
    for (name, st) in &spec.stores {
        if let Some(seg) = &st.changelog.segment {
            out.push((format!("spec.stores.{name}.changelog.segment"), seg.clone()));
        }
    }
    out
}

/// Checks what only needs the spec. Returns every problem found.
pub fn validate_spec(spec: &StreamAppSpec) -> Vec<ValidationError> {
    let mut errors = Vec::new();
    for (path, expr) in expressions(spec) {
        if let Err(e) = cel::Program::compile(&expr) {
            let message = e
                .to_string()
                .lines()
                .next()
                .unwrap_or("syntax error")
                .to_string();
            errors.push(ValidationError::InvalidExpression {
                path,
                expr,
                message,
            });
        }
    }
    for (path, d) in durations(spec) {
        match parse_duration(&d) {
            // A zero grace or retention means "none"; a zero interval, window size, gap or
            // advance cannot work.
            Ok(v)
                if v.is_zero()
                    && (path.ends_with("commitInterval") || path.contains("window"))
                    && !path.ends_with(".grace")
                    && !path.ends_with(".retention") =>
            {
                errors.push(ValidationError::InvalidDuration {
                    path,
                    message: format!("{d:?} must be greater than zero"),
                })
            }
            Ok(_) => {}
            Err(e) => errors.push(ValidationError::InvalidDuration {
                path,
                message: e.to_string(),
            }),
        }
    }
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for (i, s) in spec.steps.iter().enumerate() {
        if let Some(store) = step_store(s) {
            let label = step_label(i, s);
            if let Some(first) = owner.get(&store.0) {
                errors.push(ValidationError::DuplicateStore {
                    store: store.0.clone(),
                    first: first.clone(),
                    second: label,
                });
            } else {
                owner.insert(store.0, label);
            }
        }
    }
    for store in spec.stores.keys() {
        if !owner.contains_key(store) {
            errors.push(ValidationError::UnusedStoreSettings {
                store: store.clone(),
            });
        }
    }
    errors
}

/// The task count from the source topics' partition counts (`None`: topic missing).
pub fn task_count(partitions: &BTreeMap<String, Option<i32>>) -> Result<i32, ValidationError> {
    let missing: Vec<String> = partitions
        .iter()
        .filter(|(_, n)| n.is_none())
        .map(|(t, _)| t.clone())
        .collect();
    if !missing.is_empty() {
        return Err(ValidationError::SourceTopicsMissing { topics: missing });
    }
    let counts: BTreeMap<String, i32> = partitions
        .iter()
        .filter_map(|(t, n)| n.map(|n| (t.clone(), n)))
        .collect();
    let mut distinct: Vec<i32> = counts.values().copied().collect();
    distinct.dedup();
    distinct.sort_unstable();
    distinct.dedup();
    match distinct.as_slice() {
        [n] => Ok(*n),
        _ => Err(ValidationError::NotCoPartitioned { counts }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streamapp::StreamApp;

    fn app(yaml: &str) -> StreamApp {
        serde_yaml::from_str(yaml).expect("valid manifest")
    }

    const BASE: &str = r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {name: fraud, namespace: ns}
spec:
  kafka: {bootstrapServers: "127.0.0.1:9092"}
  source: {topics: [payments]}
  steps:
  - dedupe: {store: seen, id: value.txId, within: 24h}
  - aggregate:
      store: per-user
      groupBy: value.userId
      window: {tumbling: 10m, grace: 1m}
      fields: {count: {count: {}}, total: {sum: value.amount}}
  - filter: {cel: "value.count > 5"}
  sink: {topic: alerts}
"#;

    #[test]
    fn a_sound_spec_has_no_errors_and_lists_its_stores() {
        let a = app(BASE);
        assert_eq!(validate_spec(&a.spec), vec![]);
        assert_eq!(
            stores(&a.spec),
            vec![StoreName("seen".into()), StoreName("per-user".into())]
        );
        assert_eq!(
            a.changelog_topic(&StoreName("seen".into())),
            "fraud-seen-changelog"
        );
        assert_eq!(a.dead_letter_topic().as_deref(), Some("fraud-dlq"));
        assert_eq!(a.transactional_id(crate::TaskId(3)), "fraud-3");
    }

    #[test]
    fn a_cel_syntax_error_names_the_field() {
        let a = app(&BASE.replace("value.count > 5", "value.count >"));
        let errs = validate_spec(&a.spec);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0]
                .to_string()
                .starts_with("spec.steps[2].filter.cel: failed to parse CEL expression"),
            "{}",
            errs[0]
        );
    }

    #[test]
    fn two_steps_sharing_a_store_are_rejected() {
        let a = app(&BASE.replace("store: per-user", "store: seen"));
        let errs = validate_spec(&a.spec);
        assert_eq!(
            errs,
            vec![ValidationError::DuplicateStore {
                store: "seen".into(),
                first: "dedupe-0".into(),
                second: "aggregate-1".into()
            }]
        );
    }

    #[test]
    fn settings_for_a_store_no_step_uses_are_rejected() {
        let a = app(&BASE.replace(
            "sink:",
            "stores: {sen: {changelog: {segment: 1h}}}\n  sink:",
        ));
        assert_eq!(
            validate_spec(&a.spec),
            vec![ValidationError::UnusedStoreSettings {
                store: "sen".into()
            }]
        );
    }

    #[test]
    fn a_zero_grace_is_allowed_but_a_zero_window_is_not() {
        let a = app(&BASE.replace("grace: 1m", "grace: 0s"));
        assert_eq!(validate_spec(&a.spec), vec![]);
        let a = app(&BASE.replace("tumbling: 10m", "tumbling: 0m"));
        let errs = validate_spec(&a.spec);
        assert!(
            matches!(&errs[..], [ValidationError::InvalidDuration { path, .. }] if path.ends_with("window.tumbling")),
            "{errs:?}"
        );
    }

    #[test]
    fn a_zero_commit_interval_is_rejected() {
        let a = app(&BASE.replace("source:", "commitInterval: 0ms\n  source:"));
        let errs = validate_spec(&a.spec);
        assert!(
            matches!(&errs[..], [ValidationError::InvalidDuration { path, .. }] if path == "spec.commitInterval"),
            "{errs:?}"
        );
    }

    #[test]
    fn task_count_requires_existing_co_partitioned_topics() {
        let m = |v: &[(&str, Option<i32>)]| {
            v.iter()
                .map(|(t, n)| (t.to_string(), *n))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(task_count(&m(&[("a", Some(4)), ("b", Some(4))])), Ok(4));
        let err =
            task_count(&m(&[("a", Some(4)), ("b", Some(6))])).expect_err("not co-partitioned");
        assert_eq!(
            err.to_string(),
            "source topics are not co-partitioned: a has 4, b has 6; every source topic needs the same partition count"
        );
        let err = task_count(&m(&[("a", Some(4)), ("b", None)])).expect_err("missing");
        assert_eq!(err.to_string(), "source topics do not exist: b");
    }
}
