//! The Helm chart (`charts/oxbow`): `helm lint --strict` is clean, every combination of
//! values a user is likely to set renders objects the real API server accepts (server-side
//! dry run), the rendered objects keep their promises (non-root, read-only root
//! filesystem, no capabilities, namespaced RBAC when one namespace is watched, image
//! tags from appVersion), and bad values fail with a message naming the value.

use oxbow_e2e::harness::{TestNamespace, helm, kube_client, kubectl, workspace_root};
use serde::Deserialize;
use serde_yaml::Value;

fn chart() -> String {
    workspace_root()
        .join("charts/oxbow")
        .to_string_lossy()
        .into_owned()
}

fn app_version() -> String {
    let text = std::fs::read_to_string(workspace_root().join("charts/oxbow/Chart.yaml"))
        .expect("read Chart.yaml");
    let chart: Value = serde_yaml::from_str(&text).expect("Chart.yaml is YAML");
    chart["appVersion"]
        .as_str()
        .expect("appVersion")
        .to_string()
}

/// `helm template` with `sets`; panics with helm's message when it fails.
fn render(ns: &str, sets: &[&str]) -> String {
    let chart = chart();
    let mut args = vec!["template", "oxbow", chart.as_str(), "--namespace", ns];
    for s in sets {
        args.extend(["--set", s]);
    }
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm template {sets:?} failed: {err}");
    out
}

fn objects(rendered: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(rendered)
        .map(|d| Value::deserialize(d).expect("rendered YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

fn args_of(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

/// Every namespaced object names its namespace (the chart spans the release namespace
/// and the watched one), so no `-n` here.
fn dry_run(rendered: &str, what: &str) {
    let (ok, out, err) = kubectl(
        &["apply", "--dry-run=server", "--validate=strict", "-f", "-"],
        Some(rendered),
    );
    assert!(
        ok,
        "the API server refused the chart rendered with {what}: {err}\n{out}"
    );
}

#[test]
fn helm_lint_is_clean_in_strict_mode() {
    let chart = chart();
    let (ok, out, err) = helm(&["lint", "--strict", &chart]);
    assert!(ok, "helm lint --strict failed:\n{out}{err}");
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[tokio::test]
async fn every_values_combination_renders_objects_the_api_server_accepts() {
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "chart").await;
    let watched = TestNamespace::create(&client, "chart-apps").await;
    let watch = format!("watchNamespace={}", watched.name);
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("the defaults", vec![]),
        ("one watched namespace", vec![watch.as_str()]),
        (
            "two replicas",
            vec!["replicaCount=2", "networkPolicy.enabled=true"],
        ),
        (
            "an existing service account and no RBAC",
            vec![
                "serviceAccount.create=false",
                "serviceAccount.name=ops",
                "rbac.create=false",
                "metrics.service.enabled=false",
            ],
        ),
    ];
    for (what, sets) in &cases {
        let rendered = render(&ns.name, sets);
        dry_run(&rendered, what);
    }

    // The defaults: cluster-wide RBAC, one replica, images at appVersion, locked down.
    let objs = objects(&render(&ns.name, &[]));
    let version = app_version();
    let dep = find(&objs, "Deployment");
    assert_eq!(dep.len(), 1, "one operator Deployment");
    let dep = dep[0];
    let pod = &dep["spec"]["template"]["spec"];
    let ctr = &pod["containers"][0];
    assert_eq!(
        ctr["image"].as_str(),
        Some(format!("ghcr.io/oxbow/oxbow-operator:{version}").as_str())
    );
    let args = args_of(dep);
    assert!(
        args.contains(&format!(
            "--worker-image=ghcr.io/oxbow/oxbow-worker:{version}"
        )),
        "{args:?}"
    );
    assert!(args.contains(&"--leader-election=true".to_string()));
    assert!(
        !args.iter().any(|a| a.starts_with("--namespace")),
        "no watched namespace by default: {args:?}"
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], Value::Bool(true));
    assert_eq!(
        ctr["securityContext"]["readOnlyRootFilesystem"],
        Value::Bool(true)
    );
    assert_eq!(
        ctr["securityContext"]["allowPrivilegeEscalation"],
        Value::Bool(false)
    );
    assert_eq!(
        ctr["securityContext"]["capabilities"]["drop"][0].as_str(),
        Some("ALL")
    );
    assert_eq!(find(&objs, "ClusterRole").len(), 1);
    assert_eq!(find(&objs, "ClusterRoleBinding").len(), 1);
    assert!(
        find(&objs, "PodDisruptionBudget").is_empty(),
        "no PDB for one replica"
    );
    let rules = find(&objs, "ClusterRole")[0]["rules"]
        .as_sequence()
        .expect("rules");
    let secrets = rules
        .iter()
        .find(|r| r["resources"][0] == "secrets")
        .expect("a secrets rule");
    assert_eq!(
        secrets["verbs"].as_sequence().map(|v| v.len()),
        Some(1),
        "secrets: get only, never list or watch: {secrets:?}"
    );
    assert!(
        !rules.iter().any(|r| r["resources"][0] == "pods"
            && r["verbs"]
                .as_sequence()
                .is_some_and(|v| v.iter().any(|x| x == "delete"))),
        "the operator never deletes pods"
    );

    // One watched namespace: a Role there instead of a ClusterRole; the Lease stays home.
    let objs = objects(&render(&ns.name, &[watch.as_str()]));
    assert!(
        find(&objs, "ClusterRole").is_empty(),
        "no cluster-wide RBAC"
    );
    let roles = find(&objs, "Role");
    assert!(
        roles
            .iter()
            .any(|r| r["metadata"]["namespace"].as_str() == Some(watched.name.as_str())),
        "a Role in the watched namespace"
    );
    assert!(
        roles.iter().any(|r| {
            r["metadata"]["namespace"].as_str() == Some(ns.name.as_str())
                && r["rules"][0]["resources"][0] == "leases"
        }),
        "the leader Lease Role in the release namespace"
    );
    let args = args_of(find(&objs, "Deployment")[0]);
    assert!(
        args.contains(&format!("--namespace={}", watched.name)),
        "{args:?}"
    );
    assert!(args.contains(&"--leader-election-namespace=$(POD_NAMESPACE)".to_string()));

    // Two replicas: a PDB, and the NetworkPolicy flags reach the operator.
    let objs = objects(&render(
        &ns.name,
        &["replicaCount=2", "networkPolicy.enabled=true"],
    ));
    assert_eq!(find(&objs, "PodDisruptionBudget").len(), 1);
    let args = args_of(find(&objs, "Deployment")[0]);
    assert!(args.contains(&"--network-policy".to_string()), "{args:?}");
    assert!(
        args.contains(&"--network-policy-client-label=oxbow.dev/query-client=true".to_string()),
        "{args:?}"
    );
    watched.delete().await;
    ns.delete().await;
}

#[test]
fn bad_values_fail_with_a_message_naming_the_value() {
    let chart = chart();
    let cases: [(&[&str], &str); 5] = [
        (&["replicaCount=-1"], "replicaCount"),
        (&["operator.failoverTimeout=30"], "failoverTimeout"),
        (&["imageTag=1.0"], "imageTag"),
        (&["watchNamespace=Not_A_Namespace"], "watchNamespace"),
        (
            &["replicaCount=2", "leaderElection.enabled=false"],
            "leaderElection.enabled",
        ),
    ];
    for (sets, named) in cases {
        let mut args = vec!["template", "oxbow", chart.as_str()];
        for s in sets {
            args.extend(["--set", s]);
        }
        let (ok, _, err) = helm(&args);
        assert!(!ok, "helm accepted {sets:?}");
        assert!(
            err.contains(named),
            "the error for {sets:?} does not name {named}: {err}"
        );
    }
}
