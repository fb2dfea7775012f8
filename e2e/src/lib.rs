pub mod credentials;
pub mod harness;
pub mod node;
pub mod reports;
pub mod streams;
pub mod workers;
