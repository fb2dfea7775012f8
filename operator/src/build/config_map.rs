//! The ConfigMaps: the worker's config file (`<name>-config`) and the assignment
//! (`<name>-assignment`), each one file under one key.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A ConfigMap holding `text` under `key`.
pub(super) fn with_file(metadata: ObjectMeta, key: &str, text: String) -> ConfigMap {
    ConfigMap {
        metadata,
        data: Some(BTreeMap::from([(key.to_string(), text)])),
        ..ConfigMap::default()
    }
}
