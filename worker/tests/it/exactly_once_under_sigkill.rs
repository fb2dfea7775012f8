//! Exactly-once under crashes: a generator writes 200 000 records while the harness
//! SIGKILLs the worker at random points (at least 10 times) and restarts it. The
//! windowed counts and sums, read with `read_committed`, must be exact: for every key
//! and window the `onUpdate` outputs count 1, 2, …, n with no gap (loss) and no repeat
//! (duplicate), and the last sum is the expected one. The same run at-least-once may
//! repeat outputs but must lose nothing and end with exact aggregates.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use serde_json::json;

const RECORDS: i64 = 200_000;
const KEYS: i64 = 100;
const WINDOW_MS: i64 = 60_000;

/// Event time starts two hours ago: outputs carry their event time as the Kafka
/// timestamp, and a topic's time retention (7 days by default) would delete records
/// stamped years ago before the test reads them.
fn base_ts() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        (now - 7_200_000) / WINDOW_MS * WINDOW_MS
    })
}

fn manifest(app: &str, guarantee: &str) -> String {
    format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  processingGuarantee: {guarantee}
  commitInterval: 100ms
  source: {{topics: [{app}-in], timestamp: value.ts}}
  steps:
  - aggregate:
      store: totals
      groupBy: value.k
      window: {{tumbling: 1m}}
      fields: {{count: {{count: {{}}}}, sum: {{sum: value.amount}}}}
  sink: {{topic: {app}-out}}
"#,
        bootstrap = bootstrap()
    )
}

fn record(i: i64) -> (String, serde_json::Value) {
    let k = format!("k{}", i % KEYS);
    // Per key, event time only grows: no record is late.
    (
        k.clone(),
        json!({"k": k, "amount": i % 97, "ts": base_ts() + i * 10}),
    )
}

/// (key, windowStart) → (count, sum)
fn expected() -> BTreeMap<(String, i64), (i64, i64)> {
    let mut m = BTreeMap::new();
    for i in 0..RECORDS {
        let (k, v) = record(i);
        let ts = v["ts"].as_i64().unwrap();
        let e = m
            .entry((k, ts - ts.rem_euclid(WINDOW_MS)))
            .or_insert((0, 0));
        e.0 += 1;
        e.1 += v["amount"].as_i64().unwrap();
    }
    m
}

/// xorshift: reproducible "random" kill points.
struct Rng(u64);
impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

fn run_with_kills(guarantee: &str) -> (String, Vec<Out>) {
    let app = unique(&format!("crash-{}", &guarantee[..5]));
    let input = format!("{app}-in");
    create_topic(&input, 4);
    create_topic(&format!("{app}-out"), 4);
    let dir = scratch_dir(&app);
    let mut builder = WorkerBuilder::new(manifest(&app, guarantee), &dir.join("state"));
    // Two processing threads whatever the machine: kills land mid-turn on both.
    builder.extra_args = vec!["--threads".into(), "2".into()];

    let generator = {
        let input = input.clone();
        std::thread::spawn(move || {
            for chunk in 0..20 {
                let from = chunk * RECORDS / 20;
                let to = (chunk + 1) * RECORDS / 20;
                produce(
                    &input,
                    (from..to).map(|i| {
                        let (k, v) = record(i);
                        Input::json(&k, v)
                    }),
                );
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };

    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut kills = 0;
    let mut progressed = 0;
    // Per run: records handled when ready and at the kill (None: no status), for the
    // failure message.
    let mut samples = Vec::new();
    let mut last_log = String::new();
    while kills < 12 {
        let mut w = builder.spawn();
        w.wait_ready(Duration::from_secs(90));
        let before = w.handled();
        // Random kill point: somewhere in the next 0.2–1.5 s of processing.
        std::thread::sleep(Duration::from_millis(200 + rng.next(1300)));
        let after = w.handled();
        if after.unwrap_or(0) > before.unwrap_or(0) {
            progressed += 1;
        }
        samples.push((before, after));
        last_log = w.logs();
        w.kill9();
        kills += 1;
    }
    generator.join().unwrap();
    assert!(
        progressed >= 5,
        "the worker must be killed mid-work, not only at start ({progressed} of {kills} runs made progress; handled when ready and at the kill: {samples:?}); last worker's log:\n{last_log}"
    );

    // Every stage: the aggregate is behind a repartition by value.k.
    builder.process_all(&input);
    let isolation = if guarantee == "exactly_once" {
        "read_committed"
    } else {
        "read_uncommitted"
    };
    (app.clone(), read_all(&format!("{app}-out"), isolation))
}

fn by_window(out: &[Out]) -> BTreeMap<(String, i64), Vec<(i64, i64)>> {
    let mut m: BTreeMap<(String, i64), Vec<(i64, i64)>> = BTreeMap::new();
    for o in out {
        let v = o.json();
        let key = (
            v["key"].as_str().unwrap().to_string(),
            v["windowStart"].as_i64().unwrap(),
        );
        assert_eq!(v["windowEnd"].as_i64().unwrap(), key.1 + WINDOW_MS);
        m.entry(key)
            .or_default()
            .push((v["count"].as_i64().unwrap(), v["sum"].as_i64().unwrap()));
    }
    m
}

#[test]
fn exactly_once_output_is_exact_after_a_dozen_sigkills() {
    let (app, out) = run_with_kills("exactly_once");
    let got = by_window(&out);
    let want = expected();
    let missing: Vec<_> = want
        .keys()
        .filter(|k| !got.contains_key(*k))
        .take(10)
        .collect();
    assert_eq!(
        got.len(),
        want.len(),
        "{app}: windows with output; missing e.g. {missing:?}"
    );
    for (k, (count, sum)) in &want {
        let updates = &got[k];
        let counts: Vec<i64> = updates.iter().map(|u| u.0).collect();
        assert_eq!(
            counts,
            (1..=*count).collect::<Vec<_>>(),
            "{app}: updates of {k:?} must count 1..={count} with no loss or duplicate"
        );
        assert_eq!(updates.last().unwrap().1, *sum, "{app}: final sum of {k:?}");
    }
    assert_eq!(
        out.len() as i64,
        RECORDS,
        "one committed update per input record"
    );
}

#[test]
fn at_least_once_loses_nothing_after_a_dozen_sigkills() {
    let (app, out) = run_with_kills("at_least_once");
    let got = by_window(&out);
    let want = expected();
    for (k, (count, sum)) in &want {
        let updates = got
            .get(k)
            .unwrap_or_else(|| panic!("{app}: no output for {k:?}"));
        let (max_count, sum_at_max) = updates.iter().max_by_key(|u| u.0).copied().unwrap();
        assert_eq!(
            max_count, *count,
            "{app}: final count of {k:?} (state must not double-count replayed records)"
        );
        assert_eq!(sum_at_max, *sum, "{app}: final sum of {k:?}");
        let mut seen: Vec<i64> = updates.iter().map(|u| u.0).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen,
            (1..=*count).collect::<Vec<_>>(),
            "{app}: every intermediate count of {k:?} was emitted at least once"
        );
    }
}
