//! Fixtures for the worker's integration tests: a real Kafka (the local stack's
//! `KAFKA_BOOTSTRAP`), the real `oxbow-worker` binary as a child process, and helpers
//! that wait on conditions with a deadline and say what did not happen.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

pub fn bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP").expect(
        "KAFKA_BOOTSTRAP is not set: these tests need the local stack (`make up`, then `. ~/.cache/oxbow/stack/env`; `make test` does both)",
    )
}

/// A name no other test run uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 100_000_000;
    format!(
        "{prefix}-{t}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Polls `f` until it returns `Some`, or panics after `timeout` saying what did not happen.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

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

pub fn create_topic(name: &str, partitions: i32) {
    create_topic_with(name, partitions, &[]);
}

/// A topic with these config overrides (`max.message.bytes`, ...).
pub fn create_topic_with(name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let r = futures::executor::block_on(admin.create_topics([&t], &AdminOptions::new()))
        .expect("create_topics request");
    for x in r {
        x.unwrap_or_else(|(t, e)| panic!("failed to create topic {t}: {e}"));
    }
}

/// Deletes a consumer group and its committed offsets, as `kafka-consumer-groups
/// --delete` or an offsets.retention expiry would.
pub fn delete_group(group: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let r = futures::executor::block_on(admin.delete_groups(&[group], &AdminOptions::new()))
        .expect("delete_groups request");
    for x in r {
        x.unwrap_or_else(|(g, e)| panic!("failed to delete group {g}: {e}"));
    }
}

pub struct Input {
    pub key: Option<String>,
    pub value: Vec<u8>,
    pub partition: Option<i32>,
    pub timestamp: Option<i64>,
}

impl Input {
    pub fn json(key: &str, value: serde_json::Value) -> Self {
        Self {
            key: Some(key.into()),
            value: serde_json::to_vec(&value).unwrap(),
            partition: None,
            timestamp: None,
        }
    }
    pub fn raw(key: &str, value: &[u8]) -> Self {
        Self {
            key: Some(key.into()),
            value: value.to_vec(),
            partition: None,
            timestamp: None,
        }
    }
    pub fn partition(mut self, p: i32) -> Self {
        self.partition = Some(p);
        self
    }
    pub fn at(mut self, ts: i64) -> Self {
        self.timestamp = Some(ts);
        self
    }
}

pub fn produce(topic: &str, records: impl IntoIterator<Item = Input>) {
    produce_with(topic, records, &[]);
}

/// [`produce`] with extra producer settings (`message.max.bytes`, ...).
pub fn produce_with(
    topic: &str,
    records: impl IntoIterator<Item = Input>,
    settings: &[(&str, &str)],
) {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5");
    for (k, v) in settings {
        c.set(*k, *v);
    }
    let p: ThreadedProducer<DefaultProducerContext> = c.create().expect("producer");
    for r in records {
        let mut rec: BaseRecord<'_, str, [u8]> = BaseRecord::to(topic).payload(&r.value);
        if let Some(k) = &r.key {
            rec = rec.key(k.as_str());
        }
        if let Some(pt) = r.partition {
            rec = rec.partition(pt);
        }
        if let Some(ts) = r.timestamp {
            rec = rec.timestamp(ts);
        }
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    back,
                )) => {
                    rec = back;
                    p.poll(Duration::from_millis(5));
                }
                Err((e, _)) => panic!("failed to produce to {topic}: {e}"),
            }
        }
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

#[derive(Debug, Clone, PartialEq)]
pub struct Out {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub value: Option<Vec<u8>>,
    pub headers: BTreeMap<String, String>,
}

impl Out {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(self.value.as_deref().unwrap_or(b"null")).unwrap_or_else(|e| {
            panic!(
                "output at {}@{} is not JSON: {e}",
                self.partition, self.offset
            )
        })
    }
}

/// Everything in `topic` up to its end now, read as `isolation` (`read_committed` or
/// `read_uncommitted`), in partition then offset order.
pub fn read_all(topic: &str, isolation: &str) -> Vec<Out> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let parts = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len())
        .unwrap_or(0);
    assert!(parts > 0, "topic {topic} does not exist");
    let mut tpl = TopicPartitionList::new();
    let mut open = std::collections::BTreeSet::new();
    for p in 0..parts as i32 {
        let (lo, hi) = wait_for(
            &format!("the offsets of {topic}[{p}]"),
            Duration::from_secs(60),
            || c.fetch_watermarks(topic, p, Duration::from_secs(5)).ok(),
        );
        if hi > lo {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
            open.insert(p);
        }
    }
    let mut out = Vec::new();
    if open.is_empty() {
        return out;
    }
    c.assign(&tpl).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !open.is_empty() {
        assert!(
            Instant::now() < deadline,
            "timed out reading {topic}; partitions {open:?} never reached their end"
        );
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let mut headers = BTreeMap::new();
                if let Some(h) = m.headers() {
                    for x in h.iter() {
                        headers.insert(
                            x.key.to_string(),
                            String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                        );
                    }
                }
                out.push(Out {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    value: m.payload().map(<[u8]>::to_vec),
                    headers,
                });
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => panic!("failed to read {topic}: {e}"),
            None => {}
        }
    }
    out.sort_by_key(|o| (o.partition, o.offset));
    out
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A minimal HTTP/1.0 GET: status code and body.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
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
        let deadline = Instant::now() + timeout;
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
            assert!(
                Instant::now() < deadline,
                "worker not ready after {timeout:?}; log:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
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
        let deadline = Instant::now() + timeout;
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
            assert!(
                Instant::now() < deadline,
                "worker's stage-{stage} tasks did not commit up to {ends:?} of {topic} within {timeout:?}; status: {:?}\nlog:\n{}",
                self.status(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
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
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.exited() {
                assert!(
                    st.success(),
                    "worker exited with {st} after SIGTERM; log:\n{}",
                    self.logs()
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit within 30s of SIGTERM; log:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// End offsets of every partition of `topic`.
pub fn end_offsets(topic: &str) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let n = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len())
        .unwrap_or(0);
    // Right after a broker restart a partition may have no leader yet: retry.
    (0..n as i32)
        .map(|p| {
            let end = wait_for(
                &format!("the end offset of {topic}[{p}]"),
                Duration::from_secs(60),
                || c.fetch_watermarks(topic, p, Duration::from_secs(5)).ok(),
            );
            (p, end.1)
        })
        .collect()
}

/// Log start offsets (low watermarks) of every partition of `topic`.
pub fn start_offsets(topic: &str) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let n = topic_partitions(topic).unwrap_or(0);
    (0..n as i32)
        .filter_map(|p| {
            let (low, _) = c.fetch_watermarks(topic, p, Duration::from_secs(5)).ok()?;
            Some((p, low))
        })
        .collect()
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

/// The partition count of `topic`, or `None` when it does not exist. Asks for the
/// metadata of every topic: a request naming a missing topic may make a broker with
/// `auto.create.topics.enable` create it.
pub fn topic_partitions(topic: &str) -> Option<usize> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("consumer");
    let md = wait_for(
        "the cluster's topic metadata",
        Duration::from_secs(30),
        || c.fetch_metadata(None, Duration::from_secs(5)).ok(),
    );
    md.topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len())
}

/// Reads `topic` (as `isolation`) until `done` holds for everything in it, or panics
/// after `timeout` saying `what` did not happen and how many records there were. A
/// topic that does not exist yet (one the worker creates) reads as empty.
pub fn read_until(
    topic: &str,
    isolation: &str,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut(&[Out]) -> bool,
) -> Vec<Out> {
    let deadline = Instant::now() + timeout;
    loop {
        let out = if topic_partitions(topic).is_some() {
            read_all(topic, isolation)
        } else {
            Vec::new()
        };
        if done(&out) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what} in {topic} ({} records there)",
            out.len()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
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
    let deadline = Instant::now() + timeout;
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
        assert!(
            Instant::now() < deadline,
            "the stage-{stage} tasks did not commit {topic} up to {ends:?} within {timeout:?}; committed: {positions:?}\nlogs:\n{}",
            workers
                .iter()
                .map(|w| w.logs())
                .collect::<Vec<_>>()
                .join("\n-----\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A task entry's id of `/v1/status` as (stage, partition): `"1_3"` is (1, 3).
pub fn task_id(task: &serde_json::Value) -> Option<(u32, i32)> {
    let (stage, partition) = task["task"].as_str()?.split_once('_')?;
    Some((stage.parse().ok()?, partition.parse().ok()?))
}

/// Per partition, one past the last committed data record of `topic` (transaction
/// markers are not records a task processes, so the log end can be beyond it).
pub fn data_ends(topic: &str) -> BTreeMap<i32, i64> {
    let mut ends = BTreeMap::new();
    for o in read_all(topic, "read_committed") {
        let e = ends.entry(o.partition).or_insert(0);
        *e = (*e).max(o.offset + 1);
    }
    ends
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
