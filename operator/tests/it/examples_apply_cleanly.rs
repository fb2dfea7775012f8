//! Every manifest under examples/ is accepted by the real API server (server-side dry
//! run, so the CRD's schema and CEL rules are applied) and passes the operator's own
//! runtime checks.

use oxbow_e2e::harness::{TestNamespace, install_crd, kube_client, kubectl, workspace_root};

#[tokio::test]
async fn every_example_manifest_is_accepted() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "examples").await;
    let mut checked = 0;
    for entry in std::fs::read_dir(workspace_root().join("examples")).expect("examples/") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read example");
        let (ok, out, err) = kubectl(
            &["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"],
            Some(&text),
        );
        assert!(ok, "{} is rejected: {out}{err}", path.display());
        for doc in text.split("\n---") {
            if let Ok(app) = serde_yaml::from_str::<oxbow_crds::StreamApp>(doc) {
                let errors = oxbow_crds::validate::validate_spec(&app.spec);
                assert!(errors.is_empty(), "{}: {errors:?}", path.display());
            }
        }
        checked += 1;
    }
    assert!(checked >= 1, "examples/ has at least one manifest");
    ns.delete().await;
}
