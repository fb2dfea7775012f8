//! The worker's HTTP endpoints (warp): `/healthz` (the process answers), `/readyz`
//! (every active task restored and running), `/metrics` (Prometheus) and `/v1/status`.
//! Read-only views of [`Shared`]; this module never touches state or Kafka.

use std::net::SocketAddr;
use std::sync::Arc;

use warp::Filter;
use warp::http::StatusCode;

use crate::status::Shared;

pub fn routes(
    shared: Arc<Shared>,
) -> impl Filter<Extract = (impl warp::Reply,), Error = warp::Rejection> + Clone {
    let s1 = shared.clone();
    let s2 = shared.clone();
    let s3 = shared;
    let healthz = warp::path!("healthz").map(move || {
        if s1.snapshot().is_some() {
            warp::reply::with_status("ok", StatusCode::OK)
        } else {
            warp::reply::with_status("engine state poisoned", StatusCode::INTERNAL_SERVER_ERROR)
        }
    });
    let readyz = warp::path!("readyz").map(move || {
        if s2.ready() {
            warp::reply::with_status("ready".to_string(), StatusCode::OK)
        } else {
            let why = s2
                .snapshot()
                .map(|s| {
                    let waiting: Vec<String> = s
                        .tasks
                        .iter()
                        .filter(|t| t.state != crate::status::TaskState::Running)
                        .map(|t| format!("task {} {:?}", t.task, t.state))
                        .collect();
                    format!("not ready: worker {}; {}", s.state, waiting.join(", "))
                })
                .unwrap_or_else(|| "not ready: engine state poisoned".into());
            warp::reply::with_status(why, StatusCode::SERVICE_UNAVAILABLE)
        }
    });
    let metrics = warp::path!("metrics").map(|| {
        warp::reply::with_header(
            crate::metrics::encode(),
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    });
    let status = warp::path!("v1" / "status").map(move || match s3.snapshot() {
        Some(s) => warp::reply::with_status(warp::reply::json(&s), StatusCode::OK),
        None => warp::reply::with_status(
            warp::reply::json(&serde_json::json!({"error": "engine state poisoned"})),
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
    });
    warp::get().and(healthz.or(readyz).or(metrics).or(status))
}

/// Serves until the process exits.
pub async fn serve(addr: SocketAddr, shared: Arc<Shared>) {
    warp::serve(routes(shared)).run(addr).await;
}
