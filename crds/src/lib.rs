//! The `StreamApp` API shared by the operator and the worker.
//!
//! This crate owns the types, the Kafka naming rules and the pure decision logic both
//! sides must agree on (validation beyond the schema, the task model). It must not
//! perform I/O: no Kubernetes client, no Kafka client.

pub mod assignment;
pub mod cel_cost;
pub mod crd;
pub mod duration;
pub mod kafka_properties;
pub mod layouts;
pub mod names;
pub mod redact;
pub mod reference;
pub mod report;
pub mod streamapp;
pub mod topics;
pub mod topology;
pub mod validate;

pub use names::{StoreName, TaskId};
pub use streamapp::*;

/// API group of every Oxbow resource.
pub const API_GROUP: &str = "oxbow.dev";
