//! What goes over HTTP: the [`Answer`] every endpoint returns, and the serde types of
//! the bodies one pod builds and another reads (a forwarded range, an error).
//!
//! Owns: the shapes of those bodies. The pod that answers serializes these types and the
//! pod that asks deserializes the same ones, so the two sides cannot disagree. The JSON
//! is public (clients and `docs/queries.md` read it too): change it only compatibly.
//! Must not touch: routing, stores or I/O.

use oxbow_crds::TaskId;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json, json};

use super::params::BadRequest;

/// An HTTP answer: status, JSON body, and `Retry-After` for a restoring owner.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Json,
    pub retry_after: Option<u64>,
}

impl Answer {
    pub(crate) fn ok(body: Json) -> Self {
        Self {
            status: 200,
            body,
            retry_after: None,
        }
    }

    /// An error answer: `extra`'s fields (when it is an object) and `error`.
    pub(crate) fn error(status: u16, message: impl Into<String>, extra: Json) -> Self {
        let context = match extra {
            Json::Object(o) => o,
            _ => Map::new(),
        };
        let body = ErrorBody {
            context,
            error: message.into(),
        };
        Self {
            status,
            body: body.into_json(),
            retry_after: None,
        }
    }

    pub(crate) fn bad(e: BadRequest) -> Self {
        Self::error(400, e.0, json!({}))
    }
}

/// The 503 of a pod that cannot tell yet which task holds a key.
pub(crate) fn unknown_task_count() -> Answer {
    Answer::error(
        503,
        "the source partition count is not known yet (the worker is starting); retry",
        json!({}),
    )
}

/// The body of every error answer: what was asked (store, key, task, servedBy, ...) and
/// the `error` message. A pod merging a range reads the message of an owner's error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Serialized first: an `error` in it is overwritten by the message.
    #[serde(flatten)]
    pub context: Map<String, Json>,
    pub error: String,
}

impl ErrorBody {
    fn into_json(self) -> Json {
        // A map of JSON values and a string always serialize; the fallback keeps the
        // message if that ever changed.
        serde_json::to_value(&self).unwrap_or_else(|_| json!({ "error": self.error }))
    }

    /// The message of an error body; `None` when `body` is not one.
    pub fn message(body: &Json) -> Option<String> {
        Self::deserialize(body).ok().map(|b| b.error)
    }
}

/// A pod's answer to `range?local=true`: the tasks of the store's stage it read and
/// their first entries. The pod that asked merges these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalRange {
    pub store: String,
    pub served_by: String,
    /// The partitions (of the store's stage) read.
    pub tasks: Vec<u32>,
    /// Sorted by (key, partition).
    pub entries: Vec<RangeEntry>,
}

impl LocalRange {
    pub(crate) fn into_json(self) -> Json {
        to_json(&self)
    }
}

/// One entry of a range answer: what the merging pod reads of it typed, the rest as is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RangeEntry {
    /// The user key (lossy UTF-8 when it is not UTF-8; `keyBase64` then has the bytes).
    pub key: String,
    /// The partition (of the store's stage) that holds it: merged pages order entries
    /// by key, then partition.
    pub partition: u32,
    /// The task that holds it (`task`, `stage_partition`), the decoded entry (see
    /// `decode_entry`), and `streamTime`, `sourceTopic` and `keyBase64` where they apply.
    /// Kept untyped so that the merging pod passes on whatever the owner sent.
    #[serde(flatten)]
    pub fields: Map<String, Json>,
}

impl RangeEntry {
    /// An entry of `read_range` (an object holding its `key`) as read from `task`.
    pub fn at_task(entry: Json, task: TaskId) -> Self {
        let mut fields = match entry {
            Json::Object(o) => o,
            _ => Map::new(),
        };
        let key = match fields.remove("key") {
            Some(Json::String(k)) => k,
            _ => String::new(),
        };
        // The task's own fields win over any of the entry's, as they always have.
        fields.insert("task".into(), json!(task.to_string()));
        fields.remove("partition");
        Self {
            key,
            partition: task.partition,
            fields,
        }
    }
}

/// Plain data as JSON. Serializing maps, strings and numbers into a `Value` cannot fail.
pub(crate) fn to_json<T: Serialize>(v: &T) -> Json {
    serde_json::to_value(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_keeps_the_context_and_reads_back_its_message() {
        let a = Answer::error(503, "down", json!({"store": "s", "error": "old"}));
        assert_eq!(a.body, json!({"store": "s", "error": "down"}));
        assert_eq!(ErrorBody::message(&a.body).as_deref(), Some("down"));
        let a = Answer::error(400, "bad", json!("not an object"));
        assert_eq!(a.body, json!({"error": "bad"}));
        assert_eq!(ErrorBody::message(&json!({"status": 1})), None);
    }

    #[test]
    fn a_range_entry_is_the_decoded_entry_with_its_task() {
        let e = RangeEntry::at_task(
            json!({"key": "k1", "value": {"n": 1}, "streamTime": 5}),
            TaskId::new(1, 3),
        );
        let page = LocalRange {
            store: "s".into(),
            served_by: "a".into(),
            tasks: vec![3],
            entries: vec![e.clone()],
        }
        .into_json();
        assert_eq!(
            page,
            json!({"store": "s", "servedBy": "a", "tasks": [3], "entries": [
                {"key": "k1", "task": TaskId::new(1, 3).to_string(), "partition": 3,
                 "value": {"n": 1}, "streamTime": 5},
            ]})
        );
        assert_eq!(
            LocalRange::deserialize(&page).ok().map(|r| r.entries),
            Some(vec![e])
        );
    }
}
