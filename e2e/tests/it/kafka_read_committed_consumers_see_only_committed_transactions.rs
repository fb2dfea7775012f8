//! Transactions are on: a committed transaction is visible to `read_committed`
//! consumers, an aborted one is not (though its records are in the log). Exactly-once
//! processing is built on this.

use std::time::Duration;

use oxbow_e2e::harness::{Deadline, kafka_bootstrap, unique};
use oxbow_testkit::kafka;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

fn consume(topic: &str, isolation: &str, expect_at_least: usize) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("reader"))
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("partition");
    consumer.assign(&tpl).expect("assign");
    let mut values = Vec::new();
    // Read until the stream is quiet for 2 s after at least the expected count arrived,
    // so extra (wrongly visible) records would be caught too.
    let deadline = Deadline::after(Duration::from_secs(30));
    let mut quiet_since = std::time::Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                values.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
                quiet_since = std::time::Instant::now();
            }
            Some(Err(e)) => panic!("consume failed: {e}"),
            None if values.len() >= expect_at_least
                && quiet_since.elapsed() > Duration::from_secs(2) =>
            {
                return values;
            }
            None => {}
        }
        deadline.check(|| {
            format!(
                "the {isolation} consumer saw only {values:?} (wanted at least {expect_at_least})"
            )
        });
    }
}

#[tokio::test]
async fn read_committed_consumer_sees_exactly_the_committed_records() {
    let topic = unique("txn");
    kafka::create_topic(&topic, 1);

    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("transactional.id", unique("txn-producer"))
        .create()
        .expect("transactional producer");
    let t = Duration::from_secs(30);
    producer.init_transactions(t).expect("init_transactions");

    let send = |v: &str| {
        producer
            .send(BaseRecord::<str, str>::to(&topic).key("k").payload(v))
            .expect("enqueue");
    };
    producer.begin_transaction().expect("begin 1");
    for v in ["committed-0", "committed-1", "committed-2"] {
        send(v);
    }
    producer.commit_transaction(t).expect("commit 1");

    producer.begin_transaction().expect("begin 2");
    for v in ["aborted-0", "aborted-1"] {
        send(v);
    }
    producer
        .flush(t)
        .expect("flush the doomed records so they reach the log");
    producer.abort_transaction(t).expect("abort 2");

    producer.begin_transaction().expect("begin 3");
    send("committed-3");
    producer.commit_transaction(t).expect("commit 3");

    let committed = consume(&topic, "read_committed", 4);
    assert_eq!(
        committed,
        vec!["committed-0", "committed-1", "committed-2", "committed-3"]
    );

    // The aborted records are in the log; only the isolation level hides them.
    let uncommitted = consume(&topic, "read_uncommitted", 6);
    assert_eq!(
        uncommitted,
        vec![
            "committed-0",
            "committed-1",
            "committed-2",
            "aborted-0",
            "aborted-1",
            "committed-3"
        ]
    );
    kafka::delete_topic(&topic);
}
