//! `kubectl scale` on a StreamApp with input flowing: 3 → 4 pods, then 4 → 2. Every
//! active that moves between two live pods moves to a pod that held it as a standby in
//! the generation before (warm-up first), output never stalls for long (commits every
//! 200 ms; a gap of 1 s fails), pods leave only after their tasks moved, and the
//! committed output is exact.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use oxbow_crds::StreamApp;
use oxbow_crds::assignment::{Assignment, CONFIG_MAP_KEY};
use oxbow_e2e::harness::{apps, kafka_bootstrap, kubectl, unique, wait_for};
use oxbow_e2e::streams::{Input, RunningApp, keys, wait_exactly_once};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

/// Reads the output as it is committed and records when records arrive.
fn watch_output(topic: String, stop: Arc<AtomicBool>, arrivals: Arc<Mutex<Vec<Instant>>>) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("watch"))
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "20")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..12 {
        tpl.add_partition_offset(&topic, p, Offset::End)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    while !stop.load(Ordering::SeqCst) {
        if let Some(Ok(_)) = c.poll(Duration::from_millis(50))
            && let Ok(mut a) = arrivals.lock()
        {
            a.push(Instant::now());
        }
    }
}

/// The longest stretch without output between `from` and `to`.
fn longest_gap(arrivals: &[Instant], from: Instant, to: Instant) -> Duration {
    let mut last = from;
    let mut worst = Duration::ZERO;
    for a in arrivals.iter().filter(|a| **a >= from && **a <= to) {
        worst = worst.max(a.duration_since(last));
        last = *a;
    }
    worst.max(to.duration_since(last))
}

async fn wait_settled(api: &Api<StreamApp>, name: &str, pods: usize) {
    wait_for(
        &format!("{name} Ready on {pods} pods"),
        Duration::from_secs(180),
        || async {
            let app = api.get(name).await.map_err(|e| e.to_string())?;
            let st = app.status.clone().unwrap_or_default();
            let ready = apps::condition(&app, "Ready").map(|c| c.0);
            let busy = st
                .instances
                .iter()
                .filter(|i| !i.active_tasks.is_empty())
                .count();
            if ready.as_deref() == Some("True") && busy == pods && st.replicas == pods as i32 {
                Ok(())
            } else {
                Err(format!(
                    "Ready {ready:?}, {busy} pods with actives, {} replicas: {:?}",
                    st.replicas,
                    st.instances
                        .iter()
                        .map(|i| (&i.pod, &i.active_tasks))
                        .collect::<Vec<_>>()
                ))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn scaling_moves_only_warm_tasks_and_output_keeps_flowing() {
    let run = RunningApp::start("scale", |a| a).await;
    let (client, n, name, api) = (
        run.client.clone(),
        run.ns.name.clone(),
        run.name().to_string(),
        &run.api,
    );
    wait_settled(api, &name, 3).await;

    // Every published assignment, in order.
    let history: Arc<Mutex<Vec<Assignment>>> = Arc::default();
    let cm_watch = {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &n);
        let history = history.clone();
        let cm_name = format!("{name}-assignment");
        tokio::spawn(async move {
            let mut s = std::pin::pin!(
                watcher(
                    cms,
                    watcher::Config::default().fields(&format!("metadata.name={cm_name}"))
                )
                .applied_objects()
            );
            while let Some(Ok(cm)) = s.next().await {
                let Some(a) = cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(CONFIG_MAP_KEY))
                    .and_then(|j| serde_json::from_str::<Assignment>(j).ok())
                else {
                    continue;
                };
                if let Ok(mut h) = history.lock()
                    && h.last().is_none_or(|l| l.generation < a.generation)
                {
                    h.push(a);
                }
            }
        })
    };

    let keys = keys(48);
    let stop = Arc::new(AtomicBool::new(false));
    let arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let watcher_thread = {
        let (stop, arrivals, topic) = (stop.clone(), arrivals.clone(), run.app.sink());
        std::thread::spawn(move || watch_output(topic, stop, arrivals))
    };
    let input = Input::start(&run.app.source, &keys, Duration::from_millis(20));
    wait_for("output to flow", Duration::from_secs(30), || async {
        let n = arrivals.lock().map(|a| a.len()).unwrap_or(0);
        if n > 100 {
            Ok(())
        } else {
            Err(format!("{n} records out"))
        }
    })
    .await;

    // Scale out: 3 → 4.
    let out_start = Instant::now();
    let (ok, _, err) = kubectl(
        &["scale", "-n", &n, &format!("sapp/{name}"), "--replicas=4"],
        None,
    );
    assert!(ok, "scale to 4: {err}");
    wait_settled(api, &name, 4).await;
    let out_end = Instant::now();

    // Scale in: 4 → 2.
    let (ok, _, err) = kubectl(
        &["scale", "-n", &n, &format!("sapp/{name}"), "--replicas=2"],
        None,
    );
    assert!(ok, "scale to 2: {err}");
    wait_settled(api, &name, 2).await;
    let in_end = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &n);
    wait_for(
        "pods 2 and 3 to be gone",
        Duration::from_secs(60),
        || async {
            let left = pods
                .list(&ListParams::default().labels(&format!("oxbow.dev/streamapp={name}")))
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            if left == 2 {
                Ok(())
            } else {
                Err(format!("{left} pods"))
            }
        },
    )
    .await;

    let want = input.stop();
    stop.store(true, Ordering::SeqCst);
    watcher_thread.join().expect("output watcher");
    cm_watch.abort();

    // Output kept flowing through both moves.
    let arrivals = arrivals.lock().map(|a| a.clone()).unwrap_or_default();
    let gap_out = longest_gap(&arrivals, out_start, out_end);
    let gap_in = longest_gap(&arrivals, out_end, in_end);
    println!(
        "scale 3→4 took {:?}, longest output gap {gap_out:?}; scale 4→2 took {:?}, longest output gap {gap_in:?}",
        out_end - out_start,
        in_end - out_end
    );
    // A task that moves is fenced first, and librdkafka's coordinator timer alone is
    // 500 ms of that. On 2 cores the longest gaps were 0.46-0.78 s in most runs, and
    // 1.0 s (alone) or 1.1 s (in the full suite) in about one run in five, with the
    // restore settings of before and after 2026-12-08 alike. A restore on the
    // processing thread, which this guards against, stalled output for seconds.
    for (what, gap) in [("3→4", gap_out), ("4→2", gap_in)] {
        assert!(
            gap < Duration::from_millis(1500),
            "output stalled for {gap:?} while scaling {what}"
        );
    }

    // Every move between live pods went to a warm standby.
    let history = history.lock().map(|h| h.clone()).unwrap_or_default();
    assert!(history.len() >= 2, "assignments seen: {history:?}");
    let mut moves = 0;
    for pair in history.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        for (t, p) in &after.tasks {
            let Some(old) = before.tasks.get(t) else {
                continue;
            };
            if old.active == p.active || !after.pods.contains(&old.active) {
                continue;
            }
            moves += 1;
            assert!(
                old.standbys.contains(&p.active),
                "task {t} moved from {} to {} in generation {} without warming up there first (standbys before: {:?})",
                old.active,
                p.active,
                after.generation,
                old.standbys
            );
        }
    }
    assert!(moves >= 3, "scaling moved {moves} tasks: {history:?}");

    wait_exactly_once(&run.app.sink(), &keys, want).await;
    run.finish().await;
}
