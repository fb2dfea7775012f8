//! W5: payments keyed by payment id, deduped by txId and aggregated per user in
//! 10-minute windows (two repartitions), then left-joined with a users table kept whole
//! by every instance (a global table, a GlobalKTable in the peer) for each user's limit,
//! under exactly-once. The same topology runs in both engines
//! (the peer's `w5`), outputs are checked before the figures count.
//!
//! A run ends when the input is committed, the app's group has committed both
//! repartition topics to their ends (both engines name them `<app>-seen-repartition` and
//! `<app>-per-user-repartition`), and the output has not grown for [`QUIET`].

use std::time::{Duration, Instant};

use crate::engine::Guarantee;
use crate::kafka::committed;
use crate::{Bench, LONG, workload};

/// How long the output must stay the same for a run to count as finished.
const QUIET: Duration = Duration::from_secs(3);

impl Bench {
    pub(crate) fn w5(&mut self) {
        let input = format!("{}w5-in", self.prefix);
        let users = format!("{}w5-users", self.prefix);
        self.k.create_topic(&input, self.cfg.partitions);
        self.k.create_topic(&users, self.cfg.partitions);
        eprintln!(
            "W5: generating {} users into {users} and {} payments into {input}…",
            self.cfg.keys, self.cfg.records
        );
        let exp = workload::w5(
            &self.k,
            &input,
            &users,
            self.cfg.records,
            self.cfg.keys,
            self.cfg.seed,
            self.base_ts,
        );
        let ends = self.input_ends(&input);
        let records = self.cfg.records as f64;
        for (run, kind) in self.engine_runs() {
            let app = format!("{}w5-{}-{run}", self.prefix, kind.name());
            let mut s = self.spec(kind, "w5", Guarantee::Eos, app, &input);
            s.table = users.clone();
            self.k.create_topic(&s.output, self.cfg.partitions);
            eprintln!("W5 EOS run {run}: {}…", kind.name());
            let label = format!("W5 EOS run {run} {}", kind.name());
            let (secs, rss, cpu) = match self.until_quiet(&s, &ends) {
                Ok(m) => m,
                Err(e) => {
                    self.report.check(format!("{label}: {e}"), false);
                    continue;
                }
            };
            match workload::check_w5(&self.k, &s.output, self.cfg.partitions, &exp) {
                Ok(n) => {
                    self.report.check(
                            format!(
                                "{label}: {} (user, window) aggregates as generated with each user's limit, {} re-sends dropped; {n} outputs",
                                exp.windows.len(),
                                exp.resent
                            ),
                            true,
                        );
                    self.report
                        .add_run("W5 EOS", kind, records, (secs, rss, cpu));
                }
                Err(e) => self.report.check(format!("{label}: {e}"), false),
            }
        }
    }

    /// Runs `s` until its input is committed to `ends`, both repartition topics are
    /// committed to their ends and its output has been quiet for [`QUIET`]: (seconds
    /// until the last output, peak RSS, CPU s).
    fn until_quiet(
        &self,
        s: &crate::engine::Spec,
        ends: &[i64],
    ) -> Result<(f64, f64, f64), String> {
        self.measure(s, ends, |p, reader, _| {
            let output_end = || {
                self.k
                    .end_offsets(&s.output, self.cfg.partitions)
                    .map(|e| e.iter().sum::<i64>())
                    .unwrap_or(0)
            };
            // Under exactly-once a partition's end is one past the last transaction's
            // marker, which no consumer position passes: a lag of 1 is the end.
            let repartitions_done = || {
                ["seen", "per-user"].iter().all(|step| {
                    let topic = format!("{}-{step}-repartition", s.app);
                    let ends = self.k.end_offsets(&topic, self.cfg.partitions);
                    let done = committed(reader, &topic, self.cfg.partitions);
                    ends.is_some_and(|e| e.iter().zip(&done).all(|(end, c)| end - c <= 1))
                })
            };
            let (mut last, mut changed) = (output_end(), Instant::now());
            let deadline = Instant::now() + LONG;
            // A lag the end test cannot see past (a partition ending in two markers)
            // must not hang the run: after ten quiet periods the output check decides.
            while (changed.elapsed() < QUIET || last == 0 || !repartitions_done())
                && changed.elapsed() < QUIET * 10
            {
                p.alive()?;
                if Instant::now() > deadline {
                    return Err(format!("the output did not settle within {LONG:?}"));
                }
                std::thread::sleep(Duration::from_millis(100));
                let now = output_end();
                if now != last {
                    (last, changed) = (now, Instant::now());
                }
            }
            Ok(changed)
        })
    }
}
