//! `oxbow-operator`: `run` the controller, or print the `crd`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use oxbow_operator::build::BuildContext;
use oxbow_operator::controller::{self, Context};
use oxbow_operator::leader::LeaderElector;
use oxbow_operator::placement::PlacementConfig;
use warp::Filter;

#[derive(Parser, Debug)]
#[command(version, about = "The Oxbow operator: runs StreamApps on Kubernetes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Watch StreamApps and reconcile them.
    Run(Box<RunArgs>),
    /// Print the StreamApp CustomResourceDefinition (YAML).
    Crd,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "OXBOW_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Address of /healthz and /metrics.
    #[arg(long, env = "OXBOW_METRICS_ADDR", default_value = "0.0.0.0:8081")]
    metrics_addr: SocketAddr,
    /// Worker image for StreamApps that do not set spec.image.
    #[arg(long, env = "OXBOW_WORKER_IMAGE", default_value = concat!("oxbow-worker:", env!("CARGO_PKG_VERSION")))]
    worker_image: String,
    /// Elect a leader on a Lease so only one replica reconciles.
    #[arg(long, env = "OXBOW_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// Namespace of the leader Lease (default: the watched namespace, or POD_NAMESPACE).
    #[arg(long, env = "OXBOW_LEADER_ELECTION_NAMESPACE")]
    leader_election_namespace: Option<String>,
    /// How long deletion waits for Kafka cleanup before giving up and letting go.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    cleanup_timeout: Duration,
    /// How often a Ready StreamApp is checked again (topic drift has no watch events).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    resync_interval: Duration,
    /// How long a worker pod that is not Ready keeps its tasks while it still reports
    /// (or was just created); then they fail over to the freshest standby. A pod that is
    /// gone or terminating fails over at once.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    failover_timeout: Duration,
    /// A task moves to another pod (scale-out balance, scale-in drain) only once that
    /// pod's copy of its state is at most this many changelog records behind.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(0..))]
    warmup_max_lag: i64,
    /// Give each StreamApp a NetworkPolicy that admits its query port only from its own
    /// pods and from pods labelled with --network-policy-client-label.
    #[arg(long, env = "OXBOW_NETWORK_POLICY", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    network_policy: bool,
    /// The label (key=value) that admits a client pod, or a client namespace, to the
    /// query ports under --network-policy.
    #[arg(long, default_value = "oxbow.dev/query-client=true", value_parser = parse_label)]
    network_policy_client_label: (String, String),
    /// The compacted topic, in each Kafka cluster, where operators record which
    /// StreamApp owns an application id and which topics they created for it. Every
    /// operator sharing a Kafka cluster must use the same one.
    #[arg(long, env = "OXBOW_CLAIMS_TOPIC", default_value = oxbow_operator::ownership::DEFAULT_CLAIMS_TOPIC)]
    claims_topic: String,
    /// json (default) or text.
    #[arg(long, env = "OXBOW_LOG_FORMAT", default_value = "json")]
    log_format: String,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not a label: write key=value")),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    oxbow_crds::duration::parse_duration(s).map_err(|e| e.to_string())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", oxbow_crds::crd::crd_yaml());
            Ok(())
        }
        Command::Run(args) => runtime()?.block_on(run(*args)),
    }
}

/// The work is waiting on the API server and Kafka, which two workers keep up with.
/// Every extra thread costs a stack and usually a glibc malloc arena that keeps what it
/// once held (docs/benchmarks.md, "Tuning evidence"). The blocking pool only runs
/// librdkafka's metadata calls.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube_runtime=warn,kube_client=warn".into());
    // Every line (and a panic's message) is scrubbed of the secrets of the Kafka clients
    // built so far.
    oxbow_crds::redact::scrub_panics();
    let writer = || oxbow_crds::redact::ScrubbingWriter::new(std::io::stdout());
    if args.log_format == "text" {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .with_writer(writer)
            .init();
    } else {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(writer)
            .init();
    }
    let config = kube::Config::infer()
        .await
        .context("failed to read the Kubernetes client configuration")?;
    let api_requests = oxbow_operator::metrics::ApiRequests::default();
    let client = kube::client::ClientBuilder::try_from(config)
        .context("failed to connect to the Kubernetes API")?
        .with_layer(&oxbow_operator::metrics::count_api_requests(
            api_requests.clone(),
        ))
        .build();
    let identity = std::env::var("POD_NAME")
        .unwrap_or_else(|_| format!("oxbow-operator-{}", std::process::id()));
    let mut ctx = Context::new(
        client.clone(),
        BuildContext {
            default_image: args.worker_image.clone(),
            query_client_label: args
                .network_policy
                .then(|| args.network_policy_client_label.clone()),
        },
        args.cleanup_timeout,
        args.resync_interval,
        PlacementConfig {
            failover_timeout: args.failover_timeout,
            warmup_max_lag: args.warmup_max_lag,
        },
        &identity,
    );
    ctx.claims_topic = args.claims_topic.clone();
    ctx.metrics.register_api_requests(api_requests);
    let ctx = Arc::new(ctx);

    let metrics = ctx.metrics.clone();
    let healthz = warp::path("healthz").map(|| "ok");
    let metrics_route = warp::path("metrics").map(move || {
        warp::reply::with_header(
            metrics.encode(),
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    });
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("failed to listen on {}", args.metrics_addr))?;
    tracing::info!(addr = %args.metrics_addr, "serving /healthz and /metrics");
    tokio::spawn(
        warp::serve(healthz.or(metrics_route))
            .incoming(listener)
            .run(),
    );

    if args.leader_election {
        let lease_ns = args
            .leader_election_namespace
            .clone()
            .or_else(|| args.namespace.clone())
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".into());
        let elector = LeaderElector::new(client.clone(), &lease_ns, "oxbow-operator", &identity);
        elector.acquire().await?;
        tokio::select! {
            _ = controller::run(ctx, args.namespace.clone()) => {}
            lost = elector.hold() => {
                tracing::error!(error = %lost, "stopping: leadership lost");
                anyhow::bail!("{lost}");
            }
        }
    } else {
        controller::run(ctx, args.namespace.clone()).await;
    }
    Ok(())
}
