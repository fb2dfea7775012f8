//! Credentials for the end-to-end tests: Secrets of Kafka properties, and the bearer
//! tokens that worker pods ask of their queries (`docs/queries.md#access`).

use crate::harness::kubectl;

/// `kubectl create secret generic <name>` with these literals and files.
pub fn create_secret(ns: &str, name: &str, literals: &[(&str, String)], files: &[(&str, String)]) {
    let args = secret_args(ns, name, literals, files, false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, _, err) = kubectl(&args, None);
    assert!(ok, "create secret {name}: {err}");
}

/// Replaces the data of Secret `name` (`kubectl create --dry-run | kubectl apply`).
pub fn replace_secret(ns: &str, name: &str, literals: &[(&str, String)], files: &[(&str, String)]) {
    let args = secret_args(ns, name, literals, files, true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, yaml, err) = kubectl(&args, None);
    assert!(ok, "render secret {name}: {err}");
    let (ok, _, err) = kubectl(&["apply", "-n", ns, "-f", "-"], Some(&yaml));
    assert!(ok, "replace secret {name}: {err}");
}

fn secret_args<'a>(
    ns: &'a str,
    name: &'a str,
    literals: &[(&str, String)],
    files: &[(&str, String)],
    dry_run: bool,
) -> Vec<String> {
    let mut args: Vec<String> = ["create", "secret", "generic", name, "-n", ns]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if dry_run {
        args.extend(["--dry-run=client", "-o", "yaml"].map(String::from));
    }
    args.extend(
        literals
            .iter()
            .map(|(k, v)| format!("--from-literal={k}={v}")),
    );
    args.extend(files.iter().map(|(k, f)| format!("--from-file={k}={f}")));
    args
}

/// A ServiceAccount token in namespace `ns` (`kubectl create token`, one hour).
pub fn service_account_token(ns: &str, account: &str) -> String {
    let (ok, token, err) = kubectl(
        &["create", "token", account, "-n", ns, "--duration=1h"],
        None,
    );
    assert!(ok, "kubectl create token {account}: {err}");
    token.trim().to_string()
}

/// A bearer token of an identity that may query every StreamApp (`get` on
/// `streamapps/query` cluster-wide), for tests that read worker pods' state over HTTP.
/// Made once per test process.
pub fn query_token() -> String {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN
        .get_or_init(|| {
            let rbac = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: oxbow-e2e-query, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: oxbow-e2e-query}
rules:
- {apiGroups: [oxbow.dev], resources: [streamapps/query], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: oxbow-e2e-query}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: oxbow-e2e-query}
subjects:
- {kind: ServiceAccount, name: oxbow-e2e-query, namespace: default}
"#;
            let (ok, _, err) = kubectl(&["apply", "-f", "-"], Some(rbac));
            assert!(ok, "the e2e query identity: {err}");
            service_account_token("default", "oxbow-e2e-query")
        })
        .clone()
}
