//! Oxbow side by side with Kafka Streams on the same broker, the same topics and the same
//! guarantees (`make bench`, issue 7). For each workload it generates the input once
//! (seeded), runs every engine over it, checks each output against what the generator
//! computed before the run's figures count, and prints medians with the ratio Oxbow /
//! Kafka Streams (and Oxbow / raw pipe):
//!
//! - W1: windowed aggregate (10-minute tumbling windows, count + sum per user),
//!   at-least-once and exactly-once; records/s, peak RSS, CPU seconds per million records.
//! - W2: examples/dedupe.yaml (dedupe, map, sink, dead letters), exactly-once.
//! - W3: restore of a changelog of BENCH_RESTORE_KEYS keys from an empty state directory,
//!   and from a copy of the state BENCH_RESTORE_TAIL records behind; the restored store is
//!   read back (a seeded sample and the tail's keys) before the figures count. With the
//!   pipe engine selected, a plain consumer reading Oxbow's changelog to its end gives the
//!   restore limit (the pipe column of the full-restore rows).
//! - W4: W1 exactly-once (`w4`) and at-least-once (`w4alos`), SIGKILL half-way, restart on
//!   the same state: time until every partition commits again, and the changelog records
//!   replayed.
//! - W5: payments keyed by payment id, deduped by txId, aggregated per user in windows
//!   (two repartitions) and joined with a global users table, exactly-once (w5.rs).
//! - latency: W1 at a fixed input rate: p50/p99 from the input's timestamp to the output
//!   seen by a read_committed consumer.
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

mod engine;
mod kafka;
mod pipe;
mod report;
mod w5;
mod workload;

use std::path::PathBuf;
use std::sync::atomic::AtomicU16;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use engine::{Guarantee, Kind, Setup, Spec, cpu_seconds, peak_rss_mib, spawn};
use kafka::{Kafka, committed, wait_committed};
use report::{Better, Report};

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

    fn w1(&mut self, input: &str, expected: &workload::W1Expected, ends: &[i64]) {
        let records = self.cfg.records as f64;
        for run in 1..=self.cfg.runs {
            for g in [Guarantee::Alos, Guarantee::Eos] {
                for &kind in &self.cfg.engines {
                    let app = format!(
                        "{}w1-{}-{}-{run}",
                        self.prefix,
                        g.label().to_lowercase(),
                        kind.name()
                    );
                    let s = self.spec(kind, "w1", g, app, input);
                    self.k.create_topic(&s.output, self.cfg.partitions);
                    eprintln!("W1 {} run {run}: {}…", g.label(), kind.name());
                    let label = format!("W1 {} run {run} {}", g.label(), kind.name());
                    let (secs, rss, cpu) = match self.throughput(&s, ends) {
                        Ok(m) => m,
                        Err(e) => {
                            self.report.check(format!("{label}: {e}"), false);
                            continue;
                        }
                    };
                    let ok = if kind == Kind::Pipe {
                        let n = kafka::read_all(
                            &self.k.bootstrap,
                            &s.output,
                            self.cfg.partitions,
                            |_| {},
                        );
                        let ok =
                            n == self.cfg.records || (g == Guarantee::Alos && n > self.cfg.records);
                        self.report.check(
                            format!("{label}: {n} records piped of {}", self.cfg.records),
                            ok,
                        );
                        ok
                    } else {
                        match workload::check_w1(&self.k, &s.output, self.cfg.partitions, expected)
                        {
                            Ok(n) => {
                                // onUpdate: one output per input record; Kafka Streams' cache
                                // (when on) folds updates of a key together.
                                let exact = (kind == Kind::KStreams && self.cfg.ks_cache_bytes > 0)
                                    || n == self.cfg.records;
                                self.report.check(
                                    format!("{label}: {} (key, window) aggregates as generated; {n} outputs for {} inputs", expected.len(), self.cfg.records),
                                    exact,
                                );
                                exact
                            }
                            Err(e) => {
                                self.report.check(format!("{label}: {e}"), false);
                                false
                            }
                        }
                    };
                    if ok {
                        let w = format!("W1 {}", g.label());
                        self.report.add_run(&w, kind, records, (secs, rss, cpu));
                    }
                }
            }
        }
    }

    fn w2(&mut self) {
        let input = format!("{}w2-in", self.prefix);
        self.k.create_topic(&input, self.cfg.partitions);
        eprintln!(
            "W2: generating {} payments into {input}…",
            self.cfg.w2_records
        );
        let exp = workload::w2(
            &self.k,
            &input,
            self.cfg.w2_records,
            self.cfg.seed,
            self.base_ts,
        );
        let ends = self
            .k
            .end_offsets(&input, self.cfg.partitions)
            .expect("ends");
        let records = self.cfg.w2_records as f64;
        for run in 1..=self.cfg.runs {
            for &kind in &self.cfg.engines {
                if kind == Kind::Pipe {
                    continue;
                }
                let app = format!("{}w2-{}-{run}", self.prefix, kind.name());
                let s = self.spec(kind, "w2", Guarantee::Eos, app, &input);
                self.k.create_topic(&s.output, self.cfg.partitions);
                self.k.create_topic(&s.dlq, self.cfg.partitions);
                eprintln!("W2 EOS run {run}: {}…", kind.name());
                let label = format!("W2 EOS run {run} {}", kind.name());
                let (secs, rss, cpu) = match self.throughput(&s, &ends) {
                    Ok(m) => m,
                    Err(e) => {
                        self.report.check(format!("{label}: {e}"), false);
                        continue;
                    }
                };
                match workload::check_w2(&self.k, &s.output, &s.dlq, self.cfg.partitions, &exp) {
                    Ok(n) => {
                        self.report.check(
                            format!("{label}: {n} payments accepted once each of {} records (duplicates dropped), {} dead letters", exp.records, exp.dead_letters),
                            true,
                        );
                        self.report
                            .add_run("W2 EOS", kind, records, (secs, rss, cpu));
                    }
                    Err(e) => self.report.check(format!("{label}: {e}"), false),
                }
            }
        }
    }

    fn restore_once(
        &mut self,
        s: &Spec,
        what: &str,
        metric_prefix: &str,
        min_records: f64,
        exp: &workload::W3Expected,
    ) {
        let label = format!("W3 {what} {}", s.kind.name());
        let spawned = now_ms();
        let mut p = spawn(&self.setup, s);
        let r = p
            .wait_running(LONG)
            .and_then(|_| p.restore(self.cfg.partitions as usize, LONG));
        // From the process start to restored: start-up, (JVM, group join,) restore.
        let overall = r
            .as_ref()
            .map(|r| (r.finished_ms.max(spawned) - spawned) as f64 / 1000.0)
            .unwrap_or(0.0);
        let rss = peak_rss_mib(p.pid());
        // Read back after every figure is taken: the reads do not count in the times or
        // the peak RSS.
        let content = r.as_ref().ok().map(|_| {
            let sample = exp.sample(1000, self.cfg.seed);
            workload::check_w3_content(exp, &sample, &mut |path| p.query(path))
        });
        if r.is_err() || matches!(content, Some(Err(_))) {
            eprintln!("{}", p.log_tail());
        }
        p.stop();
        match r {
            Ok(r) => {
                let content_ok = matches!(content, Some(Ok(_)));
                let ok = r.records >= min_records && r.seconds > 0.0 && content_ok;
                let content = match content {
                    Some(Ok(n)) => format!(
                        "{n} keys read back (1000 drawn by seed, the first and last, every key of the tail) with count and sum as generated"
                    ),
                    Some(Err(e)) => format!("restored content wrong: {e}"),
                    None => String::new(),
                };
                self.report.check(
                    format!("{label}: {:.0} changelog records in {:.2} s ({}), at least {min_records:.0} expected; restored {overall:.2} s after the process started; {content}", r.records, r.seconds, r.mode),
                    ok,
                );
                if ok {
                    self.report.add(
                        "W3 restore",
                        &format!("{metric_prefix} records/s"),
                        Better::Higher,
                        s.kind,
                        r.records / r.seconds,
                    );
                    self.report.add(
                        "W3 restore",
                        &format!("{metric_prefix} seconds"),
                        Better::Lower,
                        s.kind,
                        r.seconds,
                    );
                    self.report.add(
                        "W3 restore",
                        &format!("{metric_prefix}: seconds from process start"),
                        Better::Lower,
                        s.kind,
                        overall,
                    );
                    self.report.add(
                        "W3 restore",
                        &format!("{metric_prefix} records"),
                        Better::Lower,
                        s.kind,
                        r.records,
                    );
                    self.report.add(
                        "W3 restore",
                        &format!("{metric_prefix} peak RSS MiB"),
                        Better::Lower,
                        s.kind,
                        rss,
                    );
                    self.report.note(
                        "W3 restore",
                        &format!("{metric_prefix} seconds"),
                        s.kind,
                        r.mode,
                    );
                }
            }
            Err(e) => self.report.check(format!("{label}: {e}"), false),
        }
    }

    fn w3(&mut self) {
        let (keys, tail) = (
            self.cfg.restore_keys,
            self.cfg.restore_tail.min(self.cfg.restore_keys),
        );
        let input = format!("{}w3-in", self.prefix);
        let tail_topic = format!("{}w3-tail", self.prefix);
        self.k.create_topic(&input, self.cfg.partitions);
        self.k.create_topic(&tail_topic, self.cfg.partitions);
        eprintln!("W3: generating {keys} keys into {input}…");
        let base = workload::w3(&self.k, &input, 0..keys, self.cfg.seed, self.base_ts);
        let ends = self
            .k
            .end_offsets(&input, self.cfg.partitions)
            .expect("ends");
        let both = format!("{input},{tail_topic}");
        let engines: Vec<Kind> = self
            .cfg
            .engines
            .iter()
            .copied()
            .filter(|k| *k != Kind::Pipe)
            .collect();
        let mut specs = Vec::new();
        // Build each engine's store and changelog (exactly-once), stop cleanly, keep a copy.
        for &kind in &engines {
            let app = format!("{}w3-{}", self.prefix, kind.name());
            let mut s = self.spec(kind, "w3", Guarantee::Eos, app, &both);
            s.query = true;
            // Kafka Streams does not leave its group on close: without static membership
            // every restart would first wait out the previous member's session (45 s).
            if kind == Kind::KStreams {
                s.extra
                    .push(format!("prop.group.instance.id={}-instance", s.app));
            }
            self.k.create_topic(&s.output, self.cfg.partitions);
            eprintln!("W3: {} builds its store of {keys} keys…", kind.name());
            if let Err(e) = self.throughput(&s, &ends) {
                self.report
                    .check(format!("W3 build {}: {e}", kind.name()), false);
                continue;
            }
            engine::copy_dir(&s.state, &s.state.with_extension("behind"));
            specs.push(s);
        }
        // The tail: `tail` more updates, applied by each engine to its live state only.
        // Its amounts come from another seed, so a key's total tells which payments the
        // restored state holds.
        let tail_amounts = workload::w3(
            &self.k,
            &tail_topic,
            0..tail,
            self.cfg.seed ^ 0x7a11,
            self.base_ts + keys as i64,
        );
        let exp = workload::W3Expected {
            base,
            tail: tail_amounts,
        };
        let tail_ends = self
            .k
            .end_offsets(&tail_topic, self.cfg.partitions)
            .expect("ends");
        for s in &specs {
            eprintln!("W3: {} applies the tail of {tail} records…", s.kind.name());
            let mut p = spawn(&self.setup, s);
            let r = p.wait_running(LONG).and_then(|_| {
                let reader = self.k.offsets_reader(&s.app);
                wait_committed(&reader, &tail_topic, &tail_ends, LONG, &mut || p.alive())
            });
            p.stop();
            if let Err(e) = r {
                self.report
                    .check(format!("W3 tail {}: {e}", s.kind.name()), false);
            }
        }
        for run in 1..=self.cfg.runs {
            for s in &specs {
                eprintln!(
                    "W3 run {run}: {} restores from an empty state directory…",
                    s.kind.name()
                );
                let _ = std::fs::remove_dir_all(&s.state);
                self.restore_once(s, &format!("full run {run}"), "full", keys as f64, &exp);
                eprintln!(
                    "W3 run {run}: {} restores from a copy {tail} records behind…",
                    s.kind.name()
                );
                let _ = std::fs::remove_dir_all(&s.state);
                engine::copy_dir(&s.state.with_extension("behind"), &s.state);
                self.restore_once(s, &format!("tail run {run}"), "tail", tail as f64, &exp);
            }
            if self.cfg.engines.contains(&Kind::Pipe)
                && let Some(s) = specs.iter().find(|s| s.kind == Kind::Oxbow)
            {
                self.raw_changelog_read(s, run, keys as f64);
            }
        }
    }

    /// The restore limit (the pipe column of the W3 rows): a plain consumer reading
    /// Oxbow's changelog as fast as it can, so a restore is seen as a fraction of what
    /// the broker delivers.
    fn raw_changelog_read(&mut self, s: &Spec, run: u64, min_records: f64) {
        let label = format!("W3 full run {run} raw changelog read");
        let suffix = "-per-key-changelog";
        let Some(topic) = self
            .k
            .topic_names()
            .into_iter()
            .find(|t| t.ends_with(suffix) && t.contains(&s.app))
        else {
            self.report
                .check(format!("{label}: no topic *{}*{suffix}", s.app), false);
            return;
        };
        eprintln!("W3 run {run}: a plain consumer reads {topic}…");
        match kafka::read_raw(&self.k.bootstrap, &topic, self.cfg.partitions) {
            Ok((records, seconds)) => {
                let ok = records as f64 >= min_records && seconds > 0.0;
                self.report.check(
                    format!("{label}: {records} records of {topic} in {seconds:.2} s, at least {min_records:.0} expected"),
                    ok,
                );
                if ok {
                    let records = records as f64;
                    for (metric, better, v) in [
                        ("full records/s", Better::Higher, records / seconds),
                        ("full seconds", Better::Lower, seconds),
                        ("full records", Better::Lower, records),
                    ] {
                        self.report.add("W3 restore", metric, better, Kind::Pipe, v);
                    }
                }
            }
            Err(e) => self.report.check(format!("{label}: {e}"), false),
        }
    }

    /// W4 at `g`: exactly-once (`w4`) or at-least-once (`w4alos`).
    fn w4(&mut self, input: &str, expected: &workload::W1Expected, ends: &[i64], g: Guarantee) {
        // Kafka Streams twice: with its defaults (dynamic membership: the restarted
        // instance waits for the killed member's session to time out) and with static
        // membership (group.instance.id: it takes its partitions back at once).
        let mut variants = Vec::new();
        for &kind in &self.cfg.engines {
            match kind {
                Kind::Oxbow => variants.push((kind, false)),
                Kind::KStreams => variants.extend([(kind, false), (kind, true)]),
                Kind::Pipe => {}
            }
        }
        let mut oxbow_resume = None;
        let w = &format!("W4 crash ({})", g.label());
        for (kind, static_membership) in variants {
            let Some((resume, first, running, r, over)) =
                self.crash_once(input, expected, ends, kind, static_membership, g)
            else {
                continue;
            };
            if static_membership {
                if let Some((o, of)) = oxbow_resume {
                    self.report.add(
                        w,
                        "first commit seconds, Kafka Streams with static membership",
                        Better::Lower,
                        Kind::Oxbow,
                        of,
                    );
                    self.report.add(
                        w,
                        "resume seconds, Kafka Streams with static membership",
                        Better::Lower,
                        Kind::Oxbow,
                        o,
                    );
                }
                self.report.add(
                    w,
                    "first commit seconds, Kafka Streams with static membership",
                    Better::Lower,
                    kind,
                    first,
                );
                self.report.add(
                    w,
                    "resume seconds, Kafka Streams with static membership",
                    Better::Lower,
                    kind,
                    resume,
                );
                continue;
            }
            if kind == Kind::Oxbow {
                oxbow_resume = Some((resume, first));
            }
            self.report.add(
                w,
                "first commit seconds (processing resumed)",
                Better::Lower,
                kind,
                first,
            );
            self.report
                .add(w, "resume seconds", Better::Lower, kind, resume);
            self.report.add(
                w,
                "seconds to running (restored)",
                Better::Lower,
                kind,
                running,
            );
            self.report.add(
                w,
                "changelog records replayed",
                Better::Lower,
                kind,
                r.records,
            );
            self.report
                .note(w, "changelog records replayed", kind, r.mode);
            if g == Guarantee::Alos {
                self.report.add(
                    w,
                    "(key, window)s over-counted",
                    Better::Lower,
                    kind,
                    over as f64,
                );
            }
        }
    }

    /// W1 at `g`, SIGKILL half-way, restart on the same state: (seconds until every
    /// partition commits again, until any partition does, until the engine reports
    /// running, the restore,
    /// the (key, window)s whose final aggregate counts records twice).
    fn crash_once(
        &mut self,
        input: &str,
        expected: &workload::W1Expected,
        ends: &[i64],
        kind: Kind,
        static_membership: bool,
        g: Guarantee,
    ) -> Option<(f64, f64, f64, engine::Restore, usize)> {
        let total: i64 = ends.iter().sum();
        let variant = if static_membership { "-static" } else { "" };
        let w = if g == Guarantee::Eos { "w4" } else { "w4alos" };
        let app = format!("{}{w}-{}{variant}", self.prefix, kind.name());
        let mut s = self.spec(kind, "w1", g, app, input);
        if static_membership {
            s.extra
                .push(format!("prop.group.instance.id={}-instance", s.app));
        }
        self.k.create_topic(&s.output, self.cfg.partitions);
        let label = format!("W4 {} {}{variant}", g.label(), kind.name());
        eprintln!("{label}: W1 {}, SIGKILL half-way…", g.label());
        let reader = self.k.offsets_reader(&s.app);
        let mut p = spawn(&self.setup, &s);
        let half = (|| {
            p.wait_running(Duration::from_secs(600))?;
            let deadline = Instant::now() + LONG;
            loop {
                p.alive()?;
                if committed(&reader, input, self.cfg.partitions)
                    .iter()
                    .sum::<i64>()
                    * 2
                    >= total
                {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    return Err("never reached half-way".to_string());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })();
        p.kill();
        if let Err(e) = half {
            self.report.check(format!("{label}: {e}"), false);
            return None;
        }
        let at_kill = committed(&reader, input, self.cfg.partitions);
        let restarted = Instant::now();
        let mut p = spawn(&self.setup, &s);
        let resumed = (|| -> Result<(f64, f64, f64, engine::Restore), String> {
            let deadline = Instant::now() + LONG;
            let mut running = None;
            let mut first = None;
            loop {
                p.alive()?;
                if running.is_none() && p.is_running() {
                    running = Some(restarted.elapsed().as_secs_f64());
                }
                let now = committed(&reader, input, self.cfg.partitions);
                // Processing has resumed once any partition commits past the kill.
                if first.is_none() && now.iter().zip(&at_kill).any(|(n, k)| n > k) {
                    first = Some(restarted.elapsed().as_secs_f64());
                }
                if now
                    .iter()
                    .zip(&at_kill)
                    .zip(ends)
                    .all(|((n, k), e)| n > k || k >= e)
                {
                    break;
                }
                if Instant::now() > deadline {
                    return Err("processing did not resume".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let secs = restarted.elapsed().as_secs_f64();
            let running = running.unwrap_or(secs);
            let r = p.restore(0, LONG)?;
            wait_committed(&reader, input, ends, LONG, &mut || p.alive())?;
            Ok((secs, first.unwrap_or(secs), running, r))
        })();
        if resumed.is_err() {
            eprintln!("{}", p.log_tail());
        }
        p.stop();
        let (secs, first, running, r) = match resumed {
            Ok(x) => x,
            Err(e) => {
                self.report.check(format!("{label}: {e}"), false);
                return None;
            }
        };
        let o = workload::compare_w1(&self.k, &s.output, self.cfg.partitions, expected);
        // What each engine promises after a crash. Exactly-once: the read_committed output
        // is one update per input with exact aggregates. At-least-once: outputs since the
        // last commit repeat. Oxbow's state stays exact (a restore skips changelog records
        // of work whose offsets were never committed), so its final aggregates must be
        // exact. Kafka Streams keeps changelog records (and local RocksDB writes) of that
        // work and processes it again: a window may count records twice, never fewer.
        let allow_over = g == Guarantee::Alos && kind == Kind::KStreams;
        let cache_folds = kind == Kind::KStreams && self.cfg.ks_cache_bytes > 0;
        let outputs_ok = cache_folds
            || match g {
                Guarantee::Eos => o.outputs == self.cfg.records,
                Guarantee::Alos => o.outputs >= self.cfg.records,
            };
        let mut problems = o.problems(allow_over);
        // Kafka Streams' window store changelog is also deleted by record timestamp
        // (retention.ms = window retention + windowstore.changelog.additional.retention.ms).
        // The event times here are a day old: should the broker delete its head, a restore
        // rebuilds the open windows without those records and they under-count. That is a
        // fault of the setup, not of the engine, so it is named as such.
        if kind == Kind::KStreams {
            let changelog = format!("{}-per-user-changelog", s.app);
            let deleted = match self.k.start_offsets(&changelog, self.cfg.partitions) {
                Some(lows) if lows.iter().all(|&l| l == 0) => None,
                Some(lows) => Some(format!(
                    "the broker deleted the head of {changelog} by time retention (log start offsets {lows:?}): a restore cannot rebuild the windows it held; the changelog's retention is too short for the input's event times (windowstore.changelog.additional.retention.ms)"
                )),
                None => Some(format!(
                    "could not read the log start offsets of {changelog}"
                )),
            };
            if let Some(d) = deleted {
                problems = Some(match problems {
                    Some(p) => format!("{p}; {d}"),
                    None => d,
                });
            }
        }
        let ok = problems.is_none() && outputs_ok;
        let promise = match (g, allow_over) {
            (Guarantee::Eos, _) => {
                "exactly one output per input, every (key, window)'s final aggregate as generated"
            }
            (Guarantee::Alos, false) => {
                "at least one output per input, every (key, window)'s final aggregate as generated (exact state)"
            }
            (Guarantee::Alos, true) => {
                "at least one output per input, every (key, window) present with count and sum at least as generated (re-processed work may count twice)"
            }
        };
        let skipped = if kind == Kind::Oxbow {
            format!(" ({:.0} of them skipped as uncommitted work)", r.skipped)
        } else {
            String::new()
        };
        self.report.check(
            format!(
                "{label}: running {running:.2} s, committing again {first:.2} s and on every partition {secs:.2} s after the restart, {:.0} changelog records replayed{skipped} ({}); expected {promise}: {} outputs for {} inputs, {} (key, window)s, {} over-counted ({} records counted twice){}",
                r.records,
                r.mode,
                o.outputs,
                self.cfg.records,
                expected.len(),
                o.over,
                o.over_records,
                problems.map(|p| format!("; {p}")).unwrap_or_default(),
            ),
            ok,
        );
        ok.then_some((secs, first, running, r, o.over))
    }

    /// W1 at a fixed rate: latency from the input's timestamp (the producer's clock) to the
    /// output seen by a read_committed consumer, after a warm-up of a fifth of the run.
    fn latency(&mut self) {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::Message;
        let (rate, secs) = (self.cfg.rate.max(1), self.cfg.latency_secs.max(5));
        for g in [Guarantee::Alos, Guarantee::Eos] {
            for &kind in &self.cfg.engines {
                let app = format!(
                    "{}lat-{}-{}",
                    self.prefix,
                    g.label().to_lowercase(),
                    kind.name()
                );
                let input = format!("{app}-in");
                self.k.create_topic(&input, self.cfg.partitions);
                let s = self.spec(kind, "w1", g, app, &input);
                self.k.create_topic(&s.output, self.cfg.partitions);
                let label = format!("latency W1 {} {}", g.label(), kind.name());
                eprintln!("{label}: {rate} records/s for {secs} s…");
                let mut p = spawn(&self.setup, &s);
                if let Err(e) = p.wait_running(Duration::from_secs(600)) {
                    self.report.check(format!("{label}: {e}"), false);
                    p.stop();
                    continue;
                }
                let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let (bootstrap, output, parts, stop2) = (
                    self.k.bootstrap.clone(),
                    s.output.clone(),
                    self.cfg.partitions,
                    stop.clone(),
                );
                let warm_until = now_ms() + (secs as i64 * 1000) / 5;
                let reader = std::thread::spawn(move || {
                    let c: BaseConsumer = rdkafka::ClientConfig::new()
                        .set("bootstrap.servers", &bootstrap)
                        .set("group.id", format!("{output}-latency"))
                        .set("isolation.level", "read_committed")
                        .set("fetch.wait.max.ms", "10")
                        .create()
                        .expect("latency consumer");
                    let mut tpl = rdkafka::TopicPartitionList::new();
                    for q in 0..parts {
                        tpl.add_partition_offset(&output, q, rdkafka::Offset::Beginning)
                            .expect("tpl");
                    }
                    c.assign(&tpl).expect("assign");
                    let (mut lat, mut n) = (Vec::new(), 0u64);
                    while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                        if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
                            n += 1;
                            let ts = m.timestamp().to_millis().unwrap_or(0);
                            if ts >= warm_until {
                                lat.push((now_ms() - ts) as f64);
                            }
                        }
                    }
                    (lat, n)
                });
                let prod = kafka::generator_producer(&self.k.bootstrap);
                let mut rng = workload::Rng::new(self.cfg.seed ^ 0x1a7);
                let start = Instant::now();
                let total = rate * secs;
                for i in 0..total {
                    let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    let x = rng.next();
                    let name = workload::user(x % self.cfg.keys);
                    let ts = now_ms();
                    kafka::send(
                        &prod,
                        &input,
                        name.as_bytes(),
                        workload::payment(&name, (x >> 20) % 10_000, 1, ts).as_bytes(),
                        ts,
                    );
                    if i % 64 == 0 {
                        rdkafka::producer::Producer::flush(&prod, Duration::ZERO).ok();
                    }
                }
                let _ = rdkafka::producer::Producer::flush(&prod, Duration::from_secs(30));
                // Let the outputs drain, then stop the reader.
                let ends = self
                    .k
                    .end_offsets(&input, self.cfg.partitions)
                    .expect("ends");
                let offsets = self.k.offsets_reader(&s.app);
                let drained = wait_committed(
                    &offsets,
                    &input,
                    &ends,
                    Duration::from_secs(120),
                    &mut || p.alive(),
                );
                std::thread::sleep(Duration::from_millis(500));
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                let (mut lat, n) = reader.join().expect("reader");
                p.stop();
                lat.sort_by(|a, b| a.total_cmp(b));
                let pct = |q: f64| {
                    lat.get(((lat.len() as f64 - 1.0) * q).round() as usize)
                        .copied()
                        .unwrap_or(f64::NAN)
                };
                let ok = drained.is_ok() && n >= total && !lat.is_empty();
                self.report.check(
                    format!(
                        "{label}: {n} outputs for {total} inputs at {rate}/s; p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {} samples{}",
                        pct(0.5), pct(0.99), pct(1.0), lat.len(),
                        drained.err().map(|e| format!("; {e}")).unwrap_or_default()
                    ),
                    ok,
                );
                if ok {
                    let w = format!("latency W1 {} @{rate}/s", g.label());
                    self.report.add(&w, "p50 ms", Better::Lower, kind, pct(0.5));
                    self.report
                        .add(&w, "p99 ms", Better::Lower, kind, pct(0.99));
                }
            }
        }
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("pipe") {
        pipe::run(&args[2..]);
        return;
    }
    if args.get(1).map(String::as_str) == Some("cleanup") {
        // After an interrupted run: `compare cleanup bench-<unix time>-`.
        let prefix = args.get(2).expect("cleanup bench-<unix time>-");
        assert!(
            prefix.starts_with("bench-"),
            "only bench- topics are deleted"
        );
        let bootstrap = std::env::var("KAFKA_BOOTSTRAP").expect("KAFKA_BOOTSTRAP");
        let n = Kafka::new(&bootstrap).delete_topics_with_prefix(prefix);
        eprintln!("deleted {n} topics {prefix}*");
        return;
    }
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP")
        .expect("KAFKA_BOOTSTRAP (run `make up`, source ~/.cache/oxbow/stack/env)");
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
    let cfg = Cfg {
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
    };
    let exe = std::env::current_exe().expect("exe");
    let worker = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .join("oxbow-worker");
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let ks_dir = std::env::var("BENCH_KSTREAMS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo.join("bench/kstreams"));
    let ks_classpath = if cfg.engines.contains(&Kind::KStreams) {
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
    };
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
        bootstrap: bootstrap.clone(),
        worker: worker.clone(),
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
        scratch: scratch.clone(),
        dedupe_example: repo.join("examples/dedupe.yaml"),
        port: AtomicU16::new(18600 + (run_id % 200) as u16 * 10),
    };
    let base_ts = (now_ms() - 86_400_000) / workload::WINDOW_MS * workload::WINDOW_MS;
    let load_before = loadavg();
    let started = Instant::now();
    let mut b = Bench {
        k: Kafka::new(&bootstrap),
        setup,
        prefix: prefix.clone(),
        report: Report::default(),
        base_ts,
        cfg,
    };
    eprintln!(
        "bench run {prefix}: {} records, {} keys, {} partitions, {} runs, engines {:?}, workloads {:?}, scratch {}",
        b.cfg.records,
        b.cfg.keys,
        b.cfg.partitions,
        b.cfg.runs,
        b.cfg.engines,
        b.cfg.workloads,
        scratch.display()
    );
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
    // A workload that fails (a broker restarted by someone else, an engine that does not
    // start) is reported as a failed check; the others still run and the report is written.
    if do_w1 || do_w4 || do_w4alos {
        guarded(&mut b, "W1/W4", |b| {
            let input = format!("{}w1-in", b.prefix);
            b.k.create_topic(&input, b.cfg.partitions);
            eprintln!(
                "W1: generating {} records over {} keys into {input}…",
                b.cfg.records, b.cfg.keys
            );
            let expected = workload::w1(
                &b.k,
                &input,
                b.cfg.records,
                b.cfg.keys,
                b.cfg.seed,
                b.base_ts,
            );
            let ends = b.k.end_offsets(&input, b.cfg.partitions).expect("ends");
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
        guarded(&mut b, "W2", Bench::w2);
    }
    if do_w3 {
        guarded(&mut b, "W3", Bench::w3);
    }
    if do_w5 {
        guarded(&mut b, "W5", Bench::w5);
    }
    if do_lat {
        guarded(&mut b, "latency", Bench::latency);
    }
    let load_after = loadavg();

    let ks_version = env_str("BENCH_KAFKA_VERSION", "4.1.2");
    let summary = format!(
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
    );
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
        let new = match (
            old.find("<!-- results:begin"),
            old.find("<!-- results:end -->"),
        ) {
            (Some(a), Some(z)) if a < z => format!(
                "{}{block}{}",
                &old[..a],
                &old[z + "<!-- results:end -->".len()..]
            ),
            _ => format!("{old}\n{block}\n"),
        };
        std::fs::write(&path, new).expect("write report");
        eprintln!("wrote {path}");
    }
    if std::env::var("BENCH_KEEP").is_err() {
        let n = b.k.delete_topics_with_prefix(&prefix);
        let _ = std::fs::remove_dir_all(&scratch);
        eprintln!("deleted {n} topics {prefix}* and {}", scratch.display());
    }
    if b.report.failures > 0 {
        std::process::exit(1);
    }
}
