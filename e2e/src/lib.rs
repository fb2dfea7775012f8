pub mod credentials;
pub mod harness;
pub mod node;
pub mod streams;
pub mod workers;
