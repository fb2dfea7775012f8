//! The unit of work's in-memory overlay over a task's stores.
//!
//! A record's state writes are staged here, never written to RocksDB directly: they
//! become part of the task's dirty set only if every step for that record succeeded
//! (`commit_record`), and vanish otherwise (`abort_record`). This is what makes the
//! "dedupe mark kept although a later step failed" failure of seed 000 impossible. At a
//! commit the dirty set is drained, last value per key, into the changelog and one
//! RocksDB WriteBatch. This module owns that bookkeeping; it performs no I/O.

use std::collections::BTreeMap;
use std::ops::Bound;

use oxbow_crds::StoreName;

/// A key in one store.
pub type StoreKey = (StoreName, Vec<u8>);

/// A key's last write since the last commit; `None` is a delete.
pub type Write = (StoreKey, Option<Vec<u8>>);

/// What a read found in the overlay: a pending value, a pending delete, or nothing
/// (the caller then reads the committed store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<'a> {
    Value(&'a [u8]),
    Deleted,
    Miss,
}

/// Pending writes by store, then key: a read borrows the key it is given (no copy of
/// the key or the store name per read, which every record does at least once).
type Writes = BTreeMap<StoreName, BTreeMap<Vec<u8>, Option<Vec<u8>>>>;

#[derive(Debug, Default)]
pub struct Overlay {
    /// Writes of records that completed since the last commit; `None` is a delete.
    dirty: Writes,
    /// Writes of the record being processed.
    scope: Writes,
    /// Records whose writes are in `dirty` since the last commit.
    records: u64,
}

fn store_mut<'a>(
    w: &'a mut Writes,
    store: &StoreName,
) -> &'a mut BTreeMap<Vec<u8>, Option<Vec<u8>>> {
    if !w.contains_key(store) {
        w.insert(store.clone(), BTreeMap::new());
    }
    w.get_mut(store).expect("inserted above")
}

impl Overlay {
    pub fn put(&mut self, store: &StoreName, key: &[u8], value: Vec<u8>) {
        store_mut(&mut self.scope, store).insert(key.to_vec(), Some(value));
    }

    pub fn delete(&mut self, store: &StoreName, key: &[u8]) {
        store_mut(&mut self.scope, store).insert(key.to_vec(), None);
    }

    /// The current record sees its own writes first, then earlier records' writes.
    pub fn get(&self, store: &StoreName, key: &[u8]) -> Lookup<'_> {
        let hit = self
            .scope
            .get(store)
            .and_then(|m| m.get(key))
            .or_else(|| self.dirty.get(store).and_then(|m| m.get(key)));
        match hit {
            Some(Some(v)) => Lookup::Value(v),
            Some(None) => Lookup::Deleted,
            None => Lookup::Miss,
        }
    }

    /// The pending writes of `store` with keys in `[from, to)`: the current record's
    /// over earlier records'. `None` is a delete.
    pub fn range(
        &self,
        store: &StoreName,
        from: &[u8],
        to: &[u8],
    ) -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        let mut out = BTreeMap::new();
        if from >= to {
            return out;
        }
        for map in [&self.dirty, &self.scope] {
            let Some(m) = map.get(store) else { continue };
            let bounds: (Bound<&[u8]>, Bound<&[u8]>) = (Bound::Included(from), Bound::Excluded(to));
            for (k, v) in m.range::<[u8], _>(bounds) {
                out.insert(k.clone(), v.clone());
            }
        }
        out
    }

    /// Every step succeeded: the record's writes join the next commit.
    pub fn commit_record(&mut self) {
        for (store, writes) in std::mem::take(&mut self.scope) {
            match self.dirty.get_mut(&store) {
                Some(m) => m.extend(writes),
                None => {
                    self.dirty.insert(store, writes);
                }
            }
        }
        self.records += 1;
    }

    /// A step failed: the record leaves no trace in state.
    pub fn abort_record(&mut self) {
        self.scope.clear();
    }

    /// The record being processed has written something.
    pub fn has_scope(&self) -> bool {
        self.scope.values().any(|m| !m.is_empty())
    }

    pub fn pending_records(&self) -> u64 {
        self.records
    }

    pub fn dirty_keys(&self) -> usize {
        self.dirty.values().map(BTreeMap::len).sum()
    }

    /// The last value (or delete) of every key written since the last commit, in key
    /// order, for the changelog and the WriteBatch. The overlay is empty afterwards.
    pub fn drain(&mut self) -> Vec<Write> {
        debug_assert!(!self.has_scope(), "drain inside a record's unit of work");
        self.records = 0;
        let mut out = Vec::with_capacity(self.dirty_keys());
        for (store, writes) in std::mem::take(&mut self.dirty) {
            out.extend(writes.into_iter().map(|(k, v)| ((store.clone(), k), v)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(s: &str) -> StoreName {
        StoreName(s.into())
    }

    #[test]
    fn a_record_that_fails_after_dedupe_leaves_no_mark() {
        let mut o = Overlay::default();
        // Step 1 (dedupe) marks the id; step 2 fails.
        o.put(&store("seen"), b"tx-1", b"1".to_vec());
        assert_eq!(
            o.get(&store("seen"), b"tx-1"),
            Lookup::Value(b"1"),
            "the record sees its own mark"
        );
        o.abort_record();
        assert_eq!(
            o.get(&store("seen"), b"tx-1"),
            Lookup::Miss,
            "the retry is not taken for a duplicate"
        );
        assert!(o.drain().is_empty(), "nothing reaches the changelog");
    }

    #[test]
    fn completed_records_are_drained_with_the_last_value_per_key() {
        let mut o = Overlay::default();
        o.put(&store("agg"), b"u1", b"1".to_vec());
        o.commit_record();
        o.put(&store("agg"), b"u1", b"2".to_vec());
        o.put(&store("agg"), b"u2", b"7".to_vec());
        o.commit_record();
        o.delete(&store("agg"), b"u2");
        o.commit_record();
        assert_eq!(o.pending_records(), 3);
        let drained = o.drain();
        assert_eq!(
            drained,
            vec![
                ((store("agg"), b"u1".to_vec()), Some(b"2".to_vec())),
                ((store("agg"), b"u2".to_vec()), None)
            ]
        );
        assert_eq!(o.pending_records(), 0);
        assert_eq!(o.get(&store("agg"), b"u1"), Lookup::Miss);
    }

    #[test]
    fn a_pending_delete_hides_the_committed_value() {
        let mut o = Overlay::default();
        o.delete(&store("s"), b"k");
        assert_eq!(o.get(&store("s"), b"k"), Lookup::Deleted);
    }
}
