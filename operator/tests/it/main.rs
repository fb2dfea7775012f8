//! The operator's integration tests, against the local stack's API server and broker.
//!
//! One test binary for the crate (each module below was a binary of its own: every
//! one linked RocksDB and librdkafka, which was most of the tests' build time). The
//! modules share the local stack's broker and API server, and some start operators or
//! workers that would see each other's objects, so tests run one at a time:
//! `.cargo/config.toml` sets `RUST_TEST_THREADS=1` for every `cargo test`.

mod a_change_that_would_misread_a_store_is_refused;
mod an_application_id_and_its_topics_belong_to_one_app;
mod changelog_drift_is_reported_under_report_and_corrected_under_enforce;
mod deletion_policy_deletes_or_retains_topics;
mod every_condition_reason_is_documented;
mod examples_apply_cleanly;
mod invalid_manifests_are_rejected_or_stalled_with_clear_messages;
mod operator_killed_mid_reconcile_converges_after_restart;
mod source_topics_that_are_missing_or_not_co_partitioned_stall_the_app;
mod streamapp_provisions_children_topics_and_a_truthful_status;
mod the_operator_places_tasks_with_standbys_and_drains_pods_on_scale_in;
mod two_operator_replicas_elect_one_leader;
mod unreachable_kafka_is_reported_retried_and_never_wedges_deletion;
mod worker_service_account_can_renew_only_its_apps_report_leases;
