//! The kind suite's manifests (`e2e/kind/`) hold up without a container engine: the real
//! API server accepts `kafka.yaml` (server-side dry run, strict field validation), and
//! the addresses and ports that `cluster.yaml`, `kafka.yaml`, `run.sh` and the root
//! `Dockerfile` rely on agree with each other, so pods and the host process both reach
//! Kafka at what the broker advertises.

use std::collections::BTreeMap;

use oxbow_e2e::harness::{TestNamespace, kube_client, kubectl, workspace_root};
use serde::Deserialize;
use serde_json::Value;

fn read(path: &str) -> String {
    std::fs::read_to_string(workspace_root().join(path))
        .unwrap_or_else(|e| panic!("failed to read {path}: {e}"))
}

/// Every YAML document of `path`, as JSON values.
fn documents(path: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(&read(path))
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{path} is not YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// The one document of `kind` named `name`.
fn object<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "e2e/kind/kafka.yaml has {} {kind} named {name}",
        found.len()
    );
    found[0]
}

/// `name=value` assigned at the start of a line of run.sh.
fn script_setting(script: &str, name: &str) -> String {
    let prefix = format!("{name}=");
    let values: Vec<&str> = script
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .collect();
    assert_eq!(
        values.len(),
        1,
        "e2e/kind/run.sh assigns {name} once: {values:?}"
    );
    values[0].trim().to_string()
}

/// `LISTENER://host:port,...` as listener name → (host, port).
fn listeners(spec: &str) -> BTreeMap<String, (String, u16)> {
    spec.split(',')
        .map(|l| {
            let (name, addr) = l
                .split_once("://")
                .unwrap_or_else(|| panic!("listener {l} has no name://"));
            let (host, port) = addr
                .rsplit_once(':')
                .unwrap_or_else(|| panic!("listener {l} has no port"));
            let port = port
                .parse()
                .unwrap_or_else(|e| panic!("listener {l}: bad port ({e})"));
            (name.to_string(), (host.to_string(), port))
        })
        .collect()
}

fn port_number(v: &Value, what: &str) -> u16 {
    v.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or_else(|| panic!("{what} is not a port number: {v}"))
}

#[tokio::test]
async fn kafka_yaml_passes_a_server_side_dry_run() {
    let docs = documents("e2e/kind/kafka.yaml");
    assert!(
        docs.len() >= 5,
        "kafka.yaml has a Namespace, three Services and a StatefulSet: {} documents",
        docs.len()
    );
    let client = kube_client().await;
    // On a cluster where run.sh applied kafka.yaml for real, dry-run it where it is (a
    // copy elsewhere would collide on the node port); otherwise into a fresh namespace.
    let (real, _, _) = kubectl(&["get", "namespace", "kafka"], None);
    let ns = if real {
        None
    } else {
        Some(TestNamespace::create(&client, "kind-kafka").await)
    };
    let text: String = docs
        .iter()
        .map(|d| {
            let mut d = d.clone();
            if let Some(ns) = &ns
                && d["kind"] != "Namespace"
            {
                d["metadata"]["namespace"] = ns.name.clone().into();
            }
            format!(
                "---\n{}",
                serde_yaml::to_string(&d).expect("a document as YAML")
            )
        })
        .collect();
    let (ok, out, err) = kubectl(
        &["apply", "--dry-run=server", "--validate=strict", "-f", "-"],
        Some(&text),
    );
    assert!(ok, "the API server rejects e2e/kind/kafka.yaml: {out}{err}");
    let accepted = out
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .count();
    assert_eq!(
        accepted,
        docs.len(),
        "every object is accepted by the server's dry run: {out}{err}"
    );
    if let Some(ns) = ns {
        ns.delete().await;
    }
}

#[test]
fn cluster_yaml_run_sh_and_kafka_yaml_agree_on_kafkas_addresses() {
    let kafka = documents("e2e/kind/kafka.yaml");
    let cluster = documents("e2e/kind/cluster.yaml");
    let script = read("e2e/kind/run.sh");
    assert_eq!(cluster.len(), 1, "cluster.yaml is one document");
    let cluster = &cluster[0];
    assert_eq!(cluster["kind"], "Cluster");
    assert_eq!(cluster["apiVersion"], "kind.x-k8s.io/v1alpha4");
    let nodes = cluster["nodes"]
        .as_array()
        .expect("cluster.yaml lists nodes");
    assert_eq!(nodes.len(), 1, "one node: {nodes:?}");
    assert_eq!(nodes[0]["role"], "control-plane");
    assert_eq!(
        cluster["networking"]["podSubnet"].as_str(),
        Some(script_setting(&script, "pod_subnet").as_str()),
        "run.sh routes the pod subnet cluster.yaml sets"
    );

    // The broker: image, replication settings, listeners.
    let namespace = object(&kafka, "Namespace", "kafka")["metadata"]["name"]
        .as_str()
        .expect("namespace name")
        .to_string();
    let sts = object(&kafka, "StatefulSet", "kafka");
    assert_eq!(sts["metadata"]["namespace"], namespace.as_str());
    assert_eq!(sts["spec"]["replicas"], 1);
    let pod = &sts["spec"]["template"]["spec"];
    assert_eq!(
        pod["enableServiceLinks"], false,
        "service links would give the broker KAFKA_PORT"
    );
    let container = &pod["containers"][0];
    assert_eq!(container["image"], "apache/kafka:4.1.2");
    let env: BTreeMap<&str, &str> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().expect("env name"),
                e["value"].as_str().expect("env values are strings"),
            )
        })
        .collect();
    for key in [
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ] {
        assert_eq!(env.get(key), Some(&"1"), "{key} on a single broker");
    }
    assert_eq!(env.get("KAFKA_PROCESS_ROLES"), Some(&"broker,controller"));
    let container_ports: BTreeMap<&str, u16> = container["ports"]
        .as_array()
        .expect("container ports")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("port name"),
                port_number(&p["containerPort"], "containerPort"),
            )
        })
        .collect();
    let bound = listeners(env["KAFKA_LISTENERS"]);
    let advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"]);
    assert_eq!(
        advertised.keys().collect::<Vec<_>>(),
        ["EXTERNAL", "INTERNAL"],
        "pods and the host each get a listener"
    );
    assert_eq!(
        env.get("KAFKA_INTER_BROKER_LISTENER_NAME"),
        Some(&"INTERNAL")
    );
    for (listener, port_name) in [("INTERNAL", "internal"), ("EXTERNAL", "external")] {
        assert_eq!(
            bound[listener].1, container_ports[port_name],
            "{listener} listens on the container port named {port_name}"
        );
    }
    assert_eq!(
        advertised["INTERNAL"].1, bound["INTERNAL"].1,
        "pods reach the INTERNAL listener directly"
    );

    // Pods: the advertised name is the pod's stable name under the headless Service, and
    // run.sh's in-cluster bootstrap is the Service `kafka`.
    let headless_name = sts["spec"]["serviceName"].as_str().expect("serviceName");
    let headless = object(&kafka, "Service", headless_name);
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(
        advertised["INTERNAL"].0,
        format!("kafka-0.{headless_name}.{namespace}.svc.cluster.local")
    );
    let service = object(&kafka, "Service", "kafka");
    let service_port = &service["spec"]["ports"][0];
    assert_eq!(service_port["targetPort"], "internal");
    assert_eq!(
        script_setting(&script, "kafka_in_cluster"),
        format!(
            "kafka.{namespace}.svc.cluster.local:{}",
            port_number(&service_port["port"], "Service kafka port")
        ),
        "run.sh's KAFKA_BOOTSTRAP_IN_CLUSTER is the Service kafka"
    );

    // The host: NodePort → kind's port mapping → 127.0.0.1:<hostPort>, which is what the
    // broker advertises on EXTERNAL and what run.sh exports as KAFKA_BOOTSTRAP.
    let external = object(&kafka, "Service", "kafka-external");
    assert_eq!(external["spec"]["type"], "NodePort");
    let node_port = &external["spec"]["ports"][0];
    assert_eq!(node_port["targetPort"], "external");
    let node_port = port_number(&node_port["nodePort"], "nodePort");
    let mapping = nodes[0]["extraPortMappings"]
        .as_array()
        .expect("extraPortMappings")
        .iter()
        .find(|m| m["containerPort"].as_u64() == Some(u64::from(node_port)))
        .unwrap_or_else(|| panic!("cluster.yaml maps no host port to node port {node_port}"));
    let host_port = port_number(&mapping["hostPort"], "hostPort");
    assert_eq!(mapping["listenAddress"], "127.0.0.1");
    assert_eq!(
        advertised["EXTERNAL"],
        ("127.0.0.1".to_string(), host_port),
        "the broker advertises the host's end of the mapping"
    );
    assert_eq!(
        script_setting(&script, "kafka_host_port"),
        host_port.to_string()
    );
    assert!(
        script.contains("export KAFKA_BOOTSTRAP=\"127.0.0.1:$kafka_host_port\""),
        "run.sh exports KAFKA_BOOTSTRAP from kafka_host_port"
    );
    assert!(
        script.contains("export KAFKA_BOOTSTRAP_IN_CLUSTER=\"$kafka_in_cluster\""),
        "run.sh exports KAFKA_BOOTSTRAP_IN_CLUSTER from kafka_in_cluster"
    );
}

#[test]
fn run_sh_builds_the_dockerfiles_targets_and_ci_runs_it() {
    let script = read("e2e/kind/run.sh");
    let dockerfile = read("Dockerfile");
    for target in ["operator", "worker"] {
        assert!(
            dockerfile
                .lines()
                .any(|l| l.starts_with("FROM ") && l.ends_with(&format!(" AS {target}"))),
            "the Dockerfile has a stage {target}"
        );
        assert!(
            script.contains(&format!("--target {target} ")),
            "run.sh builds the {target} target"
        );
    }
    let workflow = read(".github/workflows/kind.yml");
    assert!(
        workflow.contains("run: e2e/kind/run.sh"),
        "the kind workflow runs e2e/kind/run.sh"
    );
}
