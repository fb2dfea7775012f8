//! Processing threads (`--threads`): a worker spreads its active tasks over its threads,
//! each task on one thread, and the results are those of one thread: exactly once,
//! through a repartition, a SIGKILL mid-work and restarts on other thread counts lose
//! and repeat nothing.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use serde_json::json;

const RECORDS: i64 = 40_000;
const KEYS: i64 = 200;

fn manifest(app: &str) -> String {
    exactly_once_app(
        app,
        &format!(
            r#"
  source: {{topics: [{app}-in]}}
  steps:
  - aggregate:
      store: totals
      groupBy: value.k
      fields: {{count: {{count: {{}}}}, sum: {{sum: value.amount}}}}
  sink: {{topic: {app}-out}}
"#
        ),
    )
}

/// The threads the worker's status names for its active tasks, per task.
fn threads_of(w: &Worker) -> BTreeMap<String, Option<u64>> {
    w.status()
        .and_then(|s| s["tasks"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|t| t["role"] == "active")
        .map(|t| (t["task"].to_string(), t["thread"].as_u64()))
        .collect()
}

#[test]
fn two_threads_share_the_tasks_and_a_sigkill_loses_and_repeats_nothing() {
    let app = unique("threads");
    let input = format!("{app}-in");
    create_topic(&input, 4);
    create_topic(&format!("{app}-out"), 4);
    // Keyed by the grouping field: each key's records are in one partition, in order.
    produce(
        &input,
        (0..RECORDS).map(|i| {
            let k = format!("k{}", i % KEYS);
            Input::json(&k, json!({"k": k, "amount": i % 13}))
        }),
    );
    let dir = scratch_dir(&app);
    let mut two = WorkerBuilder::new(manifest(&app), &dir.join("state"));
    two.extra_args = vec!["--threads".into(), "2".into()];

    let mut w = two.spawn();
    w.wait_ready(Duration::from_secs(90));
    let threads = wait_for(
        "the eight active tasks (two stages: groupBy repartitions) to name their thread",
        Duration::from_secs(30),
        || {
            let t = threads_of(&w);
            (t.len() == 8 && t.values().all(Option::is_some)).then_some(t)
        },
    );
    let mut per_thread = BTreeMap::new();
    for k in threads.values().flatten() {
        *per_thread.entry(*k).or_insert(0) += 1;
    }
    assert_eq!(
        per_thread,
        BTreeMap::from([(0, 4), (1, 4)]),
        "four tasks on each of the two threads: {threads:?}"
    );
    // Killed mid-work: some records handled, not all.
    wait_for(
        "the worker to handle some records before the kill",
        Duration::from_secs(60),
        || w.handled().filter(|n| *n > 0).map(|_| ()),
    );
    let at_kill = w.handled();
    w.kill9();

    // A restart on four threads, then one: a task's thread is no part of its state.
    let mut four = WorkerBuilder::new(manifest(&app), &dir.join("state"));
    four.extra_args = vec!["--threads".into(), "4".into()];
    let mut w = four.spawn();
    w.wait_ready(Duration::from_secs(90));
    w.kill9();
    four.extra_args = vec!["--threads".into(), "1".into()];
    four.process_all(&input);

    let out = read_all(&format!("{app}-out"), "read_committed");
    let mut counts: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut sums: BTreeMap<String, i64> = BTreeMap::new();
    for o in &out {
        let v = o.json();
        let k = v["key"].as_str().unwrap().to_string();
        counts
            .entry(k.clone())
            .or_default()
            .push(v["count"].as_i64().unwrap());
        sums.insert(k, v["sum"].as_i64().unwrap());
    }
    assert_eq!(counts.len() as i64, KEYS, "{app}: every key has output");
    for (k, c) in &counts {
        let n = c.len() as i64;
        assert_eq!(
            c,
            &(1..=n).collect::<Vec<_>>(),
            "{app}: updates of {k} count 1..={n} with no loss or repeat (handled at the kill: {at_kill:?})"
        );
        assert_eq!(n, RECORDS / KEYS, "{app}: every record of {k} counted once");
        let i: i64 = k[1..].parse().unwrap();
        let want: i64 = (0..RECORDS).filter(|j| j % KEYS == i).map(|j| j % 13).sum();
        assert_eq!(sums[k], want, "{app}: final sum of {k}");
    }
    assert_eq!(
        out.len() as i64,
        RECORDS,
        "one committed update per input record"
    );
}

#[test]
fn zero_threads_is_refused_with_a_clear_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oxbow-worker"))
        .args(["run", "--config", "/nonexistent.yaml", "--threads", "0"])
        .output()
        .expect("run oxbow-worker");
    assert!(!out.status.success(), "--threads 0 must fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--threads"), "the error names the flag: {err}");
}
