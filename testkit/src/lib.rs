//! Helpers shared by the integration tests of every crate (crds, operator, worker,
//! e2e): where the local stack is ([`stack`]), waiting on a condition with a deadline
//! and a message that says what did not happen ([`wait`]), names no other run uses
//! ([`unique`]), Kafka topics, records and offsets ([`kafka`]), plain HTTP ([`http`]),
//! and, with the `kube` feature, the API server ([`kube`]).
//!
//! Owns: talking to the stack as a test does. It must not start the stack (`make up`
//! does), stand in for anything Oxbow decides, or hold a crate's own fixtures (the
//! worker's process builder, the e2e suite's operator process): those stay with the
//! crate's tests.
#![allow(clippy::unwrap_used)]

pub mod http;
pub mod kafka;
#[cfg(feature = "kube")]
pub mod kube;
pub mod stack;
pub mod wait;

use std::sync::atomic::{AtomicU32, Ordering};

/// `prefix` with a short suffix no concurrent or earlier run uses (the process, the
/// clock and a counter): short enough for a Kubernetes name of a short prefix.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}{:04x}{:x}",
        std::process::id() & 0xfff,
        nanos & 0xffff,
        N.fetch_add(1, Ordering::SeqCst)
    )
}
