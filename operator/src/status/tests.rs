use super::*;

/// Every name an error enum gives as a reason is in the reasons table.
fn all_listed(names: &[&str], whose: &str) {
    for name in names {
        assert!(
            reason::ALL.iter().any(|(r, _)| r.as_str() == *name),
            "{whose} reason {name} is not in status::reason::ALL"
        );
    }
}

#[test]
fn every_topic_error_names_a_listed_reason() {
    use crate::topics::TopicError;
    all_listed(
        <TopicError as strum::VariantNames>::VARIANTS,
        "the topic error's",
    );
}

#[test]
fn every_reason_validation_can_give_is_listed_with_its_condition_types() {
    use oxbow_crds::validate::ValidationError as E;
    all_listed(<E as strum::VariantNames>::VARIANTS, "validation's");
    let problems = [
        E::InvalidExpression {
            path: "p".into(),
            expr: "1 +".into(),
            source: cel::Program::compile("1 +")
                .expect_err("not an expression")
                .into(),
        },
        E::InvalidDuration {
            path: "p".into(),
            source: oxbow_crds::duration::DurationError {
                input: "1x".into(),
                reason: "r",
            },
        },
        E::UnusableDuration {
            path: "p".into(),
            message: "m".into(),
        },
        E::DuplicateStore {
            store: "s".into(),
            first: "a".into(),
            second: "b".into(),
        },
        E::UnusedStoreSettings { store: "s".into() },
        E::SourceTopicsMissing { topics: vec![] },
        E::NotCoPartitioned {
            counts: Default::default(),
        },
    ];
    for e in &problems {
        assert_eq!(reason::of(e).as_str(), e.reason(), "{e:?}");
    }
    let not_co_partitioned = problems.last().expect("listed last");
    assert_eq!(
        reason::of(not_co_partitioned),
        reason::SOURCE_TOPICS_NOT_CO_PARTITIONED
    );
}

#[test]
fn every_reason_is_listed_once_with_known_condition_types() {
    let types = <ConditionType as strum::VariantArray>::VARIANTS;
    let mut seen = std::collections::BTreeSet::new();
    for (r, on) in reason::ALL {
        assert!(seen.insert(r.as_str()), "{} listed twice", r.as_str());
        assert!(
            on.iter().all(|t| types.contains(t)),
            "{}: {on:?}",
            r.as_str()
        );
    }
}

fn input<'a>(prev: &'a [Condition], topics: Verdict, workload: Verdict) -> StatusInput<'a> {
    StatusInput {
        generation: Some(3),
        invalid: None,
        topics,
        tasks: Verdict::ok(reason::ASSIGNED, ""),
        workload,
        restored: Verdict::ok(reason::RESTORED, ""),
        previous: prev,
        now: Timestamp::from_second(1_800_000_000).expect("ts"),
    }
}

fn get(cs: &[Condition], t: ConditionType) -> &Condition {
    find(cs, t).expect("condition present")
}

#[test]
fn ready_only_when_every_detail_is_ready() {
    let (cs, phase) = conditions(&input(
        &[],
        Verdict::ok(reason::TOPICS_READY, ""),
        Verdict::ok(reason::ALL_WORKERS_READY, ""),
    ));
    assert_eq!(get(&cs, ConditionType::Ready).status, "True");
    assert_eq!(get(&cs, ConditionType::Reconciling).status, "False");
    assert_eq!(get(&cs, ConditionType::Stalled).status, "False");
    assert_eq!(phase, Phase::Running);
    assert!(cs.iter().all(|c| c.observed_generation == Some(3)));
}

#[test]
fn missing_pods_keep_ready_false_and_reconciling_true() {
    let w = workload_verdict(&WorkloadFacts {
        exists: true,
        want_replicas: 3,
        replicas: 3,
        ready_replicas: 1,
        updated_replicas: 3,
        rolled_out: true,
        draining: 0,
        stopping: 0,
        create_failure: None,
    });
    let (cs, phase) = conditions(&input(&[], Verdict::ok(reason::TOPICS_READY, ""), w));
    assert_eq!(get(&cs, ConditionType::Ready).status, "False");
    assert_eq!(get(&cs, ConditionType::Ready).reason, "WorkersNotReady");
    assert_eq!(
        get(&cs, ConditionType::Ready).message,
        "1/3 worker pods ready, 3/3 updated to the current spec"
    );
    assert_eq!(get(&cs, ConditionType::Reconciling).status, "True");
    assert_eq!(phase, Phase::Degraded);
}

#[test]
fn drift_stalls_with_the_topic_and_key_in_the_message() {
    let t = topics_verdict(&[TopicStatus {
        name: "a-s-changelog".into(),
        drift: vec!["min.cleanable.dirty.ratio: 0.5 (want 0.1)".into()],
        ..Default::default()
    }]);
    let (cs, phase) = conditions(&input(&[], t, Verdict::ok(reason::ALL_WORKERS_READY, "")));
    let s = get(&cs, ConditionType::Stalled);
    assert_eq!(
        (s.status.as_str(), s.reason.as_str()),
        ("True", "ConfigDrift")
    );
    assert!(
        s.message
            .contains("a-s-changelog: min.cleanable.dirty.ratio: 0.5 (want 0.1)"),
        "{}",
        s.message
    );
    assert_eq!(get(&cs, ConditionType::Reconciling).status, "False");
    assert_eq!(phase, Phase::Failed);
}

#[test]
fn reports_of_pods_that_no_longer_exist_are_ignored() {
    let report = |pod: &str, remaining| InstanceStatus {
        pod: pod.into(),
        state: Some("Restoring".into()),
        restore_remaining: Some(remaining),
        ..Default::default()
    };
    let all = vec![
        report("app-0", 10),
        report("app-2", 99),
        report("other-0", 5),
    ];
    let current = current_instances(&["app-0", "app-1"], &all);
    assert_eq!(
        current.iter().map(|i| i.pod.as_str()).collect::<Vec<_>>(),
        vec!["app-0"]
    );
    let (summary, verdict) = restoration(&current);
    assert_eq!(summary.map(|s| s.total_records), Some(10));
    assert_eq!(verdict.reason, "Restoring");
}

#[test]
fn transition_time_is_kept_while_the_status_is_unchanged() {
    let old = Time(Timestamp::from_second(1_700_000_000).expect("ts"));
    let prev = vec![Condition {
        type_: ConditionType::Ready.as_str().into(),
        status: "False".into(),
        reason: "X".into(),
        message: "".into(),
        observed_generation: Some(2),
        last_transition_time: old.clone(),
    }];
    let (cs, _) = conditions(&input(
        &prev,
        Verdict::waiting(reason::TOPICS_PROVISIONING, ""),
        Verdict::ok(reason::ALL_WORKERS_READY, ""),
    ));
    assert_eq!(
        get(&cs, ConditionType::Ready).last_transition_time,
        old,
        "still False: time kept"
    );
    let (cs, _) = conditions(&input(
        &prev,
        Verdict::ok(reason::TOPICS_READY, ""),
        Verdict::ok(reason::ALL_WORKERS_READY, ""),
    ));
    assert_ne!(
        get(&cs, ConditionType::Ready).last_transition_time,
        old,
        "flipped to True: new time"
    );
}

#[test]
fn an_invalid_spec_stalls_everything() {
    let mut i = input(
        &[],
        Verdict::ok(reason::TOPICS_READY, ""),
        Verdict::ok(reason::ALL_WORKERS_READY, ""),
    );
    i.invalid = Some(Verdict::stalled(
        reason::INVALID_EXPRESSION,
        "spec.steps[0].filter.cel: …",
    ));
    let (cs, phase) = conditions(&i);
    assert_eq!(get(&cs, ConditionType::Ready).reason, "InvalidExpression");
    assert_eq!(get(&cs, ConditionType::Stalled).status, "True");
    assert_eq!(phase, Phase::Failed);
}

fn worker(pod: &str) -> InstanceStatus {
    InstanceStatus {
        pod: pod.into(),
        state: Some("Running".into()),
        assignment_generation: Some(7),
        ..Default::default()
    }
}

#[test]
fn restoration_sums_records_rate_and_eta_over_the_workers() {
    let mut a = worker("app-0");
    a.state = Some("Restoring".into());
    a.restored = Some(700);
    a.restore_remaining = Some(300);
    a.restore_rate = Some(100);
    a.active_tasks = vec!["0_0".into(), "0_1".into(), "0_2".into()];
    a.state_lag = [("0_0".to_string(), 300), ("0_1".to_string(), 0)].into();
    let mut b = worker("app-1");
    b.state = Some("Restoring".into());
    b.restored = Some(170);
    b.restore_remaining = Some(30);
    b.restore_rate = Some(50);
    b.active_tasks = vec!["0_3".into()];
    let mut c = worker("app-2");
    c.restored = Some(100);
    let (summary, verdict) = restoration(&[&a, &b, &c]);
    let s = summary.expect("summary");
    assert_eq!((s.restored_records, s.total_records), (970, 1300));
    assert_eq!(s.percent, "74%");
    assert_eq!(s.records_per_second, Some(150));
    assert_eq!(s.eta_seconds, Some(3), "330 records at 150/s, rounded up");
    assert_eq!(s.tasks_restoring, 2, "task 0 on app-0 and task 3 on app-1");
    assert!(!verdict.ok);
    assert_eq!(verdict.reason, "Restoring");
    assert_eq!(
        verdict.message,
        "2 tasks restoring on app-0, app-1: 970/1300 records (74%), 150 records/s, ETA 3s"
    );
}

#[test]
fn a_nearly_done_restore_never_shows_as_a_hundred_percent() {
    let mut a = worker("app-0");
    a.state = Some("Restoring".into());
    a.restored = Some(999_999);
    a.restore_remaining = Some(1);
    let (summary, verdict) = restoration(&[&a]);
    assert_eq!(summary.expect("summary").percent, "99%");
    assert!(!verdict.ok);
    let mut done = worker("app-0");
    done.restored = Some(1000);
    let (summary, verdict) = restoration(&[&done]);
    let s = summary.expect("summary");
    assert_eq!((s.percent.as_str(), s.eta_seconds), ("100%", None));
    assert!(verdict.ok);
}

fn assigned(generation: i64) -> Assignment {
    let mut a = oxbow_crds::assignment::next(
        None,
        &[oxbow_crds::assignment::PodFacts {
            pod: "app-0".into(),
            eligible: true,
            ..Default::default()
        }],
        oxbow_crds::assignment::Params {
            tasks: 2,
            stages: 1,
            standby_replicas: 0,
            warmup_max_lag: 0,
        },
    );
    a.generation = generation;
    a
}

#[test]
fn a_failed_worker_makes_ready_false_with_its_pod_and_error() {
    let mut f = worker("app-1");
    f.state = Some("Failed".into());
    f.last_error = Some("store seen: disk full".into());
    let a = assigned(7);
    let v = tasks_verdict(Some(&a), &[&worker("app-0"), &f], 2);
    assert_eq!(v.reason, "TaskFailed");
    assert_eq!(v.message, "worker failed: app-1: store seen: disk full");
    let mut i = input(
        &[],
        Verdict::ok(reason::TOPICS_READY, ""),
        Verdict::waiting(reason::WORKERS_NOT_READY, "1/2 worker pods ready"),
    );
    i.tasks = v;
    let (cs, phase) = conditions(&i);
    assert_eq!(
        get(&cs, ConditionType::Ready).reason,
        "TaskFailed",
        "said before the pod count"
    );
    assert_eq!(get(&cs, ConditionType::TasksAssigned).status, "False");
    assert_eq!(phase, Phase::Degraded);
}

#[test]
fn an_unacknowledged_assignment_keeps_ready_false_until_every_worker_runs_it() {
    let a = assigned(8);
    let mut late = worker("app-1");
    late.assignment_generation = Some(6);
    let v = tasks_verdict(Some(&a), &[&worker("app-0"), &late], 2);
    assert_eq!(v.reason, "AssignmentPending");
    assert_eq!(
        v.message,
        "waiting for app-0 (at 7), app-1 (at 6) to acknowledge assignment generation 8"
    );
    let mut i = input(
        &[],
        Verdict::ok(reason::TOPICS_READY, ""),
        Verdict::ok(reason::ALL_WORKERS_READY, ""),
    );
    i.tasks = v;
    let (cs, phase) = conditions(&i);
    assert_eq!(get(&cs, ConditionType::Ready).reason, "AssignmentPending");
    assert_eq!(get(&cs, ConditionType::Reconciling).status, "True");
    assert_eq!(phase, Phase::Restoring);
    let v = tasks_verdict(Some(&assigned(7)), &[&worker("app-0")], 2);
    assert!(v.ok, "{v:?}");
}

#[test]
fn workers_that_write_no_status_are_not_waited_for() {
    let v = tasks_verdict(Some(&assigned(3)), &[], 2);
    assert!(v.ok, "{v:?}");
    let v = tasks_verdict(None, &[], 2);
    assert_eq!(
        v.reason, "AssignmentPending",
        "but an assignment must exist"
    );
    assert!(
        tasks_verdict(None, &[], 0).ok,
        "nothing to assign at 0 replicas"
    );
}

#[test]
fn pods_the_statefulset_controller_cannot_create_stall_the_app_with_its_message() {
    let facts = WorkloadFacts {
        exists: true,
        want_replicas: 3,
        replicas: 1,
        ready_replicas: 1,
        create_failure: Some("exceeded quota: q, requested: pods=1".into()),
        ..Default::default()
    };
    let w = workload_verdict(&facts);
    assert_eq!((w.reason.as_str(), w.stalled), ("PodCreationFailed", true));
    assert_eq!(
        w.message,
        "1/3 worker pods exist: the StatefulSet controller cannot create the others: exceeded quota: q, requested: pods=1"
    );
    let all_there = WorkloadFacts {
        replicas: 3,
        ..facts
    };
    assert_ne!(workload_verdict(&all_there).reason, "PodCreationFailed");
}

#[test]
fn a_scale_in_that_waits_for_warm_up_says_so() {
    let w = workload_verdict(&WorkloadFacts {
        exists: true,
        want_replicas: 2,
        replicas: 4,
        ready_replicas: 4,
        updated_replicas: 4,
        rolled_out: true,
        draining: 2,
        stopping: 0,
        create_failure: None,
    });
    assert_eq!(w.reason, "Draining");
    assert!(!w.ok && !w.stalled);
    assert!(
        w.message.starts_with("scaling in to 2: 2 pods above it"),
        "{}",
        w.message
    );
    let w = workload_verdict(&WorkloadFacts {
        exists: true,
        want_replicas: 2,
        replicas: 2,
        ready_replicas: 3,
        updated_replicas: 3,
        rolled_out: true,
        draining: 0,
        stopping: 1,
        create_failure: None,
    });
    assert_eq!(
        (w.reason.as_str(), w.ok),
        ("ScalingIn", false),
        "not Ready while a removed pod still runs"
    );
}

#[test]
fn a_topic_error_gives_the_reason_of_its_kind() {
    use crate::topics::TopicError;
    use rdkafka::error::KafkaError;
    let kafka = || KafkaError::ClientCreation("refused".into());
    let (bootstrap, detail) = (String::from("b:9092"), String::from("d"));
    let cases = [
        (
            TopicError::KafkaUnreachable {
                bootstrap: bootstrap.clone(),
                source: kafka(),
            },
            reason::KAFKA_UNREACHABLE,
        ),
        (
            TopicError::KafkaAuthentication {
                bootstrap: bootstrap.clone(),
                detail: detail.clone(),
                source: Box::new(kafka()),
            },
            reason::KAFKA_AUTHENTICATION_FAILED,
        ),
        (
            TopicError::KafkaTls {
                bootstrap,
                detail,
                source: Box::new(kafka()),
            },
            reason::KAFKA_TLS_FAILED,
        ),
        (
            TopicError::Client(kafka()),
            reason::INVALID_KAFKA_PROPERTIES,
        ),
        (
            TopicError::CreateTopic {
                topic: "t".into(),
                source: kafka(),
            },
            reason::TOPIC_OPERATION_FAILED,
        ),
    ];
    for (e, want) in cases {
        assert_eq!(reason::of_topics(&e), want, "{e:?}");
    }
}
