//! `oxbow-node` — the local node agent. See `e2e/README.md`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use oxbow_e2e::node::{Agent, AgentShared, NodeSettings, images::ImageMap, now};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Plays the kubelet for one Node: runs its pods as local processes"
)]
struct Args {
    /// Kubeconfig of the agent's own identity.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    #[arg(long, default_value = "oxbow-node")]
    node_name: String,
    /// Directory for pod directories, volumes, logs and pid files.
    #[arg(long)]
    root: PathBuf,
    /// YAML file mapping image patterns to local binaries.
    #[arg(long)]
    images: PathBuf,
    /// API server URL handed to pods in their kubeconfig.
    #[arg(long)]
    api_server: String,
    /// CA certificate of the API server, handed to pods.
    #[arg(long)]
    ca_file: PathBuf,
    #[arg(long, default_value = "v1.34.4")]
    kubernetes_version: String,
    #[arg(long, default_value = "32")]
    cpu: String,
    #[arg(long, default_value = "64Gi")]
    memory: String,
    #[arg(long, default_value_t = 250)]
    max_pods: u32,
    /// First restart back-off (the kubelet uses 10 s; shorter keeps tests quick).
    #[arg(long, default_value = "1", value_parser = parse_secs)]
    restart_backoff_base: Duration,
    #[arg(long, default_value = "20", value_parser = parse_secs)]
    restart_backoff_max: Duration,
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    s.trim_end_matches('s')
        .parse::<f64>()
        .map(Duration::from_secs_f64)
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_runtime=warn,kube_client=warn".into()),
        )
        .init();
    let args = Args::parse();
    // Fail at start on a broken map; pods re-read it at every container start.
    ImageMap::load(&args.images).map_err(anyhow::Error::msg)?;
    let ca_pem = std::fs::read_to_string(&args.ca_file)
        .with_context(|| format!("failed to read {}", args.ca_file.display()))?;
    let kubeconfig = kube::config::Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("failed to read {}", args.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = kube::Client::try_from(config)?;
    let api_port = args
        .api_server
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or(443);
    let kernel_version = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .trim()
        .to_string();
    let shared = AgentShared {
        client,
        node_name: args.node_name.clone(),
        root: args.root,
        images: args.images,
        api_server: args.api_server,
        api_port,
        ca_pem,
        restart_backoff_base: args.restart_backoff_base,
        restart_backoff_max: args.restart_backoff_max,
    };
    let settings = NodeSettings {
        node_name: args.node_name,
        cpu: args.cpu,
        memory: args.memory,
        max_pods: args.max_pods,
        kubernetes_version: args.kubernetes_version,
        kernel_version,
        boot_id,
        started: now(),
    };
    Agent::new(shared, settings).run().await
}
