//! The Oxbow worker engine: Kafka in, steps with RocksDB state, Kafka out, exactly-once.
//!
//! - [`config`]: the StreamApp manifest, validated and compiled.
//! - [`processor`]: the `Processor` trait every step implements (built-in or yours).
//! - [`steps`]: the built-in steps, their windows and store layouts. [`expr`]: CEL.
//! - [`task`]: one partition's unit of work; [`overlay`]: its staging area.
//! - [`store`]: RocksDB per task.
//! - [`engine`]: the Kafka loop, assignment, standbys, commits, restore I/O next to its
//!   pure planner, and the at-least-once replay rule. [`http`], [`metrics`], [`status`].
//!
//! [`run`] is what the binary calls; a custom worker calls [`run_with`] with its own
//! processors appended to the built-in steps.

pub mod auth;
pub mod cli;
pub mod config;
pub mod coord;
pub mod decode;
pub mod engine;
pub mod expr;
pub mod http;
pub mod lease;
pub mod liveness;
pub mod metrics;
pub mod overlay;
pub mod processor;
pub mod projection;
pub mod query;
pub mod report;
pub mod status;
pub mod steps;
pub mod store;
pub mod task;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;

pub use config::App;
pub use engine::RunOptions;
pub use processor::{Context, Processor, ProcessorFactory, Record, RecordError, StepError};

/// Runs an app until SIGTERM/SIGINT, serving HTTP on `listen`.
pub fn run(app: App, opts: RunOptions, listen: Option<SocketAddr>) -> anyhow::Result<()> {
    let app = Arc::new(app);
    let shared = initial_status(&app, &opts);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // Bound before anything starts: a port someone else holds is an error at start,
    // not a worker that runs on without its probes, status and queries.
    let bind = |addr: SocketAddr, flag: &str| {
        rt.block_on(tokio::net::TcpListener::bind(addr))
            .with_context(|| format!("cannot listen on {addr} ({flag})"))
    };
    if let Some(addr) = listen {
        let listener = bind(addr, "--listen")?;
        // A pod of a StreamApp serves its state only to callers RBAC lets query it.
        let access = match &opts.coordination {
            Some(c) => auth::Access::kubernetes(&c.namespace, &c.app),
            None => auth::Access::Open,
        };
        rt.spawn(http::serve(
            listener,
            shared.clone(),
            query::Catalog::from_app(&app),
            access,
            opts.metrics_listen.is_none(),
        ));
    }
    if let Some(addr) = opts.metrics_listen {
        rt.spawn(http::serve_metrics(bind(addr, "--metrics-listen")?));
    }
    if let Some(cfg) = opts.coordination.clone() {
        let shared = shared.clone();
        rt.spawn(async move {
            // Without the operator's word the worker runs nothing; say why loudly.
            if let Err(e) = coord::run(cfg, shared.clone()).await {
                tracing::error!(error = %e, "coordination stopped: no assignment changes will be applied");
                shared.update(|s| s.last_error = Some(oxbow_crds::redact::scrub(&e.to_string())));
            }
        });
    }
    rt.spawn(stop_on_signal(shared.clone()));
    let opts_coordination = opts.coordination.clone();
    let engine_shared = shared.clone();
    // The engine is synchronous (librdkafka and RocksDB calls block); it gets its own
    // thread. A panic there poisons the status mutex, which /healthz then reports.
    let handle = std::thread::Builder::new()
        .name("oxbow-engine".into())
        .spawn(move || -> Result<(), engine::EngineError> {
            let engine = engine::Engine::start(app, &opts, engine_shared.clone())?;
            if engine_shared.stopping() {
                return Ok(());
            }
            engine.run()
        })?;
    let result = match handle.join() {
        Ok(Err(engine::EngineError::Stopped)) => Ok(()),
        Ok(r) => r.map_err(anyhow::Error::from),
        Err(_) => Err(anyhow::anyhow!("the engine thread panicked")),
    };
    if let Err(e) = &result {
        shared.update(|s| {
            s.state = oxbow_crds::WorkerState::Failed;
            s.last_error = Some(oxbow_crds::redact::scrub(&e.to_string()));
        });
    }
    if let Some(cfg) = &opts_coordination {
        let _ = rt.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_secs(3),
                report::final_report(cfg, &shared),
            )
            .await
        });
    }
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// The worker's status before the engine starts: who it is, its peers' addresses
/// (standalone `--peers`, for forwarding queries), Starting.
fn initial_status(app: &App, opts: &RunOptions) -> Arc<status::Shared> {
    let shared = Arc::new(status::Shared::default());
    shared.liveness.set_timeout(opts.liveness_timeout);
    if let Ok(mut r) = shared.routing.write() {
        r.addresses.extend(
            opts.peers
                .iter()
                .enumerate()
                .map(|(i, a)| (format!("instance-{i}"), a.clone())),
        );
    }
    shared.update(|s| {
        s.application_id = app.application_id.clone();
        s.instance = opts.instance;
        s.instances = opts.instances;
        s.guarantee = match app.guarantee {
            oxbow_crds::ProcessingGuarantee::ExactlyOnce => "exactly_once".into(),
            oxbow_crds::ProcessingGuarantee::AtLeastOnce => "at_least_once".into(),
        };
        s.state = oxbow_crds::WorkerState::Starting;
    });
    shared
}

/// SIGTERM or SIGINT: the engine finishes its unit of work and stops.
async fn stop_on_signal(shared: Arc<status::Shared>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: finishing the current unit of work"),
        _ = int.recv() => tracing::info!("SIGINT: finishing the current unit of work"),
    }
    shared.stop();
}

/// Like [`run`], with extra processors appended after the spec's steps (before the sink).
pub fn run_with(
    mut app: App,
    extra: Vec<ProcessorFactory>,
    opts: RunOptions,
    listen: Option<SocketAddr>,
) -> anyhow::Result<()> {
    app.steps.extend(extra);
    run(app, opts, listen)
}
