//! Starting, watching and stopping the engines under test: the Oxbow worker, the Kafka
//! Streams peer (bench/kstreams) and the raw pipe (this binary's `pipe` mode).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxbow_testkit::http::free_port;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Oxbow,
    KStreams,
    Pipe,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Oxbow => "oxbow",
            Kind::KStreams => "kstreams",
            Kind::Pipe => "pipe",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Guarantee {
    Alos,
    Eos,
}

impl Guarantee {
    pub fn label(self) -> &'static str {
        match self {
            Guarantee::Alos => "ALOS",
            Guarantee::Eos => "EOS",
        }
    }
    fn oxbow(self) -> &'static str {
        match self {
            Guarantee::Alos => "at_least_once",
            Guarantee::Eos => "exactly_once",
        }
    }
    fn kstreams(self) -> &'static str {
        match self {
            Guarantee::Alos => "at_least_once",
            Guarantee::Eos => "exactly_once_v2",
        }
    }
}

/// What every engine needs to start.
pub struct Setup {
    pub bootstrap: String,
    pub worker: PathBuf,
    pub java: String,
    pub java_opts: Vec<String>,
    pub ks_classpath: String,
    pub ks_props: Vec<String>,
    pub threads: usize,
    pub ks_cache_bytes: u64,
    pub memory_mib: u64,
    pub commit_ms: u64,
    pub scratch: PathBuf,
    pub dedupe_example: PathBuf,
}

/// One engine run: its application id (also its consumer group) and topics.
pub struct Spec {
    pub kind: Kind,
    pub workload: &'static str,
    pub guarantee: Guarantee,
    pub app: String,
    pub input: String,
    pub output: String,
    pub dlq: String,
    pub state: PathBuf,
    /// W5's users table topic.
    pub table: String,
    /// More `key=value` arguments for the Kafka Streams peer.
    pub extra: Vec<String>,
    /// Kafka Streams serves its store on a loopback port (the worker always does).
    pub query: bool,
}

#[derive(Default)]
pub struct KsLog {
    pub running: bool,
    pub version: String,
    pub error: Option<String>,
    /// (t ms, partition, start offset)
    pub restore_starts: Vec<(i64, i32, i64)>,
    /// (t ms, partition, records restored)
    pub restore_ends: Vec<(i64, i32, i64)>,
}

pub struct Proc {
    pub kind: Kind,
    pub child: Child,
    addr: Option<String>,
    /// Where the store can be read back (the worker's own HTTP address for Oxbow).
    query_addr: Option<String>,
    pub ks: Arc<Mutex<KsLog>>,
    log: PathBuf,
}

/// How a store came back: records read from the changelog, seconds, and the mode.
#[derive(Clone, Debug, Default)]
pub struct Restore {
    pub records: f64,
    pub seconds: f64,
    pub mode: String,
    /// Of `records`, those Oxbow read but did not apply: produced by work whose source
    /// offsets were never committed (at-least-once).
    pub skipped: f64,
    /// When the engine had restored everything (epoch ms).
    pub finished_ms: i64,
}

pub fn http_get(addr: &str, path: &str) -> Option<serde_json::Value> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut b = String::new();
    s.read_to_string(&mut b).ok()?;
    serde_json::from_str(b.split_once("\r\n\r\n")?.1).ok()
}

/// A GET that keeps the status: (status, JSON body).
pub fn http_get_status(addr: &str, path: &str) -> Result<(u16, serde_json::Value), String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").map_err(|e| format!("{addr}{path}: {e}"))?;
    let mut b = String::new();
    s.read_to_string(&mut b)
        .map_err(|e| format!("{addr}{path}: {e}"))?;
    let (head, body) = b
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}{path}: no HTTP answer"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{addr}{path}: bad status line {head:?}"))?;
    let json = serde_json::from_str(body)
        .map_err(|e| format!("{addr}{path}: {status}, body not JSON: {e}"))?;
    Ok((status, json))
}

/// Peak resident set (VmHWM) of a live process, MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// utime + stime of a live process (all its threads), seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = s
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // USER_HZ is 100 on Linux, whatever the kernel's HZ.
    (ticks(11) + ticks(12)) / 100.0
}

fn oxbow_manifest(setup: &Setup, s: &Spec) -> String {
    let header = format!(
        "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {{name: {app}}}\nspec:\n  kafka: {{bootstrapServers: \"{b}\"}}\n  processingGuarantee: {g}\n  commitInterval: {c}ms\n  source: {{topics: [{i}]}}\n",
        app = s.app,
        b = setup.bootstrap,
        g = s.guarantee.oxbow(),
        c = setup.commit_ms,
        i = s.input,
    );
    // W1 and W3 payments are keyed by their user with the Java partitioner (as the
    // Kafka Streams peer's groupByKey needs): said so, Oxbow groups in place, as before
    // repartitioning existed, and checks every record's partition instead.
    let header_by_user = header.replace(
        "source: {topics: [",
        "source: {partitionedBy: value.user, topics: [",
    );
    match s.workload {
        "w1" => format!(
            "{header_by_user}  steps:\n  - aggregate:\n      store: per-user\n      groupBy: value.user\n      window: {{tumbling: 10m}}\n      fields: {{count: {{count: {{}}}}, total: {{sum: value.amount}}}}\n  sink: {{topic: {o}}}\n",
            o = s.output
        ),
        "w3" => format!(
            "{header_by_user}  steps:\n  - aggregate:\n      store: per-key\n      groupBy: value.user\n      fields: {{count: {{count: {{}}}}, total: {{sum: value.amount}}}}\n  sink: {{topic: {o}}}\n",
            o = s.output
        ),
        "w2" => {
            // The pipeline of examples/dedupe.yaml itself, on this run's topics.
            let text =
                std::fs::read_to_string(&setup.dedupe_example).expect("examples/dedupe.yaml");
            let mut m: serde_yaml::Value = serde_yaml::from_str(&text).expect("dedupe.yaml");
            m["metadata"]["name"] = s.app.clone().into();
            let spec = &mut m["spec"];
            spec["kafka"]["bootstrapServers"] = setup.bootstrap.clone().into();
            spec["processingGuarantee"] = s.guarantee.oxbow().into();
            spec["commitInterval"] = format!("{}ms", setup.commit_ms).into();
            spec["source"]["topics"] = vec![serde_yaml::Value::from(s.input.clone())].into();
            // Keyed by txId like the peer's input: dedupe in place (see W1).
            spec["source"]["partitionedBy"] = "value.txId".into();
            spec["sink"]["topic"] = s.output.clone().into();
            spec["errors"]["topic"] = s.dlq.clone().into();
            serde_yaml::to_string(&m).expect("manifest")
        }
        // Payments keyed by payment id: dedupe by txId and aggregate per user each
        // repartition (as the peer's); the users table is global (a GlobalKTable in the
        // peer), whole before the first payment in both. A day of grace: every input is
        // there from the start, so stages run at different event times.
        "w5" => format!(
            "{header}  tables:\n  - {{name: users, topic: {t}, global: true}}\n  steps:\n  - dedupe: {{store: seen, id: value.txId, within: 24h}}\n  - aggregate:\n      store: per-user\n      groupBy: value.user\n      window: {{tumbling: 10m, grace: 24h}}\n      fields: {{count: {{count: {{}}}}, total: {{sum: value.amount}}}}\n  - join: {{table: users, key: key, type: left}}\n  sink: {{topic: {o}}}\n",
            t = s.table,
            o = s.output
        ),
        other => panic!("no Oxbow pipeline for {other}"),
    }
}

/// The log file of an engine (its stderr), appended to.
fn open_log(log: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file")
}

pub fn spawn(setup: &Setup, s: &Spec) -> Proc {
    std::fs::create_dir_all(&s.state).expect("state dir");
    let log = setup.scratch.join(format!("{}.log", s.app));
    let ks = Arc::new(Mutex::new(KsLog::default()));
    let (child, addr, query_addr) = match s.kind {
        Kind::Oxbow => spawn_oxbow(setup, s, &log),
        Kind::KStreams => spawn_kstreams(setup, s, &log, &ks),
        Kind::Pipe => spawn_pipe(setup, s, &log),
    };
    Proc {
        kind: s.kind,
        child,
        addr,
        query_addr,
        ks,
        log,
    }
}

/// A spawned engine: the process, its status address, where its store is read back.
type Spawned = (Child, Option<String>, Option<String>);

/// The Oxbow worker on `s`'s manifest, its HTTP address for status and queries.
fn spawn_oxbow(setup: &Setup, s: &Spec, log: &Path) -> Spawned {
    let manifest = setup.scratch.join(format!("{}.yaml", s.app));
    std::fs::write(&manifest, oxbow_manifest(setup, s)).expect("manifest");
    // From the kernel: a fixed range met the stack's own ports (kube-router's health
    // port), and the worker could not listen.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let child = Command::new(&setup.worker)
        .args(["run", "--config"])
        .arg(&manifest)
        .arg("--state-dir")
        .arg(&s.state)
        .args([
            "--listen",
            &addr,
            "--memory-mib",
            &setup.memory_mib.to_string(),
            "--threads",
            &setup.threads.to_string(),
            // As the operator runs a new app; BENCH_STORE_ENCODING=json for the
            // encoding of an app an earlier operator ran.
            "--store-encoding",
            &std::env::var("BENCH_STORE_ENCODING").unwrap_or_else(|_| "binary".into()),
        ])
        .env(
            "RUST_LOG",
            std::env::var("BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(open_log(log))
        .spawn()
        .expect("spawn oxbow-worker");
    (child, Some(addr.clone()), Some(addr))
}

/// The Kafka Streams peer; its JSON-line events on stdout go to `ks`.
fn spawn_kstreams(setup: &Setup, s: &Spec, log: &Path, ks: &Arc<Mutex<KsLog>>) -> Spawned {
    let query_addr = s.query.then(|| {
        let port = free_port();
        format!("127.0.0.1:{port}")
    });
    let mut cmd = Command::new(&setup.java);
    cmd.args(&setup.java_opts)
        .arg("-cp")
        .arg(&setup.ks_classpath)
        .arg("dev.oxbow.bench.KStreamsBench")
        .arg(format!("workload={}", s.workload))
        .arg(format!("app={}", s.app))
        .arg(format!("bootstrap={}", setup.bootstrap))
        .arg(format!("input={}", s.input))
        .arg(format!("output={}", s.output))
        .arg(format!("dlq={}", s.dlq))
        .arg(format!("table={}", s.table))
        .arg(format!("guarantee={}", s.guarantee.kstreams()))
        .arg(format!("threads={}", setup.threads))
        .arg(format!("stateDir={}", s.state.display()))
        .arg(format!("commitMs={}", setup.commit_ms))
        .arg(format!("cacheBytes={}", setup.ks_cache_bytes))
        .args(&setup.ks_props)
        .args(&s.extra)
        .args(
            query_addr
                .as_deref()
                .and_then(|a| a.rsplit_once(':'))
                .map(|(_, port)| format!("queryPort={port}")),
        )
        .stdout(Stdio::piped())
        .stderr(open_log(log));
    let mut child = cmd.spawn().expect("spawn java (Kafka Streams peer)");
    let out = child.stdout.take().expect("stdout");
    follow_ks_events(out, ks.clone());
    (child, None, query_addr)
}

/// Reads the peer's JSON-line events from `out` into `ks` on a thread of its own.
fn follow_ks_events(out: std::process::ChildStdout, ks: Arc<Mutex<KsLog>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let t = v["t"].as_i64().unwrap_or(0);
            let part = v["partition"].as_i64().unwrap_or(-1) as i32;
            let mut l = ks.lock().expect("ks log");
            match v["event"].as_str().unwrap_or("") {
                "start" => l.version = v["kafkaStreams"].as_str().unwrap_or("").into(),
                "state" => l.running = v["state"] == "RUNNING",
                "error" => l.error = Some(v["message"].as_str().unwrap_or("").into()),
                "restore_start" => {
                    l.restore_starts
                        .push((t, part, v["startOffset"].as_i64().unwrap_or(0)))
                }
                "restore_end" => {
                    l.restore_ends
                        .push((t, part, v["restored"].as_i64().unwrap_or(0)))
                }
                _ => {}
            }
        }
    });
}

/// This binary's raw pipe.
fn spawn_pipe(setup: &Setup, s: &Spec, log: &Path) -> Spawned {
    let child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "pipe",
            &setup.bootstrap,
            &s.input,
            &s.output,
            &s.app,
            s.guarantee.oxbow(),
            &setup.commit_ms.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(open_log(log))
        .spawn()
        .expect("spawn pipe");
    (child, None, None)
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ok while the process lives; its exit (with its log's tail) otherwise.
    pub fn alive(&mut self) -> Result<(), String> {
        if let Ok(Some(st)) = self.child.try_wait() {
            return Err(format!(
                "{} exited ({st}); {}",
                self.kind.name(),
                self.log_tail()
            ));
        }
        if let Some(e) = &self.ks.lock().expect("ks log").error {
            return Err(format!("kstreams failed: {e}"));
        }
        Ok(())
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "log {}:\n{}",
            self.log.display(),
            lines[lines.len().saturating_sub(15)..].join("\n")
        )
    }

    pub fn status(&self) -> Option<serde_json::Value> {
        http_get(self.addr.as_deref()?, "/v1/status")
    }

    /// Whether the engine reports that it processes (see `wait_running`).
    pub fn is_running(&self) -> bool {
        match self.kind {
            Kind::Oxbow => self.status().is_some_and(|s| s["state"] == "Running"),
            Kind::KStreams => self.ks.lock().expect("ks log").running,
            Kind::Pipe => true,
        }
    }

    /// Waits until the engine processes: the worker reports Running (its restores are
    /// done), Kafka Streams reaches RUNNING, the pipe has started.
    pub fn wait_running(&mut self, timeout: Duration) -> Result<Instant, String> {
        let deadline = Instant::now() + timeout;
        loop {
            self.alive()?;
            if self.is_running() {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} not running after {timeout:?}",
                    self.kind.name()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// What the last start restored. Kafka Streams restores in the background: this waits
    /// until `expect` restores (and every one that started) have ended.
    pub fn restore(&mut self, expect: usize, timeout: Duration) -> Result<Restore, String> {
        match self.kind {
            Kind::Oxbow => {
                let s = self.status().ok_or("no status")?;
                let mut r = Restore::default();
                let mut modes = std::collections::BTreeSet::new();
                for t in s["tasks"].as_array().into_iter().flatten() {
                    let x = &t["restore"];
                    r.records += x["restored"].as_f64().unwrap_or(0.0)
                        + x["skipped"].as_f64().unwrap_or(0.0);
                    r.skipped += x["skipped"].as_f64().unwrap_or(0.0);
                    // Tasks restore side by side and each counts from the start of
                    // the batch: the slowest one is the wall time.
                    r.seconds = r.seconds.max(x["seconds"].as_f64().unwrap_or(0.0));
                    if let Some(m) = x["mode"].as_str() {
                        modes.insert(m.split([' ', '(']).next().unwrap_or(m).to_string());
                    }
                }
                r.mode = modes.into_iter().collect::<Vec<_>>().join("+");
                r.finished_ms = crate::now_ms();
                Ok(r)
            }
            Kind::KStreams => {
                let deadline = Instant::now() + timeout;
                loop {
                    self.alive()?;
                    {
                        let l = self.ks.lock().expect("ks log");
                        let (starts, ends) = (l.restore_starts.len(), l.restore_ends.len());
                        if l.running && ends >= starts && ends >= expect {
                            if starts == 0 {
                                return Ok(Restore {
                                    mode: "upToDate".into(),
                                    finished_ms: crate::now_ms(),
                                    ..Restore::default()
                                });
                            }
                            let t0 = l.restore_starts.iter().map(|e| e.0).min().unwrap_or(0);
                            let t1 = l.restore_ends.iter().map(|e| e.0).max().unwrap_or(0);
                            let full = l.restore_starts.iter().any(|e| e.2 == 0);
                            return Ok(Restore {
                                records: l.restore_ends.iter().map(|e| e.2 as f64).sum(),
                                seconds: (t1 - t0) as f64 / 1000.0,
                                mode: if full { "full" } else { "tail" }.into(),
                                finished_ms: t1,
                                ..Restore::default()
                            });
                        }
                    }
                    if Instant::now() > deadline {
                        return Err("Kafka Streams restores did not end".into());
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Kind::Pipe => Ok(Restore::default()),
        }
    }

    /// GET `path` on the engine's query endpoint; retried while the store answers 503
    /// (Kafka Streams between a rebalance and RUNNING, a task still restoring).
    pub fn query(&mut self, path: &str) -> Result<(u16, serde_json::Value), String> {
        let addr = self
            .query_addr
            .clone()
            .ok_or_else(|| format!("{} has no query endpoint", self.kind.name()))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.alive()?;
            let r = http_get_status(&addr, path);
            match &r {
                Ok((503, _)) | Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                _ => return r,
            }
        }
    }

    /// SIGTERM, then wait for a clean exit (Kafka Streams writes its checkpoints then).
    pub fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGKILL: no shutdown of any kind.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    /// An engine left running by a failed workload is killed.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Copies a state directory (the process that owns it is stopped).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir").flatten() {
        let target = to.join(e.file_name());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}
