//! The store encoding (issue 19) on real worker pods: a new app writes binary from its
//! first pod; an app whose StatefulSet an earlier operator built (no `--store-encoding`:
//! workers that read JSON alone) first rolls to a template that reads both while still
//! writing JSON, and only once every pod runs it, ready, to binary. Records flow through
//! both rolls and every one is counted exactly once.

use std::time::Duration;

use oxbow_crds::StoreEncoding;
use oxbow_e2e::harness::{kubectl, wait_for};
use oxbow_e2e::streams::{Input, RunningApp, keys, produce, wait_exactly_once};

/// Fields of the live StatefulSet, by a kubectl JSONPath template.
fn sts_fields(ns: &str, sts: &str, jsonpath: &str) -> Result<String, String> {
    let (ok, out, err) = kubectl(
        &[
            "get",
            "sts",
            "-n",
            ns,
            sts,
            "-o",
            &format!("jsonpath={jsonpath}"),
        ],
        None,
    );
    if ok { Ok(out) } else { Err(err) }
}

/// The worker container's args in the live StatefulSet.
fn sts_args(ns: &str, sts: &str) -> Vec<String> {
    let out = sts_fields(ns, sts, "{.spec.template.spec.containers[0].args}")
        .unwrap_or_else(|e| panic!("get sts: {e}"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("args are a JSON list ({e}): {out}"))
}

/// The encoding the live template tells the workers, if any.
fn told(args: &[String]) -> Option<&str> {
    let at = args.iter().position(|a| a == "--store-encoding")?;
    args.get(at + 1).map(String::as_str)
}

/// The StatefulSet's pods all run its current template (`updateRevision`), ready.
fn rolled_out(ns: &str, sts: &str) -> Result<(), String> {
    let out = sts_fields(
        ns,
        sts,
        "{.status.currentRevision} {.status.updateRevision} {.status.updatedReplicas} {.status.readyReplicas} {.spec.replicas}",
    )?;
    let f: Vec<&str> = out.split_whitespace().collect();
    match f.as_slice() {
        [current, update, updated, ready, want]
            if current == update && updated == want && ready == want =>
        {
            Ok(())
        }
        _ => Err(format!("revisions and replicas: {out}")),
    }
}

#[tokio::test]
async fn an_app_an_earlier_operator_ran_rolls_twice_to_binary_and_counts_exactly() {
    let run = RunningApp::start("encoding", |a| a.replicas(2).standbys(0)).await;
    let (ns, name) = (run.ns.name.clone(), run.name().to_string());
    assert_eq!(
        told(&sts_args(&ns, &name)),
        Some("binary"),
        "a new app writes binary from its first pod"
    );
    let status = run.status().await.expect("status");
    assert_eq!(status.store_encoding, Some(StoreEncoding::Binary));
    let keys = keys(12);
    produce(&run.app.source, &keys, 3, 5);
    wait_exactly_once(&run.app.sink(), &keys, 3).await;

    // As an earlier operator left it: a template without --store-encoding.
    let args = sts_args(&ns, &name);
    let at = args
        .iter()
        .position(|a| a == "--store-encoding")
        .expect("the flag");
    let path = "/spec/template/spec/containers/0/args";
    let patch = format!(
        r#"[{{"op":"remove","path":"{path}/{}"}},{{"op":"remove","path":"{path}/{at}"}}]"#,
        at + 1
    );
    let (ok, _, err) = kubectl(
        &[
            "patch",
            "sts",
            "-n",
            &ns,
            &name,
            "--type=json",
            "-p",
            &patch,
        ],
        None,
    );
    assert!(ok, "patch: {err}");
    // The operator sees the change at once (it watches its StatefulSets): the template
    // may already name JSON again by the time it is read.

    let input = Input::start(&run.app.source, &keys, Duration::from_millis(300));
    wait_for(
        "the operator to answer a template without the flag with one that writes JSON",
        Duration::from_secs(60),
        || async {
            let s = run.status().await?;
            let args = sts_args(&ns, &name);
            match (told(&args), s.store_encoding) {
                (Some("json"), Some(StoreEncoding::Json)) => Ok(()),
                other => Err(format!("template and status: {other:?}")),
            }
        },
    )
    .await;
    wait_for(
        "the second roll, to binary, once every pod runs the JSON-writing template",
        Duration::from_secs(300),
        || async {
            let s = run.status().await?;
            match (told(&sts_args(&ns, &name)), s.store_encoding) {
                (Some("binary"), Some(StoreEncoding::Binary)) => rolled_out(&ns, &name),
                other => Err(format!("template and status: {other:?}")),
            }
        },
    )
    .await;
    let rounds = input.stop();
    wait_exactly_once(&run.app.sink(), &keys, 3 + rounds).await;
    run.wait_ready("120s");
    run.finish().await;
}
