//! The worker's Kafka clients: their settings, the producers (one transactional
//! producer per task under exactly-once, one shared under at-least-once) and their
//! delivery reports, sending and flushing, and reading record headers.
//!
//! Owns how a client is configured; it must not decide when to send or commit (that is
//! the run loop and `commit`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxbow_crds::validate::TRANSACTION_TIMEOUT_PROPERTY;
use oxbow_crds::{ProcessingGuarantee, TaskId};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientConfig, TopicPartitionList};

use super::commit::side_by_side;
use super::merge::Fetched;
use super::{EngineError, KAFKA_TIMEOUT};
use crate::config::App;
use crate::task::{SOURCE_HEADER, parse_source_header};

/// Delivery reports of every producer: the last offset per partition (changelog
/// checkpoints) and the first error.
#[derive(Default)]
pub(super) struct Tracker {
    pub(super) offsets: Mutex<HashMap<(String, i32), i64>>,
    pub(super) error: Mutex<Option<(String, i32, KafkaError)>>,
}

#[derive(Clone)]
pub(super) struct Ctx(Arc<Tracker>);
impl ClientContext for Ctx {}
impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(m) => {
                if let Ok(mut o) = self.0.offsets.lock() {
                    let e = o
                        .entry((m.topic().to_string(), m.partition()))
                        .or_insert(-1);
                    *e = (*e).max(m.offset());
                }
            }
            Err((e, m)) => {
                if let Ok(mut err) = self.0.error.lock() {
                    err.get_or_insert_with(|| (m.topic().to_string(), m.partition(), e.clone()));
                }
            }
        }
    }
}

pub(super) type KProducer = ThreadedProducer<Ctx>;

/// How often the main consumer reports statistics when a stage merges two streams.
const MERGE_STATISTICS_INTERVAL: &str = "100";

/// The main consumer's latest statistics per partition: whether each input of a merged
/// task has records not yet handed over (see [`super::merge`]). Empty unless the app
/// merges streams (statistics are off otherwise).
#[derive(Default)]
pub(super) struct FetchWatch {
    read_committed: bool,
    latest: Mutex<HashMap<(String, i32), Fetched>>,
    /// Set once statistics failed to parse (warned once).
    unreadable: std::sync::atomic::AtomicBool,
}

impl FetchWatch {
    pub(super) fn get(&self, topic: &str, partition: i32) -> Option<Fetched> {
        let latest = self.latest.lock().ok()?;
        latest.get(&(topic.to_string(), partition)).copied()
    }
}

/// A consumer's context: the statistics of merged inputs, and a count of the events
/// its poll handles without returning them.
#[derive(Clone)]
pub(super) struct ConsumerCtx {
    watch: Arc<FetchWatch>,
    events: Arc<AtomicU64>,
}

impl ConsumerCtx {
    fn new(watch: &Arc<FetchWatch>) -> Self {
        ConsumerCtx {
            watch: watch.clone(),
            events: Arc::default(),
        }
    }

    fn event(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }
}

/// Polls without waiting. `None` means the consumer's queue is empty: rust-rdkafka's
/// poll also answers `None` when it handled an event in place of a record (a log line,
/// statistics, an offset commit's result; `log.queue` puts librdkafka's log on that
/// queue too), with records possibly queued behind it. Those records raised no wake
/// (their queue was not empty), and a turn that took the `None` for an empty queue would
/// wait out its idle time, or read a partition's split-off queue before the records of
/// that partition still in the consumer's queue (out of order).
pub(super) fn poll_now(c: &MainConsumer) -> Option<KafkaResult<BorrowedMessage<'_>>> {
    past_events(
        || c.poll(Duration::ZERO),
        || c.context().events.load(Ordering::Relaxed),
    )
}

/// Repeats `poll` while an empty answer came with an event handled (`events` moved:
/// the callbacks run inside the poll, on this thread); `None` once a poll handled none.
fn past_events<T>(mut poll: impl FnMut() -> Option<T>, events: impl Fn() -> u64) -> Option<T> {
    loop {
        let seen = events();
        if let Some(polled) = poll() {
            return Some(polled);
        }
        if events() == seen {
            return None;
        }
    }
}

impl ClientContext for ConsumerCtx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.event();
        DefaultClientContext.log(level, fac, log_message);
    }

    fn stats_raw(&self, json: &[u8]) {
        self.event();
        match serde_json::from_slice::<Statistics>(json) {
            Ok(s) => self.stats(s),
            // Merged tasks then wait up to the idle time for a quiet input, as without
            // statistics; say so once rather than every 100 ms.
            Err(e) if !self.watch.unreadable.swap(true, Ordering::Relaxed) => {
                tracing::warn!(error = %e, "the consumer's statistics cannot be read: merged inputs wait by the idle time alone");
            }
            Err(_) => {}
        }
    }

    fn stats(&self, s: Statistics) {
        let at = Instant::now();
        let Ok(mut latest) = self.watch.latest.lock() else {
            return;
        };
        for (topic, t) in s.topics {
            for p in t
                .partitions
                .values()
                .filter(|p| p.partition >= 0 && p.desired)
            {
                // Under read_committed the consumer reads up to the last stable offset.
                let end = match self.watch.read_committed {
                    true => p.ls_offset,
                    false => p.hi_offset,
                };
                let fetched = Fetched {
                    at,
                    fetching: p.fetch_state == "active",
                    app_offset: p.app_offset,
                    end,
                };
                latest.insert((topic.clone(), p.partition), fetched);
            }
        }
    }
}
impl ConsumerContext for ConsumerCtx {
    fn commit_callback(&self, _: KafkaResult<()>, _: &TopicPartitionList) {
        self.event();
    }
}

/// The engine's consumer of sources, repartition topics, tables and changelogs.
pub(super) type MainConsumer = BaseConsumer<ConsumerCtx>;

/// The main consumer; it keeps statistics when a stage merges two streams.
pub(super) fn main_consumer(app: &App) -> Result<(MainConsumer, Arc<FetchWatch>), EngineError> {
    let merges = app.topology.stages.iter().any(|s| !s.streams.is_empty());
    let watch = Arc::new(FetchWatch {
        read_committed: app.guarantee == ProcessingGuarantee::ExactlyOnce,
        latest: Mutex::default(),
        unreadable: Default::default(),
    });
    let mut c = consumer_config(app, false);
    if merges {
        c.set("statistics.interval.ms", MERGE_STATISTICS_INTERVAL);
    }
    let consumer = c
        .create_with_context(ConsumerCtx::new(&watch))
        .map_err(|source| EngineError::CreateClient {
            what: "consumer",
            source,
        })?;
    Ok((consumer, watch))
}

/// A processing thread's consumer: the main consumer's settings, without statistics
/// (a task that needs them, one merging two streams, stays on the main consumer).
pub(super) fn task_consumer(
    app: &App,
    watch: &Arc<FetchWatch>,
) -> Result<MainConsumer, EngineError> {
    let c: MainConsumer = consumer_config(app, false)
        .create_with_context(ConsumerCtx::new(watch))
        .map_err(|source| EngineError::CreateClient {
            what: "processing thread's consumer",
            source,
        })?;
    // As the main consumer is at start: knowing the inputs' leaders, and connected to
    // them, before its first partitions are assigned (a client that learns them at its
    // first fetch starts that fetch up to a metadata round and a backoff later).
    for stage in &app.topology.stages {
        for topic in app.inputs(stage.index) {
            c.fetch_metadata(Some(topic), super::KAFKA_TIMEOUT)
                .map_err(EngineError::Metadata)?;
        }
    }
    Ok(c)
}

pub(super) enum Producers {
    /// One transactional producer per task: its id fences a zombie of that task.
    Transactional(BTreeMap<TaskId, (KProducer, bool)>),
    Shared(KProducer),
}

pub(super) fn base_config(app: &App) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set(
        "bootstrap.servers",
        &app.manifest.spec.kafka.bootstrap_servers,
    );
    for (k, v) in &app.kafka {
        c.set(k, v);
    }
    c
}

pub(super) fn consumer_config(app: &App, restore: bool) -> ClientConfig {
    let mut c = base_config(app);
    c.set("group.id", &app.application_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("allow.auto.create.topics", "false")
        .set("enable.partition.eof", "false");
    // Prefetch is per partition (librdkafka's defaults allow 100 000 records or 64 MiB
    // each): bounded, memory goes to RocksDB's budget, not to records in a queue. Each
    // queued record also costs librdkafka a few hundred bytes of bookkeeping; a smaller
    // queue kept W1's throughput (docs/benchmarks.md, "Tuning evidence").
    c.set("queued.max.messages.kbytes", "1024")
        .set("queued.min.messages", "2000")
        // With a queue this small it fills often; librdkafka then postpones the
        // partition's next fetch by this long (1 s by default), and the engine, having
        // drained the queue meanwhile, sits idle for the rest of it.
        .set("fetch.queue.backoff.ms", "5");
    if restore {
        // Restore reads whole logs, so its prefetch bound is its memory: librdkafka
        // keeps an op and the parsed headers of every fetched record until it is
        // consumed, several times the record itself, and a fetch overfills the queue by
        // up to its whole size. Big fetches held a compacted changelog's partition at
        // once; small ones, pipelined while few records wait, restore as fast (heaptrack
        // and the figures: docs/benchmarks.md, "Where the memory goes"). A record
        // larger than a fetch still comes whole (KIP-74).
        // A restore ends at a known offset, so a fetch that finds nothing must not wait
        // at the broker: librdkafka fetches on past the end while the restore checks
        // its position, and the next store assigned to this consumer waited behind that
        // long poll (500 ms by default; most of a short tail restore).
        c.set("fetch.wait.max.ms", "10")
            .set("fetch.max.bytes", "1048576")
            .set("max.partition.fetch.bytes", "65536")
            .set("queued.max.messages.kbytes", "8192")
            .set("queued.min.messages", "5000");
    }
    if app.guarantee == ProcessingGuarantee::ExactlyOnce {
        c.set("isolation.level", "read_committed");
    }
    c
}

pub(super) fn producer(
    app: &App,
    tracker: &Arc<Tracker>,
    transactional_id: Option<&str>,
) -> Result<KProducer, EngineError> {
    producer_config(app, transactional_id)?
        .create_with_context(Ctx(tracker.clone()))
        .map_err(|source| EngineError::CreateClient {
            what: "producer",
            source,
        })
}

pub(super) fn producer_config(
    app: &App,
    transactional_id: Option<&str>,
) -> Result<ClientConfig, EngineError> {
    let mut c = base_config(app);
    c.set("enable.idempotence", "true")
        .set("linger.ms", "5")
        // Same partitioning as the Java clients, so keyed outputs land where Kafka
        // Streams would put them.
        .set("partitioner", "murmur2_random")
        .set("compression.type", "lz4");
    if let Some(id) = transactional_id {
        let timeout = transaction_timeout(app)?;
        c.set("transactional.id", id).set(
            TRANSACTION_TIMEOUT_PROPERTY,
            timeout.as_millis().to_string(),
        );
    }
    Ok(c)
}

/// The transaction timeout of a task's producer: it follows the commit interval, or is
/// the user's `transaction.timeout.ms` (from the spec or the Kafka Secret, which the
/// operator's validation does not see) when that leaves room for the interval.
pub(super) fn transaction_timeout(app: &App) -> Result<Duration, EngineError> {
    Ok(oxbow_crds::validate::transaction_timeout(
        app.commit_interval,
        app.kafka
            .get(TRANSACTION_TIMEOUT_PROPERTY)
            .map(String::as_str),
    )?)
}

/// Waits until every record handed to `p` is acknowledged.
///
/// rdkafka's `flush` alternates `rd_kafka_flush(0)` with a `poll` of up to 100 ms; with
/// a `ThreadedProducer` the background thread takes the delivery events, so that poll
/// sleeps its full 100 ms and every flush costs at least that. Here the zero-timeout
/// flush (which also sends lingering batches at once) is repeated with short pauses.
pub(super) fn flush(p: &KProducer, timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        match p.flush(Duration::ZERO) {
            Ok(()) => return Ok(()),
            Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut))
                if Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => return Err(e),
        }
    }
}

pub(super) fn send(
    p: &KProducer,
    topic: &str,
    partition: Option<i32>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: Option<OwnedHeaders>,
    timestamp: Option<i64>,
) -> Result<(), EngineError> {
    let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
    if let Some(p) = partition {
        rec = rec.partition(p);
    }
    if let Some(k) = key {
        rec = rec.key(k);
    }
    if let Some(v) = value {
        rec = rec.payload(v);
    }
    if let Some(h) = headers {
        rec = rec.headers(h);
    }
    if let Some(ts) = timestamp {
        rec = rec.timestamp(ts);
    }
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                rec = r;
                p.poll(Duration::from_millis(2));
            }
            Err((source, _)) => {
                return Err(EngineError::Produce {
                    topic: topic.to_string(),
                    source,
                });
            }
        }
    }
}

/// The value of header `name` of `m`, if it has one.
pub(super) fn header<'a, M: rdkafka::message::Message>(m: &'a M, name: &str) -> Option<&'a [u8]> {
    use rdkafka::message::Headers;
    m.headers()?.iter().find(|h| h.key == name)?.value
}

/// The source offsets a changelog record says produced it ([`SOURCE_HEADER`]).
pub(super) fn source_of(
    m: &rdkafka::message::BorrowedMessage<'_>,
) -> Option<BTreeMap<String, i64>> {
    m.headers()
        .and_then(|h| {
            h.iter()
                .find(|h| h.key == SOURCE_HEADER)
                .and_then(|h| h.value)
        })
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(parse_source_header)
}

/// Creates the transactional producers of `ids` and initialises them side by side.
/// Each `init_transactions` fences the previous producer with the task's id and aborts
/// its open transaction; librdkafka waits on fixed 500 ms coordinator timers there, so
/// one after the other this took about half a second per task.
pub(super) fn init_producers(
    app: &App,
    tracker: &Arc<Tracker>,
    ids: &[TaskId],
) -> Result<Vec<(TaskId, KProducer)>, EngineError> {
    let items = ids.iter().map(|id| (*id, ())).collect();
    side_by_side(items, "initialising the task's producer", |id, ()| {
        let tid = app.manifest.transactional_id(id);
        let p = producer(app, tracker, Some(&tid))?;
        p.init_transactions(KAFKA_TIMEOUT)
            .map_err(|source| EngineError::InitTransactions {
                transactional_id: tid.clone(),
                source,
            })?;
        Ok(p)
    })
    .into_iter()
    .map(|(id, r)| r.map(|p| (id, p)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(commit_interval: &str, properties: &[(&str, &str)]) -> App {
        let text = format!(
            r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: t}}
spec:
  commitInterval: {commit_interval}
  kafka: {{bootstrapServers: "127.0.0.1:1"}}
  source: {{topics: [in]}}
"#
        );
        let m =
            crate::config::parse_manifest(std::path::Path::new("t.yaml"), &text).expect("parses");
        let kafka = properties
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        App::from_manifest(m, kafka).expect("valid")
    }

    fn timeout_ms(app: &App) -> Option<String> {
        producer_config(app, Some("t-0"))
            .expect("configures")
            .get(TRANSACTION_TIMEOUT_PROPERTY)
            .map(str::to_string)
    }

    #[test]
    fn a_long_commit_interval_gets_a_transaction_timeout_that_outlives_it() {
        assert_eq!(timeout_ms(&app("100ms", &[])).as_deref(), Some("60000"));
        assert_eq!(timeout_ms(&app("90s", &[])).as_deref(), Some("210000"));
    }

    #[test]
    fn a_users_transaction_timeout_is_not_overwritten() {
        let a = app("90s", &[(TRANSACTION_TIMEOUT_PROPERTY, "400000")]);
        assert_eq!(timeout_ms(&a).as_deref(), Some("400000"));
    }

    #[test]
    fn a_transaction_timeout_from_the_kafka_secret_that_cannot_hold_the_interval_fails_the_start() {
        // The Secret's properties reach only the worker: the operator's validation
        // never sees them, so the worker is the one to refuse.
        let a = app("90s", &[(TRANSACTION_TIMEOUT_PROPERTY, "60000")]);
        let err = producer_config(&a, Some("t-0")).expect_err("no room for the interval");
        assert!(
            err.to_string().contains("at least twice that (180000 ms)"),
            "{err}"
        );
        assert!(
            producer_config(&a, None).is_ok(),
            "the at-least-once producer has no transaction"
        );
    }
}

#[cfg(test)]
mod poll_tests {
    use super::past_events;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    /// What a zero-timeout poll meets next in a consumer's queue.
    #[derive(Clone, Copy)]
    enum Next {
        Record(u32),
        /// Handled inside the poll (a log line, statistics), which then answers `None`.
        Event,
    }

    struct Queue {
        items: RefCell<VecDeque<Next>>,
        events: Cell<u64>,
    }

    impl Queue {
        fn new(items: &[Next]) -> Self {
            Queue {
                items: RefCell::new(items.iter().copied().collect()),
                events: Cell::new(0),
            }
        }

        fn poll_now(&self) -> Option<u32> {
            past_events(
                || match self.items.borrow_mut().pop_front()? {
                    Next::Record(r) => Some(r),
                    Next::Event => {
                        self.events.set(self.events.get() + 1);
                        None
                    }
                },
                || self.events.get(),
            )
        }
    }

    #[test]
    fn records_queued_behind_events_are_polled_not_taken_for_an_empty_queue() {
        use Next::*;
        let q = Queue::new(&[Event, Event, Record(7), Event, Record(8)]);
        assert_eq!(q.poll_now(), Some(7));
        assert_eq!(q.poll_now(), Some(8));
        assert_eq!(q.events.get(), 3, "every event was handled on the way");
    }

    #[test]
    fn an_empty_queue_answers_none_as_does_one_with_only_events_left() {
        assert_eq!(Queue::new(&[]).poll_now(), None);
        let q = Queue::new(&[Next::Event, Next::Event]);
        assert_eq!(q.poll_now(), None);
        assert!(q.items.borrow().is_empty(), "the events were all handled");
    }
}
