//! Three real worker pods under the operator: the published assignment gives each of 12
//! tasks one active and one standby on different pods, every pod reports its own status
//! entry acknowledging that generation, `kubectl wait --for=condition=Ready` returns, the
//! output is exact, and every key is answered correctly from every pod (forwarded to its
//! owner), and from a standby with `allowStale`: the count's store, and the store of a
//! co-partitioned table, which a standby follows from the table's own topic. Only a
//! caller RBAC lets `get` `streamapps/query` is answered: no token 401, a token without
//! the right 403, the documented Role 200, also for a key another pod owns (the caller's
//! token travels with the forwarded query). `/metrics` is served on its own port, open,
//! and not on the query port.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use oxbow_crds::assignment::{Assignment, CONFIG_MAP_KEY};
use oxbow_e2e::credentials::service_account_token;
use oxbow_e2e::harness::{kafka, kubectl, unique, wait_for};
use oxbow_e2e::streams::{
    RunningApp, exact_running_counts, http_get, http_get_as, keys, produce, read_committed,
};

#[tokio::test]
async fn tasks_get_one_active_and_one_standby_apart_and_every_pod_answers_every_key() {
    let rows = unique("rows");
    kafka::create_topic(&rows, 12).await;
    let run = RunningApp::start("place", |a| a.with_table(&rows)).await;
    let (client, n, name, app) = (
        run.client.clone(),
        run.ns.name.as_str(),
        run.name().to_string(),
        &run.app,
    );
    let keys = keys(60);
    produce(&rows, &keys, 1, 7);
    produce(&app.source, &keys, 50, 3);

    // The output is exact: per key the running counts 1..=50, once each.
    let counts = wait_for(
        "every record to be counted in the committed output",
        Duration::from_secs(120),
        || async {
            let c = exact_running_counts(&read_committed(&app.sink()))?;
            let done = c.values().filter(|n| **n == 50).count();
            if done == keys.len() {
                Ok(c)
            } else {
                Err(format!("{done}/{} keys complete", keys.len()))
            }
        },
    )
    .await;
    assert_eq!(counts.len(), keys.len());

    // The assignment: 12 actives, 12 standbys, never on the active's pod, all pods busy.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), n);
    let cm = cms
        .get(&format!("{name}-assignment"))
        .await
        .expect("assignment ConfigMap");
    let a: Assignment = serde_json::from_str(
        cm.data
            .as_ref()
            .and_then(|d| d.get(CONFIG_MAP_KEY))
            .expect("assignment key"),
    )
    .expect("assignment JSON");
    assert_eq!(a.tasks.len(), 12, "{a:?}");
    for (t, p) in &a.tasks {
        assert_eq!(p.standbys.len(), 1, "task {t}: {p:?}");
        assert_ne!(
            p.standbys[0], p.active,
            "task {t}: standby on the active's pod"
        );
    }
    let actives: BTreeSet<&str> = a.tasks.values().map(|p| p.active.as_str()).collect();
    assert_eq!(actives.len(), 3, "every pod runs actives: {a:?}");

    // Every pod reports its own entry, acknowledging the published generation.
    let api = &run.api;
    let st = wait_for(
        "three status entries running the published assignment",
        Duration::from_secs(60),
        || async {
            let s = api
                .get(&name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            // At the generation, and running exactly what it assigns (a new active
            // runs as a standby while it waits for a release).
            let cur: Vec<_> = s
                .instances
                .iter()
                .filter(|i| i.assignment_generation == Some(a.generation))
                .filter(|i| {
                    let mine = |standby: bool| -> Vec<String> {
                        a.tasks
                            .iter()
                            .filter(|(_, p)| {
                                if standby {
                                    p.standbys.contains(&i.pod)
                                } else {
                                    p.active == i.pod
                                }
                            })
                            .map(|(t, _)| t.to_string())
                            .collect()
                    };
                    i.active_tasks == mine(false) && i.standby_tasks == mine(true)
                })
                .collect();
            if cur.len() == 3 {
                Ok(s)
            } else {
                Err(format!("{:?}", s.instances))
            }
        },
    )
    .await;
    let mut reported_active = BTreeMap::new();
    for i in &st.instances {
        for t in &i.active_tasks {
            assert!(
                reported_active.insert(t.clone(), i.pod.clone()).is_none(),
                "task {t} reported active twice"
            );
        }
        assert_eq!(i.standby_tasks.len(), 4, "{}: {:?}", i.pod, i.standby_tasks);
    }
    assert_eq!(reported_active.len(), 12);
    let (ok, table, _) = kubectl(&["get", "sapp", "-n", n, &name], None);
    assert!(ok && table.contains("Running"), "{table}");

    // Every key from every pod, forwarded to the owner when it is elsewhere.
    let addresses: Vec<(String, String)> = st
        .instances
        .iter()
        .map(|i| (i.pod.clone(), i.address.clone().expect("address")))
        .collect();
    for (pod, addr) in &addresses {
        for k in &keys {
            let (code, body) = http_get(addr, &format!("/v1/stores/totals/keys/{k}"))
                .await
                .expect("query");
            assert_eq!(code, 200, "{pod} for {k}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).expect("JSON answer");
            assert_eq!(v["value"]["count"], 50, "{pod} for {k}: {body}");
            assert_eq!(v["value"]["sum"], 150, "{pod} for {k}: {body}");
        }
    }
    // A standby answers with allowStale (once caught up) and says it is a standby.
    let (t, placement) = a.tasks.iter().next().expect("a task");
    let standby = &placement.standbys[0];
    let addr = &addresses
        .iter()
        .find(|(p, _)| p == standby)
        .expect("standby pod address")
        .1;
    let key = first_key(addr, &keys, |v| v["task"] == t.to_string())
        .await
        .expect("some key lives in the first task");
    wait_for(
        "the standby to answer the key, caught up",
        Duration::from_secs(30),
        || async {
            let (code, body) = http_get(
                addr,
                &format!("/v1/stores/totals/keys/{key}?allowStale=true"),
            )
            .await?;
            let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            if code == 200
                && v["servedBy"] == standby.as_str()
                && v["stale"] == true
                && v["value"]["count"] == 50
            {
                Ok(())
            } else {
                Err(format!("{code} {body}"))
            }
        },
    )
    .await;

    // The table's store on the same standby: followed from the table's topic.
    wait_for(
        "the standby to answer the table row, caught up",
        Duration::from_secs(30),
        || async {
            let (code, body) =
                http_get(addr, &format!("/v1/stores/rows/keys/{key}?allowStale=true")).await?;
            let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            if code == 200
                && v["servedBy"] == standby.as_str()
                && v["stale"] == true
                && v["value"]["amount"] == 7
            {
                Ok(())
            } else {
                Err(format!("{code} {body}"))
            }
        },
    )
    .await;

    // Who may ask: the Role of docs/queries.md, and nobody else.
    let rbac = format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: reader}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: stranger}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: query-{name}}}
rules:
- {{apiGroups: [oxbow.dev], resources: [streamapps/query], resourceNames: [{name}], verbs: [get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: query-{name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: query-{name}}}
subjects:
- {{kind: ServiceAccount, name: reader}}
"#
    );
    let (ok, _, err) = kubectl(&["apply", "-n", n, "-f", "-"], Some(&rbac));
    assert!(ok, "rbac: {err}");
    let reader = service_account_token(n, "reader");
    let stranger = service_account_token(n, "stranger");
    // A key that one pod must forward to its owner, which it reaches by the owner's DNS
    // name under the headless Service (`--peer-domain`): the answer proves cluster DNS.
    let (asked, addr) = &addresses[0];
    let forwarded = first_key(addr, &keys, |v| v["servedBy"] != asked.as_str())
        .await
        .expect("some key is owned by another pod");
    let path = format!("/v1/stores/totals/keys/{forwarded}");
    for (who, token, want) in [
        ("no token", None, 401),
        ("a token without the right", Some(stranger.as_str()), 403),
        ("a malformed token", Some("not-a-token"), 401),
    ] {
        for p in [
            path.as_str(),
            "/v1/status",
            "/v1/stores/totals/range?limit=5",
        ] {
            let (code, _, body) = http_get_as(addr, p, token).await.expect("answer");
            assert_eq!(code, want, "{who} on {p}: {body}");
            assert!(
                !body.contains("\"count\""),
                "{who} on {p} saw state: {body}"
            );
        }
    }
    // RBAC changes reach the API server at once, the worker's cache within 10 s.
    let body = wait_for(
        "the reader to be answered, through the owner of the key",
        Duration::from_secs(30),
        || async {
            let (code, _, body) = http_get_as(addr, &path, Some(&reader)).await?;
            (code == 200)
                .then_some(body.clone())
                .ok_or(format!("{code} {body}"))
        },
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["value"]["count"], 50, "{body}");
    assert_ne!(v["servedBy"], asked.as_str(), "not forwarded: {body}");
    let (code, _, body) = http_get_as(addr, "/healthz", None).await.expect("healthz");
    assert_eq!(code, 200, "the kubelet's probe needs no token: {body}");
    // Metrics on their own port, open to any scraper; not next to the queries.
    let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
    let (code, _, body) = http_get_as(&format!("{host}:9090"), "/metrics", None)
        .await
        .expect("metrics");
    assert_eq!(code, 200, "metrics need no token: {body}");
    assert!(body.contains("oxbow_worker_"), "worker metrics: {body}");
    let (code, _, body) = http_get_as(addr, "/metrics", None).await.expect("answer");
    assert_eq!(
        code, 404,
        "metrics are not served on the query port: {body}"
    );

    run.finish().await;
}

/// The first of `keys` whose answer from the pod at `addr` satisfies `wanted`.
async fn first_key(
    addr: &str,
    keys: &[String],
    wanted: impl Fn(&serde_json::Value) -> bool,
) -> Option<String> {
    for k in keys {
        let (_, body) = http_get(addr, &format!("/v1/stores/totals/keys/{k}"))
            .await
            .expect("query");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        if wanted(&v) {
            return Some(k.clone());
        }
    }
    None
}
