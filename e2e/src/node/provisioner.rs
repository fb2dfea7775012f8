//! Local volume provisioning: a StorageClass whose claims become host directories.
//!
//! Owns the `oxbow-local` StorageClass (the default class) and the PVs it provisions.
//! A pending claim of that class gets a `hostPath` PV whose `claimRef` names it; the
//! controller-manager's PV binder then binds them, as with any external provisioner.
//! A released PV with reclaim policy `Delete` has its directory removed, so deleting a
//! PVC really loses the data. It must not touch claims of other classes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use super::FIELD_MANAGER;

pub const STORAGE_CLASS: &str = "oxbow-local";
pub const PROVISIONER: &str = "oxbow.dev/local-node";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

pub struct Provisioner {
    pub client: kube::Client,
    pub node_name: String,
    /// Parent of every provisioned volume directory.
    pub volumes_dir: PathBuf,
}

impl Provisioner {
    pub async fn ensure_storage_class(&self) -> Result<(), kube::Error> {
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        let sc = json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": true,
        });
        classes
            .patch(
                STORAGE_CLASS,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(sc),
            )
            .await?;
        Ok(())
    }

    /// Watches claims and volumes until the process ends; watch errors back off and retry.
    pub async fn run(self) {
        let claims: Api<PersistentVolumeClaim> = Api::all(self.client.clone());
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        let claim_events = watcher(claims, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let volume_events = watcher(volumes, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let mut claim_events = std::pin::pin!(claim_events);
        let mut volume_events = std::pin::pin!(volume_events);
        loop {
            tokio::select! {
                Some(ev) = claim_events.next() => match ev {
                    Ok(pvc) => if let Err(e) = self.provision(&pvc).await {
                        tracing::warn!(claim = ?pvc.metadata.name, error = %e, "failed to provision volume");
                    },
                    Err(e) => tracing::warn!(error = %e, "claim watch failed; retrying"),
                },
                Some(ev) = volume_events.next() => match ev {
                    Ok(pv) => if let Err(e) = self.reclaim(&pv).await {
                        tracing::warn!(volume = ?pv.metadata.name, error = %e, "failed to reclaim volume");
                    },
                    Err(e) => tracing::warn!(error = %e, "volume watch failed; retrying"),
                },
                else => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    async fn provision(&self, pvc: &PersistentVolumeClaim) -> anyhow::Result<()> {
        let spec = pvc.spec.clone().unwrap_or_default();
        let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
        if spec.storage_class_name.as_deref() != Some(STORAGE_CLASS)
            || spec.volume_name.is_some()
            || phase != Some("Pending")
            || pvc.metadata.deletion_timestamp.is_some()
        {
            return Ok(());
        }
        let (Some(uid), Some(ns), Some(name)) = (
            &pvc.metadata.uid,
            &pvc.metadata.namespace,
            &pvc.metadata.name,
        ) else {
            return Ok(());
        };
        let pv_name = format!("pvc-{uid}");
        let dir = self.volumes_dir.join(&pv_name);
        std::fs::create_dir_all(&dir)?;
        let size = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone())
            .unwrap_or_else(|| "1Gi".to_string());
        let pv = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": pv_name,
                "annotations": {PROVISIONED_BY: PROVISIONER},
                "labels": {"oxbow.dev/claim-namespace": ns},
            },
            "spec": {
                "capacity": {"storage": size},
                "accessModes": spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": STORAGE_CLASS,
                "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "namespace": ns, "name": name, "uid": uid},
                "hostPath": {"path": dir.to_string_lossy(), "type": "DirectoryOrCreate"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [self.node_name]}
                ]}]}},
            },
        });
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        match volumes
            .create(&PostParams::default(), &serde_json::from_value(pv)?)
            .await
        {
            Ok(_) => {
                tracing::info!(%ns, claim = %name, volume = %pv_name, dir = %dir.display(), "provisioned volume");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn reclaim(&self, pv: &PersistentVolume) -> anyhow::Result<()> {
        let ours = pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PROVISIONED_BY))
            .is_some_and(|p| p == PROVISIONER);
        let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let delete = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some("Delete");
        let Some(name) = &pv.metadata.name else {
            return Ok(());
        };
        if !(ours && released && delete) || pv.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        if let Some(path) = pv
            .spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .map(|h| PathBuf::from(&h.path))
        {
            // Only ever delete inside our own volumes directory.
            if path.starts_with(&self.volumes_dir) && path != Path::new(&self.volumes_dir) {
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        match volumes.delete(name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(volume = %name, "reclaimed released volume"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }
}
