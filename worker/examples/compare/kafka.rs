//! Kafka helpers of the driver: topics, offsets, generation and reading outputs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

pub struct Kafka {
    pub bootstrap: String,
    admin: AdminClient<DefaultClientContext>,
    meta: BaseConsumer,
}

/// One record read back from an output topic.
pub struct Out {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl Kafka {
    pub fn new(bootstrap: &str) -> Self {
        let admin = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .expect("admin client");
        let meta = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .expect("metadata consumer");
        Self {
            bootstrap: bootstrap.to_string(),
            admin,
            meta,
        }
    }

    pub fn create_topic(&self, name: &str, partitions: i32) {
        let t = [NewTopic::new(name, partitions, TopicReplication::Fixed(1))];
        let res =
            futures::executor::block_on(self.admin.create_topics(t.iter(), &AdminOptions::new()))
                .expect("create topics");
        for r in res {
            if let Err((topic, e)) = r {
                panic!("creating topic {topic}: {e}");
            }
        }
        // Wait until the metadata has the leaders: producers and consumers start at once.
        // (An explicit metadata request each time: a watermark query right after the
        // creation can cache the topic as unknown for minutes.)
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            let ready = self
                .meta
                .fetch_metadata(Some(name), Duration::from_secs(5))
                .is_ok_and(|md| {
                    md.topics().first().is_some_and(|t| {
                        t.error().is_none()
                            && t.partitions().len() == partitions as usize
                            && t.partitions().iter().all(|p| p.leader() >= 0)
                    })
                });
            if ready {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("topic {name} has no leaders after 120 s");
    }

    /// Deletes every topic whose name starts with `prefix` (the run's own topics, the
    /// engines' changelogs included: their application ids carry the same prefix).
    pub fn delete_topics_with_prefix(&self, prefix: &str) -> usize {
        let Ok(md) = self.meta.fetch_metadata(None, Duration::from_secs(10)) else {
            return 0;
        };
        let names: Vec<String> = md
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .filter(|n| n.starts_with(prefix))
            .collect();
        if names.is_empty() {
            return 0;
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let _ = futures::executor::block_on(self.admin.delete_topics(&refs, &AdminOptions::new()));
        names.len()
    }

    /// High watermarks of partitions 0..n, or None while a partition has no leader yet.
    pub fn end_offsets(&self, topic: &str, partitions: i32) -> Option<Vec<i64>> {
        (0..partitions)
            .map(|p| {
                self.meta
                    .fetch_watermarks(topic, p, Duration::from_secs(5))
                    .ok()
                    .map(|w| w.1)
            })
            .collect()
    }

    /// Low watermarks (log start offsets) of partitions 0..n, or None when one cannot be read.
    /// Compaction never moves them; deleting segments by retention does.
    pub fn start_offsets(&self, topic: &str, partitions: i32) -> Option<Vec<i64>> {
        (0..partitions)
            .map(|p| {
                self.meta
                    .fetch_watermarks(topic, p, Duration::from_secs(5))
                    .ok()
                    .map(|w| w.0)
            })
            .collect()
    }

    /// The names of the cluster's topics.
    pub fn topic_names(&self) -> Vec<String> {
        self.meta
            .fetch_metadata(None, Duration::from_secs(10))
            .map(|md| md.topics().iter().map(|t| t.name().to_string()).collect())
            .unwrap_or_default()
    }

    /// A consumer that only reads `group`'s committed offsets (it never joins the group).
    pub fn offsets_reader(&self, group: &str) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            // librdkafka's default, read_committed, asks for stable offsets: while an
            // exactly-once engine keeps a transactional offset commit pending (every
            // 100 ms) the broker answers UNSTABLE_OFFSET_COMMIT and the read retries
            // for seconds. The offsets last committed are what is measured here.
            .set("isolation.level", "read_uncommitted")
            .create()
            .expect("offsets consumer")
    }
}

/// `group`'s committed offset for each partition of `topic` (0 when none).
pub fn committed(c: &BaseConsumer, topic: &str, partitions: i32) -> Vec<i64> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    match c.committed_offsets(tpl, Duration::from_secs(5)) {
        Ok(r) => {
            let mut out = vec![0; partitions as usize];
            for e in r.elements() {
                if let Offset::Offset(o) = e.offset()
                    && let Some(slot) = out.get_mut(e.partition() as usize)
                {
                    *slot = o;
                }
            }
            out
        }
        Err(_) => vec![0; partitions as usize],
    }
}

/// Waits until `group` has committed up to `ends` on every partition; returns when.
pub fn wait_committed(
    c: &BaseConsumer,
    topic: &str,
    ends: &[i64],
    timeout: Duration,
    alive: &mut dyn FnMut() -> Result<(), String>,
) -> Result<Instant, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let got = committed(c, topic, ends.len() as i32);
        if got.iter().zip(ends).all(|(g, e)| g >= e) {
            return Ok(Instant::now());
        }
        alive()?;
        if Instant::now() > deadline {
            return Err(format!(
                "committed offsets {got:?} did not reach {ends:?} in {timeout:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn generator_producer(bootstrap: &str) -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("partitioner", "murmur2_random")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer")
}

pub fn send(
    p: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    key: &[u8],
    value: &[u8],
    ts: i64,
) {
    let mut rec = BaseRecord::to(topic).key(key).payload(value).timestamp(ts);
    loop {
        match p.send(rec) {
            Ok(()) => return,
            Err((
                KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                back,
            )) => {
                rec = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => panic!("producing to {topic}: {e}"),
        }
    }
}

/// Reads `topic` from the beginning to its end (read_committed: what exactly-once
/// consumers see), in partition order. Call it once the writer has stopped.
pub fn read_all(bootstrap: &str, topic: &str, partitions: i32, mut f: impl FnMut(Out)) -> u64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("fetch.max.bytes", "33554432")
        .set("max.partition.fetch.bytes", "8388608")
        .create()
        .expect("reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition");
    }
    c.assign(&tpl).expect("assign");
    let mut eof: HashMap<i32, bool> = HashMap::new();
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    while eof.len() < partitions as usize {
        assert!(Instant::now() < deadline, "reading {topic} took over 600 s");
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                n += 1;
                f(Out {
                    key: m.key().unwrap_or_default().to_vec(),
                    value: m.payload().unwrap_or_default().to_vec(),
                });
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                eof.insert(p, true);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    n
}

/// The W3 restore limit: plain consumers with the worker's restore fetch sizes, one per
/// partition on its own thread, read `topic` from its start to its end (read_committed,
/// as an exactly-once restore does), touching each record but copying nothing. Each
/// connects (reading its watermarks) before the clock starts, starts at an explicit
/// offset and stops when its position reaches the end (a transaction marker is never
/// delivered; waiting for librdkafka's end-of-partition event cost 1.5 s more).
/// Returns the records read and the seconds from the start to the last partition's end.
pub fn read_raw(bootstrap: &str, topic: &str, partitions: i32) -> Result<(u64, f64), String> {
    let readers: Vec<(BaseConsumer, i32, i64, i64)> = (0..partitions)
        .map(|p| {
            let c: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                // librdkafka's assign needs a group; it is never joined.
                .set("group.id", format!("{topic}-raw-reader"))
                .set("enable.auto.commit", "false")
                .set("isolation.level", "read_committed")
                .set("fetch.max.bytes", "33554432")
                .set("max.partition.fetch.bytes", "8388608")
                .set("queued.max.messages.kbytes", "8192")
                .set("queued.min.messages", "20000")
                .create()
                .map_err(|e| format!("raw reader: {e}"))?;
            let (lo, hi) = c
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .map_err(|e| format!("watermarks of {topic}[{p}]: {e}"))?;
            Ok((c, p, lo, hi))
        })
        .collect::<Result<_, String>>()?;
    let start = Instant::now();
    let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = readers
            .iter()
            .map(|(c, p, lo, hi)| s.spawn(move || read_partition(c, topic, *p, *lo, *hi)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("reader panicked".into())))
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut n = 0;
    for r in results {
        n += r?;
    }
    Ok((n, seconds))
}

/// One partition of [`read_raw`]: `[lo, hi)`.
fn read_partition(c: &BaseConsumer, topic: &str, p: i32, lo: i64, hi: i64) -> Result<u64, String> {
    if lo >= hi {
        return Ok(0);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, p, Offset::Offset(lo))
        .map_err(|e| e.to_string())?;
    c.assign(&tpl)
        .map_err(|e| format!("assign {topic}[{p}]: {e}"))?;
    let consumed = || {
        c.position().is_ok_and(|pos| {
            pos.find_partition(topic, p)
                .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= hi))
        })
    };
    let (mut n, mut bytes) = (0u64, 0usize);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if Instant::now() > deadline {
            return Err(format!(
                "reading {topic}[{p}] took over 600 s ({n} records)"
            ));
        }
        match c.poll(Duration::from_millis(5)) {
            Some(Ok(m)) => {
                n += 1;
                bytes += m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len);
                if m.offset() + 2 >= hi && consumed() {
                    break;
                }
            }
            Some(Err(e)) => return Err(format!("reading {topic}[{p}]: {e}")),
            None if consumed() => break,
            None => {}
        }
    }
    std::hint::black_box(bytes);
    Ok(n)
}
