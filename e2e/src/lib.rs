pub mod harness;
pub mod node;
pub mod streams;
