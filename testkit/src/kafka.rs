//! Kafka as a test sees it: topics made and read directly (admin client, a consumer
//! per read), records produced with chosen keys, partitions and timestamps, offsets.
//! Everything here is synchronous and waits with a deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewPartitions, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::stack::kafka_bootstrap;
use crate::unique;
use crate::wait::{Deadline, wait_for};

/// A topic of `partitions` partitions, replication 1 (the stack has one broker).
pub fn create_topic(name: &str, partitions: i32) {
    create_topic_with(name, partitions, &[]);
}

/// A topic with these config overrides (`max.message.bytes`, ...).
pub fn create_topic_with(name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin = admin();
    let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let r = futures::executor::block_on(admin.create_topics([&t], &AdminOptions::new()))
        .expect("create_topics request");
    for x in r {
        x.unwrap_or_else(|(t, e)| panic!("failed to create topic {t}: {e}"));
    }
}

/// Deletes a consumer group and its committed offsets, as `kafka-consumer-groups
/// --delete` or an offsets.retention expiry would.
pub fn delete_group(group: &str) {
    let admin = admin();
    let r = futures::executor::block_on(admin.delete_groups(&[group], &AdminOptions::new()))
        .expect("delete_groups request");
    for x in r {
        x.unwrap_or_else(|(g, e)| panic!("failed to delete group {g}: {e}"));
    }
}

pub struct Input {
    pub key: Option<String>,
    pub value: Vec<u8>,
    pub partition: Option<i32>,
    pub timestamp: Option<i64>,
}

impl Input {
    pub fn json(key: &str, value: serde_json::Value) -> Self {
        Self {
            key: Some(key.into()),
            value: serde_json::to_vec(&value).unwrap(),
            partition: None,
            timestamp: None,
        }
    }
    pub fn raw(key: &str, value: &[u8]) -> Self {
        Self {
            key: Some(key.into()),
            value: value.to_vec(),
            partition: None,
            timestamp: None,
        }
    }
    pub fn partition(mut self, p: i32) -> Self {
        self.partition = Some(p);
        self
    }
    pub fn at(mut self, ts: i64) -> Self {
        self.timestamp = Some(ts);
        self
    }
}

pub fn produce(topic: &str, records: impl IntoIterator<Item = Input>) {
    produce_with(topic, records, &[]);
}

/// [`produce`] with extra producer settings (`message.max.bytes`, ...).
pub fn produce_with(
    topic: &str,
    records: impl IntoIterator<Item = Input>,
    settings: &[(&str, &str)],
) {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", kafka_bootstrap())
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5");
    for (k, v) in settings {
        c.set(*k, *v);
    }
    let p: ThreadedProducer<DefaultProducerContext> = c.create().expect("producer");
    for r in records {
        let mut rec: BaseRecord<'_, str, [u8]> = BaseRecord::to(topic).payload(&r.value);
        if let Some(k) = &r.key {
            rec = rec.key(k.as_str());
        }
        if let Some(pt) = r.partition {
            rec = rec.partition(pt);
        }
        if let Some(ts) = r.timestamp {
            rec = rec.timestamp(ts);
        }
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    back,
                )) => {
                    rec = back;
                    p.poll(Duration::from_millis(5));
                }
                Err((e, _)) => panic!("failed to produce to {topic}: {e}"),
            }
        }
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

#[derive(Debug, Clone, PartialEq)]
pub struct Out {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub value: Option<Vec<u8>>,
    pub headers: BTreeMap<String, String>,
}

impl Out {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(self.value.as_deref().unwrap_or(b"null")).unwrap_or_else(|e| {
            panic!(
                "output at {}@{} is not JSON: {e}",
                self.partition, self.offset
            )
        })
    }
}

/// Everything in `topic` up to its end now, read as `isolation` (`read_committed` or
/// `read_uncommitted`), in partition then offset order.
pub fn read_all(topic: &str, isolation: &str) -> Vec<Out> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let parts = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len())
        .unwrap_or(0);
    assert!(parts > 0, "topic {topic} does not exist");
    let mut tpl = TopicPartitionList::new();
    let mut open = std::collections::BTreeSet::new();
    for p in 0..parts as i32 {
        let (lo, hi) = wait_for(
            &format!("the offsets of {topic}[{p}]"),
            Duration::from_secs(60),
            || c.fetch_watermarks(topic, p, Duration::from_secs(5)).ok(),
        );
        if hi > lo {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
            open.insert(p);
        }
    }
    let mut out = Vec::new();
    if open.is_empty() {
        return out;
    }
    c.assign(&tpl).expect("assign");
    let deadline = Deadline::after(Duration::from_secs(120));
    while !open.is_empty() {
        deadline.check(|| format!("reading {topic}: partitions {open:?} never reached their end"));
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let mut headers = BTreeMap::new();
                if let Some(h) = m.headers() {
                    for x in h.iter() {
                        headers.insert(
                            x.key.to_string(),
                            String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                        );
                    }
                }
                out.push(Out {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    value: m.payload().map(<[u8]>::to_vec),
                    headers,
                });
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => panic!("failed to read {topic}: {e}"),
            None => {}
        }
    }
    out.sort_by_key(|o| (o.partition, o.offset));
    out
}

/// End offsets of every partition of `topic`.
pub fn end_offsets(topic: &str) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let n = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len())
        .unwrap_or(0);
    // Right after a broker restart a partition may have no leader yet: retry.
    (0..n as i32)
        .map(|p| {
            let end = wait_for(
                &format!("the end offset of {topic}[{p}]"),
                Duration::from_secs(60),
                || c.fetch_watermarks(topic, p, Duration::from_secs(5)).ok(),
            );
            (p, end.1)
        })
        .collect()
}

/// Log start offsets (low watermarks) of every partition of `topic`.
pub fn start_offsets(topic: &str) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .unwrap();
    let n = topic_partitions(topic).unwrap_or(0);
    (0..n as i32)
        .filter_map(|p| {
            let (low, _) = c.fetch_watermarks(topic, p, Duration::from_secs(5)).ok()?;
            Some((p, low))
        })
        .collect()
}

/// The partition count of `topic`, or `None` when it does not exist. Asks for the
/// metadata of every topic: a request naming a missing topic may make a broker with
/// `auto.create.topics.enable` create it.
pub fn topic_partitions(topic: &str) -> Option<usize> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("consumer");
    let md = wait_for(
        "the cluster's topic metadata",
        Duration::from_secs(30),
        || c.fetch_metadata(None, Duration::from_secs(5)).ok(),
    );
    md.topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len())
}

/// Reads `topic` (as `isolation`) until `done` holds for everything in it, or panics
/// after `timeout` saying `what` did not happen and how many records there were. A
/// topic that does not exist yet (one the worker creates) reads as empty.
pub fn read_until(
    topic: &str,
    isolation: &str,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut(&[Out]) -> bool,
) -> Vec<Out> {
    let deadline = Deadline::after(timeout);
    loop {
        let out = if topic_partitions(topic).is_some() {
            read_all(topic, isolation)
        } else {
            Vec::new()
        };
        if done(&out) {
            return out;
        }
        deadline.next_poll(Duration::from_millis(300), || {
            format!(
                "waiting for {what} in {topic} ({} records there)",
                out.len()
            )
        });
    }
}

/// Per partition, one past the last committed data record of `topic` (transaction
/// markers are not records a task processes, so the log end can be beyond it).
pub fn data_ends(topic: &str) -> BTreeMap<i32, i64> {
    let mut ends = BTreeMap::new();
    for o in read_all(topic, "read_committed") {
        let e = ends.entry(o.partition).or_insert(0);
        *e = (*e).max(o.offset + 1);
    }
    ends
}

/// An admin client of the stack's broker, for what the helpers here do not cover.
pub fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("admin client")
}

/// Deletes a topic a test made.
pub fn delete_topic(name: &str) {
    let r = futures::executor::block_on(admin().delete_topics(&[name], &AdminOptions::new()))
        .expect("delete_topics request");
    for x in r {
        x.unwrap_or_else(|(t, e)| panic!("failed to delete topic {t}: {e}"));
    }
}

/// Grows a topic to `total` partitions, as `kafka-topics --alter --partitions` would.
pub fn add_partitions(name: &str, total: usize) {
    let res = futures::executor::block_on(
        admin().create_partitions([&NewPartitions::new(name, total)], &AdminOptions::new()),
    )
    .expect("create_partitions request");
    assert!(
        res.iter().all(|r| r.is_ok()),
        "failed to grow topic {name}: {res:?}"
    );
}

/// A topic's config: every entry with a value.
pub fn topic_config(name: &str) -> BTreeMap<String, String> {
    let res = futures::executor::block_on(
        admin().describe_configs([&ResourceSpecifier::Topic(name)], &AdminOptions::new()),
    )
    .expect("describe_configs request");
    let r = res
        .into_iter()
        .next()
        .expect("one result")
        .expect("topic config");
    r.entries
        .into_iter()
        .filter_map(|e| e.value.map(|v| (e.name, v)))
        .collect()
}

/// Sets one config of a topic by hand, as an operator of the cluster might, keeping
/// its other overrides (AlterConfigs replaces them all).
pub fn set_topic_config(name: &str, key: &str, value: &str) {
    let res = futures::executor::block_on(
        admin().describe_configs([&ResourceSpecifier::Topic(name)], &AdminOptions::new()),
    )
    .expect("describe_configs request");
    let mut current: BTreeMap<String, String> = BTreeMap::new();
    if let Some(Ok(r)) = res.into_iter().next() {
        for e in r
            .entries
            .into_iter()
            .filter(|e| !e.is_default && !e.is_read_only)
        {
            if let Some(v) = e.value {
                current.insert(e.name, v);
            }
        }
    }
    current.insert(key.into(), value.into());
    let mut ac = AlterConfig::new(ResourceSpecifier::Topic(name));
    for (k, v) in &current {
        ac = ac.set(k, v);
    }
    let res = futures::executor::block_on(admin().alter_configs([&ac], &AdminOptions::new()))
        .expect("alter_configs request");
    assert!(
        res.iter().all(|r| r.is_ok()),
        "failed to alter {name}: {res:?}"
    );
}
