//! The CRD under charts/oxbow/crds/ is generated from the Rust types; this fails when
//! someone changes one without the other. `OXBOW_UPDATE_CRD=1 cargo test` rewrites it.

use std::path::PathBuf;

#[test]
fn committed_crd_matches_the_types() {
    let root = PathBuf::from(manifest_dir()).join("..");
    let path = root.join(oxbow_crds::crd::CRD_PATH);
    let want = oxbow_crds::crd::crd_yaml();
    if std::env::var_os("OXBOW_UPDATE_CRD").is_some() {
        std::fs::write(&path, &want).expect("write CRD");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is out of date with crds/src/streamapp.rs: run `OXBOW_UPDATE_CRD=1 cargo test -p oxbow-crds` (or `oxbow-operator crd > {}`) and commit it",
        path.display(),
        oxbow_crds::crd::CRD_PATH
    );
}

/// This crate's directory. Cargo sets `CARGO_MANIFEST_DIR` when it runs a test too, and
/// that value is the checkout being tested: the compile-time one is wherever the binary
/// was built, and a target directory shared by two checkouts (CI's clone and a working
/// copy) hands one checkout's test binaries to the other when the sources match.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}
