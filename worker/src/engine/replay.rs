//! At-least-once across a repartition: a stage that restarts from its last committed
//! offsets writes the records it had already sent to the next stage a second time, and
//! the next stage, reading them at new offsets, would count them twice. Each record sent
//! to a repartition topic under at-least-once therefore carries its origin (the input
//! record it came from, and which of that record's outputs it is) in [`ORIGIN_HEADER`];
//! the next stage's task keeps, per upstream partition, the highest origin it has
//! processed ([`Marks`]) and drops a record whose origin is not above it.
//!
//! Why a mark per upstream partition is enough: one upstream task writes its outputs
//! in input order, and a restarted one starts again at its committed offset, below
//! anything it wrote after that commit. So every origin at or below a mark was seen
//! earlier in the repartition partition. The marks are committed with the offsets they
//! belong to (in the offset commit's metadata), so a restarted task resumes with the
//! marks of the position it resumes from.
//!
//! Pure: parsing, deciding and encoding. The engine attaches headers and commits.

use std::collections::BTreeMap;

/// Repartition record header: `topic:partition:offset:index`, the input record this
/// record came from and its place among that record's repartitioned outputs.
pub const ORIGIN_HEADER: &str = "oxbow.origin";

/// Kafka's default `offset.metadata.max.bytes`: marks longer than this are not
/// committed (the stage then falls back to plain at-least-once after a restart).
pub const MAX_METADATA: usize = 4096;

/// The position of an output in its upstream partition: the input offset, then the
/// output's index among that input record's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seq {
    pub offset: i64,
    pub index: u32,
}

/// Where a repartition record came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub topic: String,
    pub partition: i32,
    pub seq: Seq,
}

impl Origin {
    /// The header value of output `index` of input record `topic/partition@offset`.
    pub fn header(topic: &str, partition: i32, offset: i64, index: u32) -> String {
        format!("{topic}:{partition}:{offset}:{index}")
    }

    /// Parses an [`ORIGIN_HEADER`] value; `None` for anything malformed (such a record
    /// is processed, never dropped).
    pub fn parse(text: &str) -> Option<Self> {
        // Topic names cannot hold ':' (Kafka allows [a-zA-Z0-9._-]).
        let mut parts = text.rsplitn(4, ':');
        let index = parts.next()?.parse().ok()?;
        let offset = parts.next()?.parse().ok()?;
        let partition = parts.next()?.parse().ok()?;
        let topic = parts.next().filter(|t| !t.is_empty())?.to_string();
        Some(Self {
            topic,
            partition,
            seq: Seq { offset, index },
        })
    }
}

/// What to do with a repartition record, given the task's marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// First seen: process it (the mark moved up to it).
    New,
    /// Written again by an upstream replay; it was processed before: drop it.
    Replayed,
}

/// Per upstream (topic, partition), the highest origin processed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks(BTreeMap<(String, i32), Seq>);

impl Marks {
    /// Decides on a record of origin `o`, moving the mark when it is new.
    pub fn admit(&mut self, o: &Origin) -> Admission {
        let key = (o.topic.clone(), o.partition);
        match self.0.get(&key) {
            Some(mark) if o.seq <= *mark => Admission::Replayed,
            _ => {
                self.0.insert(key, o.seq);
                Admission::New
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The marks as offset-commit metadata: `m1;` then `t.p.o.i` entries joined by
    /// `;`, where `t` is the topic's index in `upstream` (topic names are long, the
    /// metadata is capped at [`MAX_METADATA`] bytes). `None` when they do not fit or
    /// name a topic not in `upstream`.
    pub fn encode(&self, upstream: &[String]) -> Option<String> {
        let mut text = String::from("m1");
        for ((topic, partition), seq) in &self.0 {
            let t = upstream.iter().position(|u| u == topic)?;
            text.push_str(&format!(";{t}.{partition}.{}.{}", seq.offset, seq.index));
        }
        (text.len() <= MAX_METADATA).then_some(text)
    }

    /// Reads [`Marks::encode`]'s metadata back; anything else (empty, another client's
    /// metadata, a topic index out of range) gives no marks.
    pub fn decode(text: &str, upstream: &[String]) -> Self {
        let mut marks = BTreeMap::new();
        let mut entries = text.split(';');
        if entries.next() != Some("m1") {
            return Self::default();
        }
        for e in entries {
            let f: Vec<&str> = e.split('.').collect();
            let parsed = match f.as_slice() {
                [t, p, o, i] => (|| {
                    let topic = upstream.get(t.parse::<usize>().ok()?)?.clone();
                    let seq = Seq {
                        offset: o.parse().ok()?,
                        index: i.parse().ok()?,
                    };
                    Some(((topic, p.parse().ok()?), seq))
                })(),
                _ => None,
            };
            match parsed {
                Some((k, seq)) => {
                    marks.insert(k, seq);
                }
                None => return Self::default(),
            }
        }
        Self(marks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(topic: &str, partition: i32, offset: i64, index: u32) -> Origin {
        Origin::parse(&Origin::header(topic, partition, offset, index)).expect("a header parses")
    }

    #[test]
    fn an_origin_header_round_trips_and_malformed_ones_are_refused() {
        let o = origin("app-by-user-repartition", 3, 120, 2);
        assert_eq!(o.topic, "app-by-user-repartition");
        assert_eq!((o.partition, o.seq.offset, o.seq.index), (3, 120, 2));
        for bad in ["", "t:1:2", ":1:2:3", "t:x:2:3", "t:1:2:-1", "t:1:2:3:"] {
            assert_eq!(Origin::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_replayed_origin_is_dropped_and_a_new_one_moves_the_mark() {
        let mut m = Marks::default();
        assert_eq!(m.admit(&origin("in", 0, 10, 0)), Admission::New);
        assert_eq!(m.admit(&origin("in", 0, 10, 1)), Admission::New);
        assert_eq!(m.admit(&origin("in", 0, 11, 0)), Admission::New);
        // The upstream task restarted at offset 10: its outputs come again.
        assert_eq!(m.admit(&origin("in", 0, 10, 0)), Admission::Replayed);
        assert_eq!(m.admit(&origin("in", 0, 10, 1)), Admission::Replayed);
        assert_eq!(m.admit(&origin("in", 0, 11, 0)), Admission::Replayed);
        // It goes on past what it had written: new again.
        assert_eq!(m.admit(&origin("in", 0, 11, 1)), Admission::New);
        assert_eq!(m.admit(&origin("in", 0, 12, 0)), Admission::New);
        // Other upstream partitions and topics have marks of their own.
        assert_eq!(m.admit(&origin("in", 1, 5, 0)), Admission::New);
        assert_eq!(m.admit(&origin("other", 0, 1, 0)), Admission::New);
    }

    #[test]
    fn marks_survive_the_commit_metadata_and_refuse_what_they_cannot_read() {
        let upstream = vec!["a".to_string(), "b".to_string()];
        let mut m = Marks::default();
        m.admit(&origin("a", 0, 10, 1));
        m.admit(&origin("b", 7, 99, 0));
        let text = m.encode(&upstream).expect("fits");
        assert_eq!(text, "m1;0.0.10.1;1.7.99.0");
        assert_eq!(Marks::decode(&text, &upstream), m);
        assert_eq!(Marks::decode("", &upstream), Marks::default());
        assert_eq!(Marks::decode("m1;5.0.1.0", &upstream), Marks::default());
        assert_eq!(Marks::decode("m1;0.0.x.0", &upstream), Marks::default());
        assert_eq!(Marks::decode("m1", &upstream), Marks::default());
        // A topic it does not know cannot be encoded.
        let mut other = Marks::default();
        other.admit(&origin("c", 0, 1, 0));
        assert_eq!(other.encode(&upstream), None);
    }

    #[test]
    fn marks_too_long_for_the_metadata_are_not_encoded() {
        let upstream = vec!["a".to_string()];
        let mut m = Marks::default();
        for p in 0..1000 {
            m.admit(&origin("a", p, 1_000_000_000, 0));
        }
        assert_eq!(m.encode(&upstream), None);
    }
}
