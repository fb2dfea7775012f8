//! W4: W1 at exactly-once (`w4`) or at-least-once (`w4alos`), SIGKILL half-way and a
//! restart on the same state: the time until every partition commits again (and until
//! any does, and until the engine reports running), the changelog records replayed, and
//! each engine's output checked against what it promises after a crash. Kafka Streams
//! runs twice: with its defaults and with static membership.

use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;

use crate::engine::{self, Guarantee, Kind, spawn};
use crate::kafka::{committed, wait_committed};
use crate::report::Better;
use crate::{Bench, LONG, workload};

/// What each engine promises of its output after a crash (`allow_over`: Kafka Streams
/// at-least-once, whose re-processed work may count twice).
fn crash_promise(g: Guarantee, allow_over: bool) -> &'static str {
    match (g, allow_over) {
        (Guarantee::Eos, _) => {
            "exactly one output per input, every (key, window)'s final aggregate as generated"
        }
        (Guarantee::Alos, false) => {
            "at least one output per input, every (key, window)'s final aggregate as generated (exact state)"
        }
        (Guarantee::Alos, true) => {
            "at least one output per input, every (key, window) present with count and sum at least as generated (re-processed work may count twice)"
        }
    }
}

impl Bench {
    /// W4 at `g`: exactly-once (`w4`) or at-least-once (`w4alos`).
    pub(crate) fn w4(
        &mut self,
        input: &str,
        expected: &workload::W1Expected,
        ends: &[i64],
        g: Guarantee,
    ) {
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
                self.add_w4_static(w, kind, oxbow_resume, resume, first);
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

    /// The rows of Kafka Streams with static membership (`kind`'s `resume` and `first`
    /// commit seconds), with Oxbow's figures (`oxbow_resume`) repeated beside them.
    fn add_w4_static(
        &mut self,
        w: &str,
        kind: Kind,
        oxbow_resume: Option<(f64, f64)>,
        resume: f64,
        first: f64,
    ) {
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
        let half = self.run_half_way(&mut p, &reader, input, ends);
        p.kill();
        if let Err(e) = half {
            self.report.check(format!("{label}: {e}"), false);
            return None;
        }
        let at_kill = committed(&reader, input, self.cfg.partitions);
        let restarted = Instant::now();
        let mut p = spawn(&self.setup, &s);
        let resumed = self.wait_resumed(&mut p, &reader, input, ends, &at_kill, restarted);
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
        if kind == Kind::KStreams
            && let Some(d) = self.changelog_head_deleted(&s.app)
        {
            problems = Some(match problems {
                Some(p) => format!("{p}; {d}"),
                None => d,
            });
        }
        let ok = problems.is_none() && outputs_ok;
        let promise = crash_promise(g, allow_over);
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

    /// Waits until `p` runs and its group (read by `reader`) has committed half of
    /// `input` (to `ends`).
    fn run_half_way(
        &self,
        p: &mut engine::Proc,
        reader: &BaseConsumer,
        input: &str,
        ends: &[i64],
    ) -> Result<(), String> {
        let total: i64 = ends.iter().sum();
        p.wait_running(Duration::from_secs(600))?;
        let deadline = Instant::now() + LONG;
        loop {
            p.alive()?;
            if committed(reader, input, self.cfg.partitions)
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
    }

    /// After the restart of `p` at `restarted`: waits until every partition of `input`
    /// commits past `at_kill` (or was done at the kill), then for the restore and the
    /// input committed to `ends`: (seconds until every partition commits again, until
    /// any does, until the engine reports running, the restore).
    fn wait_resumed(
        &self,
        p: &mut engine::Proc,
        reader: &BaseConsumer,
        input: &str,
        ends: &[i64],
        at_kill: &[i64],
        restarted: Instant,
    ) -> Result<(f64, f64, f64, engine::Restore), String> {
        let deadline = Instant::now() + LONG;
        let mut running = None;
        let mut first = None;
        loop {
            p.alive()?;
            if running.is_none() && p.is_running() {
                running = Some(restarted.elapsed().as_secs_f64());
            }
            let now = committed(reader, input, self.cfg.partitions);
            // Processing has resumed once any partition commits past the kill.
            if first.is_none() && now.iter().zip(at_kill).any(|(n, k)| n > k) {
                first = Some(restarted.elapsed().as_secs_f64());
            }
            if now
                .iter()
                .zip(at_kill)
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
        wait_committed(reader, input, ends, LONG, &mut || p.alive())?;
        Ok((secs, first.unwrap_or(secs), running, r))
    }

    /// Kafka Streams' window store changelog is also deleted by record timestamp
    /// (retention.ms = window retention + windowstore.changelog.additional.retention.ms).
    /// The event times here are a day old: should the broker delete its head, a restore
    /// rebuilds the open windows without those records and they under-count. That is a
    /// fault of the setup, not of the engine, so it is named as such.
    fn changelog_head_deleted(&self, app: &str) -> Option<String> {
        let changelog = format!("{app}-per-user-changelog");
        match self.k.start_offsets(&changelog, self.cfg.partitions) {
            Some(lows) if lows.iter().all(|&l| l == 0) => None,
            Some(lows) => Some(format!(
                "the broker deleted the head of {changelog} by time retention (log start offsets {lows:?}): a restore cannot rebuild the windows it held; the changelog's retention is too short for the input's event times (windowstore.changelog.additional.retention.ms)"
            )),
            None => Some(format!(
                "could not read the log start offsets of {changelog}"
            )),
        }
    }
}
