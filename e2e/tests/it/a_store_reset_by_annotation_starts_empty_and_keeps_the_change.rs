//! State compatibility (issue 16, item 8) with real worker pods: a new aggregate field
//! would read the stored accumulators by position, so the operator refuses it
//! (`IncompatibleStateChange`, the workers keep counting), and `oxbow.dev/reset=<store>`
//! lets it go ahead: the workers stop, the store's changelog is deleted and re-created
//! empty, the workers move their local copy aside and count from zero with the new
//! field, from the committed source offsets (nothing reprocessed, nothing skipped).

use std::collections::BTreeMap;
use std::time::Duration;

use oxbow_e2e::harness::{apps, kubectl, wait_for};
use oxbow_e2e::streams::{RunningApp, keys, produce, read_committed, wait_exactly_once};

/// The last committed output per key.
fn last_per_key(sink: &str) -> BTreeMap<String, serde_json::Value> {
    read_committed(sink).into_iter().collect()
}

#[tokio::test]
async fn a_store_reset_by_annotation_starts_empty_and_keeps_the_change() {
    let run = RunningApp::start("reset", |a| a.replicas(2).standbys(0)).await;
    let (n, name, api) = (run.ns.name.clone(), run.name().to_string(), &run.api);
    let keys = keys(12);
    produce(&run.app.source, &keys, 3, 5);
    wait_exactly_once(&run.app.sink(), &keys, 3).await;

    // A third accumulator under the same store: refused, nothing rolled out.
    let wider = run.app.manifest().replace(
        "sum: {sum: value.amount}}",
        "sum: {sum: value.amount}, top: {max: value.amount}}",
    );
    assert_ne!(wider, run.app.manifest(), "the manifest gained a field");
    let (ok, _, err) = kubectl(&["apply", "-n", &n, "-f", "-"], Some(&wider));
    assert!(ok, "apply: {err}");
    let msg = apps::wait_stalled(api, &name, "IncompatibleStateChange").await;
    assert!(
        msg.contains("oxbow.dev/reset=totals"),
        "the message gives the reset command: {msg}"
    );
    // The workers still run the old spec: one more record per key counts 4.
    produce(&run.app.source, &keys, 1, 5);
    wait_exactly_once(&run.app.sink(), &keys, 4).await;

    // The reset: the store starts empty under the new layout.
    let (ok, _, err) = kubectl(
        &[
            "annotate",
            "sapp",
            "-n",
            &n,
            &name,
            "oxbow.dev/reset=totals",
        ],
        None,
    );
    assert!(ok, "annotate: {err}");
    wait_for(
        "the reset to finish: layout recorded, annotation removed, Ready",
        Duration::from_secs(240),
        || async {
            let app = api.get(&name).await.map_err(|e| e.to_string())?;
            let layout = app
                .status
                .as_ref()
                .and_then(|s| s.store_layouts.get("totals").cloned())
                .unwrap_or_default();
            let annotated = app
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("oxbow.dev/reset"));
            let ready = apps::condition(&app, "Ready");
            match ready {
                Some((s, _, _)) if s == "True" && layout.contains("top:max") && !annotated => {
                    Ok(())
                }
                other => Err(format!(
                    "layout {layout:?}, annotation left: {annotated}, Ready: {other:?}"
                )),
            }
        },
    )
    .await;
    let (_, events, _) = kubectl(
        &[
            "get",
            "events",
            "-n",
            &n,
            "--field-selector",
            "reason=StateReset",
            "-o",
            "name",
        ],
        None,
    );
    assert!(!events.trim().is_empty(), "a StateReset event was emitted");

    // One more record per key: counted from an empty store, with the new field; the
    // records before the reset are not processed again.
    produce(&run.app.source, &keys, 1, 7);
    let after = wait_for(
        "every key's output after the reset",
        Duration::from_secs(120),
        || async {
            let last = last_per_key(&run.app.sink());
            let fresh: Vec<_> = keys
                .iter()
                .filter(|k| last.get(*k).is_some_and(|v| v.get("top").is_some()))
                .collect();
            if fresh.len() == keys.len() {
                Ok(last)
            } else {
                Err(format!(
                    "{}/{} keys with the new field",
                    fresh.len(),
                    keys.len()
                ))
            }
        },
    )
    .await;
    for k in &keys {
        let v = &after[k];
        assert_eq!(v["count"], 1, "key {k} counts from an empty store: {v}");
        assert_eq!(v["sum"], 7, "key {k} sums only the new record: {v}");
        assert_eq!(v["top"], 7, "key {k} has the new accumulator: {v}");
    }
    run.finish().await;
}
