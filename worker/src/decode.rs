//! How a task reads an input record: the formats of the source, of a joined stream and of
//! a repartition record, and the record's event time.
//!
//! Owns: decoding bytes into the JSON the steps see. Must not touch: what the steps do
//! with it, or Kafka (the engine hands the bytes over).

use base64::Engine as _;
use oxbow_crds::RecordFormat;
use serde_json::Value as Json;

use crate::expr::{Env, Input};
use crate::processor::{RecordError, StepError};
use crate::projection::Fields;
use crate::task::{MAX_TIMESTAMP, SourceMessage};

/// Why bytes are not a record in their format.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("invalid JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("invalid UTF-8: {0}")]
    Utf8(#[source] std::str::Utf8Error),
}

/// Bytes in `format` as the JSON a step sees (no bytes: null).
pub fn decode(bytes: Option<&[u8]>, format: RecordFormat) -> Result<Json, DecodeError> {
    let Some(b) = bytes else {
        return Ok(Json::Null);
    };
    match format {
        RecordFormat::Json => serde_json::from_slice(b).map_err(DecodeError::Json),
        RecordFormat::String => std::str::from_utf8(b)
            .map(|s| Json::String(s.to_string()))
            .map_err(DecodeError::Utf8),
        RecordFormat::Bytes => Ok(Json::String(
            base64::engine::general_purpose::STANDARD.encode(b),
        )),
    }
}

/// JSON bytes as the steps see them when only `fields` are read (see
/// [`crate::projection`]): an object keeps only those fields, anything else is kept whole.
/// The bytes are checked as fully as [`decode`] checks them, with the same errors.
pub fn decode_projected(bytes: Option<&[u8]>, fields: &Fields) -> Result<Json, DecodeError> {
    let Some(b) = bytes else {
        return Ok(Json::Null);
    };
    let mut de = serde_json::Deserializer::from_slice(b);
    serde::de::DeserializeSeed::deserialize(Keep(Some(fields)), &mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(DecodeError::Json)
}

/// `what` of a record did not decode.
pub(crate) fn undecodable(what: impl Into<String>, source: DecodeError) -> StepError {
    StepError::Record(RecordError::Decode {
        what: what.into(),
        source,
    })
}

/// A step's stored `what` did not decode.
pub(crate) fn unreadable(what: impl Into<String>, source: DecodeError) -> StepError {
    StepError::Record(RecordError::State {
        what: what.into(),
        source,
    })
}

/// What to keep of one JSON value: `None`, all of it.
#[derive(Clone, Copy)]
struct Keep<'a>(Option<&'a Fields>);

impl<'de> serde::de::DeserializeSeed<'de> for Keep<'_> {
    type Value = Json;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        match self.0 {
            None => serde::Deserialize::deserialize(d),
            Some(fields) => d.deserialize_any(KeepVisitor(fields)),
        }
    }
}

/// Builds the value as serde_json's own visitor does, except that an object's fields
/// outside the projection are skipped (still parsed and checked, never built).
struct KeepVisitor<'a>(&'a Fields);

impl<'de> serde::de::Visitor<'de> for KeepVisitor<'_> {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Json::Null, Json::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Json>()? {
            out.push(v);
        }
        Ok(Json::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match self.0.0.get(key.as_ref()) {
                Some(inner) => {
                    let v = map.next_value_seed(Keep(inner.as_ref()))?;
                    out.insert(key.into_owned(), v);
                }
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(Json::Object(out))
    }
}

/// An object key, borrowed from the input when it has no escapes.
struct KeySeed;

impl<'de> serde::de::DeserializeSeed<'de> for KeySeed {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeySeed {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object key")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(v))
    }
}

/// A record's event time: `expr` over it, else its Kafka timestamp; within 1970..9999,
/// as window arithmetic needs.
pub(crate) fn event_time(
    expr: Option<&crate::expr::Expr>,
    env: &Env,
    input: &Input<'_>,
) -> Result<i64, (String, StepError)> {
    let timestamp = match expr {
        Some(e) => e
            .timestamp(env, input)
            .map_err(|e| ("timestamp".to_string(), StepError::from(e)))?,
        None => input.timestamp,
    };
    if !(0..=MAX_TIMESTAMP).contains(&timestamp) {
        return Err((
            "timestamp".to_string(),
            StepError::invalid(format!(
                "event time {timestamp} is outside 0..={MAX_TIMESTAMP} (epoch milliseconds)"
            )),
        ));
    }
    Ok(timestamp)
}

/// A record of a joined stream: a string key (the join key), the stream's value format,
/// its event time.
pub(crate) fn decode_join_stream(
    j: &crate::config::JoinInput,
    env: &Env,
    msg: &SourceMessage<'_>,
    now: i64,
    partitions: u32,
) -> Result<(Json, Json, i64), (String, StepError)> {
    let bad = |e: StepError| ("deserialize".to_string(), e);
    let key = match msg.key.map(std::str::from_utf8) {
        Some(Ok(k)) => Json::String(k.to_string()),
        Some(Err(e)) => return Err(bad(undecodable("key", DecodeError::Utf8(e)))),
        None => {
            return Err(bad(StepError::invalid(format!(
                "a record of joined stream {:?} without a key: it must be keyed by the join key",
                msg.topic
            ))));
        }
    };
    if let Some(k) = msg.key {
        co_partitioned("joined stream", msg, k, partitions)
            .map_err(|m| bad(StepError::invalid(m)))?;
    }
    let value = decode(msg.value, j.value_format).map_err(|e| bad(undecodable("value", e)))?;
    let input = Input {
        key: &key,
        value: &value,
        timestamp: msg.timestamp.unwrap_or(now),
    };
    let timestamp = event_time(j.timestamp.as_ref(), env, &input)?;
    Ok((key, value, timestamp))
}

/// A record of stage > 0, as the stage before wrote it: the value and
/// [`KEY_HEADER`](crate::task::KEY_HEADER) as
/// JSON, the event time as the Kafka timestamp.
pub(crate) fn decode_repartitioned(
    msg: &SourceMessage<'_>,
    now: i64,
) -> Result<(Json, Json, i64), (String, StepError)> {
    let bad = |what: &str, e: DecodeError| {
        (
            "deserialize".to_string(),
            undecodable(format!("repartitioned {what}"), e),
        )
    };
    let key = match msg.record_key {
        Some(k) => serde_json::from_slice(k).map_err(|e| bad("key", DecodeError::Json(e)))?,
        None => Json::Null,
    };
    let value = decode(msg.value, RecordFormat::Json).map_err(|e| bad("value", e))?;
    Ok((key, value, msg.timestamp.unwrap_or(now)))
}

/// A joined stream's record is where murmur2 puts its key: otherwise the other side's
/// records of that key are in another task, and the join would silently miss them. The error names the reason, the topic and both
/// partitions.
pub(crate) fn co_partitioned(
    what: &str,
    msg: &SourceMessage<'_>,
    key: &[u8],
    partitions: u32,
) -> Result<(), String> {
    let want = crate::query::partition_for(oxbow_crds::Partitioner::Murmur2, key, partitions);
    if want == Some(msg.partition as u32) {
        return Ok(());
    }
    Err(format!(
        "{}: a record of {what} {:?} with key {:?} is in partition {}, but the default (murmur2) partitioner puts that key in partition {}: its producers must use murmur2 (the Java clients' default; librdkafka's is consistent_random), or the join misses the other side's records",
        crate::task::NOT_PARTITIONED_AS_DECLARED,
        msg.topic,
        String::from_utf8_lossy(key),
        msg.partition,
        want.map_or("?".into(), |p| p.to_string())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields the planner keeps for an aggregate summing `value.<path>` for each path.
    fn fields(paths: &[&str]) -> Fields {
        let sums: Vec<String> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| format!("f{i}: {{sum: value.{p}}}"))
            .collect();
        let yaml = format!(
            "kafka: {{bootstrapServers: k:9092}}\nsource: {{topics: [in]}}\nsink: {{topic: out}}\nsteps:\n- aggregate: {{store: s, groupBy: key, fields: {{{}}}}}\n",
            sums.join(", ")
        );
        let spec: oxbow_crds::StreamAppSpec = serde_yaml::from_str(&yaml).expect("spec");
        match crate::projection::plan(&spec) {
            crate::projection::Plan::Project(f) => f,
            other => panic!("no projection: {other:?}"),
        }
    }

    #[test]
    fn a_projected_object_keeps_the_selected_fields_exactly_as_a_full_decode_has_them() {
        let f = fields(&["user", "amount", "nested.inner"]);
        let bytes = br#"{"txId":"tx-1","user":"al\u00e9","amount":1.5e3,"nested":{"inner":[1,{"x":null}],"other":"skip"},"note":"padding \"quoted\""}"#;
        let got = decode_projected(Some(bytes), &f).expect("decodes");
        assert_eq!(
            got,
            serde_json::json!({"user": "alé", "amount": 1500.0, "nested": {"inner": [1, {"x": null}]}})
        );
    }

    #[test]
    fn a_projected_decode_refuses_what_a_full_decode_refuses_with_the_same_error() {
        let f = fields(&["user"]);
        for bad in [
            &b"{\"txId\": not json"[..],
            b"{\"user\":\"a\",\"note\":\"x\"} trailing",
            b"{\"user\":\"a\",\"note\":[1,2}",
            b"{\"note\":\"\\uZZZZ\",\"user\":1}",
            b"",
        ] {
            let full = decode(Some(bad), RecordFormat::Json).expect_err("full refuses");
            let projected = decode_projected(Some(bad), &f).expect_err("projected refuses");
            assert_eq!(
                projected.to_string(),
                full.to_string(),
                "for {:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn values_that_are_not_objects_are_kept_whole_so_selections_fail_alike() {
        let f = fields(&["user.name"]);
        for text in [
            &br#"[1,2]"#[..],
            b"42",
            b"\"s\"",
            b"null",
            br#"{"user":7}"#,
            br#"{"user":[{"name":1}]}"#,
        ] {
            let full = decode(Some(text), RecordFormat::Json).expect("full");
            let projected = decode_projected(Some(text), &f).expect("projected");
            assert_eq!(projected, full, "for {}", String::from_utf8_lossy(text));
        }
        assert_eq!(decode_projected(None, &f).ok(), Some(Json::Null));
    }

    #[test]
    fn a_record_that_does_not_decode_keeps_the_parsers_error_as_its_cause() {
        let e = decode(Some(b"{\"a\":"), RecordFormat::Json).expect_err("refused");
        let StepError::Record(r) = undecodable("value", e) else {
            panic!("a record error");
        };
        assert!(
            r.to_string()
                .starts_with("failed to decode value: invalid JSON: "),
            "{r}"
        );
        let cause = std::error::Error::source(&r).expect("the decode error");
        let parser = cause
            .source()
            .and_then(|c| c.downcast_ref::<serde_json::Error>());
        assert!(parser.is_some_and(serde_json::Error::is_eof), "{cause:?}");
    }

    #[test]
    fn a_duplicated_field_keeps_the_last_occurrence_like_a_full_decode() {
        let f = fields(&["a"]);
        let bytes = br#"{"a":1,"b":2,"a":3}"#;
        assert_eq!(
            decode_projected(Some(bytes), &f).ok(),
            Some(serde_json::json!({"a": 3}))
        );
        assert_eq!(
            decode(Some(bytes), RecordFormat::Json).expect("full")["a"],
            3
        );
    }
}
