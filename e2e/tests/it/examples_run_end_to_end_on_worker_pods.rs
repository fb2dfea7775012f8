//! The examples a user copies run as they say, on real worker pods under the operator:
//! `examples/dedupe.yaml` (seed 000) passes each payment once however often it is sent
//! and dead-letters what it cannot read; `examples/batch-1000.yaml` (seed 004) ships
//! batches of exactly 1000 records with stable ids and contiguous offsets.

use std::collections::BTreeMap;
use std::time::Duration;

use oxbow_e2e::harness::{
    OperatorProcess, TestNamespace, apps, install_crd, kafka, kafka_bootstrap,
    kafka_bootstrap_in_cluster, kube_client, kubectl, unique, wait_for, wait_streamapp_ready,
    workspace_root,
};
use oxbow_e2e::streams::read_committed;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

/// An example from `examples/`, renamed so runs never collide, on the stack's Kafka (its
/// address for pods) with the worker image under test. Returns (manifest, name, source,
/// sink).
fn example(file: &str) -> (String, String, String, String) {
    let text = std::fs::read_to_string(workspace_root().join("examples").join(file))
        .unwrap_or_else(|e| panic!("examples/{file}: {e}"));
    let mut doc: serde_json::Value = serde_yaml::from_str(&text).expect("example YAML");
    let base = doc["metadata"]["name"].as_str().expect("name").to_string();
    let name = unique(&base[..base.len().min(20)]);
    let source = unique("in");
    let sink = unique("out");
    doc["metadata"]["name"] = name.clone().into();
    doc["spec"]["image"] = "oxbow-worker:test".into();
    doc["spec"]["kafka"]["bootstrapServers"] = kafka_bootstrap_in_cluster().into();
    doc["spec"]["source"]["topics"] = serde_json::json!([source]);
    doc["spec"]["sink"]["topic"] = sink.clone().into();
    doc["spec"]["deletionPolicy"] =
        serde_json::json!({"topics": "Delete", "volumes": "Delete", "consumerGroup": "Delete"});
    let manifest = serde_yaml::to_string(&doc).expect("manifest");
    (manifest, name, source, sink)
}

fn producer() -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("linger.ms", "5")
        .create()
        .expect("producer")
}

fn send(
    p: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    part: i32,
    key: &str,
    value: &str,
) {
    let mut rec = BaseRecord::to(topic)
        .partition(part)
        .key(key)
        .payload(value);
    loop {
        match p.send(rec) {
            Ok(()) => return,
            Err((_, r)) => {
                rec = r;
                p.poll(Duration::from_millis(5));
            }
        }
    }
}

/// Starts the operator, creates the topics, applies the manifest and waits for Ready.
async fn run(
    prefix: &str,
    manifest: &str,
    name: &str,
    topics: &[(&str, i32)],
) -> (TestNamespace, OperatorProcess) {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, prefix).await;
    for (t, parts) in topics {
        kafka::create_topic(t, *parts).await;
    }
    let operator = OperatorProcess::start(&ns.name);
    let (ok, _, err) = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(manifest));
    assert!(ok, "apply: {err}");
    if let Err(e) = wait_streamapp_ready(&ns.name, name, "240s") {
        panic!("not Ready: {e}\n{}", operator.logs());
    }
    (ns, operator)
}

async fn finish(ns: TestNamespace, operator: OperatorProcess) {
    let api = kube::Api::<oxbow_crds::StreamApp>::namespaced(kube_client().await, &ns.name);
    apps::delete_all(&api).await;
    ns.delete().await;
    drop(operator);
}

#[tokio::test]
async fn the_dedupe_example_passes_each_payment_once_and_dead_letters_garbage() {
    let (manifest, name, source, sink) = example("dedupe.yaml");
    let (ns, operator) = run("ex-dedupe", &manifest, &name, &[(&source, 3), (&sink, 3)]).await;
    let dlq = format!("{}.{name}-dlq", ns.name);

    // 200 payments, the first 50 sent twice more (retries), and one unreadable record.
    let p = producer();
    let payment = |i: usize| {
        format!(
            "{{\"txId\":\"tx-{i}\",\"account\":\"acc-{}\",\"amount\":12.5}}",
            i % 7
        )
    };
    for round in 0..3 {
        for i in 0..200 {
            if round == 0 || i < 50 {
                send(
                    &p,
                    &source,
                    (i % 3) as i32,
                    &format!("acc-{}", i % 7),
                    &payment(i),
                );
            }
        }
    }
    send(&p, &source, 0, "acc-0", "{not json");
    p.flush(Duration::from_secs(30)).expect("flush");

    let out = wait_for(
        "200 accepted payments in the output",
        Duration::from_secs(120),
        || async {
            let out = read_committed(&sink);
            if out.len() >= 200 {
                Ok(out)
            } else {
                Err(format!("{} so far", out.len()))
            }
        },
    )
    .await;
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for (_, v) in &out {
        assert_eq!(v["cents"], 1250, "mapped: {v}");
        *seen
            .entry(v["txId"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    assert_eq!(seen.len(), 200, "every payment passed");
    assert!(
        seen.values().all(|n| *n == 1),
        "a payment passed twice: {:?}",
        seen.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    let dead = wait_for(
        "the unreadable record in the DLQ",
        Duration::from_secs(60),
        || async {
            let d = read_committed(&dlq);
            if d.is_empty() {
                Err("empty".to_string())
            } else {
                Ok(d)
            }
        },
    )
    .await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    finish(ns, operator).await;
}

#[tokio::test]
async fn the_batch_example_ships_batches_of_exactly_1000_with_stable_ids() {
    let (manifest, name, source, sink) = example("batch-1000.yaml");
    let (ns, operator) = run("ex-batch", &manifest, &name, &[(&source, 2), (&sink, 2)]).await;

    // 2000 records on partition 0, 1500 on partition 1: three full batches, and 500
    // records that stay in the open batch (maxWait is an hour).
    let p = producer();
    for (part, n) in [(0, 2000), (1, 1500)] {
        for i in 0..n {
            send(
                &p,
                &source,
                part,
                &format!("phone-{}", i % 13),
                &format!("{{\"seq\":{i}}}"),
            );
        }
    }
    p.flush(Duration::from_secs(30)).expect("flush");

    let batches = wait_for(
        "three batches in the output",
        Duration::from_secs(120),
        || async {
            let out = read_committed(&sink);
            if out.len() >= 3 {
                Ok(out)
            } else {
                Err(format!("{} so far", out.len()))
            }
        },
    )
    .await;
    let mut ids: Vec<String> = batches
        .iter()
        .map(|(_, v)| v["batchId"].as_str().unwrap_or_default().to_string())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        vec![
            format!("{source}-0-0-999"),
            format!("{source}-0-1000-1999"),
            format!("{source}-1-0-999"),
        ],
        "batch ids are the source ranges"
    );
    for (_, b) in &batches {
        let records = b["records"].as_array().expect("records");
        assert_eq!(records.len(), 1000, "{}", b["batchId"]);
        let first = b["firstOffset"].as_i64().expect("firstOffset");
        for (i, r) in records.iter().enumerate() {
            assert_eq!(
                r["offset"].as_i64(),
                Some(first + i as i64),
                "contiguous offsets"
            );
        }
    }
    finish(ns, operator).await;
}
