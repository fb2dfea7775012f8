//! docs/reference/streamapp-fields.md is rendered from the CRD's schema; this fails when
//! someone changes the types without regenerating it.
//! `OXBOW_UPDATE_REFERENCE=1 cargo test --release -p oxbow-crds` rewrites it.

use std::path::PathBuf;

#[test]
fn committed_reference_matches_the_schema() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
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
        "{} is out of date with crds/src/streamapp.rs: run `OXBOW_UPDATE_REFERENCE=1 cargo test --release -p oxbow-crds --test committed_reference_matches_the_schema` and commit it",
        oxbow_crds::reference::REFERENCE_PATH
    );
}
