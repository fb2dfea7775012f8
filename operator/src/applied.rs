//! What the operator last applied to each child, so a reconcile that would apply the
//! same object again over an unchanged child sends nothing (a steady app costs the API
//! server no writes; see `make bench-reports`).
//!
//! A child counts as unchanged only while the controller's watch still shows the
//! resourceVersion our own apply returned: anyone else's edit, or a deletion, makes the
//! next reconcile apply it again, as server-side apply would have anyway.
//!
//! Owns only this bookkeeping; it performs no I/O.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// A child: kind, namespace, name.
pub type Key = (&'static str, String, String);

#[derive(Default)]
pub struct Applied {
    /// Per child: the digest of what we applied, and the resourceVersion it got.
    ours: Mutex<HashMap<Key, (u64, String)>>,
    /// Per child: the newest resourceVersion the watch delivered.
    seen: Mutex<HashMap<Key, String>>,
}

/// A digest of the object to apply.
pub fn digest(v: &serde_json::Value) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

impl Applied {
    /// Whether applying an object with `digest` to `key` would change nothing.
    pub fn unchanged(&self, key: &Key, digest: u64) -> bool {
        let ours = self.ours.lock().unwrap_or_else(|e| e.into_inner());
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match (ours.get(key), seen.get(key)) {
            (Some((d, ours_rv)), Some(seen_rv)) => *d == digest && ours_rv == seen_rv,
            _ => false,
        }
    }

    /// Our apply of `digest` to `key` was accepted as `resource_version`.
    pub fn applied(&self, key: Key, digest: u64, resource_version: Option<String>) {
        let mut ours = self.ours.lock().unwrap_or_else(|e| e.into_inner());
        match resource_version {
            Some(rv) => ours.insert(key, (digest, rv)),
            None => ours.remove(&key),
        };
    }

    /// The watch delivered `key` at `resource_version` (`None`: it was deleted; then
    /// our record of it goes too, so a deleted app leaves nothing behind).
    /// Whether the watch has shown an object of `kind` in `ns` that it has not seen
    /// deleted since. No means there is nothing of that kind to prune there: one that
    /// the watch has not delivered yet triggers a reconcile of its owner when it is.
    pub fn any_seen(&self, kind: &str, ns: &str) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.keys().any(|(k, n, _)| *k == kind && n == ns)
    }

    pub fn seen(&self, key: Key, resource_version: Option<String>) {
        match resource_version {
            Some(rv) => {
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                seen.insert(key, rv);
            }
            None => {
                let mut ours = self.ours.lock().unwrap_or_else(|e| e.into_inner());
                ours.remove(&key);
                drop(ours);
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                seen.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> Key {
        ("ConfigMap", "ns".into(), "orders".into())
    }

    #[test]
    fn the_same_object_over_an_untouched_child_is_not_applied_again() {
        let a = Applied::default();
        let d = digest(&json!({"data": {"a": "1"}}));
        assert!(!a.unchanged(&key(), d), "never applied");
        a.applied(key(), d, Some("7".into()));
        assert!(
            !a.unchanged(&key(), d),
            "the watch has not shown our version yet"
        );
        a.seen(key(), Some("7".into()));
        assert!(a.unchanged(&key(), d));
        assert!(
            !a.unchanged(&key(), digest(&json!({"data": {"a": "2"}}))),
            "a new spec"
        );
    }

    #[test]
    fn a_kind_counts_as_present_in_a_namespace_until_its_last_object_is_deleted() {
        let a = Applied::default();
        assert!(!a.any_seen("ConfigMap", "ns"));
        a.seen(key(), Some("1".into()));
        a.seen(("ConfigMap", "ns".into(), "other".into()), Some("2".into()));
        assert!(a.any_seen("ConfigMap", "ns"));
        assert!(!a.any_seen("ConfigMap", "elsewhere"));
        assert!(!a.any_seen("Service", "ns"));
        a.seen(key(), None);
        assert!(a.any_seen("ConfigMap", "ns"), "one is left");
        a.seen(("ConfigMap", "ns".into(), "other".into()), None);
        assert!(!a.any_seen("ConfigMap", "ns"));
    }

    #[test]
    fn an_edit_or_a_deletion_by_someone_else_is_applied_over() {
        let a = Applied::default();
        let d = digest(&json!({"data": {"a": "1"}}));
        a.applied(key(), d, Some("7".into()));
        a.seen(key(), Some("8".into()));
        assert!(!a.unchanged(&key(), d), "edited after our apply");
        a.seen(key(), Some("7".into()));
        a.seen(key(), None);
        assert!(!a.unchanged(&key(), d), "deleted");
    }
}
