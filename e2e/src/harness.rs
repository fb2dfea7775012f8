//! Helpers for the end-to-end tests: the stack's coordinates, polling waits with
//! messages, namespaces per test, and kubectl.
//!
//! The tests run against whatever `KUBECONFIG` and `KAFKA_BOOTSTRAP` point at; when they
//! are unset, the env file `make up` writes is read. Nothing here starts the stack.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};

fn cache_dir() -> PathBuf {
    std::env::var_os("OXBOW_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/oxbow")
        })
}

/// A variable from the environment, or else from `make up`'s env file.
pub fn stack_var(name: &str) -> String {
    if let Ok(v) = std::env::var(name)
        && !v.is_empty()
    {
        return v;
    }
    let env_file = cache_dir().join("stack/env");
    let text = std::fs::read_to_string(&env_file).unwrap_or_else(|_| {
        panic!(
            "{name} is not set and {} does not exist: run `make up` first",
            env_file.display()
        )
    });
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("{name} is missing from {}", env_file.display()))
}

pub fn kafka_bootstrap() -> String {
    stack_var("KAFKA_BOOTSTRAP")
}

pub async fn kube_client() -> kube::Client {
    let path = stack_var("KUBECONFIG");
    let kc = kube::config::Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("failed to read kubeconfig {path}: {e}"));
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("failed to load kubeconfig {path}: {e}"));
    kube::Client::try_from(cfg).expect("kube client")
}

/// Polls `check` every 200 ms until it returns `Ok`, or panics after `timeout` naming
/// what did not happen and the last thing observed.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) => {
                if start.elapsed() > timeout {
                    panic!("timed out after {timeout:?} waiting for {what}; last observed: {last}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A short random suffix so concurrent or repeated runs never collide.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}{:04x}",
        std::process::id() & 0xfff,
        nanos & 0xffff
    )
}

/// A namespace for one test. Deleted by `delete()`; a failed test leaves it for
/// inspection (`kubectl get all -n <name>`).
pub struct TestNamespace {
    pub name: String,
    client: kube::Client,
}

impl TestNamespace {
    pub async fn create(client: &kube::Client, prefix: &str) -> Self {
        let name = unique(prefix);
        let api: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
            .expect("namespace");
        api.create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("failed to create namespace {name}: {e}"));
        // Pods need the namespace's default ServiceAccount (the controller-manager makes it).
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        wait_for(
            "the namespace's default ServiceAccount",
            Duration::from_secs(30),
            || async {
                sa.get_opt("default")
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| "absent".to_string())
            },
        )
        .await;
        Self {
            name,
            client: client.clone(),
        }
    }

    pub async fn delete(self) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let _ = api.delete(&self.name, &DeleteParams::default()).await;
    }
}

pub fn kubectl_path() -> PathBuf {
    let version = std::env::var("K8S_VERSION").unwrap_or_else(|_| "v1.34.4".into());
    let p = cache_dir().join("k8s").join(version).join("bin/kubectl");
    if p.exists() {
        p
    } else {
        PathBuf::from("kubectl")
    }
}

/// Runs kubectl against the stack with `stdin`; returns (success, stdout, stderr).
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    let mut cmd = std::process::Command::new(kubectl_path());
    cmd.args(args)
        .env("KUBECONFIG", stack_var("KUBECONFIG"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("failed to run kubectl ({}): {e}", kubectl_path().display()));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
