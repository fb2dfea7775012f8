//! The query service's point lookups: [`Queries`] gathers the facts about a key's task,
//! asks [`decide`] who answers, and reads the local store on the blocking pool or
//! forwards to the owner with reqwest.
//!
//! Owns: [`Queries`] (its state, `GET /v1/stores/{store}/keys/{key}[/windows]`, the
//! scatter over every task of a stage, forwarding, and passing another pod's answer
//! through). Must not touch: the routing decision itself (`routing.rs`), store bytes
//! (`read.rs` reads through `crate::steps::keys`), or Kafka. The range endpoint is in
//! `range.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use oxbow_crds::{StoreName, TaskId};
use serde_json::{Value as Json, json};

use super::HOP_HEADER;
use super::catalogue::{Catalog, StoreInfo};
use super::params::{BadRequest, Params, decode_segment, encode};
use super::read::read_entry;
use super::routing::{Decision, Facts, LocalCopy, decide, stale_candidates};
use super::wire::{Answer, unknown_task_count};
use crate::status::{RestoreProgress, Role, Routing, Shared, WorkerStatus};
use crate::store::StoreError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub(super) enum QueryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("failed to read the store: the blocking read was cancelled: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// What one endpoint asks of a task.
#[derive(Debug, Clone)]
struct Lookup {
    store: String,
    key: String,
    info: StoreInfo,
    windows: bool,
    params: Params,
    forwarded: bool,
}

impl Lookup {
    fn path(&self) -> String {
        format!(
            "/v1/stores/{}/keys/{}{}",
            encode(&self.store),
            encode(&self.key),
            if self.windows { "/windows" } else { "" }
        )
    }

    /// What every answer about `task` says it was about, and who answered.
    fn context(&self, task: TaskId, me: &str) -> Json {
        json!({
            "store": self.store, "key": self.key, "task": task.to_string(), "partition": task.partition, "servedBy": me,
        })
    }
}

/// The query service behind the HTTP routes.
pub struct Queries {
    pub(super) shared: Arc<Shared>,
    pub(super) catalog: Catalog,
    client: Result<reqwest::Client, String>,
}

impl Queries {
    /// The store's catalog entry, or the 404 that names the stores there are.
    pub(super) fn store_info(&self, store: &str) -> Result<StoreInfo, Answer> {
        self.catalog.stores.get(store).cloned().ok_or_else(|| {
            Answer::error(
                404,
                format!("store {store:?} does not exist; {}", self.catalog.known()),
                json!({ "store": store }),
            )
        })
    }

    pub fn new(shared: Arc<Shared>, catalog: Catalog) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(FORWARD_TIMEOUT)
            .no_proxy()
            .build()
            .map_err(|e| format!("failed to build the HTTP client for forwarding: {e}"));
        Self {
            shared,
            catalog,
            client,
        }
    }

    pub(super) fn me(routing: &Routing, status: Option<&WorkerStatus>) -> String {
        if routing.me.is_empty() {
            format!("instance-{}", status.map(|s| s.instance).unwrap_or(0))
        } else {
            routing.me.clone()
        }
    }

    pub(super) fn local_copy(
        &self,
        status: Option<&WorkerStatus>,
        task: TaskId,
    ) -> Option<LocalCopy> {
        let t = status?.tasks.iter().find(|t| t.task == task)?;
        Some(LocalCopy {
            role: t.role,
            state: t.state,
            state_lag: t.state_lag,
            restore: t.restore.clone(),
            last_error: t.last_error.clone(),
            open: self.shared.db(task).is_some(),
        })
    }

    /// `GET /v1/stores/{store}/keys/{key}[/windows]`.
    pub async fn key(
        &self,
        store: &str,
        key: &str,
        query: &HashMap<String, String>,
        windows: bool,
        forwarded: bool,
    ) -> Answer {
        let lookup = match self.lookup(store, key, query, windows, forwarded) {
            Ok(l) => l,
            Err(a) => return a,
        };
        if let super::catalogue::Layout::GlobalTable { .. } = lookup.info.layout {
            return self.global_row(&lookup).await;
        }
        let n = self.shared.routing().task_count;
        match self.partition_of(&lookup, n) {
            Ok(Some(t)) => {
                self.one_task(&lookup, TaskId::new(lookup.info.stage, t))
                    .await
            }
            Ok(None) => self.scatter(&lookup, n).await,
            Err(a) => a,
        }
    }

    /// The request, decoded and checked: the 400 or 404 that says what is wrong with it.
    fn lookup(
        &self,
        store: &str,
        key: &str,
        query: &HashMap<String, String>,
        windows: bool,
        forwarded: bool,
    ) -> Result<Lookup, Answer> {
        let (store, key) = match (decode_segment(store), decode_segment(key)) {
            (Ok(s), Ok(k)) => (s, k),
            (Err(e), _) | (_, Err(e)) => return Err(Answer::bad(e)),
        };
        let params = Params::parse(query, windows).map_err(Answer::bad)?;
        let info = self.store_info(&store)?;
        if windows && !info.layout.windowed() {
            return Err(Answer::bad(BadRequest(format!(
                "store {store:?} is a {} store, not a windowed aggregate: it has no windows; use /v1/stores/{store}/keys/{{key}}",
                info.layout.name()
            ))));
        }
        Ok(Lookup {
            store,
            key,
            info,
            windows,
            params,
            forwarded,
        })
    }

    /// The partition (of the store's stage, `n` tasks) that holds the key: `task=` when
    /// given, else from the key; `None` when any task may hold it.
    fn partition_of(&self, lookup: &Lookup, n: u32) -> Result<Option<u32>, Answer> {
        match lookup.params.task {
            Some(t) if n > 0 && t >= n => Err(Answer::bad(BadRequest(format!(
                "task={t} does not exist: the app has {n} tasks per stage (0 to {})",
                n - 1
            )))),
            Some(t) => Ok(Some(t)),
            None if n == 0 => Err(unknown_task_count()),
            None => self
                .catalog
                .partition_of(&lookup.info, &lookup.key, n)
                .map_err(|e| Answer::bad(BadRequest(e))),
        }
    }

    /// A key of a store whose keys are not partitioned (a `batch` without `groupBy`, a
    /// custom processor's store): every task of its stage is asked.
    async fn scatter(&self, lookup: &Lookup, n: u32) -> Answer {
        if n == 0 {
            return unknown_task_count();
        }
        let answers = futures::future::join_all(
            (0..n).map(|t| self.one_task(lookup, TaskId::new(lookup.info.stage, t))),
        )
        .await;
        let mut parts = Vec::new();
        let mut failed = Vec::new();
        let mut retry = None::<u64>;
        for (t, a) in answers.into_iter().enumerate() {
            match a.status {
                200 => parts.push(a.body),
                404 => {}
                _ => {
                    retry = match (retry, a.retry_after) {
                        (Some(x), Some(y)) => Some(x.max(y)),
                        (x, y) => x.or(y),
                    };
                    failed.push(json!({ "task": TaskId::new(lookup.info.stage, t as u32).to_string(), "status": a.status, "answer": a.body }));
                }
            }
        }
        let me = Self::me(&self.shared.routing(), self.shared.snapshot().as_ref());
        if !failed.is_empty() {
            let mut a = Answer::error(
                503,
                format!(
                    "store {:?} is not keyed by what its records are partitioned by, so any task may hold key {:?}, and {} of {n} tasks could not answer",
                    lookup.store,
                    lookup.key,
                    failed.len()
                ),
                json!({ "store": lookup.store, "key": lookup.key, "servedBy": me, "failedTasks": failed }),
            );
            a.retry_after = retry;
            return a;
        }
        let found = !parts.is_empty();
        Answer {
            status: if found { 200 } else { 404 },
            body: json!({
                "store": lookup.store,
                "key": lookup.key,
                "found": found,
                "routing": "scatter",
                "servedBy": me,
                "parts": parts,
            }),
            retry_after: None,
        }
    }

    /// One task's answer for a key: from here, from its owner, or why not.
    async fn one_task(&self, lookup: &Lookup, task: TaskId) -> Answer {
        let routing = self.shared.routing();
        let status = self.shared.snapshot();
        let me = Self::me(&routing, status.as_ref());
        let facts = Facts {
            me: &me,
            task,
            local: self.local_copy(status.as_ref(), task),
            placement: routing.placements.get(&task),
            addresses: &routing.addresses,
            forwarded: lookup.forwarded,
            allow_stale: lookup.params.allow_stale,
            max_staleness: lookup.params.max_staleness,
        };
        let context = lookup.context(task, &me);
        match decide(&facts) {
            Decision::Local => self.read_key(lookup, task, &me, None).await,
            Decision::StaleLocal { lag } => self.read_key(lookup, task, &me, Some(lag)).await,
            Decision::Forward { pod, addr } => {
                let a = self.forward(&addr, &pod, lookup, task, &me).await;
                if lookup.params.allow_stale && a.status == 503 {
                    for (pod, addr) in stale_candidates(&facts) {
                        let s = self.forward(&addr, &pod, lookup, task, &me).await;
                        if s.status != 503 {
                            return s;
                        }
                    }
                }
                a
            }
            Decision::StaleForward { pod, addr } => {
                // The first candidate decide chose, then the other standbys.
                let standbys = std::iter::once((pod, addr))
                    .chain(stale_candidates(&facts).into_iter().skip(1));
                self.first_standby(standbys, lookup, task, &me)
                    .await
                    .unwrap_or_else(|| {
                        Answer::error(503, format!("no copy of task {task} could answer"), context)
                    })
            }
            Decision::Restoring {
                retry_after,
                progress,
            } => restoring(context, task, &me, retry_after, progress),
            Decision::Unavailable(msg) => Answer::error(503, msg, context),
        }
    }

    /// Asks each standby in turn: the first answer that is not a 503, else the last
    /// answer (`None` without standbys).
    async fn first_standby(
        &self,
        standbys: impl Iterator<Item = (String, String)>,
        lookup: &Lookup,
        task: TaskId,
        me: &str,
    ) -> Option<Answer> {
        let mut last = None;
        for (pod, addr) in standbys {
            let s = self.forward(&addr, &pod, lookup, task, me).await;
            if s.status != 503 {
                return Some(s);
            }
            last = Some(s);
        }
        last
    }

    /// A global table's row: this worker holds the whole table, so it answers itself.
    async fn global_row(&self, lookup: &Lookup) -> Answer {
        let status = self.shared.snapshot();
        let me = Self::me(&self.shared.routing(), status.as_ref());
        let body = json!({ "store": lookup.store, "key": lookup.key, "servedBy": me });
        let Some(globals) = self.shared.globals.read().ok().and_then(|g| g.clone()) else {
            return Answer::error(
                503,
                format!("the global tables are still loading on {me}; retry"),
                body,
            );
        };
        let (table, key, layout) = (
            lookup.store.clone(),
            lookup.key.clone(),
            lookup.info.layout.clone(),
        );
        let read = tokio::task::spawn_blocking(move || {
            globals.global_row(&table, key.as_bytes()).map(|v| {
                v.map(|v| super::catalogue::decode_entry(&layout, &v, None, Default::default()))
            })
        })
        .await;
        match read {
            Ok(Ok(found)) => found_answer(body, found),
            Ok(Err(e)) => Answer::error(500, e.to_string(), body),
            Err(e) => Answer::error(500, QueryError::from(e).to_string(), body),
        }
    }

    /// Reads the key from the local copy of `task` on the blocking pool.
    async fn read_key(
        &self,
        lookup: &Lookup,
        task: TaskId,
        me: &str,
        stale: Option<i64>,
    ) -> Answer {
        let context = lookup.context(task, me);
        let Some(db) = self.shared.db(task) else {
            return Answer::error(
                503,
                format!("task {task} was closed on {me} while answering; retry"),
                context,
            );
        };
        let store = StoreName(lookup.store.clone());
        let layout = lookup.info.layout.clone();
        let key = lookup.key.clone();
        let filter = lookup.params.window;
        let read = tokio::task::spawn_blocking(move || -> Result<Option<Json>, StoreError> {
            read_entry(&db, &store, &layout, &key, filter)
        })
        .await
        .map_err(QueryError::from)
        .and_then(|r| r.map_err(QueryError::from));
        let mut body = context;
        let role = if stale.is_some() {
            self.local_copy(self.shared.snapshot().as_ref(), task)
                .map_or(Role::Standby, |l| l.role)
        } else {
            Role::Active
        };
        match read {
            Ok(found) => {
                if let Some(o) = body.as_object_mut() {
                    o.insert("role".into(), json!(role));
                    o.insert("stale".into(), json!(stale.is_some()));
                    if let Some(lag) = stale {
                        o.insert("lagRecords".into(), json!(lag));
                    }
                }
                found_answer(body, found)
            }
            Err(e) => Answer::error(500, e.to_string(), body),
        }
    }

    async fn forward(
        &self,
        addr: &str,
        pod: &str,
        lookup: &Lookup,
        task: TaskId,
        me: &str,
    ) -> Answer {
        let url = format!(
            "http://{addr}{}?{}",
            lookup.path(),
            lookup.params.query(Some(task.partition), lookup.windows)
        );
        self.get(&url, pod, me, lookup.context(task, me)).await
    }

    /// A GET to another pod, passed through: its status, JSON body and Retry-After.
    pub(super) async fn get(&self, url: &str, pod: &str, me: &str, context: Json) -> Answer {
        let client = match &self.client {
            Ok(c) => c,
            Err(e) => return Answer::error(503, e.clone(), context),
        };
        let mut request = client.get(url).header(HOP_HEADER, me);
        if let Ok(Some(token)) = super::AUTHORIZATION.try_with(|t| t.clone()) {
            request = request.header(reqwest::header::AUTHORIZATION, token);
        }
        let resp = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                return Answer::error(503, format!("failed to reach {pod} ({url}): {e}"), context);
            }
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        match resp.bytes().await {
            Ok(b) => match serde_json::from_slice::<Json>(&b) {
                Ok(body) => Answer {
                    status,
                    body,
                    retry_after,
                },
                Err(e) => Answer::error(
                    502,
                    format!("failed to read the answer of {pod} ({url}): not JSON: {e}"),
                    context,
                ),
            },
            Err(e) => Answer::error(
                503,
                format!("failed to read the answer of {pod} ({url}): {e}"),
                context,
            ),
        }
    }
}

/// The 503 of an owner that is restoring here, with when to come back.
fn restoring(
    mut body: Json,
    task: TaskId,
    me: &str,
    retry_after: u64,
    progress: Option<RestoreProgress>,
) -> Answer {
    if let Some(o) = body.as_object_mut() {
        o.insert("retryAfterSeconds".into(), json!(retry_after));
        o.insert("restore".into(), json!(progress));
    }
    let mut a = Answer::error(
        503,
        format!(
            "task {task} is restoring on {me}; retry in {retry_after}s (or pass allowStale=true to read a standby)"
        ),
        body,
    );
    a.retry_after = Some(retry_after);
    a
}

/// A point lookup's answer: `body` with `found` and the entry's fields; 200, or 404.
fn found_answer(mut body: Json, found: Option<Json>) -> Answer {
    let status = if found.is_some() { 200 } else { 404 };
    if let Some(o) = body.as_object_mut() {
        o.insert("found".into(), json!(found.is_some()));
        if let Some(Json::Object(fields)) = found {
            o.extend(fields);
        }
    }
    Answer {
        status,
        body,
        retry_after: None,
    }
}
