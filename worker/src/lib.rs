//! The Oxbow worker engine (in progress): the pure pieces of the unit of work and of
//! windowing. Kafka, RocksDB and HTTP arrive with the rest of the worker issue.

pub mod overlay;
pub mod restore;
pub mod window;
