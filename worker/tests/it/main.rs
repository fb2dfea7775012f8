//! The worker's integration tests: worker processes against the local stack's broker.
//!
//! One test binary for the crate (each module below was a binary of its own: every
//! one linked RocksDB and librdkafka, which was most of the tests' build time). The
//! modules share the local stack's broker and API server, and some start operators or
//! workers that would see each other's objects, so tests run one at a time:
//! `.cargo/config.toml` sets `RUST_TEST_THREADS=1` for every `cargo test`.

mod support;

mod a_taken_port_stops_the_worker_at_start;
mod backlogged_partitions_are_read_side_by_side;
mod batches_survive_kills;
mod broker_restart_keeps_exactly_once;
mod custom_processor_gets_the_same_machinery;
mod exactly_once_under_sigkill;
mod failing_emissions_do_not_block;
mod keyed_steps_repartition_across_partitions;
mod poison_messages_go_to_the_dlq;
mod processing_threads;
mod queries_answer_every_key_from_every_worker;
mod records_too_large_to_produce_become_dead_letters;
mod restore_tail_and_full;
mod seed000_failed_step_leaves_no_dedupe_mark;
mod store_encodings;
mod tables_joins_and_outputs;
mod windows_match_a_model;
