//! What each store's bytes mean, as a short text per store (its layout), and which spec
//! changes would make the stored data mean something else.
//!
//! An aggregate keeps its accumulators by position, in the order of its field names, so
//! adding, removing or renaming a field, or changing one's kind, shifts every stored
//! value silently; a window of another kind (or none) reads the stored windows wrongly;
//! a store name taken over by another kind of step reads another step's bytes. The
//! operator records the layouts it rolled out (`status.storeLayouts`) and refuses a
//! spec whose layouts differ for a store that keeps its name (`IncompatibleStateChange`).
//! Compatible changes (filters, maps, sinks, window sizes, grace, a new store) roll out
//! as usual.
//!
//! Pure: no I/O.

use std::collections::BTreeMap;

use crate::streamapp::{AggregateField, Step, StreamAppSpec};
use crate::validate::step_store;

/// The layout of every store the spec's steps keep, by store name.
pub fn store_layouts(spec: &StreamAppSpec) -> BTreeMap<String, String> {
    spec.steps
        .iter()
        .filter_map(|s| Some((step_store(s)?.0, layout(s)?)))
        .collect()
}

fn layout(step: &Step) -> Option<String> {
    if step.dedupe.is_some() {
        return Some("dedupe".into());
    }
    if step.batch.is_some() {
        return Some("batch".into());
    }
    if step.join.as_ref().is_some_and(|j| j.stream.is_some()) {
        return Some("stream-join".into());
    }
    let a = step.aggregate.as_ref()?;
    let window = match &a.window {
        None => "none",
        Some(w) if w.tumbling.is_some() => "tumbling",
        Some(w) if w.hopping.is_some() => "hopping",
        Some(w) if w.session.is_some() => "session",
        Some(_) => "unknown",
    };
    // The accumulators are stored in this order (the field map's).
    let fields: Vec<String> = a
        .fields
        .iter()
        .map(|(name, f)| format!("{name}:{}", kind(f)))
        .collect();
    Some(format!(
        "aggregate window={window} fields={}",
        fields.join(",")
    ))
}

fn kind(f: &AggregateField) -> &'static str {
    if f.count.is_some() {
        "count"
    } else if f.sum.is_some() {
        "sum"
    } else if f.min.is_some() {
        "min"
    } else if f.max.is_some() {
        "max"
    } else if f.avg.is_some() {
        "avg"
    } else if f.last.is_some() {
        "last"
    } else {
        "unknown"
    }
}

/// A store whose stored data would mean something else under the new spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutChange {
    pub store: String,
    pub was: String,
    pub now: String,
}

/// The stores kept under the same name whose layout changed. Stores that are new or
/// gone are not changes: a new store starts empty, a dropped one is left alone.
pub fn incompatible(
    recorded: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> Vec<LayoutChange> {
    wanted
        .iter()
        .filter_map(|(store, now)| {
            let was = recorded.get(store)?;
            (was != now).then(|| LayoutChange {
                store: store.clone(),
                was: was.clone(),
                now: now.clone(),
            })
        })
        .collect()
}

/// The message of `IncompatibleStateChange`: what changed and the ways out.
pub fn message(changes: &[LayoutChange]) -> String {
    let what: Vec<String> = changes
        .iter()
        .map(|c| {
            format!(
                "store {:?} holds \"{}\" but the spec now needs \"{}\"",
                c.store, c.was, c.now
            )
        })
        .collect();
    format!(
        "{}: its stored values would be read as something else (an aggregate's accumulators are stored by position). Nothing was rolled out; the workers keep running the previous spec. Either give the step a new store name (its state starts empty; the old changelog stays until you delete it), or revert the change",
        what.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(steps: &str) -> StreamAppSpec {
        let app: crate::StreamApp = serde_yaml::from_str(&format!(
            "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {{name: t}}\nspec:\n  kafka: {{bootstrapServers: \"k:9092\"}}\n  source: {{topics: [in]}}\n  steps:\n{steps}"
        ))
        .expect("valid manifest");
        app.spec
    }

    const BASE: &str = "  - dedupe: {store: seen, id: value.id, within: 1h}\n  - aggregate: {store: per-user, groupBy: value.u, window: {tumbling: 10m}, fields: {n: {count: {}}, total: {sum: value.a}}}\n";

    #[test]
    fn a_new_aggregate_field_is_an_incompatible_change_of_that_store_only() {
        let before = store_layouts(&spec(BASE));
        let after = store_layouts(&spec(
            &BASE.replace("fields: {n:", "fields: {avg: {avg: value.a}, n:"),
        ));
        let changes = incompatible(&before, &after);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].store, "per-user");
        assert!(message(&changes).contains("new store name"));
    }

    #[test]
    fn filters_sinks_window_sizes_and_new_stores_are_compatible() {
        let before = store_layouts(&spec(BASE));
        let after = store_layouts(&spec(&format!(
            "  - filter: {{cel: \"value.a > 0\"}}\n{}  - dedupe: {{store: other, id: value.x, within: 1m}}\n",
            BASE.replace("tumbling: 10m", "tumbling: 1h")
        )));
        assert_eq!(incompatible(&before, &after), vec![]);
    }

    #[test]
    fn another_window_kind_or_step_kind_under_one_store_name_is_incompatible() {
        let before = store_layouts(&spec(BASE));
        let session = BASE.replace("tumbling: 10m", "session: {gap: 5m}");
        assert_eq!(
            incompatible(&before, &store_layouts(&spec(&session))).len(),
            1
        );
        let swapped = BASE
            .replace("store: seen", "store: tmp")
            .replace("store: per-user", "store: seen");
        let changes = incompatible(&before, &store_layouts(&spec(&swapped)));
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].was, "dedupe");
    }
}
