//! The stores this worker knows, and how their entries read: the catalog built from the
//! app, and the JSON an entry answers as. Pure.
//!
//! Owns: [`Layout`], [`StoreInfo`], [`Catalog`] (which stage holds a store and how a key
//! maps to one of its tasks) and [`decode_entry`] (a stored value as answer fields).
//! Must not touch: store bytes beyond decoding a value already read (keys are built by
//! `crate::steps::keys`), routing, or I/O.

use std::collections::BTreeMap;

use base64::Engine as _;
use oxbow_crds::topology::KeyRoute;
use oxbow_crds::{Partitioner, RecordFormat, Step, TaskId};
use serde_json::{Value as Json, json};

use super::params::WindowFilter;
use super::partition::partition_for;
use crate::config::App;
use crate::steps::keys;
use crate::steps::window::{Window, WindowRules};
use crate::steps::{AggState, WindowAgg};

/// How a store's entries are laid out (the byte layouts are in `crate::steps::keys`).
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// `k<group>` → JSON `AggState` without a window, one row per window with one
    /// (`keys::window_key`); fields in the spec's (sorted) order.
    Aggregate {
        fields: Vec<String>,
        rules: Option<WindowRules>,
    },
    /// `k<id>` → first-seen event time.
    Dedupe { within: i64 },
    /// `h<group>` → the open batch's header.
    Batch,
    /// A co-partitioned table: the topic's key → its value, as the topic has them.
    Table { value_format: RecordFormat },
    /// A global table: every worker holds it whole (read through the engine's lookups,
    /// not a task's store).
    GlobalTable { value_format: RecordFormat },
    /// A custom processor's store: raw bytes.
    Custom,
}

impl Layout {
    /// The prefix of user keys in the store.
    pub(crate) fn prefix(&self) -> &'static [u8] {
        match self {
            Layout::Aggregate { rules: Some(_), .. } => keys::WINDOW_PREFIX,
            Layout::Aggregate { .. } | Layout::Dedupe { .. } => keys::KEY_PREFIX,
            Layout::Batch => keys::HEADER_PREFIX,
            Layout::Table { .. } | Layout::GlobalTable { .. } | Layout::Custom => b"",
        }
    }
    pub(crate) fn windowed(&self) -> bool {
        matches!(self, Layout::Aggregate { rules: Some(_), .. })
    }
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Layout::Aggregate { rules: Some(_), .. } => "windowed aggregate",
            Layout::Aggregate { .. } => "aggregate",
            Layout::Dedupe { .. } => "dedupe",
            Layout::Batch => "batch",
            Layout::Table { .. } => "table",
            Layout::GlobalTable { .. } => "global table",
            Layout::Custom => "custom",
        }
    }

    /// The layout of a built-in step's store; `None` for a step without one.
    fn of_step(step: &Step) -> Option<Self> {
        if let Some(d) = &step.dedupe {
            let within = oxbow_crds::duration::parse_duration(&d.within)
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .unwrap_or(i64::MAX);
            Some(Layout::Dedupe { within })
        } else if let Some(a) = &step.aggregate {
            Some(Layout::Aggregate {
                fields: a.fields.keys().cloned().collect(),
                // The spec was compiled at load: a bad window cannot get here.
                rules: a
                    .window
                    .as_ref()
                    .and_then(|w| WindowRules::from_spec(w).ok()),
            })
        } else if step.batch.is_some() {
            Some(Layout::Batch)
        } else {
            None
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoreInfo {
    pub layout: Layout,
    /// The stage whose tasks hold the store.
    pub stage: u32,
    /// How a key maps to one of those tasks.
    pub route: KeyRoute,
}

/// What queries need from the app: its stores and how keys map to tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    pub partitioner: Partitioner,
    pub key_format: RecordFormat,
    pub stores: BTreeMap<String, StoreInfo>,
}

impl Catalog {
    pub fn from_app(app: &App) -> Self {
        let spec = &app.manifest.spec;
        let topology = &app.topology;
        let mut stores = BTreeMap::new();
        for step in &spec.steps {
            let Some(layout) = Layout::of_step(step) else {
                continue;
            };
            let Some(store) = oxbow_crds::validate::step_store(step) else {
                continue;
            };
            let mut route = topology
                .routes
                .get(&store)
                .copied()
                .unwrap_or(KeyRoute::EveryTask);
            // A JSON source key is hashed as its JSON text, which a store key (the
            // expression's string) is not: such a key can be on any task of stage 0.
            if route == KeyRoute::Source && spec.source.key_format == RecordFormat::Json {
                route = KeyRoute::EveryTask;
            }
            stores.insert(
                store.0.clone(),
                StoreInfo {
                    layout,
                    stage: topology.stage_of_store(&store),
                    route,
                },
            );
        }
        // Co-partitioned tables, held by the stage of their join, keyed as the table's
        // producers keyed them.
        for stage in &topology.stages {
            for (store, _) in &stage.tables {
                let Some(t) = spec.tables.iter().find(|t| t.name == store.0) else {
                    continue;
                };
                stores.insert(
                    store.0.clone(),
                    StoreInfo {
                        layout: Layout::Table {
                            value_format: t.value_format,
                        },
                        stage: stage.index,
                        route: KeyRoute::Murmur2,
                    },
                );
            }
        }
        // Global tables: every worker holds them whole and answers for any key itself.
        for t in spec.tables.iter().filter(|t| t.global) {
            stores.insert(
                t.name.clone(),
                StoreInfo {
                    layout: Layout::GlobalTable {
                        value_format: t.value_format,
                    },
                    stage: 0,
                    route: KeyRoute::EveryTask,
                },
            );
        }
        // Stores of processors compiled into a custom worker: their keys are unknown.
        // (A stream–stream join's buffers are the spec's, and not queryable.)
        let builtin = oxbow_crds::validate::stores(spec);
        let last = topology.stage_count() - 1;
        for f in app.stage_steps(last) {
            for s in f(TaskId::new(last, 0))
                .stores()
                .into_iter()
                .filter(|s| !builtin.contains(s))
            {
                stores.entry(s.0).or_insert(StoreInfo {
                    layout: Layout::Custom,
                    stage: last,
                    route: KeyRoute::EveryTask,
                });
            }
        }
        Self {
            partitioner: spec.source.partitioner,
            key_format: spec.source.key_format,
            stores,
        }
    }

    /// The partition of the store's stage that holds `key`, when the key says.
    pub fn partition_of(
        &self,
        info: &StoreInfo,
        key: &str,
        partitions: u32,
    ) -> Result<Option<u32>, String> {
        Ok(match info.route {
            KeyRoute::Source => partition_for(self.partitioner, &self.source_key(key)?, partitions),
            KeyRoute::Murmur2 => partition_for(Partitioner::Murmur2, key.as_bytes(), partitions),
            KeyRoute::EveryTask => None,
        })
    }

    pub(crate) fn known(&self) -> String {
        if self.stores.is_empty() {
            "this app has no stores".into()
        } else {
            format!(
                "known stores: {}",
                self.stores.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        }
    }

    /// The source record key bytes a query key stands for.
    fn source_key(&self, key: &str) -> Result<Vec<u8>, String> {
        match self.key_format {
            RecordFormat::Bytes => base64::engine::general_purpose::STANDARD
                .decode(key)
                .map_err(|e| {
                    format!("failed to decode key {key:?} as base64 (keyFormat: bytes): {e}")
                }),
            _ => Ok(key.as_bytes().to_vec()),
        }
    }
}

/// A window's fields by name, as the step would emit them.
fn fields_json(fields: &[String], w: &WindowAgg) -> Json {
    Json::Object(
        fields
            .iter()
            .zip(&w.acc)
            .map(|(f, a)| (f.clone(), a.result()))
            .collect(),
    )
}

/// A value this worker cannot read, returned as stored with why.
fn raw(value: &[u8], note: String) -> Json {
    json!({
        "valueBase64": base64::engine::general_purpose::STANDARD.encode(value),
        "note": note,
    })
}

/// One entry's answer fields: `value` (aggregate), `windows` (windowed aggregate),
/// `seen`/`firstSeen`/`forgetAfter` (dedupe), `batches` (batch), or `valueBase64` with a
/// `note` (a layout this worker cannot read).
pub fn decode_entry(
    layout: &Layout,
    value: &[u8],
    stream_time: Option<i64>,
    filter: WindowFilter,
) -> Json {
    match layout {
        Layout::Aggregate { fields, rules } => match crate::steps::encoding::decode_state(value) {
            Ok(s) => decode_aggregate(fields, rules.as_ref(), &s, stream_time, filter),
            Err(e) => raw(value, format!("failed to decode the aggregate state: {e}")),
        },
        Layout::Dedupe { within } => match keys::decode_time(value) {
            Some(seen) => json!({
                "seen": true,
                "firstSeen": seen,
                "forgetAfter": seen.saturating_add(*within),
            }),
            None => raw(
                value,
                "failed to decode the dedupe mark (not 8 bytes)".into(),
            ),
        },
        Layout::Batch => match serde_json::from_slice::<Json>(value) {
            Ok(h) => json!({ "batches": [h] }),
            Err(e) => raw(value, format!("failed to decode the open batch: {e}")),
        },
        Layout::Table { value_format } | Layout::GlobalTable { value_format } => {
            match crate::task::decode(Some(value), *value_format) {
                Ok(v) => json!({ "value": v }),
                Err(e) => raw(value, format!("failed to decode the table row: {e}")),
            }
        }
        Layout::Custom => raw(
            value,
            "store written by a custom processor: its value is returned as stored".into(),
        ),
    }
}

/// A windowed aggregate's entry from its window rows (values as stored, in start
/// order): its `windows`, or the first row it cannot read, returned as stored.
pub fn decode_window_rows(
    layout: &Layout,
    rows: &[Vec<u8>],
    stream_time: Option<i64>,
    filter: WindowFilter,
) -> Json {
    let Layout::Aggregate { fields, rules } = layout else {
        return json!({ "windows": [] });
    };
    let mut s = AggState::default();
    for v in rows {
        match crate::steps::encoding::decode_window(v) {
            Ok(w) => s.windows.push(w),
            Err(e) => {
                return raw(
                    v,
                    format!("failed to decode a window of the aggregate: {e}"),
                );
            }
        }
    }
    decode_aggregate(fields, rules.as_ref(), &s, stream_time, filter)
}

/// An aggregate's answer: its `value`, or with a window its `windows` (those `filter`
/// keeps), each saying whether stream time has closed it.
fn decode_aggregate(
    fields: &[String],
    rules: Option<&WindowRules>,
    s: &AggState,
    stream_time: Option<i64>,
    filter: WindowFilter,
) -> Json {
    let Some(r) = rules else {
        return match s.windows.first() {
            Some(w) => json!({ "value": fields_json(fields, w) }),
            None => json!({ "value": Json::Null }),
        };
    };
    let windows: Vec<Json> = s
        .windows
        .iter()
        .filter(|w| filter.keeps(w.start))
        .map(|w| {
            let win = Window {
                start: w.start,
                end: w.end,
            };
            json!({
                "windowStart": w.start,
                "windowEnd": w.end,
                "closed": stream_time.is_some_and(|st| r.is_closed(win, st)),
                "value": fields_json(fields, w),
            })
        })
        .collect();
    json!({ "windows": windows })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::Acc;

    fn agg_state(windows: Vec<(i64, i64, Vec<Acc>)>) -> Vec<u8> {
        let s = AggState {
            windows: windows
                .into_iter()
                .map(|(start, end, acc)| WindowAgg {
                    start,
                    end,
                    emitted: false,
                    acc,
                })
                .collect(),
        };
        serde_json::to_vec(&s).expect("state")
    }

    #[test]
    fn an_unwindowed_aggregate_reads_as_its_fields() {
        let layout = Layout::Aggregate {
            fields: vec!["n".into(), "total".into()],
            rules: None,
        };
        let v = agg_state(vec![(
            0,
            0,
            vec![
                Acc::Count { n: 3 },
                Acc::Sum {
                    int: 42,
                    float: 0.5,
                    is_float: true,
                },
            ],
        )]);
        assert_eq!(
            decode_entry(&layout, &v, None, WindowFilter::default()),
            json!({"value": {"n": 3, "total": 42.5}})
        );
    }

    #[test]
    fn a_windowed_aggregate_reads_as_its_windows_filtered_by_start() {
        let spec: oxbow_crds::WindowSpec = serde_yaml::from_str("{tumbling: 10s}").expect("yaml");
        let rules = WindowRules::from_spec(&spec).expect("rules");
        let layout = Layout::Aggregate {
            fields: vec!["n".into()],
            rules: Some(rules),
        };
        let v = agg_state(vec![
            (0, 10_000, vec![Acc::Count { n: 1 }]),
            (10_000, 20_000, vec![Acc::Count { n: 2 }]),
        ]);
        assert_eq!(
            decode_entry(&layout, &v, Some(15_000), WindowFilter::default()),
            json!({"windows": [
                {"windowStart": 0, "windowEnd": 10_000, "closed": true, "value": {"n": 1}},
                {"windowStart": 10_000, "windowEnd": 20_000, "closed": false, "value": {"n": 2}},
            ]})
        );
        let f = WindowFilter {
            from: Some(5_000),
            to: Some(10_001),
        };
        assert_eq!(
            decode_entry(&layout, &v, Some(15_000), f)["windows"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn dedupe_batch_and_unknown_layouts_decode_or_fall_back_to_base64() {
        let d = Layout::Dedupe { within: 1_000 };
        assert_eq!(
            decode_entry(&d, &5_000i64.to_be_bytes(), None, WindowFilter::default()),
            json!({"seen": true, "firstSeen": 5_000, "forgetAfter": 6_000})
        );
        assert_eq!(
            decode_entry(&d, b"xy", None, WindowFilter::default())["valueBase64"],
            json!("eHk=")
        );
        assert_eq!(
            decode_entry(
                &Layout::Batch,
                br#"{"count":2}"#,
                None,
                WindowFilter::default()
            ),
            json!({"batches": [{"count": 2}]})
        );
        let c = decode_entry(&Layout::Custom, b"\x00\x01", None, WindowFilter::default());
        assert_eq!(c["valueBase64"], json!("AAE="));
        assert!(c["note"].as_str().is_some_and(|n| n.contains("custom")));
        let broken = Layout::Aggregate {
            fields: vec![],
            rules: None,
        };
        assert!(
            decode_entry(&broken, b"not json", None, WindowFilter::default())["note"]
                .as_str()
                .is_some_and(|n| n.starts_with("failed to decode"))
        );
    }

    #[test]
    fn stores_route_by_the_source_partitioner_or_by_murmur2_behind_a_repartition() {
        let text = r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {name: cat}
spec:
  kafka: {bootstrapServers: "127.0.0.1:1"}
  source: {topics: [in], partitioner: crc32}
  steps:
  - dedupe: {store: seen, id: key, within: 1h}
  - aggregate: {store: by-key, groupBy: key, window: {tumbling: 1m}, fields: {n: {count: {}}}}
  - aggregate: {store: by-colour, groupBy: value.colour, fields: {n: {count: {}}}}
  - aggregate: {store: rekeyed, groupBy: key, fields: {n: {count: {}}}}
"#;
        let m =
            crate::config::parse_manifest(std::path::Path::new("t.yaml"), text).expect("manifest");
        let app = App::from_manifest(m, BTreeMap::new()).expect("app");
        let c = Catalog::from_app(&app);
        assert_eq!(c.partitioner, Partitioner::Crc32);
        let route = |s: &str| c.stores.get(s).map(|i| (i.stage, i.route));
        assert_eq!(route("seen"), Some((0, KeyRoute::Source)));
        assert_eq!(route("by-key"), Some((0, KeyRoute::Source)));
        assert_eq!(
            route("by-colour"),
            Some((1, KeyRoute::Murmur2)),
            "grouped by a field: behind a repartition topic"
        );
        assert_eq!(
            route("rekeyed"),
            Some((1, KeyRoute::Murmur2)),
            "after an aggregate by colour the key is the colour, already co-located"
        );
        let info = c.stores.get("by-colour").cloned().expect("store");
        assert_eq!(
            c.partition_of(&info, "red", 8),
            Ok(partition_for(Partitioner::Murmur2, b"red", 8)),
            "the key's own partition, as the repartitioning stage wrote it"
        );
        assert!(matches!(
            c.stores.get("by-key").map(|i| &i.layout),
            Some(Layout::Aggregate { rules: Some(_), fields }) if fields == &["n".to_string()]
        ));
        assert_eq!(c.known(), "known stores: by-colour, by-key, rekeyed, seen");
    }
}
