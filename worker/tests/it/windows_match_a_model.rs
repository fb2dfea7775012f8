//! Windows: tumbling, hopping and session windows with `emit: onWindowClose`, fed
//! records that arrive late (inside and outside grace), checked against a
//! straightforward model of the rules: stream time is the largest event time seen; a
//! window closes when stream time reaches its end plus grace; a record is counted in
//! every window of its own that is still open, and dropped if none is.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use serde_json::json;

type Key = (String, i64, i64); // key, start, end
type Agg = (i64, i64); // count, sum

/// (key, ts, amount) in arrival order: mostly in order, some late by a little (inside
/// grace) and some by a lot (outside), over three keys; the last record moves stream
/// time far ahead so every earlier window closes.
fn events() -> Vec<(String, i64, i64)> {
    // Recent event times: outputs are stamped with them, and time retention would delete
    // records stamped in 1970.
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        (now - 86_400_000) / 60_000 * 60_000
    });
    let mut v = Vec::new();
    let mut x: u64 = 42;
    for i in 0..600i64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = format!("u{}", x % 3);
        let mut ts = i * 1_000;
        match x % 10 {
            0 => ts -= 3_000,  // late, inside a 5 s grace
            1 => ts -= 40_000, // late, outside grace
            _ => {}
        }
        v.push((key, base + ts.max(0), (x % 50) as i64));
    }
    v.push(("u0".into(), base + 10_000_000, 1));
    v
}

fn model(
    windows: &dyn Fn(i64) -> Vec<(i64, i64)>,
    grace: i64,
    session_gap: Option<i64>,
) -> BTreeMap<Key, Agg> {
    let mut st = i64::MIN;
    let mut open: BTreeMap<Key, Agg> = BTreeMap::new();
    for (k, ts, amount) in events() {
        st = st.max(ts);
        match session_gap {
            None => {
                for (s, e) in windows(ts) {
                    if st < e + grace {
                        let a = open.entry((k.clone(), s, e)).or_default();
                        a.0 += 1;
                        a.1 += amount;
                    }
                }
            }
            Some(gap) => {
                if st >= ts + gap + grace {
                    continue; // its own session would already be closed
                }
                let (mut s, mut e, mut agg) = (ts, ts + gap, (1, amount));
                let mergeable: Vec<Key> = open
                    .keys()
                    .filter(|(kk, ws, we)| {
                        kk == &k && st < we + grace && ts <= *we && ts + gap >= *ws
                    })
                    .cloned()
                    .collect();
                for m in mergeable {
                    let a = open.remove(&m).unwrap();
                    s = s.min(m.1);
                    e = e.max(m.2);
                    agg = (agg.0 + a.0, agg.1 + a.1);
                }
                open.insert((k.clone(), s, e), agg);
            }
        }
    }
    open.into_iter()
        .filter(|((_, _, e), _)| st >= e + grace)
        .collect()
}

/// A one-partition app `<prefix>-…` whose input holds `records` and whose single step
/// is an aggregate on store `w` (`n` counts, `total` sums `value.amount`), event time
/// `value.ts`: its name, input topic and manifest.
fn window_app(
    prefix: &str,
    records: impl IntoIterator<Item = Input>,
    group_by: &str,
    window_yaml: &str,
    emit: &str,
) -> (String, String, String) {
    let app = unique(prefix);
    let input = format!("{app}-in");
    create_topic(&input, 1);
    create_topic(&format!("{app}-out"), 1);
    produce(&input, records);
    let manifest = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  source: {{topics: [{input}], timestamp: value.ts}}
  steps:
  - aggregate:
      store: w
      groupBy: {group_by}
      window: {window_yaml}
      emit: {emit}
      fields: {{n: {{count: {{}}}}, total: {{sum: value.amount}}}}
  sink: {{topic: {app}-out}}
"#,
        bootstrap = bootstrap()
    );
    (app, input, manifest)
}

fn run(name: &str, window_yaml: &str) -> BTreeMap<Key, Agg> {
    let (app, input, manifest) = window_app(
        name,
        events()
            .into_iter()
            .map(|(k, ts, amount)| Input::json(&k, json!({"k": k, "ts": ts, "amount": amount}))),
        "value.k",
        window_yaml,
        "onWindowClose",
    );
    let dir = scratch_dir(&app);
    WorkerBuilder::new(manifest, &dir.join("state")).process_all(&input);
    let mut got = BTreeMap::new();
    for o in read_all(&format!("{app}-out"), "read_committed") {
        let v = o.json();
        let k = (
            v["key"].as_str().unwrap().to_string(),
            v["windowStart"].as_i64().unwrap(),
            v["windowEnd"].as_i64().unwrap(),
        );
        let prev = got.insert(
            k.clone(),
            (v["n"].as_i64().unwrap(), v["total"].as_i64().unwrap()),
        );
        assert!(
            prev.is_none(),
            "onWindowClose emits one record per key and window; {k:?} came twice"
        );
    }
    got
}

#[test]
fn tumbling_windows_with_grace_match_the_model() {
    let size = 10_000;
    let want = model(
        &|ts| vec![(ts - ts.rem_euclid(size), ts - ts.rem_euclid(size) + size)],
        5_000,
        None,
    );
    assert!(want.len() > 100);
    assert_eq!(run("tumbling", "{tumbling: 10s, grace: 5s}"), want);
}

#[test]
fn hopping_windows_with_grace_match_the_model() {
    let (size, advance) = (20_000, 5_000);
    let windows = |ts: i64| {
        let last = ts - ts.rem_euclid(advance);
        let mut v = Vec::new();
        let mut s = last;
        while s > ts - size {
            v.push((s, s + size));
            s -= advance;
        }
        v
    };
    let want = model(&windows, 5_000, None);
    assert_eq!(
        run("hopping", "{hopping: {size: 20s, advance: 5s}, grace: 5s}"),
        want
    );
}

#[test]
fn session_windows_with_grace_match_the_model() {
    let want = model(&|_| vec![], 5_000, Some(2_500));
    assert!(
        want.values().any(|a| a.0 > 1),
        "some sessions merged records"
    );
    assert_eq!(run("session", "{session: {gap: 2500ms}, grace: 5s}"), want);
}

/// Task 0_0's state and its store `w`, the worker stopped.
fn open_store(state: &std::path::Path) -> (oxbow_worker::store::TaskDb, oxbow_crds::StoreName) {
    let app_dir = std::fs::read_dir(state)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .expect("the app's state directory");
    let task = oxbow_crds::TaskId::new(0, 0);
    let store = oxbow_crds::StoreName("w".into());
    let memory = oxbow_worker::store::SharedMemory::new(16 << 20);
    let db = oxbow_worker::store::TaskDb::open(
        &app_dir.join(task.to_string()),
        task,
        std::slice::from_ref(&store),
        &memory,
    )
    .unwrap();
    (db, store)
}

/// Every entry of the app's single task's store `w`: (key, value) bytes.
fn stored_entries(state: &std::path::Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let (db, store) = open_store(state);
    let mut out = Vec::new();
    db.scan(&store, &mut |k, v| {
        out.push((k.to_vec(), v.to_vec()));
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn a_keys_windows_are_stored_one_row_each_so_no_stored_value_grows_with_them() {
    // One key, 300 one-second windows, all kept for an hour.
    let base = events()[0].1;
    let (app, input, manifest) = window_app(
        "rows",
        (0..300i64)
            .map(|i| Input::json("k", json!({"k": "k", "ts": base + i * 1000, "amount": 1}))),
        "key",
        "{tumbling: 1s, retention: 1h}",
        "onUpdate",
    );
    let dir = scratch_dir(&app);
    WorkerBuilder::new(manifest, &dir.join("state")).process_all(&input);
    let out = read_all(&format!("{app}-out"), "read_committed");
    assert_eq!(
        out.len(),
        300,
        "one update per record: {:?}",
        out.iter().map(|o| o.json()).take(3).collect::<Vec<_>>()
    );

    let entries = stored_entries(&dir.join("state"));
    let rows = entries.iter().filter(|(k, _)| k.starts_with(b"w")).count();
    assert_eq!(rows, 300, "one row per window");
    let largest = entries.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    assert!(
        largest < 256,
        "no stored value holds more than one window: the largest is {largest} bytes"
    );
}

/// Rewrites task 0_0's store `w` in the layout from before window rows: every window of
/// a key in its `k` value, a due index entry per key, `m:due-index`; keeps the
/// checkpoint.
fn rewrite_as_one_value_per_key(state: &std::path::Path) {
    use oxbow_worker::steps::{AggState, WindowAgg, keys};
    let (db, store) = open_store(state);
    let mut groups: BTreeMap<String, AggState> = BTreeMap::new();
    let mut writes = Vec::new();
    db.scan(&store, &mut |k, v| {
        if let Some((g, _, _)) = keys::split_window_key(k) {
            let w: WindowAgg = serde_json::from_slice(v).unwrap();
            groups
                .entry(String::from_utf8_lossy(g).into_owned())
                .or_default()
                .windows
                .push(w);
        }
        if k.starts_with(keys::WINDOW_PREFIX)
            || k.starts_with(keys::WINDOW_DUE_PREFIX)
            || k == keys::WINDOW_ROWS_MARK
        {
            writes.push(((store.clone(), k.to_vec()), None));
        }
        Ok(())
    })
    .unwrap();
    assert!(!groups.is_empty(), "the store held windows");
    for (g, s) in &groups {
        let first_end = s.windows.iter().map(|w| w.end).min().unwrap();
        writes.push((
            (store.clone(), keys::aggregate_key(g)),
            Some(serde_json::to_vec(s).unwrap()),
        ));
        writes.push((
            (store.clone(), keys::due_key(first_end, g)),
            Some(Vec::new()),
        ));
    }
    writes.push((
        (store.clone(), keys::DUE_INDEX_MARK.to_vec()),
        Some(Vec::new()),
    ));
    let c = db.checkpoint().unwrap();
    db.commit(&writes, &c.changelog, &c.source).unwrap();
}

#[test]
fn a_store_with_every_window_of_a_key_in_one_value_is_converted_to_rows_at_start() {
    let base = events()[0].1;
    let (app, input, manifest) = window_app(
        "convert",
        (0..120i64).map(|i| {
            let k = format!("u{}", i % 3);
            Input::json(&k, json!({"k": k, "ts": base + i * 1000, "amount": i}))
        }),
        "key",
        "{tumbling: 2s, retention: 1h}",
        "onUpdate",
    );
    let dir = scratch_dir(&app);
    let state = dir.join("state");
    let builder = WorkerBuilder::new(manifest, &state);
    builder.process_all(&input);
    let cfg = dir.join("app-0.yaml");
    let before = digests(&cfg, &state);
    let rows_before = stored_entries(&state)
        .iter()
        .filter(|(k, _)| k.starts_with(b"w"))
        .count();

    rewrite_as_one_value_per_key(&state);
    assert!(
        stored_entries(&state)
            .iter()
            .any(|(k, _)| k.starts_with(b"k")),
        "the store is in the old layout"
    );
    let mut w = builder.spawn();
    w.wait_ready(Duration::from_secs(90));
    w.stop();

    let entries = stored_entries(&state);
    assert_eq!(
        entries.iter().filter(|(k, _)| k.starts_with(b"w")).count(),
        rows_before,
        "every window is a row again"
    );
    assert!(
        !entries
            .iter()
            .any(|(k, _)| k.starts_with(b"k") || k.starts_with(b"d")),
        "no value or index of the old layout is left"
    );
    assert_eq!(digests(&cfg, &state), before, "the same state as before");
}
