//! Interactive queries across two standalone workers (`--peers`) over a 4-partition
//! topic: every key is answered, with the right value, by both workers (one reads it,
//! the other forwards to it); windows, ranges with paging, a store keyed by something
//! else than the source key (behind a repartition, routed by its own key's partition),
//! the 404s and 400s, and the 503 of an owner that is gone.
//!
//! The records are produced by librdkafka's `murmur2_random` partitioner and the workers
//! route with their own murmur2: a key answered by the task the test computes proves
//! both agree with the Java clients' partitioner.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use oxbow_crds::Partitioner;
use oxbow_worker::query::{encode, partition_for};
use serde_json::{Value, json};

const RECORDS: i64 = 2_000;
const KEYS: i64 = 200;
const MINUTE: i64 = 60_000;

fn manifest(app: &str) -> String {
    format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  processingGuarantee: at_least_once
  source: {{topics: [{app}-in]}}
  steps:
  # Each step re-emits one record per source record (onUpdate, one window each), with
  # the source record's amount and colour carried by `last`.
  - aggregate:
      store: per-minute
      groupBy: key
      window: {{tumbling: 1m, retention: 1d}}
      fields: {{n: {{count: {{}}}}, amount: {{last: value.amount}}, colour: {{last: value.colour}}}}
  - aggregate:
      store: totals
      groupBy: key
      fields: {{n: {{count: {{}}}}, total: {{sum: value.amount}}, colour: {{last: value.colour}}}}
  - aggregate:
      store: by-colour
      groupBy: value.colour
      fields: {{n: {{count: {{}}}}}}
"#,
        bootstrap = bootstrap()
    )
}

fn key_of(i: i64) -> String {
    match i % KEYS {
        // Keys that need percent-encoding in a URL path.
        0 => "a/b c".to_string(),
        1 => "café".to_string(),
        k => format!("user-{k:03}"),
    }
}

struct Expected {
    /// key → (count, sum of amounts)
    totals: BTreeMap<String, (i64, i64)>,
    /// key → window start → count
    windows: BTreeMap<String, BTreeMap<i64, i64>>,
    colours: BTreeMap<String, i64>,
}

fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
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
fn every_key_is_answered_correctly_by_every_worker() {
    let app = unique("queries");
    let input = format!("{app}-in");
    create_topic(&input, 4);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // Recent event times (the topic's time retention must not delete them), increasing
    // per key so `last` is the current record's value.
    let base = (now - 3_600_000) / MINUTE * MINUTE;
    let colours = ["red", "green", "blue"];
    let mut exp = Expected {
        totals: BTreeMap::new(),
        windows: BTreeMap::new(),
        colours: BTreeMap::new(),
    };
    let mut records = Vec::new();
    for i in 0..RECORDS {
        let (k, amount, colour, ts) = (
            key_of(i),
            i % 97,
            colours[(i % 3) as usize],
            base + i * 1_000,
        );
        let t = exp.totals.entry(k.clone()).or_default();
        t.0 += 1;
        t.1 += amount;
        *exp.windows
            .entry(k.clone())
            .or_default()
            .entry(ts / MINUTE * MINUTE)
            .or_default() += 1;
        *exp.colours.entry(colour.to_string()).or_default() += 1;
        records.push(Input::json(&k, json!({"amount": amount, "colour": colour})).at(ts));
    }
    produce(&input, records);

    let dir = scratch_dir(&app);
    let ports = [free_port(), free_port()];
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let mut workers = Vec::new();
    for i in 0..2u32 {
        let mut b = WorkerBuilder::new(manifest(&app), &dir.join(format!("state-{i}")));
        b.instance = i;
        b.instances = 2;
        b.port = Some(ports[i as usize]);
        b.extra_args = vec!["--peers".into(), peers.clone()];
        workers.push(b.spawn());
    }
    let ends = end_offsets(&input);
    for w in &mut workers {
        w.wait_ready(Duration::from_secs(90));
        w.wait_committed(&input, &ends, Duration::from_secs(120));
    }
    // by-colour is stage 1, behind `<app>-by-colour-repartition`.
    let by_colour = format!("{app}-by-colour-repartition");
    let repartitioned = data_ends(&by_colour);
    let mut all: Vec<&mut Worker> = workers.iter_mut().collect();
    wait_stage_committed(
        &mut all,
        1,
        &by_colour,
        &repartitioned,
        Duration::from_secs(120),
    );
    let addrs: Vec<SocketAddr> = workers.iter().map(|w| w.addr).collect();

    // Point lookups: every key, from both workers.
    for (key, (n, total)) in &exp.totals {
        let task = partition_for(Partitioner::Murmur2, key.as_bytes(), 4).unwrap();
        for (i, addr) in addrs.iter().enumerate() {
            let (code, v) = get(*addr, &format!("/v1/stores/totals/keys/{}", encode(key)));
            assert_eq!(code, 200, "worker {i}, key {key:?}: {v}");
            assert_eq!(v["found"], json!(true), "{v}");
            assert_eq!(v["key"], json!(key), "{v}");
            assert_eq!(
                v["task"],
                json!(format!("0_{task}")),
                "key {key:?} routes by murmur2: {v}"
            );
            assert_eq!(v["partition"], json!(task), "{v}");
            assert_eq!(
                v["servedBy"],
                json!(format!("instance-{}", task % 2)),
                "the owner answers, whoever was asked: {v}"
            );
            assert_eq!(v["stale"], json!(false), "{v}");
            assert_eq!(
                v["value"]["n"],
                json!(n),
                "count of {key:?} via worker {i}: {v}"
            );
            assert_eq!(
                v["value"]["total"],
                json!(total),
                "sum of {key:?} via worker {i}: {v}"
            );
        }
    }

    // Windows: a key's windows with start in [from, to), given as millis and RFC 3339.
    let key = key_of(7);
    let all = &exp.windows[&key];
    let starts: Vec<i64> = all.keys().copied().collect();
    let (from, to) = (starts[2], starts[6]);
    let to_rfc = chrono::DateTime::from_timestamp_millis(to)
        .unwrap()
        .to_rfc3339();
    for addr in &addrs {
        let (code, v) = get(
            *addr,
            &format!(
                "/v1/stores/per-minute/keys/{key}/windows?from={from}&to={}",
                encode(&to_rfc)
            ),
        );
        assert_eq!(code, 200, "{v}");
        let got: BTreeMap<i64, i64> = v["windows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                assert_eq!(
                    w["windowEnd"].as_i64(),
                    w["windowStart"].as_i64().map(|s| s + MINUTE)
                );
                (
                    w["windowStart"].as_i64().unwrap(),
                    w["value"]["n"].as_i64().unwrap(),
                )
            })
            .collect();
        let want: BTreeMap<i64, i64> = all.range(from..to).map(|(s, n)| (*s, *n)).collect();
        assert_eq!(got, want, "windows of {key:?} in [{from}, {to}): {v}");
        // The whole key: every window it has.
        let (code, v) = get(*addr, &format!("/v1/stores/per-minute/keys/{key}"));
        assert_eq!(code, 200, "{v}");
        assert_eq!(
            v["windows"].as_array().map(Vec::len),
            Some(all.len()),
            "{v}"
        );
    }

    // Range: every key in order, 37 at a time, following `next`.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => "/v1/stores/totals/range?limit=37".to_string(),
            Some(c) => format!("/v1/stores/totals/range?limit=37&from={}", encode(c)),
        };
        let (code, v) = get(addrs[1], &path);
        assert_eq!(code, 200, "{v}");
        let entries = v["entries"].as_array().unwrap();
        assert!(entries.len() <= 37, "{v}");
        for e in entries {
            let k = e["key"].as_str().unwrap().to_string();
            let (n, total) = exp.totals[&k];
            assert_eq!(e["value"]["n"], json!(n), "{e}");
            assert_eq!(e["value"]["total"], json!(total), "{e}");
            seen.push(k);
        }
        match v["next"].as_str() {
            Some(n) => {
                assert_eq!(entries.len(), 37, "a page with a next cursor is full: {v}");
                cursor = Some(n.to_string());
            }
            None => break,
        }
        assert!(
            seen.len() <= exp.totals.len(),
            "paging does not end: {seen:?}"
        );
    }
    let want: Vec<String> = exp.totals.keys().cloned().collect();
    assert_eq!(seen, want, "every key once, in key order");
    let (code, v) = get(addrs[0], "/v1/stores/totals/range?limit=10000");
    assert_eq!(code, 200, "the largest page: {v}");
    assert_eq!(
        v["entries"].as_array().map(Vec::len),
        Some(want.len()),
        "{v}"
    );
    assert_eq!(v["next"], Value::Null, "{v}");
    let (code, v) = get(
        addrs[0],
        "/v1/stores/totals/range?from=user-050&to=user-060",
    );
    assert_eq!(code, 200, "{v}");
    let keys: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["key"].as_str())
        .collect();
    let want: Vec<String> = (50..60).map(|k| format!("user-{k:03}")).collect();
    assert_eq!(keys, want, "[from, to): {v}");
    assert_eq!(v["next"], Value::Null, "{v}");

    // A store keyed by something else: repartitioned by colour, so one stage-1 task
    // holds each colour whole, found by the colour's own partition.
    for addr in &addrs {
        for (colour, n) in &exp.colours {
            let (code, v) = get(*addr, &format!("/v1/stores/by-colour/keys/{colour}"));
            assert_eq!(code, 200, "{v}");
            let p = partition_for(Partitioner::Murmur2, colour.as_bytes(), 4).unwrap();
            assert_eq!(v["task"], json!(format!("1_{p}")), "{v}");
            assert_eq!(v["parts"], Value::Null, "no scatter: {v}");
            assert_eq!(v["value"]["n"], json!(n), "colour {colour}: {v}");
        }
    }

    // What is not there.
    let (code, v) = get(addrs[0], "/v1/stores/nope/keys/x");
    assert_eq!(code, 404, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("nope") && msg.contains("by-colour, per-minute, totals"),
        "the message names the known stores: {msg}"
    );
    for addr in &addrs {
        let (code, v) = get(*addr, "/v1/stores/totals/keys/no-such-key");
        assert_eq!(code, 404, "{v}");
        assert_eq!(v["found"], json!(false), "{v}");
        assert!(v["servedBy"].is_string(), "{v}");
    }
    let (code, v) = get(addrs[0], "/v1/stores/totals/range?limit=0");
    assert_eq!(code, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("limit"), "{v}");
    let (code, v) = get(addrs[0], "/v1/stores/totals/keys/user-001/windows");
    assert_eq!(code, 400, "an unwindowed store has no windows: {v}");

    // An owner that is gone: 503 naming it, for a key and for a range.
    let mut workers = workers;
    if let Some(w1) = workers.pop() {
        w1.kill9();
    }
    let theirs = exp
        .totals
        .keys()
        .find(|k| partition_for(Partitioner::Murmur2, k.as_bytes(), 4).is_some_and(|t| t % 2 == 1))
        .unwrap();
    let (code, v) = get(
        addrs[0],
        &format!("/v1/stores/totals/keys/{}", encode(theirs)),
    );
    assert_eq!(code, 503, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("failed to reach instance-1"),
        "{v}"
    );
    let (code, v) = get(addrs[0], "/v1/stores/totals/range");
    assert_eq!(code, 503, "{v}");
    assert_eq!(v["missingTasks"], json!(["0_1", "0_3"]), "{v}");

    for w in workers {
        w.stop();
    }
}
