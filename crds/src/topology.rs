//! Sub-topologies (stages) and repartitioning. Pure: both the operator (topics, task
//! count, placement) and the worker (what each task runs) derive them from the spec.
//!
//! A keyed step (`aggregate`, `dedupe`, `batch` with `groupBy`, a `join` of a table
//! that is not global) is correct only when
//! every record with the same key reaches the same task. The steps are walked in order,
//! tracking which expressions the records flowing at that point are known to be
//! partitioned by: `key` at the source (a producer partitions by the record key), plus
//! `source.partitionedBy` when the user promises it. A keyed step whose key expression
//! is not among them starts a new stage: the stage before it writes each record to
//! `<applicationId>-<step>-repartition`, keyed by that expression's value, to the
//! partition murmur2 picks (what any Kafka client's default partitioner would pick), and
//! the new stage's task N reads partition N of that topic. Expressions are compared as
//! written (trimmed): `value.userId` and `value["userId"]` are different to this walk and
//! cost a repartition, never a wrong answer.
//!
//! A join also needs its key partitioned the way the table's producers partitioned
//! theirs (murmur2 over the key's string): at stage 0 that holds only with the
//! `murmur2` source partitioner and string keys, otherwise the join repartitions. The
//! table's store belongs to the stage of its join, whose task N reads partition N of the
//! table's topic as well.
//!
//! Every stage has as many tasks as the source topics have partitions, and the
//! repartition topics as many partitions.

use std::ops::Range;

use crate::names::{StoreName, TaskId, repartition_topic};
use crate::streamapp::{Partitioner, RecordFormat, Step, StreamAppSpec, TableSpec};
use crate::validate::{step_label, step_store};

/// The source record key, as an expression.
const KEY: &str = "key";

/// How a stage gets its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageInput {
    /// Partition N of every source topic.
    Source,
    /// Partition N of a repartition topic, written by the stage before, keyed by `key`.
    Repartition {
        /// The step that needs it (its label in messages).
        step: String,
        /// `<applicationId>-<name>-repartition`.
        topic: String,
        /// The CEL expression whose value keys (and partitions) the records.
        key: String,
        /// The field path of that expression, for messages.
        path: String,
    },
}

/// One sub-topology: a run of steps whose keyed steps all see their keys co-located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub index: u32,
    /// The spec's steps this stage runs (indices into `spec.steps`). Processors compiled
    /// into a custom worker run after the last stage's steps.
    pub steps: Range<usize>,
    pub input: StageInput,
    /// The stores of its steps: a store belongs to the stage that writes it.
    pub stores: Vec<StoreName>,
    /// The co-partitioned tables its joins read, with their topics: the table's store
    /// is one of `stores`, fed from partition N of the topic instead of a changelog.
    pub tables: Vec<(StoreName, String)>,
    /// The other streams of its stream–stream joins: topic, and the index (into
    /// `spec.steps`) of the join where their records enter.
    pub streams: Vec<(String, usize)>,
}

impl Stage {
    /// The topics its tasks read (partition = the task's partition): its input, then
    /// the other streams of its joins.
    pub fn input_topics<'a>(&'a self, spec: &'a StreamAppSpec) -> Vec<String> {
        let mut topics = match &self.input {
            StageInput::Source => spec.source.topics.clone(),
            StageInput::Repartition { topic, .. } => vec![topic.clone()],
        };
        topics.extend(self.streams.iter().map(|(t, _)| t.clone()));
        topics
    }
}

/// How the task holding a key of a store is found (interactive queries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRoute {
    /// A stage-0 store keyed by what the source is partitioned by (`key`, or
    /// `partitionedBy`): the source's partitioner over the key.
    Source,
    /// A store behind a repartition topic: murmur2 over the key, as the stage before
    /// wrote it.
    Murmur2,
    /// Not keyed by what its records are partitioned by (a `batch` without `groupBy`):
    /// a key may be held by any task of the stage.
    EveryTask,
}

/// The stages of an app, in order: stage 0 reads the sources, the last one writes the
/// sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub stages: Vec<Stage>,
    /// Per store of the spec's steps: how its keys map to tasks.
    pub routes: std::collections::BTreeMap<StoreName, KeyRoute>,
    /// `source.partitionedBy`, checked on every stage-0 record when set.
    pub partitioned_by: Option<String>,
}

impl Topology {
    pub fn of(application_id: &str, spec: &StreamAppSpec) -> Self {
        let mut stages = vec![Stage {
            index: 0,
            steps: 0..0,
            input: StageInput::Source,
            stores: Vec::new(),
            tables: Vec::new(),
            streams: Vec::new(),
        }];
        let partitioned_by = spec
            .source
            .partitioned_by
            .as_deref()
            .map(|e| e.trim().to_string());
        // Expressions the records at this point are partitioned by.
        let mut by: Vec<String> = vec![KEY.to_string()];
        by.extend(partitioned_by.clone());
        let mut routes = std::collections::BTreeMap::new();
        for (i, step) in spec.steps.iter().enumerate() {
            let keyed = keyed_step(spec, i, step);
            // A join at stage 0 finds its rows only if the source was partitioned the way
            // the table's producers partition: murmur2 over the key's string.
            let source_like_table = spec.source.partitioner == Partitioner::Murmur2
                && spec.source.key_format == RecordFormat::String;
            let colocated = |key: &String, stages_so_far: usize| {
                by.contains(key) && (step.join.is_none() || stages_so_far > 1 || source_like_table)
            };
            if let Some((key, path)) = keyed.clone()
                && !colocated(&key, stages.len())
            {
                let index = stages.len() as u32;
                stages.push(Stage {
                    index,
                    steps: i..i,
                    input: StageInput::Repartition {
                        step: step_label(i, step),
                        topic: repartition_topic(application_id, &topic_name(step)),
                        key: key.clone(),
                        path,
                    },
                    stores: Vec::new(),
                    tables: Vec::new(),
                    streams: Vec::new(),
                });
                // The repartition topic is keyed by the step's key, not the record key
                // (the record's own key travels with it).
                by = vec![key];
            }
            let stage = stages.last_mut().expect("stage 0 exists");
            stage.steps.end = i + 1;
            if let Some(store) = step_store(step) {
                let route = match (&keyed, stage.index) {
                    (None, _) => KeyRoute::EveryTask,
                    (Some(_), 0) => KeyRoute::Source,
                    (Some(_), _) => KeyRoute::Murmur2,
                };
                routes.insert(store.clone(), route);
                stage.stores.push(store);
            }
            if let Some(topic) = joined_stream(step) {
                stage.streams.push((topic.to_string(), i));
            }
            if let Some(table) = joined_table(spec, step).filter(|t| !t.global) {
                let store = StoreName(table.name.clone());
                // Keyed as its producers keyed it, whichever stage holds it.
                routes.insert(store.clone(), KeyRoute::Murmur2);
                if !stage.stores.contains(&store) {
                    stage.stores.push(store.clone());
                    stage.tables.push((store, table.topic.clone()));
                }
            }
            by = partitioned_after(step, by);
        }
        Self {
            stages,
            routes,
            partitioned_by,
        }
    }

    /// Stages as a task-id bound: `TaskId::all(topology.stage_count(), partitions)`.
    pub fn stage_count(&self) -> u32 {
        self.stages.len() as u32
    }

    pub fn stage(&self, index: u32) -> Option<&Stage> {
        self.stages.get(index as usize)
    }

    /// The table topic a store is fed from, if it is a co-partitioned table's store.
    pub fn table_topic(&self, store: &StoreName) -> Option<&str> {
        self.stages
            .iter()
            .flat_map(|s| &s.tables)
            .find(|(s, _)| s == store)
            .map(|(_, t)| t.as_str())
    }

    /// The stage a store belongs to (stores of custom processors: the last one).
    pub fn stage_of_store(&self, store: &StoreName) -> u32 {
        self.stages
            .iter()
            .find(|s| s.stores.contains(store))
            .map_or(self.stage_count() - 1, |s| s.index)
    }

    /// The stage after `index`, if its records go through a repartition topic.
    pub fn next(&self, index: u32) -> Option<&Stage> {
        self.stage(index + 1)
    }

    /// Every repartition topic, with the stage that reads it.
    pub fn repartition_topics(&self) -> Vec<(&Stage, &str)> {
        self.stages
            .iter()
            .filter_map(|s| match &s.input {
                StageInput::Repartition { topic, .. } => Some((s, topic.as_str())),
                StageInput::Source => None,
            })
            .collect()
    }

    /// Every task of every stage.
    pub fn tasks(&self, partitions: u32) -> Vec<TaskId> {
        TaskId::all(self.stage_count(), partitions).collect()
    }
}

/// The name a repartitioning step gives its topic: `name`, else its store's.
pub fn topic_name(step: &Step) -> String {
    step.name
        .clone()
        .or_else(|| step_store(step).map(|s| s.0))
        .or_else(|| {
            let j = step.join.as_ref()?;
            j.table.as_ref().map(|t| format!("join-{t}"))
        })
        .unwrap_or_else(|| "step".into())
}

/// The table a `join` step reads, if the step is one and the table is declared.
pub fn joined_table<'a>(spec: &'a StreamAppSpec, step: &Step) -> Option<&'a TableSpec> {
    let table = step.join.as_ref()?.table.as_ref()?;
    spec.tables.iter().find(|t| &t.name == table)
}

/// The other stream's topic of a stream–stream `join` step.
pub fn joined_stream(step: &Step) -> Option<&str> {
    Some(step.join.as_ref()?.stream.as_ref()?.topic.as_str())
}

/// [`step_key`], plus a join of a table that is not global (keyed by its lookup key).
pub fn keyed_step(spec: &StreamAppSpec, index: usize, step: &Step) -> Option<(String, String)> {
    if let Some(j) = &step.join {
        let co_partitioned =
            j.stream.is_some() || joined_table(spec, step).is_some_and(|t| !t.global);
        return match co_partitioned {
            true => Some((
                j.key.trim().to_string(),
                format!("spec.steps[{index}].join.key"),
            )),
            false => None,
        };
    }
    step_key(index, step)
}

/// The key a keyed step needs co-located, with its field path. `batch` without
/// `groupBy` keeps one batch per task and needs nothing.
pub fn step_key(index: usize, step: &Step) -> Option<(String, String)> {
    let p = format!("spec.steps[{index}]");
    if let Some(a) = &step.aggregate {
        return Some((
            a.group_by.trim().to_string(),
            format!("{p}.aggregate.groupBy"),
        ));
    }
    if let Some(d) = &step.dedupe {
        return Some((d.id.trim().to_string(), format!("{p}.dedupe.id")));
    }
    if let Some(g) = step.batch.as_ref().and_then(|b| b.group_by.as_ref()) {
        return Some((g.trim().to_string(), format!("{p}.batch.groupBy")));
    }
    None
}

/// What the records are partitioned by after `step`, given `by` before it.
fn partitioned_after(step: &Step, by: Vec<String>) -> Vec<String> {
    if step.filter.is_some() || step.to.is_some() {
        return by;
    }
    if step.join.as_ref().is_some_and(|j| j.stream.is_some()) {
        // Results are keyed by the join key, which the records were partitioned by.
        return vec![KEY.to_string()];
    }
    if step.join.is_some() {
        // The value is new; the key is kept.
        return by.into_iter().filter(|e| e == KEY).collect();
    }
    if let Some(m) = &step.map {
        // A new key is partitioned by nothing known; a new value keeps only `key`.
        return match m.key {
            Some(_) => Vec::new(),
            None => by.into_iter().filter(|e| e == KEY).collect(),
        };
    }
    if step.flat_map.is_some() {
        return by.into_iter().filter(|e| e == KEY).collect();
    }
    if let Some(d) = &step.dedupe {
        let mut by = by;
        let id = d.id.trim().to_string();
        if !by.contains(&id) {
            by.push(id);
        }
        return by;
    }
    if step.aggregate.is_some() {
        // Results are keyed by the group key, which the records were partitioned by.
        return vec![KEY.to_string()];
    }
    if let Some(b) = &step.batch {
        // A grouped batch is keyed by its group; an ungrouped one by its batch id.
        return match b.group_by {
            Some(_) => vec![KEY.to_string()],
            None => Vec::new(),
        };
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streamapp::{
        AggregateField, AggregateStep, BatchStep, CountAggregation, DedupeStep, FilterStep, MapStep,
    };

    fn spec(steps: Vec<Step>, partitioned_by: Option<&str>) -> StreamAppSpec {
        let mut s: StreamAppSpec = serde_json::from_value(serde_json::json!({
            "kafka": {"bootstrapServers": "k:9092"},
            "source": {"topics": ["payments"]},
        }))
        .expect("spec");
        s.steps = steps;
        s.source.partitioned_by = partitioned_by.map(str::to_string);
        s
    }
    fn agg(store: &str, group_by: &str) -> Step {
        Step {
            aggregate: Some(AggregateStep {
                store: store.into(),
                group_by: group_by.into(),
                window: None,
                fields: [(
                    "n".to_string(),
                    AggregateField {
                        count: Some(CountAggregation {}),
                        ..Default::default()
                    },
                )]
                .into(),
                emit: Default::default(),
            }),
            ..Default::default()
        }
    }
    fn dedupe(store: &str, id: &str) -> Step {
        Step {
            dedupe: Some(DedupeStep {
                store: store.into(),
                id: id.into(),
                within: "1h".into(),
            }),
            ..Default::default()
        }
    }
    fn filter() -> Step {
        Step {
            filter: Some(FilterStep { cel: "true".into() }),
            ..Default::default()
        }
    }

    #[test]
    fn grouping_by_a_field_that_is_not_the_key_starts_a_stage_behind_a_repartition_topic() {
        let t = Topology::of(
            "fraud",
            &spec(
                vec![filter(), agg("per-user", "value.userId"), filter()],
                None,
            ),
        );
        assert_eq!(t.stage_count(), 2);
        assert_eq!(t.stages[0].steps, 0..1);
        assert_eq!(t.stages[1].steps, 1..3);
        assert_eq!(t.stages[1].stores, vec![StoreName("per-user".into())]);
        match &t.stages[1].input {
            StageInput::Repartition { topic, key, .. } => {
                assert_eq!(topic, "fraud-per-user-repartition");
                assert_eq!(key, "value.userId");
            }
            other => panic!("expected a repartition, got {other:?}"),
        }
        assert_eq!(t.stage_of_store(&StoreName("per-user".into())), 1);
    }

    #[test]
    fn grouping_by_the_key_or_the_declared_partitioning_needs_no_repartition() {
        let t = Topology::of("a", &spec(vec![agg("s", " key ")], None));
        assert_eq!(t.stage_count(), 1);
        let t = Topology::of(
            "a",
            &spec(
                vec![dedupe("d", "value.userId"), agg("s", "value.userId")],
                Some("value.userId"),
            ),
        );
        assert_eq!(t.stage_count(), 1, "{t:?}");
    }

    #[test]
    fn dedupe_then_aggregate_by_different_fields_makes_three_stages_named_by_store_or_step() {
        let mut named = agg("per-user", "value.userId");
        named.name = Some("by-user".into());
        let t = Topology::of("f", &spec(vec![dedupe("seen", "value.txId"), named], None));
        let topics: Vec<&str> = t.repartition_topics().iter().map(|(_, t)| *t).collect();
        assert_eq!(topics, vec!["f-seen-repartition", "f-by-user-repartition"]);
        assert_eq!(
            t.tasks(2)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            vec!["0_0", "0_1", "1_0", "1_1", "2_0", "2_1"]
        );
    }

    #[test]
    fn a_second_step_on_the_same_key_stays_in_the_stage_and_a_rekey_breaks_it() {
        let t = Topology::of(
            "a",
            &spec(vec![dedupe("d", "value.id"), agg("s", "value.id")], None),
        );
        assert_eq!(
            t.stage_count(),
            2,
            "dedupe repartitions by value.id, the aggregate reuses it"
        );
        // After the aggregate, records are keyed by the group: grouping by `key` is free.
        let t = Topology::of("a", &spec(vec![agg("s", "value.u"), agg("t", "key")], None));
        assert_eq!(t.stage_count(), 2);
        let rekey = Step {
            map: Some(MapStep {
                key: Some("value.x".into()),
                value: None,
            }),
            ..Default::default()
        };
        let t = Topology::of("a", &spec(vec![rekey, agg("s", "key")], None));
        assert_eq!(
            t.stage_count(),
            2,
            "a map that changes the key loses the partitioning"
        );
    }

    fn join(table: &str, key: &str) -> Step {
        Step {
            join: Some(crate::streamapp::JoinStep {
                table: Some(table.into()),
                stream: None,
                key: key.into(),
                join_type: Default::default(),
                within: None,
                grace: None,
                store: None,
                value: None,
            }),
            ..Default::default()
        }
    }
    fn with_table(mut s: StreamAppSpec, global: bool) -> StreamAppSpec {
        s.tables = vec![TableSpec {
            name: "users".into(),
            topic: "users-topic".into(),
            value_format: RecordFormat::Json,
            global,
        }];
        s
    }

    #[test]
    fn a_join_by_a_field_repartitions_and_its_stage_reads_the_table_topic() {
        let t = Topology::of(
            "f",
            &with_table(spec(vec![join("users", "value.userId")], None), false),
        );
        assert_eq!(t.stage_count(), 2);
        assert_eq!(t.repartition_topics()[0].1, "f-join-users-repartition");
        assert_eq!(
            t.stages[1].tables,
            vec![(StoreName("users".into()), "users-topic".to_string())]
        );
        assert_eq!(
            t.table_topic(&StoreName("users".into())),
            Some("users-topic")
        );
        assert_eq!(t.routes[&StoreName("users".into())], KeyRoute::Murmur2);
    }

    #[test]
    fn a_join_by_the_key_needs_no_repartition_only_where_the_source_is_partitioned_like_the_table()
    {
        let t = Topology::of(
            "f",
            &with_table(spec(vec![join("users", "key")], None), false),
        );
        assert_eq!(
            t.stage_count(),
            1,
            "murmur2 over string keys, as the table's producers"
        );
        let mut s = with_table(spec(vec![join("users", "key")], None), false);
        s.source.partitioner = Partitioner::Crc32;
        assert_eq!(
            Topology::of("f", &s).stage_count(),
            2,
            "a crc32 source is not where murmur2 puts the rows"
        );
        // After an aggregate the records are keyed (and murmur2-partitioned) by the group.
        let t = Topology::of(
            "f",
            &with_table(
                spec(
                    vec![agg("per-user", "value.userId"), join("users", "key")],
                    None,
                ),
                false,
            ),
        );
        assert_eq!(t.stage_count(), 2);
        assert_eq!(t.stages[1].tables.len(), 1);
    }

    fn stream_join(topic: &str, key: &str) -> Step {
        let mut s = join("unused", key);
        let j = s.join.as_mut().expect("join");
        j.table = None;
        j.stream = Some(crate::streamapp::JoinStream {
            topic: topic.into(),
            value_format: RecordFormat::Json,
            timestamp: None,
        });
        j.within = Some("5m".into());
        s
    }

    #[test]
    fn a_stream_join_reads_the_other_stream_in_its_stage_and_buffers_in_its_own_store() {
        let t = Topology::of("f", &spec(vec![stream_join("clicks", "value.adId")], None));
        assert_eq!(t.stage_count(), 2, "the main side is repartitioned by adId");
        assert_eq!(t.repartition_topics()[0].1, "f-join-clicks-repartition");
        assert_eq!(t.stages[1].streams, vec![("clicks".to_string(), 0)]);
        assert_eq!(t.stages[1].stores, vec![StoreName("join-clicks".into())]);
        let s = spec(vec![stream_join("clicks", "value.adId")], None);
        assert_eq!(
            t.stages[1].input_topics(&s),
            vec![
                "f-join-clicks-repartition".to_string(),
                "clicks".to_string()
            ]
        );
        // Keyed by the join key: no stage 0 repartition; results are keyed by it too.
        let t = Topology::of(
            "f",
            &spec(
                vec![stream_join("clicks", "key"), agg("per-ad", "key")],
                None,
            ),
        );
        assert_eq!(t.stage_count(), 1);
        assert_eq!(t.stages[0].input_topics(&s), vec!["payments", "clicks"]);
    }

    #[test]
    fn a_global_table_join_stays_in_its_stage() {
        let t = Topology::of(
            "f",
            &with_table(spec(vec![join("users", "value.userId")], None), true),
        );
        assert_eq!(t.stage_count(), 1);
        assert!(t.stages[0].tables.is_empty());
    }

    #[test]
    fn a_batch_without_group_by_stays_per_task() {
        let b = |g: Option<&str>| Step {
            batch: Some(BatchStep {
                store: "b".into(),
                size: 10,
                max_wait: "1s".into(),
                group_by: g.map(str::to_string),
            }),
            ..Default::default()
        };
        assert_eq!(
            Topology::of("a", &spec(vec![b(None)], None)).stage_count(),
            1
        );
        assert_eq!(
            Topology::of("a", &spec(vec![b(Some("value.u"))], None)).stage_count(),
            2
        );
    }
}
