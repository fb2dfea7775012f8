//! A record that cannot be produced because it is over a topic's size limit (issue 16,
//! item 5) is that record's error under `errors.policy`, not a stopped engine that
//! replays it forever: a 1.2 MB output becomes a dead letter saying why, a 1.2 MB dead
//! letter goes out truncated with its original size and digest, and the records after
//! them flow, each exactly once.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::support::*;
use serde_json::json;

const BIG: usize = 1_200_000;
/// The source takes records of up to 2 MB; the sink and the dead-letter topic keep the
/// broker's default limit (about 1 MB).
const LARGE_TOPIC: &[(&str, &str)] = &[("max.message.bytes", "2000000")];
const LARGE_PRODUCER: &[(&str, &str)] = &[("message.max.bytes", "2000000")];

fn inputs(app: &str) {
    let pad = "x".repeat(BIG);
    let malformed = format!("{{\"id\": \"broken\", \"pad\": \"{pad}");
    produce_with(
        &format!("{app}-in"),
        [
            Input::json("a", json!({"id": "a"})),
            Input::json("big", json!({"id": "big", "pad": pad})),
            Input::json("b", json!({"id": "b"})),
            Input::raw("broken", malformed.as_bytes()),
            Input::json("c", json!({"id": "c"})),
        ]
        .map(|i| i.partition(0)),
        LARGE_PRODUCER,
    );
}

fn run(guarantee: &str) {
    let app = unique(&format!("too-large-{}", &guarantee[..5]));
    create_topic_with(&format!("{app}-in"), 1, LARGE_TOPIC);
    create_topic(&format!("{app}-out"), 1);
    inputs(&app);
    let manifest = app_manifest(
        &app,
        guarantee,
        &format!(
            "  source: {{topics: [{app}-in]}}\n  steps:\n  - map: {{value: \"value\"}}\n  sink: {{topic: {app}-out}}\n  errors: {{policy: deadLetter}}\n"
        ),
    );
    let dir = scratch_dir(&app);
    let mut w = WorkerBuilder::new(manifest, &dir.join("state")).spawn();
    w.wait_ready(Duration::from_secs(90));
    let input = format!("{app}-in");
    w.wait_committed(&input, &end_offsets(&input), Duration::from_secs(120));
    assert!(
        w.exited().is_none(),
        "the worker keeps running:\n{}",
        w.logs()
    );

    let isolation = "read_committed";
    let mut ids: Vec<String> = read_all(&format!("{app}-out"), isolation)
        .iter()
        .map(|o| o.json()["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, ["a", "b", "c"], "the records around them, each once");

    let dead = read_all(&format!("{app}-dlq"), isolation);
    assert_eq!(
        dead.len(),
        2,
        "one dead letter each: {:?}",
        dead.iter().map(|d| &d.headers).collect::<Vec<_>>()
    );
    let output = dead
        .iter()
        .find(|d| d.headers.get("oxbow.reason").map(String::as_str) == Some("RecordTooLarge"))
        .unwrap_or_else(|| {
            panic!(
                "a RecordTooLarge dead letter: {:?}",
                dead.iter().map(|d| &d.headers).collect::<Vec<_>>()
            )
        });
    assert_eq!(output.headers["oxbow.output.topic"], format!("{app}-out"));
    assert!(
        output.headers["oxbow.error"].contains("limit"),
        "{:?}",
        output.headers
    );
    let malformed = dead
        .iter()
        .find(|d| d.key.as_deref() == Some("broken"))
        .expect("the malformed record's dead letter");
    for d in [output, malformed] {
        assert_eq!(
            d.headers.get("oxbow.truncated").map(String::as_str),
            Some("true")
        );
        let size: usize = d.headers["oxbow.original.size"].parse().unwrap();
        assert!(size > BIG, "original size {size}");
        assert_eq!(d.headers["oxbow.original.sha256"].len(), 64);
        let kept = d.value.as_ref().map_or(0, Vec::len);
        assert!(kept > 900_000 && kept < 1_000_000, "kept {kept} bytes");
    }
    w.stop();
}

#[test]
fn oversized_outputs_and_dead_letters_never_stop_a_partition_under_exactly_once() {
    run("exactly_once");
}

#[test]
fn oversized_outputs_and_dead_letters_never_stop_a_partition_under_at_least_once() {
    run("at_least_once");
}
