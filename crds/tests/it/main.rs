//! The oxbow-crds crate's integration tests: the committed CRD and reference match the types.
//!
//! One test binary for the crate (each module below was a binary of its own: every
//! one linked RocksDB and librdkafka, which was most of the tests' build time). The
//! modules share the local stack's broker and API server, and some start operators or
//! workers that would see each other's objects, so tests run one at a time:
//! `.cargo/config.toml` sets `RUST_TEST_THREADS=1` for every `cargo test`.

mod committed_crd_matches_the_types;
mod committed_reference_matches_the_schema;
