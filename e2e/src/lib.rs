pub mod harness;
pub mod node;
