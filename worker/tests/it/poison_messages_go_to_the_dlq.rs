//! Poison messages: 1% malformed JSON and 1% records that fail a CEL expression at run
//! time all land in the dead-letter topic with headers naming the error, the step and
//! the source position; every good record is processed exactly once; nothing stalls.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use crate::support::*;
use serde_json::json;

#[test]
fn malformed_and_failing_records_are_dead_lettered_and_the_rest_flow() {
    let app = unique("poison");
    let input = format!("{app}-in");
    create_topic(&input, 3);
    create_topic(&format!("{app}-out"), 3);
    let n = 10_000;
    let mut bad_json = BTreeSet::new();
    let mut bad_cel = BTreeSet::new();
    produce(
        &input,
        (0..n).map(|i| {
            let id = format!("r{i}");
            if i % 100 == 17 {
                bad_json.insert(id.clone());
                Input::raw(&id, format!("{{\"id\": \"{id}\", \"amount\": ").as_bytes())
            } else if i % 100 == 53 {
                bad_cel.insert(id.clone());
                Input::json(&id, json!({"id": id, "amount": "not a number"}))
            } else {
                Input::json(&id, json!({"id": id, "amount": i}))
            }
        }),
    );
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  source: {{topics: [{input}]}}
  steps:
  - name: double
    map: {{value: "{{'id': value.id, 'double': value.amount * 2}}"}}
  sink: {{topic: {app}-out}}
"#,
        bootstrap = bootstrap()
    );
    let dir = scratch_dir(&app);
    WorkerBuilder::new(manifest, &dir.join("state")).process_all(&input);

    let out = read_all(&format!("{app}-out"), "read_committed");
    assert_eq!(
        out.len(),
        n - bad_json.len() - bad_cel.len(),
        "every good record exactly once"
    );
    for o in &out {
        let v = o.json();
        let i: i64 = v["id"].as_str().unwrap()[1..].parse().unwrap();
        assert_eq!(v["double"], json!(i * 2));
    }
    let dlq = read_all(&format!("{app}-dlq"), "read_committed");
    let mut got_json = BTreeSet::new();
    let mut got_cel = BTreeSet::new();
    for d in &dlq {
        let id = d.key.clone().unwrap();
        let h = &d.headers;
        assert_eq!(h["oxbow.topic"], input);
        let (p, off): (i32, i64) = (
            h["oxbow.partition"].parse().unwrap(),
            h["oxbow.offset"].parse().unwrap(),
        );
        assert!((0..3).contains(&p) && off >= 0, "{h:?}");
        match h["oxbow.step"].as_str() {
            "deserialize" => {
                assert!(h["oxbow.error"].contains("invalid JSON"), "{h:?}");
                assert!(
                    d.value.as_ref().unwrap().ends_with(b"\"amount\": "),
                    "original bytes kept"
                );
                got_json.insert(id);
            }
            "double" => {
                assert!(
                    h["oxbow.error"].contains("spec.steps[0].map.value"),
                    "{h:?}"
                );
                got_cel.insert(id);
            }
            other => panic!("unexpected step {other}: {h:?}"),
        }
    }
    assert_eq!(
        got_json, bad_json,
        "every malformed record is in the DLQ once"
    );
    assert_eq!(got_cel, bad_cel, "every CEL failure is in the DLQ once");
}

#[test]
fn a_record_too_large_for_its_expressions_budget_is_dead_lettered_as_cost_exceeded() {
    let app = unique("costly");
    let input = format!("{app}-in");
    create_topic(&input, 1);
    create_topic(&format!("{app}-out"), 1);
    // Every pair of items is compared: fine on ordinary records, about 10^8 steps on
    // one with 10 000 items.
    let filter = "value.items.all(i, value.items.exists(j, j >= i))";
    let big: Vec<i64> = (0..10_000).collect();
    produce(
        &input,
        [
            Input::json("a", json!({"items": [3, 1, 2]})),
            Input::json("huge", json!({"items": big})),
            Input::json("b", json!({"items": [5]})),
        ],
    );
    let manifest = app_manifest(
        &app,
        "exactly_once",
        &format!(
            "  source: {{topics: [{input}]}}\n  steps:\n  - name: pairs\n    filter: {{cel: \"{filter}\"}}\n  sink: {{topic: {app}-out}}\n"
        ),
    );
    let dir = scratch_dir(&app);
    WorkerBuilder::new(manifest, &dir.join("state")).process_all(&input);
    let out: Vec<String> = read_all(&format!("{app}-out"), "read_committed")
        .into_iter()
        .map(|o| o.key.unwrap())
        .collect();
    assert_eq!(out, ["a", "b"], "the records around the costly one flow");
    let dlq = read_all(&format!("{app}-dlq"), "read_committed");
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    let h = &dlq[0].headers;
    assert_eq!(dlq[0].key.as_deref(), Some("huge"));
    assert_eq!(h["oxbow.step"], "pairs");
    assert!(
        h["oxbow.error"].starts_with("CostExceeded: ")
            && h["oxbow.error"].contains("10000 elements"),
        "{h:?}"
    );
}
