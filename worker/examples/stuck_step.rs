//! A test fixture, not an example to copy: a worker whose custom step never returns for
//! a record whose value has `"stuck": true`, as a step blocked on a dead dependency
//! would. `worker/tests/custom_processor_gets_the_same_machinery.rs` runs it to show
//! that `/healthz` fails once the processing loop stops turning.
//!
//! ```sh
//! OXBOW_LIVENESS_TIMEOUT=3s stuck_step <streamapp.yaml> <state-dir> <listen-addr>
//! ```

use oxbow_crds::TaskId;
use oxbow_worker::{Context, Processor, Record, StepError};

struct Stuck;

impl Processor for Stuck {
    fn name(&self) -> &str {
        "stuck"
    }

    fn process(
        &mut self,
        _ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        if r.value["stuck"] == serde_json::json!(true) {
            tracing::warn!("stuck record: this step never returns");
            loop {
                std::thread::park();
            }
        }
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
        anyhow::bail!("usage: stuck_step <streamapp.yaml> <state-dir> <listen-addr>");
    };
    let liveness_timeout = match std::env::var("OXBOW_LIVENESS_TIMEOUT") {
        Ok(s) => oxbow_crds::duration::parse_duration(&s)?,
        Err(_) => oxbow_worker::liveness::DEFAULT_TIMEOUT,
    };
    let app = oxbow_worker::App::load(config.as_ref(), None)?;
    let stuck: oxbow_worker::ProcessorFactory =
        std::sync::Arc::new(|_task: TaskId| Box::new(Stuck) as Box<dyn Processor>);
    let opts = oxbow_worker::RunOptions {
        state_dir: state_dir.into(),
        instance: 0,
        instances: 1,
        memory_budget: 64 << 20,
        instance_from_pod_name: false,
        peers: Vec::new(),
        coordination: None,
        repartition_purge_interval: oxbow_worker::engine::DEFAULT_PURGE_INTERVAL,
        liveness_timeout,
    };
    oxbow_worker::run_with(app, vec![stuck], opts, Some(listen.parse()?))
}
