//! At-least-once under repeated SIGKILLs of worker processes in their pods, with a
//! standby per task: a killed active may leave changelog records of work whose offsets
//! it never committed; the standby that takes over must not apply them (they are
//! reprocessed). Output may repeat, but the state must be exact: per key the final
//! count equals what was produced, no count is skipped, and queries answer it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kube::api::Api;
use oxbow_crds::StreamApp;
use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kube_client, kubectl, stack_var,
    unique, wait_for,
};
use oxbow_e2e::streams::{CountingApp, http_get, produce, read_committed};

/// SIGKILLs the worker container of `pod`, as the OOM killer would.
fn kill9(ns: &str, pod: &str) {
    let uid = kubectl(
        &[
            "get",
            "pod",
            "-n",
            ns,
            pod,
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        None,
    )
    .1;
    let pid_file = std::path::Path::new(&stack_var("OXBOW_STACK_DIR"))
        .join("node/pids")
        .join(format!("{uid}-worker.pid"));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()))
        .trim()
        .parse()
        .expect("pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL the worker");
}

#[tokio::test]
async fn killed_actives_hand_over_to_standbys_without_double_counting() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "alos").await;
    let n = ns.name.clone();
    let source = unique("events");
    kafka::create_topic(&source, 12).await;
    let operator = OperatorProcess::start_with(&n, &["--failover-timeout", "15s"]);
    let mut app = CountingApp::new(&unique("count"), &source).replicas(2);
    app.guarantee = "at_least_once";
    let name = app.name.clone();
    kafka::create_topic(&app.sink(), 12).await;
    let (ok, _, err) = kubectl(&["apply", "-n", &n, "-f", "-"], Some(&app.manifest()));
    assert!(ok, "apply: {err}");
    let ready = |timeout: &str| {
        kubectl(
            &[
                "wait",
                "-n",
                &n,
                "--for=condition=Ready",
                &format!("streamapp/{name}"),
                &format!("--timeout={timeout}"),
            ],
            None,
        )
    };
    let (ok, out, err) = ready("240s");
    assert!(ok, "not Ready: {out}{err}\n{}", operator.logs());
    let api: Api<StreamApp> = Api::namespaced(client.clone(), &n);

    let keys: Vec<String> = (0..48).map(|i| format!("user-{i}")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let producer = {
        let (stop, rounds, keys, source) =
            (stop.clone(), rounds.clone(), keys.clone(), source.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                produce(&source, &keys, 1, 1);
                rounds.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    // Kill each pod's worker three times, alternating, each time once the app has
    // recovered and processed more input.
    for round in 0..6 {
        let pod = format!("{name}-{}", round % 2);
        let before = rounds.load(Ordering::SeqCst);
        wait_for("more input to flow", Duration::from_secs(30), || async {
            if rounds.load(Ordering::SeqCst) > before + 10 {
                Ok(())
            } else {
                Err("waiting".to_string())
            }
        })
        .await;
        kill9(&n, &pod);
        let (ok, out, err) = ready("180s");
        assert!(ok, "not Ready after killing {pod}: {out}{err}");
        // The app reads Ready only once the restarted container reported again.
        wait_for(
            &format!("{pod} to run again"),
            Duration::from_secs(60),
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
                    .find(|i| i.pod == pod)
                    .ok_or("no entry")?;
                if i.state.as_deref() == Some("Running") {
                    Ok(())
                } else {
                    Err(format!("{:?}", i.state))
                }
            },
        )
        .await;
    }

    stop.store(true, Ordering::SeqCst);
    producer.join().expect("producer");
    let want = rounds.load(Ordering::SeqCst) as u64;
    let finals = wait_for(
        "every key's final count to equal what was produced",
        Duration::from_secs(120),
        || async {
            let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
            for (k, v) in read_committed(&app.sink()) {
                seen.entry(k)
                    .or_default()
                    .push(v["count"].as_u64().unwrap_or(0));
            }
            let mut finals = BTreeMap::new();
            for (k, counts) in &seen {
                let max = counts.iter().copied().max().unwrap_or(0);
                if max > want {
                    return Err(format!(
                        "key {k} counted {max} > {want} produced: state counted twice"
                    ));
                }
                // At-least-once may repeat a count, never skip one.
                let distinct: std::collections::BTreeSet<u64> = counts.iter().copied().collect();
                if max == want && distinct.len() as u64 != want {
                    return Err(format!(
                        "key {k}: counts skip values ({} distinct of {want})",
                        distinct.len()
                    ));
                }
                finals.insert(k.clone(), max);
            }
            let done = finals.values().filter(|v| **v == want).count();
            if done == keys.len() {
                Ok(finals)
            } else {
                Err(format!("{done}/{} keys at {want}", keys.len()))
            }
        },
    )
    .await;
    assert_eq!(finals.len(), keys.len());

    // The state itself, read back through the query API, is exact too.
    let st = api
        .get(&name)
        .await
        .expect("app")
        .status
        .unwrap_or_default();
    let addr = st.instances[0].address.clone().expect("address");
    for k in &keys {
        let (code, body) = http_get(&addr, &format!("/v1/stores/totals/keys/{k}"))
            .await
            .expect("query");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(
            (code, v["value"]["count"].as_u64()),
            (200, Some(want)),
            "{k}: {body}"
        );
    }

    apps::delete_all(&api).await;
    ns.delete().await;
    drop(operator);
}
