//! The children as a whole: what each carries, and that the same spec gives the same objects.

use super::*;

fn app(extra: &str) -> StreamApp {
    let yaml = format!(
        r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: fraud, namespace: risk, uid: 0000-1111}}
spec:
  replicas: 3
  kafka: {{bootstrapServers: "127.0.0.1:9092"}}
  source: {{topics: [payments]}}
  steps:
  - dedupe: {{store: seen, id: value.txId, within: 24h}}
{extra}"#
    );
    serde_yaml::from_str(&yaml).expect("valid manifest")
}

fn hash(a: &StreamApp) -> String {
    hash_at(a, a.spec.replicas)
}

fn hash_at(a: &StreamApp, replicas: i32) -> String {
    let c = build(a, &cx(), replicas, None, StoreEncoding::Binary).expect("builds");
    c.stateful_set
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).cloned())
        .expect("hash")
}

fn cx() -> BuildContext {
    BuildContext {
        default_image: "oxbow-worker:0.1.0".into(),
        query_client_label: None,
    }
}

#[test]
fn statefulset_carries_storage_probes_env_and_retention() {
    let a = app(
        "  storage: {size: 5Gi, storageClassName: fast}\n  deletionPolicy: {volumes: Delete}\n",
    );
    let c = build(&a, &cx(), a.spec.replicas, None, StoreEncoding::Binary).expect("builds");
    let sts = serde_json::to_value(&c.stateful_set).expect("json");
    let spec = &sts["spec"];
    assert_eq!(spec["replicas"], 3);
    assert_eq!(spec["podManagementPolicy"], "Parallel");
    assert_eq!(spec["serviceName"], "fraud-workers");
    assert_eq!(
        spec["persistentVolumeClaimRetentionPolicy"],
        json!({"whenDeleted": "Delete", "whenScaled": "Retain"})
    );
    let claim = &spec["volumeClaimTemplates"][0]["spec"];
    assert_eq!(claim["resources"]["requests"]["storage"], "5Gi");
    assert_eq!(claim["storageClassName"], "fast");
    let ctr = &spec["template"]["spec"]["containers"][0];
    assert_eq!(ctr["image"], "oxbow-worker:0.1.0");
    assert_eq!(ctr["imagePullPolicy"], "IfNotPresent");
    assert_eq!(ctr["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(ctr["livenessProbe"]["httpGet"]["path"], "/healthz");
    let env: Vec<&str> = ctr["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        env.contains(&"POD_NAME") && env.contains(&"POD_IP"),
        "{env:?}"
    );
    let assignment = ctr["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == ASSIGNMENT_ENV)
        .expect("the workers are told to run coordinated");
    assert_eq!(assignment["value"], "fraud-assignment");
    assert_eq!(
        spec["template"]["spec"]["serviceAccountName"],
        "fraud-worker"
    );
    assert_eq!(sts["metadata"]["ownerReferences"][0]["kind"], "StreamApp");
    assert_eq!(sts["metadata"]["ownerReferences"][0]["controller"], true);
}

#[test]
fn a_spec_change_changes_the_config_hash_on_the_pod_template() {
    let a = app("");
    assert_eq!(hash(&a), hash(&a.clone()), "same spec, same hash");
    assert_ne!(
        hash(&a),
        hash(&app("  commitInterval: 1s\n")),
        "a config change rolls the pods"
    );
}

#[test]
fn scaling_does_not_change_the_config_hash() {
    let a = app("");
    let mut scaled = a.clone();
    scaled.spec.replicas = 7;
    assert_eq!(
        hash(&a),
        hash(&scaled),
        "kubectl scale must not roll every worker"
    );
    let mut policy = a.clone();
    policy.spec.drift_policy = oxbow_crds::DriftPolicy::Enforce;
    policy.spec.deletion_policy.topics = oxbow_crds::Retention::Delete;
    assert_eq!(
        hash(&a),
        hash(&policy),
        "operator-only settings must not roll the workers"
    );
}

#[test]
fn a_kafka_secret_is_mounted_into_the_workers() {
    let mut a = app("");
    a.spec.kafka.secret_ref = Some(oxbow_crds::SecretRef {
        name: "kafka-creds".into(),
    });
    let c = build(&a, &cx(), a.spec.replicas, None, StoreEncoding::Binary).expect("builds");
    let t = serde_json::to_value(c.stateful_set.spec.expect("spec").template).expect("json");
    assert!(
        t["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["secret"]["secretName"] == "kafka-creds")
    );
    let ctr = &t["spec"]["containers"][0];
    assert!(
        ctr["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["mountPath"] == KAFKA_SECRET_MOUNT)
    );
    assert!(
        ctr["args"]
            .as_array()
            .expect("args")
            .iter()
            .any(|a| a == "--kafka-secret-dir")
    );
}

#[test]
fn a_changed_kafka_secret_rolls_the_workers_without_its_content_in_the_pods() {
    let a = app("");
    let annotations = |version| {
        build(&a, &cx(), 3, version, StoreEncoding::Binary)
            .expect("builds")
            .stateful_set
            .spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .unwrap_or_default()
    };
    let v1 = annotations(Some("101"));
    assert_eq!(v1[KAFKA_SECRET_VERSION_ANNOTATION], "101");
    assert_ne!(
        v1,
        annotations(Some("102")),
        "a new Secret version must roll the pods"
    );
    assert!(!annotations(None).contains_key(KAFKA_SECRET_VERSION_ANNOTATION));
}

#[test]
fn worker_role_is_limited_to_its_own_objects() {
    let c = build(&app(""), &cx(), 3, None, StoreEncoding::Binary).expect("builds");
    let rules = serde_json::to_value(&c.role.rules).expect("json");
    assert_eq!(
        rules[0]["resourceNames"],
        json!(["fraud-config", "fraud-assignment"])
    );
    assert_eq!(rules[1]["resources"], json!(["leases"]));
    assert_eq!(rules[1]["verbs"], json!(["get", "list", "watch"]));
    assert_eq!(
        rules[2]["resourceNames"],
        json!(["fraud-0-report", "fraud-1-report", "fraud-2-report"])
    );
    assert_eq!(rules[2]["verbs"], json!(["patch"]));
    assert_eq!(
        rules.as_array().map(Vec::len),
        Some(3),
        "no status, no events"
    );
    let leases: Vec<_> = c.report_leases.iter().map(|l| l.name_any()).collect();
    assert_eq!(
        leases,
        ["fraud-0-report", "fraud-1-report", "fraud-2-report"]
    );
    assert_eq!(
        c.report_leases[0].labels()[oxbow_crds::report::REPORT_OF_LABEL],
        "fraud"
    );
    let none = build(&app(""), &cx(), 0, None, StoreEncoding::Binary).expect("builds");
    let rules = serde_json::to_value(&none.role.rules).expect("json");
    assert!(
        rules
            .as_array()
            .expect("rules")
            .iter()
            .all(|r| r["verbs"] != json!(["patch"])),
        "without pods no Lease may be written (empty resourceNames means all): {rules}"
    );
    for r in rules.as_array().expect("rules") {
        assert!(
            !r["verbs"]
                .as_array()
                .expect("verbs")
                .iter()
                .any(|v| v == "delete" || v == "*"),
            "{r}"
        );
    }
}

#[test]
fn pod_template_overrides_add_labels_env_and_scheduling() {
    let a = app(
        "  podTemplate:\n    labels: {team: risk}\n    nodeSelector: {disk: ssd}\n    env: [{name: EXTRA, value: x}]\n",
    );
    let c = build(&a, &cx(), a.spec.replicas, None, StoreEncoding::Binary).expect("builds");
    let t = serde_json::to_value(c.stateful_set.spec.expect("spec").template).expect("json");
    assert_eq!(t["metadata"]["labels"]["team"], "risk");
    assert_eq!(
        t["metadata"]["labels"][APP_LABEL], "fraud",
        "own labels win"
    );
    assert_eq!(t["spec"]["nodeSelector"]["disk"], "ssd");
    assert!(
        t["spec"]["containers"][0]["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "EXTRA")
    );
}

#[test]
fn changing_the_standby_count_does_not_roll_the_pods() {
    // Placement alone acts on standbyReplicas (the workers get their standby tasks
    // from the assignment): restarting every worker to add a standby would cause the
    // very failover the standby is meant to soften.
    let a = app("");
    let mut more = a.clone();
    more.spec.standby_replicas = 2;
    assert_eq!(hash(&a), hash(&more));
    let config = render_config(&more).expect("renders");
    assert!(!config.contains("standbyReplicas"), "{config}");
}

fn args(a: &StreamApp) -> Vec<String> {
    let c = build(a, &cx(), a.spec.replicas, None, StoreEncoding::Binary).expect("builds");
    let t = serde_json::to_value(c.stateful_set.spec.expect("spec").template).expect("json");
    t["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

fn flag(a: &StreamApp, name: &str) -> Option<String> {
    let args = args(a);
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

fn memory_flag(a: &StreamApp) -> Option<String> {
    flag(a, "--memory-mib")
}

#[test]
fn a_cpu_limit_sets_the_processing_threads_rounded_up() {
    for (cpu, threads) in [
        ("\"2\"", "2"),
        ("500m", "1"),
        ("1500m", "2"),
        ("\"4\"", "4"),
    ] {
        let a = app(&format!("  resources: {{limits: {{cpu: {cpu}}}}}\n"));
        assert_eq!(flag(&a, "--threads").as_deref(), Some(threads), "cpu {cpu}");
    }
    let a = app("  resources: {limits: {cpu: \"1000\"}}\n");
    assert_eq!(flag(&a, "--threads"), Some(MAX_THREADS.to_string()));
}

#[test]
fn without_a_cpu_limit_the_worker_counts_its_cpus_itself() {
    assert_eq!(flag(&app(""), "--threads"), None);
    // A request is a share, not a ceiling: the pod may use more cores than it asks for.
    let a = app("  resources: {requests: {cpu: \"2\"}}\n");
    assert_eq!(flag(&a, "--threads"), None);
    let a = app("  resources: {limits: {cpu: 0m}}\n");
    assert_eq!(
        flag(&a, "--threads").as_deref(),
        Some("1"),
        "never zero threads"
    );
}

#[test]
fn a_memory_limit_gives_rocksdb_half_of_it() {
    let a = app("  resources: {limits: {memory: 1Gi}, requests: {memory: 512Mi}}\n");
    assert_eq!(memory_flag(&a).as_deref(), Some("512"));
    let a = app("  resources: {limits: {memory: 2G}}\n");
    assert_eq!(memory_flag(&a).as_deref(), Some("953"), "2 GB is 1907 MiB");
}

#[test]
fn without_a_memory_limit_the_worker_keeps_its_default_budget() {
    assert_eq!(memory_flag(&app("")), None);
    // A request is no ceiling: the pod may use more, so it says nothing about OOM.
    let a = app("  resources: {requests: {memory: 4Gi}, limits: {cpu: \"2\"}}\n");
    assert_eq!(memory_flag(&a), None);
}

#[test]
fn a_tiny_memory_limit_still_leaves_rocksdb_a_working_cache() {
    let a = app("  resources: {limits: {memory: 40Mi}}\n");
    assert_eq!(memory_flag(&a).as_deref(), Some("32"));
}

#[test]
fn quantities_parse_in_binary_decimal_and_exponent_notation() {
    let mib = 1024.0 * 1024.0;
    for (q, bytes) in [
        ("512Mi", 512.0 * mib),
        ("1Gi", 1024.0 * mib),
        ("1.5Gi", 1536.0 * mib),
        ("64Ki", 65536.0),
        ("2G", 2e9),
        ("1536M", 1.536e9),
        ("500k", 5e5),
        ("128974848", 128_974_848.0),
        ("129e6", 1.29e8),
        ("1E3", 1e3),
        ("+1Gi", 1024.0 * mib),
        ("500m", 0.5),
        (" 1Gi ", 1024.0 * mib),
    ] {
        assert_eq!(parse_quantity(q), Some(bytes), "{q}");
    }
}

#[test]
fn malformed_quantities_are_refused_rather_than_guessed() {
    for q in [
        "", "Gi", "1GB", "1gi", "1.2.3Mi", "--1", "1-2", ".", "1e", "1e+", "1ex", "1 Gi",
    ] {
        assert_eq!(parse_quantity(q), None, "{q:?}");
    }
}

#[test]
fn an_absurd_memory_limit_is_capped_rather_than_overflowing_the_worker() {
    let a = app("  resources: {limits: {memory: 9999999E}}\n");
    assert_eq!(memory_flag(&a), Some((1u64 << 30).to_string()));
}

#[test]
fn the_statefulset_size_is_the_one_passed_in_while_pods_drain() {
    let a = app("");
    let c = build(&a, &cx(), 5, None, StoreEncoding::Binary).expect("builds");
    assert_eq!(c.stateful_set.spec.and_then(|s| s.replicas), Some(5));
    assert_eq!(hash(&a), hash_at(&a, 5), "a drain does not roll the pods");
}

/// Two tasks, both on `fraud-0`.
fn one_pod_assignment() -> Assignment {
    oxbow_crds::assignment::next(
        None,
        &[oxbow_crds::assignment::PodFacts {
            pod: "fraud-0".into(),
            eligible: true,
            ..Default::default()
        }],
        oxbow_crds::assignment::Params {
            tasks: 2,
            stages: 1,
            standby_replicas: 0,
            warmup_max_lag: 0,
        },
    )
}

#[test]
fn the_assignment_configmap_holds_the_json_and_is_owned_like_every_child() {
    let a = app("");
    let assignment = one_pod_assignment();
    let cm = assignment_config_map(&a, &assignment).expect("builds");
    let v = serde_json::to_value(&cm).expect("json");
    assert_eq!(v["metadata"]["name"], "fraud-assignment");
    assert_eq!(v["metadata"]["labels"][APP_LABEL], "fraud");
    assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
    let text = v["data"][CONFIG_MAP_KEY].as_str().expect("data");
    let back: Assignment = serde_json::from_str(text).expect("an assignment");
    assert_eq!(back, assignment);
}

#[test]
fn a_network_policy_admits_the_query_port_only_from_own_pods_and_labelled_clients() {
    let a = app("");
    assert!(
        build(&a, &cx(), 3, None, StoreEncoding::Binary)
            .expect("builds")
            .network_policy
            .is_none(),
        "no policy unless the operator is asked for one"
    );
    let cx = BuildContext {
        query_client_label: Some(("oxbow.dev/query-client".into(), "true".into())),
        ..cx()
    };
    let np = build(&a, &cx, 3, None, StoreEncoding::Binary)
        .expect("builds")
        .network_policy
        .expect("a policy");
    let v = serde_json::to_value(&np).expect("json");
    let selector = json!({APP_LABEL: "fraud", "app.kubernetes.io/component": "worker"});
    assert_eq!(v["metadata"]["name"], "fraud");
    assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(v["spec"]["podSelector"]["matchLabels"], selector);
    assert_eq!(v["spec"]["policyTypes"], json!(["Ingress"]));
    let rules = v["spec"]["ingress"].as_array().expect("ingress");
    assert_eq!(rules.len(), 2, "the query port, and the metrics port");
    assert_eq!(
        rules[1],
        json!({"ports": [{"port": "metrics", "protocol": "TCP"}]}),
        "metrics from anywhere"
    );
    assert_eq!(
        rules[0]["ports"],
        json!([{"port": "http", "protocol": "TCP"}])
    );
    let client = json!({"oxbow.dev/query-client": "true"});
    assert_eq!(
        rules[0]["from"],
        json!([
            {"podSelector": {"matchLabels": selector}},
            {"podSelector": {"matchLabels": client}},
            {"namespaceSelector": {"matchLabels": client}, "podSelector": {"matchLabels": client}},
        ])
    );
}

/// Every child of an app that sets every field the build reads, as JSON: the committed
/// snapshot (`operator/tests/snapshots/children.json`) is what the build gives. Run with
/// `OXBOW_UPDATE_SNAPSHOT=1` to rewrite it after a deliberate change, and review the diff.
#[test]
fn the_children_of_a_full_spec_match_the_committed_snapshot() {
    let a = app(r#"  image: registry.local/oxbow-worker:9.9.9
  storage: {size: 5Gi, storageClassName: fast}
  deletionPolicy: {volumes: Delete}
  resources:
    requests: {cpu: 500m, memory: 512Mi}
    limits: {cpu: "2", memory: 1Gi}
  podTemplate:
    labels: {team: risk}
    annotations: {note: hello}
    nodeSelector: {disk: ssd}
    tolerations: [{key: dedicated, operator: Equal, value: stream, effect: NoSchedule}]
    affinity:
      podAntiAffinity:
        preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {oxbow.dev/streamapp: fraud}}
    priorityClassName: streaming
    terminationGracePeriodSeconds: 90
    env: [{name: RUST_LOG, value: debug}]
"#);
    let mut a = a;
    a.spec.kafka.secret_ref = Some(serde_yaml::from_str("{name: kafka-creds}").expect("ref"));
    let cx = BuildContext {
        default_image: "oxbow-worker:0.1.0".into(),
        query_client_label: Some(("oxbow.dev/query-client".into(), "true".into())),
    };
    let c = build(&a, &cx, 4, Some("12345"), StoreEncoding::Binary).expect("builds");
    let assignment = one_pod_assignment();
    let got = json!({
        "serviceAccount": c.service_account,
        "role": c.role,
        "roleBinding": c.role_binding,
        "configMap": c.config_map,
        "headlessService": c.headless_service,
        "clientService": c.client_service,
        "statefulSet": c.stateful_set,
        "podDisruptionBudget": c.pod_disruption_budget,
        "networkPolicy": c.network_policy,
        "reportLeases": c.report_leases,
        "assignmentConfigMap": assignment_config_map(&a, &assignment).expect("builds"),
    });
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/children.json");
    let text = serde_json::to_string_pretty(&got).expect("json") + "\n";
    if std::env::var_os("OXBOW_UPDATE_SNAPSHOT").is_some() {
        std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        std::fs::write(&path, &text).expect("write snapshot");
    }
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path)
            .expect("the snapshot exists (OXBOW_UPDATE_SNAPSHOT=1 writes it)"),
    )
    .expect("snapshot JSON");
    assert!(
        got == want,
        "the children differ from {}: run with OXBOW_UPDATE_SNAPSHOT=1 and review the diff",
        path.display()
    );
}
