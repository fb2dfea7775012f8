//! Samples, medians, the table with ratios, and docs/benchmarks.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::engine::Kind;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

pub struct Row {
    pub workload: String,
    pub metric: String,
    pub better: Better,
    pub samples: BTreeMap<&'static str, Vec<f64>>,
    pub notes: BTreeMap<&'static str, String>,
}

#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub checks: Vec<String>,
    pub failures: usize,
}

pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

fn fmt(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

impl Report {
    /// A throughput run's three figures: records/s, peak RSS and CPU per million records.
    pub fn add_run(
        &mut self,
        workload: &str,
        kind: Kind,
        records: f64,
        (secs, rss, cpu): (f64, f64, f64),
    ) {
        self.add(workload, "records/s", Better::Higher, kind, records / secs);
        self.add(workload, "peak RSS MiB", Better::Lower, kind, rss);
        self.add(
            workload,
            "CPU s / M records",
            Better::Lower,
            kind,
            cpu / (records / 1e6),
        );
    }

    pub fn add(&mut self, workload: &str, metric: &str, better: Better, kind: Kind, value: f64) {
        let row = match self
            .rows
            .iter()
            .position(|r| r.workload == workload && r.metric == metric)
        {
            Some(i) => &mut self.rows[i],
            None => {
                self.rows.push(Row {
                    workload: workload.into(),
                    metric: metric.into(),
                    better,
                    samples: BTreeMap::new(),
                    notes: BTreeMap::new(),
                });
                self.rows.last_mut().expect("row")
            }
        };
        row.samples.entry(kind.name()).or_default().push(value);
    }

    pub fn note(&mut self, workload: &str, metric: &str, kind: Kind, note: String) {
        if let Some(r) = self
            .rows
            .iter_mut()
            .find(|r| r.workload == workload && r.metric == metric)
        {
            r.notes.insert(kind.name(), note);
        }
    }

    pub fn check(&mut self, line: String, ok: bool) {
        eprintln!("  check: {line}");
        if !ok {
            self.failures += 1;
        }
        self.checks
            .push(format!("{} {line}", if ok { "ok  " } else { "FAIL" }));
    }

    fn cell(r: &Row, k: &str) -> (Option<f64>, String) {
        match r.samples.get(k) {
            Some(v) => {
                let m = median(v);
                let mut s = m.map(fmt).unwrap_or_default();
                if let Some(n) = r.notes.get(k) {
                    s.push_str(&format!(" ({n})"));
                }
                (m, s)
            }
            None => (None, "–".into()),
        }
    }

    fn ratio(a: Option<f64>, b: Option<f64>, better: Better) -> String {
        match (a, b) {
            (Some(a), Some(b)) if b != 0.0 => {
                let r = a / b;
                let arrow = match better {
                    Better::Higher => "↑",
                    Better::Lower => "↓",
                };
                format!("{r:.2}× {arrow}")
            }
            _ => "–".into(),
        }
    }

    /// Markdown: one row per metric, medians, and the ratios (↑: higher is better, ↓:
    /// lower is better).
    pub fn table(&self) -> String {
        let mut t = String::new();
        t.push_str("| workload | metric | Oxbow | Kafka Streams | raw pipe | Oxbow / Kafka Streams | Oxbow / pipe | samples (Oxbow; Kafka Streams; pipe) |\n");
        t.push_str("|---|---|---:|---:|---:|---:|---:|---|\n");
        for r in &self.rows {
            let (o, os) = Self::cell(r, "oxbow");
            let (k, ks) = Self::cell(r, "kstreams");
            let (p, ps) = Self::cell(r, "pipe");
            let samples = ["oxbow", "kstreams", "pipe"]
                .iter()
                .map(|n| {
                    r.samples
                        .get(n)
                        .map(|v| v.iter().map(|x| fmt(*x)).collect::<Vec<_>>().join(", "))
                        .unwrap_or_else(|| "–".into())
                })
                .collect::<Vec<_>>()
                .join("; ");
            let _ = writeln!(
                t,
                "| {} | {} | {os} | {ks} | {ps} | {} | {} | {samples} |",
                r.workload,
                r.metric,
                Self::ratio(o, k, r.better),
                Self::ratio(o, p, r.better),
            );
        }
        t
    }
}
