//! A worker pod that starts with an empty volume restores its state in full from the
//! changelog. While it does, `kubectl get sapp` shows the RESTORED percentage rising,
//! the status carries a plausible ETA, `Ready` is False because of the restore and the
//! phase is Restoring; once the restore ends the app is Ready at 100%, the pre-loaded
//! state answers queries and the app keeps counting on top of it.
//!
//! The state is written straight into the changelog topic (in the aggregate's stored
//! format) while the app runs no replica, so the restore is long without the worker
//! having processed millions of records.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::Api;
use oxbow_crds::{Phase, RestorationStatus, StoreName, StreamApp, names::changelog_topic};
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, unique,
    wait_for,
};
use oxbow_e2e::streams::{
    CountingApp, counting_state, http_get, http_get_retry_after, preload, produce, read_committed,
};

/// Tasks (source partitions): the pod restores all of them, one after the other.
const TASKS: i32 = 4;
/// Pre-loaded group keys: sized for a restore of several seconds on the local stack.
/// 3 000 000 once took 8–15 s; on a fresh broker it took 3 s, too short for the
/// reports to carry a rate and an ETA three times.
const KEYS: usize = 8_000_000;
/// Keys checked after the restore (queries, and counting on).
const PROBES: [usize; 4] = [0, 1_234_567, 2_000_001, KEYS - 1];

fn group(i: usize) -> String {
    format!("user-{i:07}")
}

/// The pre-loaded state of key `i`: (count, sum).
fn preloaded(i: usize) -> (i64, i64) {
    let count = (i % 9) as i64 + 1;
    (count, count * 10)
}

/// Kafka's murmur2 (Java client, `Utils.murmur2`): the partitioner the producers of the
/// suite and the workers' query routing use.
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let chunks = data.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

fn partition_of(key: &str) -> i32 {
    ((murmur2(key.as_bytes()) & 0x7fff_ffff) % TASKS as u32) as i32
}

/// Writes the aggregate state of every key straight into the changelog, in the
/// partition (task) of its group key.
fn preload_changelog(topic: &str) {
    preload(
        topic,
        (0..KEYS).map(|i| {
            let g = group(i);
            let (count, sum) = preloaded(i);
            (
                partition_of(&g),
                format!("k{g}"),
                counting_state(count, sum),
            )
        }),
    );
}

/// One look at the app while it scales up and restores.
#[derive(Debug)]
struct Sample {
    at: Duration,
    /// The RESTORED printer column of `kubectl get sapp`.
    column: String,
    phase: Option<Phase>,
    /// (status, reason, message)
    ready: Option<(String, String, String)>,
    restored: Option<(String, String, String)>,
    restoration: Option<RestorationStatus>,
}

impl Sample {
    fn restoring(&self) -> bool {
        self.restored.as_ref().is_some_and(|c| c.0 == "False")
    }
    fn ready(&self) -> bool {
        self.ready.as_ref().is_some_and(|c| c.0 == "True")
    }
}

/// The RESTORED cell of `kubectl get sapp <name>` (cut at the header's columns, so an
/// empty cell stays empty).
fn restored_column(ns: &str, name: &str) -> Result<String, String> {
    let (ok, out, err) = kubectl(&["get", "sapp", "-n", ns, name], None);
    if !ok {
        return Err(err);
    }
    let mut lines = out.lines();
    let header = lines.next().ok_or("no header")?;
    let row = lines.next().ok_or("no row")?;
    let start = header.find("RESTORED").ok_or("no RESTORED column")?;
    let end = header[start..]
        .find("AGE")
        .map_or(row.len(), |e| start + e)
        .min(row.len());
    Ok(row.get(start..end).unwrap_or_default().trim().to_string())
}

fn percent(p: &str) -> Option<i64> {
    p.strip_suffix('%')?.parse().ok()
}

#[tokio::test]
async fn a_full_restore_shows_rising_progress_and_an_eta_and_holds_ready() {
    let started = Instant::now();
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "restore").await;
    let n = ns.name.clone();
    let source = unique("events");
    kafka::create_topic(&source, TASKS).await;
    let operator = OperatorProcess::start(&n);
    let app = CountingApp::new(&unique("count"), &source)
        .replicas(0)
        .standbys(0);
    let name = app.name.clone();
    kafka::create_topic(&app.sink(), TASKS).await;
    // Half a CPU (the kubelet enforces it): the restore then lasts long enough for the
    // status, written at most every 10 s while restoring, to show it rising.
    let manifest = app.manifest().replace(
        "  storage: {size: 1Gi}",
        "  resources: {limits: {cpu: 500m}}\n  storage: {size: 1Gi}",
    );
    let (ok, _, err) = kubectl(&["apply", "-n", &n, "-f", "-"], Some(&manifest));
    assert!(ok, "apply: {err}");
    let api: Api<StreamApp> = Api::namespaced(client.clone(), &n);

    // 1. At 0 replicas the operator creates the changelog; fill it with the state.
    let changelog = changelog_topic(&format!("{n}.{name}"), &StoreName("totals".into()));
    wait_for(
        "the operator to create the changelog topic",
        Duration::from_secs(60),
        || async {
            match kafka::partitions(&changelog) {
                Some(p) if p == TASKS as usize => Ok(()),
                other => Err(format!(
                    "{changelog}: {other:?} partitions\n{}",
                    operator.logs()
                )),
            }
        },
    )
    .await;
    let t = Instant::now();
    let cl = changelog.clone();
    tokio::task::spawn_blocking(move || preload_changelog(&cl))
        .await
        .expect("preload");
    println!(
        "pre-loaded {KEYS} keys into {changelog} in {:.1?}",
        t.elapsed()
    );

    // 2. One replica: its volume is empty, so it restores everything.
    let (ok, _, err) = kubectl(
        &["scale", "-n", &n, &format!("sapp/{name}"), "--replicas=1"],
        None,
    );
    assert!(ok, "scale: {err}");
    let scaled = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    // A query during the restore: 503 with Retry-After and the progress.
    let mut refused_while_restoring: Option<(Option<String>, String)> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(300));
    loop {
        tick.tick().await;
        assert!(
            scaled.elapsed() < Duration::from_secs(240),
            "not Ready at 100% within 240 s of scaling to 1; last samples: {:#?}\n{}",
            samples.iter().rev().take(3).collect::<Vec<_>>(),
            operator.logs()
        );
        let Ok(a) = api.get(&name).await else {
            continue;
        };
        let Ok(column) = restored_column(&n, &name) else {
            continue;
        };
        // kubectl's column and the object are two reads: a status written between them
        // would pair one version's column with another's figures. Such a sample is
        // dropped, not judged.
        match api.get(&name).await {
            Ok(again) if again.metadata.resource_version == a.metadata.resource_version => {}
            _ => continue,
        }
        let st = a.status.clone().unwrap_or_default();
        if refused_while_restoring.is_none()
            && st
                .restoration
                .as_ref()
                .is_some_and(|r| r.tasks_restoring > 0)
            && let Some(addr) = st
                .instances
                .iter()
                .find(|i| i.pod == format!("{name}-0"))
                .and_then(|i| i.address.clone())
            && let Ok((503, retry, body)) = http_get_retry_after(
                &addr,
                &format!("/v1/stores/totals/keys/{}", group(PROBES[0])),
            )
            .await
        {
            refused_while_restoring = Some((retry, body));
        }
        let s = Sample {
            at: scaled.elapsed(),
            column,
            phase: st.phase,
            ready: apps::condition(&a, "Ready"),
            restored: apps::condition(&a, "Restored"),
            restoration: st.restoration,
        };
        if s.restoring() || samples.last().is_none_or(|l| l.column != s.column) {
            let r = s.restoration.as_ref();
            println!(
                "{:>6.1?} RESTORED={:<5} phase={:?} ready={:?} records={:?}/{:?} rate={:?}/s eta={:?}s tasks={:?}",
                s.at,
                s.column,
                s.phase,
                s.ready.as_ref().map(|c| format!("{}/{}", c.0, c.1)),
                r.map(|r| r.restored_records),
                r.map(|r| r.total_records),
                r.and_then(|r| r.records_per_second),
                r.and_then(|r| r.eta_seconds),
                r.map(|r| r.tasks_restoring),
            );
        }
        let done = s.ready() && s.column == "100%";
        samples.push(s);
        if done {
            break;
        }
    }
    let ready_at = samples.last().map(|s| s.at).unwrap_or_default();

    // 3. What the samples show.
    let restoring: Vec<&Sample> = samples.iter().filter(|s| s.restoring()).collect();
    let first = restoring.first().map(|s| s.at).unwrap_or_default();
    let last = restoring.last().map(|s| s.at).unwrap_or_default();
    println!(
        "restore observed from {first:.1?} to {last:.1?} after scaling ({:.1?}); Ready at {ready_at:.1?}; {} samples while restoring",
        last.saturating_sub(first),
        restoring.len()
    );
    let shown: Vec<i64> = restoring
        .iter()
        .filter_map(|s| percent(&s.column))
        .collect();
    let mut distinct = shown.clone();
    distinct.dedup();
    println!("RESTORED column while restoring: {distinct:?}");
    assert!(
        distinct.iter().filter(|p| **p < 100).count() >= 3,
        "the RESTORED column showed fewer than 3 values below 100% while restoring: {distinct:?}"
    );
    assert!(
        shown.windows(2).all(|w| w[0] <= w[1]),
        "the RESTORED column went down during one full restore: {distinct:?}"
    );
    for s in &restoring {
        assert!(!s.ready(), "Ready was True while restoring: {s:?}");
        let (_, reason, message) = s.ready.clone().unwrap_or_default();
        assert!(
            format!("{reason} {message}")
                .to_lowercase()
                .contains("restor"),
            "Ready is False for a reason that does not name the restore: {s:?}"
        );
        assert_eq!(
            s.phase,
            Some(Phase::Restoring),
            "phase while restoring: {s:?}"
        );
        let r = s.restoration.as_ref().expect("restoration while restoring");
        assert!(
            r.total_records <= KEYS as i64 && r.restored_records <= r.total_records,
            "{s:?}"
        );
    }
    // The restore is one stretch: nothing claims 100% before it ends, and once it
    // ended (the pod may take a probe period more to be ready) it stays at 100%.
    for s in samples.iter().filter(|s| s.at >= first) {
        let during = s.at <= last;
        assert!(
            s.restoring() == during && (s.column == "100%") != during && !(during && s.ready()),
            "the restore did not show as one stretch ending at 100% (ended at {last:?}): {s:?}"
        );
    }
    // The ETA: present once a rate is known, consistent with the figures, and within
    // reach of when the restore really ended.
    let with_eta: Vec<(Duration, i64, i64)> = restoring
        .iter()
        .filter_map(|s| {
            let r = s.restoration.as_ref()?;
            Some((s.at, r.eta_seconds?, r.records_per_second?))
        })
        .collect();
    println!(
        "ETA while restoring (at, eta s, actual s left, rate/s): {:?}",
        with_eta
            .iter()
            .map(|(at, eta, rate)| format!(
                "{at:.1?}: {eta}s vs {:.1}s at {rate}/s",
                last.saturating_sub(*at).as_secs_f64()
            ))
            .collect::<Vec<_>>()
    );
    assert!(
        with_eta.len() >= 3,
        "etaSeconds was present in only {} samples while restoring",
        with_eta.len()
    );
    for s in &restoring {
        let r = s.restoration.as_ref().expect("restoration");
        if let Some(rate) = r.records_per_second.filter(|r| *r > 0) {
            let remaining = r.total_records - r.restored_records;
            assert_eq!(
                r.eta_seconds,
                Some((remaining + rate - 1) / rate),
                "etaSeconds is not the remaining records at the rate: {s:?}"
            );
        }
    }
    // Each ETA is judged where it first shows: the status is rewritten every few
    // seconds, so later samples repeat the same figure while the restore moves on (a
    // restore that ends early would otherwise fail a figure that was right when made).
    let fresh = with_eta
        .iter()
        .enumerate()
        .filter(|(i, (_, eta, rate))| {
            *i == 0 || (with_eta[i - 1].1, with_eta[i - 1].2) != (*eta, *rate)
        })
        .map(|(_, s)| s);
    for (at, eta, _) in fresh {
        let left = last.saturating_sub(*at).as_secs_f64();
        assert!(
            (*eta as f64) <= 3.0 * left + 5.0 && (*eta as f64) >= left / 3.0 - 5.0,
            "at {at:.1?} the ETA was {eta}s, but the restore ended {left:.1}s later: {with_eta:?}"
        );
    }
    let end = samples.last().expect("a sample");
    let r = end.restoration.as_ref().expect("restoration when Ready");
    assert_eq!(
        (r.percent.as_str(), r.eta_seconds, r.tasks_restoring),
        ("100%", None, 0),
        "{end:?}"
    );
    assert_eq!(end.phase, Some(Phase::Running), "{end:?}");

    let (retry, body) =
        refused_while_restoring.expect("no query was refused with 503 while the pod restored");
    println!("query while restoring: 503, Retry-After {retry:?}: {body}");
    let secs: u64 = retry
        .as_deref()
        .and_then(|r| r.parse().ok())
        .expect("503 without a numeric Retry-After");
    assert!((1..=300).contains(&secs), "Retry-After {secs}");
    assert!(body.contains("restor"), "the 503 says why: {body}");

    // 4. The restored state: the pod answers the pre-loaded values…
    let a = api.get(&name).await.expect("app");
    let addr = a
        .status
        .unwrap_or_default()
        .instances
        .iter()
        .find(|i| i.pod == format!("{name}-0"))
        .and_then(|i| i.address.clone())
        .expect("the pod's address");
    for i in PROBES {
        let (count, sum) = preloaded(i);
        let (code, body) = http_get(&addr, &format!("/v1/stores/totals/keys/{}", group(i)))
            .await
            .expect("query");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON answer");
        assert_eq!(
            (code, &v["value"]["count"], &v["value"]["sum"]),
            (200, &serde_json::json!(count), &serde_json::json!(sum)),
            "key {}: {body}",
            group(i)
        );
    }
    // …and keeps counting on top of them.
    let keys: Vec<String> = PROBES.iter().map(|i| group(*i)).collect();
    produce(&source, &keys, 2, 1);
    let want: BTreeMap<String, Vec<(i64, i64)>> = PROBES
        .iter()
        .map(|i| {
            let (c, s) = preloaded(*i);
            (group(*i), vec![(c + 1, s + 1), (c + 2, s + 2)])
        })
        .collect();
    wait_for(
        "running counts on top of the restored state in the committed output",
        Duration::from_secs(60),
        || async {
            let mut got: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
            for (k, v) in read_committed(&app.sink()) {
                got.entry(k).or_default().push((
                    v["count"].as_i64().unwrap_or(-1),
                    v["sum"].as_i64().unwrap_or(-1),
                ));
            }
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}, want {want:?}"))
            }
        },
    )
    .await;
    println!(
        "restore: {KEYS} records, Ready {ready_at:.1?} after scaling to 1; test took {:.1?}",
        started.elapsed()
    );

    apps::delete_all(&api).await;
    ns.delete().await;
}
