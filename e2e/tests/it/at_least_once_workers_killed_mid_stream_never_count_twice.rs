//! At-least-once under repeated SIGKILLs of worker processes in their pods, with a
//! standby per task: a killed active may leave changelog records of work whose offsets
//! it never committed; the standby that takes over must not apply them (they are
//! reprocessed). Output may repeat, but the state must be exact: per key the final
//! count equals what was produced, no count is skipped, and queries answer it.

use std::collections::BTreeMap;
use std::time::Duration;

use oxbow_e2e::containers::kill9;
use oxbow_e2e::harness::{requires_local_stack, wait_for};
use oxbow_e2e::streams::{Input, RunningApp, http_get, keys, read_committed};

#[tokio::test]
async fn killed_actives_hand_over_to_standbys_without_double_counting() {
    if requires_local_stack("SIGKILLs worker containers' processes from the node's host") {
        return;
    }
    let run = RunningApp::start("alos", |mut a| {
        a.guarantee = "at_least_once";
        a.replicas(2)
    })
    .await;
    let (n, name) = (run.ns.name.clone(), run.name().to_string());
    let keys = keys(48);
    let input = Input::start(&run.app.source, &keys, Duration::from_millis(20));

    // Kill each pod's worker three times, alternating, each time once the app has
    // recovered and processed more input.
    for round in 0..6 {
        let pod = format!("{name}-{}", round % 2);
        let before = input.rounds();
        wait_for("more input to flow", Duration::from_secs(30), || async {
            if input.rounds() > before + 10 {
                Ok(())
            } else {
                Err("waiting".to_string())
            }
        })
        .await;
        kill9(&n, &pod, "worker");
        run.wait_ready("180s");
        // The app reads Ready only once the restarted container reported again.
        wait_for(
            &format!("{pod} to run again"),
            Duration::from_secs(60),
            || async {
                let st = run.status().await?;
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

    let want = input.stop();
    let finals = wait_for(
        "every key's final count to equal what was produced",
        Duration::from_secs(120),
        || async {
            let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
            for (k, v) in read_committed(&run.app.sink()) {
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

    // The state itself, read back through the query API, is exact too. Queries read
    // committed state, and at least once the last output goes out before its task's
    // next commit (every 200 ms): wait for that commit, never for more than `want`.
    let st = run.status().await.expect("status");
    let addr = st.instances[0].address.clone().expect("address");
    for k in &keys {
        wait_for(
            &format!("the committed state of {k} to count {want}"),
            Duration::from_secs(30),
            || async {
                let (code, body) = http_get(&addr, &format!("/v1/stores/totals/keys/{k}")).await?;
                let v: serde_json::Value =
                    serde_json::from_str(&body).map_err(|e| e.to_string())?;
                let count = v["value"]["count"].as_u64();
                assert!(
                    count.is_none_or(|c| c <= want),
                    "{k} counted twice in the state: {body}"
                );
                match (code, count) {
                    (200, Some(c)) if c == want => Ok(()),
                    _ => Err(format!("{code} {body}")),
                }
            },
        )
        .await;
    }
    run.finish().await;
}
