//! A small benchmark of the worker on the local Kafka (`make bench-worker`): the
//! windowed-aggregate workload (JSON records of ~150 bytes over many keys, 10-minute
//! tumbling windows, count + sum per key), at-least-once and exactly-once with a
//! 100 ms commit interval; then a full restore of the exactly-once run's state from its
//! changelog. Prints records/s, peak RSS and the restore rate. Figures, not assertions:
//! run it next to a peer on the same machine to compare.
//!
//! `cargo run --release -p oxbow-worker --example bench -- [records] [keys] [partitions]`

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn get(addr: &str, path: &str) -> Option<serde_json::Value> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut b = String::new();
    s.read_to_string(&mut b).ok()?;
    serde_json::from_str(b.split_once("\r\n\r\n")?.1).ok()
}

fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_string)
        })
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = s
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

struct Run {
    child: Child,
    addr: String,
}

fn spawn(
    worker: &std::path::Path,
    manifest: &std::path::Path,
    state: &std::path::Path,
    port: u16,
) -> Run {
    let child = Command::new(worker)
        .args(["run", "--config"])
        .arg(manifest)
        .arg("--state-dir")
        .arg(state)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--memory-mib",
            &std::env::var("BENCH_MEMORY_MIB").unwrap_or_else(|_| "256".into()),
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn oxbow-worker");
    Run {
        child,
        addr: format!("127.0.0.1:{port}"),
    }
}

fn wait_ready(r: &mut Run) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while Instant::now() < deadline {
        if let Ok(Some(st)) = r.child.try_wait() {
            panic!("worker exited: {st}");
        }
        if get(&r.addr, "/v1/status").is_some_and(|s| s["state"] == "Running") {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("worker not running after 600 s");
}

fn stop(mut r: Run) {
    let _ = Command::new("kill")
        .args(["-TERM", &r.child.id().to_string()])
        .status();
    let _ = r.child.wait();
}

fn main() {
    let records = arg(1, 1_000_000);
    let keys = arg(2, 100_000);
    let partitions = arg(3, 4) as i32;
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP")
        .expect("KAFKA_BOOTSTRAP (run `make up`, source ~/.cache/oxbow/stack/env)");
    let worker = std::env::current_exe()
        .expect("exe")
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .join("oxbow-worker");
    assert!(
        worker.exists(),
        "{} is missing: cargo build --release -p oxbow-worker",
        worker.display()
    );
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let input = format!("bench-{run_id}-in");
    let scratch = std::env::temp_dir().join(format!("oxbow-bench-{run_id}"));
    std::fs::create_dir_all(&scratch).expect("scratch dir");

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("admin");
    let topics = [NewTopic::new(
        &input,
        partitions,
        TopicReplication::Fixed(1),
    )];
    futures::executor::block_on(admin.create_topics(topics.iter(), &AdminOptions::new()))
        .expect("create topic");

    eprintln!(
        "generating {records} records over {keys} keys into {input} ({partitions} partitions)…"
    );
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer");
    // Recent event times: outputs carry them, and time retention deletes old stamps.
    let base_ts: i64 = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
        - 86_400_000)
        / 600_000
        * 600_000;
    let mut x: u64 = 0x2545F4914F6CDD1D;
    for i in 0..records {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let user = format!("user-{:06}", x % keys);
        let value = format!(
            r#"{{"user":"{user}","amount":{},"currency":"EUR","merchant":"m-{:04}","ts":{},"channel":"web","note":"benchmark-record"}}"#,
            x % 10_000,
            x % 1000,
            base_ts + i as i64 * 5
        );
        let mut rec = BaseRecord::to(&input)
            .key(user.as_str())
            .payload(value.as_str());
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((_, back)) => {
                    rec = back;
                    p.poll(Duration::from_millis(1));
                }
            }
        }
    }
    p.flush(Duration::from_secs(120)).expect("flush");
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("consumer");
    let ends: Vec<i64> = (0..partitions)
        .map(|q| {
            c.fetch_watermarks(&input, q, Duration::from_secs(10))
                .expect("watermarks")
                .1
        })
        .collect();

    let commit = std::env::var("BENCH_COMMIT_INTERVAL").unwrap_or_else(|_| "100ms".into());
    println!(
        "\nOxbow worker, W1 windowed aggregate: {records} records, {keys} keys, {partitions} partitions, commit {commit}"
    );
    println!(
        "{:<16} {:>12} {:>10} {:>14} {:>12}",
        "guarantee", "records/s", "seconds", "peak RSS MiB", "CPU s/M rec"
    );
    let mut port = 18500;
    let mut eos_state = None;
    for guarantee in ["at_least_once", "exactly_once"] {
        let app = format!("bench-{run_id}-{}", &guarantee[..5].trim_end_matches('_'));
        let manifest = scratch.join(format!("{app}.yaml"));
        std::fs::write(
            &manifest,
            format!(
                "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {{name: {app}}}\nspec:\n  kafka: {{bootstrapServers: \"{bootstrap}\"}}\n  processingGuarantee: {guarantee}\n  commitInterval: {commit}\n  source: {{topics: [{input}], timestamp: value.ts}}\n  steps:\n  - aggregate:\n      store: per-user\n      groupBy: value.user\n      window: {{tumbling: 10m}}\n      fields: {{count: {{count: {{}}}}, total: {{sum: value.amount}}}}\n  sink: {{topic: {app}-out}}\n"
            ),
        )
        .expect("manifest");
        let out_topic = format!("{app}-out");
        let out = [NewTopic::new(
            &out_topic,
            partitions,
            TopicReplication::Fixed(1),
        )];
        futures::executor::block_on(admin.create_topics(out.iter(), &AdminOptions::new()))
            .expect("create output");
        let state = scratch.join(format!("{app}-state"));
        port += 1;
        let mut r = spawn(&worker, &manifest, &state, port);
        wait_ready(&mut r);
        let cpu0 = cpu_seconds(r.child.id());
        let started = Instant::now();
        loop {
            let done = get(&r.addr, "/v1/status").is_some_and(|s| {
                s["tasks"].as_array().is_some_and(|ts| {
                    ts.iter().all(|t| {
                        let q = t["task"].as_u64().unwrap_or(0) as usize;
                        t["positions"][&input].as_i64().unwrap_or(0) >= ends[q]
                    })
                })
            });
            if done {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let secs = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds(r.child.id()) - cpu0;
        let rss = peak_rss_mib(r.child.id());
        println!(
            "{:<16} {:>12.0} {:>10.2} {:>14.1} {:>12.2}",
            guarantee,
            records as f64 / secs,
            secs,
            rss,
            cpu / (records as f64 / 1e6)
        );
        stop(r);
        if guarantee == "exactly_once" {
            eos_state = Some((manifest, state));
        }
    }

    if let Some((manifest, state)) = eos_state {
        std::fs::remove_dir_all(&state).expect("delete state");
        port += 1;
        let mut r = spawn(&worker, &manifest, &state, port);
        wait_ready(&mut r);
        let s = get(&r.addr, "/v1/status").expect("status");
        let (mut restored, mut secs) = (0.0, 0.0f64);
        for t in s["tasks"].as_array().into_iter().flatten() {
            restored += t["restore"]["restored"].as_f64().unwrap_or(0.0)
                + t["restore"]["skipped"].as_f64().unwrap_or(0.0);
            secs += t["restore"]["seconds"].as_f64().unwrap_or(0.0);
        }
        let rss = peak_rss_mib(r.child.id());
        println!(
            "\nfull restore from the changelog (empty state dir, tasks restored one after another): {restored:.0} records in {secs:.2} s = {:.0} records/s, peak RSS {rss:.1} MiB",
            restored / secs.max(1e-9)
        );
        stop(r);
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
