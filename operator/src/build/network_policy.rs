//! The workers' NetworkPolicy (with `--network-policy`).
//!
//! Workers forward queries to the owner of a key, so the app's own pods must be
//! admitted; anyone else needs the client label (in the app's namespace, or in a
//! namespace that carries the same label). Egress stays open: Kafka is wherever the
//! spec says.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::match_labels;

fn port(name: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    }
}

/// `client`: the (key, value) of the label that admits a query client.
pub(super) fn build(
    metadata: ObjectMeta,
    selector: &BTreeMap<String, String>,
    (key, value): &(String, String),
) -> NetworkPolicy {
    let client = BTreeMap::from([(key.clone(), value.clone())]);
    let pods = |labels: &BTreeMap<String, String>| NetworkPolicyPeer {
        pod_selector: Some(match_labels(labels)),
        ..NetworkPolicyPeer::default()
    };
    NetworkPolicy {
        metadata,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(match_labels(selector)),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![
                        pods(selector),
                        pods(&client),
                        NetworkPolicyPeer {
                            namespace_selector: Some(match_labels(&client)),
                            pod_selector: Some(match_labels(&client)),
                            ..NetworkPolicyPeer::default()
                        },
                    ]),
                    ports: Some(vec![port("http")]),
                },
                // Metrics hold no state and no secret: any scraper.
                NetworkPolicyIngressRule {
                    from: None,
                    ports: Some(vec![port("metrics")]),
                },
            ]),
            ..NetworkPolicySpec::default()
        }),
    }
}
