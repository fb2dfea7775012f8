//! The broker dies mid-stream (SIGKILL) and comes back. The worker either rides it out
//! (librdkafka reconnects, the transaction commits late) or fails its commit and exits;
//! a supervisor (here the test, in a cluster the kubelet) restarts it. Either way the
//! committed output is exact: every key's running count goes 1, 2, …, n with no gap
//! and no repeat.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use serde_json::json;

const RECORDS: i64 = 60_000;
const KEYS: i64 = 20;

fn restart_broker() {
    let run = std::path::PathBuf::from(std::env::var("HOME").unwrap())
        .join(".cache/oxbow/stack/run/kafka.pid");
    let run = std::env::var("OXBOW_CACHE")
        .map(|c| std::path::PathBuf::from(c).join("stack/run/kafka.pid"))
        .unwrap_or(run);
    let pid: i32 = std::fs::read_to_string(&run)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for("the broker process to die", Duration::from_secs(30), || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            .is_err()
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(2)); // an outage, not a blip
    let up = format!("{}/../e2e/stack/up.sh", manifest_dir());
    let st = std::process::Command::new("bash")
        .arg(&up)
        .status()
        .unwrap();
    assert!(
        st.success(),
        "the local stack did not come back up after the broker kill"
    );
}

#[test]
fn a_broker_killed_mid_stream_leaves_exactly_once_output_exact() {
    let app = unique("broker");
    let input = format!("{app}-in");
    create_topic(&input, 2);
    create_topic(&format!("{app}-out"), 2);
    produce(
        &input,
        (0..RECORDS).map(|i| {
            let k = format!("k{}", i % KEYS);
            Input::json(&k, json!({"k": k, "amount": i % 7}))
        }),
    );
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  processingGuarantee: exactly_once
  # Producers key by k: the aggregate needs no repartition.
  source: {{topics: [{input}], partitionedBy: value.k}}
  steps:
  - aggregate:
      store: totals
      groupBy: value.k
      fields: {{count: {{count: {{}}}}, sum: {{sum: value.amount}}}}
  sink: {{topic: {app}-out}}
"#,
        bootstrap = bootstrap()
    );
    let dir = scratch_dir(&app);
    let builder = WorkerBuilder::new(manifest, &dir.join("state"));
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(60));
    wait_for(
        "the worker to process some records",
        Duration::from_secs(60),
        || (w.handled().unwrap_or(0) > 1_000).then_some(()),
    );
    restart_broker();

    let ends = end_offsets(&input);
    let deadline = Deadline::after(Duration::from_secs(300));
    let mut restarts = 0;
    loop {
        if w.exited().is_some() {
            restarts += 1;
            assert!(
                restarts <= 5,
                "the worker keeps failing after the broker is back; log:\n{}",
                w.logs()
            );
            w = builder.spawn();
        } else if w.status().is_some_and(|s| {
            s["tasks"].as_array().is_some_and(|ts| {
                ts.len() == 2
                    && ts.iter().all(|t| {
                        let (_, p) = task_id(t).unwrap();
                        t["positions"][&input].as_i64().unwrap_or(0) >= ends[&p]
                    })
            })
        }) {
            break;
        }
        deadline.next_poll(Duration::from_millis(200), || {
            format!(
                "the worker did not finish after the broker restart ({restarts} restarts); log:\n{}",
                w.logs()
            )
        });
    }
    w.stop();

    let mut updates: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for o in read_all(&format!("{app}-out"), "read_committed") {
        let v = o.json();
        updates
            .entry(v["key"].as_str().unwrap().to_string())
            .or_default()
            .push((v["count"].as_i64().unwrap(), v["sum"].as_i64().unwrap()));
    }
    assert_eq!(updates.len() as i64, KEYS);
    for (k, u) in &updates {
        let n = RECORDS / KEYS;
        let counts: Vec<i64> = u.iter().map(|x| x.0).collect();
        assert_eq!(
            counts,
            (1..=n).collect::<Vec<_>>(),
            "{k}: one committed update per record, in order"
        );
        let idx: i64 = k[1..].parse().unwrap();
        let want: i64 = (0..RECORDS)
            .filter(|i| i % KEYS == idx)
            .map(|i| i % 7)
            .sum();
        assert_eq!(u.last().unwrap().1, want, "{k}: final sum");
    }
}

/// This crate's directory. Cargo sets `CARGO_MANIFEST_DIR` when it runs a test too, and
/// that value is the checkout being tested: the compile-time one is wherever the binary
/// was built, and a target directory shared by two checkouts (CI's clone and a working
/// copy) hands one checkout's test binaries to the other when the sources match.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}
