//! End-to-end tests: the operator, worker pods on the local node, and the broker.
//!
//! One test binary for the crate (each module below was a binary of its own: every
//! one linked RocksDB and librdkafka, which was most of the tests' build time). The
//! modules share the local stack's broker and API server, and some start operators or
//! workers that would see each other's objects, so tests run one at a time:
//! `.cargo/config.toml` sets `RUST_TEST_THREADS=1` for every `cargo test`.

mod a_dead_pods_tasks_move_while_another_pod_is_still_restoring;
mod a_full_restore_shows_rising_progress_and_an_eta_and_holds_ready;
mod a_pod_keeps_processing_its_tasks_while_it_restores_another;
mod a_store_reset_by_annotation_starts_empty_and_keeps_the_change;
mod a_wedged_worker_pod_is_failed_over_and_restarted_by_its_liveness_probe;
mod apps_connect_to_kafka_over_sasl_ssl_and_mutual_tls;
mod argocd_health_check_gives_the_right_verdicts;
mod at_least_once_workers_cut_off_from_the_api_server_stop_before_their_tasks_move;
mod at_least_once_workers_killed_mid_stream_never_count_twice;
mod coordinated_workers_place_tasks_with_standbys_and_answer_every_key;
mod deleted_worker_pods_fail_over_and_output_stays_exact;
mod examples_run_end_to_end_on_worker_pods;
mod invalid_manifests_are_rejected_with_the_api_servers_message;
mod kafka_compacted_topic_keeps_the_last_value_per_key;
mod kafka_read_committed_consumers_see_only_committed_transactions;
mod kind_manifests_are_accepted_by_the_api_server;
mod no_secret_shows_in_conditions_events_status_logs_or_metrics;
mod pods_get_config_credentials_probes_and_restarts_like_a_kubelet;
mod scaling_out_and_in_warms_tasks_up_before_moving_them;
mod statefulset_pods_run_ready_keep_their_volumes_and_scale;
mod the_helm_chart_lints_and_renders_objects_the_api_server_accepts;
mod the_helm_chart_runs_the_operator_as_a_pod_that_brings_an_app_to_ready;
mod the_node_runs_workers_as_real_containers;
mod worker_pods_pass_restricted_pod_security_and_say_why_they_are_missing;
