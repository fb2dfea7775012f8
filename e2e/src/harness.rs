//! Helpers for the end-to-end and operator tests: the operator process, the CRD, helm,
//! StreamApp waits and the suite's Kafka calls. What every crate's tests share (the
//! stack's coordinates, waits with a deadline, namespaces per test, kubectl, Kafka) is
//! `oxbow-testkit`'s, re-exported here.
//!
//! The tests run against whatever `KUBECONFIG` and `KAFKA_BOOTSTRAP` point at; when they
//! are unset, the env file `make up` writes is read. Nothing here starts the stack.
//!
//! The same suite runs on a kind cluster (`e2e/kind/run.sh`, `OXBOW_E2E_TARGET=kind`):
//! there pods reach Kafka at `KAFKA_BOOTSTRAP_IN_CLUSTER` while the test process uses
//! `KAFKA_BOOTSTRAP`, [`OperatorProcess`] stands for the operator the Helm chart
//! installed, and tests that need the local node agent skip themselves
//! ([`requires_local_stack`]).

use std::path::PathBuf;
use std::time::Duration;

pub use oxbow_testkit::kube::{TestNamespace, kube_client, kubectl, kubectl_path};
pub use oxbow_testkit::stack::{cache_dir, kafka_bootstrap, stack_var, stack_var_opt};
pub use oxbow_testkit::unique;
pub use oxbow_testkit::wait::{Deadline, wait_for_async as wait_for};

/// Kafka's bootstrap servers for pods, what the StreamApps the tests write put in
/// `spec.kafka.bootstrapServers`: `KAFKA_BOOTSTRAP_IN_CLUSTER` when set (on kind, the
/// in-cluster Service), else [`kafka_bootstrap`] (on the local stack pods share the
/// host's network, so both are the same address).
pub fn kafka_bootstrap_in_cluster() -> String {
    match std::env::var("KAFKA_BOOTSTRAP_IN_CLUSTER") {
        Ok(v) if !v.is_empty() => v,
        _ => kafka_bootstrap(),
    }
}

/// What pods put in `spec.kafka.bootstrapServers` for the stack's secured listener
/// `name` (`KAFKA_BOOTSTRAP_SASL_SSL`, `KAFKA_BOOTSTRAP_MTLS`): `<name>_IN_CLUSTER` when
/// the stack sets it (the local node's pods reach the broker on the bridge's address,
/// which the host reaches too), else `name`.
pub fn kafka_listener_for_pods(name: &str) -> String {
    stack_var_opt(&format!("{name}_IN_CLUSTER")).unwrap_or_else(|| stack_var(name))
}

/// Whether the suite runs on a kind cluster (`OXBOW_E2E_TARGET=kind`, set by
/// `e2e/kind/run.sh`) rather than on the local stack of `make up`.
pub fn on_kind() -> bool {
    std::env::var("OXBOW_E2E_TARGET").is_ok_and(|t| t == "kind")
}

/// For a test that needs what only the local stack has (the node agent's pid and log
/// files, its kubelet emulation, host processes): on kind it prints
/// `skipped on kind: <reason>` and returns true, and the test returns at once; on the
/// local stack it returns false and the test runs as always.
pub fn requires_local_stack(reason: &str) -> bool {
    if on_kind() {
        println!("skipped on kind: {reason}");
        true
    } else {
        false
    }
}

/// The helm `make up` builds (`e2e/stack/build-go.sh`), else `helm` on the PATH.
pub fn helm_path() -> PathBuf {
    let version = std::env::var("HELM_VERSION").unwrap_or_else(|_| "v3.19.5".into());
    let p = cache_dir().join("helm").join(version).join("bin/helm");
    if p.exists() { p } else { PathBuf::from("helm") }
}

/// Runs helm against the stack; returns (success, stdout, stderr).
pub fn helm(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(helm_path())
        .args(args)
        .env("KUBECONFIG", stack_var("KUBECONFIG"))
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "failed to run helm ({}): {e}; `make up` builds it",
                helm_path().display()
            )
        });
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl wait --for=condition=Ready streamapp/<name>`: `Err` carries kubectl's output.
pub fn wait_streamapp_ready(ns: &str, name: &str, timeout: &str) -> Result<(), String> {
    let (ok, out, err) = kubectl(
        &[
            "wait",
            "-n",
            ns,
            "--for=condition=Ready",
            &format!("streamapp/{name}"),
            &format!("--timeout={timeout}"),
        ],
        None,
    );
    if ok {
        Ok(())
    } else {
        Err(format!("{out}{err}"))
    }
}

/// The workspace root (for committed manifests such as the CRD).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(manifest_dir()).join("..")
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("target"))
}

/// Applies the committed StreamApp CRD (server-side, idempotent) and waits until it is
/// established.
pub fn install_crd() {
    let crd = workspace_root().join("charts/oxbow/crds/streamapps.oxbow.dev.yaml");
    let path = crd.to_string_lossy().into_owned();
    let (ok, _, err) = kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", &path],
        None,
    );
    assert!(ok, "failed to install the StreamApp CRD: {err}");
    // Not `kubectl wait`: on a CRD created a moment ago it fails at once, before the
    // API server has written any condition ("<nil> is of the type <nil>").
    let deadline = Deadline::after(Duration::from_secs(60));
    loop {
        let (_, out, err) = kubectl(
            &[
                "get",
                "crd/streamapps.oxbow.dev",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
            ],
            None,
        );
        if out.trim() == "True" {
            return;
        }
        deadline.next_poll(Duration::from_millis(200), || {
            format!("the StreamApp CRD was not established: {out} {err}")
        });
    }
}

/// Flags every operator of the suite runs with (besides its namespace, metrics address
/// and log format); `e2e/kind/run.sh` installs the chart with the same values.
const OPERATOR_FLAGS: [&str; 4] = ["--resync-interval", "3s", "--cleanup-timeout", "20s"];

/// An `oxbow-operator run` process watching one namespace. Killed (SIGKILL) on drop.
///
/// On kind no process is started: the operator the Helm chart installed (every
/// namespace) serves the test's namespace, [`OperatorProcess::logs`] reads its pod's
/// log, and `start_with` checks that it runs with the flags the test asks for.
pub struct OperatorProcess {
    child: Option<std::process::Child>,
    pub log: PathBuf,
    pub metrics_addr: String,
}

impl OperatorProcess {
    pub fn start(namespace: &str) -> Self {
        Self::start_with(namespace, &[])
    }

    pub fn start_with(namespace: &str, extra: &[&str]) -> Self {
        if on_kind() {
            return Self::in_cluster(namespace, extra);
        }
        let bin = target_dir().join("release/oxbow-operator");
        assert!(
            bin.exists(),
            "{} is missing: run `make build`",
            bin.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let metrics_addr = format!("127.0.0.1:{port}");
        let log = std::env::temp_dir().join(format!("oxbow-operator-{namespace}-{port}.log"));
        let file = std::fs::File::create(&log).expect("operator log file");
        let child = std::process::Command::new(bin)
            .args([
                "run",
                "--namespace",
                namespace,
                "--metrics-addr",
                &metrics_addr,
                "--log-format",
                "text",
            ])
            .args(["--worker-image", "oxbow-standin:test"])
            // The suite's flags, less those `extra` sets itself.
            .args(
                OPERATOR_FLAGS
                    .chunks(2)
                    .filter(|pair| !extra.contains(&pair[0]))
                    .flatten(),
            )
            .args(extra)
            .env("KUBECONFIG", stack_var("KUBECONFIG"))
            .env("RUST_LOG", "info,oxbow_operator=debug,kube_runtime=warn")
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start oxbow-operator");
        Self {
            child: Some(child),
            log,
            metrics_addr,
        }
    }

    /// On kind: the chart's operator Deployment (`OXBOW_E2E_OPERATOR` in
    /// `OXBOW_E2E_OPERATOR_NAMESPACE`), which must run with the suite's flags and `extra`.
    fn in_cluster(namespace: &str, extra: &[&str]) -> Self {
        let (ns, deployment) = kind_operator();
        let (ok, out, err) = kubectl(
            &[
                "get",
                "-n",
                &ns,
                &deployment,
                "-o",
                "jsonpath={.spec.template.spec.containers[0].args}",
            ],
            None,
        );
        assert!(ok, "failed to read the args of {deployment} in {ns}: {err}");
        let args: Vec<String> = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("args of {deployment} are not a list ({e}): {out}"));
        let wanted: Vec<&str> = OPERATOR_FLAGS.iter().chain(extra).copied().collect();
        for pair in wanted.chunks(2) {
            let flag = pair.join("=");
            assert!(
                args.contains(&flag),
                "the test needs the operator to run with {flag}, but {deployment} runs with \
                 {args:?}: install the chart as e2e/kind/run.sh does, or skip the test on kind"
            );
        }
        println!(
            "on kind: {deployment} in {ns} (the chart's operator) serves namespace {namespace}"
        );
        Self {
            child: None,
            log: PathBuf::new(),
            metrics_addr: String::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(|c| c.id())
            .expect("on kind the operator is the chart's Deployment, not a process of the test")
    }

    /// SIGKILL, as a node failure or OOM would.
    pub fn kill(&mut self) {
        assert!(
            self.child.is_some(),
            "on kind the operator is the chart's Deployment, not a process of the test"
        );
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn logs(&self) -> String {
        if self.child.is_some() {
            return std::fs::read_to_string(&self.log).unwrap_or_default();
        }
        let (ns, deployment) = kind_operator();
        let (_, out, err) = kubectl(
            &[
                "logs",
                "-n",
                &ns,
                &deployment,
                "--all-containers",
                "--tail=300",
            ],
            None,
        );
        format!("{out}{err}")
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The namespace and name (`deployment.apps/<name>`) of the chart's operator on kind.
fn kind_operator() -> (String, String) {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: on kind, run the suite through e2e/kind/run.sh")
        })
    };
    (
        var("OXBOW_E2E_OPERATOR_NAMESPACE"),
        var("OXBOW_E2E_OPERATOR"),
    )
}

/// Kafka helpers for the suite, as its async tests call them; the work is
/// `oxbow_testkit::kafka`'s.
pub mod kafka {
    use std::collections::BTreeMap;

    use oxbow_testkit::kafka as kit;

    pub async fn create_topic(name: &str, partitions: i32) {
        kit::create_topic(name, partitions);
    }

    /// Grows a topic to `total` partitions, as `kafka-topics --alter --partitions` would.
    pub async fn add_partitions(name: &str, total: usize) {
        kit::add_partitions(name, total);
    }

    /// Partition count, or None when the topic does not exist.
    pub fn partitions(name: &str) -> Option<usize> {
        kit::topic_partitions(name)
    }

    /// The topic's config (every entry with a value).
    pub async fn config(name: &str) -> BTreeMap<String, String> {
        kit::topic_config(name)
    }

    /// Sets one config of a topic by hand, as an operator of the cluster might.
    pub async fn set_config(name: &str, key: &str, value: &str) {
        kit::set_topic_config(name, key, value);
    }
}

/// StreamApp fixtures and waits.
pub mod apps {
    use std::time::Duration;

    use kube::api::Api;
    use oxbow_crds::StreamApp;

    /// A StreamApp manifest with a dedupe and an aggregate step (two stores), a sink, the
    /// stand-in worker image and the stack's Kafka (its address for pods). `extra` is YAML
    /// appended under `spec` (indented by two spaces).
    pub fn manifest(name: &str, sources: &[&str], extra: &str) -> String {
        format!(
            r#"apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata:
  name: {name}
spec:
  replicas: 2
  image: oxbow-standin:test
  kafka:
    bootstrapServers: "{bootstrap}"
  source:
    topics: [{sources}]
  steps:
  - dedupe: {{store: seen, id: value.txId, within: 1h}}
  - aggregate:
      store: per-user
      groupBy: value.userId
      window: {{tumbling: 1m}}
      fields: {{count: {{count: {{}}}}}}
  sink: {{topic: {name}-out}}
{extra}"#,
            bootstrap = super::kafka_bootstrap_in_cluster(),
            sources = sources.join(", "),
        )
    }

    pub fn condition(app: &StreamApp, type_: &str) -> Option<(String, String, String)> {
        app.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }

    /// Deletes StreamApp `name` and waits until it is gone (the operator's finalizer ran).
    pub async fn delete_and_wait(api: &Api<StreamApp>, name: &str) {
        api.delete(name, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("failed to delete {name}: {e}"));
        super::wait_for(
            &format!("StreamApp {name} to be gone"),
            Duration::from_secs(90),
            || async {
                api.get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?
                    .map_or(Ok(()), |_| Err("still present".into()))
            },
        )
        .await;
    }

    /// Deletes every StreamApp the Api covers and waits until all are gone, so a test
    /// leaves no finalizer behind to hold its namespace.
    pub async fn delete_all(api: &Api<StreamApp>) {
        let list = api
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("failed to list StreamApps: {e}"));
        for app in list.items {
            let name = kube::ResourceExt::name_any(&app);
            api.delete(&name, &Default::default())
                .await
                .unwrap_or_else(|e| panic!("failed to delete {name}: {e}"));
        }
        super::wait_for(
            "every StreamApp to be deleted",
            Duration::from_secs(90),
            || async {
                let left = api
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len();
                if left == 0 {
                    Ok(())
                } else {
                    Err(format!("{left} left"))
                }
            },
        )
        .await;
    }

    /// Waits for `Stalled=True` with `reason` (90 s at most); returns its message.
    pub async fn wait_stalled(api: &Api<StreamApp>, name: &str, reason: &str) -> String {
        super::wait_for(
            &format!("{name} to stall with {reason}"),
            Duration::from_secs(90),
            || async {
                let app = api.get(name).await.map_err(|e| e.to_string())?;
                match condition(&app, "Stalled") {
                    Some((s, r, m)) if s == "True" && r == reason => Ok(m),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
    }

    /// Waits until condition `type_` has `status` (and the status reflects the current
    /// generation); returns the StreamApp.
    pub async fn wait_condition(
        api: &Api<StreamApp>,
        name: &str,
        type_: &str,
        status: &str,
        timeout: Duration,
    ) -> StreamApp {
        let what = format!("StreamApp {name} condition {type_}={status}");
        super::wait_for(&what, timeout, || async {
            let app = api.get(name).await.map_err(|e| e.to_string())?;
            let current =
                app.status.as_ref().and_then(|s| s.observed_generation) == app.metadata.generation;
            match condition(&app, type_) {
                Some((s, _, _)) if s == status && current => Ok(app),
                other => Err(format!(
                    "{type_}: {other:?}, observedGeneration current: {current}"
                )),
            }
        })
        .await
    }
}

/// This crate's directory. Cargo sets `CARGO_MANIFEST_DIR` when it runs a test too, and
/// that value is the checkout being tested: the compile-time one is wherever the binary
/// was built, and a target directory shared by two checkouts (CI's clone and a working
/// copy) hands one checkout's test binaries to the other when the sources match.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}
