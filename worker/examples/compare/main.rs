//! Oxbow side by side with Kafka Streams on the same broker, the same topics and the same
//! guarantees (`make bench`, issue 7). For each workload it generates the input once
//! (seeded), runs every engine over it, checks each output against what the generator
//! computed before the run's figures count, and prints medians with the ratio Oxbow /
//! Kafka Streams (and Oxbow / raw pipe):
//!
//! - W1: windowed aggregate (10-minute tumbling windows, count + sum per user),
//!   at-least-once and exactly-once; records/s, peak RSS, CPU seconds per million records
//!   (w1.rs).
//! - W2: examples/dedupe.yaml (dedupe, map, sink, dead letters), exactly-once (w2.rs).
//! - W3: restore of a changelog of BENCH_RESTORE_KEYS keys from an empty state directory,
//!   and from a copy of the state BENCH_RESTORE_TAIL records behind; the restored store is
//!   read back (a seeded sample and the tail's keys) before the figures count. With the
//!   pipe engine selected, a plain consumer reading Oxbow's changelog to its end gives the
//!   restore limit (the pipe column of the full-restore rows) (w3.rs).
//! - W4: W1 exactly-once (`w4`) and at-least-once (`w4alos`), SIGKILL half-way, restart on
//!   the same state: time until every partition commits again, and the changelog records
//!   replayed (w4.rs).
//! - W5: payments keyed by payment id, deduped by txId, aggregated per user in windows
//!   (two repartitions) and joined with a global users table, exactly-once (w5.rs).
//! - latency: W1 at a fixed input rate: p50/p99 from the input's timestamp to the output
//!   seen by a read_committed consumer (latency.rs).
//! - the raw pipe (`compare pipe …`, pipe.rs): consume → produce, no state.
//!
//! Environment (defaults are the issue's sizes): KAFKA_BOOTSTRAP; BENCH_RECORDS
//! (1000000), BENCH_KEYS (100000), BENCH_PARTITIONS (4), BENCH_RUNS (3), BENCH_SEED (42),
//! BENCH_W2_RECORDS (= BENCH_RECORDS), BENCH_RESTORE_KEYS (1000000), BENCH_RESTORE_TAIL
//! (50000), BENCH_RATE (5000 records/s), BENCH_LATENCY_SECS (30), BENCH_WORKLOADS
//! (w1,w2,w3,w4,w4alos,w5,latency), BENCH_ENGINES (oxbow,kstreams,pipe), BENCH_THREADS (cores),
//! BENCH_MEMORY_MIB (256, the worker's), BENCH_COMMIT_MS (100), BENCH_KS_CACHE_BYTES (0:
//! every update emitted, as Oxbow's `emit: onUpdate`), BENCH_KS_JAVA_OPTS (-Xmx1g),
//! BENCH_KS_PROPS (producer.compression.type=lz4), BENCH_KSTREAMS_DIR (bench/kstreams),
//! BENCH_REPORT (a markdown file whose results section is replaced), BENCH_KEEP (keep the
//! run's topics and state).
//!
//! This file reads that environment, sets the run up, runs the selected workloads in that
//! order, prints and writes the report and cleans up; each workload's runner is an
//! `impl Bench` in its own file, the engines are in engine.rs, the generators and checks
//! in workload.rs, the Kafka helpers in kafka.rs and the table in report.rs.

mod engine;
mod kafka;
mod latency;
mod pipe;
mod report;
mod w1;
mod w2;
mod w3;
mod w4;
mod w5;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use engine::{Guarantee, Kind, Setup, Spec, cpu_seconds, peak_rss_mib, spawn};
use kafka::{Kafka, wait_committed};
use report::Report;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn env_str(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

struct Cfg {
    records: u64,
    keys: u64,
    partitions: i32,
    runs: u64,
    seed: u64,
    w2_records: u64,
    restore_keys: u64,
    restore_tail: u64,
    rate: u64,
    latency_secs: u64,
    workloads: Vec<String>,
    engines: Vec<Kind>,
    ks_cache_bytes: u64,
}

struct Bench {
    cfg: Cfg,
    k: Kafka,
    setup: Setup,
    prefix: String,
    report: Report,
    /// Recent event times: outputs carry them, and time retention deletes old stamps.
    base_ts: i64,
}

const LONG: Duration = Duration::from_secs(1800);

impl Bench {
    /// The end offsets of a generated input: where a run over it is complete.
    fn input_ends(&self, input: &str) -> Vec<i64> {
        self.k
            .end_offsets(input, self.cfg.partitions)
            .expect("ends")
    }

    /// Each run of each selected engine that keeps state (the raw pipe has no
    /// counterpart of a stateful workload), in the order the runs go.
    fn engine_runs(&self) -> Vec<(u64, Kind)> {
        (1..=self.cfg.runs)
            .flat_map(|run| {
                self.cfg
                    .engines
                    .iter()
                    .filter(|k| **k != Kind::Pipe)
                    .map(move |k| (run, *k))
            })
            .collect()
    }

    fn spec(
        &self,
        kind: Kind,
        workload: &'static str,
        g: Guarantee,
        app: String,
        input: &str,
    ) -> Spec {
        Spec {
            kind,
            workload,
            guarantee: g,
            output: format!("{app}-out"),
            dlq: format!("{app}-dlq"),
            state: self.setup.scratch.join(format!("{app}-state")),
            table: String::new(),
            extra: Vec::new(),
            query: false,
            input: input.to_string(),
            app,
        }
    }

    /// Runs `s` over `input` until it has committed `ends`: (seconds, peak RSS, CPU s).
    fn throughput(&self, s: &Spec, ends: &[i64]) -> Result<(f64, f64, f64), String> {
        self.measure(s, ends, |_, _, committed| Ok(committed))
    }

    /// Runs `s` until it has committed `ends` of its first input, then until `finish`
    /// (given the process, the group's offsets reader and when the input was committed)
    /// says when the run ended: (seconds from running to then, peak RSS, CPU s).
    fn measure(
        &self,
        s: &Spec,
        ends: &[i64],
        finish: impl FnOnce(
            &mut engine::Proc,
            &rdkafka::consumer::BaseConsumer,
            Instant,
        ) -> Result<Instant, String>,
    ) -> Result<(f64, f64, f64), String> {
        let mut p = spawn(&self.setup, s);
        let res = (|| {
            let t0 = p.wait_running(Duration::from_secs(600))?;
            let cpu0 = cpu_seconds(p.pid());
            let reader = self.k.offsets_reader(&s.app);
            let input = s.input.split(',').next().unwrap_or_default();
            let committed = wait_committed(&reader, input, ends, LONG, &mut || p.alive())?;
            let t1 = finish(&mut p, &reader, committed)?;
            Ok((
                (t1 - t0).as_secs_f64(),
                peak_rss_mib(p.pid()),
                cpu_seconds(p.pid()) - cpu0,
            ))
        })();
        if res.is_err() {
            eprintln!("{}", p.log_tail());
        }
        p.stop();
        res
    }
}

fn guarded(b: &mut Bench, name: &str, f: impl FnOnce(&mut Bench)) {
    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(b))) {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        b.report.check(format!("{name} stopped: {msg}"), false);
    }
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map_or(0.0, |k| k / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{} cores ({model}), {mem:.0} GiB, Linux {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel.trim()
    )
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn command_output(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| {
            let s = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&s)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// `compare cleanup bench-<unix time>-`: deletes an interrupted run's topics.
fn cleanup_command(args: &[String]) {
    // After an interrupted run: `compare cleanup bench-<unix time>-`.
    let prefix = args.get(2).expect("cleanup bench-<unix time>-");
    assert!(
        prefix.starts_with("bench-"),
        "only bench- topics are deleted"
    );
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP").expect("KAFKA_BOOTSTRAP");
    let n = Kafka::new(&bootstrap).delete_topics_with_prefix(prefix);
    eprintln!("deleted {n} topics {prefix}*");
}

impl Cfg {
    /// The sizes and selections of the run, from the environment (see the module docs).
    fn from_env() -> Self {
        let records = env_u64("BENCH_RECORDS", 1_000_000);
        let engines: Vec<Kind> = env_str("BENCH_ENGINES", "oxbow,kstreams,pipe")
            .split(',')
            .filter_map(|e| match e.trim() {
                "oxbow" => Some(Kind::Oxbow),
                "kstreams" => Some(Kind::KStreams),
                "pipe" => Some(Kind::Pipe),
                "" => None,
                other => panic!("BENCH_ENGINES: unknown engine {other}"),
            })
            .collect();
        Cfg {
            records,
            keys: env_u64("BENCH_KEYS", 100_000).max(1),
            partitions: env_u64("BENCH_PARTITIONS", 4).max(1) as i32,
            runs: env_u64("BENCH_RUNS", 3).max(1),
            seed: env_u64("BENCH_SEED", 42),
            w2_records: env_u64("BENCH_W2_RECORDS", records),
            restore_keys: env_u64("BENCH_RESTORE_KEYS", 1_000_000).max(1),
            restore_tail: env_u64("BENCH_RESTORE_TAIL", 50_000),
            rate: env_u64("BENCH_RATE", 5_000),
            latency_secs: env_u64("BENCH_LATENCY_SECS", 30),
            workloads: env_str("BENCH_WORKLOADS", "w1,w2,w3,w4,w4alos,w5,latency")
                .split(',')
                .map(|w| w.trim().to_string())
                .filter(|w| !w.is_empty())
                .collect(),
            engines,
            ks_cache_bytes: env_u64("BENCH_KS_CACHE_BYTES", 0),
        }
    }
}

/// The repository's root (for bench/kstreams, examples/dedupe.yaml and its revision).
fn repo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Kafka Streams peer's class path (bench/kstreams, built by build-kstreams.sh), when
/// that engine is selected.
fn ks_classpath(cfg: &Cfg, repo: &Path) -> String {
    let ks_dir = std::env::var("BENCH_KSTREAMS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo.join("bench/kstreams"));
    if cfg.engines.contains(&Kind::KStreams) {
        let deps = std::fs::read_to_string(ks_dir.join("target/classpath.txt")).unwrap_or_else(|_| {
            panic!("{}/target/classpath.txt is missing: build the peer with `make bench` (bench/build-kstreams.sh)", ks_dir.display())
        });
        format!(
            "{}:{}",
            ks_dir.join("target/classes").display(),
            deps.trim()
        )
    } else {
        String::new()
    }
}

/// How the engines are started (binaries, JVM, threads, memory, this run's scratch
/// directory, created here), and the run's topic prefix `bench-<unix time>-`.
fn setup(bootstrap: &str, cfg: &Cfg, repo: &Path) -> (Setup, String) {
    let exe = std::env::current_exe().expect("exe");
    let worker = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .join("oxbow-worker");
    let ks_classpath = ks_classpath(cfg, repo);
    if cfg.engines.contains(&Kind::Oxbow) {
        assert!(
            worker.exists(),
            "{} is missing: cargo build --release -p oxbow-worker",
            worker.display()
        );
    }
    let run_id = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let prefix = format!("bench-{run_id}-");
    let scratch = std::env::temp_dir().join(format!("oxbow-compare-{run_id}"));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    let threads = env_u64(
        "BENCH_THREADS",
        std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
    ) as usize;
    let setup = Setup {
        bootstrap: bootstrap.to_string(),
        worker,
        java: env_str("BENCH_JAVA", "java"),
        java_opts: env_str("BENCH_KS_JAVA_OPTS", "-Xmx1g")
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        ks_classpath,
        ks_props: env_str("BENCH_KS_PROPS", "producer.compression.type=lz4")
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| format!("prop.{}", p.trim()))
            .collect(),
        threads,
        ks_cache_bytes: cfg.ks_cache_bytes,
        memory_mib: env_u64("BENCH_MEMORY_MIB", 256),
        commit_ms: env_u64("BENCH_COMMIT_MS", 100),
        scratch,
        dedupe_example: repo.join("examples/dedupe.yaml"),
    };
    (setup, prefix)
}

/// Runs the workloads of BENCH_WORKLOADS in their order. A workload that fails (a broker
/// restarted by someone else, an engine that does not start) is reported as a failed
/// check; the others still run and the report is written.
fn run_workloads(b: &mut Bench) {
    let wants = |w: &str| b.cfg.workloads.iter().any(|x| x == w);
    let (do_w1, do_w2, do_w3, do_w4, do_w4alos, do_w5, do_lat) = (
        wants("w1"),
        wants("w2"),
        wants("w3"),
        wants("w4"),
        wants("w4alos"),
        wants("w5"),
        wants("latency"),
    );
    if do_w1 || do_w4 || do_w4alos {
        guarded(b, "W1/W4", |b| {
            let (input, expected, ends) = b.w1_input();
            if do_w1 {
                guarded(b, "W1", |b| b.w1(&input, &expected, &ends));
            }
            if do_w4 {
                guarded(b, "W4", |b| b.w4(&input, &expected, &ends, Guarantee::Eos));
            }
            if do_w4alos {
                guarded(b, "W4 ALOS", |b| {
                    b.w4(&input, &expected, &ends, Guarantee::Alos)
                });
            }
        });
    }
    if do_w2 {
        guarded(b, "W2", Bench::w2);
    }
    if do_w3 {
        guarded(b, "W3", Bench::w3);
    }
    if do_w5 {
        guarded(b, "W5", Bench::w5);
    }
    if do_lat {
        guarded(b, "latency", Bench::latency);
    }
}

/// The report's head: the machine, versions and parameters of the run.
fn summary(
    b: &Bench,
    repo: &Path,
    load_before: &str,
    load_after: &str,
    started: Instant,
) -> String {
    let prefix = &b.prefix;
    let ks_version = env_str("BENCH_KAFKA_VERSION", "4.1.2");
    format!(
        "Run {prefix} on {}, {}; load average {load_before} before, {load_after} after; {:.0} min.\n\n\
         Versions: Oxbow {} ({}), librdkafka {}, Kafka Streams {ks_version} on {}, Kafka broker {ks_version} (local, one broker).\n\n\
         Parameters: workloads {}, engines {}; {} records over {} keys, {} partitions, {} runs (medians), seed {}; W2 {} records; W3 {} keys, tail {}; \
         latency {} records/s for {} s; commit interval {} ms; worker --memory-mib {}; processing threads {} (Oxbow --threads, Kafka Streams num.stream.threads), \
         statestore.cache.max.bytes {}, JVM {}, {}.\n",
        machine(),
        command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        started.elapsed().as_secs_f64() / 60.0,
        env!("CARGO_PKG_VERSION"),
        command_output(
            "git",
            &[
                "-C",
                &repo.display().to_string(),
                "rev-parse",
                "--short",
                "HEAD"
            ]
        ),
        rdkafka::util::get_rdkafka_version().1,
        command_output(&b.setup.java, &["-version"]),
        b.cfg.workloads.join(","),
        b.cfg
            .engines
            .iter()
            .map(|e| e.name())
            .collect::<Vec<_>>()
            .join(","),
        b.cfg.records,
        b.cfg.keys,
        b.cfg.partitions,
        b.cfg.runs,
        b.cfg.seed,
        b.cfg.w2_records,
        b.cfg.restore_keys,
        b.cfg.restore_tail,
        b.cfg.rate,
        b.cfg.latency_secs,
        b.setup.commit_ms,
        b.setup.memory_mib,
        b.setup.threads,
        b.cfg.ks_cache_bytes,
        b.setup.java_opts.join(" "),
        b.setup.ks_props.join(" "),
    )
}

/// Prints the results (`summary`, the table, the checks) and, with BENCH_REPORT set,
/// replaces the results section of that file with them.
fn write_results(b: &Bench, summary: &str) {
    let table = b.report.table();
    let checks = b.report.checks.join("\n");
    println!(
        "\n{summary}\n{table}\nCorrectness checks ({} failed):\n{checks}",
        b.report.failures
    );

    if let Ok(path) = std::env::var("BENCH_REPORT") {
        let block = format!(
            "<!-- results:begin (written by `make bench`; everything up to results:end is replaced) -->\n{summary}\n{table}\n<details><summary>Correctness checks ({} failed)</summary>\n\n```\n{checks}\n```\n</details>\n<!-- results:end -->",
            b.report.failures
        );
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        std::fs::write(&path, replace_results(&old, &block)).expect("write report");
        eprintln!("wrote {path}");
    }
}

/// `old` with its results section (results:begin to results:end) replaced by `block`,
/// or with `block` appended when it has none.
fn replace_results(old: &str, block: &str) -> String {
    match (
        old.find("<!-- results:begin"),
        old.find("<!-- results:end -->"),
    ) {
        (Some(a), Some(z)) if a < z => format!(
            "{}{block}{}",
            &old[..a],
            &old[z + "<!-- results:end -->".len()..]
        ),
        _ => format!("{old}\n{block}\n"),
    }
}

/// Deletes the run's topics and scratch directory, unless BENCH_KEEP is set.
fn clean_up(b: &Bench) {
    if std::env::var("BENCH_KEEP").is_err() {
        let prefix = &b.prefix;
        let scratch = &b.setup.scratch;
        let n = b.k.delete_topics_with_prefix(prefix);
        let _ = std::fs::remove_dir_all(scratch);
        eprintln!("deleted {n} topics {prefix}* and {}", scratch.display());
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("pipe") {
        pipe::run(&args[2..]);
        return;
    }
    if args.get(1).map(String::as_str) == Some("cleanup") {
        cleanup_command(&args);
        return;
    }
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP")
        .expect("KAFKA_BOOTSTRAP (run `make up`, source ~/.cache/oxbow/stack/env)");
    let cfg = Cfg::from_env();
    let repo = repo_dir();
    let (setup, prefix) = setup(&bootstrap, &cfg, &repo);
    let base_ts = (now_ms() - 86_400_000) / workload::WINDOW_MS * workload::WINDOW_MS;
    let load_before = loadavg();
    let started = Instant::now();
    let mut b = Bench {
        k: Kafka::new(&bootstrap),
        setup,
        prefix,
        report: Report::default(),
        base_ts,
        cfg,
    };
    eprintln!(
        "bench run {}: {} records, {} keys, {} partitions, {} runs, engines {:?}, workloads {:?}, scratch {}",
        b.prefix,
        b.cfg.records,
        b.cfg.keys,
        b.cfg.partitions,
        b.cfg.runs,
        b.cfg.engines,
        b.cfg.workloads,
        b.setup.scratch.display()
    );
    run_workloads(&mut b);
    let load_after = loadavg();
    let summary = summary(&b, &repo, &load_before, &load_after, started);
    write_results(&b, &summary);
    clean_up(&b);
    if b.report.failures > 0 {
        std::process::exit(1);
    }
}
