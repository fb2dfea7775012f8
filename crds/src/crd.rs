//! The CRD manifest generated from the types, as committed under `charts/oxbow/crds/`.

use kube::CustomResourceExt;

use crate::streamapp::StreamApp;

/// Path of the committed CRD, relative to the workspace root.
pub const CRD_PATH: &str = "charts/oxbow/crds/streamapps.oxbow.dev.yaml";

/// The CRD as YAML with a header saying where it comes from.
pub fn crd_yaml() -> String {
    let body = serde_yaml::to_string(&StreamApp::crd())
        .unwrap_or_else(|e| format!("# failed to render the CRD: {e}\n"));
    format!("# Generated from crds/src/streamapp.rs by `oxbow-operator crd`. Do not edit.\n{body}")
}
