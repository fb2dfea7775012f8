//! A task's RocksDB instance: one column family per store plus `oxbow.meta`, which holds
//! the changelog checkpoints and source offsets written in the same WriteBatch as the
//! state they describe. This module owns RocksDB; it knows nothing of Kafka.
//!
//! Contract: [`TaskDb::commit`] is the only way state and checkpoints change after
//! restore, and it is atomic (one WriteBatch), so the directory always holds a state
//! and the changelog offset it corresponds to: a committed prefix of the changelog.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use oxbow_crds::{StoreName, TaskId};
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, IngestExternalFileOptions, Options,
    SstFileWriter, WriteBatch, WriteBufferManager, WriteOptions,
};

const META: &str = "oxbow.meta";
/// A file in a task directory saying RocksDB found it corrupted after it opened (a
/// failed block checksum on a read or a compaction): the next open moves the directory
/// aside (`engine::quarantine`) instead of failing on the same block again.
pub const CORRUPTION_MARK: &str = "OXBOW-CORRUPTED";
/// The key in `oxbow.meta` of the directory's [`Identity`].
const IDENTITY: &str = "identity";

/// Whose state a task directory holds: written when the directory is first opened, and
/// checked at every open, so a directory of another app, task or partitioning (a
/// volume reused, a directory copied or swapped by hand) is never taken for this
/// task's state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    pub application_id: String,
    pub task: String,
    /// Tasks per stage (the source partition count) when the state was written: keys
    /// are spread over tasks by it.
    pub partitions: u32,
    /// What each store's data means (`oxbow_crds::layouts`) as written. A store whose
    /// layout changed was reset (`oxbow.dev/reset`): its local copy is not this one.
    /// Empty in directories written before layouts were recorded.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub layouts: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("failed to open the state of task {task} at {path}: {source}")]
    Open {
        task: TaskId,
        path: PathBuf,
        source: rocksdb::Error,
    },
    #[error("failed to read store {store} of task {task}: {source}")]
    Read {
        task: TaskId,
        store: String,
        source: rocksdb::Error,
    },
    #[error("failed to write the state of task {task}: {source}")]
    Write {
        task: TaskId,
        source: rocksdb::Error,
    },
    #[error("failed to bulk-load store {store} of task {task}: {source}")]
    Ingest {
        task: TaskId,
        store: String,
        source: rocksdb::Error,
    },
    #[error("store {store} is not declared by any step")]
    UnknownStore { store: String },
    #[error("failed to prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A stored value the step cannot read: the task stops rather than skip records
    /// on state it does not understand.
    #[error("failed to decode {what} in store {store}: {source}")]
    Decode {
        store: String,
        what: String,
        source: crate::steps::encoding::DecodeError,
    },
}

/// Memory shared by every task of the process: one block cache and one write-buffer
/// manager charged to it, so the budget holds however many tasks the pod runs.
#[derive(Clone)]
pub struct SharedMemory {
    cache: Cache,
    write_buffers: WriteBufferManager,
}

impl SharedMemory {
    /// `budget_bytes` covers block cache and memtables together.
    pub fn new(budget_bytes: usize) -> Self {
        let cache = Cache::new_lru_cache(budget_bytes);
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            budget_bytes / 2,
            false,
            cache.clone(),
        );
        Self {
            cache,
            write_buffers,
        }
    }

    fn options(&self) -> Options {
        let mut o = Options::default();
        o.create_if_missing(true);
        o.create_missing_column_families(true);
        o.set_write_buffer_manager(&self.write_buffers);
        // RocksDB's 64 MiB memtable per column family let every task's memtable grow
        // towards the whole manager's share before a flush, so the worker's memory rose
        // with the input until the budget was reached. 16 MiB (Kafka Streams' size too)
        // flushes sooner; the budget still caps the total.
        o.set_write_buffer_size(16 << 20);
        o.set_compression_type(rocksdb::DBCompressionType::Lz4);
        o.set_max_background_jobs(2);
        let mut t = BlockBasedOptions::default();
        t.set_block_cache(&self.cache);
        t.set_bloom_filter(10.0, false);
        // Most reads of a windowed aggregate are of a window not written yet: a bloom
        // filter over the memtable answers those without a skiplist search.
        o.set_memtable_prefix_bloom_ratio(0.05);
        o.set_memtable_whole_key_filtering(true);
        t.set_cache_index_and_filter_blocks(true);
        o.set_block_based_table_factory(&t);
        o
    }
}

/// Checkpoints kept with the state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// Per store: the next changelog offset not reflected in the local state.
    pub changelog: BTreeMap<StoreName, i64>,
    /// Per source topic: the next offset to process (informational; Kafka's committed
    /// offsets are the truth).
    pub source: BTreeMap<String, i64>,
}

pub struct TaskDb {
    task: TaskId,
    path: PathBuf,
    db: DB,
    stores: Vec<StoreName>,
    memory: SharedMemory,
}

impl TaskDb {
    pub fn open(
        dir: &Path,
        task: TaskId,
        stores: &[StoreName],
        memory: &SharedMemory,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let opts = memory.options();
        let mut cfs = vec![ColumnFamilyDescriptor::new(META, memory.options())];
        cfs.extend(
            stores
                .iter()
                .map(|s| ColumnFamilyDescriptor::new(cf_name(s), memory.options())),
        );
        // Column families of stores no longer in the topology are kept, not dropped:
        // a rollback of the spec finds its state again.
        if let Ok(existing) = DB::list_cf(&opts, dir) {
            for name in existing {
                if name != "default" && name != META && !stores.iter().any(|s| cf_name(s) == name) {
                    cfs.push(ColumnFamilyDescriptor::new(name, memory.options()));
                }
            }
        }
        let db = DB::open_cf_descriptors(&opts, dir, cfs).map_err(|source| StoreError::Open {
            task,
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Self {
            task,
            path: dir.to_path_buf(),
            db,
            stores: stores.to_vec(),
            memory: memory.clone(),
        })
    }

    fn read_error(&self, store: &StoreName, source: rocksdb::Error) -> StoreError {
        StoreError::Read {
            task: self.task,
            store: store.0.clone(),
            source: self.noted(source),
        }
    }

    fn write_error(&self, source: rocksdb::Error) -> StoreError {
        StoreError::Write {
            task: self.task,
            source: self.noted(source),
        }
    }

    /// Marks the directory ([`CORRUPTION_MARK`]) when `source` reports corruption.
    fn noted(&self, source: rocksdb::Error) -> rocksdb::Error {
        if source.kind() == rocksdb::ErrorKind::Corruption {
            let marked = std::fs::write(self.path.join(CORRUPTION_MARK), source.to_string());
            tracing::error!(task = %self.task, error = %source, marked = marked.is_ok(), "RocksDB found this task's state corrupted: the directory is moved aside and rebuilt from the changelog when the task next opens");
        }
        source
    }

    /// Whether RocksDB found the directory at `dir` corrupted after it last opened, and
    /// what it said.
    pub fn corruption_noted(dir: &Path) -> Option<String> {
        std::fs::read_to_string(dir.join(CORRUPTION_MARK)).ok()
    }

    pub fn stores(&self) -> &[StoreName] {
        &self.stores
    }

    fn cf(&self, store: &StoreName) -> Result<&rocksdb::ColumnFamily, StoreError> {
        self.db
            .cf_handle(&cf_name(store))
            .ok_or_else(|| StoreError::UnknownStore {
                store: store.0.clone(),
            })
    }

    fn meta(&self) -> Result<&rocksdb::ColumnFamily, StoreError> {
        self.db
            .cf_handle(META)
            .ok_or_else(|| StoreError::UnknownStore { store: META.into() })
    }

    pub fn get(&self, store: &StoreName, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db
            .get_cf(self.cf(store)?, key)
            .map_err(|source| self.read_error(store, source))
    }

    pub fn scan(
        &self,
        store: &StoreName,
        f: &mut crate::processor::ScanFn<'_>,
    ) -> Result<(), crate::processor::StepError> {
        for item in self
            .db
            .iterator_cf(self.cf(store)?, rocksdb::IteratorMode::Start)
        {
            let (k, v) = item.map_err(|source| self.read_error(store, source))?;
            f(&k, &v)?;
        }
        Ok(())
    }

    pub fn is_empty(&self, store: &StoreName) -> Result<bool, StoreError> {
        let mut it = self
            .db
            .iterator_cf(self.cf(store)?, rocksdb::IteratorMode::Start);
        match it.next() {
            None => Ok(true),
            Some(Ok(_)) => Ok(false),
            Some(Err(source)) => Err(self.read_error(store, source)),
        }
    }

    /// The directory's identity; `Ok(None)` when it has none yet (new, or written
    /// before identities), `Some(Err(_))` with why when it is there but unreadable.
    pub fn identity(&self) -> Result<Option<Result<Identity, serde_json::Error>>, StoreError> {
        let raw = self
            .db
            .get_cf(self.meta()?, IDENTITY)
            .map_err(|source| StoreError::Read {
                task: self.task,
                store: META.into(),
                source: self.noted(source),
            })?;
        Ok(raw.map(|v| serde_json::from_slice(&v)))
    }

    /// Records the directory's identity.
    pub fn stamp(&self, identity: &Identity) -> Result<(), StoreError> {
        let v = serde_json::to_vec(identity).unwrap_or_default();
        self.db
            .put_cf(self.meta()?, IDENTITY, v)
            .map_err(|source| self.write_error(source))
    }

    pub fn checkpoint(&self) -> Result<Checkpoint, StoreError> {
        let mut c = Checkpoint::default();
        let meta = self.meta()?;
        for item in self.db.iterator_cf(meta, rocksdb::IteratorMode::Start) {
            let (k, v) = item.map_err(|source| StoreError::Read {
                task: self.task,
                store: META.into(),
                source: self.noted(source),
            })?;
            let (Ok(k), Ok(v)) = (std::str::from_utf8(&k), <[u8; 8]>::try_from(&v[..])) else {
                continue;
            };
            let v = i64::from_be_bytes(v);
            if let Some(s) = k.strip_prefix("changelog/") {
                c.changelog.insert(StoreName(s.into()), v);
            } else if let Some(t) = k.strip_prefix("source/") {
                c.source.insert(t.into(), v);
            }
        }
        Ok(c)
    }

    /// Applies a unit of work's state and the offsets it corresponds to, atomically.
    pub fn commit(
        &self,
        writes: &[crate::overlay::Write],
        changelog: &BTreeMap<StoreName, i64>,
        source: &BTreeMap<String, i64>,
    ) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for ((store, key), value) in writes {
            let cf = self.cf(store)?;
            match value {
                Some(v) => batch.put_cf(cf, key, v),
                None => batch.delete_cf(cf, key),
            }
        }
        let meta = self.meta()?;
        for (store, off) in changelog {
            batch.put_cf(meta, format!("changelog/{store}"), off.to_be_bytes());
        }
        for (topic, off) in source {
            batch.put_cf(meta, format!("source/{topic}"), off.to_be_bytes());
        }
        // No fsync: a process crash keeps the WAL in the page cache; a machine crash may
        // lose the newest batches, which only makes the checkpoint older (restore reads
        // a longer tail), never inconsistent.
        let mut wo = WriteOptions::default();
        wo.set_sync(false);
        self.db
            .write_opt(batch, &wo)
            .map_err(|source| self.write_error(source))
    }

    /// Empties a store (its local copy cannot be trusted) and forgets its checkpoint.
    ///
    /// By deletes in batches rather than dropping the column family: the store may be
    /// shared with query readers (`Arc<TaskDb>`), and a wipe is rare (a recreated
    /// changelog topic), so its cost does not matter.
    pub fn wipe(&self, store: &StoreName) -> Result<(), StoreError> {
        let write = |source| self.write_error(source);
        let cf = self.cf(store)?;
        let mut batch = WriteBatch::default();
        for item in self.db.iterator_cf(cf, rocksdb::IteratorMode::Start) {
            let (k, _) = item.map_err(|source| self.read_error(store, source))?;
            batch.delete_cf(cf, k);
            if batch.len() >= 10_000 {
                self.db.write(std::mem::take(&mut batch)).map_err(write)?;
            }
        }
        batch.delete_cf(self.meta()?, format!("changelog/{store}"));
        self.db.write(batch).map_err(write)
    }

    /// Writes sorted entries into an SST file and ingests it: how an empty store is
    /// rebuilt (no memtable, no WAL, no compaction of single puts).
    pub fn ingest_sorted<'a>(
        &self,
        store: &StoreName,
        entries: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        seq: usize,
    ) -> Result<(), StoreError> {
        let mut entries = entries.into_iter().peekable();
        if entries.peek().is_none() {
            return Ok(());
        }
        let ingest = |source| StoreError::Ingest {
            task: self.task,
            store: store.0.clone(),
            source,
        };
        let dir = self.path.join("ingest");
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
            path: dir.clone(),
            source,
        })?;
        let file = dir.join(format!("{store}-{seq}.sst"));
        let opts = self.memory.options();
        let mut w = SstFileWriter::create(&opts);
        w.open(&file).map_err(ingest)?;
        for (k, v) in entries {
            match v {
                Some(v) => w.put(k, v).map_err(ingest)?,
                None => w.delete(k).map_err(ingest)?,
            }
        }
        w.finish().map_err(ingest)?;
        let mut io = IngestExternalFileOptions::default();
        io.set_move_files(true);
        self.db
            .ingest_external_file_cf_opts(self.cf(store)?, &io, vec![&file])
            .map_err(ingest)?;
        let _ = std::fs::remove_file(&file);
        Ok(())
    }

    /// Estimated live bytes of a store, for metrics.
    pub fn size_bytes(&self, store: &StoreName) -> u64 {
        self.cf(store)
            .ok()
            .and_then(|cf| {
                self.db
                    .property_int_value_cf(cf, "rocksdb.estimate-live-data-size")
                    .ok()
                    .flatten()
            })
            .unwrap_or(0)
    }

    /// Every entry of a store, for the restore digest and tests.
    pub fn digest(&self, store: &StoreName) -> Result<u64, StoreError> {
        // FNV-1a over (key, value) pairs in key order: equal state ⇔ equal digest
        // (with overwhelming probability), cheap and dependency-free.
        let mut h: u64 = 0xcbf29ce484222325;
        let mut feed = |bytes: &[u8]| {
            for b in (bytes.len() as u64).to_be_bytes().iter().chain(bytes) {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x100000001b3);
            }
        };
        for item in self
            .db
            .iterator_cf(self.cf(store)?, rocksdb::IteratorMode::Start)
        {
            let (k, v) = item.map_err(|source| self.read_error(store, source))?;
            feed(&k);
            feed(&v);
        }
        Ok(h)
    }
}

/// Key/value pairs of a store, in key order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Reads for interactive queries (`crate::query`). They see the committed state only
/// (the overlay never reaches RocksDB before its commit), and they block: callers run
/// them on the blocking pool.
impl TaskDb {
    /// The entries of a store with keys in `[from, to)` (`to: None`: to the end), in key
    /// order, at most `limit` of them.
    pub fn range(
        &self,
        store: &StoreName,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Entries, StoreError> {
        let mut out = Vec::new();
        let mode = rocksdb::IteratorMode::From(from, rocksdb::Direction::Forward);
        // The bound stops RocksDB itself at `to`: without it, a seek whose range holds
        // only deleted keys steps over every tombstone after it to find a live key.
        let mut opts = rocksdb::ReadOptions::default();
        if let Some(to) = to {
            opts.set_iterate_upper_bound(to);
        }
        for item in self.db.iterator_cf_opt(self.cf(store)?, opts, mode) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item.map_err(|source| self.read_error(store, source))?;
            if to.is_some_and(|to| &*k >= to) {
                break;
            }
            out.push((k.into_vec(), v.into_vec()));
        }
        Ok(out)
    }

    /// The entries of a store whose keys start with `prefix`, in key order, at most
    /// `limit` of them.
    pub fn prefixed(
        &self,
        store: &StoreName,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Entries, StoreError> {
        let mut out = Vec::new();
        let mode = rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward);
        let mut opts = rocksdb::ReadOptions::default();
        if let Some(end) = upper_bound_of(prefix) {
            opts.set_iterate_upper_bound(end);
        }
        for item in self.db.iterator_cf_opt(self.cf(store)?, opts, mode) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item.map_err(|source| self.read_error(store, source))?;
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k.into_vec(), v.into_vec()));
        }
        Ok(out)
    }
}

/// The first key after every key starting with `prefix`; `None` when there is none
/// (an empty prefix or only 0xff bytes).
fn upper_bound_of(prefix: &[u8]) -> Option<Vec<u8>> {
    let keep = prefix.iter().rposition(|b| *b != 0xff)?;
    let mut end = prefix[..=keep].to_vec();
    end[keep] += 1;
    Some(end)
}

fn cf_name(store: &StoreName) -> String {
    format!("store.{store}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_upper_bound_skips_trailing_ff_bytes() {
        assert_eq!(upper_bound_of(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(upper_bound_of(&[b'a', 0xff, 0xff]), Some(b"b".to_vec()));
        assert_eq!(upper_bound_of(&[0xff]), None);
        assert_eq!(upper_bound_of(b""), None);
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("oxbow-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn state_and_checkpoint_commit_together_and_survive_reopen() {
        let dir = tmp("reopen");
        let mem = SharedMemory::new(8 << 20);
        let s = StoreName("counts".into());
        {
            let db = TaskDb::open(&dir, TaskId::new(0, 0), std::slice::from_ref(&s), &mem)
                .expect("open");
            assert!(db.is_empty(&s).expect("empty"));
            let cl = BTreeMap::from([(s.clone(), 42)]);
            let src = BTreeMap::from([("in".to_string(), 7)]);
            db.commit(
                &[((s.clone(), b"a".to_vec()), Some(b"1".to_vec()))],
                &cl,
                &src,
            )
            .expect("commit");
        }
        let db =
            TaskDb::open(&dir, TaskId::new(0, 0), std::slice::from_ref(&s), &mem).expect("reopen");
        assert_eq!(db.get(&s, b"a").expect("get"), Some(b"1".to_vec()));
        let c = db.checkpoint().expect("checkpoint");
        assert_eq!(c.changelog.get(&s), Some(&42));
        assert_eq!(c.source.get("in"), Some(&7));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bulk_load_applies_puts_and_later_deletes_in_order() {
        let dir = tmp("ingest");
        let mem = SharedMemory::new(8 << 20);
        let s = StoreName("s".into());
        let db =
            TaskDb::open(&dir, TaskId::new(0, 1), std::slice::from_ref(&s), &mem).expect("open");
        let first: &[(&[u8], Option<&[u8]>)] = &[(b"a", Some(b"1")), (b"b", Some(b"2"))];
        let second: &[(&[u8], Option<&[u8]>)] = &[(b"a", None), (b"c", Some(b"3"))];
        let entries = |m: &'static [(&'static [u8], Option<&'static [u8]>)]| m.iter().copied();
        db.ingest_sorted(&s, entries(first), 0).expect("ingest 1");
        db.ingest_sorted(&s, entries(second), 1).expect("ingest 2");
        assert_eq!(db.get(&s, b"a").expect("get"), None);
        assert_eq!(db.get(&s, b"b").expect("get"), Some(b"2".to_vec()));
        assert_eq!(db.get(&s, b"c").expect("get"), Some(b"3".to_vec()));
        db.wipe(&s).expect("wipe");
        assert!(db.is_empty(&s).expect("empty"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
