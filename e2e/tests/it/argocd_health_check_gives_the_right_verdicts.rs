//! The Argo CD health check (`gitops/argocd/streamapp-health.lua`) run in Lua against
//! StreamApps with the statuses the operator writes: each gets the verdict a user of
//! Argo CD expects, and the copy inlined in `gitops/argocd/argocd-cm.yaml` is the same
//! script. Pure: no cluster needed.

use mlua::{Lua, LuaSerdeExt};
use oxbow_e2e::harness::workspace_root;
use serde_json::{Value, json};

fn script() -> String {
    std::fs::read_to_string(workspace_root().join("gitops/argocd/streamapp-health.lua"))
        .expect("the health script")
}

/// Runs the check on `obj` as Argo CD does (the object as global `obj`).
fn verdict(obj: &Value) -> (String, String) {
    let lua = Lua::new();
    let v = lua.to_value(obj).expect("object to Lua");
    lua.globals().set("obj", v).expect("set obj");
    let hs: mlua::Table = lua.load(script()).eval().expect("the script runs");
    (
        hs.get::<String>("status").expect("status"),
        hs.get::<String>("message").unwrap_or_default(),
    )
}

fn cond(t: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": t, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 3})
}

fn app(replicas: i64, observed: Option<i64>, conditions: Vec<Value>) -> Value {
    let mut o = json!({
        "apiVersion": "oxbow.dev/v1alpha1", "kind": "StreamApp",
        "metadata": {"name": "fraud", "generation": 3},
        "spec": {"replicas": replicas},
    });
    if let Some(g) = observed {
        o["status"] = json!({"observedGeneration": g, "conditions": conditions});
    }
    o
}

#[test]
fn each_status_the_operator_writes_gets_the_expected_health() {
    let ready = cond(
        "Ready",
        "True",
        "Ready",
        "topics exist, every worker is ready",
    );
    let not_stalled = cond("Stalled", "False", "NotStalled", "");
    let cases = [
        (
            "no status yet",
            app(3, None, vec![]),
            "Progressing",
            "Waiting",
        ),
        (
            "status for an older generation",
            app(3, Some(2), vec![ready.clone()]),
            "Progressing",
            "generation 3, observed 2",
        ),
        (
            "ready",
            app(3, Some(3), vec![ready.clone(), not_stalled.clone()]),
            "Healthy",
            "every worker is ready",
        ),
        (
            "scaled to zero",
            app(0, Some(3), vec![cond("Ready", "True", "Ready", "")]),
            "Suspended",
            "Scaled to zero",
        ),
        (
            "restoring",
            app(
                3,
                Some(3),
                vec![
                    cond(
                        "Ready",
                        "False",
                        "Restoring",
                        "1600/2000 records (80%), ETA 4s",
                    ),
                    not_stalled.clone(),
                ],
            ),
            "Progressing",
            "Restoring: 1600/2000 records (80%)",
        ),
        (
            "stalled on drift",
            app(
                3,
                Some(3),
                vec![
                    cond("Ready", "False", "ConfigDrift", "x"),
                    cond(
                        "Stalled",
                        "True",
                        "ConfigDrift",
                        "fraud-seen-changelog: min.cleanable.dirty.ratio: 0.5 (want 0.1)",
                    ),
                ],
            ),
            "Degraded",
            "ConfigDrift: fraud-seen-changelog",
        ),
        (
            "a failed task",
            app(
                3,
                Some(3),
                vec![
                    cond("Ready", "False", "TaskFailed", "worker failed"),
                    not_stalled,
                    cond(
                        "TasksAssigned",
                        "False",
                        "TaskFailed",
                        "worker failed: fraud-1: step map: boom",
                    ),
                ],
            ),
            "Degraded",
            "fraud-1: step map: boom",
        ),
    ];
    for (what, obj, status, message) in cases {
        let (s, m) = verdict(&obj);
        assert_eq!(s, status, "{what}: {m}");
        assert!(
            m.contains(message),
            "{what}: message {m:?} lacks {message:?}"
        );
    }
}

#[test]
fn the_configmap_inlines_the_same_script() {
    let text = std::fs::read_to_string(workspace_root().join("gitops/argocd/argocd-cm.yaml"))
        .expect("argocd-cm.yaml");
    let cm: Value = serde_yaml::from_str(&text).expect("YAML");
    let inlined = cm["data"]["resource.customizations.health.oxbow.dev_StreamApp"]
        .as_str()
        .expect("the health key");
    assert_eq!(
        inlined,
        script(),
        "regenerate argocd-cm.yaml from the script"
    );
}
