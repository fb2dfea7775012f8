//! API writes and operator CPU in steady state (issue 17, item 7): N StreamApps of M real
//! worker pods each, every app Ready and idle, then the API server's write requests per
//! second (its own `apiserver_request_total`, less the idle cluster's) and the
//! operator's CPU over a window.
//!
//! ```sh
//! make bench-reports                                     # 10 apps x 10 pods, 60 s
//! BENCH_REPORT_APPS=2 BENCH_REPORT_PODS=3 make bench-reports
//! ```
//!
//! Settings (environment):
//! - `BENCH_REPORT_APPS` (10), `BENCH_REPORT_PODS` (10): apps, and worker pods per app
//!   (one source partition per pod, so each pod runs one task).
//! - `BENCH_REPORT_WINDOW_SECS` (60): the measured window; `BENCH_REPORT_SETTLE_SECS`
//!   (30): the wait between the last app turning Ready and the window.
//! - `BENCH_OPERATOR_BIN`: the operator binary (default: the release build), and
//!   `BENCH_WORKER_IMAGE` (`oxbow-worker:bench`): the workers' image, so an older pair of
//!   binaries can be measured the same way (map the image in the node's images file).
//!
//! It makes its own namespace, topics and operator (watching only that namespace, with
//! its default settings), and deletes the apps and the namespace at the end.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    TestNamespace, apps, install_crd, kafka, kafka_bootstrap_in_cluster, kube_client, kubectl,
    stack_var, target_dir, unique,
};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// Write requests the API server has served, by `verb resource[/subresource]`.
fn writes() -> BTreeMap<String, f64> {
    let (ok, out, err) = kubectl(&["get", "--raw", "/metrics"], None);
    assert!(ok, "failed to read the API server's metrics: {err}");
    let mut by = BTreeMap::new();
    for line in out
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let verb = label("verb");
        if !WRITE_VERBS.contains(&verb.as_str()) {
            continue;
        }
        let sub = label("subresource");
        let key = if sub.is_empty() {
            format!("{verb} {}", label("resource"))
        } else {
            format!("{verb} {}/{sub}", label("resource"))
        };
        *by.entry(key).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    by
}

/// Writes per second over `window`, by kind of request.
fn rates(window: Duration) -> BTreeMap<String, f64> {
    let before = writes();
    std::thread::sleep(window);
    let after = writes();
    after
        .into_iter()
        .map(|(k, v)| {
            let d = v - before.get(&k).copied().unwrap_or(0.0);
            (k, d / window.as_secs_f64())
        })
        .filter(|(_, r)| *r > 0.0)
        .collect()
}

/// CPU seconds (user + system) the process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the command.
    (ticks(11) + ticks(12)) / 100.0
}

fn manifest(name: &str, source: &str, pods: u32, image: &str) -> String {
    format!(
        "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {{name: {name}}}\nspec:\n  replicas: {pods}\n  standbyReplicas: 0\n  image: {image}\n  kafka: {{bootstrapServers: \"{bootstrap}\"}}\n  source: {{topics: [{source}]}}\n  steps:\n  - aggregate: {{store: totals, groupBy: key, fields: {{count: {{count: {{}}}}}}}}\n  sink: {{topic: {name}-out}}\n",
        bootstrap = kafka_bootstrap_in_cluster(),
    )
}

fn print(title: &str, r: &BTreeMap<String, f64>) {
    println!("{title}: {:.2} writes/s", r.values().sum::<f64>());
    let mut v: Vec<_> = r.iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    for (k, rate) in v.iter().take(12) {
        println!("  {rate:>8.2}  {k}");
    }
}

#[tokio::main]
async fn main() {
    let n_apps: u32 = env_or("BENCH_REPORT_APPS", 10);
    let pods: u32 = env_or("BENCH_REPORT_PODS", 10);
    let window = Duration::from_secs(env_or("BENCH_REPORT_WINDOW_SECS", 60));
    let settle = Duration::from_secs(env_or("BENCH_REPORT_SETTLE_SECS", 30));
    let image: String = env_or("BENCH_WORKER_IMAGE", "oxbow-worker:bench".to_string());
    let bin = std::env::var("BENCH_OPERATOR_BIN").unwrap_or_else(|_| {
        target_dir()
            .join("release/oxbow-operator")
            .display()
            .to_string()
    });

    install_crd();
    let client = kube_client().await;
    println!("baseline: the idle cluster over {window:?}");
    let baseline = rates(window);
    print("baseline", &baseline);

    let ns = TestNamespace::create(&client, "reportbench").await;
    let n = ns.name.clone();
    let source = unique("rb-src");
    kafka::create_topic(&source, pods as i32).await;
    let log = std::env::temp_dir().join(format!("oxbow-report-bench-{n}.log"));
    let mut operator = std::process::Command::new(&bin)
        .args(["run", "--namespace", &n, "--metrics-addr", "127.0.0.1:0"])
        .args(["--log-format", "text"])
        .env("KUBECONFIG", stack_var("KUBECONFIG"))
        .env("RUST_LOG", "info,kube_runtime=warn")
        .stdout(std::fs::File::create(&log).expect("log"))
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .unwrap_or_else(|e| panic!("failed to start {bin}: {e}"));
    let names: Vec<String> = (0..n_apps).map(|i| unique(&format!("rb{i}"))).collect();
    for name in &names {
        // Oxbow never creates sink topics.
        kafka::create_topic(&format!("{name}-out"), 1).await;
    }
    let all: String = names
        .iter()
        .map(|a| manifest(a, &source, pods, &image))
        .collect::<Vec<_>>()
        .join("---\n");
    let (ok, _, err) = kubectl(&["apply", "-n", &n, "-f", "-"], Some(&all));
    assert!(ok, "apply: {err}");

    let api: Api<StreamApp> = Api::namespaced(client.clone(), &n);
    let t0 = Instant::now();
    let timeout = Duration::from_secs(env_or("BENCH_REPORT_TIMEOUT_SECS", 900));
    loop {
        let list = api.list(&Default::default()).await.expect("list apps");
        let ready = list
            .items
            .iter()
            .filter(|a| apps::condition(a, "Ready").is_some_and(|(s, _, _)| s == "True"))
            .count();
        if ready == names.len() {
            break;
        }
        assert!(
            t0.elapsed() < timeout,
            "only {ready} of {} apps Ready after {timeout:?}; operator log: {}",
            names.len(),
            log.display()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!(
        "{n_apps} apps x {pods} pods Ready after {:.0} s; settling {settle:?}",
        t0.elapsed().as_secs_f64()
    );
    tokio::time::sleep(settle).await;

    let pid = operator.id();
    let cpu0 = cpu_seconds(pid);
    let busy = tokio::task::spawn_blocking(move || rates(window))
        .await
        .expect("measure");
    let cpu = (cpu_seconds(pid) - cpu0) / window.as_secs_f64();
    print("steady state", &busy);
    let net: f64 = busy.values().sum::<f64>() - baseline.values().sum::<f64>();
    println!(
        "RESULT apps={n_apps} pods={pods} window={}s writes/s={:.2} net_of_idle={net:.2} per_app={:.2} operator_cpu={:.1}%",
        window.as_secs(),
        busy.values().sum::<f64>(),
        net / f64::from(n_apps),
        cpu * 100.0
    );

    apps::delete_all(&api).await;
    let _ = operator.kill();
    let _ = operator.wait();
    ns.delete().await;
}
