//! A worker that cannot listen where it was told must say so and exit: before, the
//! HTTP server's bind panicked on a runtime thread, and the worker ran on without its
//! probes, status and queries (a benchmark waited on it for a quarter of an hour).

use std::process::{Command, Stdio};
use std::time::Duration;

use oxbow_testkit::wait::Deadline;

use crate::support::scratch_dir;

#[test]
fn a_worker_whose_listen_port_is_taken_exits_with_an_error_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let addr = taken.local_addr().expect("its address").to_string();
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/dedupe.yaml");
    let state = scratch_dir("taken-port");
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxbow-worker"))
        .args([
            "run",
            "--config",
            manifest,
            "--listen",
            &addr,
            "--state-dir",
        ])
        .arg(&state)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start oxbow-worker");
    let deadline = Deadline::after(Duration::from_secs(30));
    let status = loop {
        if let Some(status) = child.try_wait().expect("the worker's status") {
            break status;
        }
        deadline.next_poll(Duration::from_millis(50), || {
            let _ = child.kill();
            format!("the worker with --listen {addr} (taken) did not exit")
        });
    };
    let out = child.wait_with_output().expect("the worker's output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !status.success(),
        "a worker without its port must fail: {err}"
    );
    assert!(
        err.contains(&format!("cannot listen on {addr} (--listen)")),
        "the error names the address and the flag: {err}"
    );
    drop(taken);
    let _ = std::fs::remove_dir_all(&state);
}
