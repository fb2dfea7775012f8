//! The API server validates what it is given: built-in validation, strict field
//! validation and CRD schemas with CEL rules all reject bad input with a message a
//! person can act on. Oxbow's own CRD relies on all three.

use oxbow_e2e::harness::{TestNamespace, kube_client, kubectl};

const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.e2e.oxbow.dev}
spec:
  group: e2e.oxbow.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1}
              max: {type: integer}
            x-kubernetes-validations:
            - rule: "!has(self.max) || self.size <= self.max"
              message: "size must not exceed max"
"#;

fn apply(ns: &str, manifest: &str) -> (bool, String) {
    let (ok, out, err) = kubectl(&["apply", "-n", ns, "-f", "-"], Some(manifest));
    (ok, format!("{out}{err}"))
}

#[tokio::test]
async fn bad_manifests_are_rejected_with_a_message_naming_the_field() {
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "invalid").await;

    let (ok, msg) = apply(
        &ns.name,
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: bad}\nspec:\n  replicas: -1\n  serviceName: bad\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec: {containers: [{name: c, image: x}]}\n",
    );
    assert!(!ok, "negative replicas must be rejected");
    assert!(
        msg.contains("spec.replicas") && msg.contains("greater than or equal to 0"),
        "message: {msg}"
    );

    let (ok, msg) = apply(
        &ns.name,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: typo}\ndatta: {a: b}\n",
    );
    assert!(
        !ok,
        "unknown fields must be rejected under strict validation"
    );
    assert!(
        msg.contains("unknown field") && msg.contains("datta"),
        "message: {msg}"
    );

    let (ok, msg) = apply(&ns.name, WIDGET_CRD);
    assert!(ok, "CRD apply failed: {msg}");
    let (ok, _, err) = kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            "crd/widgets.e2e.oxbow.dev",
        ],
        None,
    );
    assert!(ok, "CRD not established: {err}");

    let widget = |spec: &str| {
        format!("apiVersion: e2e.oxbow.dev/v1\nkind: Widget\nmetadata: {{name: w}}\nspec: {spec}\n")
    };
    let (ok, msg) = apply(&ns.name, &widget("{size: 0}"));
    assert!(
        !ok && msg.contains("spec.size") && msg.contains("greater than or equal to 1"),
        "OpenAPI minimum: {msg}"
    );
    let (ok, msg) = apply(&ns.name, &widget("{size: 5, max: 3}"));
    assert!(
        !ok && msg.contains("size must not exceed max"),
        "CEL rule message: {msg}"
    );
    let (ok, msg) = apply(&ns.name, &widget("{size: 2, max: 3}"));
    assert!(ok, "a valid widget is accepted: {msg}");

    ns.delete().await;
}
