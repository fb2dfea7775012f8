//! A bulk load's next sorted file, gathered flat: keys and values packed end to end in
//! one buffer, with a 16-byte index entry per record, sorted once when the file is
//! written. A map of owned keys and values cost two heap blocks, two `Vec` headers and a
//! share of a tree node per record, three times the bytes of a small record, so a file
//! held a third of the records its memory could (docs/benchmarks.md, "Where the memory
//! goes").
//!
//! Owns only the buffer and its order: the last record of a key wins, a deletion is
//! kept as one. It must not write to RocksDB (that is [`crate::store::TaskDb`]).

/// The value length that marks a deletion (Kafka records are far below 4 GiB).
const TOMBSTONE: u32 = u32::MAX;

/// Where one record's key and value are in the buffer.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The key's offset; the value follows it.
    at: usize,
    key_len: u32,
    value_len: u32,
}

/// The records of the next sorted file, in arrival order until [`SortBuffer::sorted`].
#[derive(Debug, Default)]
pub(super) struct SortBuffer {
    bytes: Vec<u8>,
    entries: Vec<Entry>,
}

impl SortBuffer {
    /// Adds a record; a later record of the same key replaces it.
    pub(super) fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(key);
        let value_len = match value {
            Some(v) => {
                self.bytes.extend_from_slice(v);
                v.len() as u32
            }
            None => TOMBSTONE,
        };
        self.entries.push(Entry {
            at,
            key_len: key.len() as u32,
            value_len,
        });
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The bytes the records take: what a file's budget is counted in.
    pub(super) fn size(&self) -> usize {
        self.bytes.len() + self.entries.len() * std::mem::size_of::<Entry>()
    }

    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.entries.clear();
    }

    fn key(&self, e: &Entry) -> &[u8] {
        key_in(&self.bytes, e)
    }

    fn value(&self, e: &Entry) -> Option<&[u8]> {
        let from = e.at + e.key_len as usize;
        (e.value_len != TOMBSTONE).then(|| &self.bytes[from..from + e.value_len as usize])
    }

    /// Sorts the records by key and returns each key once, with its last value (`None`:
    /// deleted), in key order, as a sorted file must have them.
    pub(super) fn sorted(&mut self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> + '_ {
        let bytes = &self.bytes;
        // Ties by arrival (the offset in the buffer grows with it): the last is the newest.
        self.entries
            .sort_unstable_by(|a, b| key_in(bytes, a).cmp(key_in(bytes, b)).then(a.at.cmp(&b.at)));
        let this: &Self = self;
        this.entries.iter().enumerate().filter_map(move |(i, e)| {
            let newest = this
                .entries
                .get(i + 1)
                .is_none_or(|next| this.key(next) != this.key(e));
            newest.then(|| (this.key(e), this.value(e)))
        })
    }
}

/// `e`'s key in `bytes` (a free function, so the sort can borrow the buffer while it
/// reorders the index).
fn key_in<'a>(bytes: &'a [u8], e: &Entry) -> &'a [u8] {
    &bytes[e.at..e.at + e.key_len as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(buf: &mut SortBuffer) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        buf.sorted()
            .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
            .collect()
    }

    #[test]
    fn records_come_out_in_key_order_with_the_last_value_of_each_key() {
        let mut buf = SortBuffer::default();
        buf.push(b"b", Some(b"1"));
        buf.push(b"a", Some(b"2"));
        buf.push(b"b", Some(b"3"));
        buf.push(b"c", Some(b""));
        buf.push(b"b", Some(b"4"));
        assert_eq!(
            all(&mut buf),
            vec![
                (b"a".to_vec(), Some(b"2".to_vec())),
                (b"b".to_vec(), Some(b"4".to_vec())),
                (b"c".to_vec(), Some(Vec::new())),
            ]
        );
    }

    #[test]
    fn a_deletion_after_a_value_stays_a_deletion_and_a_value_after_it_wins() {
        let mut buf = SortBuffer::default();
        buf.push(b"k", Some(b"v"));
        buf.push(b"k", None);
        buf.push(b"j", None);
        buf.push(b"j", Some(b"back"));
        assert_eq!(
            all(&mut buf),
            vec![
                (b"j".to_vec(), Some(b"back".to_vec())),
                (b"k".to_vec(), None),
            ]
        );
    }

    #[test]
    fn a_key_that_is_a_prefix_of_another_sorts_first() {
        let mut buf = SortBuffer::default();
        buf.push(b"ab", Some(b"2"));
        buf.push(b"a", Some(b"1"));
        buf.push(b"", Some(b"0"));
        let keys: Vec<Vec<u8>> = all(&mut buf).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec![b"".to_vec(), b"a".to_vec(), b"ab".to_vec()]);
    }

    #[test]
    fn the_size_counts_the_bytes_and_the_index_and_clearing_empties_it() {
        let mut buf = SortBuffer::default();
        assert!(buf.is_empty());
        buf.push(b"key", Some(b"value"));
        buf.push(b"gone", None);
        assert_eq!(buf.size(), 3 + 5 + 4 + 2 * 16);
        buf.clear();
        assert!(buf.is_empty());
        assert_eq!(buf.size(), 0);
        assert!(all(&mut buf).is_empty());
    }
}
