//! The Oxbow operator: turns `StreamApp`s into workers, topics and status.

pub mod applied;
pub mod build;
pub mod claims;
pub mod client_cache;
pub mod controller;
pub mod kafka_context;
pub mod leader;
pub mod metrics;
pub mod ownership;
pub mod placement;
pub mod reports;
pub mod status;
pub mod topics;
