//! Fixtures for suites that run the real worker as pods under the operator: a StreamApp
//! builder with a keyed running count, keyed input, the committed output and the check
//! that exactly-once output is exact (per key the running counts are 1, 2, … n, each
//! once).

use std::collections::BTreeMap;
use std::time::Duration;

use oxbow_testkit::kafka as kit;

use crate::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kafka_bootstrap_in_cluster,
    kube_client, kubectl, unique, wait_for,
};
use kube::api::Api;
use oxbow_crds::StreamApp;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A StreamApp that counts records per key (`groupBy: key`, so a key's state lives in
/// the task of its source partition and queries can route by key) and sums `amount`.
#[derive(Debug, Clone)]
pub struct CountingApp {
    pub name: String,
    pub source: String,
    pub replicas: i32,
    pub standbys: i32,
    pub guarantee: &'static str,
    pub commit_interval: &'static str,
    /// A co-partitioned table `rows` on this topic, joined after the count (the output
    /// stays the count's): its store lives in the stage-0 tasks and their standbys.
    pub table: Option<String>,
    /// Another Kafka listener and the Secret of `spec.kafka.secretRef` (its keys are
    /// librdkafka properties): (bootstrap servers, Secret name).
    pub kafka: Option<(String, String)>,
}

impl CountingApp {
    pub fn new(name: &str, source: &str) -> Self {
        Self {
            name: name.into(),
            source: source.into(),
            replicas: 3,
            standbys: 1,
            guarantee: "exactly_once",
            commit_interval: "200ms",
            table: None,
            kafka: None,
        }
    }
    /// Connects through `bootstrap` with the properties in Secret `secret`.
    pub fn kafka(mut self, bootstrap: &str, secret: &str) -> Self {
        self.kafka = Some((bootstrap.into(), secret.into()));
        self
    }
    pub fn with_table(mut self, topic: &str) -> Self {
        self.table = Some(topic.to_string());
        self
    }
    pub fn replicas(mut self, n: i32) -> Self {
        self.replicas = n;
        self
    }
    pub fn standbys(mut self, n: i32) -> Self {
        self.standbys = n;
        self
    }
    pub fn sink(&self) -> String {
        format!("{}-out", self.name)
    }
    pub fn manifest(&self) -> String {
        format!(
            r#"apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata:
  name: {name}
spec:
  replicas: {replicas}
  standbyReplicas: {standbys}
  image: oxbow-worker:test
  processingGuarantee: {guarantee}
  commitInterval: {interval}
  kafka:
    bootstrapServers: "{bootstrap}"{secret_ref}
  source:
    topics: [{source}]
  steps:
  - aggregate:
      store: totals
      groupBy: key
      fields: {{count: {{count: {{}}}}, sum: {{sum: value.amount}}}}
{table}  sink: {{topic: {name}-out}}
  storage: {{size: 1Gi}}
  deletionPolicy: {{topics: Delete, volumes: Delete, consumerGroup: Delete}}
"#,
            name = self.name,
            replicas = self.replicas,
            standbys = self.standbys,
            guarantee = self.guarantee,
            interval = self.commit_interval,
            bootstrap = self
                .kafka
                .as_ref()
                .map_or_else(kafka_bootstrap_in_cluster, |k| k.0.clone()),
            secret_ref = self
                .kafka
                .as_ref()
                .map(|k| format!("\n    secretRef: {{name: {}}}", k.1))
                .unwrap_or_default(),
            source = self.source,
            table = match &self.table {
                Some(t) => format!(
                    "  - join: {{table: rows, key: key, type: left, value: 'value'}}\n  tables:\n  - {{name: rows, topic: {t}}}\n"
                ),
                None => String::new(),
            },
        )
    }
}

/// `per_key` records `{"amount": amount}` for each key, interleaved across keys.
pub fn produce(topic: &str, keys: &[String], per_key: usize, amount: i64) {
    let value = format!("{{\"amount\":{amount}}}");
    let records =
        (0..per_key).flat_map(|_| keys.iter().map(|k| kit::Input::raw(k, value.as_bytes())));
    kit::produce(topic, records);
}

/// Every record of `topic` visible to a read_committed consumer now: (key, JSON value),
/// each partition's in offset order.
pub fn read_committed(topic: &str) -> Vec<(String, serde_json::Value)> {
    kit::read_all(topic, "read_committed")
        .into_iter()
        .map(|o| {
            let v = o
                .value
                .as_deref()
                .and_then(|v| serde_json::from_slice(v).ok())
                .unwrap_or(serde_json::Value::Null);
            (o.key.unwrap_or_default(), v)
        })
        .collect()
}

/// Exactly-once check of a running count: per key, the committed outputs' counts are
/// exactly 1..=n in order. Returns n per key, or what is wrong.
pub fn exact_running_counts(
    outputs: &[(String, serde_json::Value)],
) -> Result<BTreeMap<String, u64>, String> {
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (k, v) in outputs {
        let c = v["count"]
            .as_u64()
            .ok_or_else(|| format!("output for {k} has no count: {v}"))?;
        seen.entry(k.clone()).or_default().push(c);
    }
    let mut out = BTreeMap::new();
    for (k, counts) in seen {
        let want: Vec<u64> = (1..=counts.len() as u64).collect();
        if counts != want {
            let dup = counts.windows(2).find(|w| w[1] != w[0] + 1);
            return Err(format!(
                "key {k}: counts are not 1..{} exactly once (first break: {dup:?}; {} outputs)",
                counts.len(),
                counts.len()
            ));
        }
        out.insert(k, counts.len() as u64);
    }
    Ok(out)
}

/// GET `http://{addr}{path}`: status and body.
pub async fn http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    http_get_retry_after(addr, path)
        .await
        .map(|(code, _, body)| (code, body))
}

/// GET `http://{addr}{path}`: status, the `Retry-After` header if any, and body. The
/// request carries [`crate::credentials::query_token`]: worker pods serve their state only
/// to callers allowed to query the app.
pub async fn http_get_retry_after(
    addr: &str,
    path: &str,
) -> Result<(u16, Option<String>, String), String> {
    let token = tokio::task::spawn_blocking(crate::credentials::query_token)
        .await
        .map_err(|e| e.to_string())?;
    http_get_as(addr, path, Some(&token)).await
}

/// GET `http://{addr}{path}` with `token` as the bearer token (none: no header).
pub async fn http_get_as(
    addr: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, Option<String>, String), String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let mut request = client.get(format!("http://{addr}{path}"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let r = request
        .send()
        .await
        .map_err(|e| format!("GET {addr}{path}: {e}"))?;
    let code = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let body = r.text().await.map_err(|e| e.to_string())?;
    Ok((code, retry, body))
}

/// A namespace with the operator and a [`CountingApp`] over a 12-partition source,
/// applied and Ready. `finish` deletes the app (the operator's finalizer runs) and the
/// namespace.
pub struct RunningApp {
    pub client: kube::Client,
    pub ns: TestNamespace,
    pub operator: OperatorProcess,
    pub app: CountingApp,
    pub api: Api<StreamApp>,
}

impl RunningApp {
    pub async fn start(prefix: &str, configure: impl FnOnce(CountingApp) -> CountingApp) -> Self {
        Self::start_with(prefix, &[], configure).await
    }

    /// As [`RunningApp::start`], with more arguments for the operator.
    pub async fn start_with(
        prefix: &str,
        operator_args: &[&str],
        configure: impl FnOnce(CountingApp) -> CountingApp,
    ) -> Self {
        install_crd();
        let client = kube_client().await;
        let ns = TestNamespace::create(&client, prefix).await;
        let source = unique("events");
        kafka::create_topic(&source, 12).await;
        let mut args = vec!["--failover-timeout", "15s"];
        args.extend_from_slice(operator_args);
        let operator = OperatorProcess::start_with(&ns.name, &args);
        let app = configure(CountingApp::new(&unique("count"), &source));
        kafka::create_topic(&app.sink(), 12).await;
        let (ok, _, err) = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(&app.manifest()));
        assert!(ok, "apply: {err}");
        let api = Api::namespaced(client.clone(), &ns.name);
        let me = Self {
            client,
            ns,
            operator,
            app,
            api,
        };
        me.wait_ready("240s");
        me
    }

    pub fn name(&self) -> &str {
        &self.app.name
    }

    /// `kubectl wait --for=condition=Ready`, or the test fails with the operator's log.
    pub fn wait_ready(&self, timeout: &str) {
        let (ok, out, err) = kubectl(
            &[
                "wait",
                "-n",
                &self.ns.name,
                "--for=condition=Ready",
                &format!("streamapp/{}", self.app.name),
                &format!("--timeout={timeout}"),
            ],
            None,
        );
        assert!(ok, "not Ready: {out}{err}\n{}", self.operator.logs());
    }

    pub async fn status(&self) -> Result<oxbow_crds::StreamAppStatus, String> {
        Ok(self
            .api
            .get(&self.app.name)
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default())
    }

    pub async fn finish(self) {
        apps::delete_all(&self.api).await;
        self.ns.delete().await;
        drop(self.operator);
    }
}

/// Input flowing in the background: one record per key per round, until stopped.
pub struct Input {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<()>,
}

impl Input {
    pub fn start(topic: &str, keys: &[String], pause: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, rounds, keys, topic) = (
                stop.clone(),
                rounds.clone(),
                keys.to_vec(),
                topic.to_string(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    produce(&topic, &keys, 1, 1);
                    rounds.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(pause);
                }
            })
        };
        Self {
            stop,
            rounds,
            thread,
        }
    }

    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::SeqCst) as u64
    }

    /// Stops and returns how many records each key got.
    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        let rounds = self.rounds.clone();
        let _ = self.thread.join();
        rounds.load(Ordering::SeqCst) as u64
    }
}

/// `n` keys `user-0` … `user-{n-1}`.
pub fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user-{i}")).collect()
}

/// Waits until the committed output holds, for every key, the running counts 1..=want
/// exactly once each.
pub async fn wait_exactly_once(sink: &str, keys: &[String], want: u64) {
    wait_for(
        "every produced record in the committed output, exactly once",
        Duration::from_secs(120),
        || async {
            let c = exact_running_counts(&read_committed(sink))?;
            if let Some((k, v)) = c.iter().find(|(_, v)| **v > want) {
                return Err(format!("key {k} counted {v} > {want} produced"));
            }
            let done = c.values().filter(|v| **v == want).count();
            if done == keys.len() {
                Ok(())
            } else {
                Err(format!("{done}/{} keys at {want}", keys.len()))
            }
        },
    )
    .await;
}

/// A field of pod `pod` by kubectl JSONPath (empty while the pod does not exist).
pub fn pod_field(ns: &str, pod: &str, jsonpath: &str) -> String {
    kubectl(
        &[
            "get",
            "pod",
            "-n",
            ns,
            pod,
            "-o",
            &format!("jsonpath={jsonpath}"),
        ],
        None,
    )
    .1
}

/// The uid of pod `pod` (empty while it does not exist): a recreated pod has a new one.
pub fn pod_uid(ns: &str, pod: &str) -> String {
    pod_field(ns, pod, "{.metadata.uid}")
}

/// The changelog value of `CountingApp`'s store for one group: an unwindowed aggregate
/// with the fields `count` and `sum`, as the worker stores it.
pub fn counting_state(count: i64, sum: i64) -> String {
    format!(
        r#"{{"windows":[{{"start":0,"end":0,"emitted":false,"acc":[{{"k":"count","n":{count}}},{{"k":"sum","int":{sum},"float":0.0,"is_float":false}}]}}]}}"#
    )
}

/// Pre-loads `keys` counting states (`kuser-0000000`, …, each count 1 and sum 1) into
/// partition 0 of the `totals` changelog of `CountingApp` `app` in namespace `ns`: task
/// 0 then has a full restore of `keys` records ahead of it. Returns the changelog's name.
pub async fn preload_task0_counts(ns: &str, app: &str, keys: usize) -> String {
    let changelog = oxbow_crds::names::changelog_topic(
        &format!("{ns}.{app}"),
        &oxbow_crds::StoreName("totals".into()),
    );
    let topic = changelog.clone();
    tokio::task::spawn_blocking(move || {
        preload(
            &topic,
            (0..keys).map(|i| (0, format!("kuser-{i:07}"), counting_state(1, 1))),
        )
    })
    .await
    .expect("preload");
    changelog
}

/// Writes `(partition, key, value)` records straight into `topic` (for example state
/// into a changelog, so a restore is long without the worker having processed it).
pub fn preload(topic: &str, records: impl Iterator<Item = (i32, String, String)>) {
    let records = records.map(|(partition, key, value)| {
        kit::Input::raw(&key, value.as_bytes()).partition(partition)
    });
    kit::produce_with(
        topic,
        records,
        &[
            ("linger.ms", "50"),
            ("compression.type", "lz4"),
            ("queue.buffering.max.messages", "1000000"),
            ("queue.buffering.max.kbytes", "1048576"),
        ],
    );
}
