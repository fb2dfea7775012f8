//! The worker's ServiceAccount: the identity its Role is bound to, and the one the API
//! server sees when a worker renews its report Lease.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub(super) fn build(metadata: ObjectMeta) -> ServiceAccount {
    ServiceAccount {
        metadata,
        ..ServiceAccount::default()
    }
}
