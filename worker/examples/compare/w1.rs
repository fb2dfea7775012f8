//! W1: a windowed aggregate (10-minute tumbling windows, count + sum per user) at
//! at-least-once and exactly-once, every engine over the same generated input; each
//! output is checked against what the generator computed before the run's records/s,
//! peak RSS and CPU seconds count. The input is shared with W4 ([`Bench::w1_input`]).

use crate::engine::{Guarantee, Kind};
use crate::{Bench, kafka, workload};

impl Bench {
    /// Generates the W1 input (also W4's): (topic, the expected aggregates, its ends).
    pub(crate) fn w1_input(&mut self) -> (String, workload::W1Expected, Vec<i64>) {
        let input = format!("{}w1-in", self.prefix);
        self.k.create_topic(&input, self.cfg.partitions);
        eprintln!(
            "W1: generating {} records over {} keys into {input}…",
            self.cfg.records, self.cfg.keys
        );
        let expected = workload::w1(
            &self.k,
            &input,
            self.cfg.records,
            self.cfg.keys,
            self.cfg.seed,
            self.base_ts,
        );
        let ends = self.input_ends(&input);
        (input, expected, ends)
    }

    pub(crate) fn w1(&mut self, input: &str, expected: &workload::W1Expected, ends: &[i64]) {
        for run in 1..=self.cfg.runs {
            for g in [Guarantee::Alos, Guarantee::Eos] {
                for kind in self.cfg.engines.clone() {
                    self.w1_once(run, g, kind, input, expected, ends);
                }
            }
        }
    }

    /// One W1 run of `kind` at `g`: its figures count once its output checks.
    fn w1_once(
        &mut self,
        run: u64,
        g: Guarantee,
        kind: Kind,
        input: &str,
        expected: &workload::W1Expected,
        ends: &[i64],
    ) {
        let records = self.cfg.records as f64;
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
                return;
            }
        };
        let ok = if kind == Kind::Pipe {
            self.w1_check_piped(&s.output, g, &label)
        } else {
            self.w1_check_output(&s.output, kind, &label, expected)
        };
        if ok {
            let w = format!("W1 {}", g.label());
            self.report.add_run(&w, kind, records, (secs, rss, cpu));
        }
    }

    /// The raw pipe copies records: every input once (at-least-once: at least once).
    fn w1_check_piped(&mut self, output: &str, g: Guarantee, label: &str) -> bool {
        let n = kafka::read_all(&self.k.bootstrap, output, self.cfg.partitions, |_| {});
        let ok = n == self.cfg.records || (g == Guarantee::Alos && n > self.cfg.records);
        self.report.check(
            format!("{label}: {n} records piped of {}", self.cfg.records),
            ok,
        );
        ok
    }

    /// Every (key, window)'s aggregate as generated, one output per input.
    fn w1_check_output(
        &mut self,
        output: &str,
        kind: Kind,
        label: &str,
        expected: &workload::W1Expected,
    ) -> bool {
        match workload::check_w1(&self.k, output, self.cfg.partitions, expected) {
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
    }
}
