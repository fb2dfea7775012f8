//! W2: examples/dedupe.yaml (dedupe, map, sink, dead letters) under exactly-once, every
//! engine but the raw pipe over the same generated payments; each output and its dead
//! letters are checked against what the generator computed before the figures count.

use crate::engine::Guarantee;
use crate::{Bench, workload};

impl Bench {
    pub(crate) fn w2(&mut self) {
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
        let ends = self.input_ends(&input);
        let records = self.cfg.w2_records as f64;
        for (run, kind) in self.engine_runs() {
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
