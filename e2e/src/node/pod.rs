//! One pod on this node: its volumes, its containers as process groups, its probes and
//! its status.
//!
//! Owns `<root>/pods/<uid>/` and the pod's `status` (written with strategic merge so the
//! scheduler's `PodScheduled` condition is kept). It must not touch other pods or the
//! PV directories' contents.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use super::AgentShared;
use super::env::{EnvSources, expand, resolve_env, rewrite_paths};
use super::images::ImageMap;
use super::probe::{self, ProbeTarget};
use super::volumes::{self, DataSource, VolumeContext};

/// Why a pod's containers stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The pod is being deleted, with this grace period: stop, then remove the object.
    Delete(Duration),
    /// The agent itself is stopping: stop the processes, keep the pod object and its
    /// directory so a restarted agent runs the pod again, as a restarted kubelet would.
    AgentExit,
}

impl Stop {
    pub fn grace(self) -> Duration {
        match self {
            Stop::Delete(g) => g,
            Stop::AgentExit => Duration::from_secs(5),
        }
    }
}

/// How a pod's containers are asked to stop: `Some(stop)` once they must.
pub type StopSignal = watch::Receiver<Option<Stop>>;

#[derive(Debug, Clone)]
enum CState {
    Waiting {
        reason: String,
        message: String,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        message: String,
        started_at: Timestamp,
        finished_at: Timestamp,
    },
}

impl CState {
    fn to_json(&self) -> Value {
        let t = |ts: &Timestamp| serde_json::to_value(Time(*ts)).unwrap_or(Value::Null);
        match self {
            CState::Waiting { reason, message } => {
                json!({"waiting": {"reason": reason, "message": message}})
            }
            CState::Running { started_at } => json!({"running": {"startedAt": t(started_at)}}),
            CState::Terminated {
                exit_code,
                reason,
                message,
                started_at,
                finished_at,
            } => json!({"terminated": {
                "exitCode": exit_code, "reason": reason, "message": message,
                "startedAt": t(started_at), "finishedAt": t(finished_at)}}),
        }
    }
}

#[derive(Debug, Clone)]
struct ContainerRec {
    image: String,
    binary: String,
    state: CState,
    last_state: Option<CState>,
    ready: bool,
    started: bool,
    restart_count: i32,
    pid: Option<i32>,
    /// Still going to run (restarting or running); false once it will never run again.
    alive: bool,
}

#[derive(Debug, Default)]
struct PodState {
    containers: BTreeMap<String, ContainerRec>,
    init: BTreeMap<String, ContainerRec>,
    initialized: bool,
    start_time: Option<Timestamp>,
}

pub struct PodRunner {
    pub shared: Arc<AgentShared>,
    pub pod: Pod,
    pub ip: Ipv4Addr,
    pub stop: StopSignal,
}

struct Ctx {
    shared: Arc<AgentShared>,
    pod: Pod,
    ns: String,
    name: String,
    uid: String,
    ip: Ipv4Addr,
    dir: PathBuf,
    state: Mutex<PodState>,
    changed: Notify,
    http: reqwest::Client,
}

impl Ctx {
    fn with_state<T>(&self, f: impl FnOnce(&mut PodState) -> T) -> T {
        // A poisoned lock means a status writer panicked mid-update; the data is plain
        // values, so taking it over is safe and keeps the pod manageable.
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let out = f(&mut guard);
        drop(guard);
        self.changed.notify_one();
        out
    }

    fn log_path(&self, container: &str) -> PathBuf {
        self.shared
            .root
            .join("logs")
            .join(format!("{}_{}_{}.log", self.ns, self.name, container))
    }

    fn pid_path(&self, container: &str) -> PathBuf {
        self.shared
            .root
            .join("pids")
            .join(format!("{}-{}.pid", self.uid, container))
    }
}

impl PodRunner {
    pub async fn run(self) {
        let meta = &self.pod.metadata;
        let ctx = Arc::new(Ctx {
            ns: meta.namespace.clone().unwrap_or_else(|| "default".into()),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            dir: self
                .shared
                .root
                .join("pods")
                .join(meta.uid.clone().unwrap_or_default()),
            shared: self.shared.clone(),
            pod: self.pod.clone(),
            ip: self.ip,
            state: Mutex::new(PodState {
                start_time: Some(Timestamp::now()),
                ..Default::default()
            }),
            changed: Notify::new(),
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap_or_else(|_| reqwest::Client::new()),
        });
        let spec = self.pod.spec.clone().unwrap_or_default();
        ctx.with_state(|s| {
            for (set, list) in [
                (&mut s.init, spec.init_containers.clone()),
                (&mut s.containers, Some(spec.containers.clone())),
            ] {
                for c in list.into_iter().flatten() {
                    set.insert(
                        c.name.clone(),
                        ContainerRec {
                            image: c.image.clone().unwrap_or_default(),
                            binary: String::new(),
                            state: CState::Waiting {
                                reason: "ContainerCreating".into(),
                                message: String::new(),
                            },
                            last_state: None,
                            ready: false,
                            started: false,
                            restart_count: 0,
                            pid: None,
                            alive: true,
                        },
                    );
                }
            }
        });
        let writer = tokio::spawn(status_writer(ctx.clone()));
        let mut stop = self.stop.clone();
        // Containers (init ones included) run in their own task, so a stop never drops a
        // process handle: each container observes the signal and terminates itself.
        let mut pod_task = tokio::spawn(run_pod(ctx.clone(), stop.clone()));
        let mut finished = false;
        let reason = tokio::select! {
            _ = &mut pod_task => {
                finished = true;
                // Every container has finished for good (restartPolicy Never/OnFailure):
                // the pod stays, with its final status, until someone deletes it.
                wait_stop(&mut stop).await
            }
            s = wait_stop(&mut stop) => s,
        };
        if !finished
            && tokio::time::timeout(reason.grace() + Duration::from_secs(10), &mut pod_task)
                .await
                .is_err()
        {
            tracing::warn!(pod = %ctx.name, "containers did not stop in time");
            pod_task.abort();
        }
        ctx.changed.notify_one();
        tokio::time::sleep(Duration::from_millis(200)).await;
        writer.abort();
        if reason == Stop::AgentExit {
            tracing::info!(ns = %ctx.ns, pod = %ctx.name, "pod processes stopped with the agent");
            return;
        }
        // The kubelet's last word: remove the object now that no process is left.
        let pods: Api<Pod> = Api::namespaced(ctx.shared.client.clone(), &ctx.ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(ctx.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match pods.delete(&ctx.name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                tracing::warn!(pod = %ctx.name, error = %e, "failed to delete terminated pod")
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&ctx.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %ctx.dir.display(), error = %e, "failed to remove pod directory");
        }
        tracing::info!(ns = %ctx.ns, pod = %ctx.name, "pod terminated");
    }
}

async fn wait_stop(stop: &mut StopSignal) -> Stop {
    loop {
        if let Some(s) = *stop.borrow() {
            return s;
        }
        if stop.changed().await.is_err() {
            return Stop::AgentExit;
        }
    }
}

fn restart_policy(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into())
}

async fn run_pod(ctx: Arc<Ctx>, stop: StopSignal) {
    let spec = ctx.pod.spec.clone().unwrap_or_default();
    // Volumes, configuration and credentials: retried until they work or the pod goes.
    let prepared = loop {
        match prepare(&ctx).await {
            Ok(p) => break p,
            Err(msg) => {
                ctx.with_state(|s| {
                    for c in s.init.values_mut().chain(s.containers.values_mut()) {
                        c.state = CState::Waiting {
                            reason: "ContainerCreating".into(),
                            message: msg.clone(),
                        };
                    }
                });
                tracing::info!(pod = %ctx.name, reason = %msg, "pod not startable yet");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let prepared = Arc::new(prepared);
    for c in spec.init_containers.clone().unwrap_or_default() {
        loop {
            let code =
                run_container(ctx.clone(), prepared.clone(), c.clone(), true, stop.clone()).await;
            if code == Some(0) {
                break;
            }
            if code.is_none() || restart_policy(&ctx.pod) == "Never" {
                return;
            }
        }
    }
    ctx.with_state(|s| s.initialized = true);
    let runs = spec.containers.iter().map(|c| {
        tokio::spawn(run_container(
            ctx.clone(),
            prepared.clone(),
            c.clone(),
            false,
            stop.clone(),
        ))
    });
    futures::future::join_all(runs).await;
}

struct Prepared {
    volume_dirs: HashMap<String, PathBuf>,
    env: EnvSources,
    kubeconfig: PathBuf,
}

async fn prepare(ctx: &Ctx) -> Result<Prepared, String> {
    std::fs::create_dir_all(&ctx.dir)
        .map_err(|e| format!("failed to create pod directory: {e}"))?;
    let mut env = EnvSources {
        pod_ip: ctx.ip.to_string(),
        host_ip: "127.0.0.1".into(),
        node_name: ctx.shared.node_name.clone(),
        ..Default::default()
    };
    // Read every ConfigMap and Secret the pod refers to, so resolution stays pure.
    let spec = ctx.pod.spec.clone().unwrap_or_default();
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    for c in all {
        for e in c.env.iter().flatten() {
            if let Some(v) = &e.value_from {
                if let Some(r) = &v.config_map_key_ref {
                    cms.push(r.name.clone());
                }
                if let Some(r) = &v.secret_key_ref {
                    secrets.push(r.name.clone());
                }
            }
        }
        for f in c.env_from.iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                cms.push(r.name.clone());
            }
            if let Some(r) = &f.secret_ref {
                secrets.push(r.name.clone());
            }
        }
    }
    for (source, names) in [(DataSource::ConfigMap, cms), (DataSource::Secret, secrets)] {
        for name in names {
            let data = volumes::object_data(&ctx.shared.client, &ctx.ns, source, &name)
                .await
                .map_err(|e| format!("failed to read {source:?} {name}: {e}"))?;
            if let Some(data) = data {
                // Env values are text; invalid UTF-8 is replaced, as the kubelet does.
                let text = data
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                    .collect();
                match source {
                    DataSource::ConfigMap => env.config_maps.insert(name, text),
                    DataSource::Secret => env.secrets.insert(name, text),
                };
            }
        }
    }
    let cx = VolumeContext {
        client: &ctx.shared.client,
        pod: &ctx.pod,
        pod_dir: &ctx.dir,
        env: &env,
    };
    let volume_dirs = volumes::prepare(&cx).await.map_err(|e| e.to_string())?;
    // The pod's own credentials: a kubeconfig with a pod-bound ServiceAccount token, so
    // kube-rs `Config::infer()` (and client-go) work unchanged and RBAC applies.
    let token = volumes::request_token(&ctx.shared.client, &ctx.pod, vec![], None)
        .await
        .map_err(|e| format!("failed to request a ServiceAccount token: {e}"))?;
    let kubeconfig = ctx.dir.join("kubeconfig");
    let ca = k8s_openapi::ByteString(ctx.shared.ca_pem.clone().into_bytes());
    let ca_b64 = serde_json::to_value(&ca)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca_b64}\nusers:\n- name: pod\n  user:\n    token: {token}\ncontexts:\n- name: pod\n  context:\n    cluster: local\n    user: pod\n    namespace: {ns}\ncurrent-context: pod\n",
        server = ctx.shared.api_server,
        ns = ctx.ns,
    );
    std::fs::write(&kubeconfig, kc).map_err(|e| format!("failed to write pod kubeconfig: {e}"))?;
    Ok(Prepared {
        volume_dirs,
        env,
        kubeconfig,
    })
}

/// Runs one container until it is done for good. Returns its last exit code, or `None`
/// when the pod was stopped or the container could never start.
async fn run_container(
    ctx: Arc<Ctx>,
    mut prepared: Arc<Prepared>,
    c: Container,
    is_init: bool,
    mut stop: StopSignal,
) -> Option<i32> {
    let set = |ctx: &Ctx, f: &dyn Fn(&mut ContainerRec)| {
        ctx.with_state(|s| {
            let map = if is_init {
                &mut s.init
            } else {
                &mut s.containers
            };
            if let Some(r) = map.get_mut(&c.name) {
                f(r);
            }
        })
    };
    let policy = match (is_init, restart_policy(&ctx.pod).as_str()) {
        // Init containers are retried unless the pod never restarts anything.
        (true, "Never") => "Never".to_string(),
        (true, _) => "OnFailure".to_string(),
        (false, p) => p.to_string(),
    };
    let mut backoff = ctx.shared.restart_backoff_base;
    loop {
        let launched = launch(&ctx, &prepared, &c);
        let (mut child, argv_env) = match launched {
            Ok(v) => v,
            Err((reason, message)) => {
                set(&ctx, &|r| {
                    r.state = CState::Waiting {
                        reason: reason.clone(),
                        message: message.clone(),
                    }
                });
                tracing::warn!(pod = %ctx.name, container = %c.name, %reason, %message, "container cannot start");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(5)) => continue,
                    _ = wait_stop(&mut stop) => {
                        set(&ctx, &|r| r.alive = false);
                        return None;
                    }
                }
            }
        };
        let pid = child.id().and_then(|p| i32::try_from(p).ok());
        let started_at = Timestamp::now();
        let t0 = Instant::now();
        if let Some(pid) = pid {
            let _ = std::fs::write(ctx.pid_path(&c.name), pid.to_string());
        }
        let has_startup = c.startup_probe.is_some();
        let has_readiness = c.readiness_probe.is_some();
        set(&ctx, &|r| {
            r.state = CState::Running { started_at };
            r.pid = pid;
            r.started = !has_startup;
            r.ready = !has_readiness && !has_startup && !is_init;
        });
        tracing::info!(pod = %ctx.name, container = %c.name, ?pid, "container started");

        let (kill_tx, mut kill_rx) = tokio::sync::mpsc::channel::<String>(1);
        let probes = if is_init {
            None
        } else {
            Some(tokio::spawn(run_probes(
                ctx.clone(),
                c.clone(),
                argv_env,
                kill_tx,
            )))
        };
        let mut killed_for: Option<String> = None;
        let mut stopping: Option<Stop> = None;
        let status = tokio::select! {
            st = child.wait() => st.ok(),
            Some(why) = kill_rx.recv() => { killed_for = Some(why); None }
            g = wait_stop(&mut stop) => { stopping = Some(g); None }
        };
        if let Some(p) = probes {
            p.abort();
        }
        let status = match status {
            Some(s) => Some(s),
            None => {
                let grace = stopping
                    .map(Stop::grace)
                    .unwrap_or_else(|| termination_grace(&ctx.pod));
                terminate(pid, &mut child, grace, &mut stop).await
            }
        };
        let _ = std::fs::remove_file(ctx.pid_path(&c.name));
        let exit_code = status.map(exit_code_of).unwrap_or(137);
        let (reason, message) = match (&killed_for, exit_code) {
            (Some(why), _) => ("Error".to_string(), why.clone()),
            (None, 0) => ("Completed".to_string(), String::new()),
            (None, 137) => ("Error".to_string(), "killed (SIGKILL)".to_string()),
            (None, _) => ("Error".to_string(), String::new()),
        };
        let terminated = CState::Terminated {
            exit_code,
            reason,
            message,
            started_at,
            finished_at: Timestamp::now(),
        };
        tracing::info!(pod = %ctx.name, container = %c.name, exit_code, "container exited");
        if stopping.is_some() || stop.borrow().is_some() {
            set(&ctx, &|r| {
                r.state = terminated.clone();
                r.pid = None;
                r.ready = false;
                r.alive = false;
            });
            return None;
        }
        let restart = match policy.as_str() {
            "Always" => true,
            "OnFailure" => exit_code != 0,
            _ => false,
        };
        if !restart {
            set(&ctx, &|r| {
                r.state = terminated.clone();
                r.pid = None;
                r.ready = false;
                r.alive = false;
            });
            return Some(exit_code);
        }
        // A container that ran for a while starts its back-off afresh, as the kubelet does.
        if t0.elapsed() > ctx.shared.restart_backoff_max * 2 {
            backoff = ctx.shared.restart_backoff_base;
        }
        let msg = format!(
            "back-off {}s restarting failed container={} pod={}",
            backoff.as_secs_f32(),
            c.name,
            ctx.name
        );
        set(&ctx, &|r| {
            r.last_state = Some(terminated.clone());
            r.state = CState::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: msg.clone(),
            };
            r.pid = None;
            r.ready = false;
            r.restart_count += 1;
        });
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = wait_stop(&mut stop) => {
                set(&ctx, &|r| r.alive = false);
                return None;
            }
        }
        backoff = (backoff * 2).min(ctx.shared.restart_backoff_max);
        // A restarted container sees its ConfigMaps and Secrets as they are now, as the
        // kubelet's volume sync and env resolution give it: a container that failed on
        // a broken ConfigMap recovers once the ConfigMap is put back. Where they cannot
        // be read, it keeps what it had.
        match prepare(&ctx).await {
            Ok(p) => prepared = Arc::new(p),
            Err(msg) => tracing::info!(pod = %ctx.name, reason = %msg, "kept the previous volumes"),
        }
        if is_init {
            return Some(exit_code);
        }
    }
}

fn termination_grace(pod: &Pod) -> Duration {
    let s = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    Duration::from_secs(s.max(0) as u64)
}

fn exit_code_of(s: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code()
        .or_else(|| s.signal().map(|sig| 128 + sig))
        .unwrap_or(255)
}

/// SIGTERM to the container's process group, SIGKILL after `grace`.
/// SIGTERM to the container's process group, SIGKILL after `grace`, or at once when a
/// shorter grace arrives meanwhile (a force delete during a graceful one).
async fn terminate(
    pid: Option<i32>,
    child: &mut tokio::process::Child,
    grace: Duration,
    stop: &mut StopSignal,
) -> Option<std::process::ExitStatus> {
    let group = pid.map(Pid::from_raw);
    if let Some(g) = group {
        let _ = killpg(g, Signal::SIGTERM);
    }
    let mut deadline = tokio::time::Instant::now() + grace;
    let status = loop {
        tokio::select! {
            s = child.wait() => break s.ok(),
            _ = tokio::time::sleep_until(deadline) => {
                if let Some(g) = group {
                    let _ = killpg(g, Signal::SIGKILL);
                }
                break child.wait().await.ok();
            }
            changed = stop.changed() => {
                if changed.is_err() {
                    continue;
                }
                if let Some(Stop::Delete(g)) = *stop.borrow() {
                    deadline = deadline.min(tokio::time::Instant::now() + g);
                }
            }
        }
    };
    if let Some(g) = group {
        // Reap helpers the container left in its group.
        let _ = killpg(g, Signal::SIGKILL);
    }
    status
}

type Launched = (tokio::process::Child, (Vec<(String, String)>, PathBuf));

fn launch(ctx: &Ctx, prepared: &Prepared, c: &Container) -> Result<Launched, (String, String)> {
    let image = c.image.clone().unwrap_or_default();
    let images =
        ImageMap::load(&ctx.shared.images).map_err(|e| ("ErrImageNeverPull".to_string(), e))?;
    let binary = images.resolve(&image).cloned().ok_or_else(|| {
        (
            "ErrImageNeverPull".to_string(),
            format!(
                "image {image:?} is not mapped to a local binary (see the node agent's images file)"
            ),
        )
    })?;
    if !binary.is_file() {
        return Err((
            "ErrImageNeverPull".into(),
            format!(
                "image {image:?} maps to {} which does not exist: build it first",
                binary.display()
            ),
        ));
    }
    let mounts = volumes::container_mounts(c.volume_mounts.as_ref(), &prepared.volume_dirs);
    let resolved = resolve_env(&ctx.pod, c, &prepared.env)
        .map_err(|e| ("CreateContainerConfigError".to_string(), e.to_string()))?;
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOSTNAME".into(), ctx.name.clone()),
        ("HOME".into(), ctx.dir.to_string_lossy().into_owned()),
        ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
        (
            "KUBERNETES_SERVICE_PORT".into(),
            ctx.shared.api_port.to_string(),
        ),
        (
            "KUBECONFIG".into(),
            prepared.kubeconfig.to_string_lossy().into_owned(),
        ),
        ("POD_IP".into(), ctx.ip.to_string()),
    ];
    for (k, v) in resolved {
        let v = rewrite_paths(&v, &mounts);
        match env.iter_mut().find(|(name, _)| *name == k) {
            Some(slot) => slot.1 = v,
            None => env.push((k, v)),
        }
    }
    let lookup = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let argv: Vec<String> = c
        .command
        .iter()
        .flatten()
        .skip(1)
        .chain(c.args.iter().flatten())
        .map(|a| rewrite_paths(&expand(a, lookup), &mounts))
        .collect();
    let cwd = match &c.working_dir {
        Some(w) => PathBuf::from(rewrite_paths(w, &mounts)),
        None => ctx.dir.join("containers").join(&c.name),
    };
    std::fs::create_dir_all(&cwd).map_err(|e| {
        (
            "RunContainerError".to_string(),
            format!("failed to create working directory {}: {e}", cwd.display()),
        )
    })?;
    let log = open_log(&ctx.log_path(&c.name), &binary, &argv).map_err(|e| {
        (
            "RunContainerError".to_string(),
            format!("failed to open log file: {e}"),
        )
    })?;
    let log2 = log
        .try_clone()
        .map_err(|e| ("RunContainerError".to_string(), e.to_string()))?;
    let child = tokio::process::Command::new(&binary)
        .args(&argv)
        .env_clear()
        .envs(env.iter().cloned())
        .current_dir(&cwd)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2)
        .process_group(0)
        .spawn()
        .map_err(|e| {
            (
                "RunContainerError".to_string(),
                format!("failed to start {}: {e}", binary.display()),
            )
        })?;
    ctx.with_state(|s| {
        if let Some(r) = s.containers.get_mut(&c.name).or(s.init.get_mut(&c.name)) {
            r.binary = binary.to_string_lossy().into_owned();
        }
    });
    Ok((child, (env, cwd)))
}

fn open_log(path: &Path, binary: &Path, argv: &[String]) -> std::io::Result<std::fs::File> {
    use std::io::Write;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(
        f,
        "--- oxbow-node {}: starting {} {:?}",
        Timestamp::now(),
        binary.display(),
        argv
    )?;
    Ok(f)
}

async fn run_probes(
    ctx: Arc<Ctx>,
    c: Container,
    (env, cwd): (Vec<(String, String)>, PathBuf),
    kill: tokio::sync::mpsc::Sender<String>,
) {
    let target = ProbeTarget {
        pod_ip: ctx.ip.to_string(),
        container: c.clone(),
        env,
        cwd,
        http: ctx.http.clone(),
    };
    let set = |f: &dyn Fn(&mut ContainerRec)| {
        ctx.with_state(|s| {
            if let Some(r) = s.containers.get_mut(&c.name) {
                f(r);
            }
        })
    };
    if let Some(p) = c.startup_probe.clone() {
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
        let mut tx = Some(tx);
        probe::watch(target.clone(), p, false, |ok, msg| {
            if let Some(tx) = tx.take() {
                let _ = tx.send(if ok { Ok(()) } else { Err(msg) });
            }
            false
        })
        .await;
        match rx.await {
            Ok(Ok(())) => set(&|r| r.started = true),
            Ok(Err(msg)) => {
                let _ = kill.send(format!("Startup probe failed: {msg}")).await;
                return;
            }
            Err(_) => return,
        }
    }
    let readiness = async {
        match c.readiness_probe.clone() {
            Some(p) => {
                probe::watch(target.clone(), p, false, |ok, msg| {
                    set(&|r| r.ready = ok);
                    if !ok && !msg.is_empty() {
                        tracing::debug!(pod = %ctx.name, container = %c.name, %msg, "readiness probe failed");
                    }
                    true
                })
                .await
            }
            None => set(&|r| r.ready = true),
        }
    };
    let liveness = async {
        if let Some(p) = c.liveness_probe.clone() {
            let kill = kill.clone();
            let mut fired: Option<String> = None;
            probe::watch(target.clone(), p, true, |ok, msg| {
                if ok {
                    return true;
                }
                fired = Some(msg);
                false
            })
            .await;
            if let Some(msg) = fired {
                tracing::info!(pod = %ctx.name, container = %c.name, %msg, "liveness probe failed; restarting container");
                let _ = kill.send(format!("Liveness probe failed: {msg}")).await;
            }
        }
    };
    tokio::join!(readiness, liveness);
}

/// Writes the pod's status whenever it changes (and at least every 30 s).
async fn status_writer(ctx: Arc<Ctx>) {
    let pods: Api<Pod> = Api::namespaced(ctx.shared.client.clone(), &ctx.ns);
    let mut last: Option<Value> = None;
    // Condition type -> (status, lastTransitionTime), so times move only on a flip.
    let mut transitions: HashMap<String, (Value, Value)> = HashMap::new();
    loop {
        let status = {
            let guard = ctx.state.lock().unwrap_or_else(|e| e.into_inner());
            build_status(&guard, &ctx)
        };
        if last.as_ref() != Some(&status) {
            let mut stamped = status.clone();
            let now = serde_json::to_value(Time(Timestamp::now())).unwrap_or(Value::Null);
            if let Some(conds) = stamped["conditions"].as_array_mut() {
                for c in conds {
                    let t = c["type"].as_str().unwrap_or_default().to_string();
                    let entry = transitions
                        .entry(t)
                        .or_insert_with(|| (c["status"].clone(), now.clone()));
                    if entry.0 != c["status"] {
                        *entry = (c["status"].clone(), now.clone());
                    }
                    c["lastTransitionTime"] = entry.1.clone();
                }
            }
            let patch = json!({"status": stamped});
            match pods
                .patch_status(&ctx.name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Ok(_) => last = Some(status),
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => {
                    tracing::warn!(pod = %ctx.name, error = %e, "failed to write pod status; retrying")
                }
            }
        }
        tokio::select! {
            _ = ctx.changed.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(if last.is_some() { 30 } else { 1 })) => {}
        }
        // Coalesce bursts of changes (a container start flips several fields).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pod status as the kubelet would report it, without transition times.
fn build_status(s: &PodState, ctx: &Ctx) -> Value {
    let to_json = |(name, r): (&String, &ContainerRec)| {
        let mut v = json!({
            "name": name,
            "image": r.image,
            "imageID": format!("oxbow-local://{}", r.binary),
            "ready": r.ready,
            "started": r.started,
            "restartCount": r.restart_count,
            "state": r.state.to_json(),
            "lastState": r.last_state.as_ref().map(CState::to_json).unwrap_or_else(|| json!({})),
        });
        if let Some(pid) = r.pid {
            v["containerID"] = json!(format!("oxbow://{}/{pid}", ctx.uid));
        }
        v
    };
    let containers = &s.containers;
    let all_ready = !containers.is_empty() && containers.values().all(|r| r.ready);
    let any_alive = containers.values().any(|r| r.alive);
    let has_run = containers
        .values()
        .any(|r| !matches!(r.state, CState::Waiting { .. }) || r.restart_count > 0);
    let all_succeeded = containers
        .values()
        .all(|r| matches!(r.state, CState::Terminated { exit_code: 0, .. }));
    let init_failed = s.init.values().any(|r| {
        !r.alive && matches!(r.state, CState::Terminated { exit_code, .. } if exit_code != 0)
    });
    let phase = if init_failed {
        "Failed"
    } else if !s.initialized || !has_run {
        "Pending"
    } else if any_alive {
        "Running"
    } else if all_succeeded {
        "Succeeded"
    } else {
        "Failed"
    };
    let cond = |t: &str, ok: bool, reason: &str, message: &str| {
        let mut c =
            json!({"type": t, "status": if ok { "True" } else { "False" }, "lastProbeTime": null});
        if !ok {
            c["reason"] = json!(reason);
            c["message"] = json!(message);
        }
        c
    };
    let not_ready: Vec<&str> = containers
        .iter()
        .filter(|(_, r)| !r.ready)
        .map(|(n, _)| n.as_str())
        .collect();
    let msg = format!("containers with unready status: [{}]", not_ready.join(" "));
    json!({
        "phase": phase,
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": ctx.ip.to_string(),
        "podIPs": [{"ip": ctx.ip.to_string()}],
        "startTime": s.start_time.map(|t| serde_json::to_value(Time(t)).unwrap_or(Value::Null)),
        "conditions": [
            cond("PodReadyToStartContainers", true, "", ""),
            cond("Initialized", s.initialized, "ContainersNotInitialized", "containers with incomplete status"),
            cond("Ready", all_ready, "ContainersNotReady", &msg),
            cond("ContainersReady", all_ready, "ContainersNotReady", &msg),
            cond("PodScheduled", true, "", ""),
        ],
        "initContainerStatuses": s.init.iter().map(to_json).collect::<Vec<_>>(),
        "containerStatuses": containers.iter().map(to_json).collect::<Vec<_>>(),
    })
}
