//! `oxbow-node`: a local node agent that plays the kubelet for one Node.
//!
//! It registers the Node and keeps its Lease fresh, provisions host-directory volumes,
//! and runs every pod scheduled to it as local processes (see `e2e/README.md` for what
//! it emulates and what it does not). The agent owns the pods bound to its node and
//! nothing else: it never schedules, and never touches pods on other nodes.

pub mod env;
pub mod images;
pub mod ips;
pub mod pod;
pub mod probe;
pub mod provisioner;
pub mod registration;
pub mod volumes;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use self::ips::IpPool;
use self::pod::{PodRunner, Stop};

/// Field manager for everything the agent applies.
pub const FIELD_MANAGER: &str = "oxbow-node";

/// What the Node object advertises.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    pub node_name: String,
    pub cpu: String,
    pub memory: String,
    pub max_pods: u32,
    pub kubernetes_version: String,
    pub kernel_version: String,
    pub boot_id: String,
    pub started: Time,
}

/// Read-only facts every pod runner shares.
pub struct AgentShared {
    pub client: kube::Client,
    pub node_name: String,
    pub root: PathBuf,
    /// The image map file; read at every container start so a rewritten map applies
    /// without restarting the agent.
    pub images: PathBuf,
    pub api_server: String,
    pub api_port: u16,
    pub ca_pem: String,
    pub restart_backoff_base: Duration,
    pub restart_backoff_max: Duration,
}

struct PodHandle {
    stop: watch::Sender<Option<Stop>>,
}

pub struct Agent {
    shared: Arc<AgentShared>,
    settings: NodeSettings,
    pool: Arc<Mutex<IpPool>>,
    pods: HashMap<String, PodHandle>,
}

impl Agent {
    pub fn new(shared: AgentShared, settings: NodeSettings) -> Self {
        Self {
            shared: Arc::new(shared),
            settings,
            pool: Arc::default(),
            pods: HashMap::new(),
        }
    }

    /// Runs until SIGTERM/SIGINT, then stops every pod's processes (the pod objects stay:
    /// a restarted agent starts them again, as a restarted kubelet would).
    pub async fn run(mut self) -> anyhow::Result<()> {
        for d in ["pods", "logs", "pids", "volumes"] {
            std::fs::create_dir_all(self.shared.root.join(d))?;
        }
        kill_leftovers(&self.shared.root.join("pids"));
        let client = self.shared.client.clone();
        registration::register(&client, &self.settings).await?;
        registration::renew_lease(&client, &self.settings).await?;
        let provisioner = provisioner::Provisioner {
            client: client.clone(),
            node_name: self.shared.node_name.clone(),
            volumes_dir: self.shared.root.join("volumes"),
        };
        provisioner.ensure_storage_class().await?;
        tokio::spawn(provisioner.run());
        tokio::spawn(registration::heartbeat(
            client.clone(),
            self.settings.clone(),
        ));
        tracing::info!(node = %self.shared.node_name, "node registered");

        let pods: Api<Pod> = Api::all(client.clone());
        let cfg =
            watcher::Config::default().fields(&format!("spec.nodeName={}", self.shared.node_name));
        let events = watcher(pods, cfg).default_backoff();
        let mut events = std::pin::pin!(events);
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let mut sigterm =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        // A (re)list arrives as Init, InitApply*, InitDone: buffered, so pods that vanished
        // during a watch gap are noticed and every listed pod's IP is reserved first.
        let mut relist: Option<Vec<Pod>> = None;
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(watcher::Event::Init)) => relist = Some(Vec::new()),
                    Some(Ok(watcher::Event::InitApply(p))) => match relist.as_mut() {
                        Some(buf) => buf.push(p),
                        None => self.on_pod(p, &done_tx),
                    },
                    Some(Ok(watcher::Event::InitDone)) => {
                        if let Some(buf) = relist.take() {
                            self.on_relist(buf, &done_tx);
                        }
                    }
                    Some(Ok(watcher::Event::Apply(p))) => self.on_pod(p, &done_tx),
                    Some(Ok(watcher::Event::Delete(p))) => self.on_pod_gone(&p),
                    Some(Err(e)) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                    None => anyhow::bail!("pod watch ended"),
                },
                Some(uid) = done_rx.recv() => { self.pods.remove(&uid); }
                _ = sigterm.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        tracing::info!("agent stopping: stopping every pod's processes");
        let n = self.pods.len();
        for h in self.pods.values() {
            let _ = h.stop.send(Some(Stop::AgentExit));
        }
        // Give runners time to signal their process groups before we exit.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut left = n;
        while left > 0 && tokio::time::Instant::now() < deadline {
            tokio::select! {
                Some(_) = done_rx.recv() => left -= 1,
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        Ok(())
    }

    fn on_pod(&mut self, pod: Pod, done: &tokio::sync::mpsc::UnboundedSender<String>) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let deleting = pod.metadata.deletion_timestamp.is_some();
        if let Some(h) = self.pods.get(&uid) {
            if deleting {
                let grace = pod
                    .metadata
                    .deletion_grace_period_seconds
                    .unwrap_or(30)
                    .max(0) as u64;
                let _ = h.stop.send(Some(Stop::Delete(Duration::from_secs(grace))));
            }
            return;
        }
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if deleting {
            // Nothing runs for it here (finished, or from before an agent restart).
            tokio::spawn(force_delete(self.shared.client.clone(), pod));
            return;
        }
        if phase == "Succeeded" || phase == "Failed" {
            return;
        }
        let previous_ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        let ip = {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            pool.allocate(previous_ip)
        };
        let Some(ip) = ip else {
            tracing::error!(pod = ?pod.metadata.name, "no free loopback pod IP left");
            return;
        };
        let (tx, rx) = watch::channel(None);
        self.pods.insert(uid.clone(), PodHandle { stop: tx });
        tracing::info!(ns = ?pod.metadata.namespace, pod = ?pod.metadata.name, %ip, "starting pod");
        let runner = PodRunner {
            shared: self.shared.clone(),
            pod,
            ip,
            stop: rx,
        };
        let pool = self.pool.clone();
        let done = done.clone();
        tokio::spawn(async move {
            runner.run().await;
            pool.lock().unwrap_or_else(|e| e.into_inner()).release(ip);
            let _ = done.send(uid);
        });
    }

    /// A complete list of the node's pods: stop runners of pods no longer listed, then
    /// handle each listed pod, those that already had an IP first so they keep it.
    fn on_relist(&mut self, mut pods: Vec<Pod>, done: &tokio::sync::mpsc::UnboundedSender<String>) {
        let listed: std::collections::HashSet<String> =
            pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        for (uid, h) in &self.pods {
            if !listed.contains(uid) {
                tracing::info!(%uid, "pod vanished during a watch gap; stopping it");
                let _ = h.stop.send(Some(Stop::Delete(Duration::ZERO)));
            }
        }
        pods.sort_by_key(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_none());
        for p in pods {
            self.on_pod(p, done);
        }
    }

    fn on_pod_gone(&mut self, pod: &Pod) {
        let Some(uid) = &pod.metadata.uid else { return };
        if let Some(h) = self.pods.get(uid) {
            // Force-deleted: no grace left.
            let _ = h.stop.send(Some(Stop::Delete(Duration::ZERO)));
        }
    }
}

async fn force_delete(client: kube::Client, pod: Pod) {
    let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone()) else {
        return;
    };
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    if let Err(e) = api.delete(&name, &dp).await
        && !matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
    {
        tracing::warn!(pod = %name, error = %e, "failed to delete pod");
    }
}

/// Process groups recorded by a previous agent that died without stopping them.
fn kill_leftovers(pids: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(pids) else {
        return;
    };
    for e in entries.flatten() {
        if let Some(pid) = std::fs::read_to_string(e.path())
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::remove_file(e.path());
    }
}

/// Current time as a Kubernetes timestamp.
pub fn now() -> Time {
    Time(Timestamp::now())
}
