//! Worker pods deleted mid-stream under exactly-once: a pod deleted with its volume
//! comes back and restores only the tail; a pod deleted together with its volume has its
//! tasks taken over by their standbys within seconds while the new pod rebuilds. With
//! input flowing throughout, the committed output is exact: per key the running counts
//! are 1..n, each once, and n is everything produced.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use oxbow_crds::{InstanceStatus, StreamApp};
use oxbow_e2e::harness::{kubectl, wait_for};
use oxbow_e2e::streams::{Input, RunningApp, http_get, keys, pod_uid, wait_exactly_once};

/// All 12 tasks are active on Running pods, counting only reports written after `since`
/// (a deleted pod's last report must not pass for a running task).
async fn all_tasks_running(
    api: &Api<StreamApp>,
    name: &str,
    since: Timestamp,
) -> Result<Vec<String>, String> {
    let app = api.get(name).await.map_err(|e| e.to_string())?;
    let st = app.status.unwrap_or_default();
    let fresh = |i: &&InstanceStatus| {
        i.updated_at
            .as_deref()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .is_some_and(|t| t.as_second() >= since.as_second())
    };
    let mut tasks: Vec<oxbow_crds::TaskId> = st
        .instances
        .iter()
        .filter(fresh)
        .filter(|i| i.state.as_deref() == Some("Running"))
        .flat_map(|i| i.active_tasks.clone())
        .filter_map(|t| t.parse().ok())
        .collect();
    tasks.sort_unstable();
    if tasks == oxbow_crds::TaskId::all(1, 12).collect::<Vec<_>>() {
        Ok(st
            .instances
            .iter()
            .map(|i| format!("{}:{:?}", i.pod, i.active_tasks))
            .collect())
    } else {
        Err(format!("running actives reported since {since}: {tasks:?}"))
    }
}

/// Rounds to the next second: reports carry whole seconds.
fn after_now() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second() + 1).unwrap_or(now)
}

#[tokio::test]
async fn deleted_pods_and_volumes_lose_and_duplicate_nothing() {
    let run = RunningApp::start("failover", |a| a).await;
    let (n, name, api) = (run.ns.name.clone(), run.name().to_string(), &run.api);
    let keys = keys(48);
    let input = Input::start(&run.app.source, &keys, Duration::from_millis(50));

    // 1. A pod deleted with its volume: it comes back and restores only the tail.
    let pod1 = format!("{name}-1");
    let uid_before = pod_uid(&n, &pod1);
    let (ok, _, err) = kubectl(&["delete", "pod", "-n", &n, &pod1, "--wait=false"], None);
    assert!(ok, "{err}");
    wait_for(
        "the deleted pod to be recreated",
        Duration::from_secs(60),
        || async {
            let uid = pod_uid(&n, &pod1);
            if !uid.is_empty() && uid != uid_before {
                Ok(())
            } else {
                Err(format!("uid {uid}"))
            }
        },
    )
    .await;
    let since = after_now();
    wait_for("every task running again", Duration::from_secs(90), || {
        all_tasks_running(api, &name, since)
    })
    .await;
    // Its tasks went to their standbys meanwhile; balancing gives it tasks back once
    // its copies (the kept volume, caught up from their checkpoints) are warm.
    let addr = wait_for(
        "the recreated pod to run active tasks again",
        Duration::from_secs(90),
        || async {
            let st = api
                .get(&name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            let i = st
                .instances
                .iter()
                .find(|i| i.pod == pod1)
                .ok_or("no entry")?;
            if i.active_tasks.len() >= 3 && i.state.as_deref() == Some("Running") {
                i.address.clone().ok_or_else(|| "no address".to_string())
            } else {
                Err(format!("{:?} {:?}", i.state, i.active_tasks))
            }
        },
    )
    .await;
    let (_, body) = http_get(&addr, "/v1/status").await.expect("worker status");
    let st: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
    let mut actives = 0;
    for t in st["tasks"].as_array().expect("tasks") {
        if t["role"] != "active" {
            continue;
        }
        actives += 1;
        let mode = t["restore"]["mode"].as_str().unwrap_or("none");
        assert!(
            mode == "tail" || mode == "upToDate",
            "the recreated pod kept its volume, yet task {} restored with mode {mode}: {t}",
            t["task"]
        );
    }
    assert!(actives >= 3, "{body}");

    // 2. A pod deleted with its volume: standbys take its tasks over within seconds.
    let pod2 = format!("{name}-2");
    let (ok, _, err) = kubectl(
        &[
            "delete",
            "pvc",
            "-n",
            &n,
            &format!("state-{pod2}"),
            "--wait=false",
        ],
        None,
    );
    assert!(ok, "{err}");
    let t0 = Instant::now();
    let since = after_now();
    let (ok, _, err) = kubectl(&["delete", "pod", "-n", &n, &pod2, "--wait=false"], None);
    assert!(ok, "{err}");
    let placement = wait_for(
        "every task running again after losing a volume",
        Duration::from_secs(60),
        || all_tasks_running(api, &name, since),
    )
    .await;
    let took = t0.elapsed();
    println!(
        "failover: every task running again {took:?} after the pod and volume were deleted: {placement:?}"
    );
    assert!(
        took < Duration::from_secs(30),
        "processing resumed only after {took:?}"
    );

    // The recreated pod rebuilds (as a standby first) and the app is Ready again.
    run.wait_ready("180s");
    // The input never stopped through both failures. A few more rounds after them, so
    // the check covers records produced after the failover too: waited for, not
    // assumed, since a quick failover leaves only a few rounds (19 in one run).
    let enough = (input.rounds() + 3).max(20);
    wait_for(
        "input to flow on after the failures",
        Duration::from_secs(60),
        || async {
            let r = input.rounds();
            if r >= enough {
                Ok(())
            } else {
                Err(format!("{r} of {enough} rounds"))
            }
        },
    )
    .await;
    let want = input.stop();
    assert!(want >= enough, "input stopped at {want} rounds");
    wait_exactly_once(&run.app.sink(), &keys, want).await;
    run.finish().await;
}
