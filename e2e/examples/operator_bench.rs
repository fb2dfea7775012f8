//! Operator figures on the local stack (issue 7, item 5): the RSS of one `oxbow-operator`
//! managing N StreamApps, and the time from `kubectl apply` to each app's StatefulSet and
//! to its `Ready` condition. The workers are the fast stand-ins (`oxbow-standin:*`), so
//! the times are the operator's, the API server's and the node agent's, not a worker's.
//!
//! ```sh
//! make bench-operator                                    # N = 50, burst
//! BENCH_OPERATOR_APPS=10 BENCH_OPERATOR_MODE=both make bench-operator
//! ```
//!
//! Settings (environment; the first argument also sets the app count):
//! - `BENCH_OPERATOR_APPS` (50): StreamApps per run.
//! - `BENCH_OPERATOR_MODE` (`burst`): `burst` applies all N in one `kubectl apply`;
//!   `sequential` applies one at a time and waits for it to be Ready; `both`.
//! - `BENCH_OPERATOR_IDLE_SECS` (20): how long RSS is sampled (every second) once all N
//!   are Ready.
//! - `BENCH_OPERATOR_TIMEOUT_SECS` (600): how long to wait for all N to be Ready.
//! - `BENCH_OPERATOR_RESYNC` (`3s`, the suite's): the operator's `--resync-interval`.
//! - `BENCH_OPERATOR_CLEAN_PREFIX`: instead of a run, delete the topics whose names start
//!   with it (an interrupted run's, e.g. `ob-1a2b3c4`) and exit.
//!
//! It makes its own namespace, source topic and operator (`OperatorProcess`, which runs
//! the release `oxbow-operator` with the suite's flags: `--resync-interval 3s`,
//! `--cleanup-timeout 20s`, watching only that namespace), and removes them at the end.
//! Each app is the suite's fixture (`apps::manifest`: a dedupe and an aggregate store, so
//! two changelog topics and a dead-letter topic per app) with `replicas: 1`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::Api;
use kube::runtime::watcher;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kafka_bootstrap, kube_client,
    kubectl, unique,
};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// First time each StatefulSet was seen, and first time each StreamApp was Ready (for its
/// current generation), by name.
#[derive(Default)]
struct Seen {
    sts: HashMap<String, Instant>,
    ready: HashMap<String, Instant>,
    /// First watch event of the StreamApp: it exists in the API server.
    created: HashMap<String, Instant>,
}

/// One reading of /proc/<pid>/status and /proc/<pid>/stat.
#[derive(Clone, Copy, Debug, Default)]
struct Mem {
    rss_kib: u64,
    hwm_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    threads: u64,
}

fn read_mem(pid: u32) -> Mem {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Mem {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
        anon_kib: field("RssAnon:"),
        file_kib: field("RssFile:"),
        threads: field("Threads:"),
    }
}

/// `name × count` of the process's threads, and how many of its descriptors are sockets
/// (mostly connections to the API server and Kafka).
fn threads_and_sockets(pid: u32) -> String {
    let mut names: std::collections::BTreeMap<String, usize> = Default::default();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
    {
        if let Ok(comm) =
            std::fs::read_to_string(task.map(|t| t.path().join("comm")).unwrap_or_default())
        {
            *names.entry(comm.trim().to_string()).or_default() += 1;
        }
    }
    let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count();
    let threads: Vec<String> = names.iter().map(|(n, c)| format!("{n} × {c}")).collect();
    format!("threads {}; {sockets} sockets", threads.join(", "))
}

fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// User + system CPU seconds of the process so far.
fn cpu_secs(pid: u32, tck: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // After the command name: state is field 3, utime 14, stime 15.
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(14) + ticks(15)) / tck
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn median_u64(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The operator's own count of its Kubernetes API requests, by verb
/// (`oxbow_operator_api_requests_total`).
async fn api_requests(metrics_addr: &str) -> std::collections::BTreeMap<String, f64> {
    let text = match oxbow_e2e::streams::http_get(metrics_addr, "/metrics").await {
        Ok((200, text)) => text,
        other => panic!("failed to read the operator's metrics at {metrics_addr}: {other:?}"),
    };
    text.lines()
        .filter_map(|l| l.strip_prefix("oxbow_operator_api_requests_total{verb=\""))
        .filter_map(|rest| {
            let (verb, value) = rest.split_once("\"}")?;
            Some((verb.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Requests per second between two readings, total and by verb (largest first).
fn request_rates(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
    secs: f64,
) -> String {
    let mut by: Vec<(String, f64)> = after
        .iter()
        .map(|(v, n)| {
            (
                v.clone(),
                (n - before.get(v).copied().unwrap_or(0.0)) / secs,
            )
        })
        .filter(|(_, r)| *r > 0.0)
        .collect();
    by.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = by.iter().map(|(_, r)| r).sum();
    let parts: Vec<String> = by.iter().map(|(v, r)| format!("{v} {r:.1}")).collect();
    format!("{total:.1}/s ({})", parts.join(", "))
}

/// Samples memory every second for `secs`; returns (median, peak) readings.
async fn sample_idle(pid: u32, secs: u64) -> (Mem, u64) {
    let mut samples = Vec::new();
    for _ in 0..secs.max(1) {
        samples.push(read_mem(pid));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    samples.push(read_mem(pid));
    let med = Mem {
        rss_kib: median_u64(samples.iter().map(|m| m.rss_kib).collect()),
        hwm_kib: samples.iter().map(|m| m.hwm_kib).max().unwrap_or(0),
        anon_kib: median_u64(samples.iter().map(|m| m.anon_kib).collect()),
        file_kib: median_u64(samples.iter().map(|m| m.file_kib).collect()),
        threads: median_u64(samples.iter().map(|m| m.threads).collect()),
    };
    let peak_rss = samples.iter().map(|m| m.rss_kib).max().unwrap_or(0);
    (med, peak_rss)
}

/// Watches StatefulSets and StreamApps in `ns`, recording first sightings into `seen`.
/// Returns once both watches have listed (so nothing applied afterwards is missed).
async fn start_watches(client: &kube::Client, ns: &str, seen: Arc<Mutex<Seen>>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(2);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let (seen1, tx1) = (seen.clone(), tx.clone());
    tokio::spawn(async move {
        let mut stream = watcher(sts, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            let now = Instant::now();
            match ev {
                Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => {
                    let name = kube::ResourceExt::name_any(&o);
                    seen1
                        .lock()
                        .expect("seen lock")
                        .sts
                        .entry(name)
                        .or_insert(now);
                }
                Ok(watcher::Event::InitDone) => {
                    let _ = tx1.send(()).await;
                }
                _ => {}
            }
        }
    });
    let apps_api: Api<StreamApp> = Api::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        let mut stream = watcher(apps_api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            let now = Instant::now();
            match ev {
                Ok(watcher::Event::Apply(app)) | Ok(watcher::Event::InitApply(app)) => {
                    let current = app.status.as_ref().and_then(|s| s.observed_generation)
                        == app.metadata.generation;
                    let ready = apps::condition(&app, "Ready").is_some_and(|c| c.0 == "True");
                    let name = kube::ResourceExt::name_any(&app);
                    let mut s = seen.lock().expect("seen lock");
                    s.created.entry(name.clone()).or_insert(now);
                    if ready && current {
                        s.ready.entry(name).or_insert(now);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    let _ = tx.send(()).await;
                }
                _ => {}
            }
        }
    });
    for _ in 0..2 {
        rx.recv().await;
    }
}

fn manifest(name: &str, source: &str) -> String {
    apps::manifest(name, &[source], "").replacen("replicas: 2", "replicas: 1", 1)
}

fn apply(ns: &str, docs: &str) {
    let (ok, _, err) = kubectl(&["apply", "-n", ns, "-f", "-"], Some(docs));
    assert!(ok, "kubectl apply failed: {err}");
}

struct RunResult {
    mode: &'static str,
    n: usize,
    apply_secs: f64,
    sts: Vec<f64>,
    ready: Vec<f64>,
    created_sts: Vec<f64>,
    created_ready: Vec<f64>,
    all_ready_secs: f64,
    idle: Mem,
    idle_peak_rss_kib: u64,
    /// Threads by name and the number of open sockets, read at the end of the idle
    /// sampling: what the memory of an idle operator goes with.
    threads_sockets: String,
    cpu_to_ready: f64,
    cpu_idle: f64,
    idle_secs: u64,
    /// The operator's API requests per second from apply to all Ready, and while idle.
    api_to_ready: String,
    api_idle: String,
    delete_secs: f64,
    after_delete: Mem,
    missing: usize,
}

/// How many of `names` have been Ready.
fn ready_count(seen: &Mutex<Seen>, names: &[String]) -> usize {
    let s = seen.lock().expect("seen lock");
    names.iter().filter(|n| s.ready.contains_key(*n)).count()
}

/// One run's applies: where they go, what watches them, and until when they are
/// waited for (`timeout` from `start`). Each apply notes its time in `t0`.
struct Applying<'a> {
    ns: &'a str,
    source: &'a str,
    seen: &'a Mutex<Seen>,
    t0: HashMap<String, Instant>,
    start: Instant,
    timeout: Duration,
}

/// Applies all of `names` in one `kubectl apply` and waits until all are Ready or the
/// run's timeout has passed: the seconds `kubectl` took.
async fn apply_burst(a: &mut Applying<'_>, names: &[String]) -> f64 {
    let (seen, start, timeout) = (a.seen, a.start, a.timeout);
    let n = names.len();
    let docs: Vec<String> = names.iter().map(|nm| manifest(nm, a.source)).collect();
    let t = Instant::now();
    for nm in names {
        a.t0.insert(nm.clone(), t);
    }
    apply(a.ns, &docs.join("---\n"));
    let apply_secs = t.elapsed().as_secs_f64();
    let mut last_print = Instant::now();
    while ready_count(seen, names) < n && start.elapsed() < timeout {
        if last_print.elapsed() > Duration::from_secs(10) {
            println!(
                "  {:>5.1} s: {}/{n} Ready",
                start.elapsed().as_secs_f64(),
                ready_count(seen, names)
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    apply_secs
}

/// Applies `names` one at a time, each waited for until Ready or the run's timeout has
/// passed: the seconds `kubectl` took in all.
async fn apply_sequential(a: &mut Applying<'_>, names: &[String]) -> f64 {
    let mut total_apply = 0.0;
    for nm in names {
        let t = Instant::now();
        a.t0.insert(nm.clone(), t);
        apply(a.ns, &manifest(nm, a.source));
        total_apply += t.elapsed().as_secs_f64();
        let one = std::slice::from_ref(nm);
        while ready_count(a.seen, one) < 1 && a.start.elapsed() < a.timeout {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    total_apply
}

/// Sorted seconds of `names` from apply (`t0`) to StatefulSet and to Ready, how many are
/// not Ready, and the seconds from creation to StatefulSet and to Ready.
fn first_sightings(
    seen: &Mutex<Seen>,
    names: &[String],
    t0: &HashMap<String, Instant>,
) -> (Vec<f64>, Vec<f64>, usize, Vec<f64>, Vec<f64>) {
    let n = names.len();
    let s = seen.lock().expect("seen lock");
    let since_created = |m: &HashMap<String, Instant>| {
        let mut v: Vec<f64> = names
            .iter()
            .filter_map(|nm| {
                Some(
                    m.get(nm)?
                        .saturating_duration_since(*s.created.get(nm)?)
                        .as_secs_f64(),
                )
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (created_sts, created_ready) = (since_created(&s.sts), since_created(&s.ready));
    let mut sts: Vec<f64> = names
        .iter()
        .filter_map(|nm| Some(s.sts.get(nm)?.duration_since(t0[nm]).as_secs_f64()))
        .collect();
    let mut ready: Vec<f64> = names
        .iter()
        .filter_map(|nm| Some(s.ready.get(nm)?.duration_since(t0[nm]).as_secs_f64()))
        .collect();
    sts.sort_by(f64::total_cmp);
    ready.sort_by(f64::total_cmp);
    let missing = n - ready.len();
    (sts, ready, missing, created_sts, created_ready)
}

#[allow(clippy::too_many_arguments)]
async fn run_mode(
    mode: &'static str,
    metrics_addr: &str,
    client: &kube::Client,
    ns: &str,
    source: &str,
    pid: u32,
    n: usize,
    seen: &Arc<Mutex<Seen>>,
    tck: f64,
    run: &str,
) -> RunResult {
    let idle_secs: u64 = env_or("BENCH_OPERATOR_IDLE_SECS", 20);
    let timeout = Duration::from_secs(env_or("BENCH_OPERATOR_TIMEOUT_SECS", 600));
    let prefix = if mode == "burst" { "b" } else { "s" };
    let names: Vec<String> = (0..n).map(|i| format!("{run}-{prefix}{i:03}")).collect();
    let cpu0 = cpu_secs(pid, tck);
    let api0 = api_requests(metrics_addr).await;
    let start = Instant::now();
    let mut applying = Applying {
        ns,
        source,
        seen,
        t0: HashMap::new(),
        start,
        timeout,
    };
    let apply_secs = if mode == "burst" {
        apply_burst(&mut applying, &names).await
    } else {
        apply_sequential(&mut applying, &names).await
    };
    let t0 = applying.t0;
    let all_ready_secs = start.elapsed().as_secs_f64();
    let cpu_to_ready = cpu_secs(pid, tck) - cpu0;
    let api1 = api_requests(metrics_addr).await;
    let api_to_ready = request_rates(&api0, &api1, all_ready_secs);
    let (sts, ready, missing, created_sts, created_ready) = first_sightings(seen, &names, &t0);
    println!(
        "  {mode}: {}/{n} Ready after {all_ready_secs:.1} s; sampling RSS for {idle_secs} s (load {})",
        n - missing,
        loadavg()
    );
    let cpu1 = cpu_secs(pid, tck);
    let idle_start = Instant::now();
    let (idle, idle_peak_rss_kib) = sample_idle(pid, idle_secs).await;
    let threads_sockets = threads_and_sockets(pid);
    let cpu_idle = cpu_secs(pid, tck) - cpu1;
    let api_idle = request_rates(
        &api1,
        &api_requests(metrics_addr).await,
        idle_start.elapsed().as_secs_f64(),
    );

    // Delete this run's apps (the operator's finalizer removes their topics) and wait.
    let api: Api<StreamApp> = Api::namespaced(client.clone(), ns);
    let t = Instant::now();
    apps::delete_all(&api).await;
    let delete_secs = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after_delete = read_mem(pid);
    RunResult {
        mode,
        n,
        apply_secs,
        sts,
        ready,
        created_sts,
        created_ready,
        all_ready_secs,
        idle,
        idle_peak_rss_kib,
        threads_sockets,
        cpu_to_ready,
        cpu_idle,
        idle_secs,
        api_to_ready,
        api_idle,
        delete_secs,
        after_delete,
        missing,
    }
}

async fn delete_topics(names: &[String]) {
    use rdkafka::ClientConfig;
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("admin client");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for chunk in names.chunks(50) {
        match admin.delete_topics(chunk, &AdminOptions::new()).await {
            Ok(res) => {
                for r in res.into_iter().filter_map(Result::err) {
                    eprintln!("failed to delete topic {r:?}");
                }
            }
            Err(e) => eprintln!("failed to delete topics: {e}"),
        }
    }
    // Deletion is asynchronous on the broker.
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// Topics whose name starts with `prefix` (the run's leftovers, if any).
fn topics_with_prefix(prefix: &str) -> Vec<String> {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("consumer");
    c.fetch_metadata(None, Duration::from_secs(10))
        .map(|md| {
            md.topics()
                .iter()
                .map(|t| t.name().to_string())
                .filter(|t| t.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// The modes of BENCH_OPERATOR_MODE, in order.
fn modes_from_env() -> Vec<&'static str> {
    let mode = std::env::var("BENCH_OPERATOR_MODE").unwrap_or_else(|_| "burst".into());
    match mode.as_str() {
        "burst" => vec!["burst"],
        "sequential" => vec!["sequential"],
        "both" => vec!["burst", "sequential"],
        other => panic!("BENCH_OPERATOR_MODE must be burst, sequential or both, not {other}"),
    }
}

/// The operator alone, started and watching an empty namespace: its memory readings
/// over 5 s and the CPU seconds it took to start.
async fn operator_alone(pid: u32, tck: f64) -> (Mem, f64) {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu_start = cpu_secs(pid, tck);
    let (baseline, _) = sample_idle(pid, 5).await;
    println!(
        "  0 apps: VmRSS {:.1} MiB (anon {:.1}, file {:.1}), {} threads, {:.2} CPU s to start",
        mib(baseline.rss_kib),
        mib(baseline.anon_kib),
        mib(baseline.file_kib),
        baseline.threads,
        cpu_start
    );
    (baseline, cpu_start)
}

/// The table: the operator alone (`baseline`, `cpu_start`), then a row per run.
fn print_table(
    load_start: &str,
    load_end: &str,
    baseline: &Mem,
    cpu_start: f64,
    results: &[RunResult],
) {
    println!();
    println!(
        "Operator, N StreamApps (stand-in workers, 1 replica, 2 stores each), load average {load_start} at start, {load_end} at end"
    );
    println!();
    println!(
        "| mode | N | Ready | idle VmRSS median | VmHWM peak | RssAnon / RssFile | apply→StatefulSet p50 / p99 / max | apply→Ready p50 / p99 / max | all N Ready | kubectl apply | CPU s to Ready / per idle min | delete all |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| none | 0 | – | {:.1} MiB | {:.1} MiB | {:.1} / {:.1} MiB | – | – | – | – | {:.2} to start | – |",
        mib(baseline.rss_kib),
        mib(baseline.hwm_kib),
        mib(baseline.anon_kib),
        mib(baseline.file_kib),
        cpu_start
    );
    for r in results {
        println!(
            "| {} | {} | {}/{} | {:.1} MiB | {:.1} MiB | {:.1} / {:.1} MiB | {:.2} / {:.2} / {:.2} s | {:.2} / {:.2} / {:.2} s | {:.1} s | {:.2} s | {:.2} / {:.2} | {:.1} s |",
            r.mode,
            r.n,
            r.n - r.missing,
            r.n,
            mib(r.idle.rss_kib),
            mib(r.idle.hwm_kib),
            mib(r.idle.anon_kib),
            mib(r.idle.file_kib),
            pct(&r.sts, 0.5),
            pct(&r.sts, 0.99),
            pct(&r.sts, 1.0),
            pct(&r.ready, 0.5),
            pct(&r.ready, 0.99),
            pct(&r.ready, 1.0),
            r.all_ready_secs,
            r.apply_secs,
            r.cpu_to_ready,
            r.cpu_idle * 60.0 / r.idle_secs as f64,
            r.delete_secs,
        );
    }
    println!();
}

/// Each run's times from creation, idle and after-delete memory, threads and sockets,
/// and API request rates.
fn print_details(results: &[RunResult]) {
    for r in results {
        println!(
            "{}: from the StreamApp's creation (first watch event; kubectl applies one object at a time): to StatefulSet p50 / p99 / max {:.2} / {:.2} / {:.2} s, to Ready {:.2} / {:.2} / {:.2} s",
            r.mode,
            pct(&r.created_sts, 0.5),
            pct(&r.created_sts, 0.99),
            pct(&r.created_sts, 1.0),
            pct(&r.created_ready, 0.5),
            pct(&r.created_ready, 0.99),
            pct(&r.created_ready, 1.0),
        );
    }
    for r in results {
        println!(
            "{}: idle peak VmRSS {:.1} MiB, {} threads; 5 s after deleting all: VmRSS {:.1} MiB",
            r.mode,
            mib(r.idle_peak_rss_kib),
            r.idle.threads,
            mib(r.after_delete.rss_kib)
        );
        println!("{}: at the end of idle: {}", r.mode, r.threads_sockets);
        println!(
            "{}: operator API requests from apply to all Ready {}; idle {}",
            r.mode, r.api_to_ready, r.api_idle
        );
    }
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| env_or("BENCH_OPERATOR_APPS", 50));
    let modes = modes_from_env();
    if let Ok(prefix) = std::env::var("BENCH_OPERATOR_CLEAN_PREFIX") {
        // After an interrupted run: delete the topics of run `prefix` (e.g. ob-1a2b3c4).
        let topics = topics_with_prefix(&prefix);
        println!("deleting {} topics: {topics:?}", topics.len());
        delete_topics(&topics).await;
        return;
    }
    let tck = clk_tck();
    let load_start = loadavg();
    println!("operator bench: N = {n}, modes {modes:?}, load average {load_start}");

    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "opbench").await;
    // App names start with `run` (unique), so their topics can be found and removed.
    let run = unique("ob");
    let source = format!("{run}-source");
    kafka::create_topic(&source, 1).await;
    // The suite's 3 s resync by default (the figures of 50 apps); at hundreds of apps a
    // resync that short asks for more reconciles than any operator serves: say
    // BENCH_OPERATOR_RESYNC=30s (the operator's default).
    let resync = std::env::var("BENCH_OPERATOR_RESYNC").unwrap_or_else(|_| "3s".into());
    let operator = OperatorProcess::start_with(&ns.name, &["--resync-interval", &resync]);
    let pid = operator.pid();
    println!(
        "  namespace {}, source topic {source}, operator pid {pid}, --resync-interval {resync}",
        ns.name
    );

    // The operator alone: started, watching an empty namespace.
    let (baseline, cpu_start) = operator_alone(pid, tck).await;

    let seen = Arc::new(Mutex::new(Seen::default()));
    start_watches(&client, &ns.name, seen.clone()).await;
    let mut results = Vec::new();
    for m in modes {
        results.push(
            run_mode(
                m,
                &operator.metrics_addr,
                &client,
                &ns.name,
                &source,
                pid,
                n,
                &seen,
                tck,
                &run,
            )
            .await,
        );
    }
    let load_end = loadavg();
    let final_mem = read_mem(pid);
    let cpu_total = cpu_secs(pid, tck);
    drop(operator);
    ns.delete().await;
    // The source, and every app's changelog and dead-letter topics (kept by the default
    // `deletionPolicy: {topics: Retain}`): all start with `run`.
    let topics = topics_with_prefix(&format!("{run}-"));
    delete_topics(&topics).await;
    let leftovers = topics_with_prefix(&format!("{run}-"));

    print_table(&load_start, &load_end, &baseline, cpu_start, &results);
    print_details(&results);
    println!(
        "operator total: {cpu_total:.2} CPU s, VmHWM {:.1} MiB, final VmRSS {:.1} MiB",
        mib(final_mem.hwm_kib),
        mib(final_mem.rss_kib)
    );
    if !leftovers.is_empty() {
        println!("topics left behind (delete by hand): {leftovers:?}");
    }
    if results.iter().any(|r| r.missing > 0) {
        std::process::exit(1);
    }
}
