//! Container environment and command lines, resolved the way the kubelet does it.
//!
//! Pure: every value the resolution needs (pod fields, ConfigMaps, Secrets, the pod IP)
//! is read beforehand and passed in. This module owns `$(VAR)` expansion and the
//! rewriting of mount paths to host directories; it must not touch the API or the disk.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

/// A value a container's environment refers to could not be resolved.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvError {
    #[error("failed to resolve env {var}: ConfigMap {name} or its key {key} does not exist")]
    MissingConfigMapKey {
        var: String,
        name: String,
        key: String,
    },
    #[error("failed to resolve env {var}: Secret {name} or its key {key} does not exist")]
    MissingSecretKey {
        var: String,
        name: String,
        key: String,
    },
    #[error(
        "failed to resolve env {var}: field path {path} is not supported by the local node agent"
    )]
    UnsupportedFieldPath { var: String, path: String },
    #[error("failed to resolve envFrom: {kind} {name} does not exist")]
    MissingSource { kind: &'static str, name: String },
    #[error("failed to resolve env {var}: it has neither value nor a supported valueFrom")]
    EmptyValueFrom { var: String },
}

/// Everything env resolution may look at, already read from the API.
#[derive(Debug, Default, Clone)]
pub struct EnvSources {
    pub pod_ip: String,
    pub host_ip: String,
    pub node_name: String,
    /// ConfigMap name → data.
    pub config_maps: HashMap<String, BTreeMap<String, String>>,
    /// Secret name → decoded data (non-UTF-8 values are replaced lossily).
    pub secrets: HashMap<String, BTreeMap<String, String>>,
}

/// Resolves `metadata.name`, `status.podIP` and friends for a downward-API reference.
pub fn field_ref(pod: &Pod, src: &EnvSources, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let label_or_annotation = |prefix: &str, map: Option<&BTreeMap<String, String>>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .or_else(|| Some(src.node_name.clone())),
        "spec.serviceAccountName" => Some(
            spec.and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".to_string()),
        ),
        "status.podIP" | "status.podIPs" => Some(src.pod_ip.clone()),
        "status.hostIP" | "status.hostIPs" => Some(src.host_ip.clone()),
        _ => label_or_annotation("metadata.labels['", meta.labels.as_ref())
            .or_else(|| label_or_annotation("metadata.annotations['", meta.annotations.as_ref())),
    }
}

/// The container's environment in definition order, with `$(VAR)` references expanded
/// against the variables defined before them, as the kubelet does.
pub fn resolve_env(
    pod: &Pod,
    container: &Container,
    src: &EnvSources,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut out: Vec<(String, String)> = Vec::new();
    let set = |out: &mut Vec<(String, String)>, k: String, v: String| {
        if let Some(slot) = out.iter_mut().find(|(name, _)| *name == k) {
            slot.1 = v;
        } else {
            out.push((k, v));
        }
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(cm) = &from.config_map_ref {
            match src.config_maps.get(&cm.name) {
                Some(data) => data
                    .iter()
                    .for_each(|(k, v)| set(&mut out, format!("{prefix}{k}"), v.clone())),
                None if cm.optional == Some(true) => {}
                None => {
                    return Err(EnvError::MissingSource {
                        kind: "ConfigMap",
                        name: cm.name.clone(),
                    });
                }
            }
        }
        if let Some(sec) = &from.secret_ref {
            match src.secrets.get(&sec.name) {
                Some(data) => data
                    .iter()
                    .for_each(|(k, v)| set(&mut out, format!("{prefix}{k}"), v.clone())),
                None if sec.optional == Some(true) => {}
                None => {
                    return Err(EnvError::MissingSource {
                        kind: "Secret",
                        name: sec.name.clone(),
                    });
                }
            }
        }
    }
    for var in container.env.iter().flatten() {
        if let Some(value) = resolve_var(pod, var, src)? {
            let expanded = {
                let lookup =
                    |name: &str| out.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
                expand(&value, lookup)
            };
            set(&mut out, var.name.clone(), expanded);
        }
    }
    Ok(out)
}

fn resolve_var(pod: &Pod, var: &EnvVar, src: &EnvSources) -> Result<Option<String>, EnvError> {
    let Some(from) = &var.value_from else {
        return Ok(Some(var.value.clone().unwrap_or_default()));
    };
    if let Some(f) = &from.field_ref {
        return field_ref(pod, src, &f.field_path).map(Some).ok_or_else(|| {
            EnvError::UnsupportedFieldPath {
                var: var.name.clone(),
                path: f.field_path.clone(),
            }
        });
    }
    if let Some(r) = &from.config_map_key_ref {
        return match src.config_maps.get(&r.name).and_then(|d| d.get(&r.key)) {
            Some(v) => Ok(Some(v.clone())),
            None if r.optional == Some(true) => Ok(None),
            None => Err(EnvError::MissingConfigMapKey {
                var: var.name.clone(),
                name: r.name.clone(),
                key: r.key.clone(),
            }),
        };
    }
    if let Some(r) = &from.secret_key_ref {
        return match src.secrets.get(&r.name).and_then(|d| d.get(&r.key)) {
            Some(v) => Ok(Some(v.clone())),
            None if r.optional == Some(true) => Ok(None),
            None => Err(EnvError::MissingSecretKey {
                var: var.name.clone(),
                name: r.name.clone(),
                key: r.key.clone(),
            }),
        };
    }
    if from.resource_field_ref.is_some() {
        // No cgroups here: report "no limit" the way the kubelet does without one (0 = unset).
        return Ok(Some("0".to_string()));
    }
    Err(EnvError::EmptyValueFrom {
        var: var.name.clone(),
    })
}

/// Expands `$(NAME)` with `lookup`; `$$(NAME)` yields a literal `$(NAME)`; references that
/// do not resolve are left as written (Kubernetes' documented behaviour).
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            out.push('$');
            rest = escaped;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A container path (`mountPath`) and the host directory that stands in for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
}

/// Rewrites container mount paths inside `s` to their host directories.
///
/// There is no mount namespace: a process sees the host's filesystem, so a path it is
/// told on its command line or in its environment must already be the host path. A mount
/// path matches at a path boundary only (`/data` matches `/data` and `/data/x`, not
/// `/database`); the longest mount path wins.
pub fn rewrite_paths(s: &str, mounts: &[Mount]) -> String {
    let mut sorted: Vec<&Mount> = mounts.iter().collect();
    sorted.sort_by_key(|m| std::cmp::Reverse(m.container_path.len()));
    let is_delim = |c: char| matches!(c, '=' | ' ' | ':' | ',' | '"' | '\'' | ';');
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let bytes = s.as_bytes();
    'outer: while i < s.len() {
        let at_boundary = i == 0 || s[..i].chars().next_back().is_some_and(is_delim);
        if at_boundary && bytes[i] == b'/' {
            for m in &sorted {
                let cp = m.container_path.trim_end_matches('/');
                if cp.is_empty() {
                    continue;
                }
                if s[i..].starts_with(cp) {
                    let end = i + cp.len();
                    let next = s[end..].chars().next();
                    if next.is_none() || next == Some('/') || next.is_some_and(is_delim) {
                        out.push_str(m.host_path.trim_end_matches('/'));
                        i = end;
                        continue 'outer;
                    }
                }
            }
        }
        let ch = s[i..].chars().next().unwrap_or_default();
        out.push(ch);
        i += ch.len_utf8().max(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounts() -> Vec<Mount> {
        vec![
            Mount {
                container_path: "/data".into(),
                host_path: "/h/pv1".into(),
            },
            Mount {
                container_path: "/data/logs".into(),
                host_path: "/h/logs".into(),
            },
            Mount {
                container_path: "/etc/oxbow".into(),
                host_path: "/h/cm".into(),
            },
        ]
    }

    #[test]
    fn expand_replaces_known_references_and_keeps_unknown_ones() {
        let lookup = |k: &str| (k == "POD_IP").then(|| "127.0.1.2".to_string());
        assert_eq!(expand("$(POD_IP):8080", lookup), "127.0.1.2:8080");
        assert_eq!(expand("$(NOPE)/x", lookup), "$(NOPE)/x");
        assert_eq!(expand("$$(POD_IP)", lookup), "$(POD_IP)");
        assert_eq!(expand("cost $5 (x)", lookup), "cost $5 (x)");
        assert_eq!(expand("$(unterminated", lookup), "$(unterminated");
    }

    #[test]
    fn rewrite_paths_matches_only_at_path_boundaries() {
        let m = mounts();
        assert_eq!(rewrite_paths("/data", &m), "/h/pv1");
        assert_eq!(rewrite_paths("/data/x.txt", &m), "/h/pv1/x.txt");
        assert_eq!(
            rewrite_paths("--state-dir=/data/state", &m),
            "--state-dir=/h/pv1/state"
        );
        assert_eq!(rewrite_paths("/database", &m), "/database");
        assert_eq!(rewrite_paths("x/data", &m), "x/data");
        assert_eq!(
            rewrite_paths("/etc/oxbow/config.yaml", &m),
            "/h/cm/config.yaml"
        );
    }

    #[test]
    fn rewrite_paths_prefers_the_longest_mount() {
        assert_eq!(rewrite_paths("/data/logs/a", &mounts()), "/h/logs/a");
    }

    fn pod_with_env(env: Vec<EnvVar>) -> (Pod, Container) {
        let container = Container {
            name: "c".into(),
            env: Some(env),
            ..Default::default()
        };
        let mut pod = Pod::default();
        pod.metadata.name = Some("p-0".into());
        pod.metadata.namespace = Some("ns".into());
        (pod, container)
    }

    #[test]
    fn resolve_env_expands_earlier_variables_and_downward_api_fields() {
        use k8s_openapi::api::core::v1::{EnvVarSource, ObjectFieldSelector};
        let field = |p: &str| {
            Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: p.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        let (pod, c) = pod_with_env(vec![
            EnvVar {
                name: "POD_NAME".into(),
                value_from: field("metadata.name"),
                ..Default::default()
            },
            EnvVar {
                name: "POD_IP".into(),
                value_from: field("status.podIP"),
                ..Default::default()
            },
            EnvVar {
                name: "ADDR".into(),
                value: Some("$(POD_IP):80".into()),
                ..Default::default()
            },
        ]);
        let src = EnvSources {
            pod_ip: "127.0.1.9".into(),
            ..Default::default()
        };
        let env = resolve_env(&pod, &c, &src).expect("resolves");
        assert_eq!(
            env,
            vec![
                ("POD_NAME".into(), "p-0".into()),
                ("POD_IP".into(), "127.0.1.9".into()),
                ("ADDR".into(), "127.0.1.9:80".into()),
            ]
        );
    }

    #[test]
    fn resolve_env_names_the_missing_config_map_key() {
        use k8s_openapi::api::core::v1::{ConfigMapKeySelector, EnvVarSource};
        let (pod, c) = pod_with_env(vec![EnvVar {
            name: "X".into(),
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: "cfg".into(),
                    key: "k".into(),
                    optional: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        let err = resolve_env(&pod, &c, &EnvSources::default()).expect_err("must fail");
        assert_eq!(
            err,
            EnvError::MissingConfigMapKey {
                var: "X".into(),
                name: "cfg".into(),
                key: "k".into()
            }
        );
    }
}
