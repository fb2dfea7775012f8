//! A compacted topic's config is visible through the admin API, and the broker's log
//! cleaner really compacts it: changelog topics depend on both.

use std::collections::BTreeMap;
use std::time::Duration;

use oxbow_e2e::harness::{kafka_bootstrap, unique, wait_for};
use oxbow_testkit::kafka;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminOptions, ResourceSpecifier};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// Every record left in the single-partition `topic`, as (key, value), and its end
/// offset.
fn records_and_end(topic: &str) -> (Vec<(String, String)>, i64) {
    let records = kafka::read_all(topic, "read_uncommitted")
        .into_iter()
        .map(|o| {
            let value =
                String::from_utf8_lossy(o.value.as_deref().unwrap_or_default()).into_owned();
            (o.key.unwrap_or_default(), value)
        })
        .collect();
    let end = kafka::end_offsets(topic).get(&0).copied().unwrap_or(0);
    (records, end)
}

#[tokio::test]
async fn compacted_topic_config_is_visible_and_the_cleaner_keeps_the_last_value_per_key() {
    let topic = unique("compacted");
    kafka::create_topic_with(
        &topic,
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "200"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("delete.retention.ms", "100"),
        ],
    );
    let admin = kafka::admin();

    // CreateTopics returns once the controller has the topic; the broker that answers
    // DescribeConfigs may learn of it a moment later and answer with no entries.
    wait_for(
        "the broker to report the new topic's compaction config",
        Duration::from_secs(30),
        || async {
            let configs = admin
                .describe_configs([&ResourceSpecifier::Topic(&topic)], &AdminOptions::new())
                .await
                .map_err(|e| format!("describe_configs: {e}"))?;
            let cfg = configs
                .into_iter()
                .next()
                .ok_or("no resource in the answer")?
                .map_err(|e| format!("topic config: {e:?}"))?;
            let entry = |name: &str| cfg.get(name).and_then(|e| e.value.clone());
            let got = (entry("cleanup.policy"), entry("min.cleanable.dirty.ratio"));
            if got.0.as_deref() == Some("compact") && got.1.as_deref() == Some("0.01") {
                Ok(())
            } else {
                Err(format!(
                    "cleanup.policy, min.cleanable.dirty.ratio = {got:?}"
                ))
            }
        },
    )
    .await;

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let mut want: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..500 {
        let key = format!("k{}", i % 10);
        let value = format!("v{i}");
        producer
            .send(
                FutureRecord::to(&topic).key(&key).payload(&value),
                Duration::from_secs(10),
            )
            .await
            .expect("produce");
        want.insert(key, value);
    }

    // Segments roll only when a record arrives after segment.ms, so keep appending a
    // marker while waiting for the cleaner to shrink the log.
    let compacted = wait_for(
        "the log cleaner to compact the topic",
        Duration::from_secs(90),
        || async {
            producer
                .send(
                    FutureRecord::to(&topic).key("tick").payload("t"),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e.to_string())?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (records, high) = records_and_end(&topic);
            let data: Vec<_> = records
                .iter()
                .filter(|(k, _)| k != "tick")
                .cloned()
                .collect();
            // The end offset proves all 500 were written; what is left to read is the cleaner's work.
            if high >= 500 && data.len() <= 10 {
                Ok(data)
            } else {
                Err(format!(
                    "{} data records still in the log (end offset {high})",
                    data.len()
                ))
            }
        },
    )
    .await;
    let got: BTreeMap<String, String> = compacted.into_iter().collect();
    assert_eq!(
        got, want,
        "compaction must keep exactly the last value of every key"
    );

    kafka::delete_topic(&topic);
}
