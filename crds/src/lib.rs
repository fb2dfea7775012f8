//! The `StreamApp` API shared by the operator and the worker.
//!
//! This crate owns the types, the Kafka naming rules and the pure decision logic both
//! sides must agree on. It must not perform I/O: no Kubernetes client, no Kafka client.

/// API group of every Oxbow resource.
pub const API_GROUP: &str = "oxbow.dev";
