//! Pod volumes as host directories.
//!
//! Owns `<root>/pods/<uid>/volumes/` (ConfigMap, Secret, projected, downward-API and
//! emptyDir volumes, written here and removed with the pod). A PVC volume is the bound
//! PV's own directory, which outlives the pod; this module never deletes it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
    Volume,
};
use kube::api::{Api, PostParams};

use super::env::{EnvSources, Mount, field_ref};

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("failed to mount volume {volume}: PersistentVolumeClaim {claim} is not bound yet")]
    ClaimNotBound { volume: String, claim: String },
    #[error("failed to mount volume {volume}: {kind} {name} does not exist")]
    SourceMissing {
        volume: String,
        kind: &'static str,
        name: String,
    },
    #[error("failed to mount volume {volume}: its PV {pv} is neither hostPath nor local")]
    UnsupportedVolumeSource { volume: String, pv: String },
    #[error(
        "failed to mount volume {volume}: volume type {kind} is not supported by the local node agent"
    )]
    UnsupportedType { volume: String, kind: String },
    #[error("failed to mount volume {volume}: {source}")]
    Api { volume: String, source: kube::Error },
    #[error("failed to write volume {volume}: {source}")]
    Io {
        volume: String,
        source: std::io::Error,
    },
}

impl VolumeError {
    /// Waiting on another controller (the PV binder) rather than a broken spec.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::ClaimNotBound { .. } | Self::Api { .. })
    }
}

pub struct VolumeContext<'a> {
    pub client: &'a kube::Client,
    pub pod: &'a Pod,
    pub pod_dir: &'a Path,
    pub env: &'a EnvSources,
}

/// Prepares every volume of the pod and returns volume name → host directory.
pub async fn prepare(cx: &VolumeContext<'_>) -> Result<HashMap<String, PathBuf>, VolumeError> {
    let mut dirs = HashMap::new();
    for v in cx
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let dir = prepare_one(cx, v).await?;
        dirs.insert(v.name.clone(), dir);
    }
    Ok(dirs)
}

/// The mounts of one container: its `volumeMounts` mapped to host directories.
pub fn container_mounts(
    mounts: Option<&Vec<k8s_openapi::api::core::v1::VolumeMount>>,
    dirs: &HashMap<String, PathBuf>,
) -> Vec<Mount> {
    mounts
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let base = dirs.get(&m.name)?;
            let host = match m.sub_path.as_deref().filter(|p| !p.is_empty()) {
                Some(sub) => base.join(sub),
                None => base.clone(),
            };
            Some(Mount {
                container_path: m.mount_path.clone(),
                host_path: host.to_string_lossy().into_owned(),
            })
        })
        .collect()
}

fn ns(pod: &Pod) -> String {
    pod.metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into())
}

async fn prepare_one(cx: &VolumeContext<'_>, v: &Volume) -> Result<PathBuf, VolumeError> {
    let io = |source| VolumeError::Io {
        volume: v.name.clone(),
        source,
    };
    let own_dir = cx.pod_dir.join("volumes").join(&v.name);
    if let Some(pvc) = &v.persistent_volume_claim {
        return claim_dir(cx, &v.name, &pvc.claim_name).await;
    }
    if let Some(hp) = &v.host_path {
        let p = PathBuf::from(&hp.path);
        if matches!(hp.type_.as_deref(), Some("DirectoryOrCreate")) {
            std::fs::create_dir_all(&p).map_err(io)?;
        }
        return Ok(p);
    }
    std::fs::create_dir_all(&own_dir).map_err(io)?;
    if v.empty_dir.is_some() {
        return Ok(own_dir);
    }
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    if let Some(cm) = &v.config_map {
        source_files(
            cx,
            &v.name,
            DataSource::ConfigMap,
            &cm.name,
            cm.items.as_ref(),
            cm.optional,
            &mut files,
        )
        .await?;
    } else if let Some(sec) = &v.secret {
        let name = sec.secret_name.clone().unwrap_or_default();
        source_files(
            cx,
            &v.name,
            DataSource::Secret,
            &name,
            sec.items.as_ref(),
            sec.optional,
            &mut files,
        )
        .await?;
    } else if let Some(dapi) = &v.downward_api {
        downward_files(cx, dapi.items.as_ref(), &mut files);
    } else if let Some(proj) = &v.projected {
        for s in proj.sources.iter().flatten() {
            if let Some(cm) = &s.config_map {
                source_files(
                    cx,
                    &v.name,
                    DataSource::ConfigMap,
                    &cm.name,
                    cm.items.as_ref(),
                    cm.optional,
                    &mut files,
                )
                .await?;
            }
            if let Some(sec) = &s.secret {
                source_files(
                    cx,
                    &v.name,
                    DataSource::Secret,
                    &sec.name,
                    sec.items.as_ref(),
                    sec.optional,
                    &mut files,
                )
                .await?;
            }
            if let Some(d) = &s.downward_api {
                downward_files(cx, d.items.as_ref(), &mut files);
            }
            if let Some(t) = &s.service_account_token {
                let audiences = t.audience.clone().map(|a| vec![a]).unwrap_or_default();
                let token = request_token(cx.client, cx.pod, audiences, t.expiration_seconds)
                    .await
                    .map_err(|source| VolumeError::Api {
                        volume: v.name.clone(),
                        source,
                    })?;
                files.insert(t.path.clone(), token.into_bytes());
            }
        }
    } else {
        return Err(VolumeError::UnsupportedType {
            volume: v.name.clone(),
            kind: volume_kind(v),
        });
    }
    for (path, bytes) in files {
        let target = own_dir.join(&path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(&target, bytes).map_err(io)?;
    }
    Ok(own_dir)
}

/// Downward-API items (pod fields) as files.
fn downward_files(
    cx: &VolumeContext<'_>,
    items: Option<&Vec<k8s_openapi::api::core::v1::DownwardAPIVolumeFile>>,
    files: &mut BTreeMap<String, Vec<u8>>,
) {
    for item in items.into_iter().flatten() {
        if let Some(f) = &item.field_ref {
            let value = field_ref(cx.pod, cx.env, &f.field_path).unwrap_or_default();
            files.insert(item.path.clone(), value.into_bytes());
        }
    }
}

fn volume_kind(v: &Volume) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|j| {
            j.as_object().map(|o| {
                o.keys()
                    .filter(|k| *k != "name")
                    .cloned()
                    .collect::<Vec<_>>()
            })
        })
        .map(|k| k.join(","))
        .unwrap_or_else(|| "unknown".into())
}

async fn claim_dir(
    cx: &VolumeContext<'_>,
    volume: &str,
    claim: &str,
) -> Result<PathBuf, VolumeError> {
    let api_err = |source| VolumeError::Api {
        volume: volume.to_string(),
        source,
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cx.client.clone(), &ns(cx.pod));
    let pvc = claims
        .get_opt(claim)
        .await
        .map_err(api_err)?
        .ok_or_else(|| VolumeError::SourceMissing {
            volume: volume.into(),
            kind: "PersistentVolumeClaim",
            name: claim.into(),
        })?;
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let Some(pv_name) = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|_| bound)
    else {
        return Err(VolumeError::ClaimNotBound {
            volume: volume.into(),
            claim: claim.into(),
        });
    };
    let volumes: Api<PersistentVolume> = Api::all(cx.client.clone());
    let pv = volumes.get(&pv_name).await.map_err(api_err)?;
    let spec = pv.spec.unwrap_or_default();
    let path = spec
        .host_path
        .map(|h| h.path)
        .or(spec.local.map(|l| l.path))
        .ok_or_else(|| VolumeError::UnsupportedVolumeSource {
            volume: volume.into(),
            pv: pv_name.clone(),
        })?;
    let path = PathBuf::from(path);
    std::fs::create_dir_all(&path).map_err(|source| VolumeError::Io {
        volume: volume.into(),
        source,
    })?;
    Ok(path)
}

fn select_items(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    out: &mut BTreeMap<String, Vec<u8>>,
) {
    match items {
        Some(items) => {
            for it in items {
                if let Some(v) = data.get(&it.key) {
                    out.insert(it.path.clone(), v.clone());
                }
            }
        }
        None => out.extend(data),
    }
}

/// Where file or env data comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataSource {
    ConfigMap,
    Secret,
}

impl DataSource {
    fn kind(self) -> &'static str {
        match self {
            DataSource::ConfigMap => "ConfigMap",
            DataSource::Secret => "Secret",
        }
    }
}

/// The data of a ConfigMap (data + binaryData) or a Secret (data + stringData) in the
/// pod's namespace, as bytes; `None` when it does not exist.
pub async fn object_data(
    client: &kube::Client,
    namespace: &str,
    source: DataSource,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, kube::Error> {
    Ok(match source {
        DataSource::ConfigMap => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
            api.get_opt(name).await?.map(|cm| {
                let mut data: BTreeMap<String, Vec<u8>> = cm
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .collect();
                data.extend(
                    cm.binary_data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0)),
                );
                data
            })
        }
        DataSource::Secret => {
            let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
            api.get_opt(name).await?.map(|s| {
                let mut data: BTreeMap<String, Vec<u8>> = s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, ByteString(v))| (k, v))
                    .collect();
                data.extend(
                    s.string_data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes())),
                );
                data
            })
        }
    })
}

/// Files of a ConfigMap or Secret volume (or projected source), honouring `items` and
/// `optional`.
async fn source_files(
    cx: &VolumeContext<'_>,
    volume: &str,
    source: DataSource,
    name: &str,
    items: Option<&Vec<KeyToPath>>,
    optional: Option<bool>,
    out: &mut BTreeMap<String, Vec<u8>>,
) -> Result<(), VolumeError> {
    let data = object_data(cx.client, &ns(cx.pod), source, name)
        .await
        .map_err(|source| VolumeError::Api {
            volume: volume.into(),
            source,
        })?;
    match data {
        Some(data) => {
            select_items(data, items, out);
            Ok(())
        }
        None if optional == Some(true) => Ok(()),
        None => Err(VolumeError::SourceMissing {
            volume: volume.into(),
            kind: source.kind(),
            name: name.into(),
        }),
    }
}

/// A ServiceAccount token bound to the pod, as the kubelet requests it. 3607 s is the
/// kubelet's own request: the API server extends such pod-bound tokens (to a year by
/// default), so a long-running pod keeps a valid credential without a refresh loop.
pub async fn request_token(
    client: &kube::Client,
    pod: &Pod,
    audiences: Vec<String>,
    expiration_seconds: Option<i64>,
) -> Result<String, kube::Error> {
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns(pod));
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences,
            expiration_seconds: Some(expiration_seconds.unwrap_or(3607)),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let resp = api
        .create_token_request(&sa, &PostParams::default(), &req)
        .await?;
    Ok(resp.status.map(|s| s.token).unwrap_or_default())
}
