//! The worker's HTTP endpoints (warp): `/healthz` (the process answers), `/readyz`
//! (every active task restored and running), `/metrics` (Prometheus; on its own port
//! under the operator, `--metrics-listen`), `/v1/status`, and
//! the interactive queries under `/v1/stores` (see [`crate::query`] and
//! `docs/queries.md`). Read-only views of [`Shared`] and the stores; this module never
//! touches Kafka. `/v1/...` serves only callers [`Access`] lets in; the probes and the
//! metrics (no secrets, no state) stay open for the kubelet and Prometheus.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::net::TcpListener;
use warp::Filter;
use warp::http::StatusCode;

use crate::auth::Access;
use crate::query::{AUTHORIZATION, Answer, Catalog, HOP_HEADER, Queries};
use crate::status::Shared;

/// A request [`Access`] turned away, with its status and message.
#[derive(Debug)]
struct Refused(u16, String);

impl warp::reject::Reject for Refused {}

/// Passes the request's `Authorization` header on when [`Access`] lets it in.
fn allowed(
    access: Arc<Access>,
) -> impl Filter<Extract = (Option<String>,), Error = warp::Rejection> + Clone {
    warp::header::optional::<String>("authorization").and_then(move |h: Option<String>| {
        let access = access.clone();
        async move {
            let verdict = access.check(h.as_deref()).await;
            let (ns, app) = access.target();
            match verdict.refusal(ns, app) {
                None => Ok(h),
                Some((code, message)) => Err(warp::reject::custom(Refused(code, message))),
            }
        }
    })
}

async fn refused(r: warp::Rejection) -> Result<warp::http::Response<String>, warp::Rejection> {
    match r.find::<Refused>() {
        Some(Refused(code, message)) => Ok(reply(Answer {
            status: *code,
            body: serde_json::json!({ "error": message }),
            retry_after: None,
        })),
        None => Err(r),
    }
}

pub fn routes(
    shared: Arc<Shared>,
    catalog: Catalog,
    access: Arc<Access>,
    with_metrics: bool,
) -> impl Filter<Extract = (impl warp::Reply,), Error = warp::Rejection> + Clone {
    let queries = Arc::new(Queries::new(shared.clone(), catalog));
    let auth = move || allowed(access.clone());
    let s1 = shared.clone();
    let s2 = shared.clone();
    let s3 = shared;
    let healthz = warp::path!("healthz").map(move || {
        let (body, code) = liveness(&s1);
        warp::reply::with_status(body, code)
    });
    let readyz = warp::path!("readyz").map(move || {
        let (body, code) = readiness(&s2);
        warp::reply::with_status(body, code)
    });
    // Served on its own port when there is one: not found here then.
    let metrics = warp::path!("metrics")
        .and_then(move || async move {
            if with_metrics {
                Ok(())
            } else {
                Err(warp::reject::not_found())
            }
        })
        .untuple_one()
        .and(metrics());
    let status = warp::path!("v1" / "status")
        .and(auth())
        .map(move |_| match s3.snapshot() {
            Some(s) => warp::reply::with_status(warp::reply::json(&s), StatusCode::OK),
            None => warp::reply::with_status(
                warp::reply::json(&serde_json::json!({"error": "engine state poisoned"})),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        });
    let with = move || {
        let q = queries.clone();
        warp::any().map(move || q.clone())
    };
    let params = || warp::query::<HashMap<String, String>>();
    let hop = || warp::header::optional::<String>(HOP_HEADER);
    // A forwarded query carries the caller's token on (see `query::AUTHORIZATION`), so
    // the pod that answers checks the caller, not the forwarder.
    // `/keys/{key}` and `/keys/{key}/windows`: one handler, `windows` says which.
    let windows_suffix = warp::path("windows")
        .and(warp::path::end())
        .map(|| true)
        .or(warp::path::end().map(|| false))
        .unify();
    let key = warp::path!("v1" / "stores" / String / "keys" / String / ..)
        .and(windows_suffix)
        .and(auth())
        .and(params())
        .and(hop())
        .and(with())
        .then(
            |store: String,
             key: String,
             windows: bool,
             token: Option<String>,
             q: HashMap<String, String>,
             hop: Option<String>,
             s: Arc<Queries>| async move {
                let answer = s.key(&store, &key, &q, windows, hop.is_some());
                reply(AUTHORIZATION.scope(token, answer).await)
            },
        );
    let range = warp::path!("v1" / "stores" / String / "range")
        .and(auth())
        .and(params())
        .and(hop())
        .and(with())
        .then(
            |store: String,
             token: Option<String>,
             q: HashMap<String, String>,
             hop: Option<String>,
             s: Arc<Queries>| async move {
                let answer = s.range(&store, &q, hop.is_some());
                reply(AUTHORIZATION.scope(token, answer).await)
            },
        );
    warp::get()
        .and(healthz.or(readyz).or(metrics).or(status).or(key).or(range))
        .recover(refused)
}

/// `/healthz`: fails only when the processing loop is wedged (or its state poisoned).
fn liveness(s: &Shared) -> (String, StatusCode) {
    use crate::liveness::Verdict;
    if s.snapshot().is_none() {
        return (
            "engine state poisoned".to_string(),
            StatusCode::INTERNAL_SERVER_ERROR,
        );
    }
    match s.liveness.verdict() {
        Verdict::NotStarted | Verdict::Alive => ("ok".to_string(), StatusCode::OK),
        Verdict::Wedged { silent } => (
            format!(
                "the processing loop has made no progress for {}s (liveness timeout {}s)",
                silent.as_secs(),
                s.liveness.timeout().as_secs()
            ),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
    }
}

/// `/readyz`: ready once every task runs; otherwise what it waits for.
fn readiness(s: &Shared) -> (String, StatusCode) {
    if s.ready() {
        return ("ready".to_string(), StatusCode::OK);
    }
    let why = s
        .snapshot()
        .map(|s| {
            let waiting: Vec<String> = s
                .tasks
                .iter()
                .filter(|t| t.state != crate::status::TaskState::Running)
                .map(|t| format!("task {} {:?}", t.task, t.state))
                .chain(
                    s.waiting_for_release
                        .iter()
                        .map(|t| format!("task {t} waits for its previous owner")),
                )
                .collect();
            format!("not ready: worker {}; {}", s.state, waiting.join(", "))
        })
        .unwrap_or_else(|| "not ready: engine state poisoned".into());
    (why, StatusCode::SERVICE_UNAVAILABLE)
}

/// A query answer as HTTP: its status, the JSON body, and `Retry-After` when set.
fn reply(a: Answer) -> warp::http::Response<String> {
    let mut b = warp::http::Response::builder()
        .status(StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json");
    if let Some(s) = a.retry_after {
        b = b.header("retry-after", s.to_string());
    }
    let body = serde_json::to_string(&a.body).unwrap_or_else(|_| "{}".into());
    b.body(body).unwrap_or_else(|_| {
        let mut r = warp::http::Response::new("{\"error\":\"failed to build the answer\"}".into());
        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        r
    })
}

/// `/metrics`: the Prometheus text (no secrets, no state: open to any caller).
fn metrics() -> impl Filter<Extract = (impl warp::Reply,), Error = std::convert::Infallible> + Clone
{
    warp::any().map(|| {
        warp::reply::with_header(
            crate::metrics::encode(),
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    })
}

/// Serves on `listener` until the process exits.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    catalog: Catalog,
    access: Access,
    with_metrics: bool,
) {
    warp::serve(routes(shared, catalog, Arc::new(access), with_metrics))
        .incoming(listener)
        .run()
        .await;
}

/// Serves `/metrics` alone on `listener` until the process exits.
pub async fn serve_metrics(listener: TcpListener) {
    let route = warp::get().and(warp::path!("metrics")).and(metrics());
    warp::serve(route).incoming(listener).run().await;
}
