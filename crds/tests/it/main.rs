//! The oxbow-crds crate's integration tests: the committed CRD and reference match the types.
//!
//! One test binary for the crate, as in every crate of the workspace (tests/it/main.rs
//! with a module per subject). These read only the repository's files: no broker, no
//! API server.

mod committed_crd_matches_the_types;
mod committed_reference_matches_the_schema;
