//! Interactive queries: read a store's committed state over HTTP, from any worker.
//!
//! A store belongs to one stage, and every key of a keyed store lives in exactly one task
//! of that stage (the steps repartition to make it so, see `oxbow_crds::topology`). A
//! point lookup finds the key's partition (the source partitioner for a stage-0 store,
//! murmur2 behind a repartition topic), then the task's owner in the routing table, and
//! answers locally or forwards to the owner. Only a store that is not keyed by what its
//! records are partitioned by (a `batch` without `groupBy`, a custom processor's store)
//! is asked on every task of its stage. A range asks every pod for the tasks of the
//! store's stage it holds actively and merges the answers in key order.
//!
//! The pieces that decide are pure and unit-tested: the partitioners (`partition.rs`),
//! the catalog and entry decoding (`catalogue.rs`), the routing decision (`routing.rs`),
//! parameter parsing (`params.rs`) and the bodies pods exchange (`wire.rs`). [`Queries`]
//! does the I/O: point lookups and forwarding (`serve.rs`), ranges (`range.rs`), and the
//! blocking RocksDB reads (`read.rs`). A forwarded request carries [`HOP_HEADER`] and is
//! never forwarded again, so requests cannot loop while the assignment moves.
//!
//! Owns: the query API. Must not touch: Kafka, or the stores' bytes other than through
//! `crate::steps::keys`; queries only read.

mod catalogue;
mod params;
mod partition;
mod range;
mod read;
mod routing;
mod serve;
mod wire;

pub use catalogue::{Catalog, Layout, StoreInfo, decode_entry};
pub use params::{BadRequest, Params, WindowFilter, decode_segment, encode, parse_time};
pub use partition::{crc32, fnv1a, murmur2, partition_for};
pub use read::{read_entry, read_range};
pub use routing::{Decision, Facts, LocalCopy, decide, retry_after, stale_candidates};
pub use serve::Queries;
pub use wire::{Answer, ErrorBody, LocalRange, RangeEntry};

/// Set on a forwarded query (value: the forwarding pod): the receiver answers from what
/// it holds and never forwards again.
pub const HOP_HEADER: &str = "x-oxbow-forwarded-by";

tokio::task_local! {
    /// The `Authorization` header of the request being answered. A query forwarded to
    /// another pod carries it on, so that pod checks the caller too (a pod's own
    /// identity never stands in for a caller's).
    pub static AUTHORIZATION: Option<String>;
}
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 10_000;
/// Default bound for `?allowStale=true`: changelog records a standby may be behind.
pub const DEFAULT_MAX_STALENESS: i64 = 10_000;
