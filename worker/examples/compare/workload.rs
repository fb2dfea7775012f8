//! Deterministic workloads: the same seed, record count and key count give the same
//! records (keys, values and event-time offsets) on every run. Each generator also
//! computes what a correct engine must output.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::producer::Producer;

use crate::kafka::{Kafka, generator_producer, send};

pub const WINDOW_MS: i64 = 600_000;

/// xorshift64*, seeded through splitmix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

pub fn user(i: u64) -> String {
    format!("user-{i:06}")
}

/// A W1 payment (~150 bytes): what both engines parse.
pub fn payment(user: &str, amount: u64, merchant: u64, ts: i64) -> String {
    format!(
        r#"{{"user":"{user}","amount":{amount},"currency":"EUR","merchant":"m-{merchant:04}","ts":{ts},"channel":"web","note":"benchmark-record-with-some-padding"}}"#
    )
}

/// (user number, window start) → (count, total).
pub type W1Expected = HashMap<(u32, i64), (i64, i64)>;

/// W1 input: `records` payments over `keys` users, event times 5 ms apart from `base_ts`
/// (the Kafka record timestamp, which both engines use as event time).
pub fn w1(k: &Kafka, topic: &str, records: u64, keys: u64, seed: u64, base_ts: i64) -> W1Expected {
    let p = generator_producer(&k.bootstrap);
    let mut rng = Rng::new(seed);
    let mut expected = W1Expected::new();
    for i in 0..records {
        let x = rng.next();
        let u = x % keys;
        let amount = (x >> 20) % 10_000;
        let ts = base_ts + i as i64 * 5;
        let name = user(u);
        send(
            &p,
            topic,
            name.as_bytes(),
            payment(&name, amount, (x >> 40) % 1000, ts).as_bytes(),
            ts,
        );
        let e = expected
            .entry((u as u32, ts - ts.rem_euclid(WINDOW_MS)))
            .or_insert((0, 0));
        e.0 += 1;
        e.1 += amount as i64;
    }
    p.flush(Duration::from_secs(300)).expect("flush");
    expected
}

/// A W1 output topic against the generator: the last update of every (key, window).
pub struct W1Outcome {
    /// Output records read.
    pub outputs: u64,
    /// (key, window)s whose last update counts more records than were generated, with a
    /// total at least the generated one: work applied twice.
    pub over: usize,
    /// The records counted twice, summed over those windows.
    pub over_records: i64,
    /// Everything else that differs: missing or extra windows, fewer records than
    /// generated, a wrong total for the right count, unreadable outputs.
    pub bad: Vec<String>,
}

impl W1Outcome {
    /// Up to five problems as one line; `over` counts as a problem when exactness is
    /// promised.
    pub fn problems(&self, allow_over: bool) -> Option<String> {
        let mut all = self.bad.clone();
        if !allow_over && self.over > 0 {
            all.insert(
                0,
                format!(
                    "{} windows over-counted ({} records counted twice)",
                    self.over, self.over_records
                ),
            );
        }
        if all.is_empty() {
            return None;
        }
        let total = all.len();
        all.truncate(5);
        Some(format!("{total} mismatches, e.g. {}", all.join("; ")))
    }
}

pub fn compare_w1(k: &Kafka, topic: &str, partitions: i32, expected: &W1Expected) -> W1Outcome {
    let mut last: HashMap<(u32, i64), (i64, i64)> = HashMap::with_capacity(expected.len());
    let mut bad = Vec::new();
    let n = crate::kafka::read_all(&k.bootstrap, topic, partitions, |o| {
        let v: serde_json::Value = match serde_json::from_slice(&o.value) {
            Ok(v) => v,
            Err(e) => {
                bad.push(format!("unreadable output: {e}"));
                return;
            }
        };
        let u = v["key"]
            .as_str()
            .and_then(|s| s.strip_prefix("user-"))
            .and_then(|s| s.parse::<u32>().ok());
        let (Some(u), Some(ws), Some(c), Some(t)) = (
            u,
            v["windowStart"].as_i64(),
            v["count"].as_i64(),
            v["total"].as_i64(),
        ) else {
            bad.push(format!("unexpected output {v}"));
            return;
        };
        // A key's updates are in one partition, in order: the last one read is the final.
        last.insert((u, ws), (c, t));
    });
    let (mut over, mut over_records) = (0, 0);
    for (key, want) in expected {
        match last.get(key) {
            Some(got) if got == want => {}
            // Amounts are never negative, so work applied twice raises both.
            Some(got) if got.0 > want.0 && got.1 >= want.1 => {
                over += 1;
                over_records += got.0 - want.0;
            }
            got => bad.push(format!(
                "user-{:06} window {}: expected (count, total) {want:?}, got {got:?}",
                key.0, key.1
            )),
        }
    }
    for key in last.keys() {
        if !expected.contains_key(key) {
            bad.push(format!("unexpected window user-{:06} {}", key.0, key.1));
        }
    }
    W1Outcome {
        outputs: n,
        over,
        over_records,
        bad,
    }
}

/// Checks a W1 output topic: the last update of every (key, window) must equal the
/// expected count and total, with no extra windows. Returns the number of output
/// records, or the first mismatches.
pub fn check_w1(
    k: &Kafka,
    topic: &str,
    partitions: i32,
    expected: &W1Expected,
) -> Result<u64, String> {
    let o = compare_w1(k, topic, partitions, expected);
    match o.problems(false) {
        None => Ok(o.outputs),
        Some(e) => Err(e),
    }
}

/// What W2 (examples/dedupe.yaml) must output: each txId once with its account and cents,
/// and every unreadable record dead-lettered.
pub struct W2Expected {
    pub accepted: HashMap<String, (String, i64)>,
    pub dead_letters: u64,
    pub records: u64,
}

/// W2 input: payments keyed by txId; about 20% are re-sends of one of the last 10 000
/// payments (same bytes), 0.1% are unreadable. Amounts are decimals (CEL's
/// `value.amount * 100.0` needs a double).
pub fn w2(k: &Kafka, topic: &str, records: u64, seed: u64, base_ts: i64) -> W2Expected {
    let p = generator_producer(&k.bootstrap);
    let mut rng = Rng::new(seed ^ 0x5757);
    let mut recent: Vec<(String, String)> = Vec::new();
    let mut exp = W2Expected {
        accepted: HashMap::new(),
        dead_letters: 0,
        records,
    };
    for i in 0..records {
        let x = rng.next();
        let ts = base_ts + i as i64 * 5;
        if x % 1000 == 7 {
            let key = format!("garbage-{i}");
            send(&p, topic, key.as_bytes(), b"{\"txId\": not json", ts);
            exp.dead_letters += 1;
            continue;
        }
        if x % 100 < 20 && !recent.is_empty() {
            let (id, value) = recent[((x >> 16) % recent.len() as u64) as usize].clone();
            send(&p, topic, id.as_bytes(), value.as_bytes(), ts);
            continue;
        }
        let id = format!("tx-{i:09}");
        let account = format!("acc-{:05}", (x >> 8) % 50_000);
        let amount = format!("{}.{:02}", (x >> 24) % 5_000, (x >> 40) % 100);
        let value = format!(
            r#"{{"txId":"{id}","account":"{account}","amount":{amount},"currency":"EUR","note":"payment request"}}"#
        );
        send(&p, topic, id.as_bytes(), value.as_bytes(), ts);
        let cents = (amount.parse::<f64>().expect("amount") * 100.0) as i64;
        exp.accepted.insert(id.clone(), (account, cents));
        if recent.len() < 10_000 {
            recent.push((id, value));
        } else {
            recent[(i % 10_000) as usize] = (id, value);
        }
    }
    p.flush(Duration::from_secs(300)).expect("flush");
    exp
}

/// Checks W2's outputs: every accepted payment exactly once (read_committed), mapped
/// right; the dead-letter topic holds exactly the unreadable records.
pub fn check_w2(
    k: &Kafka,
    out: &str,
    dlq: &str,
    partitions: i32,
    exp: &W2Expected,
) -> Result<u64, String> {
    let mut seen: HashMap<String, u32> = HashMap::with_capacity(exp.accepted.len());
    let mut bad = Vec::new();
    let n = crate::kafka::read_all(&k.bootstrap, out, partitions, |o| {
        let v: serde_json::Value = serde_json::from_slice(&o.value).unwrap_or_default();
        let id = v["txId"].as_str().unwrap_or_default().to_string();
        match exp.accepted.get(&id) {
            Some((acc, cents))
                if v["account"].as_str() == Some(acc.as_str())
                    && v["cents"].as_i64() == Some(*cents)
                    && o.key == id.as_bytes() => {}
            want => bad.push(format!(
                "output {v} (key {:?}), expected {want:?}",
                String::from_utf8_lossy(&o.key)
            )),
        }
        *seen.entry(id).or_default() += 1;
    });
    let twice = seen.values().filter(|c| **c > 1).count();
    if twice > 0 {
        bad.push(format!("{twice} payments output more than once"));
    }
    let missing = exp
        .accepted
        .keys()
        .filter(|id| !seen.contains_key(*id))
        .count();
    if missing > 0 {
        bad.push(format!("{missing} payments missing"));
    }
    let dead = crate::kafka::read_all(&k.bootstrap, dlq, partitions, |_| {});
    if dead != exp.dead_letters {
        bad.push(format!(
            "{dead} dead letters, expected {}",
            exp.dead_letters
        ));
    }
    if bad.is_empty() {
        Ok(n)
    } else {
        let total = bad.len();
        bad.truncate(5);
        Err(format!("{total} problems, e.g. {}", bad.join("; ")))
    }
}

/// W3 input: one payment for each key number in `range`, keyed `key-<n>`, with amounts
/// from `seed`. Returns the amounts, in `range` order, so the restored state can be checked.
pub fn w3(
    k: &Kafka,
    topic: &str,
    range: std::ops::Range<u64>,
    seed: u64,
    base_ts: i64,
) -> Vec<u64> {
    let p = generator_producer(&k.bootstrap);
    let mut rng = Rng::new(seed ^ 0x3333 ^ range.start);
    let mut amounts = Vec::with_capacity((range.end - range.start) as usize);
    for (n, i) in range.enumerate() {
        let x = rng.next();
        let name = w3_key(i);
        let ts = base_ts + n as i64;
        send(
            &p,
            topic,
            name.as_bytes(),
            payment(&name, x % 10_000, (x >> 40) % 1000, ts).as_bytes(),
            ts,
        );
        amounts.push(x % 10_000);
    }
    p.flush(Duration::from_secs(300)).expect("flush");
    amounts
}

pub fn w3_key(i: u64) -> String {
    format!("key-{i:07}")
}

/// What W3's store must hold once built and updated: key `i` has one payment of
/// `base[i]`, plus one of `tail[i]` when `i < tail.len()`.
pub struct W3Expected {
    pub base: Vec<u64>,
    pub tail: Vec<u64>,
}

impl W3Expected {
    /// (count, total) of key number `i`.
    pub fn get(&self, i: u64) -> (i64, i64) {
        let i = i as usize;
        match self.tail.get(i) {
            Some(t) => (2, (self.base[i] + t) as i64),
            None => (1, self.base[i] as i64),
        }
    }

    /// The keys read back one by one: `n` drawn by `seed` over the whole key space, and
    /// the first and last key. The tail's keys are read as one range besides.
    pub fn sample(&self, n: usize, seed: u64) -> Vec<u64> {
        let keys = self.base.len() as u64;
        let mut rng = Rng::new(seed ^ 0x5a3);
        let mut s: std::collections::BTreeSet<u64> =
            (0..n).map(|_| rng.next() % keys.max(1)).collect();
        s.insert(0);
        s.insert(keys.saturating_sub(1));
        s.into_iter().collect()
    }
}

/// (count, total) from an entry of either engine's query answer: `{"value": {"count",
/// "total"}}`. Oxbow's sum may come back as a float; amounts are integers far below 2^53.
fn agg_of(entry: &serde_json::Value) -> Option<(i64, i64)> {
    let v = &entry["value"];
    let count = v["count"].as_f64()?;
    let total = v["total"].as_f64()?;
    (count.fract() == 0.0 && total.fract() == 0.0).then_some((count as i64, total as i64))
}

/// Reads the restored W3 store back through the engine's query endpoint and compares
/// every key read with what the generator wrote. `get` is a GET of a path on the engine
/// (status and JSON body). Returns how many keys were compared, or the mismatches.
/// A GET on an engine's query endpoint: (status, JSON body).
pub type Get<'a> = dyn FnMut(&str) -> Result<(u16, serde_json::Value), String> + 'a;

pub fn check_w3_content(exp: &W3Expected, sample: &[u64], get: &mut Get) -> Result<usize, String> {
    let mut bad = Vec::new();
    let mut compared = 0;
    for &i in sample {
        let key = w3_key(i);
        let (status, body) = get(&format!("/v1/stores/per-key/keys/{key}"))?;
        let want = exp.get(i);
        compared += 1;
        match status {
            200 => {
                // Oxbow routes a key to the one task holding it and answers with the
                // entry; the Kafka Streams peer answers with the parts it found.
                let parts = match body["parts"].as_array() {
                    Some(parts) => parts.clone(),
                    None if body["found"] == true => vec![body.clone()],
                    None => Vec::new(),
                };
                match parts.as_slice() {
                    [one] if agg_of(one) == Some(want) => {}
                    [one] => bad.push(format!(
                        "{key}: expected (count, total) {want:?}, got {:?} ({})",
                        agg_of(one),
                        one["value"]
                    )),
                    _ => bad.push(format!(
                        "{key}: expected one task holding it, got {} parts",
                        parts.len()
                    )),
                }
            }
            404 => bad.push(format!("{key}: expected {want:?}, missing")),
            s => return Err(format!("GET {key}: {s} {body}")),
        }
    }
    // Every key the tail updated, read as ranges (Oxbow pages at 10 000 keys).
    let tail = exp.tail.len() as u64;
    if tail > 0 {
        let to = w3_key(tail);
        let mut from = w3_key(0);
        let mut seen = 0u64;
        loop {
            let (status, body) = get(&format!(
                "/v1/stores/per-key/range?from={from}&to={to}&limit=10000"
            ))?;
            if status != 200 {
                return Err(format!("range from {from}: {status} {body}"));
            }
            for e in body["entries"].as_array().into_iter().flatten() {
                let key = e["key"].as_str().unwrap_or_default();
                let i = key.strip_prefix("key-").and_then(|n| n.parse::<u64>().ok());
                match i {
                    Some(i) if i < tail => {
                        seen += 1;
                        compared += 1;
                        let want = exp.get(i);
                        if agg_of(e) != Some(want) {
                            bad.push(format!(
                                "{key} (tail): expected (count, total) {want:?}, got {:?}",
                                agg_of(e)
                            ));
                        }
                    }
                    _ => bad.push(format!("range [{}, {to}) returned {key:?}", w3_key(0))),
                }
            }
            match body["next"].as_str() {
                Some(n) => from = n.to_string(),
                None => break,
            }
        }
        if seen != tail {
            bad.push(format!(
                "the tail's range held {seen} keys, expected {tail}"
            ));
        }
    }
    if bad.is_empty() {
        Ok(compared)
    } else {
        let total = bad.len();
        bad.truncate(5);
        Err(format!("{total} mismatches, e.g. {}", bad.join("; ")))
    }
}

/// What W5 must output: the last update of every (user, window) with the generated
/// count and total of the payments left after dedupe, joined with the user's limit.
pub struct W5Expected {
    pub windows: W1Expected,
    /// Users with a row in the users table; the others join as `other: null`.
    pub limits: HashMap<u32, i64>,
    /// Payments re-sent with a new payment id (dropped by the dedupe).
    pub resent: u64,
}

/// W5 input: `keys` users in `users_topic` (every 50th has no row), then `records`
/// payments keyed by their payment id (so a user's and a transaction's payments are on
/// every partition); about 10% re-send one of the last 1 000 transactions under a new
/// payment id, with its event time. Event times are 5 ms apart from `base_ts`.
pub fn w5(
    k: &Kafka,
    input: &str,
    users_topic: &str,
    records: u64,
    keys: u64,
    seed: u64,
    base_ts: i64,
) -> W5Expected {
    let p = generator_producer(&k.bootstrap);
    let mut limits = HashMap::new();
    for u in 0..keys {
        if u % 50 == 49 {
            continue;
        }
        let limit = 1_000 + (u * 7_919) % 100_000;
        let row = format!(r#"{{"limit":{limit}}}"#);
        send(&p, users_topic, user(u).as_bytes(), row.as_bytes(), base_ts);
        limits.insert(u as u32, limit as i64);
    }
    let mut rng = Rng::new(seed ^ 0x0505);
    // (value, event time) of recent payments: a re-send keeps the original's event time,
    // so whichever copy the dedupe meets first (they are on different partitions), the
    // payment counts in the same window.
    let mut recent: Vec<(String, i64)> = Vec::new();
    let mut exp = W5Expected {
        windows: W1Expected::new(),
        limits,
        resent: 0,
    };
    for i in 0..records {
        let x = rng.next();
        let ts = base_ts + i as i64 * 5;
        let key = format!("p-{i}");
        if x.is_multiple_of(10) && !recent.is_empty() {
            let (again, at) = &recent[((x >> 8) % recent.len() as u64) as usize];
            send(&p, input, key.as_bytes(), again.as_bytes(), *at);
            exp.resent += 1;
            continue;
        }
        let u = (x >> 4) % keys;
        let amount = (x >> 20) % 10_000;
        let name = user(u);
        let value = format!(
            r#"{{"txId":"tx-{i}","user":"{name}","amount":{amount},"currency":"EUR","ts":{ts},"note":"benchmark-record-with-some-padding"}}"#
        );
        send(&p, input, key.as_bytes(), value.as_bytes(), ts);
        if recent.len() < 1_000 {
            recent.push((value, ts));
        } else {
            recent[(i % 1_000) as usize] = (value, ts);
        }
        let e = exp
            .windows
            .entry((u as u32, ts - ts.rem_euclid(WINDOW_MS)))
            .or_insert((0, 0));
        e.0 += 1;
        e.1 += amount as i64;
    }
    p.flush(Duration::from_secs(300)).expect("flush");
    exp
}

/// Checks a W5 output topic: `{"value": <the window's aggregate>, "other": <the user's
/// row or null>}`, the last update of every (user, window) as generated, with the
/// user's limit. Returns the number of output records, or the first mismatches.
pub fn check_w5(k: &Kafka, topic: &str, partitions: i32, exp: &W5Expected) -> Result<u64, String> {
    let mut last: HashMap<(u32, i64), (i64, i64, Option<i64>)> = HashMap::new();
    let mut bad = Vec::new();
    let n = crate::kafka::read_all(&k.bootstrap, topic, partitions, |o| {
        let v: serde_json::Value = match serde_json::from_slice(&o.value) {
            Ok(v) => v,
            Err(e) => return bad.push(format!("unreadable output: {e}")),
        };
        let a = &v["value"];
        let u = a["key"]
            .as_str()
            .and_then(|s| s.strip_prefix("user-"))
            .and_then(|s| s.parse::<u32>().ok());
        let (Some(u), Some(ws), Some(c), Some(t)) = (
            u,
            a["windowStart"].as_i64(),
            a["count"].as_i64(),
            a["total"].as_i64(),
        ) else {
            return bad.push(format!("unexpected output {v}"));
        };
        last.insert((u, ws), (c, t, v["other"]["limit"].as_i64()));
    });
    for (key, want) in &exp.windows {
        let limit = exp.limits.get(&key.0).copied();
        match last.get(key) {
            Some(&(c, t, l)) if (c, t) == *want && l == limit => {}
            got => bad.push(format!(
                "user-{:06} window {}: expected (count, total, limit) ({}, {}, {limit:?}), got {got:?}",
                key.0, key.1, want.0, want.1
            )),
        }
    }
    for key in last.keys() {
        if !exp.windows.contains_key(key) {
            bad.push(format!("unexpected window user-{:06} {}", key.0, key.1));
        }
    }
    if bad.is_empty() {
        return Ok(n);
    }
    let total = bad.len();
    bad.truncate(5);
    Err(format!("{total} mismatches, e.g. {}", bad.join("; ")))
}
