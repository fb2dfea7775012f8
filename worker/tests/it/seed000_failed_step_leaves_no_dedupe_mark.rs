//! Seed 000: a dedupe mark must not survive a later step's failure. A pipeline
//! `dedupe → map` whose map fails for one record: with `errors.policy: fail` the task
//! stops there; once the fault is fixed the record is processed and reaches the output
//! exactly once (a leftover mark would drop it as a duplicate). With the failure
//! permanent and `deadLetter`, it lands in the DLQ and the dedupe store never holds it.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::support::*;
use serde_json::json;

fn manifest(app: &str, policy: &str, map_value: &str) -> String {
    format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  processingGuarantee: exactly_once
  commitInterval: 100ms
  # Producers key by the id: the dedupe needs no repartition.
  source: {{topics: [{app}-in], partitionedBy: value.id}}
  steps:
  - dedupe: {{store: seen, id: value.id, within: 1h}}
  - map: {{value: "{map_value}"}}
  sink: {{topic: {app}-out}}
  errors: {{policy: {policy}}}
"#,
        bootstrap = bootstrap()
    )
}

const FAULTY: &str =
    "value.id == 'tx-7' ? value.no_such_field : {'id': value.id, 'amount': value.amount}";
const FIXED: &str = "{'id': value.id, 'amount': value.amount}";

fn inputs(app: &str) {
    let mut records: Vec<Input> = (0..20)
        .map(|i| {
            Input::json(
                &format!("tx-{i}"),
                json!({"id": format!("tx-{i}"), "amount": i}),
            )
        })
        .collect();
    // Duplicates the dedupe must drop.
    records.push(Input::json("tx-3", json!({"id": "tx-3", "amount": 3})));
    records.push(Input::json("tx-7", json!({"id": "tx-7", "amount": 7})));
    produce(&format!("{app}-in"), records);
}

fn output_ids(app: &str) -> Vec<String> {
    let mut ids: Vec<String> = read_all(&format!("{app}-out"), "read_committed")
        .iter()
        .map(|o| o.json()["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_record_whose_map_failed_is_processed_exactly_once_after_the_fault_is_fixed() {
    let app = unique("seed0-retry");
    create_topic(&format!("{app}-in"), 2);
    create_topic(&format!("{app}-out"), 2);
    inputs(&app);
    let dir = scratch_dir(&app);
    let state = dir.join("state");

    // Not ready ever: a failed task keeps /readyz at 503.
    let w = WorkerBuilder::new(manifest(&app, "fail", FAULTY), &state).spawn();
    let failed = wait_for(
        "the task holding tx-7 to fail",
        Duration::from_secs(60),
        || {
            let s = w.status()?;
            s["tasks"]
                .as_array()?
                .iter()
                .find(|t| t["state"] == "Failed")
                .cloned()
        },
    );
    let err = failed["lastError"].as_str().unwrap();
    assert!(
        err.contains("map-1") && err.contains("no_such_field"),
        "error names the step and cause: {err}"
    );
    let (code, body) = http_get(w.addr, "/readyz").unwrap();
    assert_eq!(code, 503, "a failed task makes the worker unready: {body}");
    w.stop();

    WorkerBuilder::new(manifest(&app, "fail", FIXED), &state).process_all(&format!("{app}-in"));

    let want: Vec<String> = {
        let mut v: Vec<String> = (0..20).map(|i| format!("tx-{i}")).collect();
        v.sort();
        v
    };
    assert_eq!(
        output_ids(&app),
        want,
        "every id exactly once, tx-7 included, duplicates dropped"
    );
}

#[test]
fn a_permanently_failing_record_is_dead_lettered_and_leaves_no_dedupe_mark() {
    let app = unique("seed0-dlq");
    create_topic(&format!("{app}-in"), 2);
    create_topic(&format!("{app}-out"), 2);
    inputs(&app);
    let dir = scratch_dir(&app);
    WorkerBuilder::new(manifest(&app, "deadLetter", FAULTY), &dir.join("state"))
        .process_all(&format!("{app}-in"));

    let want: Vec<String> = {
        let mut v: Vec<String> = (0..20)
            .filter(|i| *i != 7)
            .map(|i| format!("tx-{i}"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(output_ids(&app), want);

    let dlq = read_all(&format!("{app}-dlq"), "read_committed");
    assert_eq!(
        dlq.len(),
        2,
        "both tx-7 records are dead letters (no mark made the second a duplicate): {dlq:?}"
    );
    for d in &dlq {
        assert_eq!(d.key.as_deref(), Some("tx-7"));
        assert_eq!(
            d.json(),
            json!({"id": "tx-7", "amount": 7}),
            "the original bytes"
        );
        assert_eq!(d.headers["oxbow.step"], "map-1");
        assert_eq!(d.headers["oxbow.topic"], format!("{app}-in"));
        assert!(
            d.headers["oxbow.error"].contains("no_such_field"),
            "{:?}",
            d.headers
        );
        assert!(d.headers["oxbow.offset"].parse::<i64>().is_ok());
        assert!(d.headers["oxbow.partition"].parse::<i32>().is_ok());
    }
    let marks: Vec<String> = read_all(&format!("{app}-seen-changelog"), "read_committed")
        .into_iter()
        .filter_map(|o| o.key)
        .collect();
    assert!(
        marks.contains(&"ktx-3".to_string()),
        "the changelog holds the marks: {marks:?}"
    );
    assert!(
        !marks.contains(&"ktx-7".to_string()),
        "no mark for the failed record: {marks:?}"
    );
}
