//! Which store encoding the workers are told (`--store-encoding`): a pure decision from
//! the live StatefulSet.
//!
//! Every worker since the binary encoding reads both encodings; a worker from before it
//! reads JSON alone, and it may read another pod's values (a standby, a restore from the
//! changelog) while a rolling update runs. So an app moves to binary only when no such
//! worker can be left: when its StatefulSet does not exist yet, or when every pod runs a
//! template that already names an encoding (built by this operator, so a worker that
//! reads both) with the image about to be applied. An app an earlier operator ran rolls
//! twice: once to a worker that reads both while still writing JSON, then to binary, as
//! Kafka Streams' two-bounce `upgrade.from` does, without the user's second edit. Once
//! binary, an app stays binary.
//!
//! It must not read or write anything: the rollout step applies what it decides.

use k8s_openapi::api::apps::v1::StatefulSet;
use oxbow_crds::StoreEncoding;

use crate::build::{live_image, live_store_encoding, template_rolled_out};

/// The encoding to write into the template about to be applied; `image`: the worker
/// image that template runs.
pub(super) fn decide(live: Option<&StatefulSet>, image: &str) -> StoreEncoding {
    let Some(sts) = live else {
        return StoreEncoding::Binary;
    };
    match live_store_encoding(sts) {
        Some(StoreEncoding::Binary) => StoreEncoding::Binary,
        Some(StoreEncoding::Json) if live_image(sts) == Some(image) && every_pod_updated(sts) => {
            StoreEncoding::Binary
        }
        _ => StoreEncoding::Json,
    }
}

/// The StatefulSet controller has seen the live template and every pod runs it, ready.
fn every_pod_updated(sts: &StatefulSet) -> bool {
    let Some(st) = &sts.status else {
        return false;
    };
    let want = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    template_rolled_out(sts)
        && st.replicas == want
        && st.updated_replicas.unwrap_or(0) == want
        && st.ready_replicas.unwrap_or(0) == want
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{StatefulSetSpec, StatefulSetStatus};
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};

    use super::*;

    const IMAGE: &str = "oxbow-worker:0.2.0";

    /// A StatefulSet of 3 whose worker runs `image` with `args`; `updated` pods of
    /// them run the live template, all ready.
    fn sts(image: &str, args: &[&str], updated: i32) -> StatefulSet {
        StatefulSet {
            metadata: kube::api::ObjectMeta {
                generation: Some(4),
                ..Default::default()
            },
            spec: Some(StatefulSetSpec {
                replicas: Some(3),
                template: PodTemplateSpec {
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "worker".into(),
                            image: Some(image.into()),
                            args: Some(args.iter().map(|a| a.to_string()).collect()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            }),
            status: Some(StatefulSetStatus {
                observed_generation: Some(4),
                replicas: 3,
                ready_replicas: Some(3),
                updated_replicas: Some(updated),
                current_revision: Some(if updated == 3 { "b" } else { "a" }.into()),
                update_revision: Some("b".into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_new_app_writes_binary_from_its_first_pod() {
        assert_eq!(decide(None, IMAGE), StoreEncoding::Binary);
    }

    #[test]
    fn an_app_an_earlier_operator_ran_first_rolls_to_a_worker_that_reads_both() {
        let old = sts("oxbow-worker:0.1.0", &["run", "--threads", "2"], 3);
        assert_eq!(decide(Some(&old), IMAGE), StoreEncoding::Json);
    }

    #[test]
    fn binary_waits_until_every_pod_runs_the_template_that_reads_both() {
        let args = ["run", "--store-encoding", "json"];
        assert_eq!(
            decide(Some(&sts(IMAGE, &args, 2)), IMAGE),
            StoreEncoding::Json,
            "one pod still runs the old template"
        );
        assert_eq!(
            decide(Some(&sts(IMAGE, &args, 3)), IMAGE),
            StoreEncoding::Binary
        );
        let mut unready = sts(IMAGE, &args, 3);
        if let Some(st) = unready.status.as_mut() {
            st.ready_replicas = Some(2);
        }
        assert_eq!(decide(Some(&unready), IMAGE), StoreEncoding::Json);
        let mut unseen = sts(IMAGE, &args, 3);
        unseen.metadata.generation = Some(5);
        assert_eq!(
            decide(Some(&unseen), IMAGE),
            StoreEncoding::Json,
            "the StatefulSet controller has not seen the latest template"
        );
    }

    #[test]
    fn a_new_image_rolls_out_before_the_encoding_changes() {
        let live = sts(
            "oxbow-worker:0.1.9",
            &["run", "--store-encoding", "json"],
            3,
        );
        assert_eq!(decide(Some(&live), IMAGE), StoreEncoding::Json);
    }

    #[test]
    fn an_app_once_binary_stays_binary() {
        let live = sts("other:1", &["run", "--store-encoding", "binary"], 1);
        assert_eq!(decide(Some(&live), IMAGE), StoreEncoding::Binary);
    }
}
