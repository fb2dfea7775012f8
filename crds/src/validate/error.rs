//! Every problem validation reports, with the field path it concerns and the reason a
//! condition or event shows for it.
//!
//! Owns: the error texts and reasons. Must not check anything (that is the parent).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::describe_counts;

/// The variant's name is the reason a condition or event shows (three are renamed;
/// `UnusableDuration` shares `InvalidDuration`'s).
#[derive(
    Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr, strum::VariantNames,
)]
pub enum ValidationError {
    #[error("{path}: failed to parse CEL expression {expr:?}: {source}")]
    InvalidExpression {
        path: String,
        expr: String,
        #[source]
        source: CelParseError,
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
    /// A duration that does not parse.
    #[error("{path}: {source}")]
    InvalidDuration {
        path: String,
        #[source]
        source: crate::duration::DurationError,
    },
    /// A duration that parses but cannot work where it is (zero, or at odds with the
    /// transaction timeout). Shown with the same reason as one that does not parse.
    #[error("{path}: {message}")]
    #[strum(serialize = "InvalidDuration")]
    UnusableDuration { path: String, message: String },
    /// Never quotes the value: it may be a secret.
    #[error("{path}: refused, because {}", why.explain())]
    #[strum(serialize = "KafkaPropertyRefused")]
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
    #[strum(serialize = "SourceTopicsNotCoPartitioned")]
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
    /// A short CamelCase reason for conditions and events: the variant's name.
    pub fn reason(&self) -> &'static str {
        self.into()
    }
}

/// CEL's parse error, kept as the cause of [`ValidationError::InvalidExpression`]. Its
/// text spans lines (the expression, a caret); it shows the first, which says what is
/// wrong. Two are equal when their texts are: CEL's error has no equality of its own.
#[derive(Debug, Clone)]
pub struct CelParseError(Arc<cel::ParseErrors>);

impl From<cel::ParseErrors> for CelParseError {
    fn from(e: cel::ParseErrors) -> Self {
        Self(Arc::new(e))
    }
}

impl std::fmt::Display for CelParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0.to_string();
        f.write_str(text.lines().next().unwrap_or("syntax error"))
    }
}

impl std::error::Error for CelParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl PartialEq for CelParseError {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for CelParseError {}
