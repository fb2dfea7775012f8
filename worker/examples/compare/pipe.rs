//! The raw pipe: consume → produce with no state and no parsing, with the worker's own
//! client settings (engine.rs: consumer prefetch bounds, idempotent lz4 producer with
//! linger 5 ms and the murmur2 partitioner) and the same commit interval. At-least-once
//! flushes then commits offsets; exactly-once commits a transaction with the offsets.
//! It shows what the broker and client allow on this machine.
//!
//! `compare pipe <bootstrap> <input> <output> <group> <at_least_once|exactly_once> <commit ms>`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

fn flush(p: &ThreadedProducer<DefaultProducerContext>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while p.flush(Duration::ZERO).is_err() {
        assert!(Instant::now() < deadline, "flush took over 60 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A consumer of every partition of `input` from `group`'s committed offsets (the
/// beginning where none), read_committed under exactly-once.
fn consumer(bootstrap: &str, input: &str, group: &str, eos: bool) -> BaseConsumer {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("allow.auto.create.topics", "false")
        .set("enable.partition.eof", "false")
        .set("queued.max.messages.kbytes", "4096")
        .set("queued.min.messages", "20000");
    if eos {
        cc.set("isolation.level", "read_committed");
    }
    let consumer: BaseConsumer = cc.create().expect("consumer");
    let md = consumer
        .fetch_metadata(Some(input), Duration::from_secs(10))
        .expect("metadata");
    let partitions = md.topics().first().map_or(0, |t| t.partitions().len()) as i32;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(input, p);
    }
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    let mut assign = TopicPartitionList::new();
    for e in committed.elements() {
        let at = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        assign
            .add_partition_offset(input, e.partition(), at)
            .expect("partition");
    }
    consumer.assign(&assign).expect("assign");
    consumer
}

/// The worker's producer settings; under exactly-once transactional, a transaction begun.
fn producer(bootstrap: &str, group: &str, eos: bool) -> ThreadedProducer<DefaultProducerContext> {
    let mut pc = ClientConfig::new();
    pc.set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("partitioner", "murmur2_random")
        .set("compression.type", "lz4");
    if eos {
        pc.set("transactional.id", format!("{group}-pipe"))
            .set("transaction.timeout.ms", "60000");
    }
    let producer: ThreadedProducer<DefaultProducerContext> = pc.create().expect("producer");
    if eos {
        producer
            .init_transactions(Duration::from_secs(30))
            .expect("init_transactions");
        producer.begin_transaction().expect("begin");
    }
    producer
}

/// Sends `rec`, waiting while the producer's queue is full.
fn send_all(producer: &ThreadedProducer<DefaultProducerContext>, mut rec: BaseRecord<[u8], [u8]>) {
    loop {
        match producer.send(rec) {
            Ok(()) => break,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                rec = back;
                std::thread::sleep(Duration::from_micros(200));
            }
            Err((e, _)) => panic!("produce: {e}"),
        }
    }
}

/// Commits `next` (the offsets of `input` to resume from): in the transaction (and begins
/// the next) under exactly-once; after a flush otherwise.
fn commit(
    consumer: &BaseConsumer,
    producer: &ThreadedProducer<DefaultProducerContext>,
    input: &str,
    next: &BTreeMap<i32, i64>,
    eos: bool,
) {
    let mut offsets = TopicPartitionList::new();
    for (p, o) in next {
        offsets
            .add_partition_offset(input, *p, Offset::Offset(*o))
            .expect("offset");
    }
    if eos {
        let cgm = consumer.group_metadata().expect("group metadata");
        producer
            .send_offsets_to_transaction(&offsets, &cgm, Duration::from_secs(30))
            .expect("send offsets");
        producer
            .commit_transaction(Duration::from_secs(30))
            .expect("commit");
        producer.begin_transaction().expect("begin");
    } else {
        flush(producer);
        consumer.commit(&offsets, CommitMode::Sync).expect("commit");
    }
}

pub fn run(args: &[String]) {
    let [bootstrap, input, output, group, guarantee, commit_ms] = args else {
        panic!("pipe <bootstrap> <input> <output> <group> <guarantee> <commit ms>");
    };
    let eos = guarantee == "exactly_once";
    let commit_every = Duration::from_millis(commit_ms.parse().expect("commit ms"));
    let consumer = consumer(bootstrap, input, group, eos);
    let producer = producer(bootstrap, group, eos);

    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let mut dirty = false;
    let mut last = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(if dirty { 5 } else { 100 })) {
            Some(Ok(m)) => {
                let mut rec = BaseRecord::to(output)
                    .payload(m.payload().unwrap_or_default())
                    .key(m.key().unwrap_or_default());
                if let Some(ts) = m.timestamp().to_millis() {
                    rec = rec.timestamp(ts);
                }
                send_all(&producer, rec);
                next.insert(m.partition(), m.offset() + 1);
                dirty = true;
            }
            Some(Err(e)) => panic!("consume: {e}"),
            None => {}
        }
        if dirty && last.elapsed() >= commit_every {
            commit(&consumer, &producer, input, &next, eos);
            dirty = false;
            last = Instant::now();
        }
    }
}
