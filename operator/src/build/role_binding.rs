//! The worker's RoleBinding: its Role to its ServiceAccount, nothing wider.

use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Binds the Role of the same name to the ServiceAccount `sa_name`.
pub(super) fn build(metadata: ObjectMeta, sa_name: &str, namespace: &str) -> RoleBinding {
    RoleBinding {
        metadata,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: sa_name.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa_name.into(),
            namespace: Some(namespace.into()),
            ..Subject::default()
        }]),
    }
}
