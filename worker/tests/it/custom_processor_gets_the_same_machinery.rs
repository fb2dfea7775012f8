//! The `Processor` trait gives Rust code the built-in steps' machinery: the example
//! worker `worker/examples/custom_processor.rs` (a `RiskScore` step with its own store)
//! runs a manifest; its store is changelogged, and a restart with the state dir deleted
//! rebuilds it, so counting continues where it stopped. And a step that never returns
//! (`worker/examples/stuck_step.rs`) fails `/healthz`, so the kubelet restarts the pod.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;
use serde_json::json;

fn example(name: &str) -> std::path::PathBuf {
    // target/release/deps/<this test> → target/release/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: `cargo test` builds examples; run it through cargo",
        p.display()
    );
    p
}

fn run_until_done(manifest: &std::path::Path, state: &std::path::Path, input: &str) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut child = Command::new(example("custom_processor"))
        .arg(manifest)
        .arg(state)
        .arg(addr.to_string())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(state.with_extension(format!("{port}.log"))).unwrap())
        .spawn()
        .unwrap();
    let ends = end_offsets(input);
    let done = || {
        let (code, body) = http_get(addr, "/v1/status")?;
        let s: serde_json::Value = serde_json::from_str(&body).ok()?;
        let tasks = s["tasks"].as_array()?;
        (code == 200
            && s["state"] == "Running"
            && !tasks.is_empty()
            && tasks.iter().all(|t| {
                task_id(t)
                    .is_some_and(|(_, p)| t["positions"][input].as_i64().unwrap_or(0) >= ends[&p])
            }))
        .then_some(())
    };
    wait_for(
        "the custom worker to commit all input",
        Duration::from_secs(60),
        || {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the custom worker exited early"
            );
            done()
        },
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success(), "clean exit on SIGTERM");
}

#[test]
fn a_custom_processor_store_is_changelogged_and_rebuilt() {
    let app = unique("custom");
    let input = format!("{app}-in");
    create_topic(&input, 1);
    create_topic(&format!("{app}-out"), 1);
    let dir = scratch_dir(&app);
    let manifest = dir.join("app.yaml");
    std::fs::write(
        &manifest,
        format!(
            r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {{name: {app}}}
spec:
  kafka: {{bootstrapServers: "{bootstrap}"}}
  source: {{topics: [{input}]}}
  sink: {{topic: {app}-out}}
"#,
            bootstrap = bootstrap()
        ),
    )
    .unwrap();
    let state = dir.join("state");
    let feed = |n: usize| {
        produce(
            &input,
            (0..n).map(|i| Input::json("c1", json!({"card": "c1", "amount": 500, "i": i}))),
        )
    };

    feed(3);
    run_until_done(&manifest, &state, &input);
    std::fs::remove_dir_all(&state).unwrap();
    feed(2);
    run_until_done(&manifest, &state, &input);

    let out = read_all(&format!("{app}-out"), "read_committed");
    assert_eq!(out.len(), 5);
    // risk = min(ln(seen) * amount / 1000, 1): seen counts 1..5 across the restart.
    let risks: Vec<f64> = out
        .iter()
        .map(|o| o.json()["risk"].as_f64().unwrap())
        .collect();
    let want: Vec<f64> = (1..=5)
        .map(|n: i32| ((n as f64).ln() * 0.5).min(1.0))
        .collect();
    assert_eq!(
        risks, want,
        "the count survived a lost state dir through the changelog"
    );
    let changelog = read_all(&format!("{app}-risk-changelog"), "read_committed");
    assert!(
        changelog.iter().any(|c| c.key.as_deref() == Some("c1")),
        "the custom store is changelogged"
    );
}

#[test]
fn a_step_that_never_returns_fails_healthz_while_an_idle_worker_passes_it() {
    let app = unique("stuck");
    let input = format!("{app}-in");
    create_topic(&input, 1);
    create_topic(&format!("{app}-out"), 1);
    let dir = scratch_dir(&app);
    let manifest = dir.join("app.yaml");
    std::fs::write(
        &manifest,
        app_manifest(
            &app,
            "at_least_once",
            &format!("  source: {{topics: [{input}]}}\n  sink: {{topic: {app}-out}}\n"),
        ),
    )
    .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let log = dir.join("stuck.log");
    let mut child = Command::new(example("stuck_step"))
        .arg("run")
        .arg("--config")
        .arg(&manifest)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--listen")
        .arg(addr.to_string())
        .env("OXBOW_LIVENESS_TIMEOUT", "3s")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let healthz = || http_get(addr, "/healthz");

    produce(&input, (0..3).map(|i| Input::json("k", json!({"i": i}))));
    wait_for(
        "the three records in the sink",
        Duration::from_secs(60),
        || {
            assert!(
                child.try_wait().unwrap().is_none(),
                "worker exited:\n{}",
                logs()
            );
            (read_all(&format!("{app}-out"), "read_uncommitted").len() == 3).then_some(())
        },
    );
    // Idle is not wedged: the loop keeps turning with nothing to read, for longer
    // than the timeout.
    holds_for(
        Duration::from_secs(5),
        Duration::from_millis(250),
        || match healthz() {
            Some((200, _)) => Ok(()),
            h => Err(format!(
                "an idle worker must stay healthy: {h:?}\n{}",
                logs()
            )),
        },
    );

    produce(&input, [Input::json("k", json!({"stuck": true}))]);
    let (_, why) = wait_for(
        "/healthz to fail once the loop is stuck past the 3 s timeout",
        Duration::from_secs(30),
        || healthz().filter(|(c, _)| *c == 503),
    );
    assert!(
        why.contains("no progress for") && why.contains("liveness timeout 3s"),
        "the probe says why: {why}"
    );
    assert_eq!(
        http_get(addr, "/readyz").map(|(c, _)| c),
        Some(200),
        "readiness is not what fails: the kubelet restarts on liveness"
    );
    let _ = child.kill();
    let _ = child.wait();
}
