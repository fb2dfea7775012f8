//! At-least-once fencing (issue 16, item 2). Exactly-once fences a zombie with the
//! transactional ids; at-least-once has nothing in Kafka that could. A worker that can
//! no longer write its report (cut off from the API server, but not from Kafka) must
//! stop processing before another pod takes its tasks: its lease (20 s) runs out before
//! the new owner's wait for a silent holder (30 s) does.
//!
//! Real parts: the local stack's API server and Kafka, the real `oxbow-worker` binary in
//! coordinated mode. The test plays the operator (it writes the assignment) and cuts
//! one worker's API access with a TCP proxy between that worker and the API server.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use oxbow_crds::assignment::Assignment;
use oxbow_e2e::harness::{
    Deadline, TestNamespace, install_crd, kube_client, stack_var, unique, wait_for,
};
use oxbow_e2e::streams::{produce, read_committed};
use oxbow_e2e::workers::{WorkerProc, assignment, placement, played_app, publish};

/// A TCP proxy to the API server that the test can cut: it refuses new connections and
/// shuts the open ones, as a network partition would.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c, o) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if c.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let mut held = o.lock().unwrap();
                held.push(client.try_clone().unwrap());
                held.push(server.try_clone().unwrap());
                drop(held);
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Self { port, cut, open }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}

/// The admin kubeconfig with its server replaced by `https://127.0.0.1:<port>`.
fn kubeconfig_via(port: u16, dir: &Path) -> PathBuf {
    let original = std::fs::read_to_string(stack_var("KUBECONFIG")).unwrap();
    let server = original
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .unwrap()
        .trim()
        .to_string();
    let path = dir.join(format!("kubeconfig-{port}"));
    std::fs::write(
        &path,
        original.replace(&server, &format!("https://127.0.0.1:{port}")),
    )
    .unwrap();
    path
}

fn api_server_address() -> String {
    let kc = std::fs::read_to_string(stack_var("KUBECONFIG")).unwrap();
    let server = kc
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .unwrap()
        .trim();
    server.trim_start_matches("https://").to_string()
}

/// Both tasks on `pod`.
fn all_to(pod: &str, previous: Option<(&str, i64)>, generation: i64, pods: &[&str]) -> Assignment {
    let previous: Vec<(&str, i64)> = previous.into_iter().collect();
    assignment(generation, [0, 1].map(|_| placement(pod, &previous)), pods)
}

#[tokio::test]
async fn an_at_least_once_worker_cut_off_from_the_api_server_stops_before_the_new_owner_starts() {
    install_crd();
    let client = kube_client().await;
    let ns = TestNamespace::create(&client, "lease").await;
    let played = played_app(&ns.name, &unique("lease"), "at_least_once", 2).await;
    let (app, source, dir, config) = (&played.name, &played.source, &played.dir, &played.config);
    let (a_pod, b_pod) = (format!("{app}-0"), format!("{app}-1"));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    publish(&cms, app, &all_to(&a_pod, None, 1, &[&a_pod])).await;

    let proxy = Proxy::start(api_server_address());
    let a = WorkerProc::start(
        &ns.name,
        app,
        &a_pod,
        config,
        dir,
        &kubeconfig_via(proxy.port, dir),
    );
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    produce(source, &keys, 10, 1);
    wait_for(
        "worker A to run both tasks",
        Duration::from_secs(90),
        || async {
            (a.running().len() == 2)
                .then_some(())
                .ok_or_else(|| a.logs())
        },
    )
    .await;
    wait_for(
        "A's report in its Lease",
        Duration::from_secs(30),
        || async {
            oxbow_e2e::reports::entry(&client, &ns.name, &a_pod)
                .await
                .map(|_| ())
                .ok_or_else(|| "no report".to_string())
        },
    )
    .await;

    // A loses the API server, not Kafka; the tasks move to B (A is still listed, so B
    // waits for A's entry to go silent, as it would for a pod the operator still sees).
    proxy.cut();
    let cut_at = Instant::now();
    publish(
        &cms,
        app,
        &all_to(&b_pod, Some((&a_pod, 2)), 2, &[&a_pod, &b_pod]),
    )
    .await;
    let b = WorkerProc::start(
        &ns.name,
        app,
        &b_pod,
        config,
        dir,
        Path::new(&stack_var("KUBECONFIG")),
    );
    produce(source, &keys, 10, 1);
    let mut a = a;
    let deadline = Deadline::after(Duration::from_secs(90).saturating_sub(cut_at.elapsed()));
    let (mut a_exit, mut b_run) = (None, None);
    loop {
        if a_exit.is_none() && a.child.try_wait().unwrap().is_some() {
            a_exit = Some(cut_at.elapsed());
        }
        if b_run.is_none() && b.running().len() == 2 {
            b_run = Some(cut_at.elapsed());
        }
        if a_exit.is_some() && b_run.is_some() {
            break;
        }
        deadline
            .next_poll_async(Duration::from_millis(100), || {
                format!(
                    "after the cut: A exited {a_exit:?}, B running both tasks {b_run:?} (time after the cut)\n--- A\n{}\n--- B\n{}",
                    a.logs(),
                    b.logs()
                )
            })
            .await;
    }
    assert!(
        a_exit < b_run,
        "B ran the tasks {b_run:?} after the cut, A stopped only {a_exit:?} after it: both processed"
    );
    assert!(
        a.logs()
            .contains("stopped processing: no report write reached the API server"),
        "A says why it stopped:\n{}",
        a.logs()
    );

    // Nothing counted twice in the state: every key's count reaches 20 and never more.
    wait_for(
        "every key counted 20 times by B",
        Duration::from_secs(90),
        || async {
            let mut max: BTreeMap<String, u64> = BTreeMap::new();
            for (k, v) in read_committed(&format!("{app}-out")) {
                let c = v["count"].as_u64().unwrap_or(0);
                assert!(
                    c <= 20,
                    "key {k} counted {c} times, 20 records: counted twice"
                );
                let m = max.entry(k).or_default();
                *m = (*m).max(c);
            }
            (max.len() == 20 && max.values().all(|c| *c == 20))
                .then_some(())
                .ok_or_else(|| format!("{max:?}\n--- B\n{}", b.logs()))
        },
    )
    .await;
    drop(b);
    ns.delete().await;
}
