//! The `StreamApp` custom resource (`oxbow.dev/v1alpha1`).
//!
//! Field docs become the CRD's descriptions (`kubectl explain streamapp.spec`). Every
//! check the API server can make lives in the schema (OpenAPI constraints and CEL rules
//! with messages); checks that need more than the object (CEL expression syntax, topic
//! partition counts) live in [`crate::validate`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, EnvVar, ResourceRequirements, Toleration};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod status;
pub use status::{
    InstanceStatus, Phase, RestorationStatus, StoreEncoding, StreamAppStatus, TopicStatus,
    WorkerState,
};

/// A stateful stream application: Kafka in, steps with RocksDB state, Kafka out.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "oxbow.dev",
    version = "v1alpha1",
    kind = "StreamApp",
    doc = "A StreamApp runs a stateful stream application: Kafka in, steps with RocksDB state, Kafka out.",
    plural = "streamapps",
    shortname = "sapp",
    validation = Rule::new("size(self.metadata.name) <= 47 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS-1035 label of at most 47 characters (lowercase letters, digits and '-', starting with a letter): it names the worker StatefulSet, pods and Services"),
    namespaced,
    status = "StreamAppStatus",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas","labelSelectorPath":".status.selector"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Restored","type":"string","jsonPath":".status.restoration.percent"}"#,
    printcolumn = r#"{"name":"Lag","type":"integer","jsonPath":".status.lag","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.replicas == 0 || self.standbyReplicas < self.replicas").message("standbyReplicas must be less than replicas: a standby needs a pod other than its active's"))]
#[x_kube(validation = Rule::new("!has(oldSelf.applicationId) || (has(self.applicationId) && self.applicationId == oldSelf.applicationId)").message("applicationId is immutable once set: it names the consumer group, the changelog topics and the transactional ids; create a new StreamApp instead"))]
#[x_kube(validation = Rule::new("self.errors.policy != 'deadLetter' || !has(self.errors.topic) || !self.source.topics.exists(t, t == self.errors.topic)").message("errors.topic must not be a source topic: dead letters would be read back as input"))]
#[x_kube(validation = Rule::new("!has(self.sink) || !self.source.topics.exists(t, t == self.sink.topic)").message("sink.topic must not be a source topic: output would be read back as input"))]
#[x_kube(validation = Rule::new("!has(self.sink) || !has(self.errors.topic) || self.errors.topic != self.sink.topic").message("errors.topic must not be the sink topic: dead letters would be mixed into the output"))]
pub struct StreamAppSpec {
    /// Worker pods. Tasks (source partitions) are spread over them; 0 stops processing
    /// and keeps state. `kubectl scale` and HPAs act on this field.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// Worker image. Defaults to the worker image released with the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// Names the consumer group, the changelog topics (`<applicationId>-<store>-changelog`)
    /// and the transactional ids (`<applicationId>-<task>`). Defaults to
    /// `<namespace>.<name>` (apps created before that default keep `<name>`, recorded in
    /// `status.applicationId`). It may be set once, to the id in force, and is then
    /// immutable. One StreamApp per Kafka cluster owns an id: a second one goes `Stalled`
    /// with reason `ApplicationIdConflict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 170))]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z0-9._-]+$') && size(self) <= 170").message("applicationId may use letters, digits, '.', '_' and '-' (at most 170): it becomes part of Kafka topic names, which Kafka limits to 249 characters"))]
    pub application_id: Option<String>,

    /// How to reach Kafka.
    pub kafka: KafkaSpec,

    /// Take over changelog, repartition and dead-letter topics that already exist under
    /// this app's names but were not created by Oxbow for it (for example after a
    /// migration from Kafka Streams). Without it such a topic stalls the app with reason
    /// `TopicNotOwned`: Oxbow alters and deletes only topics it created or adopted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopt_existing_topics: bool,

    /// `exactly_once`: output, changelog and offsets commit in one Kafka transaction per
    /// task. `at_least_once`: flush, then commit offsets; faster, may repeat output.
    #[serde(default)]
    pub processing_guarantee: ProcessingGuarantee,

    /// How often each task commits (a transaction under exactly-once).
    #[serde(default = "default_commit_interval")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("commitInterval must be a duration such as 100ms, 30s, 5m, 24h or 1d"))]
    pub commit_interval: String,

    /// Standby copies of each task's state on other pods, fed from the changelog, so a
    /// failover does not wait for a full restore. Must be less than replicas.
    #[serde(default)]
    #[schemars(range(min = 0, max = 10))]
    pub standby_replicas: i32,

    /// The input topics. With more than one they must have the same partition count
    /// (co-partitioned): partition N of every topic is task N.
    pub source: SourceSpec,

    /// Tables the `join` steps look rows up in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(t, self.exists_one(u, u.name == t.name))").message("table names must be unique"))]
    pub tables: Vec<TableSpec>,

    /// The processing steps, applied in order to each record.
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub steps: Vec<Step>,

    /// Where results go. Without a sink the app only builds queryable state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<SinkSpec>,

    /// What happens to a record that cannot be deserialized or fails a step.
    #[serde(default)]
    pub errors: ErrorsSpec,

    /// Per-store settings, keyed by store name. Changelog settings default sensibly.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    #[x_kube(validation = Rule::new("self.all(k, k != 'true' && k != 'false')").message("a store is named true or false in spec.stores: kubectl reads an unquoted key n, y, no, yes, on or off as a YAML 1.1 boolean; quote the key"))]
    pub stores: BTreeMap<String, StoreSpec>,

    /// `Report`: topic config that differs from what the spec wants is reported in
    /// status.topics. `Enforce`: it is also corrected.
    #[serde(default)]
    pub drift_policy: DriftPolicy,

    /// The persistent volume each worker keeps its RocksDB state on.
    #[serde(default)]
    pub storage: StorageSpec,

    /// What is kept when the StreamApp is deleted.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// Compute resources of the worker container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Additions to the worker pods: labels, annotations, scheduling, extra env.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplateOverrides>,
}

fn default_replicas() -> i32 {
    1
}
fn default_commit_interval() -> String {
    "100ms".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KafkaSpec {
    /// Comma-separated host:port list.
    #[schemars(length(min = 1))]
    pub bootstrap_servers: String,
    /// librdkafka client properties passed through (e.g. `security.protocol`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
    /// A Secret in the same namespace whose keys are librdkafka properties (SASL/TLS
    /// credentials). The operator's admin client uses them and the workers get the
    /// Secret mounted at /etc/oxbow/kafka-secret (one file per property).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct SecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ProcessingGuarantee {
    #[default]
    #[serde(rename = "exactly_once")]
    ExactlyOnce,
    #[serde(rename = "at_least_once")]
    AtLeastOnce,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum RecordFormat {
    #[default]
    String,
    Json,
    Bytes,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceSpec {
    /// Input topics (co-partitioned when more than one).
    #[schemars(length(min = 1, max = 16), inner(length(max = 249)))]
    #[x_kube(validation = Rule::new("self.all(t, t.matches('^[a-zA-Z0-9._-]+$') && size(t) <= 249)").message("source topic names may use letters, digits, '.', '_' and '-' (at most 249)"))]
    pub topics: Vec<String>,
    /// How record keys are read: `string` (UTF-8), `json` or `bytes`.
    #[serde(default)]
    pub key_format: RecordFormat,
    /// How record values are read: `json`, `string` (UTF-8) or `bytes`. A record that
    /// cannot be read goes to `errors.policy`.
    #[serde(default = "json_format")]
    pub value_format: RecordFormat,
    /// Event time: a CEL expression over `key` and `value` giving epoch milliseconds or an
    /// RFC 3339 string (e.g. `value.ts`). Default: the Kafka record timestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    /// How the producers of the source topics map a key to a partition. Interactive
    /// queries use it to find the task holding a key. `murmur2` (the default) is the Java
    /// clients' and Kafka Streams' partitioner; `crc32` is librdkafka's `consistent`
    /// (and `consistent_random`'s keyed case); `fnv1a` is librdkafka's `fnv1a`.
    #[serde(default)]
    pub partitioner: Partitioner,
    /// A promise that the source topics are already partitioned by this CEL expression
    /// (over `key` and `value`): the producers chose each record's partition with
    /// `partitioner` applied to the expression's value. A keyed step (`aggregate`,
    /// `dedupe`, `batch` with `groupBy`) whose key is written the same way then runs
    /// without a repartition topic. Every record is checked: one whose partition breaks
    /// the promise goes to `errors.policy` with reason `NotPartitionedAsDeclared`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub partitioned_by: Option<String>,
}

/// A producer's key → partition function (see `SourceSpec.partitioner`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Partitioner {
    /// `toPositive(murmur2(key)) % partitions`: Java clients, Kafka Streams, librdkafka's
    /// `murmur2` / `murmur2_random`.
    #[default]
    Murmur2,
    /// `crc32(key) % partitions`: librdkafka's `consistent` and `consistent_random`.
    Crc32,
    /// `abs(fnv1a(key)) % partitions`: librdkafka's `fnv1a` / `fnv1a_random`.
    Fnv1a,
}

fn json_format() -> RecordFormat {
    RecordFormat::Json
}

/// One processing step: set exactly one of the step kinds.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.filter) ? 1 : 0) + (has(self.map) ? 1 : 0) + (has(self.flatMap) ? 1 : 0) + (has(self.dedupe) ? 1 : 0) + (has(self.aggregate) ? 1 : 0) + (has(self.batch) ? 1 : 0) + (has(self.join) ? 1 : 0) + (has(self.to) ? 1 : 0) == 1").message("each step must set exactly one of filter, map, flatMap, dedupe, aggregate, batch, join or to"))]
pub struct Step {
    /// A name for this step in errors, metrics and dead-letter headers (default: its kind
    /// and position, `filter-2`). A keyed step that repartitions names its topic
    /// `<applicationId>-<name>-repartition`; without a name its store's name is used, so
    /// inserting a step elsewhere does not rename the topic. Unique among the steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100))]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z0-9._-]+$') && size(self) <= 100").message("step names may use letters, digits, '.', '_' and '-' (at most 100): a repartitioning step's name becomes part of a topic name"))]
    pub name: Option<String>,
    /// Keep records for which the CEL expression is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterStep>,
    /// Replace key and/or value with CEL expressions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<MapStep>,
    /// Emit zero or more records from a CEL expression returning a list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flat_map: Option<FlatMapStep>,
    /// Pass the first occurrence of an id within a time span; drop repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe: Option<DedupeStep>,
    /// Windowed or running aggregation per group key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<AggregateStep>,
    /// Group records into batches every consumer sees identically.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchStep>,
    /// Enrich each record with the current row of a table (`spec.tables`), or join it
    /// with the records of another stream within a time window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<JoinStep>,
    /// Send the record to another topic as well (the record also goes on to the next
    /// step): several outputs, or a branch by predicates or by a topic expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<ToStep>,
}

/// A join: with a table (`table`), the row whose key is `key` is `other` in `value`;
/// with a stream (`stream`), each record of the other stream whose key is `key` and
/// whose event time is at most `within` away.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.table) != has(self.stream)").message("join needs exactly one of table or stream"))]
pub struct JoinStep {
    /// The table's name in `spec.tables` (a stream–table join).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub table: Option<String>,
    /// The other stream (a stream–stream join within `within`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<JoinStream>,
    /// CEL over `key` and `value` returning the join key (a string): the table key to
    /// look up, or the key the other stream's records are keyed by. Both sides are
    /// co-partitioned: when the records are not already partitioned by this expression,
    /// they are repartitioned by it.
    #[schemars(length(min = 1))]
    pub key: String,
    /// `inner`: records without a match are dropped. `left`: they go on with `other`
    /// null (for a stream, once their window has closed). `outer` (streams only):
    /// unmatched records of both sides go on, the missing side null.
    #[serde(default, rename = "type")]
    pub join_type: JoinType,
    /// Stream–stream only: how far apart in event time two records may be and still
    /// join (both directions), such as `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("within must be a duration such as 5m"))]
    pub within: Option<String>,
    /// Stream–stream only: how far behind the stream time a record may arrive and still
    /// join. Later records are dropped and counted as late. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("grace must be a duration such as 1m"))]
    pub grace: Option<String>,
    /// Stream–stream only: the store buffering both sides (default `join-<topic>`);
    /// its changelog is `<applicationId>-<store>-changelog`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([a-z0-9-]*[a-z0-9])?$') && size(self) <= 100").message("store names are lowercase letters, digits and '-'"))]
    pub store: Option<String>,
    /// CEL over `key`, `value` and `other` returning the new value. For a table, `other`
    /// is the row or null; for a stream, `value` is this side's record and `other` the
    /// other stream's (either null in an unmatched `left` or `outer` result). Default:
    /// `{"value": value, "other": other}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// The other side of a stream–stream join: a topic keyed by the join key (the default
/// murmur2 partitioner over the key's string), with as many partitions as the stage of
/// the join has tasks. Its records enter the steps at the join.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JoinStream {
    /// The other stream's topic. Oxbow never creates, alters or deletes it.
    #[schemars(length(max = 249))]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z0-9._-]+$') && size(self) <= 249").message("stream topics may use letters, digits, '.', '_' and '-' (at most 249)"))]
    pub topic: String,
    /// How its values are read: `json` (default), `string` or `bytes`.
    #[serde(default = "json_format")]
    pub value_format: RecordFormat,
    /// Event time of its records: CEL over `key` and `value` (epoch milliseconds or RFC
    /// 3339). Default: the Kafka record timestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum JoinType {
    #[default]
    Inner,
    Left,
    Outer,
}

/// An extra output: `topic` or `topicExpr`, optionally only `when` a predicate holds.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.topic) != has(self.topicExpr)").message("to needs exactly one of topic or topicExpr"))]
pub struct ToStep {
    /// The topic. It must exist: the worker checks at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 249))]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z0-9._-]+$') && size(self) <= 249").message("to.topic may use letters, digits, '.', '_' and '-' (at most 249)"))]
    pub topic: Option<String>,
    /// CEL over `key` and `value` returning the topic name. A record whose topic does
    /// not exist goes to `errors.policy` with reason `OutputTopicMissing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_expr: Option<String>,
    /// CEL returning bool: only records for which it is true are sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// CEL returning the output key. Default: the record's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// CEL returning the output value. Default: the record's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A table: a compacted topic read as a keyed store, latest value per key, tombstones
/// delete. Its store is restored from the topic itself (no changelog).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TableSpec {
    /// The table's name: `join.table` and queries (`/v1/stores/<name>`) use it.
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([a-z0-9-]*[a-z0-9])?$') && size(self) <= 63").message("table names are lowercase letters, digits and '-' (at most 63)"))]
    pub name: String,
    /// The topic (compacted, keyed by the table key with the default murmur2
    /// partitioner). Oxbow never creates, alters or deletes it.
    #[schemars(length(max = 249))]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z0-9._-]+$') && size(self) <= 249").message("table topics may use letters, digits, '.', '_' and '-' (at most 249)"))]
    pub topic: String,
    /// How row values are read: `json` (default), `string` or `bytes`. Keys are read
    /// as UTF-8 strings.
    #[serde(default = "json_format")]
    pub value_format: RecordFormat,
    /// Every worker keeps the whole table (Kafka Streams' GlobalKTable): any lookup
    /// key works without repartitioning, and the topic may have any partition count.
    /// Otherwise each task keeps its partition, and the topic needs as many partitions
    /// as the source topics.
    #[serde(default)]
    pub global: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct FilterStep {
    /// CEL over `key` and `value`, returning bool.
    #[schemars(length(min = 1))]
    pub cel: String,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.key) || has(self.value)").message("map needs key, value or both"))]
pub struct MapStep {
    /// CEL returning the new key (a string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// CEL returning the new value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct FlatMapStep {
    /// CEL returning a list; each element becomes a record value.
    #[schemars(length(min = 1))]
    pub cel: String,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct DedupeStep {
    /// The store holding the ids seen.
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([a-z0-9-]*[a-z0-9])?$') && size(self) <= 63").message("store names are lowercase letters, digits and '-' (at most 63): they become part of topic names"))]
    pub store: String,
    /// CEL returning the id to deduplicate on.
    #[schemars(length(min = 1))]
    pub id: String,
    /// How long an id is remembered.
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("within must be a duration such as 10m, 24h or 7d"))]
    pub within: String,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AggregateStep {
    /// The store holding one aggregate per group key (and window); queryable, backed
    /// by the changelog `<applicationId>-<store>-changelog`.
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([a-z0-9-]*[a-z0-9])?$') && size(self) <= 63").message("store names are lowercase letters, digits and '-' (at most 63): they become part of topic names"))]
    pub store: String,
    /// CEL returning the group key (a string).
    #[schemars(length(min = 1))]
    pub group_by: String,
    /// Without a window the aggregate runs forever per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowSpec>,
    /// Output fields, each one aggregation.
    #[schemars(extend("minProperties" = 1, "maxProperties" = 16))]
    #[x_kube(validation = Rule::new("self.all(k, k != 'true' && k != 'false')").message("an aggregate field is named true or false: kubectl reads an unquoted key n, y, no, yes, on or off as a YAML 1.1 boolean; quote the key, for example \"n\": {count: {}}"))]
    pub fields: BTreeMap<String, AggregateField>,
    /// `onUpdate`: a record per change. `onWindowClose`: one final record per key and
    /// window once stream time passes the window end plus grace.
    #[serde(default)]
    pub emit: Emit,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Emit {
    #[default]
    OnUpdate,
    OnWindowClose,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("(has(self.tumbling) ? 1 : 0) + (has(self.hopping) ? 1 : 0) + (has(self.session) ? 1 : 0) == 1").message("a window is exactly one of tumbling, hopping or session"))]
pub struct WindowSpec {
    /// Fixed, non-overlapping windows of this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("tumbling must be a duration such as 10m"))]
    pub tumbling: Option<String>,
    /// Overlapping windows of `size`, one starting every `advance`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hopping: Option<HoppingWindow>,
    /// Per-key windows that grow while records keep arriving within `gap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionWindow>,
    /// How late a record may arrive and still count. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("grace must be a duration such as 1m"))]
    pub grace: Option<String>,
    /// How long closed windows stay queryable. Default: window size plus grace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("retention must be a duration such as 1d"))]
    pub retention: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct HoppingWindow {
    /// Length of each window.
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("hopping.size must be a duration such as 10m"))]
    pub size: String,
    /// Time between the starts of consecutive windows (at most `size`).
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("hopping.advance must be a duration such as 1m"))]
    pub advance: String,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SessionWindow {
    /// A session closes after this much inactivity.
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("session.gap must be a duration such as 5m"))]
    pub gap: String,
}

/// One aggregation: set exactly one of count, sum, min, max, avg, last.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("(has(self.count) ? 1 : 0) + (has(self.sum) ? 1 : 0) + (has(self.min) ? 1 : 0) + (has(self.max) ? 1 : 0) + (has(self.avg) ? 1 : 0) + (has(self.last) ? 1 : 0) == 1").message("each aggregate field is exactly one of count, sum, min, max, avg or last"))]
pub struct AggregateField {
    /// Number of records: `count: {}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<CountAggregation>,
    /// CEL returning a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<String>,
    /// CEL returning a number; the smallest seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<String>,
    /// CEL returning a number; the largest seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// CEL returning a number; the mean (a sum and a count are kept, so merging windows
    /// and restores give the same mean as one pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg: Option<String>,
    /// CEL returning any value; the latest wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct CountAggregation {}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchStep {
    /// The store holding the open batches, so a batch survives a restart half full.
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([a-z0-9-]*[a-z0-9])?$') && size(self) <= 63").message("store names are lowercase letters, digits and '-' (at most 63): they become part of topic names"))]
    pub store: String,
    /// Records per batch.
    #[schemars(range(min = 1, max = 100000))]
    pub size: i32,
    /// Emit a partial batch after this long without filling it.
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("maxWait must be a duration such as 5s"))]
    pub max_wait: String,
    /// CEL returning a key: one open batch per key. Default: one per partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_by: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SinkSpec {
    /// The output topic. It must exist; under exactly-once it is written in the same
    /// transaction as the state and the input offsets.
    #[schemars(length(max = 249))]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z0-9._-]+$') && size(self) <= 249").message("sink.topic may use letters, digits, '.', '_' and '-' (at most 249)"))]
    pub topic: String,
    /// CEL returning the output key. Default: the record's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// CEL returning the output value. Default: the record's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ErrorPolicy {
    /// Write the original record with error headers to the dead-letter topic, go on.
    #[default]
    DeadLetter,
    /// Count and log the failure, go on.
    Skip,
    /// Stop the task and report the failure; the record is retried after a restart.
    Fail,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ErrorsSpec {
    /// deadLetter (default), skip or fail.
    #[serde(default)]
    pub policy: ErrorPolicy,
    /// Dead-letter topic. Default `<applicationId>-dlq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 249))]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z0-9._-]+$') && size(self) <= 249").message("errors.topic may use letters, digits, '.', '_' and '-' (at most 249)"))]
    pub topic: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct StoreSpec {
    #[serde(default)]
    pub changelog: ChangelogSpec,
}

/// Settings of a store's compacted changelog topic.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.minInsyncReplicas) || !has(self.replicationFactor) || self.minInsyncReplicas <= self.replicationFactor").message("minInsyncReplicas must not exceed replicationFactor, or no write could ever succeed"))]
pub struct ChangelogSpec {
    /// `min.cleanable.dirty.ratio`: how much of the log may be superseded before the
    /// cleaner compacts it. Lower keeps restores short. Default 0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_cleanable_dirty_ratio: Option<f64>,
    /// `segment.ms`: the active segment is never compacted; rolling it often keeps the
    /// uncompacted tail (and restores) short. Default 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(ms|s|m|h|d))+$')").message("segment must be a duration such as 1h or 1d"))]
    pub segment: Option<String>,
    /// Default: the broker's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32))]
    pub replication_factor: Option<i32>,
    /// Default: the broker's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32))]
    pub min_insync_replicas: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DriftPolicy {
    #[default]
    Report,
    Enforce,
}

/// Immutable: a StatefulSet's volume claim template cannot change after creation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("storage is immutable: the workers' volume claim template cannot change; resize the PVCs directly or create a new StreamApp"))]
pub struct StorageSpec {
    /// Volume size per worker pod, e.g. 10Gi.
    #[serde(default = "default_storage_size")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))").message("storage.size must be a positive quantity such as 512Mi or 10Gi"))]
    pub size: String,
    /// Default: the cluster's default StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

impl Default for StorageSpec {
    fn default() -> Self {
        Self {
            size: default_storage_size(),
            storage_class_name: None,
        }
    }
}

fn default_storage_size() -> String {
    "1Gi".into()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum Retention {
    #[default]
    Retain,
    Delete,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeletionPolicy {
    /// Changelog and dead-letter topics (source and sink topics are never touched).
    #[serde(default)]
    pub topics: Retention,
    /// The workers' state volumes.
    #[serde(default)]
    pub volumes: Retention,
    /// The consumer group (committed offsets).
    #[serde(default)]
    pub consumer_group: Retention,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateOverrides {
    /// Extra pod labels; the operator's own labels win on a clash.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Extra pod annotations; the operator's config hash annotation wins on a clash.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Schedule the workers only onto nodes with these labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the worker pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// PriorityClass of the worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Seconds a stopping worker gets to commit and hand its tasks over. Default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub termination_grace_period_seconds: Option<i64>,
    /// Extra environment for the worker container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}
