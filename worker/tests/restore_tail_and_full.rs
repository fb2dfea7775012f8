//! Restore: a restart with the state dir kept restores only the tail (at most one unit
//! of work: RocksDB is written right after every Kafka commit); with the state dir
//! deleted, a full restore bulk-loads the changelog into state equal, by digest, to
//! what was there before.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

const KEYS: i64 = 2_000;

fn manifest(app: &str) -> String {
    format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  processingGuarantee: exactly_once
  # Producers key by k: the aggregate needs no repartition.
  source: {{topics: [{app}-in], partitionedBy: value.k}}
  steps:
  - aggregate:
      store: totals
      groupBy: value.k
      fields: {{n: {{count: {{}}}}, total: {{sum: value.amount}}, top: {{max: value.amount}}}}
"#,
        bootstrap = bootstrap()
    )
}

#[test]
fn a_restart_restores_the_tail_and_a_lost_volume_is_rebuilt_equal_by_digest() {
    let app = unique("restore");
    let input = format!("{app}-in");
    create_topic(&input, 2);
    produce(
        &input,
        (0..40_000).map(|i| {
            Input::json(
                &format!("k{}", i % KEYS),
                json!({"k": format!("k{}", i % KEYS), "amount": i % 1000}),
            )
        }),
    );
    let dir = scratch_dir(&app);
    let state = dir.join("state");
    let builder = WorkerBuilder::new(manifest(&app), &state);

    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(60));
    w.wait_committed(&input, &end_offsets(&input), Duration::from_secs(120));
    w.kill9();

    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(60));
    let status = w.status().unwrap();
    for t in status["tasks"].as_array().unwrap() {
        let r = &t["restore"];
        let mode = r["mode"].as_str().unwrap();
        assert!(
            mode == "tail" || mode == "upToDate",
            "task {}: a kept state dir restores the tail only, got {r}",
            t["task"]
        );
        assert!(
            r["restored"].as_u64().unwrap() <= KEYS as u64,
            "task {}: at most one unit of work (one record per dirty key) is replayed, got {r}",
            t["task"]
        );
    }
    w.stop();
    let cfg = dir.join("app-0.yaml");
    let before = digests(&cfg, &state);
    assert_eq!(before.len(), 2, "two tasks with one store each: {before:?}");

    std::fs::remove_dir_all(&state).unwrap();
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(120));
    let status = w.status().unwrap();
    let mut restored = 0;
    for t in status["tasks"].as_array().unwrap() {
        let r = &t["restore"];
        assert!(
            r["mode"].as_str().unwrap().starts_with("full"),
            "a deleted state dir means a full restore: {r}"
        );
        assert!(
            r["ingestedFiles"].as_u64().unwrap() >= 1,
            "an empty store is bulk-loaded from SST files: {r}"
        );
        restored += r["restored"].as_u64().unwrap();
    }
    assert!(
        restored >= KEYS as u64,
        "every key came back from the changelog ({restored})"
    );
    w.stop();
    assert_eq!(
        digests(&cfg, &state),
        before,
        "rebuilt state equals the state before the loss"
    );
}
