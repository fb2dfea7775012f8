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

/// What a write of the current record replaced: the key's entry before it (`None`: the
/// key had no pending write).
type Undo = (StoreName, Vec<u8>, Option<Option<Vec<u8>>>);

/// The writes since the last commit, the current record's included, with what the
/// current record replaced so a failed record can be taken back. A record's writes go
/// straight into the one map: a read looks in one place, and a completed record costs
/// nothing to keep (it used to be staged in a map of its own and moved over, about a
/// twentieth of a windowed aggregate's CPU).
#[derive(Debug, Default)]
pub struct Overlay {
    /// The last write per key since the last commit; `None` is a delete.
    dirty: Writes,
    /// The current record's writes, oldest first, with what each replaced.
    undo: Vec<Undo>,
    /// Records whose writes are in `dirty` since the last commit.
    records: u64,
}

impl Overlay {
    pub fn put(&mut self, store: &StoreName, key: &[u8], value: Vec<u8>) {
        self.write(store, key, Some(value));
    }

    pub fn delete(&mut self, store: &StoreName, key: &[u8]) {
        self.write(store, key, None);
    }

    fn write(&mut self, store: &StoreName, key: &[u8], value: Option<Vec<u8>>) {
        let writes = match self.dirty.get_mut(store) {
            Some(w) => w,
            None => self.dirty.entry(store.clone()).or_default(),
        };
        let before = writes.insert(key.to_vec(), value);
        self.undo.push((store.clone(), key.to_vec(), before));
    }

    /// The current record sees its own writes first, then earlier records' writes.
    pub fn get(&self, store: &StoreName, key: &[u8]) -> Lookup<'_> {
        match self.dirty.get(store).and_then(|m| m.get(key)) {
            Some(Some(v)) => Lookup::Value(v),
            Some(None) => Lookup::Deleted,
            None => Lookup::Miss,
        }
    }

    /// Pending writes (values and deletes) with keys in `from..to`, current record last.
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
        if let Some(m) = self.dirty.get(store) {
            let bounds: (Bound<&[u8]>, Bound<&[u8]>) = (Bound::Included(from), Bound::Excluded(to));
            for (k, v) in m.range::<[u8], _>(bounds) {
                out.insert(k.clone(), v.clone());
            }
        }
        out
    }

    /// Every step succeeded: the record's writes join the next commit.
    pub fn commit_record(&mut self) {
        self.undo.clear();
        self.records += 1;
    }

    /// A step failed: the record leaves no trace in state. Its writes are taken back
    /// newest first, so a key it wrote twice gets what it had before the record.
    pub fn abort_record(&mut self) {
        while let Some((store, key, before)) = self.undo.pop() {
            let Some(writes) = self.dirty.get_mut(&store) else {
                continue;
            };
            match before {
                Some(v) => {
                    writes.insert(key, v);
                }
                None => {
                    writes.remove(&key);
                }
            }
        }
    }

    /// The record being processed has written something.
    pub fn has_scope(&self) -> bool {
        !self.undo.is_empty()
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

    #[test]
    fn a_failed_record_gives_back_what_earlier_records_wrote_to_the_same_keys() {
        let mut o = Overlay::default();
        o.put(&store("agg"), b"u1", b"1".to_vec());
        o.delete(&store("agg"), b"u2");
        o.commit_record();
        // The failing record overwrites both keys, one of them twice, and adds a third.
        o.put(&store("agg"), b"u1", b"2".to_vec());
        o.put(&store("agg"), b"u1", b"3".to_vec());
        o.put(&store("agg"), b"u2", b"9".to_vec());
        o.put(&store("other"), b"u3", b"5".to_vec());
        assert_eq!(o.get(&store("agg"), b"u1"), Lookup::Value(b"3"));
        o.abort_record();
        assert!(!o.has_scope());
        assert_eq!(o.get(&store("agg"), b"u1"), Lookup::Value(b"1"));
        assert_eq!(o.get(&store("agg"), b"u2"), Lookup::Deleted);
        assert_eq!(o.get(&store("other"), b"u3"), Lookup::Miss);
        assert_eq!(
            o.range(&store("agg"), b"a", b"z").len(),
            2,
            "the range sees the earlier record's writes only"
        );
        assert_eq!(o.pending_records(), 1);
        assert_eq!(o.drain().len(), 2);
    }
}
