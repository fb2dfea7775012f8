//! Fixtures of the worker's integration tests: the real `oxbow-worker` binary as a child
//! process (one or a fleet), StreamApp manifests on the local broker, and waits on the
//! workers' own status. Kafka, HTTP, names and waiting with a deadline come from the
//! shared helpers (`oxbow-testkit`), re-exported here.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub use oxbow_testkit::http::{free_port, http_get};
pub use oxbow_testkit::kafka::*;
pub use oxbow_testkit::stack::kafka_bootstrap as bootstrap;
pub use oxbow_testkit::unique;
pub use oxbow_testkit::wait::{Deadline, holds_for, wait_for};

/// A StreamApp manifest named `app` on the local broker under `guarantee`
/// (`exactly_once` or `at_least_once`) with 100 ms commits; `spec` is the rest of the
/// spec, each line indented two spaces.
pub fn app_manifest(app: &str, guarantee: &str, spec: &str) -> String {
    format!(
        "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {{name: {app}}}\nspec:\n  kafka: {{bootstrapServers: \"{}\"}}\n  processingGuarantee: {guarantee}\n  commitInterval: 100ms\n{}",
        bootstrap(),
        spec.trim_start_matches('\n')
    )
}

/// [`app_manifest`] under exactly-once.
pub fn exactly_once_app(app: &str, spec: &str) -> String {
    app_manifest(app, "exactly_once", spec)
}

/// A StreamApp manifest file plus the flags of one worker process.
pub struct WorkerBuilder {
    pub manifest: String,
    pub state_dir: PathBuf,
    pub instance: u32,
    pub instances: u32,
    /// The HTTP port; default: a free one picked at spawn. Set it when other workers
    /// must know the address beforehand (`--peers`).
    pub port: Option<u16>,
    /// More `oxbow-worker run` flags.
    pub extra_args: Vec<String>,
}

pub struct Worker {
    child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

pub fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join("oxbow-worker-tests").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl WorkerBuilder {
    pub fn new(manifest: String, state_dir: &Path) -> Self {
        Self {
            manifest,
            state_dir: state_dir.to_path_buf(),
            instance: 0,
            instances: 1,
            port: None,
            extra_args: Vec::new(),
        }
    }

    /// Runs a worker until it has committed everything now in `input`, and every later
    /// stage everything its repartition topic got, then stops it with SIGTERM
    /// (asserting a clean exit).
    pub fn process_all(&self, input: &str) {
        let mut w = self.spawn();
        w.wait_ready(Duration::from_secs(90));
        w.wait_committed(input, &end_offsets(input), Duration::from_secs(120));
        for (stage, topic) in self.repartition_topics() {
            // The stage before has committed all it wrote: these ends are final.
            let ends = data_ends(&topic);
            w.wait_stage_committed(stage, &topic, &ends, Duration::from_secs(120));
        }
        w.stop();
    }

    /// The app's repartition topics with the stage that reads each, in stage order.
    pub fn repartition_topics(&self) -> Vec<(u32, String)> {
        let app: oxbow_crds::StreamApp =
            serde_yaml::from_str(&self.manifest).expect("the test's manifest parses");
        oxbow_crds::topology::Topology::of(&app.application_id(), &app.spec)
            .repartition_topics()
            .into_iter()
            .map(|(stage, topic)| (stage.index, topic.to_string()))
            .collect()
    }

    pub fn spawn(&self) -> Worker {
        let dir = self
            .state_dir
            .parent()
            .unwrap_or(&self.state_dir)
            .to_path_buf();
        let cfg = dir.join(format!("app-{}.yaml", self.instance));
        std::fs::write(&cfg, &self.manifest).unwrap();
        let port = self.port.unwrap_or_else(free_port);
        static RUN: AtomicU32 = AtomicU32::new(0);
        let log = dir.join(format!(
            "worker-{}-{}.log",
            self.instance,
            RUN.fetch_add(1, Ordering::SeqCst)
        ));
        let f = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_oxbow-worker"))
            .args(["run", "--config"])
            .arg(&cfg)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args([
                "--instance",
                &self.instance.to_string(),
                "--instances",
                &self.instances.to_string(),
            ])
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--memory-mib",
                "64",
            ])
            .args(&self.extra_args)
            .env(
                "RUST_LOG",
                std::env::var("OXBOW_TEST_LOG").unwrap_or_else(|_| "info,librdkafka=warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("spawn oxbow-worker");
        Worker {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log,
        }
    }
}

impl Worker {
    pub fn status(&self) -> Option<serde_json::Value> {
        let (code, body) = http_get(self.addr, "/v1/status")?;
        (code == 200)
            .then(|| serde_json::from_str(&body).ok())
            .flatten()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Deadline::after(timeout);
        loop {
            if let Some(st) = self.exited() {
                panic!(
                    "worker exited with {st} before it was ready; log:\n{}",
                    self.logs()
                );
            }
            if http_get(self.addr, "/readyz").is_some_and(|(c, _)| c == 200) {
                return;
            }
            deadline.next_poll(Duration::from_millis(50), || {
                format!("the worker is not ready; log:\n{}", self.logs())
            });
        }
    }

    /// Sum of `processed + deadLetters + skipped` over tasks, i.e. source records handled.
    pub fn handled(&self) -> Option<u64> {
        let s = self.status()?;
        Some(
            s["tasks"]
                .as_array()?
                .iter()
                .map(|t| {
                    t["processed"].as_u64().unwrap_or(0)
                        + t["deadLetters"].as_u64().unwrap_or(0)
                        + t["skipped"].as_u64().unwrap_or(0)
                })
                .sum(),
        )
    }

    /// Waits until every task's committed position reached `ends` (topic → partition → end).
    /// Waits until the stage-0 tasks have committed `topic` (a source) up to `ends`.
    pub fn wait_committed(&mut self, topic: &str, ends: &BTreeMap<i32, i64>, timeout: Duration) {
        self.wait_stage_committed(0, topic, ends, timeout);
    }

    /// Waits until this worker's tasks of `stage` have committed `topic` up to `ends`.
    pub fn wait_stage_committed(
        &mut self,
        stage: u32,
        topic: &str,
        ends: &BTreeMap<i32, i64>,
        timeout: Duration,
    ) {
        let deadline = Deadline::after(timeout);
        loop {
            if let Some(st) = self.exited() {
                panic!(
                    "worker exited with {st} while processing; log:\n{}",
                    self.logs()
                );
            }
            if let Some(s) = self.status()
                && let Some(tasks) = s["tasks"].as_array()
                && !tasks.is_empty()
                && tasks.iter().all(|t| match task_id(t) {
                    None => false,
                    Some((st, _)) if st != stage => true,
                    Some((_, p)) => {
                        let want = ends.get(&p).copied().unwrap_or(0);
                        t["positions"][topic].as_i64().unwrap_or(0) >= want
                    }
                })
            {
                return;
            }
            deadline.next_poll(Duration::from_millis(100), || {
                format!(
                    "the worker's stage-{stage} tasks did not commit up to {ends:?} of {topic}; status: {:?}\nlog:\n{}",
                    self.status(),
                    self.logs()
                )
            });
        }
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Deadline::after(Duration::from_secs(30));
        loop {
            if let Some(st) = self.exited() {
                assert!(
                    st.success(),
                    "worker exited with {st} after SIGTERM; log:\n{}",
                    self.logs()
                );
                return;
            }
            deadline.next_poll(Duration::from_millis(50), || {
                format!(
                    "the worker did not exit after SIGTERM; log:\n{}",
                    self.logs()
                )
            });
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `oxbow-worker digest` and returns `task/store → digest`.
pub fn digests(manifest_path: &Path, state_dir: &Path) -> BTreeMap<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_oxbow-worker"))
        .args(["digest", "--config"])
        .arg(manifest_path)
        .arg("--state-dir")
        .arg(state_dir)
        .output()
        .expect("run oxbow-worker digest");
    assert!(
        out.status.success(),
        "digest failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.trim().to_string()))
        })
        .collect()
}

/// Waits until the tasks of `stage` (ids `<stage>_<partition>`) over all `workers` have
/// committed `topic` up to `ends` (partition → end offset): every partition of `ends`
/// must be reported by some worker. Use it on a source topic (no transaction markers);
/// on a topic written in transactions the last offset is a marker no task reads past.
pub fn wait_stage_committed(
    workers: &mut [&mut Worker],
    stage: u32,
    topic: &str,
    ends: &BTreeMap<i32, i64>,
    timeout: Duration,
) {
    let deadline = Deadline::after(timeout);
    loop {
        let mut positions: BTreeMap<i32, i64> = BTreeMap::new();
        for w in workers.iter_mut() {
            if let Some(st) = w.exited() {
                panic!(
                    "worker exited with {st} while processing; log:\n{}",
                    w.logs()
                );
            }
            let Some(s) = w.status() else { continue };
            for t in s["tasks"].as_array().into_iter().flatten() {
                if let Some((st, p)) = task_id(t)
                    && st == stage
                {
                    positions.insert(p, t["positions"][topic].as_i64().unwrap_or(0));
                }
            }
        }
        if ends
            .iter()
            .all(|(p, end)| positions.get(p).is_some_and(|pos| pos >= end))
        {
            return;
        }
        deadline.next_poll(Duration::from_millis(100), || {
            format!(
                "the stage-{stage} tasks did not commit {topic} up to {ends:?}; committed: {positions:?}\nlogs:\n{}",
                workers
                    .iter()
                    .map(|w| w.logs())
                    .collect::<Vec<_>>()
                    .join("\n-----\n")
            )
        });
    }
}

/// A task entry's id of `/v1/status` as (stage, partition): `"1_3"` is (1, 3).
pub fn task_id(task: &serde_json::Value) -> Option<(u32, i32)> {
    let (stage, partition) = task["task"].as_str()?.split_once('_')?;
    Some((stage.parse().ok()?, partition.parse().ok()?))
}

/// xorshift: reproducible "random" kill points.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// Standalone workers `0..n` of one app, each with its own state directory, that can be
/// SIGKILLed and restarted one by one. With `peers` they know each other's addresses.
pub struct Fleet {
    pub builders: Vec<WorkerBuilder>,
    pub workers: Vec<Option<Worker>>,
}

impl Fleet {
    pub fn new(manifest: &str, dir: &Path, n: u32, peers: bool) -> Self {
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let peer_list = ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let builders = (0..n)
            .map(|i| {
                let mut b =
                    WorkerBuilder::new(manifest.to_string(), &dir.join(format!("state-{i}")));
                b.instance = i;
                b.instances = n;
                b.port = Some(ports[i as usize]);
                if peers {
                    b.extra_args = vec!["--peers".into(), peer_list.clone()];
                }
                b
            })
            .collect();
        Self {
            builders,
            workers: (0..n).map(|_| None).collect(),
        }
    }

    /// Starts every worker that is not running and waits until all are ready.
    pub fn start_missing(&mut self) {
        for (b, w) in self.builders.iter().zip(self.workers.iter_mut()) {
            if w.is_none() {
                *w = Some(b.spawn());
            }
        }
        for w in self.workers.iter_mut().flatten() {
            w.wait_ready(Duration::from_secs(90));
        }
    }

    pub fn kill9(&mut self, i: usize) {
        if let Some(w) = self.workers[i].take() {
            w.kill9();
        }
    }

    /// Records handled by the running workers since they started.
    pub fn handled(&self) -> u64 {
        self.workers
            .iter()
            .flatten()
            .map(|w| w.handled().unwrap_or(0))
            .sum()
    }

    pub fn running(&mut self) -> Vec<&mut Worker> {
        self.workers.iter_mut().flatten().collect()
    }

    pub fn addrs(&self) -> Vec<std::net::SocketAddr> {
        self.workers.iter().flatten().map(|w| w.addr).collect()
    }

    pub fn logs(&self) -> String {
        self.workers
            .iter()
            .flatten()
            .map(|w| format!("== {}\n{}", w.log.display(), w.logs()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGTERM to every worker, asserting clean exits.
    pub fn stop(self) {
        for w in self.workers.into_iter().flatten() {
            w.stop();
        }
    }
}
