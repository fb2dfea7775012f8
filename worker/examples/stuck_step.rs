//! A test fixture, not an example to copy: a worker whose custom step never returns for
//! a record whose value has `"stuck": true`, or whose key is `stuck-on-<pod name>` when
//! it runs in that pod, as a step blocked on a dead dependency would. It takes the same command
//! line as `oxbow-worker` (pod mode included: the local stack runs it as the image
//! `oxbow-stuck`).
//! `worker/tests/it/custom_processor_gets_the_same_machinery.rs` runs it to show that
//! `/healthz` fails once the processing loop stops turning, and
//! `e2e/tests/it/a_wedged_worker_pod_is_failed_over_and_restarted_by_its_liveness_probe.rs`
//! that the operator moves its tasks and the kubelet restarts it.
//!
//! ```sh
//! OXBOW_LIVENESS_TIMEOUT=3s stuck_step run --config <streamapp.yaml> --state-dir <dir> --listen <addr>
//! ```

use oxbow_crds::TaskId;
use oxbow_worker::{Context, Processor, Record, StepError};

struct Stuck {
    pod: Option<String>,
}

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
        let here = self
            .pod
            .as_ref()
            .is_some_and(|p| r.key.as_str() == Some(format!("stuck-on-{p}").as_str()));
        if r.value["stuck"] == serde_json::json!(true) || here {
            tracing::warn!("stuck record: this step never returns");
            loop {
                std::thread::park();
            }
        }
        out.push(r);
        Ok(())
    }
}

fn main() -> std::process::ExitCode {
    let pod = std::env::var("POD_NAME").ok();
    let stuck: oxbow_worker::ProcessorFactory = std::sync::Arc::new(move |_task: TaskId| {
        Box::new(Stuck { pod: pod.clone() }) as Box<dyn Processor>
    });
    oxbow_worker::cli::main_with(vec![stuck])
}
