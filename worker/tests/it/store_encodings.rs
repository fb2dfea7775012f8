//! Store encodings (`--store-encoding`): an app whose aggregate store was written as JSON
//! goes on in binary with nothing lost or counted twice, a full restore reads a
//! changelog that holds both, queries answer JSON either way; and a stored value in an
//! encoding the worker does not know stops the worker instead of skipping records.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use serde_json::json;

const KEYS: i64 = 40;
const BATCH: i64 = 2_000;

fn manifest(app: &str) -> String {
    exactly_once_app(
        app,
        &format!(
            r#"
  # Producers key by k: the aggregate needs no repartition.
  source: {{topics: [{app}-in], partitionedBy: value.k}}
  steps:
  - aggregate:
      store: totals
      groupBy: value.k
      fields: {{n: {{count: {{}}}}, total: {{sum: value.amount}}, tag: {{last: value.tag}}}}
  sink: {{topic: {app}-out}}
"#
        ),
    )
}

/// Batch `b` of the inputs: [`BATCH`] records over [`KEYS`] keys.
fn batch(input: &str, b: i64) {
    produce(
        input,
        (b * BATCH..(b + 1) * BATCH).map(|i| {
            let k = format!("k{}", i % KEYS);
            Input::json(&k, json!({"k": k, "amount": i % 7, "tag": format!("t{i}")}))
        }),
    );
}

fn encoding(w: &mut WorkerBuilder, e: &str) {
    w.extra_args = vec!["--store-encoding".into(), e.into()];
}

#[test]
fn json_state_goes_on_in_binary_and_a_full_restore_reads_both() {
    let app = unique("encodings");
    let input = format!("{app}-in");
    create_topic(&input, 2);
    create_topic(&format!("{app}-out"), 2);
    let dir = scratch_dir(&app);
    let state = dir.join("state");
    let mut w = WorkerBuilder::new(manifest(&app), &state);

    // As an app an earlier operator ran: JSON. Then the operator's second roll: binary.
    encoding(&mut w, "json");
    batch(&input, 0);
    w.process_all(&input);
    encoding(&mut w, "binary");
    batch(&input, 1);
    w.process_all(&input);

    // The changelog holds each key's JSON values, then its binary ones.
    let changelog = read_all(&format!("{app}-totals-changelog"), "read_committed");
    let mut firsts: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut lasts: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for c in changelog
        .iter()
        .filter(|c| c.key.as_deref().is_some_and(|k| k.starts_with("kk")))
    {
        let (k, v) = (c.key.clone().unwrap(), c.value.clone().unwrap_or_default());
        firsts.entry(k.clone()).or_insert_with(|| v.clone());
        lasts.insert(k, v);
    }
    assert_eq!(firsts.len() as i64, KEYS, "{app}: every key changelogged");
    for (k, v) in &firsts {
        assert_eq!(
            v.first(),
            Some(&b'{'),
            "{app}: {k} was first written as JSON"
        );
        assert_eq!(
            lasts[k].first(),
            Some(&oxbow_worker::steps::encoding::BINARY_V1),
            "{app}: {k} was last written in binary"
        );
    }

    // The state dir is lost: a full restore from the mixed changelog, then a query.
    std::fs::remove_dir_all(&state).unwrap();
    let mut worker = w.spawn();
    worker.wait_ready(Duration::from_secs(90));
    let (code, body) = wait_for(
        "an answer to the query for k7 after the full restore",
        Duration::from_secs(10),
        || http_get(worker.addr, "/v1/stores/totals/keys/k7"),
    );
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let last_tag = (0..2 * BATCH).filter(|i| i % KEYS == 7).max().unwrap();
    assert_eq!(
        v["value"],
        json!({
            "n": 2 * BATCH / KEYS,
            "total": (0..2 * BATCH).filter(|i| i % KEYS == 7).map(|i| i % 7).sum::<i64>(),
            "tag": format!("t{last_tag}"),
        }),
        "{app}: the restored binary state answers as JSON: {body}"
    );
    worker.stop();
    batch(&input, 2);
    w.process_all(&input);

    let out = read_all(&format!("{app}-out"), "read_committed");
    let mut counts: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut last: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for o in &out {
        let v = o.json();
        let k = v["key"].as_str().unwrap().to_string();
        counts
            .entry(k.clone())
            .or_default()
            .push(v["n"].as_i64().unwrap());
        last.insert(k, v);
    }
    assert_eq!(out.len() as i64, 3 * BATCH, "{app}: one update per input");
    for (k, c) in &counts {
        let n = c.len() as i64;
        assert_eq!(
            c,
            &(1..=n).collect::<Vec<_>>(),
            "{app}: {k} counts on across the change of encoding and the restore"
        );
        let i: i64 = k[1..].parse().unwrap();
        let mine: Vec<i64> = (0..3 * BATCH).filter(|j| j % KEYS == i).collect();
        assert_eq!(
            n,
            mine.len() as i64,
            "{app}: every record of {k} counted once"
        );
        assert_eq!(
            last[k]["total"],
            json!(mine.iter().map(|j| j % 7).sum::<i64>()),
            "{app}: final sum of {k}"
        );
        assert_eq!(
            last[k]["tag"],
            json!(format!("t{}", mine.last().unwrap())),
            "{app}: last tag of {k}"
        );
    }
}

#[test]
fn a_stored_value_in_an_unknown_encoding_stops_the_worker_and_skips_nothing() {
    let app = unique("unknown-encoding");
    let input = format!("{app}-in");
    let output = format!("{app}-out");
    create_topic(&input, 1);
    create_topic(&output, 1);
    let dir = scratch_dir(&app);
    let state = dir.join("state");
    let mut w = WorkerBuilder::new(manifest(&app), &state);
    encoding(&mut w, "binary");
    produce(
        &input,
        [Input::json(
            "k1",
            json!({"k": "k1", "amount": 1, "tag": "a"}),
        )],
    );
    w.process_all(&input);

    // A later version's value (first byte 2) for k1 in the changelog, and a lost state
    // dir: the full restore loads it as it is, and the next record of k1 reads it.
    produce(
        &format!("{app}-totals-changelog"),
        [Input::raw("kk1", &[0x02, 0xff, 0x00])],
    );
    std::fs::remove_dir_all(&state).unwrap();
    produce(
        &input,
        [Input::json(
            "k1",
            json!({"k": "k1", "amount": 2, "tag": "b"}),
        )],
    );
    let mut worker = w.spawn();
    let status = wait_for(
        "the worker to stop on a value it cannot read",
        Duration::from_secs(90),
        || worker.exited(),
    );
    assert!(!status.success(), "{app}: the worker failed: {status}");
    let logs = worker.logs();
    assert!(
        logs.contains("unknown store encoding (first byte 0x02)") && logs.contains("totals"),
        "{app}: the error names the store and the encoding byte:\n{logs}"
    );
    let out = read_all(&output, "read_committed");
    assert_eq!(
        out.iter()
            .map(|o| o.json()["n"].clone())
            .collect::<Vec<_>>(),
        vec![json!(1)],
        "{app}: the second record was neither counted from empty state nor skipped"
    );
}
