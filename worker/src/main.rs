//! The Oxbow worker. Filled in by the worker issue; for now it only reports its version.

fn main() {
    println!(
        "oxbow-worker {} ({})",
        env!("CARGO_PKG_VERSION"),
        oxbow_crds::API_GROUP
    );
}
