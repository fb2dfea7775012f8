//! The Oxbow operator. Filled in by the operator issue; for now it only reports its version.

fn main() {
    println!(
        "oxbow-operator {} ({})",
        env!("CARGO_PKG_VERSION"),
        oxbow_crds::API_GROUP
    );
}
