//! No secret is ever shown (issue 17, items 2 and 3). A sentinel value goes into every
//! sensitive Kafka property of several apps, each provoking another error path: Kafka
//! refusing the login, a property librdkafka rejects (rust-rdkafka quotes the rejected
//! value in its error), a property this build does not support, a secret in the manifest,
//! and properties that would load code or read files. The operator and a worker process
//! run into each; the sentinel must then appear in no condition, event, status field, log
//! line or metric.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::credentials::create_secret;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kafka_listener_for_pods, kube_client,
    kubectl, requires_local_stack, stack_var, unique, wait_for,
};
use oxbow_e2e::streams::{CountingApp, http_get};
use oxbow_e2e::workers::worker_bin;

/// Secret properties every app below carries, each with the sentinel as its value.
const SENSITIVE: [&str; 4] = [
    "sasl.password",
    "ssl.key.password",
    "sasl.oauthbearer.client.secret",
    "sasl.kerberos.min.time.before.relogin",
];

/// SCRAM over SASL_SSL with the sentinel as the password, plus `extra`.
fn scram_with(sentinel: &str, extra: &[&str]) -> Vec<(&'static str, String)> {
    let mut p = vec![
        ("security.protocol", "SASL_SSL".to_string()),
        ("sasl.mechanism", "SCRAM-SHA-512".to_string()),
        ("sasl.username", stack_var("KAFKA_SASL_USERNAME")),
        ("sasl.password", sentinel.to_string()),
    ];
    for name in SENSITIVE.iter().filter(|n| extra.contains(n)) {
        p.push((name, sentinel.to_string()));
    }
    p
}

async fn apply(ns: &str, secret: Option<&str>, manifest_property: Option<(&str, &str)>) -> String {
    let source = unique("events");
    kafka::create_topic(&source, 1).await;
    let mut app = CountingApp::new(&unique("leak"), &source)
        .replicas(1)
        .standbys(0);
    if let Some(s) = secret {
        app = app.kafka(&kafka_listener_for_pods("KAFKA_BOOTSTRAP_SASL_SSL"), s);
    }
    let mut manifest = app.manifest();
    if let Some((k, v)) = manifest_property {
        manifest = manifest.replace(
            "  source:\n",
            &format!("    properties: {{{k:?}: {v:?}}}\n  source:\n"),
        );
    }
    let (ok, _, err) = kubectl(&["apply", "-n", ns, "-f", "-"], Some(&manifest));
    assert!(ok, "apply: {err}\n{manifest}");
    app.name
}

/// Waits until condition `type_` of app `name` is False with `reason`; its message.
async fn failed_with(
    api: &Api<StreamApp>,
    name: &str,
    type_: &str,
    reason: &str,
    operator: &OperatorProcess,
) -> String {
    wait_for(
        &format!("{name}'s {type_} to be False with reason {reason}"),
        Duration::from_secs(90),
        || async {
            let app = api.get(name).await.map_err(|e| e.to_string())?;
            match apps::condition(&app, type_) {
                Some((s, r, m)) if s == "False" && r == reason => Ok(m),
                other => Err(format!("{other:?}\n{}", operator.logs())),
            }
        },
    )
    .await
}

/// Runs `oxbow-worker run` standalone with `secret` as its mounted Secret directory until
/// it exits; its exit status and everything it printed.
async fn worker_fails(dir: &Path, manifest: &str, secret: &[(&str, String)]) -> (bool, String) {
    let secret_dir = dir.join(unique("secret"));
    std::fs::create_dir_all(&secret_dir).expect("secret dir");
    for (k, v) in secret {
        std::fs::write(secret_dir.join(k), v).expect("secret file");
    }
    let config = dir.join(unique("app.yaml"));
    std::fs::write(&config, manifest).expect("manifest");
    let log = dir.join(unique("worker.log"));
    let child = Command::new(worker_bin())
        .args(["run", "--config"])
        .arg(&config)
        .arg("--kafka-secret-dir")
        .arg(&secret_dir)
        .arg("--state-dir")
        .arg(dir.join(unique("state")))
        .args(["--listen", "127.0.0.1:0", "--memory-mib", "64"])
        .env("RUST_LOG", "debug")
        .stdout(std::fs::File::create(&log).expect("log"))
        .stderr(std::fs::File::create(log.with_extension("err")).expect("log"))
        .stdin(Stdio::null())
        .spawn()
        .expect("start oxbow-worker");
    let child = &std::sync::Mutex::new(child);
    let status = wait_for(
        "the worker to exit on its bad Kafka configuration",
        Duration::from_secs(60),
        || async move {
            match child.lock().expect("child").try_wait() {
                Ok(Some(s)) => Ok(s),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let out = std::fs::read_to_string(&log).unwrap_or_default()
        + &std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
    (status.success(), out)
}

#[tokio::test]
async fn a_sentinel_in_every_secret_property_shows_nowhere_after_every_error_path() {
    if requires_local_stack("the secured listener is the local stack's broker's") {
        return;
    }
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "leak").await;
    let operator = OperatorProcess::start(&ns.name);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), &ns.name);
    let sentinel = format!("S3ntinel{}", unique("x").replace('-', ""));
    let ca = [("ssl.ca.pem", stack_var("KAFKA_CA_FILE"))];

    // Kafka refuses the login: the sentinel is the password.
    create_secret(
        &ns.name,
        "refused",
        &scram_with(&sentinel, &["ssl.key.password"]),
        &ca,
    );
    let refused = apply(&ns.name, Some("refused"), None).await;
    // librdkafka rejects an integer property; rust-rdkafka's error quotes the value.
    create_secret(
        &ns.name,
        "rejected",
        &scram_with(&sentinel, &["sasl.kerberos.min.time.before.relogin"]),
        &ca,
    );
    let rejected = apply(&ns.name, Some("rejected"), None).await;
    // OIDC needs a librdkafka built with curl: not supported in this build.
    create_secret(
        &ns.name,
        "unsupported",
        &scram_with(&sentinel, &["sasl.oauthbearer.client.secret"]),
        &ca,
    );
    let unsupported = apply(&ns.name, Some("unsupported"), None).await;
    // A password in the manifest is refused; a plugin in the Secret is never loaded.
    let in_manifest = apply(&ns.name, None, Some(("sasl.password", &sentinel))).await;
    let mut plugin = scram_with(&sentinel, &[]);
    plugin.push(("plugin.library.paths", format!("/tmp/{sentinel}.so")));
    create_secret(&ns.name, "plugin", &plugin, &ca);
    let with_plugin = apply(&ns.name, Some("plugin"), None).await;

    let mut messages = vec![
        failed_with(
            &api,
            &refused,
            "TopicsReady",
            "KafkaAuthenticationFailed",
            &operator,
        )
        .await,
    ];
    for app in [&rejected, &unsupported] {
        let m = failed_with(
            &api,
            app,
            "TopicsReady",
            "InvalidKafkaProperties",
            &operator,
        )
        .await;
        messages.push(m);
    }
    let m = failed_with(
        &api,
        &in_manifest,
        "Ready",
        "KafkaPropertyRefused",
        &operator,
    )
    .await;
    assert!(
        m.contains(r#"spec.kafka.properties["sasl.password"]"#) && m.contains("Secret"),
        "the refusal names neither the property nor where it belongs: {m}"
    );
    messages.push(m);
    let m = failed_with(
        &api,
        &with_plugin,
        "TopicsReady",
        "KafkaPropertyRefused",
        &operator,
    )
    .await;
    assert!(
        m.contains(r#"key "plugin.library.paths" of Secret plugin"#) && m.contains("loads"),
        "the refusal does not name the plugin property: {m}"
    );
    messages.push(m);
    assert!(
        messages[1].contains("sasl.kerberos.min.time.before.relogin")
            && messages[2].contains("sasl.oauthbearer.client.secret"),
        "the messages do not name the rejected properties: {messages:#?}"
    );
    for m in &messages {
        println!("{m}");
    }

    // The worker, with the same Secrets mounted: each stops with an error.
    let dir = std::env::temp_dir().join(unique("leak-worker"));
    std::fs::create_dir_all(&dir).expect("dir");
    let manifest = CountingApp::new(&unique("leak"), "events")
        .kafka(
            &kafka_listener_for_pods("KAFKA_BOOTSTRAP_SASL_SSL"),
            "mounted",
        )
        .manifest();
    let mut worker_output = String::new();
    for (secret, says) in [
        (
            scram_with(&sentinel, &["sasl.kerberos.min.time.before.relogin"]),
            "sasl.kerberos.min.time.before.relogin",
        ),
        (plugin.clone(), "plugin.library.paths"),
    ] {
        let (ok, out) = worker_fails(&dir, &manifest, &secret).await;
        assert!(!ok, "the worker ran with a bad configuration:\n{out}");
        assert!(
            out.contains(says),
            "the worker's error does not name {says}:\n{out}"
        );
        worker_output.push_str(&out);
    }

    // Everything a reader of the namespace, the logs or the metrics can see.
    let mut seen = vec![
        ("operator log", operator.logs()),
        ("worker output", worker_output),
    ];
    for app in [
        &refused,
        &rejected,
        &unsupported,
        &in_manifest,
        &with_plugin,
    ] {
        let a = api.get(app).await.expect("app");
        let status = serde_json::to_string(&a.status).expect("status");
        seen.push(("StreamApp status", status));
    }
    let (ok, events, err) = kubectl(&["get", "events", "-n", &ns.name, "-o", "json"], None);
    assert!(ok, "get events: {err}");
    assert!(
        events.contains("InvalidKafkaProperties"),
        "no event records the rejected properties:\n{events}"
    );
    seen.push(("events", events));
    let (code, metrics) = http_get(&operator.metrics_addr, "/metrics")
        .await
        .expect("operator metrics");
    assert_eq!(code, 200, "metrics: {metrics}");
    seen.push(("operator metrics", metrics));
    for (what, text) in &seen {
        assert!(
            !text.contains(&sentinel),
            "the {what} shows the secret sentinel {sentinel}:\n{}",
            text.lines()
                .filter(|l| l.contains(&sentinel))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    apps::delete_all(&api).await;
    ns.delete().await;
}
