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

mod error;
pub use error::{CelParseError, ValidationError};

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
            return Err(ValidationError::UnusableDuration {
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
        .map_err(|_| ValidationError::UnusableDuration {
            path: path.clone(),
            message: format!("failed to read {explicit:?} as a whole number of milliseconds"),
        })?;
    if timeout > BROKER_MAX_TRANSACTION_TIMEOUT {
        return Err(ValidationError::UnusableDuration {
            path,
            message: format!(
                "{} ms is above the brokers' default transaction.max.timeout.ms ({max_ms} ms): no task's producer could start under exactly_once; at most {max_ms} ms, and at least twice commitInterval {interval:?}",
                timeout.as_millis()
            ),
        });
    }
    if timeout < twice {
        return Err(ValidationError::UnusableDuration {
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
    let mut errors = expression_errors(spec);
    errors.extend(duration_errors(spec));
    errors.extend(kafka_errors(spec));
    let (owner, store_errors) = store_owners(spec);
    errors.extend(store_errors);
    errors.extend(yaml_boolean_keys(spec, &owner));
    errors.extend(step_names(spec));
    errors.extend(tables_and_outputs(spec, &owner));
    errors
}

/// Every CEL expression compiles and fits the cost budget.
fn expression_errors(spec: &StreamAppSpec) -> Vec<ValidationError> {
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
            Err(e) => errors.push(ValidationError::InvalidExpression {
                path,
                expr,
                source: e.into(),
            }),
        }
    }
    errors
}

/// Every duration parses, and those that cannot be zero are not.
fn duration_errors(spec: &StreamAppSpec) -> Vec<ValidationError> {
    let mut errors = Vec::new();
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
                errors.push(ValidationError::UnusableDuration {
                    path,
                    message: format!("{d:?} must be greater than zero"),
                })
            }
            Ok(_) => {}
            Err(source) => errors.push(ValidationError::InvalidDuration { path, source }),
        }
    }
    errors
}

/// The transaction timeout fits the commit interval, and no refused client property.
fn kafka_errors(spec: &StreamAppSpec) -> Vec<ValidationError> {
    let mut errors = Vec::new();
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
    errors
}

/// Which step owns each store (by label), and the stores two steps claim.
fn store_owners(spec: &StreamAppSpec) -> (BTreeMap<String, String>, Vec<ValidationError>) {
    let mut errors = Vec::new();
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
    (owner, errors)
}

/// Map keys YAML 1.1 would read as booleans, and store settings no step uses.
fn yaml_boolean_keys(
    spec: &StreamAppSpec,
    owner: &BTreeMap<String, String>,
) -> Vec<ValidationError> {
    let mut errors = Vec::new();
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
mod tests;
