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

/// Checks a W1 output topic: the last update of every (key, window) must equal the
/// expected count and total, with no extra windows. Returns the number of output
/// records, or the first mismatches.
pub fn check_w1(
    k: &Kafka,
    topic: &str,
    partitions: i32,
    expected: &W1Expected,
) -> Result<u64, String> {
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
        last.insert((u, ws), (c, t));
    });
    for (key, want) in expected {
        match last.get(key) {
            Some(got) if got == want => {}
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
    if bad.is_empty() {
        Ok(n)
    } else {
        let total = bad.len();
        bad.truncate(5);
        Err(format!("{total} mismatches, e.g. {}", bad.join("; ")))
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

/// W3 input: one payment for each of `keys` keys (a changelog of `keys` records), or with
/// `first..first+n` a second payment for n of them (the tail).
pub fn w3(k: &Kafka, topic: &str, range: std::ops::Range<u64>, seed: u64, base_ts: i64) {
    let p = generator_producer(&k.bootstrap);
    let mut rng = Rng::new(seed ^ 0x3333 ^ range.start);
    for (n, i) in range.enumerate() {
        let x = rng.next();
        let name = format!("key-{i:07}");
        let ts = base_ts + n as i64;
        send(
            &p,
            topic,
            name.as_bytes(),
            payment(&name, x % 10_000, (x >> 40) % 1000, ts).as_bytes(),
            ts,
        );
    }
    p.flush(Duration::from_secs(300)).expect("flush");
}
