//! Records too large to produce. An output, repartition or dead-letter record over its
//! topic's `max.message.bytes` or the producer's `message.max.bytes` would fail the
//! commit, and the restart would replay the same record forever. Instead it becomes that
//! record's error under `errors.policy`: a dead letter with the reason, and a dead letter
//! that is itself too large goes out truncated, with its original size and digest.
//!
//! Owns the limits and what to do about a record over them (pure, but for reading the
//! topics' limits once at start); it must not send anything.

use std::collections::HashMap;

use oxbow_crds::ErrorPolicy;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use sha2::{Digest, Sha256};

use super::KAFKA_TIMEOUT;
use super::kafka::base_config;
use crate::config::App;

/// librdkafka's default `message.max.bytes`.
const DEFAULT_PRODUCER_LIMIT: usize = 1_000_000;
/// Kafka's default `max.message.bytes` of a topic.
const DEFAULT_TOPIC_LIMIT: usize = 1_048_588;
/// Room for the record batch's own framing (61 bytes) and the record's varints, kept
/// generous: a record refused for a few bytes is no better than one refused for many.
const FRAMING: usize = 512;

/// Size limits of the topics a worker writes to.
#[derive(Debug, Clone)]
pub struct Limits {
    producer: usize,
    topics: HashMap<String, usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            producer: DEFAULT_PRODUCER_LIMIT,
            topics: HashMap::new(),
        }
    }
}

impl Limits {
    /// Reads `max.message.bytes` of `topics`; a topic that cannot be described gets the
    /// broker default (a delivery error still stops the commit then, not silently).
    pub fn load(app: &App, topics: &[String]) -> Self {
        let producer = app
            .kafka
            .get("message.max.bytes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_PRODUCER_LIMIT);
        let mut out = Self {
            producer,
            topics: HashMap::new(),
        };
        let Ok(admin) = base_config(app).create::<AdminClient<DefaultClientContext>>() else {
            return out;
        };
        let specs: Vec<ResourceSpecifier> =
            topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let opts = AdminOptions::new().request_timeout(Some(KAFKA_TIMEOUT));
        let Ok(results) = futures::executor::block_on(admin.describe_configs(specs.iter(), &opts))
        else {
            return out;
        };
        for (topic, r) in topics.iter().zip(results) {
            let limit = r.ok().and_then(|r| {
                r.entries
                    .iter()
                    .find(|e| e.name == "max.message.bytes")
                    .and_then(|e| e.value.as_deref()?.parse().ok())
            });
            out.topics
                .insert(topic.clone(), limit.unwrap_or(DEFAULT_TOPIC_LIMIT));
        }
        out
    }

    /// The largest record `topic` takes from this producer.
    pub fn of(&self, topic: &str) -> usize {
        self.topics
            .get(topic)
            .copied()
            .unwrap_or(DEFAULT_TOPIC_LIMIT)
            .min(self.producer)
    }

    #[cfg(test)]
    pub fn with(producer: usize, topics: &[(&str, usize)]) -> Self {
        Self {
            producer,
            topics: topics.iter().map(|(t, n)| (t.to_string(), *n)).collect(),
        }
    }
}

/// What a record costs against a limit.
pub fn record_size(key: Option<&[u8]>, value: Option<&[u8]>, headers: &[(&str, &[u8])]) -> usize {
    key.map_or(0, <[u8]>::len)
        + value.map_or(0, <[u8]>::len)
        + headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum::<usize>()
        + FRAMING
}

/// What to do with an output record over its topic's limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TooLarge {
    /// Write this dead letter instead (its headers say why).
    DeadLetter(Vec<(&'static str, String)>),
    /// Count and drop it (`errors.policy: skip`).
    Skip(String),
    /// Stop the task (`errors.policy: fail`).
    Fail(String),
}

pub fn too_large(policy: ErrorPolicy, topic: &str, size: usize, limit: usize) -> TooLarge {
    let why = format!(
        "a record of about {size} bytes is over the {limit}-byte limit of topic {topic} (max.message.bytes, or the producer's message.max.bytes)"
    );
    match policy {
        ErrorPolicy::DeadLetter => TooLarge::DeadLetter(vec![
            ("oxbow.error", why),
            ("oxbow.reason", "RecordTooLarge".into()),
            ("oxbow.step", "produce".into()),
            ("oxbow.output.topic", topic.into()),
        ]),
        ErrorPolicy::Skip => TooLarge::Skip(why),
        ErrorPolicy::Fail => TooLarge::Fail(why),
    }
}

/// A record cut down to size: its key, value and headers.
pub type Truncated = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(&'static str, String)>,
);

/// A dead letter cut down to `limit`: the value is truncated (the key too when it alone
/// is over) and headers give the original size and SHA-256 of the value, so the record
/// can be found at its source. `None`: it fits as it is.
pub fn truncated(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&'static str, String)],
    limit: usize,
) -> Option<Truncated> {
    let hs: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    if record_size(key, value, &hs) <= limit {
        return None;
    }
    let original = value.unwrap_or_default();
    let mut extra = headers.to_vec();
    extra.push(("oxbow.truncated", "true".into()));
    extra.push(("oxbow.original.size", original.len().to_string()));
    extra.push((
        "oxbow.original.sha256",
        Sha256::digest(original)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    ));
    if let Some(k) = key {
        extra.push(("oxbow.original.key.size", k.len().to_string()));
    }
    let hs: Vec<(&str, &[u8])> = extra.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    let room = limit.saturating_sub(record_size(None, None, &hs));
    let key = key.map(|k| k[..k.len().min(room / 2)].to_vec());
    let room = room.saturating_sub(key.as_ref().map_or(0, Vec::len));
    let value = value.map(|v| v[..v.len().min(room)].to_vec());
    Some((key, value, extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_smaller_of_the_topic_and_the_producer() {
        let l = Limits::with(1_000_000, &[("small", 10_000), ("big", 5_000_000)]);
        assert_eq!(l.of("small"), 10_000);
        assert_eq!(l.of("big"), 1_000_000);
        assert_eq!(l.of("unknown"), 1_000_000);
    }

    #[test]
    fn an_oversized_output_becomes_the_records_error_under_each_policy() {
        match too_large(ErrorPolicy::DeadLetter, "out", 1_200_000, 1_000_000) {
            TooLarge::DeadLetter(h) => {
                assert!(h.contains(&("oxbow.reason", "RecordTooLarge".into())));
                assert!(h.contains(&("oxbow.output.topic", "out".into())));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            too_large(ErrorPolicy::Skip, "out", 2, 1),
            TooLarge::Skip(_)
        ));
        assert!(matches!(
            too_large(ErrorPolicy::Fail, "out", 2, 1),
            TooLarge::Fail(m) if m.contains("over the 1-byte limit of topic out")
        ));
    }

    #[test]
    fn a_dead_letter_over_the_limit_is_truncated_with_its_size_and_digest() {
        let value = vec![b'x'; 1_200_000];
        let headers = vec![("oxbow.error", "boom".to_string())];
        assert!(truncated(Some(b"k"), Some(b"small"), &headers, 1_000_000).is_none());
        let (key, v, h) =
            truncated(Some(b"k"), Some(&value), &headers, 1_000_000).expect("truncated");
        let v = v.expect("value");
        let hs: Vec<(&str, &[u8])> = h.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        assert!(record_size(key.as_deref(), Some(&v), &hs) <= 1_000_000);
        assert!(v.len() > 900_000, "keeps as much as fits: {}", v.len());
        assert_eq!(key.as_deref(), Some(&b"k"[..]));
        let get = |k: &str| h.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        assert_eq!(get("oxbow.original.size"), Some("1200000".into()));
        assert_eq!(get("oxbow.truncated"), Some("true".into()));
        assert_eq!(get("oxbow.original.sha256").map(|d| d.len()), Some(64));
        assert_eq!(get("oxbow.error"), Some("boom".into()));
    }
}
