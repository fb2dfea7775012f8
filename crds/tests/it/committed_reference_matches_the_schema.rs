//! docs/reference/streamapp-fields.md is rendered from the CRD's schema; this fails when
//! someone changes the types without regenerating it.
//! `OXBOW_UPDATE_REFERENCE=1 cargo test --release -p oxbow-crds` rewrites it.

use std::path::PathBuf;

#[test]
fn committed_reference_matches_the_schema() {
    let root = PathBuf::from(manifest_dir()).join("..");
    let path = root.join(oxbow_crds::reference::REFERENCE_PATH);
    let want = oxbow_crds::reference::streamapp_fields_md();
    if std::env::var_os("OXBOW_UPDATE_REFERENCE").is_some() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("create docs/reference");
        }
        std::fs::write(&path, &want).expect("write the field reference");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is out of date with crds/src/streamapp.rs: run `OXBOW_UPDATE_REFERENCE=1 cargo test --release -p oxbow-crds --test it committed_reference` and commit it",
        oxbow_crds::reference::REFERENCE_PATH
    );
}

/// The reference only helps if it says what each field means: every Oxbow field of the
/// spec and the status carries a description (the Kubernetes types the reference names
/// rather than expands bring their own).
#[test]
fn every_spec_and_status_field_has_a_description() {
    fn walk(path: &str, node: &serde_json::Value, missing: &mut Vec<String>) {
        if oxbow_crds::reference::STREAMAPP_EXTERNAL
            .iter()
            .any(|e| e.path == path)
        {
            return;
        }
        if let Some(props) = node.get("properties").and_then(|p| p.as_object()) {
            for (name, child) in props {
                let p = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                let described = child
                    .get("description")
                    .and_then(|d| d.as_str())
                    .is_some_and(|d| !d.trim().is_empty());
                if !described && (p.starts_with("spec") || p.starts_with("status")) {
                    missing.push(p.clone());
                }
                walk(&p, child, missing);
            }
        }
        if let Some(items) = node.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
        if let Some(values) = node.get("additionalProperties").filter(|v| v.is_object()) {
            walk(&format!("{path}.*"), values, missing);
        }
    }
    let mut missing = Vec::new();
    walk("", &oxbow_crds::reference::streamapp_schema(), &mut missing);
    assert!(
        missing.is_empty(),
        "fields without a description (add a doc comment in crds/src/streamapp.rs): {missing:?}"
    );
}

/// This crate's directory. Cargo sets `CARGO_MANIFEST_DIR` when it runs a test too, and
/// that value is the checkout being tested: the compile-time one is wherever the binary
/// was built, and a target directory shared by two checkouts (CI's clone and a working
/// copy) hands one checkout's test binaries to the other when the sources match.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}
