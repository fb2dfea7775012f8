//! Restore: a restart with the state dir kept restores only the tail (at most one unit
//! of work: RocksDB is written right after every Kafka commit); with the state dir
//! deleted, a full restore bulk-loads the changelog into state equal, by digest, to
//! what was there before.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use serde_json::json;

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

/// A fresh app counting and summing `records` inputs over [`KEYS`] keys in two
/// partitions: its name, input topic, scratch dir, state dir and worker.
fn totals_app(
    prefix: &str,
    records: i64,
) -> (
    String,
    String,
    std::path::PathBuf,
    std::path::PathBuf,
    WorkerBuilder,
) {
    let app = unique(prefix);
    let input = format!("{app}-in");
    create_topic(&input, 2);
    produce(
        &input,
        (0..records).map(|i| {
            Input::json(
                &format!("k{}", i % KEYS),
                json!({"k": format!("k{}", i % KEYS), "amount": i % 1000}),
            )
        }),
    );
    let dir = scratch_dir(&app);
    let state = dir.join("state");
    let builder = WorkerBuilder::new(manifest(&app), &state);
    (app, input, dir, state, builder)
}

#[test]
fn a_restart_restores_the_tail_and_a_lost_volume_is_rebuilt_equal_by_digest() {
    let (_, input, dir, state, builder) = totals_app("restore", 40_000);

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

/// The metric line counting moved-aside directories of `task` for `reason`, if any.
fn quarantined(w: &Worker, task: &str, reason: &str) -> Option<String> {
    let (_, body) = http_get(w.addr, "/metrics")?;
    body.lines()
        .find(|l| {
            l.starts_with("oxbow_worker_state_quarantined_total")
                && l.contains(&format!("task=\"{task}\""))
                && l.contains(&format!("reason=\"{reason}\""))
        })
        .map(str::to_string)
}

#[test]
fn a_swapped_and_a_corrupted_state_directory_are_moved_aside_and_rebuilt_equal() {
    let (app, input, dir, state, builder) = totals_app("quarantine", 10_000);
    builder.process_all(&input);
    let cfg = dir.join("app-0.yaml");
    let before = digests(&cfg, &state);
    assert_eq!(before.len(), 2, "two tasks with one store each: {before:?}");
    let tasks = state.join(&app);
    let quarantine = tasks.join("quarantine");

    // Swapped by hand: each directory now holds the other task's keys.
    std::fs::rename(tasks.join("0_0"), tasks.join("swap")).unwrap();
    std::fs::rename(tasks.join("0_1"), tasks.join("0_0")).unwrap();
    std::fs::rename(tasks.join("swap"), tasks.join("0_1")).unwrap();
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(120));
    for t in w.status().unwrap()["tasks"].as_array().unwrap() {
        let mode = t["restore"]["mode"].as_str().unwrap();
        assert!(
            mode.starts_with("full"),
            "task {}: another task's directory is not its state: {mode}",
            t["task"]
        );
    }
    for task in ["0_0", "0_1"] {
        assert!(
            quarantined(&w, task, "foreign").is_some(),
            "task {task}: the swap is counted as foreign state\n{}",
            w.logs()
        );
    }
    assert!(
        w.logs().contains("holds the state of application"),
        "the log says whose state it found"
    );
    w.stop();
    assert_eq!(digests(&cfg, &state), before, "rebuilt from the changelog");
    assert_eq!(
        std::fs::read_dir(&quarantine).unwrap().count(),
        2,
        "both directories kept aside, not deleted"
    );

    // Corrupted: RocksDB cannot even open it. No crash loop: moved aside, rebuilt.
    std::fs::write(tasks.join("0_0").join("CURRENT"), b"not a manifest name").unwrap();
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(120));
    assert!(
        quarantined(&w, "0_0", "unreadable").is_some(),
        "the corrupted directory is counted\n{}",
        w.logs()
    );
    w.stop();
    assert_eq!(digests(&cfg, &state), before, "rebuilt from the changelog");
    assert_eq!(std::fs::read_dir(&quarantine).unwrap().count(), 3);
}

#[test]
fn a_state_directory_found_corrupted_after_it_opened_is_moved_aside_at_the_next_start() {
    let (app, input, dir, state, builder) = totals_app("corrupt", 10_000);
    builder.process_all(&input);
    // A full restore bulk-loads the stores from SST files: the state is on disk.
    std::fs::remove_dir_all(&state).unwrap();
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(120));
    w.stop();
    let task_dir = state.join(&app).join("0_0");
    let ssts: Vec<_> = std::fs::read_dir(&task_dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sst"))
        .collect();
    assert!(!ssts.is_empty(), "task 0_0 keeps SST files");
    // Flip bytes in the first data block of each: RocksDB opens the directory (footer
    // and index are intact) and fails the block's checksum when it reads it.
    for f in &ssts {
        let mut b = std::fs::read(f).unwrap();
        for x in b.iter_mut().skip(16).take(64) {
            *x ^= 0xff;
        }
        std::fs::write(f, b).unwrap();
    }
    // Another record for every key: processing them reads the corrupted block.
    produce(
        &input,
        (0..KEYS)
            .map(|i| Input::json(&format!("k{i}"), json!({"k": format!("k{i}"), "amount": 1}))),
    );
    let mut w = builder.spawn();
    let deadline = Deadline::after(Duration::from_secs(120));
    while w.exited().is_none() {
        deadline.next_poll(Duration::from_millis(200), || {
            format!("the worker went on over a corrupted block\n{}", w.logs())
        });
    }
    assert!(
        w.logs().contains("corrupted"),
        "the worker says why it stopped\n{}",
        w.logs()
    );
    assert!(
        task_dir.join("OXBOW-CORRUPTED").exists(),
        "the directory is marked for the next start"
    );

    // The next start moves it aside and rebuilds it: no crash loop.
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(120));
    assert!(
        quarantined(&w, "0_0", "corrupted").is_some(),
        "the corrupted directory is counted\n{}",
        w.logs()
    );
    w.wait_committed(&input, &end_offsets(&input), Duration::from_secs(120));
    w.stop();
    let cfg = dir.join("app-0.yaml");
    let after = digests(&cfg, &state);
    // Equal to the state rebuilt from the changelog alone.
    std::fs::remove_dir_all(&state).unwrap();
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(120));
    w.stop();
    assert_eq!(digests(&cfg, &state), after, "rebuilt from the changelog");
}

#[test]
fn exactly_once_without_group_offsets_resumes_after_the_restored_state_not_from_the_start() {
    let app = unique("nooffsets");
    let input = format!("{app}-in");
    let out = format!("{app}-out");
    create_topic(&input, 2);
    create_topic(&out, 2);
    let manifest = format!(
        "{}  sink: {{topic: {out}}}\n",
        manifest(&app).replace(
            "fields: {n: {count: {}}",
            "emit: onUpdate\n      fields: {n: {count: {}}"
        )
    );
    let feed = |from: i64, to: i64| {
        produce(
            &input,
            (from..to).map(|i| {
                Input::json(
                    &format!("k{}", i % 50),
                    json!({"k": format!("k{}", i % 50), "amount": 1}),
                )
            }),
        )
    };
    let dir = scratch_dir(&app);
    let state = dir.join("state");
    let builder = WorkerBuilder::new(manifest, &state);
    feed(0, 1_000);
    builder.process_all(&input);

    // The group's offsets are gone (expired while stopped, or deleted), and so is the
    // volume: only the changelog knows how far the state got.
    delete_group(&app);
    std::fs::remove_dir_all(&state).unwrap();
    feed(1_000, 1_500);
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(120));
    wait_for(
        "every key's count to reach 30 (1 500 records over 50 keys)",
        Duration::from_secs(120),
        || {
            assert!(w.exited().is_none(), "worker exited:\n{}", w.logs());
            let mut last = BTreeMap::new();
            for o in read_all(&out, "read_committed") {
                let v = o.json();
                last.insert(
                    v["key"].as_str().unwrap().to_string(),
                    v["n"].as_i64().unwrap(),
                );
            }
            assert!(
                last.values().all(|n| *n <= 30),
                "a record was counted twice on top of the restored state: {last:?}\n{}",
                w.logs()
            );
            (last.len() == 50 && last.values().all(|n| *n == 30)).then_some(())
        },
    );
    assert!(
        w.logs()
            .contains("resuming after the last source offset the restored changelog holds"),
        "the log says where it resumed and why"
    );
    w.stop();
}
