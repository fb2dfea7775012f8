//! Each worker pod's report Lease (see `oxbow_crds::report`): made by the operator,
//! renewed by its pod, which may patch it and nothing else.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::ResourceExt;
use oxbow_crds::StreamApp;

use super::ChildMeta;

/// One Lease per pod of a StatefulSet of `replicas`, labelled for the watches of its
/// app's pods and the operator.
pub(super) fn all(app: &StreamApp, meta: &ChildMeta, replicas: i32) -> Vec<Lease> {
    (0..replicas.max(0))
        .map(|i| {
            let mut metadata = meta.named(oxbow_crds::report::lease_name(&format!(
                "{}-{i}",
                app.worker_name()
            )));
            metadata
                .labels
                .get_or_insert_default()
                .insert(oxbow_crds::report::REPORT_OF_LABEL.into(), app.name_any());
            Lease {
                metadata,
                spec: Some(LeaseSpec::default()),
            }
        })
        .collect()
}
