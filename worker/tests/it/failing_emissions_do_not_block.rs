//! A step after an `aggregate` that fails on one emitted window dead-letters that
//! window alone (flagged `oxbow.emitted`); the record whose arrival closed it is not
//! blamed, the window is not emitted again with every later record, and the partition
//! keeps flowing.
#![allow(clippy::unwrap_used)]

use crate::support::*;
use serde_json::json;

#[test]
fn a_window_a_later_step_rejects_is_dead_lettered_alone_and_the_rest_flow() {
    let app = unique("emission");
    let input = format!("{app}-in");
    create_topic(&input, 1);
    create_topic(&format!("{app}-out"), 1);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let base = (now - 3_600_000) / 60_000 * 60_000;
    let keys = ["good1", "good2", "bad"];
    let mut events: Vec<Input> = (0..60)
        .map(|i| {
            let k = keys[i % 3];
            Input::json(k, json!({"k": k, "ts": base + i as i64 * 1_000}))
        })
        .collect();
    // Moves stream time past every window above.
    events.push(Input::json(
        "good1",
        json!({"k": "good1", "ts": base + 1_000_000}),
    ));
    produce(&input, events);
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  source: {{topics: [{input}], timestamp: value.ts}}
  steps:
  - aggregate:
      store: w
      groupBy: value.k
      window: {{tumbling: 10s}}
      emit: onWindowClose
      fields: {{n: {{count: {{}}}}}}
  - map: {{value: "value.key == 'bad' ? value.no_such_field : value"}}
  sink: {{topic: {app}-out}}
"#,
        bootstrap = bootstrap()
    );
    let dir = scratch_dir(&app);
    WorkerBuilder::new(manifest, &dir.join("state")).process_all(&input);

    let out = read_all(&format!("{app}-out"), "read_committed");
    assert_eq!(out.len(), 12, "6 windows each for good1 and good2: {out:?}");
    assert!(out.iter().all(|o| o.json()["key"] != "bad"));
    assert_eq!(
        out.iter()
            .map(|o| o.json()["n"].as_i64().unwrap())
            .sum::<i64>(),
        40,
        "every good event counted once"
    );
    let dlq = read_all(&format!("{app}-dlq"), "read_committed");
    assert_eq!(
        dlq.len(),
        6,
        "each bad window once, not once per later record: {dlq:?}"
    );
    for d in &dlq {
        assert_eq!(d.headers["oxbow.emitted"], "true");
        assert_eq!(d.headers["oxbow.step"], "map-1");
        assert_eq!(
            d.json()["key"],
            "bad",
            "the emitted window, not the triggering record"
        );
    }
}
