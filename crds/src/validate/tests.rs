use super::*;
use crate::streamapp::StreamApp;

fn app(yaml: &str) -> StreamApp {
    serde_yaml::from_str(yaml).expect("valid manifest")
}

/// An app reading `in` with the given `tables:` and `steps:` lines.
fn app_with(rest: &str) -> StreamApp {
    app(&format!(
        "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {{name: t}}\nspec:\n  kafka: {{bootstrapServers: \"k:9092\"}}\n  source: {{topics: [in]}}\n{rest}"
    ))
}

const BASE: &str = r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {name: fraud, namespace: ns}
spec:
  kafka: {bootstrapServers: "127.0.0.1:9092"}
  source: {topics: [payments]}
  steps:
  - dedupe: {store: seen, id: value.txId, within: 24h}
  - aggregate:
      store: per-user
      groupBy: value.userId
      window: {tumbling: 10m, grace: 1m}
      fields: {count: {count: {}}, total: {sum: value.amount}}
  - filter: {cel: "value.count > 5"}
  sink: {topic: alerts}
"#;

#[test]
fn a_sound_spec_has_no_errors_and_lists_its_stores() {
    let a = app(BASE);
    assert_eq!(validate_spec(&a.spec), vec![]);
    assert_eq!(
        stores(&a.spec),
        vec![StoreName("seen".into()), StoreName("per-user".into())]
    );
    assert_eq!(
        a.changelog_topic(&StoreName("seen".into())),
        "ns.fraud-seen-changelog"
    );
    assert_eq!(a.dead_letter_topic().as_deref(), Some("ns.fraud-dlq"));
    assert_eq!(a.transactional_id(crate::TaskId::new(1, 3)), "ns.fraud-1_3");
}

#[test]
fn a_triply_nested_comprehension_is_refused_as_too_costly_and_a_single_pass_is_not() {
    let nested = "value.a.all(i, value.a.all(j, value.a.exists(k, k == i + j)))";
    let a = app(&BASE.replace("value.count > 5", nested));
    let errs = validate_spec(&a.spec);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].reason(), "ExpressionTooCostly");
    assert!(
        errs[0]
            .to_string()
            .starts_with("spec.steps[2].filter.cel: CEL expression"),
        "{}",
        errs[0]
    );
    let once = app(&BASE.replace("value.count > 5", "value.items.all(i, i.price > 0)"));
    assert_eq!(validate_spec(&once.spec), vec![]);
}

#[test]
fn a_cel_syntax_error_names_the_field() {
    let a = app(&BASE.replace("value.count > 5", "value.count >"));
    let errs = validate_spec(&a.spec);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0]
            .to_string()
            .starts_with("spec.steps[2].filter.cel: failed to parse CEL expression"),
        "{}",
        errs[0]
    );
}

#[test]
fn two_steps_sharing_a_store_are_rejected() {
    let a = app(&BASE.replace("store: per-user", "store: seen"));
    let errs = validate_spec(&a.spec);
    assert_eq!(
        errs,
        vec![ValidationError::DuplicateStore {
            store: "seen".into(),
            first: "dedupe-0".into(),
            second: "aggregate-1".into()
        }]
    );
}

#[test]
fn settings_for_a_store_no_step_uses_are_rejected() {
    let a = app(&BASE.replace(
        "sink:",
        "stores: {sen: {changelog: {segment: 1h}}}\n  sink:",
    ));
    assert_eq!(
        validate_spec(&a.spec),
        vec![ValidationError::UnusedStoreSettings {
            store: "sen".into()
        }]
    );
}

#[test]
fn a_zero_grace_is_allowed_but_a_zero_window_is_not() {
    let a = app(&BASE.replace("grace: 1m", "grace: 0s"));
    assert_eq!(validate_spec(&a.spec), vec![]);
    let a = app(&BASE.replace("tumbling: 10m", "tumbling: 0m"));
    let errs = validate_spec(&a.spec);
    assert!(
        matches!(&errs[..], [ValidationError::UnusableDuration { path, .. }] if path.ends_with("window.tumbling")),
        "{errs:?}"
    );
}

#[test]
fn a_zero_commit_interval_is_rejected() {
    let a = app(&BASE.replace("source:", "commitInterval: 0ms\n  source:"));
    let errs = validate_spec(&a.spec);
    assert!(
        matches!(&errs[..], [ValidationError::UnusableDuration { path, .. }] if path == "spec.commitInterval"),
        "{errs:?}"
    );
}

#[test]
fn a_password_or_a_file_path_in_spec_kafka_properties_is_refused_without_quoting_it() {
    let app = with(
        "5s",
        r#""sasl.password": "hunter2-sentinel", "ssl.key.location": "/etc/shadow""#,
    );
    let errors: Vec<String> = validate_app(&app).iter().map(|e| e.to_string()).collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].starts_with(
            r#"spec.kafka.properties["sasl.password"]: refused, because its value is secret"#
        ),
        "{errors:?}"
    );
    assert!(
        errors[1].starts_with(
            r#"spec.kafka.properties["ssl.key.location"]: refused, because it reads a file"#
        ),
        "{errors:?}"
    );
    assert!(!errors.concat().contains("hunter2") && !errors.concat().contains("shadow"));
}

fn with(commit_interval: &str, kafka_properties: &str) -> StreamApp {
    app(&BASE
        .replace(
            "source:",
            &format!("commitInterval: {commit_interval}\n  source:"),
        )
        .replace(
            r#"bootstrapServers: "127.0.0.1:9092"}"#,
            &format!(r#"bootstrapServers: "127.0.0.1:9092", properties: {{{kafka_properties}}}}}"#),
        ))
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn the_transaction_timeout_grows_with_a_long_commit_interval() {
    assert_eq!(
        transaction_timeout(Duration::from_millis(100), None),
        Ok(60 * SECOND),
        "a short interval keeps librdkafka's 60 s"
    );
    assert_eq!(
        transaction_timeout(90 * SECOND, None),
        Ok(210 * SECOND),
        "two intervals and a commit round"
    );
    assert_eq!(
        transaction_timeout(440 * SECOND, None),
        Ok(BROKER_MAX_TRANSACTION_TIMEOUT),
        "never above what the brokers accept by default"
    );
    assert_eq!(validate_spec(&with("90s", "").spec), vec![]);
}

#[test]
fn an_explicit_transaction_timeout_is_honoured_when_it_has_room_for_the_commit_interval() {
    assert_eq!(
        transaction_timeout(90 * SECOND, Some("300000")),
        Ok(300 * SECOND)
    );
    assert_eq!(
        transaction_timeout(Duration::from_millis(100), Some("10000")),
        Ok(10 * SECOND),
        "Kafka Streams' own exactly-once default"
    );
    assert_eq!(
        validate_spec(&with("90s", r#""transaction.timeout.ms": "300000""#).spec),
        vec![]
    );
}

#[test]
fn a_commit_interval_the_transaction_timeout_cannot_hold_is_rejected_naming_both() {
    let errs = validate_spec(&with("90s", r#""transaction.timeout.ms": "60000""#).spec);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].reason(), "InvalidDuration");
    assert_eq!(
        errs[0].to_string(),
        r#"spec.commitInterval: "1m30s" needs a transaction timeout of at least twice that (180000 ms) under exactly_once, but spec.kafka.properties["transaction.timeout.ms"] is 60000 ms: transactions would be aborted before they commit; shorten commitInterval or raise transaction.timeout.ms"#
    );
}

#[test]
fn a_commit_interval_beyond_what_brokers_allow_by_default_is_rejected() {
    let errs = validate_spec(&with("10m", "").spec);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        errs[0].to_string(),
        r#"spec.commitInterval: "10m" is too long for exactly_once: a transaction stays open about one commit interval, so it needs a transaction timeout of at least twice that (1200000 ms), above the brokers' default transaction.max.timeout.ms (900000 ms); use a commitInterval of at most 7m30s"#
    );
    let errs = validate_spec(&with("10s", r#""transaction.timeout.ms": "1800000""#).spec);
    assert!(
        matches!(&errs[..], [ValidationError::UnusableDuration { path, message }]
                if path == r#"spec.kafka.properties["transaction.timeout.ms"]"#
                    && message.starts_with("1800000 ms is above the brokers' default transaction.max.timeout.ms (900000 ms)")),
        "{errs:?}"
    );
}

#[test]
fn a_transaction_timeout_that_is_not_a_number_is_rejected() {
    let errs = validate_spec(&with("1s", r#""transaction.timeout.ms": "1m""#).spec);
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![
            r#"spec.kafka.properties["transaction.timeout.ms"]: failed to read "1m" as a whole number of milliseconds"#
        ]
    );
}

#[test]
fn at_least_once_has_no_transaction_to_time_out() {
    let mut a = with("10m", r#""transaction.timeout.ms": "60000""#);
    a.spec.processing_guarantee = ProcessingGuarantee::AtLeastOnce;
    assert_eq!(validate_spec(&a.spec), vec![]);
}

#[test]
fn joins_and_outputs_are_checked_naming_the_step() {
    let a = app_with(
        r#"
  tables:
  - {name: users, topic: users}
  - {name: seen, topic: other}
  steps:
  - dedupe: {store: seen, id: value.txId, within: 1h}
  - join: {table: user, key: value.userId}
  - to: {topic: in}
"#,
    );
    let errors = validate_spec(&a.spec);
    let reasons: Vec<&str> = errors.iter().map(ValidationError::reason).collect();
    assert!(reasons.contains(&"TableNameTaken"), "{errors:?}");
    assert!(reasons.contains(&"UnknownTable"), "{errors:?}");
    assert!(reasons.contains(&"OutputTopicTaken"), "{errors:?}");
    let text = errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(text.contains("step join-1 joins table \"user\""), "{text}");
    assert!(
        text.contains("step to-2 writes to \"in\", which is a source topic"),
        "{text}"
    );
}

#[test]
fn a_table_joined_in_two_stages_is_rejected() {
    let a = app_with(
        r#"
  tables:
  - {name: users, topic: users}
  steps:
  - join: {table: users, key: value.userId}
  - aggregate: {store: s, groupBy: value.country, fields: {n: {count: {}}}}
  - join: {table: users, key: key}
"#,
    );
    let errors = validate_spec(&a.spec);
    assert!(
        errors.iter().any(|e| e.reason() == "TableInTwoStages"),
        "{errors:?}"
    );
}

#[test]
fn a_table_needs_its_topic_and_unless_global_the_task_count() {
    let a = app_with(
        r#"
  tables:
  - {name: users, topic: users}
  - {name: countries, topic: countries, global: true}
"#,
    );
    let counts = BTreeMap::from([
        ("users".to_string(), Some(3)),
        ("countries".to_string(), Some(1)),
    ]);
    let errors = join_partitions(&a.spec, 4, &counts);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].reason(), "TableNotCoPartitioned");
    assert!(
        errors[0]
            .to_string()
            .contains("with 3 partitions, but the app's tasks need 4")
    );
    let missing = join_partitions(&a.spec, 3, &BTreeMap::new());
    assert_eq!(missing.len(), 2);
    assert!(missing.iter().all(|e| e.reason() == "TableTopicMissing"));
}

#[test]
fn stream_joins_need_a_window_their_own_topic_and_table_joins_no_window() {
    let a = app_with(
        r#"
  tables:
  - {name: users, topic: users}
  steps:
  - name: clicks
    join: {stream: {topic: clicks}, key: value.adId}
  - join: {stream: {topic: in}, key: key, within: 5s}
  - join: {table: users, key: value.userId, type: outer, within: 1m}
"#,
    );
    let errors = validate_spec(&a.spec);
    let reasons: Vec<&str> = errors.iter().map(ValidationError::reason).collect();
    assert_eq!(
        reasons,
        vec![
            "StreamJoinWithoutWindow",
            "JoinStreamTaken",
            "NotForTableJoins",
            "NotForTableJoins"
        ],
        "{errors:?}"
    );
    let text = errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        text.contains(
            "spec.steps[0].join.within: step clicks joins stream \"clicks\" without a window"
        ),
        "{text}"
    );
    assert!(
        text.contains("step join-1 joins stream \"in\", which is a source topic"),
        "{text}"
    );
    assert!(text.contains("spec.steps[2].join.type: step join-2 joins table \"users\": type: outer applies to stream–stream joins only"), "{text}");
    // The stream's topic must exist with the task count.
    let counts = BTreeMap::from([
        ("clicks".to_string(), Some(3)),
        ("users".to_string(), Some(4)),
    ]);
    let errors = join_partitions(&a.spec, 4, &counts);
    let reasons: Vec<&str> = errors.iter().map(ValidationError::reason).collect();
    assert_eq!(
        reasons,
        vec!["JoinStreamNotCoPartitioned", "JoinStreamMissing"],
        "{errors:?}"
    );
    assert_eq!(join_topics(&a.spec), vec!["users", "clicks", "in"]);
}

#[test]
fn task_count_requires_existing_co_partitioned_topics() {
    let m = |v: &[(&str, Option<i32>)]| {
        v.iter()
            .map(|(t, n)| (t.to_string(), *n))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(task_count(&m(&[("a", Some(4)), ("b", Some(4))])), Ok(4));
    let err = task_count(&m(&[("a", Some(4)), ("b", Some(6))])).expect_err("not co-partitioned");
    assert_eq!(
        err.to_string(),
        "source topics are not co-partitioned: a has 4, b has 6; every source topic needs the same partition count"
    );
    let err = task_count(&m(&[("a", Some(4)), ("b", None)])).expect_err("missing");
    assert_eq!(err.to_string(), "source topics do not exist: b");
}

#[test]
fn an_unparsable_duration_keeps_the_parse_error_as_its_cause() {
    let a = app(&BASE.replace("source:", "commitInterval: 10x\n  source:"));
    let errs = validate_spec(&a.spec);
    let [e @ ValidationError::InvalidDuration { path, .. }] = &errs[..] else {
        panic!("one unparsable duration expected: {errs:?}");
    };
    assert_eq!(path, "spec.commitInterval");
    let cause = std::error::Error::source(e).expect("the parse error is kept as the cause");
    assert!(cause.to_string().contains(r#""10x""#), "{cause}");
}

#[test]
fn a_duration_that_cannot_work_shows_the_same_reason_as_one_that_does_not_parse() {
    let a = app(&BASE.replace("source:", "commitInterval: 0ms\n  source:"));
    let errs = validate_spec(&a.spec);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].reason(), "InvalidDuration");
}
