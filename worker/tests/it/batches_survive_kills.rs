//! Seed 004: 10 000 records in batches of 1 000, the worker SIGKILLed mid-batch twice.
//! The batch topic holds exactly 10 batches whose ids are contiguous, non-overlapping
//! source offset ranges, each with its 1 000 records in order, and two independent
//! consumers see identical batches.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::support::*;
use serde_json::json;

#[test]
fn ten_thousand_records_make_ten_identical_batches_despite_two_kills() {
    let app = unique("batch");
    let input = format!("{app}-in");
    create_topic(&input, 1);
    create_topic(&format!("{app}-out"), 1);
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  source: {{topics: [{input}]}}
  steps:
  - batch: {{store: open, size: 1000, maxWait: 1h}}
  sink: {{topic: {app}-out}}
"#,
        bootstrap = bootstrap()
    );
    let dir = scratch_dir(&app);
    let builder = WorkerBuilder::new(manifest, &dir.join("state"));
    let feed = |from: i64, to: i64| {
        produce(
            &input,
            (from..to).map(|i| Input::json(&format!("r{i}"), json!({"i": i}))),
        );
    };

    // Kill with 500 records of a batch buffered, then with 200.
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(60));
    feed(0, 2_500);
    w.wait_committed(&input, &end_offsets(&input), Duration::from_secs(60));
    w.kill9();
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(60));
    feed(2_500, 6_200);
    w.wait_committed(&input, &end_offsets(&input), Duration::from_secs(60));
    w.kill9();
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(60));
    feed(6_200, 10_000);
    w.wait_committed(&input, &end_offsets(&input), Duration::from_secs(60));
    w.stop();

    let first = read_all(&format!("{app}-out"), "read_committed");
    let second = read_all(&format!("{app}-out"), "read_committed");
    assert_eq!(first, second, "two consumers see identical batches");
    assert_eq!(first.len(), 10, "exactly 10 batches");
    for (n, b) in first.iter().enumerate() {
        let v = b.json();
        let (lo, hi) = (n as i64 * 1000, n as i64 * 1000 + 999);
        assert_eq!(v["batchId"], json!(format!("{input}-0-{lo}-{hi}")));
        assert_eq!(
            (v["firstOffset"].as_i64(), v["lastOffset"].as_i64()),
            (Some(lo), Some(hi))
        );
        let records = v["records"].as_array().unwrap();
        let offsets: Vec<i64> = records
            .iter()
            .map(|r| r["offset"].as_i64().unwrap())
            .collect();
        assert_eq!(
            offsets,
            (lo..=hi).collect::<Vec<_>>(),
            "batch {n} holds its offsets once each, in order"
        );
        assert!(
            records.iter().all(|r| r["value"]["i"] == r["offset"]),
            "batch {n} holds the right records"
        );
    }
}
