//! The `Processor` trait: one step of a topology, built-in or written in Rust.
//!
//! A processor sees one record at a time through a [`Context`] that gives it its stores
//! (reads see the record's own pending writes, then earlier records' writes, then
//! RocksDB) and the record's source position. Everything a processor writes is part of
//! the record's unit of work: if any later step fails, the writes vanish. A processor
//! must keep in-memory data (indexes, caches) as *hints* only, rebuilt in [`Processor::init`]
//! from the store: a crash loses memory, never the store.

use oxbow_crds::{StoreName, TaskId};
use serde_json::Value as Json;

use crate::decode::DecodeError;
use crate::expr::Env;
use crate::overlay::{Lookup, Overlay};
use crate::store::{StoreError, TaskDb};

/// A record flowing through the steps. Keys are JSON (usually a string).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub key: Json,
    pub value: Json,
    /// Event time, epoch milliseconds.
    pub timestamp: i64,
}

/// Where the record being processed came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePos {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// This record cannot be processed (bad field, CEL runtime error): it goes to the
    /// error policy and the partition moves on.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The task cannot go on (state unreadable): the task stops.
    #[error("failed to access state: {0}")]
    State(#[from] StoreError),
}

impl StepError {
    /// The record breaks a rule of its step; `message` says which, and how to fix it.
    pub fn invalid(message: impl Into<String>) -> Self {
        StepError::Record(RecordError::Invalid(message.into()))
    }

    /// A custom processor's own error about this record, kept as the cause.
    pub fn custom(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        StepError::Record(RecordError::Custom(source.into()))
    }
}

impl From<crate::expr::ExprError> for StepError {
    fn from(e: crate::expr::ExprError) -> Self {
        StepError::Record(RecordError::Expr(e))
    }
}

/// Why one record cannot be processed. Its text is what a dead letter's `oxbow.error`
/// header and the log say; each kind keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Its key or value is not in the format it is read in.
    #[error("failed to decode {what}: {source}")]
    Decode {
        what: String,
        #[source]
        source: DecodeError,
    },
    /// A step's stored state for it (a table row, a join buffer, an open batch) does not
    /// decode.
    #[error("{what} cannot be read: {source}")]
    State {
        what: String,
        #[source]
        source: DecodeError,
    },
    /// A CEL expression failed on it.
    #[error(transparent)]
    Expr(#[from] crate::expr::ExprError),
    /// It breaks a rule of its step (an event time out of range, a key missing, a
    /// partition other than declared); the text says which and how to fix it.
    #[error("{0}")]
    Invalid(String),
    /// A custom processor refused it.
    #[error(transparent)]
    Custom(Box<dyn std::error::Error + Send + Sync>),
}

/// Visits one committed entry of a store: key, value.
pub type ScanFn<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StepError> + 'a;

/// What a step may ask of the worker beyond its own task: the global tables, and
/// whether a topic exists (for outputs whose topic a record names).
pub trait Lookups: Send + Sync {
    /// The raw row of `key` in global table `table`, if any.
    fn global_row(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Whether `topic` exists (cached: this is asked per record).
    fn topic_exists(&self, topic: &str) -> bool;
}

/// No global tables, every topic exists: for tests and tools without a worker.
pub struct NoLookups;
impl Lookups for NoLookups {
    fn global_row(&self, _: &str, _: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    fn topic_exists(&self, _: &str) -> bool {
        true
    }
}

/// A record for a topic other than the sink's, sent by a `to` step in the unit of work
/// of the record that reached it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToRecord {
    pub topic: std::sync::Arc<str>,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub timestamp: i64,
}

/// A processor's window on its task: state, source position, CEL environment.
pub struct Context<'a> {
    pub(crate) task: TaskId,
    pub(crate) overlay: &'a mut Overlay,
    pub(crate) db: &'a TaskDb,
    pub(crate) env: &'a Env,
    pub(crate) source: Option<SourcePos>,
    pub(crate) now_ms: i64,
    pub(crate) lookups: &'a dyn Lookups,
    /// Records for other topics, kept only if the unit of work succeeds.
    pub(crate) sends: &'a mut Vec<ToRecord>,
    /// How the built-in steps write their stores' values.
    pub(crate) encoding: oxbow_crds::StoreEncoding,
}

impl Context<'_> {
    pub fn task(&self) -> TaskId {
        self.task
    }
    /// The source record being processed; `None` in a punctuation.
    pub fn source(&self) -> Option<&SourcePos> {
        self.source.as_ref()
    }
    /// Wall-clock time of this unit of work, epoch milliseconds.
    pub fn now_ms(&self) -> i64 {
        self.now_ms
    }
    pub fn env(&self) -> &Env {
        self.env
    }
    /// How the built-in steps write their stores' values (the app's choice; every
    /// encoding is read).
    pub fn store_encoding(&self) -> oxbow_crds::StoreEncoding {
        self.encoding
    }
    pub fn get(&self, store: &StoreName, key: &[u8]) -> Result<Option<Vec<u8>>, StepError> {
        match self.overlay.get(store, key) {
            Lookup::Value(v) => Ok(Some(v.to_vec())),
            Lookup::Deleted => Ok(None),
            Lookup::Miss => Ok(self.db.get(store, key)?),
        }
    }
    pub fn put(&mut self, store: &StoreName, key: &[u8], value: Vec<u8>) {
        self.overlay.put(store, key, value);
    }
    pub fn delete(&mut self, store: &StoreName, key: &[u8]) {
        self.overlay.delete(store, key);
    }
    /// The raw row of `key` in global table `table`.
    pub fn global_row(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StepError> {
        Ok(self.lookups.global_row(table, key)?)
    }
    pub fn topic_exists(&self, topic: &str) -> bool {
        self.lookups.topic_exists(topic)
    }
    /// Sends a record to `topic` in this unit of work.
    pub fn send(&mut self, s: ToRecord) {
        self.sends.push(s);
    }
    /// Up to `limit` entries of a store with keys in `[from, to)`, in key order, as this
    /// record sees them: committed state under the pending writes.
    pub fn range(
        &self,
        store: &StoreName,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<crate::store::Entries, StepError> {
        let pending = self.overlay.range(store, from, to);
        // Each pending delete can hide one committed entry.
        let committed =
            self.db
                .range(store, from, Some(to), limit.saturating_add(pending.len()))?;
        let mut merged: std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>> =
            committed.into_iter().map(|(k, v)| (k, Some(v))).collect();
        merged.extend(pending);
        Ok(merged
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .take(limit)
            .collect())
    }

    /// Up to `limit` committed entries of a store from key `from` on, in key order
    /// (RocksDB only: read each one again with [`Context::get`] before acting on it,
    /// since this record's own writes are not among them).
    pub fn committed_from(
        &self,
        store: &StoreName,
        from: &[u8],
        limit: usize,
    ) -> Result<crate::store::Entries, StepError> {
        Ok(self.db.range(store, from, None, limit)?)
    }

    /// Every committed entry of a store (RocksDB only): for [`Processor::init`], which
    /// runs before any record, when the overlay is empty.
    pub fn scan(&self, store: &StoreName, f: &mut ScanFn<'_>) -> Result<(), StepError> {
        self.db.scan(store, &mut |k, v| f(k, v))
    }
}

/// A step of the topology, one instance per task.
pub trait Processor: Send {
    /// The name used in errors, metrics and dead-letter headers.
    fn name(&self) -> &str;
    /// The stores this processor reads and writes (one RocksDB column family each).
    fn stores(&self) -> Vec<StoreName> {
        Vec::new()
    }
    /// Whether this processor's outputs are new records built from its state (closed
    /// windows, batches) rather than the input passed on. A later step that fails on
    /// such a record dead-letters that record alone: the state that produced it (a
    /// window marked emitted) is kept, so one bad emission cannot block the partition.
    fn emits(&self) -> bool {
        false
    }
    /// After restore, before the first record: rebuild in-memory hints from the stores.
    fn init(&mut self, _ctx: &mut Context<'_>) -> Result<(), StepError> {
        Ok(())
    }
    /// Processes one record, pushing what goes to the next step onto `out`.
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        record: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError>;
    /// The record (or punctuation) just finished: `committed` if every step succeeded,
    /// otherwise its store writes were dropped and in-memory hints changed while
    /// processing it must be undone.
    fn end_record(&mut self, _committed: bool) {}
    /// Called regularly with no record (wall-clock work such as a batch's `maxWait`);
    /// what it pushes onto `out` goes to the next step.
    fn punctuate(
        &mut self,
        _ctx: &mut Context<'_>,
        _out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        Ok(())
    }
}

/// Builds a task's instance of a processor. Built-in steps compile their expressions
/// once and clone them per task.
pub type ProcessorFactory = std::sync::Arc<dyn Fn(TaskId) -> Box<dyn Processor> + Send + Sync>;
