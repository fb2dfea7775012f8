//! W3: the restore of a changelog of BENCH_RESTORE_KEYS keys, from an empty state
//! directory and from a copy of the state BENCH_RESTORE_TAIL records behind. Each engine
//! builds its store once (exactly-once), a copy is kept, the tail is applied to the live
//! state only; every run then restores both ways and reads the restored store back (a
//! seeded sample and the tail's keys) before the figures count. With the pipe engine
//! selected, a plain consumer reading Oxbow's changelog to its end gives the restore
//! limit (the pipe column of the full-restore rows).

use crate::engine::{self, Guarantee, Kind, Spec, peak_rss_mib, spawn};
use crate::kafka::{self, wait_committed};
use crate::report::Better;
use crate::{Bench, LONG, now_ms, workload};

impl Bench {
    pub(crate) fn w3(&mut self) {
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
        let ends = self.input_ends(&input);
        let both = format!("{input},{tail_topic}");
        let specs = self.w3_build_stores(&both, &ends, keys);
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
        self.w3_apply_tail(&specs, &tail_topic, tail);
        for run in 1..=self.cfg.runs {
            self.w3_run(run, &specs, keys, tail, &exp);
        }
    }

    /// Builds each engine's store and changelog (exactly-once) from `both` (the input
    /// and the tail's topic) up to `ends` of the input, stops cleanly, keeps a copy of
    /// the state: the specs of the engines that built theirs.
    fn w3_build_stores(&mut self, both: &str, ends: &[i64], keys: u64) -> Vec<Spec> {
        let engines: Vec<Kind> = self
            .cfg
            .engines
            .iter()
            .copied()
            .filter(|k| *k != Kind::Pipe)
            .collect();
        let mut specs = Vec::new();
        for &kind in &engines {
            let app = format!("{}w3-{}", self.prefix, kind.name());
            let mut s = self.spec(kind, "w3", Guarantee::Eos, app, both);
            s.query = true;
            // Kafka Streams does not leave its group on close: without static membership
            // every restart would first wait out the previous member's session (45 s).
            if kind == Kind::KStreams {
                s.extra
                    .push(format!("prop.group.instance.id={}-instance", s.app));
            }
            self.k.create_topic(&s.output, self.cfg.partitions);
            eprintln!("W3: {} builds its store of {keys} keys…", kind.name());
            if let Err(e) = self.throughput(&s, ends) {
                self.report
                    .check(format!("W3 build {}: {e}", kind.name()), false);
                continue;
            }
            engine::copy_dir(&s.state, &s.state.with_extension("behind"));
            specs.push(s);
        }
        specs
    }

    /// Each engine applies the tail (`tail` records of `tail_topic`) to its live state.
    fn w3_apply_tail(&mut self, specs: &[Spec], tail_topic: &str, tail: u64) {
        let tail_ends = self
            .k
            .end_offsets(tail_topic, self.cfg.partitions)
            .expect("ends");
        for s in specs {
            eprintln!("W3: {} applies the tail of {tail} records…", s.kind.name());
            let mut p = spawn(&self.setup, s);
            let r = p.wait_running(LONG).and_then(|_| {
                let reader = self.k.offsets_reader(&s.app);
                wait_committed(&reader, tail_topic, &tail_ends, LONG, &mut || p.alive())
            });
            p.stop();
            if let Err(e) = r {
                self.report
                    .check(format!("W3 tail {}: {e}", s.kind.name()), false);
            }
        }
    }

    /// Run `run`: each engine restores from an empty state directory, then from the copy
    /// `tail` records behind; then the raw changelog read, with the pipe engine selected.
    fn w3_run(
        &mut self,
        run: u64,
        specs: &[Spec],
        keys: u64,
        tail: u64,
        exp: &workload::W3Expected,
    ) {
        for s in specs {
            eprintln!(
                "W3 run {run}: {} restores from an empty state directory…",
                s.kind.name()
            );
            let _ = std::fs::remove_dir_all(&s.state);
            self.restore_once(s, &format!("full run {run}"), "full", keys as f64, exp);
            eprintln!(
                "W3 run {run}: {} restores from a copy {tail} records behind…",
                s.kind.name()
            );
            let _ = std::fs::remove_dir_all(&s.state);
            engine::copy_dir(&s.state.with_extension("behind"), &s.state);
            self.restore_once(s, &format!("tail run {run}"), "tail", tail as f64, exp);
        }
        if self.cfg.engines.contains(&Kind::Pipe)
            && let Some(s) = specs.iter().find(|s| s.kind == Kind::Oxbow)
        {
            self.raw_changelog_read(s, run, keys as f64);
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
                    self.add_restore_figures(s.kind, metric_prefix, r, overall, rss);
                }
            }
            Err(e) => self.report.check(format!("{label}: {e}"), false),
        }
    }

    /// The figures of a checked restore `r` of `kind` (`overall`: seconds from the
    /// process start; `rss`: peak RSS MiB) in the rows of `metric_prefix`.
    fn add_restore_figures(
        &mut self,
        kind: Kind,
        metric_prefix: &str,
        r: engine::Restore,
        overall: f64,
        rss: f64,
    ) {
        self.report.add(
            "W3 restore",
            &format!("{metric_prefix} records/s"),
            Better::Higher,
            kind,
            r.records / r.seconds,
        );
        self.report.add(
            "W3 restore",
            &format!("{metric_prefix} seconds"),
            Better::Lower,
            kind,
            r.seconds,
        );
        self.report.add(
            "W3 restore",
            &format!("{metric_prefix}: seconds from process start"),
            Better::Lower,
            kind,
            overall,
        );
        self.report.add(
            "W3 restore",
            &format!("{metric_prefix} records"),
            Better::Lower,
            kind,
            r.records,
        );
        self.report.add(
            "W3 restore",
            &format!("{metric_prefix} peak RSS MiB"),
            Better::Lower,
            kind,
            rss,
        );
        self.report.note(
            "W3 restore",
            &format!("{metric_prefix} seconds"),
            kind,
            r.mode,
        );
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
}
