//! The claims topic of one Kafka cluster (I/O): reads it to its end into a
//! [`ClaimsView`] and writes claim and topic records. What the records mean and what is
//! decided from them is [`crate::ownership`]'s; this module must not decide anything.
//!
//! The topic is compacted with one partition, so its order is the order of claims. The
//! view is kept between reconciliations and only the new records are read each time.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::ownership::ClaimsView;
use crate::topics::{Role, WantedTopic};

#[derive(Debug, thiserror::Error)]
pub enum ClaimsError {
    #[error("failed to create a Kafka client for the claims topic {topic}")]
    Client {
        topic: String,
        #[source]
        source: Box<KafkaError>,
    },
    #[error("failed to read the claims topic {topic}")]
    Read {
        topic: String,
        #[source]
        source: Box<KafkaError>,
    },
    #[error("timed out reading the claims topic {topic} to offset {end} (at {at})")]
    ReadTimeout { topic: String, end: i64, at: i64 },
    #[error("the claim {key} written to the claims topic {topic} was not read back")]
    NotReadBack { topic: String, key: String },
    #[error("failed to write {key} to the claims topic {topic}")]
    Write {
        topic: String,
        key: String,
        #[source]
        source: Box<KafkaError>,
    },
}

/// The claims topic as the operator creates it when it is missing.
pub fn wanted(topic: &str) -> WantedTopic {
    WantedTopic {
        name: topic.into(),
        role: Role::Changelog,
        store: None,
        partitions: 1,
        replication_factor: None,
        configs: BTreeMap::from([
            ("cleanup.policy".to_string(), "compact".to_string()),
            // Tombstones must outlive an operator that is down for a while, or it would
            // never see a claim taken back and keep it as live.
            ("delete.retention.ms".to_string(), "604800000".to_string()),
        ]),
    }
}

struct Reader {
    consumer: BaseConsumer,
    view: ClaimsView,
    /// The next offset to read.
    next: i64,
}

pub struct Claims {
    topic: String,
    reader: Mutex<Option<Reader>>,
    producer: FutureProducer,
    config: ClientConfig,
    timeout: Duration,
}

impl Claims {
    pub fn new(
        topic: &str,
        bootstrap: &str,
        properties: &BTreeMap<String, String>,
    ) -> Result<Self, ClaimsError> {
        let mut config = ClientConfig::new();
        for (k, v) in properties {
            config.set(k, v);
        }
        config
            .set("bootstrap.servers", bootstrap)
            .set("socket.timeout.ms", "10000");
        let producer = config
            .clone()
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "10000")
            .create()
            .map_err(|source| ClaimsError::Client {
                topic: topic.into(),
                source: Box::new(source),
            })?;
        Ok(Self {
            topic: topic.into(),
            reader: Mutex::new(None),
            producer,
            config,
            timeout: Duration::from_secs(10),
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Everything in the topic up to its current end.
    pub async fn view(self: &std::sync::Arc<Self>) -> Result<ClaimsView, ClaimsError> {
        let me = self.clone();
        // librdkafka's poll blocks: on the blocking pool, as the metadata calls.
        tokio::task::spawn_blocking(move || me.read_to_end())
            .await
            .unwrap_or_else(|e| match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(_) => Err(ClaimsError::Read {
                    topic: self.topic.clone(),
                    source: Box::new(KafkaError::Canceled),
                }),
            })
    }

    fn read_to_end(&self) -> Result<ClaimsView, ClaimsError> {
        let read = |source| ClaimsError::Read {
            topic: self.topic.clone(),
            source: Box::new(source),
        };
        let mut guard = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let consumer: BaseConsumer = self
                .config
                .clone()
                .set("group.id", "oxbow-operator-claims")
                .set("enable.auto.commit", "false")
                .set("enable.partition.eof", "true")
                .set("auto.offset.reset", "earliest")
                // Each read starts with a watermark request on the same connection as
                // the fetches, and the broker answers a connection's requests in order:
                // behind a fetch parked for librdkafka's default 500 ms, reconciles
                // queued on this reader for seconds each, and new apps were not reached
                // (docs/benchmarks.md, "At 500 StreamApps").
                .set("fetch.wait.max.ms", "10")
                .create()
                .map_err(|source| ClaimsError::Client {
                    topic: self.topic.clone(),
                    source: Box::new(source),
                })?;
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&self.topic, 0, Offset::Beginning)
                .map_err(read)?;
            consumer.assign(&tpl).map_err(read)?;
            *guard = Some(Reader {
                consumer,
                view: ClaimsView::default(),
                next: 0,
            });
        }
        let reader = guard.as_mut().expect("set above");
        // Paused between reads (below): no fetches while nobody reads.
        let mut partition = TopicPartitionList::new();
        partition.add_partition(&self.topic, 0);
        reader.consumer.resume(&partition).map_err(read)?;
        let (_, end) = reader
            .consumer
            .fetch_watermarks(&self.topic, 0, self.timeout)
            .map_err(read)?;
        let deadline = Instant::now() + self.timeout;
        while reader.next < end {
            if Instant::now() > deadline {
                let at = reader.next;
                // Start over next time rather than trust a half-read position.
                *guard = None;
                return Err(ClaimsError::ReadTimeout {
                    topic: self.topic.clone(),
                    end,
                    at,
                });
            }
            match reader.consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    if let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) {
                        reader.view.apply(m.offset(), key, m.payload());
                    }
                    reader.next = m.offset() + 1;
                }
                // Compaction leaves gaps: the end of the partition is the end. But an
                // end-of-partition event can be a stale one, queued when an earlier
                // read reached the end before the records written since: only the
                // fetch position says whether this read is done.
                Some(Err(KafkaError::PartitionEOF(_))) => {
                    let at_end = reader.consumer.position().ok().is_some_and(|tpl| {
                        tpl.find_partition(&self.topic, 0)
                            .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= end))
                    });
                    if at_end {
                        break;
                    }
                }
                Some(Err(e)) => {
                    *guard = None;
                    return Err(read(e));
                }
                None => {}
            }
        }
        reader.consumer.pause(&partition).map_err(read)?;
        Ok(reader.view.clone())
    }

    /// Writes one record (`None`: a tombstone) and waits until the broker has it.
    pub async fn write(&self, key: &str, value: Option<&[u8]>) -> Result<(), ClaimsError> {
        let mut record = FutureRecord::<str, [u8]>::to(&self.topic).key(key);
        if let Some(v) = value {
            record = record.payload(v);
        }
        self.producer
            .send(record, self.timeout)
            .await
            .map(|_| ())
            .map_err(|(source, _)| ClaimsError::Write {
                topic: self.topic.clone(),
                key: key.into(),
                source: Box::new(source),
            })
    }
}
