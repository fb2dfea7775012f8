//! A worker with a custom step written in Rust: the same state, changelog and
//! exactly-once machinery as the built-in steps.
//!
//! `RiskScore` keeps a running count per card in its own store (`risk`, changelogged to
//! `<applicationId>-risk-changelog`) and adds `risk` to every record. It runs after the
//! manifest's steps and before its sink:
//!
//! ```sh
//! cargo run --release -p oxbow-worker --example custom_processor -- \
//!     examples/payments.yaml ./state 127.0.0.1:8080
//! ```
//!
//! If the step fails for a record, its store writes vanish with the record's other
//! writes, and the record goes to the manifest's error policy.

use oxbow_crds::{StoreName, TaskId};
use oxbow_worker::{Context, Processor, Record, StepError};

struct RiskScore {
    store: StoreName,
}

impl Processor for RiskScore {
    fn name(&self) -> &str {
        "risk-score"
    }

    fn stores(&self) -> Vec<StoreName> {
        vec![self.store.clone()]
    }

    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        mut r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let card = r.value["card"]
            .as_str()
            .ok_or_else(|| StepError::invalid("value.card must be a string"))?
            .to_string();
        let seen = ctx
            .get(&self.store, card.as_bytes())?
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, u64::from_be_bytes);
        let seen = seen + 1;
        ctx.put(&self.store, card.as_bytes(), seen.to_be_bytes().to_vec());
        let amount = r.value["amount"].as_f64().unwrap_or(0.0);
        r.value["risk"] = serde_json::json!(((seen as f64).ln() * amount / 1000.0).min(1.0));
        out.push(r);
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let (Some(config), Some(state_dir), Some(listen)) = (args.next(), args.next(), args.next())
    else {
        anyhow::bail!("usage: custom_processor <streamapp.yaml> <state-dir> <listen-addr>");
    };
    let app = oxbow_worker::App::load(config.as_ref(), None)?;
    let risk: oxbow_worker::ProcessorFactory = std::sync::Arc::new(|_task: TaskId| {
        Box::new(RiskScore {
            store: StoreName("risk".into()),
        }) as Box<dyn Processor>
    });
    let opts = oxbow_worker::RunOptions {
        state_dir: state_dir.into(),
        instance: 0,
        instances: 1,
        memory_budget: 64 << 20,
        instance_from_pod_name: false,
        peers: Vec::new(),
        coordination: None,
        repartition_purge_interval: oxbow_worker::engine::DEFAULT_PURGE_INTERVAL,
        liveness_timeout: oxbow_worker::liveness::DEFAULT_TIMEOUT,
        metrics_listen: None,
        threads: 1,
    };
    oxbow_worker::run_with(app, vec![risk], opts, Some(listen.parse()?))
}
