//! latency: W1 at a fixed input rate (BENCH_RATE for BENCH_LATENCY_SECS), at-least-once
//! and exactly-once: p50/p99 from the input's timestamp (the producer's clock) to the
//! output seen by a read_committed consumer, after a warm-up of a fifth of the run. A run
//! counts once every input has an output.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{DefaultProducerContext, ThreadedProducer};

use crate::engine::{Guarantee, Kind, spawn};
use crate::kafka::{self, wait_committed};
use crate::report::Better;
use crate::{Bench, now_ms, workload};

/// Reads `output` (`parts` partitions) read_committed until `stop`: the latencies (ms)
/// of the outputs whose input was stamped from `warm_until` on, and how many outputs.
fn read_latencies(
    bootstrap: String,
    output: String,
    parts: i32,
    stop: Arc<AtomicBool>,
    warm_until: i64,
) -> (Vec<f64>, u64) {
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
    while !stop.load(Ordering::Relaxed) {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
            n += 1;
            let ts = m.timestamp().to_millis().unwrap_or(0);
            if ts >= warm_until {
                lat.push((now_ms() - ts) as f64);
            }
        }
    }
    (lat, n)
}

impl Bench {
    /// W1 at a fixed rate: latency from the input's timestamp (the producer's clock) to the
    /// output seen by a read_committed consumer, after a warm-up of a fifth of the run.
    pub(crate) fn latency(&mut self) {
        let (rate, secs) = (self.cfg.rate.max(1), self.cfg.latency_secs.max(5));
        for g in [Guarantee::Alos, Guarantee::Eos] {
            for kind in self.cfg.engines.clone() {
                self.latency_once(g, kind, rate, secs);
            }
        }
    }

    /// One latency run of `kind` at `g`: `rate` records/s for `secs` seconds.
    fn latency_once(&mut self, g: Guarantee, kind: Kind, rate: u64, secs: u64) {
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
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (bootstrap, output, parts, stop2) = (
            self.k.bootstrap.clone(),
            s.output.clone(),
            self.cfg.partitions,
            stop.clone(),
        );
        let warm_until = now_ms() + (secs as i64 * 1000) / 5;
        let reader =
            std::thread::spawn(move || read_latencies(bootstrap, output, parts, stop2, warm_until));
        let (_prod, total) = self.send_at_rate(&input, rate, secs);
        // Let the outputs drain, then stop the reader.
        let ends = self.input_ends(&input);
        let offsets = self.k.offsets_reader(&s.app);
        let drained = wait_committed(
            &offsets,
            &input,
            &ends,
            Duration::from_secs(120),
            &mut || p.alive(),
        );
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
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

    /// Sends `rate` W1 payments a second to `input` for `secs` seconds, each stamped with
    /// the producer's clock: the producer (kept until the run ends) and how many.
    fn send_at_rate(
        &self,
        input: &str,
        rate: u64,
        secs: u64,
    ) -> (ThreadedProducer<DefaultProducerContext>, u64) {
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
                input,
                name.as_bytes(),
                workload::payment(&name, (x >> 20) % 10_000, 1, ts).as_bytes(),
                ts,
            );
            if i % 64 == 0 {
                rdkafka::producer::Producer::flush(&prod, Duration::ZERO).ok();
            }
        }
        let _ = rdkafka::producer::Producer::flush(&prod, Duration::from_secs(30));
        (prod, total)
    }
}
