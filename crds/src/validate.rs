//! Checks on a `StreamApp` that the API server's schema cannot make.
//!
//! Pure: CEL syntax, store uniqueness and durations need only the spec; co-partitioning
//! needs the source topics' partition counts, which the caller reads beforehand. Every
//! problem is reported (not only the first) with the field path it concerns.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::duration::{format_duration, parse_duration};
use crate::names::StoreName;
use crate::streamapp::{ProcessingGuarantee, Step, StreamAppSpec};

/// The librdkafka property a user may set in `spec.kafka.properties`.
pub const TRANSACTION_TIMEOUT_PROPERTY: &str = "transaction.timeout.ms";
/// The brokers' default `transaction.max.timeout.ms`. A producer asking for more fails
/// `init_transactions`, so no task could start.
pub const BROKER_MAX_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The transaction timeout of a short commit interval (librdkafka's own default).
const MIN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);
/// What one commit round may add to a transaction's life: the flush, the offsets and the
/// commit each wait for Kafka up to 30 s.
const COMMIT_ROUND_ALLOWANCE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("{path}: failed to parse CEL expression {expr:?}: {message}")]
    InvalidExpression {
        path: String,
        expr: String,
        message: String,
    },
    #[error(
        "{path}: CEL expression {expr:?} may cost {estimated} units on records with lists of {assumed} elements, over the budget of {budget}: nested comprehensions multiply; iterate once, or move the work to a custom step"
    )]
    ExpressionTooCostly {
        path: String,
        expr: String,
        estimated: u64,
        assumed: u64,
        budget: u64,
    },
    #[error("{path}: {message}")]
    InvalidDuration { path: String, message: String },
    /// Never quotes the value: it may be a secret.
    #[error("{path}: refused, because {}", why.explain())]
    RefusedProperty {
        path: String,
        why: crate::kafka_properties::Refusal,
    },
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
    #[error("{path}: step name {name:?} is also the name of {other}: step names must be unique")]
    DuplicateStepName {
        path: String,
        name: String,
        other: String,
    },
    #[error(
        "{path}: step {step} repartitions through topic {topic:?}, which is also {other}; give the step another name"
    )]
    TopicCollision {
        path: String,
        step: String,
        topic: String,
        other: String,
    },
    #[error(
        "{path}: step {step} joins table {table:?}, which spec.tables does not declare ({known})"
    )]
    UnknownTable {
        path: String,
        step: String,
        table: String,
        known: String,
    },
    #[error(
        "{path}: step {step} joins table {table:?} in another stage than {other} does: a table that is not global lives in the stage of its join; join it before the repartition, or make it global"
    )]
    TableInTwoStages {
        path: String,
        step: String,
        table: String,
        other: String,
    },
    #[error(
        "spec.tables: table {table:?} has the name of the store of {step}: tables and stores share one namespace"
    )]
    TableNameTaken { table: String, step: String },
    #[error("{path}: step {step} writes to {topic:?}, which is {what}: {why}")]
    OutputTopicTaken {
        path: String,
        step: String,
        topic: String,
        what: &'static str,
        why: &'static str,
    },
    #[error(
        "{path}: table {table:?} reads topic {topic:?} with {actual} partitions, but the app's tasks need {want} (the source topics' partition count): a table that is not global must be co-partitioned with the stream; give the topic {want} partitions or make the table global"
    )]
    TableNotCoPartitioned {
        path: String,
        table: String,
        topic: String,
        actual: i32,
        want: i32,
    },
    #[error("{path}: table {table:?} reads topic {topic:?}, which does not exist")]
    TableTopicMissing {
        path: String,
        table: String,
        topic: String,
    },
    #[error(
        "{path}: step {step} joins stream {topic:?} without a window: a stream–stream join needs within (how far apart in event time two records may be), such as within: 5m"
    )]
    StreamJoinWithoutWindow {
        path: String,
        step: String,
        topic: String,
    },
    #[error(
        "{path}: step {step} joins table {table:?}: {what} applies to stream–stream joins only"
    )]
    NotForTableJoins {
        path: String,
        step: String,
        table: String,
        what: &'static str,
    },
    #[error(
        "{path}: step {step} joins stream {topic:?}, which is {what}: its records would be read twice"
    )]
    JoinStreamTaken {
        path: String,
        step: String,
        topic: String,
        what: &'static str,
    },
    #[error(
        "{path}: step {step} joins stream {topic:?} with {actual} partitions, but the stage of the join has {want} tasks (the source topics' partition count): the other stream must be co-partitioned, keyed by the join key; give the topic {want} partitions"
    )]
    JoinStreamNotCoPartitioned {
        path: String,
        step: String,
        topic: String,
        actual: i32,
        want: i32,
    },
    #[error("{path}: step {step} joins stream {topic:?}, which does not exist")]
    JoinStreamMissing {
        path: String,
        step: String,
        topic: String,
    },
    #[error(
        "{path}: the key {key:?} reads as a YAML 1.1 boolean: kubectl parses an unquoted n, y, no, yes, on or off as false or true, so this {what} would be named {key:?}; quote the key in the manifest (for example \"n\": {{count: {{}}}})"
    )]
    YamlBooleanKey {
        path: String,
        key: String,
        what: &'static str,
    },
}

impl ValidationError {
    /// A short CamelCase reason for conditions and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidExpression { .. } => "InvalidExpression",
            Self::ExpressionTooCostly { .. } => "ExpressionTooCostly",
            Self::InvalidDuration { .. } => "InvalidDuration",
            Self::RefusedProperty { .. } => "KafkaPropertyRefused",
            Self::DuplicateStore { .. } => "DuplicateStore",
            Self::UnusedStoreSettings { .. } => "UnusedStoreSettings",
            Self::SourceTopicsMissing { .. } => "SourceTopicsMissing",
            Self::NotCoPartitioned { .. } => "SourceTopicsNotCoPartitioned",
            Self::DuplicateStepName { .. } => "DuplicateStepName",
            Self::TopicCollision { .. } => "TopicCollision",
            Self::YamlBooleanKey { .. } => "YamlBooleanKey",
            Self::UnknownTable { .. } => "UnknownTable",
            Self::TableInTwoStages { .. } => "TableInTwoStages",
            Self::TableNameTaken { .. } => "TableNameTaken",
            Self::OutputTopicTaken { .. } => "OutputTopicTaken",
            Self::TableNotCoPartitioned { .. } => "TableNotCoPartitioned",
            Self::TableTopicMissing { .. } => "TableTopicMissing",
            Self::StreamJoinWithoutWindow { .. } => "StreamJoinWithoutWindow",
            Self::NotForTableJoins { .. } => "NotForTableJoins",
            Self::JoinStreamTaken { .. } => "JoinStreamTaken",
            Self::JoinStreamNotCoPartitioned { .. } => "JoinStreamNotCoPartitioned",
            Self::JoinStreamMissing { .. } => "JoinStreamMissing",
        }
    }
}

/// The transaction timeout of each task's producer under exactly-once.
///
/// A transaction opens at a task's first output after a commit and commits at the next
/// commit round, one `commit_interval` after the previous round ended; the round itself
/// may take up to [`COMMIT_ROUND_ALLOWANCE`] per Kafka call. So a transaction lives about
/// one interval plus a round, and a loop that falls one interval behind doubles that.
/// Without `explicit` (the user's `transaction.timeout.ms`) the timeout is
/// max(60 s, 2 × interval + 30 s), capped at the brokers' default maximum. An explicit
/// value is honoured, but it must be at least twice the interval and within the brokers'
/// default maximum: anything else aborts transactions or never starts.
pub fn transaction_timeout(
    commit_interval: Duration,
    explicit: Option<&str>,
) -> Result<Duration, ValidationError> {
    let twice = commit_interval.saturating_mul(2);
    let interval = format_duration(commit_interval);
    let max_ms = BROKER_MAX_TRANSACTION_TIMEOUT.as_millis();
    let Some(explicit) = explicit else {
        if twice > BROKER_MAX_TRANSACTION_TIMEOUT {
            return Err(ValidationError::InvalidDuration {
                path: "spec.commitInterval".into(),
                message: format!(
                    "{interval:?} is too long for exactly_once: a transaction stays open about one commit interval, so it needs a transaction timeout of at least twice that ({} ms), above the brokers' default transaction.max.timeout.ms ({max_ms} ms); use a commitInterval of at most {}",
                    twice.as_millis(),
                    format_duration(BROKER_MAX_TRANSACTION_TIMEOUT / 2),
                ),
            });
        }
        return Ok(twice
            .saturating_add(COMMIT_ROUND_ALLOWANCE)
            .clamp(MIN_TRANSACTION_TIMEOUT, BROKER_MAX_TRANSACTION_TIMEOUT));
    };
    let path = format!("spec.kafka.properties[{TRANSACTION_TIMEOUT_PROPERTY:?}]");
    let timeout = explicit
        .trim()
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| ValidationError::InvalidDuration {
            path: path.clone(),
            message: format!("failed to read {explicit:?} as a whole number of milliseconds"),
        })?;
    if timeout > BROKER_MAX_TRANSACTION_TIMEOUT {
        return Err(ValidationError::InvalidDuration {
            path,
            message: format!(
                "{} ms is above the brokers' default transaction.max.timeout.ms ({max_ms} ms): no task's producer could start under exactly_once; at most {max_ms} ms, and at least twice commitInterval {interval:?}",
                timeout.as_millis()
            ),
        });
    }
    if timeout < twice {
        return Err(ValidationError::InvalidDuration {
            path: "spec.commitInterval".into(),
            message: format!(
                "{interval:?} needs a transaction timeout of at least twice that ({} ms) under exactly_once, but {path} is {} ms: transactions would be aborted before they commit; shorten commitInterval or raise {TRANSACTION_TIMEOUT_PROPERTY}",
                twice.as_millis(),
                timeout.as_millis()
            ),
        });
    }
    Ok(timeout)
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
    } else if step.join.is_some() {
        "join"
    } else if step.to.is_some() {
        "to"
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
        .or_else(|| join_store(step))
}

/// The store of a stream–stream join: `join.store`, else `join-<topic>` (stable when
/// steps are inserted elsewhere, as a changelog name must be).
pub fn join_store(step: &Step) -> Option<StoreName> {
    let j = step.join.as_ref()?;
    let s = j.stream.as_ref()?;
    Some(StoreName(
        j.store
            .clone()
            .unwrap_or_else(|| format!("join-{}", s.topic)),
    ))
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
    push(
        "spec.source.partitionedBy".into(),
        &spec.source.partitioned_by,
    );
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
        if let Some(j) = &s.join {
            push(format!("{p}.join.key"), &Some(j.key.clone()));
            push(format!("{p}.join.value"), &j.value);
            if let Some(st) = &j.stream {
                push(format!("{p}.join.stream.timestamp"), &st.timestamp);
            }
        }
        if let Some(t) = &s.to {
            push(format!("{p}.to.topicExpr"), &t.topic_expr);
            push(format!("{p}.to.when"), &t.when);
            push(format!("{p}.to.key"), &t.key);
            push(format!("{p}.to.value"), &t.value);
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
        if let Some(j) = &s.join {
            for (k, v) in [("within", &j.within), ("grace", &j.grace)] {
                if let Some(v) = v {
                    out.push((format!("{p}.join.{k}"), v.clone()));
                }
            }
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

/// [`validate_spec`], plus what needs the application id: repartition topics that
/// would be a source, sink or dead-letter topic.
pub fn validate_app(app: &crate::StreamApp) -> Vec<ValidationError> {
    let mut errors = validate_spec(&app.spec);
    errors.extend(topic_collisions(&app.application_id(), &app.spec, true));
    errors
}

/// Checks what only needs the spec. Returns every problem found.
pub fn validate_spec(spec: &StreamAppSpec) -> Vec<ValidationError> {
    let mut errors = Vec::new();
    for (path, expr) in expressions(spec) {
        match cel::Program::compile(&expr) {
            Ok(p) => {
                let estimated = crate::cel_cost::estimate(&p).at(crate::cel_cost::ASSUMED_SIZE);
                if estimated > crate::cel_cost::BUDGET {
                    errors.push(ValidationError::ExpressionTooCostly {
                        path,
                        expr,
                        estimated,
                        assumed: crate::cel_cost::ASSUMED_SIZE,
                        budget: crate::cel_cost::BUDGET,
                    });
                }
            }
            Err(e) => {
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
    if spec.processing_guarantee == ProcessingGuarantee::ExactlyOnce
        && let Ok(interval) = parse_duration(&spec.commit_interval)
        && !interval.is_zero()
        && let Err(e) = transaction_timeout(
            interval,
            spec.kafka
                .properties
                .get(TRANSACTION_TIMEOUT_PROPERTY)
                .map(String::as_str),
        )
    {
        errors.push(e);
    }
    for (name, value) in &spec.kafka.properties {
        use crate::kafka_properties::{Place, refusal};
        if let Some(why) = refusal(name, value, Place::Manifest) {
            errors.push(ValidationError::RefusedProperty {
                path: format!("spec.kafka.properties[{name:?}]"),
                why,
            });
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
        if yaml_boolean(store) {
            errors.push(ValidationError::YamlBooleanKey {
                path: format!("spec.stores.{store}"),
                key: store.clone(),
                what: "store",
            });
        } else if !owner.contains_key(store) {
            errors.push(ValidationError::UnusedStoreSettings {
                store: store.clone(),
            });
        }
    }
    for (i, s) in spec.steps.iter().enumerate() {
        for field in s.aggregate.iter().flat_map(|a| a.fields.keys()) {
            if yaml_boolean(field) {
                errors.push(ValidationError::YamlBooleanKey {
                    path: format!("spec.steps[{i}].aggregate.fields.{field}"),
                    key: field.clone(),
                    what: "aggregate field",
                });
            }
        }
    }
    errors.extend(step_names(spec));
    errors.extend(tables_and_outputs(spec, &owner));
    errors
}

/// Joins name declared tables, a table that is not global lives in one stage, tables
/// do not take a store's name, and a `to` topic is not read back as input.
fn tables_and_outputs(
    spec: &StreamAppSpec,
    store_owner: &BTreeMap<String, String>,
) -> Vec<ValidationError> {
    let mut errors = Vec::new();
    for t in &spec.tables {
        if let Some(step) = store_owner.get(&t.name) {
            errors.push(ValidationError::TableNameTaken {
                table: t.name.clone(),
                step: step.clone(),
            });
        }
    }
    let topology = crate::topology::Topology::of("<applicationId>", spec);
    let mut joined_in: BTreeMap<&str, (u32, String)> = BTreeMap::new();
    for (i, s) in spec.steps.iter().enumerate() {
        let path = format!("spec.steps[{i}]");
        let label = step_label(i, s);
        if let Some((j, st)) = s.join.as_ref().and_then(|j| Some((j, j.stream.as_ref()?))) {
            errors.extend(stream_join(spec, &path, &label, j, st));
        }
        if let Some((j, table)) = s.join.as_ref().and_then(|j| Some((j, j.table.as_ref()?))) {
            errors.extend(table_join_options(&path, &label, j, table));
            match spec.tables.iter().find(|t| &t.name == table) {
                None => errors.push(ValidationError::UnknownTable {
                    path: format!("{path}.join.table"),
                    step: label.clone(),
                    table: table.clone(),
                    known: match spec.tables.is_empty() {
                        true => "no tables are declared".into(),
                        false => format!(
                            "declared: {}",
                            spec.tables
                                .iter()
                                .map(|t| t.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    },
                }),
                Some(t) if !t.global => {
                    let stage = topology
                        .stages
                        .iter()
                        .find(|st| st.steps.contains(&i))
                        .map_or(0, |st| st.index);
                    match joined_in.get(t.name.as_str()) {
                        Some((other_stage, other)) if *other_stage != stage => {
                            errors.push(ValidationError::TableInTwoStages {
                                path: format!("{path}.join"),
                                step: label.clone(),
                                table: t.name.clone(),
                                other: other.clone(),
                            })
                        }
                        Some(_) => {}
                        None => {
                            joined_in.insert(t.name.as_str(), (stage, label.clone()));
                        }
                    }
                }
                Some(_) => {}
            }
        }
        if let Some(topic) = s.to.as_ref().and_then(|t| t.topic.as_ref()) {
            let taken = if spec.source.topics.contains(topic) {
                Some(("a source topic", "its records would be read back as input"))
            } else if spec.tables.iter().any(|t| &t.topic == topic) {
                Some(("a table's topic", "its records would become table rows"))
            } else {
                None
            };
            if let Some((what, why)) = taken {
                errors.push(ValidationError::OutputTopicTaken {
                    path: format!("{path}.to.topic"),
                    step: label,
                    topic: topic.clone(),
                    what,
                    why,
                });
            }
        }
    }
    errors
}

/// A stream–stream join has a window and reads a topic nothing else reads.
fn stream_join(
    spec: &StreamAppSpec,
    path: &str,
    label: &str,
    j: &crate::streamapp::JoinStep,
    st: &crate::streamapp::JoinStream,
) -> Vec<ValidationError> {
    let mut errors = Vec::new();
    if j.within.is_none() {
        errors.push(ValidationError::StreamJoinWithoutWindow {
            path: format!("{path}.join.within"),
            step: label.to_string(),
            topic: st.topic.clone(),
        });
    }
    let other_join = spec.steps.iter().filter(|o| {
        o.join
            .as_ref()
            .and_then(|oj| oj.stream.as_ref())
            .is_some_and(|os| os.topic == st.topic)
    });
    let taken = if spec.source.topics.contains(&st.topic) {
        Some("a source topic")
    } else if spec.tables.iter().any(|t| t.topic == st.topic) {
        Some("a table's topic")
    } else if other_join.count() > 1 {
        Some("the stream of another join")
    } else {
        None
    };
    if let Some(what) = taken {
        errors.push(ValidationError::JoinStreamTaken {
            path: format!("{path}.join.stream.topic"),
            step: label.to_string(),
            topic: st.topic.clone(),
            what,
        });
    }
    errors
}

/// A table join sets none of the stream–stream options.
fn table_join_options(
    path: &str,
    label: &str,
    j: &crate::streamapp::JoinStep,
    table: &str,
) -> Vec<ValidationError> {
    [
        (j.within.is_some(), "join.within", "within"),
        (j.grace.is_some(), "join.grace", "grace"),
        (j.store.is_some(), "join.store", "store"),
        (
            j.join_type == crate::streamapp::JoinType::Outer,
            "join.type",
            "type: outer",
        ),
    ]
    .into_iter()
    .filter(|(set, _, _)| *set)
    .map(|(_, field, what)| ValidationError::NotForTableJoins {
        path: format!("{path}.{field}"),
        step: label.to_string(),
        table: table.to_string(),
        what,
    })
    .collect()
}

/// Each co-partitioned table's topic, and each joined stream's, exists with the app's
/// task count (`None`: the topic is missing).
pub fn join_partitions(
    spec: &StreamAppSpec,
    task_count: i32,
    partitions: &BTreeMap<String, Option<i32>>,
) -> Vec<ValidationError> {
    let mut errors = Vec::new();
    for (i, t) in spec.tables.iter().enumerate() {
        let path = format!("spec.tables[{i}].topic");
        match partitions.get(&t.topic).copied().flatten() {
            None => errors.push(ValidationError::TableTopicMissing {
                path,
                table: t.name.clone(),
                topic: t.topic.clone(),
            }),
            Some(n) if !t.global && n != task_count => {
                errors.push(ValidationError::TableNotCoPartitioned {
                    path,
                    table: t.name.clone(),
                    topic: t.topic.clone(),
                    actual: n,
                    want: task_count,
                })
            }
            Some(_) => {}
        }
    }
    for (i, step) in spec.steps.iter().enumerate() {
        let Some(st) = step.join.as_ref().and_then(|j| j.stream.as_ref()) else {
            continue;
        };
        let path = format!("spec.steps[{i}].join.stream.topic");
        let label = step_label(i, step);
        match partitions.get(&st.topic).copied().flatten() {
            None => errors.push(ValidationError::JoinStreamMissing {
                path,
                step: label,
                topic: st.topic.clone(),
            }),
            Some(n) if n != task_count => {
                errors.push(ValidationError::JoinStreamNotCoPartitioned {
                    path,
                    step: label,
                    topic: st.topic.clone(),
                    actual: n,
                    want: task_count,
                })
            }
            Some(_) => {}
        }
    }
    errors
}

/// The topics [`join_partitions`] needs the partition counts of.
pub fn join_topics(spec: &StreamAppSpec) -> Vec<String> {
    let tables = spec.tables.iter().map(|t| t.topic.clone());
    let streams = spec
        .steps
        .iter()
        .filter_map(|s| s.join.as_ref()?.stream.as_ref().map(|st| st.topic.clone()));
    tables.chain(streams).collect()
}

/// What YAML 1.1 makes of an unquoted `y`, `n`, `yes`, `no`, `on`, `off`, `true` or
/// `false` key once kubectl has turned it into JSON.
fn yaml_boolean(key: &str) -> bool {
    key == "true" || key == "false"
}

/// Step names are unique, and no repartition topic is a source, sink or error topic or
/// another step's repartition topic.
fn step_names(spec: &StreamAppSpec) -> Vec<ValidationError> {
    let mut errors = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, s) in spec.steps.iter().enumerate() {
        let label = step_label(i, s);
        match seen.get(&label) {
            Some(j) => errors.push(ValidationError::DuplicateStepName {
                path: format!("spec.steps[{i}].name"),
                name: label,
                other: format!("spec.steps[{j}]"),
            }),
            None => {
                seen.insert(label, i);
            }
        }
    }
    // The application id only prefixes every name: a placeholder finds the same clashes
    // among repartition topics; against the user's topics the real id is checked by the
    // caller that knows it (see `topic_collisions`).
    // Two steps sharing a store also share its default topic name: that is reported
    // as DuplicateStore already.
    let stores = stores(spec);
    let unique: std::collections::BTreeSet<_> = stores.iter().collect();
    if unique.len() == stores.len() {
        errors.extend(topic_collisions("<applicationId>", spec, false));
    }
    errors
}

/// Repartition topics that clash with each other (`with_user_topics` false), or with a
/// source, sink or dead-letter topic of the app (true: needs the real application id).
pub fn topic_collisions(
    application_id: &str,
    spec: &StreamAppSpec,
    with_user_topics: bool,
) -> Vec<ValidationError> {
    let topology = crate::topology::Topology::of(application_id, spec);
    let mut taken: BTreeMap<String, String> = BTreeMap::new();
    if with_user_topics {
        for t in &spec.source.topics {
            taken.insert(t.clone(), "a source topic".into());
        }
        if let Some(sink) = &spec.sink {
            taken.insert(sink.topic.clone(), "the sink topic".into());
        }
        if let Some(t) = &spec.errors.topic {
            taken.insert(t.clone(), "the dead-letter topic".into());
        }
    }
    let mut errors = Vec::new();
    for (stage, topic) in topology.repartition_topics() {
        let crate::topology::StageInput::Repartition { step, .. } = &stage.input else {
            continue;
        };
        let path = format!("spec.steps[{}]", stage.steps.start);
        match taken.get(topic) {
            Some(other) => errors.push(ValidationError::TopicCollision {
                path,
                step: step.clone(),
                topic: topic.to_string(),
                other: other.clone(),
            }),
            None if !with_user_topics => {
                taken.insert(
                    topic.to_string(),
                    format!("the repartition topic of step {step}"),
                );
            }
            None => {}
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

    /// An app reading `in` with the given `tables:` and `steps:` lines.
    fn app_with(rest: &str) -> StreamApp {
        app(&format!(
            "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {{name: t}}\nspec:\n  kafka: {{bootstrapServers: \"k:9092\"}}\n  source: {{topics: [in]}}\n{rest}"
        ))
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
            "ns.fraud-seen-changelog"
        );
        assert_eq!(a.dead_letter_topic().as_deref(), Some("ns.fraud-dlq"));
        assert_eq!(a.transactional_id(crate::TaskId::new(1, 3)), "ns.fraud-1_3");
    }

    #[test]
    fn a_triply_nested_comprehension_is_refused_as_too_costly_and_a_single_pass_is_not() {
        let nested = "value.a.all(i, value.a.all(j, value.a.exists(k, k == i + j)))";
        let a = app(&BASE.replace("value.count > 5", nested));
        let errs = validate_spec(&a.spec);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].reason(), "ExpressionTooCostly");
        assert!(
            errs[0]
                .to_string()
                .starts_with("spec.steps[2].filter.cel: CEL expression"),
            "{}",
            errs[0]
        );
        let once = app(&BASE.replace("value.count > 5", "value.items.all(i, i.price > 0)"));
        assert_eq!(validate_spec(&once.spec), vec![]);
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
    fn a_password_or_a_file_path_in_spec_kafka_properties_is_refused_without_quoting_it() {
        let app = with(
            "5s",
            r#""sasl.password": "hunter2-sentinel", "ssl.key.location": "/etc/shadow""#,
        );
        let errors: Vec<String> = validate_app(&app).iter().map(|e| e.to_string()).collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with(
                r#"spec.kafka.properties["sasl.password"]: refused, because its value is secret"#
            ),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with(
                r#"spec.kafka.properties["ssl.key.location"]: refused, because it reads a file"#
            ),
            "{errors:?}"
        );
        assert!(!errors.concat().contains("hunter2") && !errors.concat().contains("shadow"));
    }

    fn with(commit_interval: &str, kafka_properties: &str) -> StreamApp {
        app(&BASE
            .replace(
                "source:",
                &format!("commitInterval: {commit_interval}\n  source:"),
            )
            .replace(
                r#"bootstrapServers: "127.0.0.1:9092"}"#,
                &format!(
                    r#"bootstrapServers: "127.0.0.1:9092", properties: {{{kafka_properties}}}}}"#
                ),
            ))
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn the_transaction_timeout_grows_with_a_long_commit_interval() {
        assert_eq!(
            transaction_timeout(Duration::from_millis(100), None),
            Ok(60 * SECOND),
            "a short interval keeps librdkafka's 60 s"
        );
        assert_eq!(
            transaction_timeout(90 * SECOND, None),
            Ok(210 * SECOND),
            "two intervals and a commit round"
        );
        assert_eq!(
            transaction_timeout(440 * SECOND, None),
            Ok(BROKER_MAX_TRANSACTION_TIMEOUT),
            "never above what the brokers accept by default"
        );
        assert_eq!(validate_spec(&with("90s", "").spec), vec![]);
    }

    #[test]
    fn an_explicit_transaction_timeout_is_honoured_when_it_has_room_for_the_commit_interval() {
        assert_eq!(
            transaction_timeout(90 * SECOND, Some("300000")),
            Ok(300 * SECOND)
        );
        assert_eq!(
            transaction_timeout(Duration::from_millis(100), Some("10000")),
            Ok(10 * SECOND),
            "Kafka Streams' own exactly-once default"
        );
        assert_eq!(
            validate_spec(&with("90s", r#""transaction.timeout.ms": "300000""#).spec),
            vec![]
        );
    }

    #[test]
    fn a_commit_interval_the_transaction_timeout_cannot_hold_is_rejected_naming_both() {
        let errs = validate_spec(&with("90s", r#""transaction.timeout.ms": "60000""#).spec);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].reason(), "InvalidDuration");
        assert_eq!(
            errs[0].to_string(),
            r#"spec.commitInterval: "1m30s" needs a transaction timeout of at least twice that (180000 ms) under exactly_once, but spec.kafka.properties["transaction.timeout.ms"] is 60000 ms: transactions would be aborted before they commit; shorten commitInterval or raise transaction.timeout.ms"#
        );
    }

    #[test]
    fn a_commit_interval_beyond_what_brokers_allow_by_default_is_rejected() {
        let errs = validate_spec(&with("10m", "").spec);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(
            errs[0].to_string(),
            r#"spec.commitInterval: "10m" is too long for exactly_once: a transaction stays open about one commit interval, so it needs a transaction timeout of at least twice that (1200000 ms), above the brokers' default transaction.max.timeout.ms (900000 ms); use a commitInterval of at most 7m30s"#
        );
        let errs = validate_spec(&with("10s", r#""transaction.timeout.ms": "1800000""#).spec);
        assert!(
            matches!(&errs[..], [ValidationError::InvalidDuration { path, message }]
                if path == r#"spec.kafka.properties["transaction.timeout.ms"]"#
                    && message.starts_with("1800000 ms is above the brokers' default transaction.max.timeout.ms (900000 ms)")),
            "{errs:?}"
        );
    }

    #[test]
    fn a_transaction_timeout_that_is_not_a_number_is_rejected() {
        let errs = validate_spec(&with("1s", r#""transaction.timeout.ms": "1m""#).spec);
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            vec![
                r#"spec.kafka.properties["transaction.timeout.ms"]: failed to read "1m" as a whole number of milliseconds"#
            ]
        );
    }

    #[test]
    fn at_least_once_has_no_transaction_to_time_out() {
        let mut a = with("10m", r#""transaction.timeout.ms": "60000""#);
        a.spec.processing_guarantee = ProcessingGuarantee::AtLeastOnce;
        assert_eq!(validate_spec(&a.spec), vec![]);
    }

    #[test]
    fn joins_and_outputs_are_checked_naming_the_step() {
        let a = app_with(
            r#"
  tables:
  - {name: users, topic: users}
  - {name: seen, topic: other}
  steps:
  - dedupe: {store: seen, id: value.txId, within: 1h}
  - join: {table: user, key: value.userId}
  - to: {topic: in}
"#,
        );
        let errors = validate_spec(&a.spec);
        let reasons: Vec<&str> = errors.iter().map(ValidationError::reason).collect();
        assert!(reasons.contains(&"TableNameTaken"), "{errors:?}");
        assert!(reasons.contains(&"UnknownTable"), "{errors:?}");
        assert!(reasons.contains(&"OutputTopicTaken"), "{errors:?}");
        let text = errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(text.contains("step join-1 joins table \"user\""), "{text}");
        assert!(
            text.contains("step to-2 writes to \"in\", which is a source topic"),
            "{text}"
        );
    }

    #[test]
    fn a_table_joined_in_two_stages_is_rejected() {
        let a = app_with(
            r#"
  tables:
  - {name: users, topic: users}
  steps:
  - join: {table: users, key: value.userId}
  - aggregate: {store: s, groupBy: value.country, fields: {n: {count: {}}}}
  - join: {table: users, key: key}
"#,
        );
        let errors = validate_spec(&a.spec);
        assert!(
            errors.iter().any(|e| e.reason() == "TableInTwoStages"),
            "{errors:?}"
        );
    }

    #[test]
    fn a_table_needs_its_topic_and_unless_global_the_task_count() {
        let a = app_with(
            r#"
  tables:
  - {name: users, topic: users}
  - {name: countries, topic: countries, global: true}
"#,
        );
        let counts = BTreeMap::from([
            ("users".to_string(), Some(3)),
            ("countries".to_string(), Some(1)),
        ]);
        let errors = join_partitions(&a.spec, 4, &counts);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].reason(), "TableNotCoPartitioned");
        assert!(
            errors[0]
                .to_string()
                .contains("with 3 partitions, but the app's tasks need 4")
        );
        let missing = join_partitions(&a.spec, 3, &BTreeMap::new());
        assert_eq!(missing.len(), 2);
        assert!(missing.iter().all(|e| e.reason() == "TableTopicMissing"));
    }

    #[test]
    fn stream_joins_need_a_window_their_own_topic_and_table_joins_no_window() {
        let a = app_with(
            r#"
  tables:
  - {name: users, topic: users}
  steps:
  - name: clicks
    join: {stream: {topic: clicks}, key: value.adId}
  - join: {stream: {topic: in}, key: key, within: 5s}
  - join: {table: users, key: value.userId, type: outer, within: 1m}
"#,
        );
        let errors = validate_spec(&a.spec);
        let reasons: Vec<&str> = errors.iter().map(ValidationError::reason).collect();
        assert_eq!(
            reasons,
            vec![
                "StreamJoinWithoutWindow",
                "JoinStreamTaken",
                "NotForTableJoins",
                "NotForTableJoins"
            ],
            "{errors:?}"
        );
        let text = errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            text.contains(
                "spec.steps[0].join.within: step clicks joins stream \"clicks\" without a window"
            ),
            "{text}"
        );
        assert!(
            text.contains("step join-1 joins stream \"in\", which is a source topic"),
            "{text}"
        );
        assert!(text.contains("spec.steps[2].join.type: step join-2 joins table \"users\": type: outer applies to stream–stream joins only"), "{text}");
        // The stream's topic must exist with the task count.
        let counts = BTreeMap::from([
            ("clicks".to_string(), Some(3)),
            ("users".to_string(), Some(4)),
        ]);
        let errors = join_partitions(&a.spec, 4, &counts);
        let reasons: Vec<&str> = errors.iter().map(ValidationError::reason).collect();
        assert_eq!(
            reasons,
            vec!["JoinStreamNotCoPartitioned", "JoinStreamMissing"],
            "{errors:?}"
        );
        assert_eq!(join_topics(&a.spec), vec!["users", "clicks", "in"]);
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
