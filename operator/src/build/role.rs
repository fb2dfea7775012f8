//! The worker's Role. Least privilege: a worker reads its own ConfigMaps and its app's
//! reports, and renews its app's report Leases; nothing else. It writes no status and
//! no events.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use oxbow_crds::StreamApp;

fn rule(group: &str, resource: &str, names: Option<Vec<String>>, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        resource_names: names,
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..PolicyRule::default()
    }
}

pub(super) fn build(app: &StreamApp, metadata: ObjectMeta, report_leases: &[Lease]) -> Role {
    let read = ["get", "list", "watch"];
    let mut rules = vec![
        rule(
            "",
            "configmaps",
            Some(vec![
                app.config_map_name(),
                app.assignment_config_map_name(),
            ]),
            &read,
        ),
        // A label selector cannot be combined with resourceNames: reading Leases is
        // namespace-wide (they hold no secrets); writing them is not.
        rule("coordination.k8s.io", "leases", None, &read),
    ];
    let lease_names: Vec<String> = report_leases
        .iter()
        .filter_map(|l| l.metadata.name.clone())
        .collect();
    // An empty resourceNames would grant every name: no rule at all without pods.
    if !lease_names.is_empty() {
        rules.push(rule(
            "coordination.k8s.io",
            "leases",
            Some(lease_names),
            &["patch"],
        ));
    }
    Role {
        metadata,
        rules: Some(rules),
    }
}
