//! How a task reads an input record: the formats of the source, of a joined stream and of
//! a repartition record, and the record's event time.
//!
//! Owns: decoding bytes into the JSON the steps see. Must not touch: what the steps do
//! with it, or Kafka (the engine hands the bytes over).

use base64::Engine as _;
use oxbow_crds::RecordFormat;
use serde_json::Value as Json;

use crate::expr::{Env, Input};
use crate::processor::StepError;
use crate::task::{MAX_TIMESTAMP, SourceMessage};

/// Bytes in `format` as the JSON a step sees (no bytes: null).
pub fn decode(bytes: Option<&[u8]>, format: RecordFormat) -> Result<Json, String> {
    let Some(b) = bytes else {
        return Ok(Json::Null);
    };
    match format {
        RecordFormat::Json => serde_json::from_slice(b).map_err(|e| format!("invalid JSON: {e}")),
        RecordFormat::String => std::str::from_utf8(b)
            .map(|s| Json::String(s.to_string()))
            .map_err(|e| format!("invalid UTF-8: {e}")),
        RecordFormat::Bytes => Ok(Json::String(
            base64::engine::general_purpose::STANDARD.encode(b),
        )),
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
            StepError::Record(format!(
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
    let bad = |e: String| ("deserialize".to_string(), StepError::Record(e));
    let key = match msg.key.map(std::str::from_utf8) {
        Some(Ok(k)) => Json::String(k.to_string()),
        Some(Err(e)) => return Err(bad(format!("failed to decode key as UTF-8: {e}"))),
        None => {
            return Err(bad(format!(
                "a record of joined stream {:?} without a key: it must be keyed by the join key",
                msg.topic
            )));
        }
    };
    if let Some(k) = msg.key {
        co_partitioned("joined stream", msg, k, partitions).map_err(bad)?;
    }
    let value = decode(msg.value, j.value_format)
        .map_err(|e| bad(format!("failed to decode value: {e}")))?;
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
    let bad = |what: &str, e: String| {
        (
            "deserialize".to_string(),
            StepError::Record(format!("failed to decode repartitioned {what}: {e}")),
        )
    };
    let key = match msg.record_key {
        Some(k) => serde_json::from_slice(k).map_err(|e| bad("key", e.to_string()))?,
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
