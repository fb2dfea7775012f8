//! Tables, stream–table joins and several outputs, against the real broker.
//!
//! - A co-partitioned table joined by a field the stream is not keyed by: the stream is
//!   repartitioned by the lookup key, the table is read by the join's stage from its own
//!   topic, and every payment is enriched with the row current when it was processed:
//!   the first limits, then (once the table's update is read) the new ones. With
//!   SIGKILLs under exactly-once every payment comes out once. Then the state volume is
//!   lost and the table store comes back from the table's topic, answering queries from
//!   every worker.
//! - A global table with another partition count: no repartition, loaded before any
//!   record is processed, and following updates while running.
//! - `to` steps branching to three topics under exactly-once with kills: each record in
//!   exactly the right topic once; a `topicExpr` naming a missing topic dead-letters the
//!   record with the topic in the reason.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const PARTITIONS: i32 = 4;
const USERS: i64 = 10;

fn user(i: i64) -> String {
    format!("user-{:02}", i % USERS)
}

/// `n` payments from `from`, keyed by their own id (so a user's payments are on every
/// partition); `ghost` payments belong to a user the table does not have.
fn payments(from: i64, n: i64) -> Vec<Input> {
    (from..from + n)
        .map(|i| {
            let tx = format!("tx-{i}");
            let u = if i % 25 == 0 {
                "ghost".to_string()
            } else {
                user(i)
            };
            Input::json(&tx, json!({"txId": tx, "userId": u, "amount": i % 97}))
        })
        .collect()
}

fn limits(generation: i64) -> Vec<Input> {
    (0..USERS)
        .map(|u| Input::json(&user(u), json!({"limit": 1000 * generation + u})))
        .collect()
}

fn join_manifest(app: &str, input: &str, table: &str, sink: &str, global: bool) -> String {
    format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  processingGuarantee: exactly_once
  commitInterval: 100ms
  source: {{topics: [{input}]}}
  tables:
  - {{name: users, topic: {table}, global: {global}}}
  steps:
  - join:
      table: users
      key: value.userId
      type: left
      value: '{{"txId": value.txId, "userId": value.userId, "limit": other == null ? -1 : other.limit}}'
  sink: {{topic: {sink}}}
"#,
        bootstrap = bootstrap()
    )
}

/// txId → the limits it came out with (one entry per output record).
fn enriched(out: &[Out]) -> BTreeMap<String, Vec<i64>> {
    let mut m: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for o in out {
        let v = o.json();
        m.entry(v["txId"].as_str().unwrap().to_string())
            .or_default()
            .push(v["limit"].as_i64().unwrap());
    }
    m
}

/// The limit payment `i` must carry when the table holds `generation`.
fn want_limit(i: i64, generation: i64) -> i64 {
    if i % 25 == 0 {
        -1
    } else {
        1000 * generation + i % USERS
    }
}

#[test]
fn a_stream_keyed_differently_from_its_table_is_joined_with_the_latest_row_through_kills() {
    let app = unique("join");
    let (input, table, sink) = (
        format!("{app}-payments"),
        format!("{app}-users"),
        format!("{app}-out"),
    );
    create_topic(&input, PARTITIONS);
    create_topic(&table, PARTITIONS);
    create_topic(&sink, PARTITIONS);
    produce(&table, limits(1));
    let manifest = join_manifest(&app, &input, &table, &sink, false);
    let dir = scratch_dir(&app);
    let mut fleet = Fleet::new(&manifest, &dir, 2, true);
    assert_eq!(
        fleet.builders[0].repartition_topics(),
        vec![(1, format!("{app}-join-users-repartition"))],
        "payments keyed by txId are repartitioned by userId before the join"
    );
    fleet.start_missing();
    // The join's stage has read the first limits.
    wait_stage_committed(
        &mut fleet.running(),
        1,
        &table,
        &end_offsets(&table),
        Duration::from_secs(60),
    );

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (first, second) = (400, 400);
    let gen_a = {
        let input = input.clone();
        std::thread::spawn(move || {
            for c in 0..8 {
                produce(&input, payments(c * first / 8, first / 8));
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(300 + rng.next(900)));
        fleet.kill9(round % 2);
        fleet.start_missing();
    }
    gen_a.join().unwrap();
    let out = read_until(
        &sink,
        "read_committed",
        "every first payment joined",
        Duration::from_secs(120),
        |o| enriched(o).len() as i64 >= first,
    );
    for (tx, limits) in enriched(&out) {
        let i: i64 = tx.trim_start_matches("tx-").parse().unwrap();
        assert_eq!(
            limits,
            vec![want_limit(i, 1)],
            "{tx} must come out once with the first limit"
        );
    }

    // The table changes while the app runs; once the join's stage has read the change,
    // later payments see the new rows.
    produce(&table, limits(2));
    wait_stage_committed(
        &mut fleet.running(),
        1,
        &table,
        &end_offsets(&table),
        Duration::from_secs(60),
    );
    let gen_b = {
        let input = input.clone();
        std::thread::spawn(move || produce(&input, payments(first, second)))
    };
    std::thread::sleep(Duration::from_millis(200 + rng.next(500)));
    fleet.kill9(0);
    fleet.kill9(1);
    fleet.start_missing();
    gen_b.join().unwrap();
    let out = read_until(
        &sink,
        "read_committed",
        "every payment joined",
        Duration::from_secs(120),
        |o| enriched(o).len() as i64 >= first + second,
    );
    let got = enriched(&out);
    assert_eq!(
        got.len() as i64,
        first + second,
        "no payment is missing or invented"
    );
    for (tx, limits) in got {
        let i: i64 = tx.trim_start_matches("tx-").parse().unwrap();
        let generation = if i < first { 1 } else { 2 };
        assert_eq!(
            limits,
            vec![want_limit(i, generation)],
            "{tx} must come out exactly once"
        );
    }

    // Every worker answers for every user's row, forwarding to the task that holds it.
    let ask_all = |fleet: &Fleet| {
        for addr in fleet.addrs() {
            for u in 0..USERS {
                let path = format!("/v1/stores/users/keys/{}", user(u));
                let (code, body) = wait_for(
                    &format!("GET {path} from {addr}"),
                    Duration::from_secs(30),
                    || http_get(addr, &path).filter(|(c, _)| *c == 200),
                );
                let v: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(
                    (code, v["value"]["limit"].as_i64()),
                    (200, Some(2000 + u)),
                    "{path} from {addr}: {v}"
                );
            }
        }
    };
    ask_all(&fleet);

    // Lost volumes: the table store is restored from the table's own topic.
    fleet.kill9(0);
    fleet.kill9(1);
    for i in 0..2 {
        std::fs::remove_dir_all(dir.join(format!("state-{i}"))).unwrap();
    }
    fleet.start_missing();
    ask_all(&fleet);
    assert!(
        topic_partitions(&format!("{app}-users-changelog")).is_none(),
        "a table has no changelog of its own"
    );
    fleet.stop();
}

#[test]
fn a_global_table_is_whole_before_the_first_record_and_follows_updates() {
    let app = unique("gjoin");
    let (input, table, sink) = (
        format!("{app}-payments"),
        format!("{app}-users"),
        format!("{app}-out"),
    );
    create_topic(&input, PARTITIONS);
    // Any partition count: every worker keeps the whole table.
    create_topic(&table, 3);
    create_topic(&sink, PARTITIONS);
    produce(&table, limits(1));
    produce(&input, payments(0, 200));
    let manifest = join_manifest(&app, &input, &table, &sink, true);
    let dir = scratch_dir(&app);
    let builder = WorkerBuilder::new(manifest, &dir.join("state"));
    assert!(
        builder.repartition_topics().is_empty(),
        "a global table needs no repartition"
    );
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(90));
    let out = read_until(
        &sink,
        "read_committed",
        "200 payments joined",
        Duration::from_secs(60),
        |o| enriched(o).len() >= 200,
    );
    for (tx, limits) in enriched(&out) {
        let i: i64 = tx.trim_start_matches("tx-").parse().unwrap();
        assert_eq!(
            limits,
            vec![want_limit(i, 1)],
            "{tx}: the table was loaded before the first payment"
        );
    }
    // An update read while running: probes for user 3 until one sees it.
    produce(&table, vec![Input::json(&user(3), json!({"limit": 7777}))]);
    let mut probe = 10_000;
    wait_for(
        "a payment joined with the updated row",
        Duration::from_secs(30),
        || {
            probe += 1;
            let tx = format!("probe-{probe}");
            produce(
                &input,
                vec![Input::json(&tx, json!({"txId": tx, "userId": user(3)}))],
            );
            std::thread::sleep(Duration::from_millis(200));
            read_all(&sink, "read_committed")
                .iter()
                .any(|o| o.json()["limit"] == 7777)
                .then_some(())
        },
    );
    w.stop();
}

#[test]
fn branching_to_three_topics_under_exactly_once_with_kills_puts_each_record_in_its_topic_once() {
    let app = unique("branch");
    let input = format!("{app}-in");
    let kinds = ["a", "b", "c"];
    create_topic(&input, PARTITIONS);
    for k in kinds {
        create_topic(&format!("{app}-{k}"), 2);
    }
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  processingGuarantee: exactly_once
  commitInterval: 100ms
  source: {{topics: [{input}]}}
  steps:
  - to: {{topic: {app}-a, when: "value.kind == 'a'"}}
  - to: {{topic: {app}-b, when: "value.kind == 'b'"}}
  - to: {{topic: {app}-c, when: "value.kind == 'c'", value: '{{"id": value.id, "upper": true}}'}}
"#,
        bootstrap = bootstrap()
    );
    let dir = scratch_dir(&app);
    let mut fleet = Fleet::new(&manifest, &dir, 2, false);
    fleet.start_missing();
    const N: i64 = 3000;
    let kind = |i: i64| kinds[(i * 7 % 3) as usize];
    let generator = {
        let input = input.clone();
        std::thread::spawn(move || {
            for c in 0..10 {
                produce(
                    &input,
                    (c * N / 10..(c + 1) * N / 10).map(|i| {
                        Input::json(
                            &format!("r-{i}"),
                            json!({"id": i, "kind": kinds[(i * 7 % 3) as usize]}),
                        )
                    }),
                );
                std::thread::sleep(Duration::from_millis(150));
            }
        })
    };
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(300 + rng.next(800)));
        fleet.kill9(round % 2);
        fleet.start_missing();
    }
    generator.join().unwrap();
    wait_stage_committed(
        &mut fleet.running(),
        0,
        &input,
        &end_offsets(&input),
        Duration::from_secs(120),
    );
    let mut seen: BTreeMap<i64, Vec<&str>> = BTreeMap::new();
    for k in kinds {
        for o in read_all(&format!("{app}-{k}"), "read_committed") {
            let v = o.json();
            if k == "c" {
                assert_eq!(v["upper"], true, "the c branch writes its own value");
            }
            seen.entry(v["id"].as_i64().unwrap()).or_default().push(k);
        }
    }
    assert_eq!(seen.len() as i64, N, "every record reached a branch");
    for (i, got) in seen {
        assert_eq!(
            got,
            vec![kind(i)],
            "record {i} must be in its topic exactly once"
        );
    }
    fleet.stop();
}

#[test]
fn a_topic_expression_naming_a_missing_topic_dead_letters_the_record_with_the_topic() {
    let app = unique("route");
    let input = format!("{app}-in");
    create_topic(&input, 2);
    create_topic(&format!("{app}-x"), 1);
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  processingGuarantee: exactly_once
  source: {{topics: [{input}]}}
  steps:
  - to: {{topicExpr: "'{app}-' + value.dest"}}
"#,
        bootstrap = bootstrap()
    );
    produce(
        &input,
        (0..20).map(|i| {
            let dest = if i % 4 == 0 { "nowhere" } else { "x" };
            Input::json(&format!("k{i}"), json!({"id": i, "dest": dest}))
        }),
    );
    let dir = scratch_dir(&app);
    WorkerBuilder::new(manifest, &dir.join("state")).process_all(&input);
    let routed: BTreeSet<i64> = read_all(&format!("{app}-x"), "read_committed")
        .iter()
        .map(|o| o.json()["id"].as_i64().unwrap())
        .collect();
    assert_eq!(routed, (0..20).filter(|i| i % 4 != 0).collect());
    let dead = read_all(&format!("{app}-dlq"), "read_committed");
    assert_eq!(
        dead.len(),
        5,
        "the five records for the missing topic are dead letters"
    );
    for d in dead {
        let reason = &d.headers["oxbow.error"];
        assert!(
            reason.contains("OutputTopicMissing") && reason.contains(&format!("{app}-nowhere")),
            "the reason names the missing topic: {reason}"
        );
        assert_eq!(d.headers["oxbow.step"], "to-0");
    }
}
