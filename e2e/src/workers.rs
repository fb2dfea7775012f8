//! Worker processes for suites that play the operator: the real `oxbow-worker` binary in
//! coordinated mode, run on this machine against the stack's API server and Kafka, with
//! the test writing the assignment ConfigMap. It owns starting, asking and killing those
//! processes; it must not stand in for anything the worker or the operator decides.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use oxbow_crds::TaskId;
use oxbow_crds::assignment::{Assignment, CONFIG_MAP_KEY, PreviousActive, TaskPlacement};

use crate::harness::target_dir;

/// The release `oxbow-worker` binary (built by `make build`), or `OXBOW_WORKER_BIN`
/// (a bench measuring an older worker the same way).
pub fn worker_bin() -> PathBuf {
    let bin = std::env::var_os("OXBOW_WORKER_BIN")
        .map_or_else(|| target_dir().join("release/oxbow-worker"), PathBuf::from);
    assert!(
        bin.exists(),
        "{} is missing: run `make build`",
        bin.display()
    );
    bin
}

/// One `oxbow-worker run` process, playing pod `pod` of StreamApp `app`: its state
/// directory is `<dir>/<pod>`, its log `<dir>/<pod>.log`.
pub struct WorkerProc {
    pub child: Child,
    pub log: PathBuf,
    pub addr: String,
}

impl WorkerProc {
    pub fn start(
        ns: &str,
        app: &str,
        pod: &str,
        config: &Path,
        dir: &Path,
        kubeconfig: &Path,
    ) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let addr = format!("127.0.0.1:{port}");
        let log = dir.join(format!("{pod}.log"));
        let child = Command::new(worker_bin())
            .args(["run", "--config"])
            .arg(config)
            .arg("--state-dir")
            .arg(dir.join(pod))
            .args(["--listen", &addr, "--memory-mib", "64"])
            .args(["--assignment-configmap", &format!("{app}-assignment")])
            .env("POD_NAME", pod)
            .env("POD_NAMESPACE", ns)
            .env("OXBOW_STREAMAPP", app)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,librdkafka=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("worker log file"))
            .spawn()
            .expect("start oxbow-worker");
        Self { child, log, addr }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The worker's `/v1/status` document, if it answers.
    pub fn status(&self) -> Option<serde_json::Value> {
        let mut s = TcpStream::connect(&self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(
            s,
            "GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            crate::credentials::query_token()
        )
        .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        let json = body.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        serde_json::from_str(json).ok()
    }

    /// Its tasks that `/v1/status` shows running as actives.
    pub fn running(&self) -> Vec<String> {
        self.status()
            .and_then(|v| {
                v["tasks"].as_array().map(|ts| {
                    ts.iter()
                        .filter(|t| t["role"] == "active" && t["state"] == "Running")
                        .map(|t| t["task"].to_string().trim_matches('"').to_string())
                        .collect()
                })
            })
            .unwrap_or_default()
    }

    /// SIGKILL, as a node would kill a pod's container: nothing is released.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A task's placement: active on `pod`, no standby, with the previous actives given as
/// (pod, the generation that moved the task away from it).
pub fn placement(pod: &str, previous: &[(&str, i64)]) -> TaskPlacement {
    TaskPlacement {
        active: pod.into(),
        standbys: vec![],
        previous: previous
            .iter()
            .map(|(pod, until)| PreviousActive {
                pod: (*pod).into(),
                until: *until,
            })
            .collect(),
    }
}

/// An assignment (tracking previous actives, as the operator's does) of stage-0 tasks
/// 0, 1, … placed as given, listing `pods` as the pods that exist.
pub fn assignment(
    generation: i64,
    tasks: impl IntoIterator<Item = TaskPlacement>,
    pods: &[&str],
) -> Assignment {
    Assignment {
        generation,
        tasks: (0u32..)
            .zip(tasks)
            .map(|(p, tp)| (TaskId::new(0, p), tp))
            .collect(),
        pods: pods.iter().map(|p| p.to_string()).collect(),
        tracks_previous: true,
    }
}

/// Writes `a` as app `app`'s assignment ConfigMap, as the operator would.
pub async fn publish(cms: &Api<ConfigMap>, app: &str, a: &Assignment) {
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{app}-assignment")},
        "data": {CONFIG_MAP_KEY: serde_json::to_string(a).expect("assignment JSON")},
    });
    cms.patch(
        &format!("{app}-assignment"),
        &PatchParams::apply("oxbow-e2e-operator").force(),
        &Patch::Apply(&cm),
    )
    .await
    .expect("publish the assignment");
}

/// A counting StreamApp run by worker processes, without the operator: the test plays
/// the operator, so [`played_app`] applies it, creates the topics the operator would,
/// and writes the manifest where the workers read it.
pub struct PlayedApp {
    pub name: String,
    pub source: String,
    pub sink: String,
    /// The workers' state directories and logs live here.
    pub dir: PathBuf,
    /// The manifest the workers run (`--config`).
    pub config: PathBuf,
}

/// Applies a StreamApp `name` in `ns` that counts (and sums `value.amount`) per key
/// from `<name>-in` into `<name>-out` under `guarantee`, and creates its topics with
/// `partitions` partitions each.
pub async fn played_app(ns: &str, name: &str, guarantee: &str, partitions: i32) -> PlayedApp {
    let (source, sink) = (format!("{name}-in"), format!("{name}-out"));
    let manifest = format!(
        "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  kafka: {{bootstrapServers: \"{bootstrap}\"}}\n  processingGuarantee: {guarantee}\n  commitInterval: 100ms\n  source: {{topics: [{source}]}}\n  steps:\n  - aggregate: {{store: totals, groupBy: key, fields: {{count: {{count: {{}}}}, sum: {{sum: value.amount}}}}}}\n  sink: {{topic: {sink}}}\n",
        bootstrap = crate::harness::kafka_bootstrap(),
    );
    let (ok, _, err) = crate::harness::kubectl(&["apply", "-n", ns, "-f", "-"], Some(&manifest));
    assert!(ok, "apply: {err}");
    let parsed: oxbow_crds::StreamApp = serde_yaml::from_str(&manifest).expect("the manifest");
    let mut topics = vec![source.clone(), sink.clone()];
    topics.extend(
        oxbow_crds::topics::wanted_topics(&parsed, partitions)
            .into_iter()
            .map(|t| t.name),
    );
    for t in &topics {
        crate::harness::kafka::create_topic(t, partitions).await;
    }
    // The report Leases the operator would make for pods 0..5.
    let pods: Vec<String> = (0..5).map(|i| format!("{name}-{i}")).collect();
    crate::reports::make_leases(&crate::harness::kube_client().await, ns, name, &pods).await;
    let dir = std::env::temp_dir().join("oxbow-played-apps").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the app's directory");
    let config = dir.join("app.yaml");
    std::fs::write(&config, &manifest).expect("the app's manifest");
    PlayedApp {
        name: name.into(),
        source,
        sink,
        dir,
        config,
    }
}
