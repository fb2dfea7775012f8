//! The stack's API server as a test sees it: a client from the stack's kubeconfig, a
//! namespace per test, and kubectl for what reads best as a command.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};

use crate::stack::{cache_dir, stack_var};
use crate::unique;
use crate::wait::wait_for_async;

/// A client of the stack's API server (`KUBECONFIG`).
pub async fn kube_client() -> kube::Client {
    let path = stack_var("KUBECONFIG");
    let kc = kube::config::Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("failed to read kubeconfig {path}: {e}"));
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("failed to load kubeconfig {path}: {e}"));
    kube::Client::try_from(cfg).expect("kube client")
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
        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        wait_for_async(
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

/// The kubectl `make up` builds, else `kubectl` on the PATH.
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
