//! The latency of a pod's running tasks while another task of the same pod does a full
//! restore (issue 19, item 3): the p50/p99/max from an input's timestamp to its output
//! seen by a read_committed consumer, in a steady window before the restore and during
//! it.
//!
//! ```sh
//! make bench-restore                                     # 2 000 000 keys, 1 000 records/s
//! OXBOW_WORKER_BIN=/tmp/old-oxbow-worker make bench-restore   # an older worker
//! ```
//!
//! One real `oxbow-worker` process plays pod A of a counting app with three partitions,
//! coordinated through the stack's API server (the bench plays the operator, as the
//! suite's played apps do). A runs tasks 1 and 2 under a steady input; task 0's
//! changelog is pre-loaded with `BENCH_RESTORE_KEYS` keys; then task 0 is moved to A,
//! which restores it fully while the input to tasks 1 and 2 goes on.
//!
//! Settings (environment):
//! - `BENCH_RESTORE_KEYS` (2000000): keys in task 0's changelog.
//! - `BENCH_RESTORE_RATE` (1000): input records per second, to tasks 1 and 2.
//! - `BENCH_RESTORE_BASELINE_SECS` (10): the window measured before the restore.
//! - `BENCH_RESTORE_GUARANTEE` (`exactly_once`): or `at_least_once`.
//! - `OXBOW_WORKER_BIN`: the worker binary (default: the release build).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use oxbow_e2e::harness::{
    TestNamespace, install_crd, kafka_bootstrap, kube_client, stack_var, unique, wait_for,
};
use oxbow_e2e::streams::preload_task0_counts;
use oxbow_e2e::workers::{PlayedApp, WorkerProc, assignment, placement as on, played_app, publish};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, Timestamp};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Task `task`'s state on `w` and the records its restore has left.
fn task_state(w: &WorkerProc, task: &str) -> Option<(String, i64)> {
    let status = w.status()?;
    let t = status["tasks"]
        .as_array()?
        .iter()
        .find(|t| t["task"] == task && t["role"] == "active")?
        .clone();
    Some((
        t["state"].as_str()?.to_string(),
        t["restore"]["remaining"].as_i64().unwrap_or(0),
    ))
}

/// Sends `rate` records a second to partitions 1 and 2 of `topic` until `stop`, each
/// stamped with the producer's clock; counts them in `sent`.
fn steady_input(topic: String, rate: u64, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("linger.ms", "0")
        .create()
        .expect("input producer");
    let start = Instant::now();
    let mut i: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let key = format!("k{}", i % 1000);
        let mut rec = BaseRecord::to(&topic)
            .partition(1 + (i % 2) as i32)
            .key(key.as_str())
            .payload("{\"amount\":1}")
            .timestamp(now_ms());
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    rec = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        i += 1;
        sent.store(i, Ordering::Relaxed);
    }
    p.flush(Duration::from_secs(30)).expect("flush the input");
}

/// Reads `topic` (3 partitions) read_committed until `stop`: (input timestamp, latency
/// in ms) per output.
fn read_latencies(topic: String, stop: Arc<AtomicBool>, seen: Arc<AtomicU64>) -> Vec<(i64, i64)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("restore-latency"))
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .create()
        .expect("output consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition_offset(&topic, p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(50))
            && let Timestamp::CreateTime(ts) = m.timestamp()
        {
            out.push((ts, now_ms() - ts));
            seen.fetch_add(1, Ordering::Relaxed);
        }
    }
    out
}

/// p50, p99 and max of `lat` (sorted in place), in ms.
fn percentiles(lat: &mut [i64]) -> (i64, i64, i64) {
    lat.sort_unstable();
    let at = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(-1)
    };
    (at(0.5), at(0.99), at(1.0))
}

/// Tasks 1 and 2 on pod `a_pod`; task 0 on `gone_pod`, which never starts: publishes that
/// assignment, starts A and waits until it runs its two tasks.
async fn start_a(
    ns: &str,
    played: &PlayedApp,
    cms: &Api<ConfigMap>,
    a_pod: &str,
    gone_pod: &str,
    kubeconfig: &str,
) -> WorkerProc {
    let app = &played.name;
    let gen1 = assignment(
        1,
        [on(gone_pod, &[]), on(a_pod, &[]), on(a_pod, &[])],
        &[a_pod, gone_pod],
    );
    publish(cms, app, &gen1).await;
    let a = WorkerProc::start(
        ns,
        app,
        a_pod,
        &played.config,
        &played.dir,
        Path::new(kubeconfig),
    );
    wait_for(
        "A to run tasks 1 and 2",
        Duration::from_secs(90),
        || async {
            let ra = a.running();
            (ra == ["0_1", "0_2"])
                .then_some(())
                .ok_or_else(|| format!("A runs {ra:?}\n--- A\n{}", a.logs()))
        },
    )
    .await;
    a
}

/// What a measurement saw: every output (input timestamp, latency ms), the bounds of
/// the steady window and of the restore (epoch ms), the worker's restore line and the
/// inputs sent.
struct Measured {
    out: Vec<(i64, i64)>,
    steady_from: i64,
    assigned: i64,
    restored: i64,
    restore: String,
    total: u64,
}

/// Runs the steady input and the output reader through a `baseline` window, then moves
/// task 0 to A (pod `a_pod`) and waits for its restore and for every input's output.
async fn measure(
    a: &WorkerProc,
    played: &PlayedApp,
    cms: &Api<ConfigMap>,
    a_pod: &str,
    rate: u64,
    baseline: Duration,
) -> Measured {
    let app = &played.name;
    // The steady input and the output reader run through the whole measurement.
    let stop_in = Arc::new(AtomicBool::new(false));
    let stop_out = Arc::new(AtomicBool::new(false));
    let (sent, seen) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let reader = {
        let (t, s, n) = (played.sink.clone(), stop_out.clone(), seen.clone());
        std::thread::spawn(move || read_latencies(t, s, n))
    };
    let input = {
        let (t, s, n) = (played.source.clone(), stop_in.clone(), sent.clone());
        std::thread::spawn(move || steady_input(t, rate, s, n))
    };
    // A fifth of the baseline warms up; the rest is the steady window.
    tokio::time::sleep(baseline / 5).await;
    let steady_from = now_ms();
    tokio::time::sleep(baseline).await;

    // Task 0 moves to A, which restores it fully while tasks 1 and 2 go on.
    let assigned = now_ms();
    let gen2 = assignment(
        2,
        [on(a_pod, &[]), on(a_pod, &[]), on(a_pod, &[])],
        &[a_pod],
    );
    publish(cms, app, &gen2).await;
    wait_for(
        "A to run task 0 after its restore",
        Duration::from_secs(300),
        || async {
            let ra = a.running();
            (ra == ["0_0", "0_1", "0_2"])
                .then_some(())
                .ok_or_else(|| format!("A runs {ra:?}, task 0 {:?}", task_state(a, "0_0")))
        },
    )
    .await;
    let restored = now_ms();
    let restore = a
        .logs()
        .lines()
        .rev()
        .find(|l| l.contains("restored") && l.contains("0_0"))
        .map(str::to_string)
        .unwrap_or_default();
    // A little steady input after the restore, then every input's output.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_in.store(true, Ordering::Relaxed);
    input.join().expect("input thread");
    let total = sent.load(Ordering::Relaxed);
    wait_for("every input's output", Duration::from_secs(120), || async {
        let n = seen.load(Ordering::Relaxed);
        (n >= total)
            .then_some(())
            .ok_or_else(|| format!("{n} outputs for {total} inputs"))
    })
    .await;
    stop_out.store(true, Ordering::Relaxed);
    let out = reader.join().expect("reader thread");
    Measured {
        out,
        steady_from,
        assigned,
        restored,
        restore,
        total,
    }
}

/// Prints the table of the steady window and the restore's; returns how many outputs
/// each had.
fn print_report(m: &Measured, guarantee: &str, rate: u64, keys: usize) -> (usize, usize) {
    let window = |from: i64, to: i64| -> Vec<i64> {
        m.out
            .iter()
            .filter(|(ts, _)| (from..to).contains(ts))
            .map(|(_, l)| *l)
            .collect()
    };
    let (mut before, mut during) = (
        window(m.steady_from, m.assigned),
        window(m.assigned, m.restored),
    );
    let (b50, b99, bmax) = percentiles(&mut before);
    let (d50, d99, dmax) = percentiles(&mut during);
    println!(
        "\nrunning tasks' latency (ms, input timestamp to read_committed output), {guarantee}, {rate} records/s, task 0 restoring {keys} keys:\n"
    );
    println!("| window | outputs | p50 | p99 | max |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| steady, before the restore | {} | {b50} | {b99} | {bmax} |",
        before.len()
    );
    println!(
        "| during the restore ({:.1} s) | {} | {d50} | {d99} | {dmax} |",
        (m.restored - m.assigned) as f64 / 1000.0,
        during.len()
    );
    println!(
        "\np99 during / before: {:.2}x; {} inputs, {} outputs\nworker: {}",
        d99 as f64 / b99.max(1) as f64,
        m.total,
        m.out.len(),
        m.restore.trim()
    );
    (before.len(), during.len())
}

#[tokio::main]
async fn main() {
    let keys: usize = env_or("BENCH_RESTORE_KEYS", 2_000_000);
    let rate: u64 = env_or("BENCH_RESTORE_RATE", 1000);
    let baseline = Duration::from_secs(env_or("BENCH_RESTORE_BASELINE_SECS", 10));
    let guarantee: String = env_or("BENCH_RESTORE_GUARANTEE", "exactly_once".to_string());
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "restore-latency").await;
    let played = played_app(&ns.name, &unique("rlat"), &guarantee, 3).await;
    let app = &played.name;
    let kubeconfig = stack_var("KUBECONFIG");
    let [a_pod, gone_pod] = [0, 1].map(|i| format!("{app}-{i}"));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);

    // Tasks 1 and 2 on A; task 0 on a pod that never starts, its changelog pre-loaded.
    let a = start_a(&ns.name, &played, &cms, &a_pod, &gone_pod, &kubeconfig).await;
    eprintln!("pre-loading {keys} keys into task 0's changelog…");
    preload_task0_counts(&ns.name, app, keys).await;

    let m = measure(&a, &played, &cms, &a_pod, rate, baseline).await;
    drop(a);

    let (before, during) = print_report(&m, &guarantee, rate, keys);
    ns.delete().await;
    assert!(
        during > 0 && before > 0,
        "a window without outputs: before {before}, during {during}"
    );
}
