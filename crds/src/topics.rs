//! The Kafka topics a StreamApp needs besides its sources: a compacted changelog per
//! store, a repartition topic in front of each stage after the first, and the
//! dead-letter topic. Pure: both the operator (which reconciles them) and
//! a standalone worker (which creates missing ones) derive them from here.

use std::collections::BTreeMap;

use crate::StreamApp;
use crate::duration::parse_duration;
use crate::validate::stores;

/// Default `min.cleanable.dirty.ratio` of changelogs: compact early so restores read
/// little more than one value per key (Kafka's 0.5 lets the log grow to twice that).
pub const DEFAULT_DIRTY_RATIO: &str = "0.1";
/// Default `segment.ms` of changelogs: the active segment is never compacted, so it is
/// rolled hourly instead of weekly.
pub const DEFAULT_SEGMENT_MS: u64 = 3_600_000;
/// `segment.ms` of repartition topics (Kafka Streams' 10 minutes): deleted records free
/// their space only when their whole segment is behind the log start.
pub const REPARTITION_SEGMENT_MS: u64 = 600_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Changelog,
    Repartition,
    DeadLetter,
}

impl Role {
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Changelog => "changelog",
            Role::Repartition => "repartition",
            Role::DeadLetter => "deadLetter",
        }
    }
}

/// A topic as the spec wants it.
#[derive(Debug, Clone, PartialEq)]
pub struct WantedTopic {
    pub name: String,
    pub role: Role,
    pub store: Option<String>,
    pub partitions: i32,
    /// `None`: the broker's default.
    pub replication_factor: Option<i32>,
    pub configs: BTreeMap<String, String>,
}

pub fn wanted_topics(app: &StreamApp, tasks: i32) -> Vec<WantedTopic> {
    let mut out = Vec::new();
    for store in stores(&app.spec) {
        let cfg = app
            .spec
            .stores
            .get(&store.0)
            .map(|s| s.changelog.clone())
            .unwrap_or_default();
        let segment_ms = cfg
            .segment
            .as_deref()
            .and_then(|s| parse_duration(s).ok())
            .map(|d| d.as_millis() as u64)
            .unwrap_or(DEFAULT_SEGMENT_MS);
        let mut configs = BTreeMap::from([
            ("cleanup.policy".to_string(), "compact".to_string()),
            (
                "min.cleanable.dirty.ratio".to_string(),
                cfg.min_cleanable_dirty_ratio
                    .map(|r| r.to_string())
                    .unwrap_or_else(|| DEFAULT_DIRTY_RATIO.into()),
            ),
            ("segment.ms".to_string(), segment_ms.to_string()),
        ]);
        if let Some(isr) = cfg.min_insync_replicas {
            configs.insert("min.insync.replicas".into(), isr.to_string());
        }
        out.push(WantedTopic {
            name: app.changelog_topic(&store),
            role: Role::Changelog,
            store: Some(store.0.clone()),
            partitions: tasks,
            replication_factor: cfg.replication_factor,
            configs,
        });
    }
    // Records wait here only until the next stage has committed past them (it deletes
    // what it consumed), so time and size retention stay off: a stopped app must not
    // lose records it has not processed. Segments roll often so deletions free space.
    let topology = crate::topology::Topology::of(&app.application_id(), &app.spec);
    for (_, topic) in topology.repartition_topics() {
        out.push(WantedTopic {
            name: topic.to_string(),
            role: Role::Repartition,
            store: None,
            partitions: tasks,
            replication_factor: None,
            configs: BTreeMap::from([
                ("cleanup.policy".to_string(), "delete".to_string()),
                ("retention.ms".to_string(), "-1".to_string()),
                ("retention.bytes".to_string(), "-1".to_string()),
                ("segment.ms".to_string(), REPARTITION_SEGMENT_MS.to_string()),
            ]),
        });
    }
    if let Some(dlq) = app.dead_letter_topic() {
        out.push(WantedTopic {
            name: dlq,
            role: Role::DeadLetter,
            store: None,
            partitions: tasks,
            replication_factor: None,
            configs: BTreeMap::from([("cleanup.policy".to_string(), "delete".to_string())]),
        });
    }
    out
}

/// A changelog topic with the default settings (for stores the spec does not list, such
/// as those of custom processors); the caller sets the name.
pub fn changelog_defaults(tasks: i32) -> Option<WantedTopic> {
    Some(WantedTopic {
        name: String::new(),
        role: Role::Changelog,
        store: None,
        partitions: tasks,
        replication_factor: None,
        configs: BTreeMap::from([
            ("cleanup.policy".to_string(), "compact".to_string()),
            (
                "min.cleanable.dirty.ratio".to_string(),
                DEFAULT_DIRTY_RATIO.to_string(),
            ),
            ("segment.ms".to_string(), DEFAULT_SEGMENT_MS.to_string()),
        ]),
    })
}
