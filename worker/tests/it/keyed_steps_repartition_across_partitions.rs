//! Keyed steps over a source that is not keyed by their key: the worker repartitions
//! through `<applicationId>-<store>-repartition` (Kafka Streams' sub-topologies), so
//! every record of a group, id or batch group meets in one task of the next stage.
//!
//! The inputs are keyed by something unique (a payment id) or placed on chosen
//! partitions, so one group's records are on every source partition: without a
//! repartition each task would hold a partial aggregate, miss duplicates or keep
//! several open batches per group, and these tests would see it.
//!
//! Waiting: the source offsets of stage 0 say nothing about stage 1, so the tests wait
//! on the output. Where the output alone cannot say everything arrived, they send
//! "barrier" records from every source partition to every repartition partition after
//! the data: a repartition partition is read in order, so once a barrier of each source
//! partition came out of stage 1, everything before it did too.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::*;
use oxbow_crds::Partitioner;
use oxbow_worker::query::{encode, partition_for};
use serde_json::{Value, json};

const PARTITIONS: i32 = 4;
const MINUTE: i64 = 60_000;

/// The partition Kafka's default partitioner (murmur2) gives `key`: where the worker
/// writes a repartition record, and where `produce` puts a keyed record.
fn partition_of(key: &str) -> i32 {
    partition_for(Partitioner::Murmur2, key.as_bytes(), PARTITIONS as u32).unwrap() as i32
}

/// `prefix-0`, `prefix-1`, … : the first one murmur2 puts in `partition`.
fn key_in_partition(prefix: &str, partition: i32) -> String {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|k| partition_of(k) == partition)
        .unwrap()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

// ---------------------------------------------------------------------------------------
// Windowed aggregate grouped by a field, with SIGKILLs
// ---------------------------------------------------------------------------------------

const PAYMENTS: i64 = 600;
const USERS: i64 = 12;

/// Payment `i`: keyed by its own id, for user `i % USERS`, event time half a second
/// after the one before. Event times start three hours ago (the topics' time retention
/// must keep them; a broker may refuse timestamps far in the future).
fn payment(base: i64, i: i64) -> (String, Value) {
    let tx = format!("tx-{i}");
    let value = json!({
        "txId": tx,
        "userId": format!("user-{:02}", i % USERS),
        "amount": (i * 37) % 101 + 1,
        "ts": base + i * 500,
    });
    (tx, value)
}

/// (user, windowStart) → (count, sum) of the payments.
fn window_model(base: i64) -> BTreeMap<(String, i64), (i64, i64)> {
    let mut m: BTreeMap<(String, i64), (i64, i64)> = BTreeMap::new();
    for i in 0..PAYMENTS {
        let (_, v) = payment(base, i);
        let ts = v["ts"].as_i64().unwrap();
        let e = m
            .entry((
                v["userId"].as_str().unwrap().to_string(),
                ts - ts.rem_euclid(MINUTE),
            ))
            .or_default();
        e.0 += 1;
        e.1 += v["amount"].as_i64().unwrap();
    }
    m
}

struct WindowRun {
    app: String,
    base: i64,
    out: Vec<Out>,
    /// Kill rounds during which the workers made progress before the SIGKILL.
    progressed: usize,
}

/// Two workers over a 4-partition topic of payments keyed by payment id, counting and
/// summing per user and 1-minute window with `emit: onWindowClose`. While a generator
/// writes the payments, `kills` rounds each SIGKILL worker 0, worker 1 or both at a
/// random point and restart them. Then, once stage 0 has committed every payment, a
/// closer per repartition partition (event time two hours on, past every window's end
/// plus the 1 h grace) closes the windows; returns the output once every window of the
/// model is in it.
fn run_windows_with_kills(guarantee: &str, kills: usize) -> WindowRun {
    // metadata.name is a DNS label: no `_`.
    let app = unique(if guarantee == "exactly_once" {
        "rp-eos"
    } else {
        "rp-alos"
    });
    let input = format!("{app}-in");
    let sink = format!("{app}-out");
    create_topic(&input, PARTITIONS);
    create_topic(&sink, PARTITIONS);
    let base = (now_ms() - 3 * 3_600_000) / MINUTE * MINUTE;
    // The point of the test: one user's payments are on every source partition.
    for u in 0..USERS {
        let parts: BTreeSet<i32> = (0..PAYMENTS)
            .filter(|i| i % USERS == u)
            .map(|i| partition_of(&payment(base, i).0))
            .collect();
        assert_eq!(
            parts.len(),
            PARTITIONS as usize,
            "user {u} is on partitions {parts:?} only"
        );
    }
    // A large grace: records of a window arrive at its stage-1 task in any order from
    // four stage-0 tasks (and again after kills); none may be late. Only the closers close.
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  processingGuarantee: {guarantee}
  commitInterval: 100ms
  source: {{topics: [{input}], timestamp: value.ts}}
  steps:
  - aggregate:
      store: per-user
      groupBy: value.userId
      window: {{tumbling: 1m, grace: 1h}}
      emit: onWindowClose
      fields: {{count: {{count: {{}}}}, sum: {{sum: value.amount}}}}
  sink: {{topic: {sink}}}
"#,
        bootstrap = bootstrap()
    );
    let dir = scratch_dir(&app);
    let mut fleet = Fleet::new(&manifest, &dir, 2, false);
    fleet.start_missing();

    let generator = {
        let input = input.clone();
        std::thread::spawn(move || {
            let chunks = 12;
            for c in 0..chunks {
                let (from, to) = (c * PAYMENTS / chunks, (c + 1) * PAYMENTS / chunks);
                produce(
                    &input,
                    (from..to).map(|i| {
                        let (k, v) = payment(base, i);
                        Input::json(&k, v)
                    }),
                );
                std::thread::sleep(Duration::from_millis(400));
            }
        })
    };

    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut progressed = 0;
    for round in 0..kills {
        let before = fleet.handled();
        // Somewhere in the next 0.3–1.5 s of processing.
        std::thread::sleep(Duration::from_millis(300 + rng.next(1200)));
        if fleet.handled() > before {
            progressed += 1;
        }
        match round % 3 {
            0 => fleet.kill9(0),
            1 => fleet.kill9(1),
            _ => {
                fleet.kill9(0);
                fleet.kill9(1);
            }
        }
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
    // Every payment is now in the repartition topic (committed), ahead of the closers.
    let closers: Vec<Input> = (0..PARTITIONS)
        .map(|r| {
            let user = key_in_partition("closer", r);
            Input::json(
                &format!("closer-tx-{r}"),
                json!({"txId": format!("closer-tx-{r}"), "userId": user, "amount": 0, "ts": base + 2 * 3_600_000}),
            )
        })
        .collect();
    produce(&input, closers);

    let want: BTreeSet<(String, i64)> = window_model(base).into_keys().collect();
    let isolation = if guarantee == "exactly_once" {
        "read_committed"
    } else {
        "read_uncommitted"
    };
    let out = read_until(
        &sink,
        isolation,
        &format!(
            "a final result for each of the {} (user, window) pairs",
            want.len()
        ),
        Duration::from_secs(120),
        |out| {
            let got: BTreeSet<(String, i64)> = out.iter().map(window_of).collect();
            want.is_subset(&got)
        },
    );
    assert_eq!(
        topic_partitions(&format!("{app}-per-user-repartition")),
        Some(PARTITIONS as usize),
        "{app}: the repartition topic exists with as many partitions as the source"
    );
    fleet.stop();
    WindowRun {
        app,
        base,
        out,
        progressed,
    }
}

fn window_of(o: &Out) -> (String, i64) {
    let v = o.json();
    (
        v["key"].as_str().unwrap_or_default().to_string(),
        v["windowStart"].as_i64().unwrap_or(-1),
    )
}

/// (user, windowStart) → every (count, sum) emitted for it, in output order per partition.
fn emitted(out: &[Out]) -> BTreeMap<(String, i64), Vec<(i64, i64)>> {
    let mut m: BTreeMap<(String, i64), Vec<(i64, i64)>> = BTreeMap::new();
    for o in out {
        let v = o.json();
        let w = window_of(o);
        assert_eq!(v["windowEnd"].as_i64(), Some(w.1 + MINUTE), "{v}");
        m.entry(w)
            .or_default()
            .push((v["count"].as_i64().unwrap(), v["sum"].as_i64().unwrap()));
    }
    m
}

#[test]
fn grouping_by_a_field_that_is_not_the_key_gives_one_final_result_per_group_and_window_under_exactly_once()
 {
    let run = run_windows_with_kills("exactly_once", 4);
    let app = &run.app;
    assert!(
        run.progressed >= 2,
        "{app}: the workers must be killed mid-work ({} of 4 kill rounds made progress)",
        run.progressed
    );
    let got = emitted(&run.out);
    let want = window_model(run.base);
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        extra.is_empty(),
        "{app}: results for windows no payment is in: {extra:?}"
    );
    let repeated: Vec<_> = got.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(
        repeated.is_empty(),
        "{app}: onWindowClose under exactly-once gives one committed result per (user, window); these have several: {repeated:?}"
    );
    let wrong: Vec<_> = want
        .iter()
        .filter(|(k, v)| got[*k] != vec![**v])
        .map(|(k, v)| (k, v, &got[k]))
        .collect();
    assert!(
        wrong.is_empty(),
        "{app}: (user, window), model (count, sum), got: {wrong:?}"
    );
    assert_eq!(
        run.out.len(),
        want.len(),
        "{app}: one output record per (user, window)"
    );
}

#[test]
fn at_least_once_grouping_across_partitions_never_loses_a_count() {
    let run = run_windows_with_kills("at_least_once", 1);
    let app = &run.app;
    let got = emitted(&run.out);
    let want = window_model(run.base);
    let mut exact = 0;
    for (k, (count, sum)) in &want {
        let (c, s) = *got[k].last().unwrap();
        // At-least-once may count a payment twice (stage 0 replays what it wrote to the
        // repartition topic after its last commit) but never loses one.
        assert!(
            c >= *count && s >= *sum,
            "{app}: {k:?} lost payments: got count {c} sum {s}, model count {count} sum {sum}; all emitted: {:?}",
            got[k]
        );
        if c == *count {
            assert_eq!(
                s, *sum,
                "{app}: {k:?} has the right count but the wrong sum"
            );
            exact += 1;
        }
    }
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        extra.is_empty(),
        "{app}: results for windows no payment is in: {extra:?}"
    );
    eprintln!(
        "{app}: {exact} of {} (user, window) results exact, {} records emitted",
        want.len(),
        run.out.len()
    );
}

// ---------------------------------------------------------------------------------------
// dedupe and batch keyed by a field
// ---------------------------------------------------------------------------------------

/// For every source partition q and repartition partition r, a record produced to q
/// whose step key (`make` is given `prefix-q-r-n` candidates) murmur2 puts in r.
fn barriers(
    prefix: &str,
    mut make: impl FnMut(&str) -> Value,
    key_field: &str,
) -> Vec<(i32, String, Value)> {
    let mut v = Vec::new();
    for q in 0..PARTITIONS {
        for r in 0..PARTITIONS {
            let id = key_in_partition(&format!("{prefix}-{q}-{r}"), r);
            let value = make(&id);
            assert_eq!(value[key_field], json!(id));
            v.push((q, format!("{prefix}-key-{q}-{r}"), value));
        }
    }
    v
}

/// An app that deduplicates `input` by `value.id` (not the key) into `sink`.
fn dedupe_by_id(app: &str, input: &str, sink: &str) -> String {
    format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  source: {{topics: [{input}]}}
  steps:
  - dedupe: {{store: seen, id: value.id, within: 1h}}
  sink: {{topic: {sink}}}
"#,
        bootstrap = bootstrap()
    )
}

fn single_worker(app: &str, manifest: String) -> Worker {
    let dir = scratch_dir(app);
    let mut w = WorkerBuilder::new(manifest, &dir.join("state")).spawn();
    w.wait_ready(Duration::from_secs(90));
    w
}

#[test]
fn dedupe_on_an_id_that_is_not_the_key_drops_every_duplicate_across_partitions() {
    let app = unique("rp-dedupe");
    let input = format!("{app}-in");
    let sink = format!("{app}-out");
    create_topic(&input, PARTITIONS);
    create_topic(&sink, PARTITIONS);
    let manifest = dedupe_by_id(&app, &input, &sink);
    let w = single_worker(&app, manifest);

    // 100 ids, each three times under three different keys on three different partitions.
    let ids = 100;
    let mut keys_of: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut records = Vec::new();
    for copy in 0..3 {
        for i in 0..ids {
            let id = format!("id-{i:03}");
            let key = format!("k-{i}-{copy}");
            keys_of.entry(id.clone()).or_default().insert(key.clone());
            let p = (i + copy) % PARTITIONS;
            records.push(Input::json(&key, json!({"id": id, "copy": copy})).partition(p));
        }
    }
    produce(&input, records);
    let barrier = barriers("barrier", |id| json!({"id": id, "copy": 0}), "id");
    for (_, key, v) in &barrier {
        keys_of
            .entry(v["id"].as_str().unwrap().to_string())
            .or_default()
            .insert(key.clone());
    }
    produce(
        &input,
        barrier
            .iter()
            .map(|(q, key, v)| Input::json(key, v.clone()).partition(*q)),
    );
    let barrier_ids: BTreeSet<String> = barrier
        .iter()
        .map(|(_, _, v)| v["id"].as_str().unwrap().to_string())
        .collect();

    let out = read_until(
        &sink,
        "read_committed",
        "every barrier id",
        Duration::from_secs(120),
        |out| {
            let seen: BTreeSet<String> = out
                .iter()
                .filter_map(|o| o.json()["id"].as_str().map(str::to_string))
                .collect();
            barrier_ids.is_subset(&seen)
        },
    );
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for o in &out {
        let id = o.json()["id"].as_str().unwrap().to_string();
        assert!(
            keys_of[&id].contains(o.key.as_deref().unwrap_or_default()),
            "{app}: a deduplicated record keeps its own key: {o:?}"
        );
        *count.entry(id).or_default() += 1;
    }
    let repeated: BTreeMap<&String, &usize> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "{app}: ids let through more than once: {repeated:?}"
    );
    let want: BTreeSet<&String> = keys_of.keys().collect();
    let got: BTreeSet<&String> = count.keys().collect();
    assert_eq!(got, want, "{app}: every id comes through once");
    assert_eq!(
        topic_partitions(&format!("{app}-seen-repartition")),
        Some(PARTITIONS as usize),
        "{app}: the dedupe reads a repartition topic"
    );
    w.stop();
}

#[test]
fn repartition_records_are_deleted_once_the_next_stage_has_committed_them() {
    let app = unique("rp-purge");
    let input = format!("{app}-in");
    let sink = format!("{app}-out");
    create_topic(&input, PARTITIONS);
    create_topic(&sink, PARTITIONS);
    let manifest = dedupe_by_id(&app, &input, &sink);
    let dir = scratch_dir(&app);
    let mut b = WorkerBuilder::new(manifest, &dir.join("state"));
    b.extra_args = vec!["--repartition-purge-interval".into(), "1s".into()];
    let mut w = b.spawn();
    w.wait_ready(Duration::from_secs(90));
    produce(
        &input,
        (0..400).map(|i| {
            Input::json(&format!("k{i}"), json!({"id": format!("id-{}", i % 50)}))
                .partition(i % PARTITIONS)
        }),
    );
    let repartition = format!("{app}-seen-repartition");
    w.wait_committed(&input, &end_offsets(&input), Duration::from_secs(120));
    assert_eq!(
        read_all(&repartition, "read_committed").len(),
        400,
        "{app}: every record went through the repartition topic"
    );
    // Offsets, not counts: transaction markers take offsets too.
    let ends = data_ends(&repartition);
    w.wait_stage_committed(1, &repartition, &ends, Duration::from_secs(120));
    // Kafka keeps the log start at or below what was deleted: every committed record
    // is gone once the purge ran, and nothing the next stage has not committed.
    let purged = wait_for(
        "the consumed repartition records to be deleted (DeleteRecords)",
        Duration::from_secs(60),
        || {
            let starts = start_offsets(&repartition);
            ends.iter()
                .all(|(p, end)| starts.get(p) == Some(end))
                .then_some(starts)
        },
    );
    assert!(
        purged.values().all(|start| *start > 0),
        "{app}: every partition had records deleted: {purged:?}"
    );
    w.stop();
}

#[test]
fn a_batch_grouped_by_a_field_keeps_one_open_batch_per_group_across_partitions() {
    let app = unique("rp-batch");
    let input = format!("{app}-in");
    let sink = format!("{app}-out");
    let repartition = format!("{app}-open-repartition");
    create_topic(&input, PARTITIONS);
    create_topic(&sink, PARTITIONS);
    let size = 5;
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  source: {{topics: [{input}]}}
  steps:
  - batch: {{store: open, size: {size}, maxWait: 1h, groupBy: value.group}}
  sink: {{topic: {sink}}}
"#,
        bootstrap = bootstrap()
    );
    let w = single_worker(&app, manifest);

    // Six groups of 20 records, each group's records round-robin over the partitions:
    // one open batch per group means 4 full batches per group; one per (group, task)
    // would leave each task with 5 of a group, never filling in order.
    let (groups, per_group) = (6, 20);
    let mut ids_of: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut records = Vec::new();
    for j in 0..per_group {
        for g in 0..groups {
            let (group, id) = (format!("g{g}"), format!("g{g}-r{j:02}"));
            ids_of.entry(group.clone()).or_default().insert(id.clone());
            records.push(
                Input::json(&format!("key-{id}"), json!({"group": group, "id": id}))
                    .partition(j % PARTITIONS),
            );
        }
    }
    produce(&input, records);
    // Barriers: per repartition partition r, a group that murmur2 puts in r, with `size`
    // records from every source partition: its 4 batches all close only once stage 1 has
    // read everything each source partition wrote to r before.
    let mut barrier_records = Vec::new();
    for r in 0..PARTITIONS {
        let group = key_in_partition(&format!("barrier-{r}"), r);
        for q in 0..PARTITIONS {
            for n in 0..size {
                let id = format!("{group}-q{q}-{n}");
                ids_of.entry(group.clone()).or_default().insert(id.clone());
                barrier_records.push(
                    Input::json(&format!("key-{id}"), json!({"group": group, "id": id}))
                        .partition(q),
                );
            }
        }
    }
    produce(&input, barrier_records);
    let want_batches: usize = ids_of.values().map(|ids| ids.len() / size as usize).sum();

    let out = read_until(
        &sink,
        "read_committed",
        &format!("{want_batches} full batches"),
        Duration::from_secs(120),
        |out| out.len() >= want_batches,
    );
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for o in &out {
        let v = o.json();
        let records = v["records"].as_array().unwrap();
        let groups: BTreeSet<&str> = records
            .iter()
            .map(|r| r["value"]["group"].as_str().unwrap())
            .collect();
        assert_eq!(
            groups.len(),
            1,
            "{app}: a batch holds one group's records: {v}"
        );
        let group = groups.into_iter().next().unwrap().to_string();
        assert_eq!(
            records.len(),
            size as usize,
            "{app}: only full batches: {v}"
        );
        assert_eq!(
            o.key.as_deref(),
            Some(group.as_str()),
            "{app}: a batch is keyed by its group"
        );
        assert_eq!(
            v["topic"],
            json!(repartition),
            "{app}: the batch reads the repartition topic: {v}"
        );
        assert_eq!(
            v["partition"],
            json!(partition_of(&group)),
            "{app}: the group's repartition partition is murmur2 of it: {v}"
        );
        got.entry(group).or_default().extend(
            records
                .iter()
                .map(|r| r["value"]["id"].as_str().unwrap().to_string()),
        );
    }
    assert_eq!(out.len(), want_batches, "{app}: batches");
    for (group, ids) in &ids_of {
        let mut seen = got.get(group).cloned().unwrap_or_default();
        seen.sort();
        assert_eq!(
            seen,
            ids.iter().cloned().collect::<Vec<_>>(),
            "{app}: group {group}'s records each in exactly one batch"
        );
    }
    w.stop();
}

// ---------------------------------------------------------------------------------------
// partitionedBy
// ---------------------------------------------------------------------------------------

#[test]
fn a_declared_partitioning_skips_the_repartition_and_dead_letters_a_record_that_breaks_it() {
    let app = unique("rp-declared");
    let input = format!("{app}-in");
    let sink = format!("{app}-out");
    let dlq = format!("{app}-dlq");
    create_topic(&input, PARTITIONS);
    create_topic(&sink, PARTITIONS);
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  source: {{topics: [{input}], partitionedBy: value.userId}}
  errors: {{policy: deadLetter}}
  steps:
  - aggregate:
      store: totals
      groupBy: value.userId
      fields: {{count: {{count: {{}}}}, sum: {{sum: value.amount}}}}
  sink: {{topic: {sink}}}
"#,
        bootstrap = bootstrap()
    );
    let w = single_worker(&app, manifest);

    // Keyed by payment id, but on the partition murmur2 gives the user: as promised.
    let (payments, users) = (200, 10);
    let mut model: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut records = Vec::new();
    let bad_user = "user-3".to_string();
    let bad_partition = (partition_of(&bad_user) + 1) % PARTITIONS;
    let bad_value = serde_json::to_vec(&json!({"userId": bad_user, "amount": 1000})).unwrap();
    for i in 0..payments {
        let user = format!("user-{}", i % users);
        let amount = i % 13 + 1;
        let e = model.entry(user.clone()).or_default();
        e.0 += 1;
        e.1 += amount;
        records.push(
            Input::json(
                &format!("tx-{i}"),
                json!({"userId": user, "amount": amount}),
            )
            .partition(partition_of(&user)),
        );
        if i == payments / 2 {
            // The broken promise, in the middle of the stream.
            records.push(Input::raw("tx-bad", &bad_value).partition(bad_partition));
        }
    }
    produce(&input, records);

    let dead = read_until(
        &dlq,
        "read_committed",
        "the record on the wrong partition",
        Duration::from_secs(120),
        |d| !d.is_empty(),
    );
    let out = read_until(
        &sink,
        "read_committed",
        &format!("one update per good payment ({payments})"),
        Duration::from_secs(120),
        |out| out.len() >= payments as usize,
    );
    let status = w.status().unwrap();
    let tasks: Vec<&str> = status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"].as_str().unwrap_or_default())
        .collect();
    w.stop();

    assert_eq!(
        topic_partitions(&format!("{app}-totals-repartition")),
        None,
        "{app}: partitionedBy matches the groupBy: no repartition topic"
    );
    assert!(
        tasks.iter().all(|t| t.starts_with("0_")) && tasks.len() == PARTITIONS as usize,
        "{app}: one stage of {PARTITIONS} tasks: {tasks:?}"
    );
    assert_eq!(
        dead.len(),
        1,
        "{app}: exactly the bad record is dead-lettered: {dead:?}"
    );
    let d = &dead[0];
    assert_eq!(d.key.as_deref(), Some("tx-bad"), "{d:?}");
    assert_eq!(
        d.value.as_deref(),
        Some(bad_value.as_slice()),
        "the original bytes: {d:?}"
    );
    let error = d.headers.get("oxbow.error").cloned().unwrap_or_default();
    assert!(
        error.starts_with("NotPartitionedAsDeclared"),
        "{app}: the reason: {:?}",
        d.headers
    );
    assert_eq!(
        d.headers.get("oxbow.step").map(String::as_str),
        Some("partitionedBy"),
        "{:?}",
        d.headers
    );
    assert_eq!(
        d.headers.get("oxbow.topic"),
        Some(&input),
        "{:?}",
        d.headers
    );
    assert_eq!(
        d.headers.get("oxbow.partition"),
        Some(&bad_partition.to_string()),
        "{:?}",
        d.headers
    );

    assert_eq!(
        out.len(),
        payments as usize,
        "{app}: one update per good payment, none for the bad one"
    );
    let mut last: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for o in &out {
        let v = o.json();
        let user = v["key"].as_str().unwrap().to_string();
        assert_eq!(
            o.partition,
            partition_of(&user),
            "{app}: the output of a user stays on its partition: {v}"
        );
        last.insert(
            user,
            (v["count"].as_i64().unwrap(), v["sum"].as_i64().unwrap()),
        );
    }
    assert_eq!(
        last, model,
        "{app}: the good payments are counted, the bad one is not"
    );
}

// ---------------------------------------------------------------------------------------
// Interactive queries on a repartitioned store
// ---------------------------------------------------------------------------------------

fn get(addr: std::net::SocketAddr, path: &str) -> (u16, Value) {
    let (code, body) = wait_for(
        &format!("an answer to GET {path} from {addr}"),
        Duration::from_secs(10),
        || http_get(addr, path),
    );
    let v = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: not JSON ({e}): {body}"));
    (code, v)
}

#[test]
fn a_repartitioned_store_answers_a_key_from_either_worker_without_scatter() {
    let app = unique("rp-query");
    let input = format!("{app}-in");
    let sink = format!("{app}-out");
    create_topic(&input, PARTITIONS);
    create_topic(&sink, PARTITIONS);
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  source: {{topics: [{input}]}}
  steps:
  - aggregate:
      store: per-user
      groupBy: value.userId
      fields: {{count: {{count: {{}}}}, sum: {{sum: value.amount}}}}
  sink: {{topic: {sink}}}
"#,
        bootstrap = bootstrap()
    );
    let dir = scratch_dir(&app);
    let mut fleet = Fleet::new(&manifest, &dir, 2, true);
    fleet.start_missing();

    let (payments, users) = (400, 16);
    let mut model: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    produce(
        &input,
        (0..payments).map(|i| {
            // A user name that needs percent-encoding, too.
            let user = match i % users {
                0 => "a/b c".to_string(),
                u => format!("user-{u:02}"),
            };
            let amount = i % 29 + 1;
            let e = model.entry(user.clone()).or_default();
            e.0 += 1;
            e.1 += amount;
            Input::json(
                &format!("tx-{i}"),
                json!({"userId": user, "amount": amount}),
            )
        }),
    );
    // One committed update per payment: the store holds every payment.
    read_until(
        &sink,
        "read_committed",
        &format!("one update per payment ({payments})"),
        Duration::from_secs(120),
        |out| out.len() >= payments as usize,
    );

    let addrs = fleet.addrs();
    assert_eq!(addrs.len(), 2);
    for (user, (count, sum)) in &model {
        let p = partition_of(user);
        for (i, addr) in addrs.iter().enumerate() {
            let (code, v) = get(*addr, &format!("/v1/stores/per-user/keys/{}", encode(user)));
            assert_eq!(
                code,
                200,
                "{app}: worker {i}, user {user:?}: {v}\nlogs:\n{}",
                fleet.logs()
            );
            assert_ne!(
                v["routing"],
                json!("scatter"),
                "{app}: worker {i}, user {user:?}: {v}"
            );
            assert!(v.get("parts").is_none(), "{app}: no partial copies: {v}");
            assert_eq!(v["key"], json!(user), "{v}");
            assert_eq!(
                v["task"],
                json!(format!("1_{p}")),
                "{app}: user {user:?} lives in the stage-1 task murmur2 gives it: {v}"
            );
            assert_eq!(
                v["servedBy"],
                json!(format!("instance-{}", p % 2)),
                "{app}: the owner answers: {v}"
            );
            assert_eq!(
                v["value"]["count"],
                json!(count),
                "{app}: count of {user:?} via worker {i}: {v}"
            );
            assert_eq!(
                v["value"]["sum"],
                json!(sum),
                "{app}: sum of {user:?} via worker {i}: {v}"
            );
        }
    }
    fleet.stop();
}
