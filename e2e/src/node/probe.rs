//! Readiness, liveness and startup probes.
//!
//! Owns one probe's schedule and thresholds; it reports transitions and never touches
//! processes itself (the container runner decides what a failed liveness probe means).

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// What a probe needs to run against one container instance.
#[derive(Clone)]
pub struct ProbeTarget {
    pub pod_ip: String,
    pub container: Container,
    /// The container's resolved environment and mounts, for exec probes.
    pub env: Vec<(String, String)>,
    pub cwd: std::path::PathBuf,
    pub http: reqwest::Client,
}

pub enum Outcome {
    Success,
    Failure(String),
}

impl ProbeTarget {
    fn port(&self, p: &IntOrString) -> Result<u16, String> {
        match p {
            IntOrString::Int(n) => {
                u16::try_from(*n).map_err(|_| format!("port {n} is out of range"))
            }
            IntOrString::String(name) => self
                .container
                .ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(name))
                .and_then(|cp| u16::try_from(cp.container_port).ok())
                .ok_or_else(|| format!("named port {name} is not declared by the container")),
        }
    }

    pub async fn run(&self, probe: &Probe) -> Outcome {
        let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
        match tokio::time::timeout(timeout, self.run_inner(probe)).await {
            Ok(o) => o,
            Err(_) => Outcome::Failure(format!("probe timed out after {}s", timeout.as_secs())),
        }
    }

    async fn run_inner(&self, probe: &Probe) -> Outcome {
        if let Some(h) = &probe.http_get {
            if h.scheme
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case("https"))
            {
                return Outcome::Failure(
                    "HTTPS probes are not supported by the local node agent".into(),
                );
            }
            let port = match self.port(&h.port) {
                Ok(p) => p,
                Err(e) => return Outcome::Failure(e),
            };
            let host = h.host.clone().unwrap_or_else(|| self.pod_ip.clone());
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            let url = format!("http://{host}:{port}{path}");
            let mut req = self.http.get(&url);
            for hdr in h.http_headers.iter().flatten() {
                req = req.header(&hdr.name, &hdr.value);
            }
            return match req.send().await {
                Ok(r) if (200..400).contains(&r.status().as_u16()) => Outcome::Success,
                Ok(r) => Outcome::Failure(format!(
                    "HTTP probe failed with statuscode: {}",
                    r.status().as_u16()
                )),
                Err(e) => Outcome::Failure(format!("Get \"{url}\": {e}")),
            };
        }
        if let Some(t) = &probe.tcp_socket {
            let port = match self.port(&t.port) {
                Ok(p) => p,
                Err(e) => return Outcome::Failure(e),
            };
            let host = t.host.clone().unwrap_or_else(|| self.pod_ip.clone());
            let addr: Result<SocketAddr, _> = format!("{host}:{port}").parse();
            return match addr {
                Ok(a) => match tokio::net::TcpStream::connect(a).await {
                    Ok(_) => Outcome::Success,
                    Err(e) => Outcome::Failure(format!("dial tcp {a}: {e}")),
                },
                Err(e) => Outcome::Failure(format!("bad probe address {host}:{port}: {e}")),
            };
        }
        if let Some(e) = &probe.exec {
            let cmd = e.command.clone().unwrap_or_default();
            let Some((prog, args)) = cmd.split_first() else {
                return Outcome::Failure("exec probe has an empty command".into());
            };
            let status = tokio::process::Command::new(prog)
                .args(args)
                .env_clear()
                .envs(self.env.iter().cloned())
                .current_dir(&self.cwd)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .status()
                .await;
            return match status {
                Ok(s) if s.success() => Outcome::Success,
                Ok(s) => Outcome::Failure(format!("command {cmd:?} exited with {s}")),
                Err(err) => Outcome::Failure(format!("command {cmd:?} could not start: {err}")),
            };
        }
        Outcome::Failure("probe has no handler the local node agent supports (grpc is not)".into())
    }
}

/// Runs `probe` on its schedule and calls `on_change(ok, message)` when the thresholded
/// result flips (starting from `initial`), and once when `failureThreshold` consecutive
/// failures accumulate while already failing (a startup probe that never succeeds).
/// Returns when `on_change` returns false.
pub async fn watch(
    target: ProbeTarget,
    probe: Probe,
    initial: bool,
    mut on_change: impl FnMut(bool, String) -> bool,
) {
    let delay = Duration::from_secs(probe.initial_delay_seconds.unwrap_or(0).max(0) as u64);
    let period = Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
    let success_threshold = probe.success_threshold.unwrap_or(1).max(1);
    let failure_threshold = probe.failure_threshold.unwrap_or(3).max(1);
    tokio::time::sleep(delay).await;
    let mut state = initial;
    let (mut successes, mut failures) = (0, 0);
    loop {
        match target.run(&probe).await {
            Outcome::Success => {
                successes += 1;
                failures = 0;
                if !state && successes >= success_threshold {
                    state = true;
                    if !on_change(true, String::new()) {
                        return;
                    }
                }
            }
            Outcome::Failure(msg) => {
                failures += 1;
                successes = 0;
                if state && failures >= failure_threshold {
                    state = false;
                    if !on_change(false, msg) {
                        return;
                    }
                } else if !state && failures == failure_threshold && !on_change(false, msg) {
                    return;
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}
