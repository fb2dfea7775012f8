//! Kafka security end to end (issue 17, item 1). The local stack's broker has a
//! `SASL_SSL` listener (SCRAM users made with Kafka's own tool) and an `SSL` listener
//! that requires client certificates, both signed by a CA of the stack's. A StreamApp
//! names a Secret of librdkafka properties (`spec.kafka.secretRef`): the operator's admin
//! client and the worker pods (the Secret mounted as files) connect with it, and the app
//! counts exactly once. A wrong password and a certificate Kafka does not trust are
//! reported in the app's conditions, saying which, without a storm of retries.

use std::time::{Duration, Instant};

use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::credentials::create_secret;
use oxbow_e2e::credentials::replace_secret;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kafka_listener_for_pods, kube_client,
    kubectl, requires_local_stack, stack_var, unique, wait_for,
};
use oxbow_e2e::streams::{CountingApp, pod_field, pod_uid, produce, read_committed};

const PARTITIONS: i32 = 2;

fn scram(password: &str) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "SASL_SSL".into()),
        ("sasl.mechanism", "SCRAM-SHA-512".into()),
        ("sasl.username", stack_var("KAFKA_SASL_USERNAME")),
        ("sasl.password", password.into()),
    ]
}

/// Applies a one-replica counting app through `bootstrap` with Secret `secret`.
async fn apply(ns: &str, bootstrap: &str, secret: &str) -> CountingApp {
    let source = unique("events");
    kafka::create_topic(&source, PARTITIONS).await;
    let app = CountingApp::new(&unique("count"), &source)
        .replicas(1)
        .standbys(0)
        .kafka(bootstrap, secret);
    kafka::create_topic(&app.sink(), PARTITIONS).await;
    let (ok, _, err) = kubectl(&["apply", "-n", ns, "-f", "-"], Some(&app.manifest()));
    assert!(ok, "apply: {err}");
    app
}

/// Ready, then every key counted 1..=3 exactly once in the committed output.
async fn counts_exactly_once(ns: &str, app: &CountingApp, operator: &OperatorProcess) {
    counts_up_to(ns, app, operator, 0, 3).await;
}

/// Ready, then `more` records per key on top of `before`: every key counted
/// 1..=before+more exactly once in the committed output.
async fn counts_up_to(
    ns: &str,
    app: &CountingApp,
    operator: &OperatorProcess,
    before: usize,
    more: usize,
) {
    let (ok, out, err) = kubectl(
        &[
            "wait",
            "-n",
            ns,
            "--for=condition=Ready",
            &format!("streamapp/{}", app.name),
            "--timeout=180s",
        ],
        None,
    );
    assert!(ok, "not Ready: {out}{err}\n{}", operator.logs());
    let keys: Vec<String> = (0..20).map(|i| format!("user-{i}")).collect();
    produce(&app.source, &keys, more, 1);
    let want: Vec<i64> = (1..=(before + more) as i64).collect();
    wait_for(
        &format!("every key counted {want:?} once in the committed output"),
        Duration::from_secs(90),
        || async {
            let mut seen: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
            for (k, v) in read_committed(&app.sink()) {
                seen.entry(k)
                    .or_default()
                    .push(v["count"].as_i64().unwrap_or(-1));
            }
            let exact = seen.len() == keys.len() && seen.values().all(|c| c == &want);
            exact.then_some(()).ok_or_else(|| format!("{seen:?}"))
        },
    )
    .await;
}

#[tokio::test]
async fn an_app_counts_exactly_once_over_sasl_ssl_with_scram_sha_512() {
    if requires_local_stack("the secured listeners are the local stack's broker's") {
        return;
    }
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "sasl").await;
    let operator = OperatorProcess::start(&ns.name);
    let mut props = scram(&stack_var("KAFKA_SASL_PASSWORD"));
    props.push(("ssl.endpoint.identification.algorithm", "https".into()));
    create_secret(
        &ns.name,
        "kafka-creds",
        &props,
        &[("ssl.ca.pem", stack_var("KAFKA_CA_FILE"))],
    );
    let app = apply(
        &ns.name,
        &kafka_listener_for_pods("KAFKA_BOOTSTRAP_SASL_SSL"),
        "kafka-creds",
    )
    .await;
    counts_exactly_once(&ns.name, &app, &operator).await;
    apps::delete_all(&Api::<StreamApp>::namespaced(client, &ns.name)).await;
    ns.delete().await;
}

#[tokio::test]
async fn an_app_counts_exactly_once_over_mutual_tls() {
    if requires_local_stack("the secured listeners are the local stack's broker's") {
        return;
    }
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "mtls").await;
    let operator = OperatorProcess::start(&ns.name);
    create_secret(
        &ns.name,
        "kafka-tls",
        &[("security.protocol", "SSL".into())],
        &[
            ("ssl.ca.pem", stack_var("KAFKA_CA_FILE")),
            ("ssl.certificate.pem", stack_var("KAFKA_CLIENT_CERT_FILE")),
            ("ssl.key.pem", stack_var("KAFKA_CLIENT_KEY_FILE")),
        ],
    );
    let app = apply(
        &ns.name,
        &kafka_listener_for_pods("KAFKA_BOOTSTRAP_MTLS"),
        "kafka-tls",
    )
    .await;
    counts_exactly_once(&ns.name, &app, &operator).await;
    apps::delete_all(&Api::<StreamApp>::namespaced(client, &ns.name)).await;
    ns.delete().await;
}

#[tokio::test]
async fn a_changed_secret_replaces_the_operators_client_and_rolls_the_workers() {
    if requires_local_stack("the secured listeners are the local stack's broker's") {
        return;
    }
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "rotate").await;
    let operator = OperatorProcess::start(&ns.name);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), &ns.name);
    let ca = [("ssl.ca.pem", stack_var("KAFKA_CA_FILE"))];
    create_secret(&ns.name, "creds", &scram("an-old-password"), &ca);
    let app = apply(
        &ns.name,
        &kafka_listener_for_pods("KAFKA_BOOTSTRAP_SASL_SSL"),
        "creds",
    )
    .await;
    wait_for(
        "the old password to be refused",
        Duration::from_secs(90),
        || async {
            match topics_ready(&api, &app.name).await {
                Some(c) if c.1 == "KafkaAuthenticationFailed" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    // The password is fixed in the Secret: the operator's cached client must go.
    replace_secret(
        &ns.name,
        "creds",
        &scram(&stack_var("KAFKA_SASL_PASSWORD")),
        &ca,
    );
    counts_exactly_once(&ns.name, &app, &operator).await;
    let pod = format!("{}-0", app.name);
    let first = pod_uid(&ns.name, &pod);
    // Any change to the Secret restarts the workers, which read it at start.
    let mut props = scram(&stack_var("KAFKA_SASL_PASSWORD"));
    props.push(("ssl.endpoint.identification.algorithm", "https".into()));
    replace_secret(&ns.name, "creds", &props, &ca);
    let (ok, version, err) = kubectl(
        &[
            "get",
            "secret",
            "creds",
            "-n",
            &ns.name,
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
        None,
    );
    assert!(ok, "{err}");
    wait_for(
        "the worker pod to be replaced, started with the new Secret",
        Duration::from_secs(120),
        || async {
            let uid = pod_uid(&ns.name, &pod);
            let started_with = pod_field(
                &ns.name,
                &pod,
                r"{.metadata.annotations.oxbow\.dev/kafka-secret-version}",
            );
            (!uid.is_empty() && uid != first && started_with == version)
                .then_some(())
                .ok_or_else(|| {
                    format!(
                        "pod {uid} started with Secret version {started_with:?}, want {version}"
                    )
                })
        },
    )
    .await;
    counts_up_to(&ns.name, &app, &operator, 3, 2).await;
    apps::delete_all(&api).await;
    ns.delete().await;
}

/// The `TopicsReady` condition of the app: (status, reason, message).
async fn topics_ready(api: &Api<StreamApp>, name: &str) -> Option<(String, String, String)> {
    apps::condition(&api.get(name).await.ok()?, "TopicsReady")
}

/// Lines of the broker's log that record a failed authentication.
fn failed_authentications() -> usize {
    let log = format!("{}/logs/kafka.log", stack_var("OXBOW_STACK_DIR"));
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("Failed authentication with"))
        .count()
}

#[tokio::test]
async fn a_wrong_password_and_an_untrusted_certificate_are_reported_without_a_retry_storm() {
    if requires_local_stack("the secured listeners are the local stack's broker's") {
        return;
    }
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "badauth").await;
    let operator = OperatorProcess::start(&ns.name);
    let api: Api<StreamApp> = Api::namespaced(client.clone(), &ns.name);
    let ca = stack_var("KAFKA_CA_FILE");
    create_secret(
        &ns.name,
        "wrong-password",
        &scram("not-the-password"),
        &[("ssl.ca.pem", ca.clone())],
    );
    // A client certificate the cluster's CA signed: Kafka trusts only its own CA.
    let pki = format!("{}/pki", stack_var("OXBOW_STACK_DIR"));
    create_secret(
        &ns.name,
        "untrusted-cert",
        &[("security.protocol", "SSL".into())],
        &[
            ("ssl.ca.pem", ca),
            ("ssl.certificate.pem", format!("{pki}/admin.crt")),
            ("ssl.key.pem", format!("{pki}/admin.key")),
        ],
    );
    let auth_failures_before = failed_authentications();
    let started = Instant::now();
    let wrong = apply(
        &ns.name,
        &kafka_listener_for_pods("KAFKA_BOOTSTRAP_SASL_SSL"),
        "wrong-password",
    )
    .await;
    let untrusted = apply(
        &ns.name,
        &kafka_listener_for_pods("KAFKA_BOOTSTRAP_MTLS"),
        "untrusted-cert",
    )
    .await;
    for (app, want_reason, want_words) in [
        (
            &wrong,
            "KafkaAuthenticationFailed",
            ["SASL", "SCRAM-SHA-512"],
        ),
        (&untrusted, "KafkaTlsFailed", ["SSL", "certificate"]),
    ] {
        let (_, reason, message) = wait_for(
            &format!("{}'s TopicsReady to say {want_reason}", app.name),
            Duration::from_secs(90),
            || async {
                match topics_ready(&api, &app.name).await {
                    Some(c) if c.0 == "False" && c.1 == want_reason => Ok(c),
                    other => Err(format!("{other:?}\n{}", operator.logs())),
                }
            },
        )
        .await;
        println!("{}: {reason}: {message}", app.name);
        for w in want_words {
            assert!(
                message.contains(w),
                "the message does not say {w}: {message}"
            );
        }
        assert!(
            !message.contains("not-the-password"),
            "the message shows the password: {message}"
        );
    }
    // Keep failing for a while: the retries back off instead of storming the broker.
    let window = Duration::from_secs(30);
    let from = failed_authentications();
    tokio::time::sleep(window).await;
    let during = failed_authentications() - from;
    println!(
        "failed authentications at the broker: {} in the first {:.0?}, {during} in the next {window:?}",
        from - auth_failures_before,
        started.elapsed()
    );
    assert!(
        during <= 30,
        "{during} failed authentications in {window:?}: the operator retries in a storm"
    );
    for app in [&wrong, &untrusted] {
        let (status, reason, _) = topics_ready(&api, &app.name).await.unwrap_or_default();
        assert_eq!(
            (status.as_str(), app.name.as_str()),
            ("False", app.name.as_str()),
            "{reason}"
        );
    }
    apps::delete_all(&api).await;
    ns.delete().await;
}
