//! A backlog on several partitions of one consumer is read from all of them side by
//! side, not one partition after the other. librdkafka bounds a consumer's prefetch
//! over all its partitions unless each has a queue of its own; with one shared bound the
//! partition that fetched first refilled the queue every time, so a task's records
//! waited until another task on the same consumer had read its partition to the end
//! (its lag only grew meanwhile).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use serde_json::json;

const PER_PARTITION: i64 = 40_000;

/// Records processed per task, from the worker's status.
fn processed(w: &Worker) -> BTreeMap<String, u64> {
    w.status()
        .and_then(|s| s["tasks"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|t| t["role"] == "active")
        .map(|t| (t["task"].to_string(), t["processed"].as_u64().unwrap_or(0)))
        .collect()
}

/// A worker on `threads` threads running a pass-through app at least once over `input`
/// (already filled), with `properties` as its librdkafka settings; ready.
fn pass_through(app: &str, input: &str, threads: u32, properties: &str) -> Worker {
    create_topic(
        &format!("{app}-out"),
        topic_partitions(input).unwrap() as i32,
    );
    let manifest = app_manifest(
        app,
        "at_least_once",
        &format!(
            "  source: {{topics: [{input}]}}\n  steps:\n  - map: {{value: \"value\"}}\n  sink: {{topic: {app}-out}}\n"
        ),
    )
    .replace(
        "kafka: {bootstrapServers: ",
        &format!("kafka: {{properties: {{{properties}}}, bootstrapServers: "),
    );
    let mut b = WorkerBuilder::new(manifest, &scratch_dir(app).join("state"));
    b.extra_args = vec!["--threads".into(), threads.to_string()];
    let mut w = b.spawn();
    w.wait_ready(Duration::from_secs(90));
    w
}

fn every_partition_advances_while_one_is_backlogged(threads: u32, partitions: i32) {
    let app = unique(&format!("backlog{threads}t"));
    let input = format!("{app}-in");
    create_topic(&input, partitions);
    let total = PER_PARTITION * i64::from(partitions);
    produce(
        &input,
        (0..total).map(|i| {
            let k = format!("k{}", i % 1000);
            Input::json(&k, json!({"k": k, "pad": "x".repeat(64)}))
                .partition((i % i64::from(partitions)) as i32)
        }),
    );
    // Small fetches make many rounds of the prefetch bound out of a small backlog.
    let mut w = pass_through(
        &app,
        &input,
        threads,
        "max.partition.fetch.bytes: \"16384\"",
    );
    let at_three_quarters = wait_for(
        "a task to process three quarters of its partition",
        Duration::from_secs(120),
        || {
            let p = processed(&w);
            let lead = p.values().max().copied().unwrap_or(0);
            (p.len() == partitions as usize && lead * 4 >= PER_PARTITION as u64 * 3).then_some(p)
        },
    );
    let behind = at_three_quarters.values().min().copied().unwrap_or(0);
    assert!(
        behind * 3 >= PER_PARTITION as u64,
        "{app} ({threads} thread(s), {partitions} partitions): when one task had processed \
         three quarters of its partition every other had processed at least a third of \
         its own, not waited its turn: {at_three_quarters:?}"
    );
    w.wait_committed(&input, &end_offsets(&input), Duration::from_secs(120));
    w.stop();
}

/// With librdkafka's default fetch size one fetch holds tens of thousands of small
/// records of one partition: if it landed in the consumer's shared queue, the other
/// partition's first records would wait behind all of them.
#[test]
fn a_backlog_starts_every_partition_at_once_not_one_fetch_after_another() {
    let app = unique("backlogstart");
    let input = format!("{app}-in");
    create_topic(&input, 2);
    let per_partition: i64 = 60_000;
    produce(
        &input,
        (0..per_partition * 2)
            .map(|i| Input::raw(&format!("k{}", i % 100), b"{}").partition((i % 2) as i32)),
    );
    let mut w = pass_through(&app, &input, 1, "");
    let early = wait_for(
        "a task to process 20 000 records",
        Duration::from_secs(120),
        || {
            let p = processed(&w);
            (p.len() == 2 && p.values().max().copied().unwrap_or(0) >= 20_000).then_some(p)
        },
    );
    assert!(
        early.values().all(|n| *n >= 2_000),
        "{app}: both partitions started together, not one after the other's first fetch: {early:?}"
    );
    w.wait_committed(&input, &end_offsets(&input), Duration::from_secs(120));
    w.stop();
}

#[test]
fn one_thread_reads_a_backlog_from_every_partition_side_by_side() {
    every_partition_advances_while_one_is_backlogged(1, 2);
}

#[test]
fn each_of_two_threads_reads_a_backlog_from_all_its_partitions_side_by_side() {
    every_partition_advances_while_one_is_backlogged(2, 4);
}
