//! The worker Services: a headless one that gives each pod a DNS name (peers forward
//! queries by it, ready or not), and a ClusterIP one for clients' queries.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::HTTP_PORT;

fn http_port() -> ServicePort {
    ServicePort {
        name: Some("http".into()),
        port: HTTP_PORT,
        target_port: Some(IntOrString::String("http".into())),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

pub(super) fn headless(metadata: ObjectMeta, selector: &BTreeMap<String, String>) -> Service {
    Service {
        metadata,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector.clone()),
            ports: Some(vec![http_port()]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

pub(super) fn client(metadata: ObjectMeta, selector: &BTreeMap<String, String>) -> Service {
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector.clone()),
            ports: Some(vec![http_port()]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
