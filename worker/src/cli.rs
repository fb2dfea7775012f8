//! The worker's command line (`run`, `check`, `digest`), for `oxbow-worker` and for a
//! worker binary built with custom processors ([`main_with`]): the same flags, the same
//! pod mode under the operator.
//!
//! Owns: parsing the flags and environment into [`crate::RunOptions`]. Must not touch:
//! what running means (`crate::run_with`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    version,
    about = "Runs a StreamApp: Kafka in, steps with RocksDB state, Kafka out"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Process records until SIGTERM.
    Run(Box<RunArgs>),
    /// Load and validate a manifest, compile its expressions, and exit.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// Print a digest of every store of every task in a state directory (the worker
    /// must not be running): `<task>/<store> <digest>`. Equal digests, equal state.
    Digest {
        #[arg(long)]
        config: PathBuf,
        #[arg(long, default_value = "./state")]
        state_dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// A StreamApp manifest (YAML or JSON), as applied with kubectl.
    #[arg(long)]
    config: PathBuf,
    /// This worker's number, 0-based. Default: the ordinal of POD_NAME (`app-2` → 2), else 0.
    #[arg(long, env = "OXBOW_INSTANCE")]
    instance: Option<u32>,
    /// How many workers share the tasks.
    #[arg(long, env = "OXBOW_INSTANCES", default_value_t = 1)]
    instances: u32,
    /// Where RocksDB state lives (`<dir>/<applicationId>/<task>/`).
    #[arg(long, default_value = "./state")]
    state_dir: PathBuf,
    /// HTTP address for /healthz, /readyz, /v1/status, the queries, and /metrics unless
    /// --metrics-listen is given.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// HTTP address for /metrics alone (the operator sets it on its own port, so a
    /// NetworkPolicy can admit Prometheus there and keep the queries closed).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// A directory of librdkafka properties, one file each (a mounted Secret).
    #[arg(long)]
    kafka_secret_dir: Option<PathBuf>,
    /// Memory for RocksDB block cache and memtables, all tasks together (MiB). The
    /// operator sets it to half the container's memory limit, when there is one.
    #[arg(long, default_value_t = 256)]
    memory_mib: usize,
    /// Run the tasks the operator assigns in this ConfigMap (set by the operator in the
    /// StatefulSet) instead of `--instance`/`--instances`. Needs POD_NAME, POD_NAMESPACE
    /// and OXBOW_STREAMAPP, and renews this pod's report Lease.
    #[arg(long, env = "OXBOW_ASSIGNMENT_CONFIGMAP")]
    assignment_configmap: Option<String>,
    /// Coordinated: reach another pod for a routed query at `<pod>.<domain>` (the
    /// operator passes the StatefulSet's headless Service, `<service>.<namespace>.svc`),
    /// on the port of its reported address, instead of at its reported IP.
    #[arg(long, env = "OXBOW_PEER_DOMAIN")]
    peer_domain: Option<String>,
    /// Standalone: every instance's HTTP address (`host:port`), in instance order, so a
    /// query for a key another instance owns is forwarded there.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// How often repartition records that every reader has committed past are deleted
    /// (DeleteRecords), as Kafka Streams' `repartition.purge.interval.ms`.
    #[arg(long, env = "OXBOW_REPARTITION_PURGE_INTERVAL", default_value = "30s", value_parser = duration)]
    repartition_purge_interval: std::time::Duration,
    /// `/healthz` fails (and the kubelet restarts the worker) once the processing loop,
    /// or a restore it runs, has made no turn for this long.
    #[arg(long, env = "OXBOW_LIVENESS_TIMEOUT", default_value = "60s", value_parser = duration)]
    liveness_timeout: std::time::Duration,
    /// Processing threads: how many active tasks run side by side. Default: the CPUs
    /// this process may use (a container's CPU limit counts), at least 1.
    #[arg(long, env = "OXBOW_THREADS", value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: Option<u16>,
    /// How the aggregate stores' values are written: `json`, which every worker reads,
    /// or `binary`, which only workers since it read. Both are always read. The operator
    /// chooses binary once no older worker can see the app's stores; standalone, choose
    /// binary only when every worker of the app reads it.
    #[arg(long, env = "OXBOW_STORE_ENCODING", default_value = "json")]
    store_encoding: oxbow_crds::StoreEncoding,
}

/// The address other pods and clients reach this worker at: `--listen` itself, or, when
/// it listens on all addresses, the pod's IP (`POD_IP`) with its port.
fn advertised(listen: SocketAddr) -> anyhow::Result<String> {
    if !listen.ip().is_unspecified() {
        return Ok(listen.to_string());
    }
    let ip = std::env::var("POD_IP").map_err(|_| {
        anyhow::anyhow!("failed to start coordinated: --listen {listen} needs the environment variable POD_IP, the address to report")
    })?;
    let ip: std::net::IpAddr = ip.parse().map_err(|e| {
        anyhow::anyhow!("failed to start coordinated: POD_IP {ip:?} is not an IP address: {e}")
    })?;
    Ok(SocketAddr::new(ip, listen.port()).to_string())
}

fn duration(s: &str) -> Result<std::time::Duration, String> {
    oxbow_crds::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// Runs the worker's command line with `extra` processors appended after the spec's
/// steps (see [`crate::run_with`]); `oxbow-worker` is `main_with(Vec::new())`.
pub fn main_with(extra: Vec<crate::ProcessorFactory>) -> std::process::ExitCode {
    oxbow_crds::redact::scrub_panics();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,librdkafka=warn".into()),
        )
        // Colours only on a terminal: a container's log (kubectl logs) is plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Every line is scrubbed of the secrets of the app's Kafka configuration.
        .with_writer(|| oxbow_crds::redact::ScrubbingWriter::new(std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { config } => crate::App::load(&config, None)
            .map(|a| println!("{}: ok ({} steps)", a.application_id, a.steps.len()))
            .map_err(anyhow::Error::from),
        Command::Run(a) => run(*a, extra),
        Command::Digest { config, state_dir } => digest(&config, &state_dir),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {}", oxbow_crds::redact::scrub(&format!("{e:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(a: RunArgs, extra: Vec<crate::ProcessorFactory>) -> anyhow::Result<()> {
    let mut app = crate::App::load(&a.config, a.kafka_secret_dir.as_deref())?;
    app.store_encoding = a.store_encoding;
    let from_pod = std::env::var("POD_NAME")
        .ok()
        .and_then(|p| p.rsplit_once('-').and_then(|(_, n)| n.parse::<u32>().ok()));
    let instance = a.instance.or(from_pod).unwrap_or(0);
    let coordination = match &a.assignment_configmap {
        None => None,
        Some(cm) => {
            let var = |name: &str| {
                std::env::var(name).map_err(|_| {
                    anyhow::anyhow!("failed to start coordinated: --assignment-configmap needs the environment variable {name}")
                })
            };
            Some(crate::coord::CoordConfig {
                namespace: var("POD_NAMESPACE")?,
                app: var("OXBOW_STREAMAPP")?,
                pod: var("POD_NAME")?,
                config_map: cm.clone(),
                address: advertised(a.listen)?,
                peer_domain: a.peer_domain.clone(),
            })
        }
    };
    let opts = crate::RunOptions {
        state_dir: a.state_dir,
        instance,
        instances: a.instances,
        memory_budget: a.memory_mib.saturating_mul(1 << 20),
        instance_from_pod_name: a.instance.is_none() && from_pod.is_some(),
        peers: a.peers,
        coordination,
        repartition_purge_interval: a.repartition_purge_interval,
        liveness_timeout: a.liveness_timeout,
        metrics_listen: a.metrics_listen,
        threads: a.threads.map(usize::from).unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }),
    };
    tracing::info!(app = %app.application_id, instance, instances = a.instances, threads = opts.threads, store_encoding = %app.store_encoding, "starting");
    crate::run_with(app, extra, opts, Some(a.listen))
}

fn digest(config: &std::path::Path, state_dir: &std::path::Path) -> anyhow::Result<()> {
    let app = crate::App::load(config, None)?;
    let dir = state_dir.join(&app.application_id);
    let memory = crate::store::SharedMemory::new(16 << 20);
    let mut tasks: Vec<oxbow_crds::TaskId> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tasks.sort_unstable();
    for t in tasks {
        let stores: Vec<_> = app
            .stage_steps(t.stage)
            .iter()
            .flat_map(|f| f(t).stores())
            .collect();
        let db = crate::store::TaskDb::open(&dir.join(t.to_string()), t, &stores, &memory)?;
        for s in &stores {
            println!("{t}/{s} {:016x}", db.digest(s)?);
        }
    }
    Ok(())
}
