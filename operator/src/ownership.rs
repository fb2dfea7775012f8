//! Who owns an application id, and which topics were created for it, on one Kafka
//! cluster (pure). The records live in a compacted claims topic in Kafka itself, so every
//! operator that shares the cluster sees them, whatever namespaces or Kubernetes
//! clusters it watches; [`crate::claims`] reads and writes them.
//!
//! This module owns the record keys and values and the decisions made from them. It does
//! no I/O and must not know how the records travel.
//!
//! - `app/<applicationId>/<namespace>/<name>`: a StreamApp claims the id. Written once, so
//!   its offset never moves: of the live claims of one id, the first in the log owns it.
//!   A claim that loses takes itself back (a tombstone), and deletion releases the owner's.
//! - `topic/<topic>`: the operator created (or, on request, adopted) this topic for the
//!   named app. Written before the topic is created, removed after it is deleted. Only
//!   topics recorded for an app are ever altered or deleted for it.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The claims topic's default name (operator flag `--claims-topic`).
pub const DEFAULT_CLAIMS_TOPIC: &str = "oxbow-claims";

/// A StreamApp, as the claims name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Owner {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The value of an `app/…` record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppClaim {
    pub application_id: String,
    pub namespace: String,
    pub name: String,
    /// RFC 3339, for humans reading the topic.
    pub claimed_at: String,
}

/// The value of a `topic/…` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicRecord {
    pub application_id: String,
    pub namespace: String,
    pub name: String,
    /// It existed before and the app said `adoptExistingTopics: true`.
    #[serde(default)]
    pub adopted: bool,
}

impl TopicRecord {
    pub fn owner(&self) -> Owner {
        Owner {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

pub fn app_key(application_id: &str, owner: &Owner) -> String {
    format!("app/{application_id}/{}/{}", owner.namespace, owner.name)
}

pub fn topic_key(topic: &str) -> String {
    format!("topic/{topic}")
}

/// Everything the claims topic says, as of the offset it was read to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimsView {
    /// Live claims of each application id with the offset they were written at.
    apps: BTreeMap<String, BTreeMap<Owner, i64>>,
    topics: BTreeMap<String, TopicRecord>,
}

impl ClaimsView {
    /// Folds one record in. Records this version does not understand are skipped, so a
    /// newer operator's additions never break an older one.
    pub fn apply(&mut self, offset: i64, key: &str, value: Option<&[u8]>) {
        if let Some(topic) = key.strip_prefix("topic/") {
            match value.and_then(|v| serde_json::from_slice::<TopicRecord>(v).ok()) {
                Some(r) => {
                    self.topics.insert(topic.to_string(), r);
                }
                None => {
                    self.topics.remove(topic);
                }
            }
            return;
        }
        let Some(rest) = key.strip_prefix("app/") else {
            return;
        };
        // The id may not contain '/', namespaces and names neither: split from the right.
        let mut parts = rest.rsplitn(3, '/');
        let (Some(name), Some(namespace), Some(id)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let owner = Owner {
            namespace: namespace.into(),
            name: name.into(),
        };
        let claims = self.apps.entry(id.to_string()).or_default();
        if value.is_some() {
            // A rewrite keeps the first offset: ownership never moves to a later writer.
            claims.entry(owner).or_insert(offset);
        } else {
            claims.remove(&owner);
            if claims.is_empty() {
                self.apps.remove(id);
            }
        }
    }

    /// The owner of an application id: its earliest live claim.
    pub fn owner_of(&self, application_id: &str) -> Option<&Owner> {
        self.apps
            .get(application_id)?
            .iter()
            .min_by_key(|(_, offset)| **offset)
            .map(|(o, _)| o)
    }

    /// Whether `owner` has a live claim on the id (owning it or not).
    pub fn has_claim(&self, application_id: &str, owner: &Owner) -> bool {
        self.apps
            .get(application_id)
            .is_some_and(|c| c.contains_key(owner))
    }

    /// Apps other than `owner` that claim the id.
    pub fn other_claimants(&self, application_id: &str, owner: &Owner) -> Vec<Owner> {
        self.apps
            .get(application_id)
            .map(|c| c.keys().filter(|o| *o != owner).cloned().collect())
            .unwrap_or_default()
    }

    pub fn topic(&self, topic: &str) -> Option<&TopicRecord> {
        self.topics.get(topic)
    }

    /// The topics recorded for this app under this id: what deletion may remove.
    pub fn topics_of(&self, application_id: &str, owner: &Owner) -> Vec<String> {
        self.topics
            .iter()
            .filter(|(_, r)| r.application_id == application_id && r.owner() == *owner)
            .map(|(t, _)| t.clone())
            .collect()
    }
}

/// What to do about an application id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimDecision {
    /// This app owns it.
    Owned,
    /// Nobody claims it: write this app's claim, then read again.
    Claim,
    /// Another app owns it. `withdraw`: this app's own claim is in the log too (it lost a
    /// race) and must be taken back.
    Conflict { owner: Owner, withdraw: bool },
}

pub fn decide_claim(view: &ClaimsView, application_id: &str, me: &Owner) -> ClaimDecision {
    match view.owner_of(application_id) {
        None => ClaimDecision::Claim,
        Some(o) if o == me => ClaimDecision::Owned,
        Some(o) => ClaimDecision::Conflict {
            owner: o.clone(),
            withdraw: view.has_claim(application_id, me),
        },
    }
}

/// Facts about one topic the app wants, besides the claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicFacts {
    pub exists: bool,
    /// A dead-letter topic the user named (`errors.topic`): the user's, like a sink.
    pub user_named: bool,
    /// `spec.adoptExistingTopics`.
    pub adopt: bool,
    /// The app was last reconciled by an operator that kept no records, and listed this
    /// topic in its status: it created it.
    pub legacy: bool,
}

/// Whose a wanted topic is, and so what the operator may do with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicOwnership {
    /// Recorded for this app: create, grow, correct and delete it as the spec says.
    Ours,
    /// Missing: record it for this app, then create it.
    Create,
    /// Exists unrecorded and the app may take it: record it as adopted, then manage it.
    Adopt,
    /// The user's: create it when missing, never alter or delete it.
    User,
    /// Not this app's: leave it alone and stall. `owner`: the app it is recorded for.
    NotOwned { owner: Option<Owner> },
}

pub fn topic_ownership(
    record: Option<&TopicRecord>,
    application_id: &str,
    me: &Owner,
    facts: TopicFacts,
) -> TopicOwnership {
    if facts.user_named {
        return TopicOwnership::User;
    }
    match record {
        Some(r) if r.application_id == application_id && r.owner() == *me => TopicOwnership::Ours,
        Some(r) => TopicOwnership::NotOwned {
            owner: Some(r.owner()),
        },
        None if !facts.exists => TopicOwnership::Create,
        None if facts.adopt => TopicOwnership::Adopt,
        None if facts.legacy => TopicOwnership::Adopt,
        None => TopicOwnership::NotOwned { owner: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(ns: &str, name: &str) -> Owner {
        Owner {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn claim(view: &mut ClaimsView, offset: i64, id: &str, o: &Owner) {
        let v = serde_json::to_vec(&AppClaim {
            application_id: id.into(),
            namespace: o.namespace.clone(),
            name: o.name.clone(),
            claimed_at: "2026-12-02T00:00:00Z".into(),
        })
        .expect("serializes");
        view.apply(offset, &app_key(id, o), Some(&v));
    }

    #[test]
    fn the_first_claim_in_the_log_owns_an_id_and_a_later_one_is_a_conflict() {
        let (a, b) = (owner("team-a", "orders"), owner("team-b", "orders"));
        let mut view = ClaimsView::default();
        assert_eq!(decide_claim(&view, "orders", &a), ClaimDecision::Claim);
        claim(&mut view, 3, "orders", &a);
        claim(&mut view, 7, "orders", &b);
        assert_eq!(decide_claim(&view, "orders", &a), ClaimDecision::Owned);
        assert_eq!(
            decide_claim(&view, "orders", &b),
            ClaimDecision::Conflict {
                owner: a.clone(),
                withdraw: true
            }
        );
        // A rewrite of the owner's claim later in the log keeps its first offset.
        claim(&mut view, 9, "orders", &a);
        assert_eq!(view.owner_of("orders"), Some(&a));
        // Released: the next claimant owns it.
        view.apply(10, &app_key("orders", &a), None);
        assert_eq!(decide_claim(&view, "orders", &b), ClaimDecision::Owned);
        assert!(view.other_claimants("orders", &b).is_empty());
    }

    #[test]
    fn topic_records_say_which_topics_deletion_may_remove() {
        let (a, b) = (owner("team-a", "orders"), owner("team-b", "orders"));
        let mut view = ClaimsView::default();
        let rec = |o: &Owner| {
            serde_json::to_vec(&TopicRecord {
                application_id: "orders".into(),
                namespace: o.namespace.clone(),
                name: o.name.clone(),
                adopted: false,
            })
            .expect("serializes")
        };
        view.apply(1, &topic_key("orders-seen-changelog"), Some(&rec(&a)));
        view.apply(2, &topic_key("orders-dlq"), Some(&rec(&a)));
        view.apply(3, &topic_key("orders-dlq"), None);
        view.apply(4, "something/else", Some(b"{}"));
        assert_eq!(view.topics_of("orders", &a), vec!["orders-seen-changelog"]);
        assert!(view.topics_of("orders", &b).is_empty());
        assert_eq!(view.topic("orders-dlq"), None);
    }

    #[test]
    fn an_existing_topic_is_taken_only_when_recorded_adopted_or_left_by_an_earlier_operator() {
        let me = owner("team-a", "orders");
        let facts = |exists, adopt, legacy| TopicFacts {
            exists,
            user_named: false,
            adopt,
            legacy,
        };
        let t = |r: Option<&TopicRecord>, f| topic_ownership(r, "orders", &me, f);
        assert_eq!(t(None, facts(false, false, false)), TopicOwnership::Create);
        assert_eq!(
            t(None, facts(true, false, false)),
            TopicOwnership::NotOwned { owner: None }
        );
        assert_eq!(t(None, facts(true, true, false)), TopicOwnership::Adopt);
        assert_eq!(t(None, facts(true, false, true)), TopicOwnership::Adopt);
        let theirs = TopicRecord {
            application_id: "orders".into(),
            namespace: "team-b".into(),
            name: "orders".into(),
            adopted: false,
        };
        assert_eq!(
            t(Some(&theirs), facts(true, true, true)),
            TopicOwnership::NotOwned {
                owner: Some(owner("team-b", "orders"))
            },
            "adoption never takes a topic recorded for another app"
        );
        let ours = TopicRecord {
            namespace: "team-a".into(),
            ..theirs
        };
        assert_eq!(
            t(Some(&ours), facts(true, false, false)),
            TopicOwnership::Ours
        );
        let user = TopicFacts {
            user_named: true,
            ..facts(true, false, false)
        };
        assert_eq!(t(Some(&ours), user), TopicOwnership::User);
    }
}
