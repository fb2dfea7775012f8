//! The range endpoint: a page of a store's entries in key order, from every task of the
//! store's stage. This pod reads the tasks it holds actively, asks each other owner once
//! (`local=true`) for the tasks it holds, and merges the answers.
//!
//! Owns: `GET /v1/stores/{store}/range`, the local reads on the blocking pool, and the
//! merge ([`Merge`]: which tasks are covered, why others are not, the page and its
//! cursor). Must not touch: the routing decision (`routing.rs`), store bytes
//! (`read.rs`), or the bodies' shapes (`wire.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use oxbow_crds::{StoreName, TaskId};
use serde::Deserialize;
use serde_json::json;

use super::catalogue::StoreInfo;
use super::params::{BadRequest, Params, decode_segment, encode};
use super::read::read_range;
use super::routing::{Decision, Facts, decide};
use super::serve::{Queries, QueryError};
use super::wire::{Answer, ErrorBody, LocalRange, RangeEntry, to_json, unknown_task_count};
use crate::status::{Role, Routing, TaskState, WorkerStatus};
use crate::store::{StoreError, TaskDb};

/// Entries keyed for the merge: (key bytes, partition), so a page is in key order and a
/// key held by several tasks (a store that is not keyed) is ordered by task.
type Keyed = ((Vec<u8>, u32), RangeEntry);

impl Queries {
    /// `GET /v1/stores/{store}/range?from=&to=&limit=[&local=true]`.
    pub async fn range(
        &self,
        store: &str,
        query: &HashMap<String, String>,
        forwarded: bool,
    ) -> Answer {
        let (store, params, info) = match self.range_request(store, query) {
            Ok(r) => r,
            Err(a) => return a,
        };
        let routing = self.shared.routing();
        let status = self.shared.snapshot();
        let me = Self::me(&routing, status.as_ref());
        // Every pod reads `limit + 1` per task: the first entry past the page is the
        // cursor, and the global first `limit + 1` are among each task's first.
        let want = params.limit + 1;
        let local = self
            .local_range(&store, &info, &params, want, status.as_ref())
            .await;
        let (covered, mut entries) = match local {
            Ok(x) => x,
            Err(e) => {
                return Answer::error(
                    500,
                    e.to_string(),
                    json!({ "store": store, "servedBy": me }),
                );
            }
        };
        if params.local || forwarded {
            entries.truncate(want);
            let answer = LocalRange {
                store,
                served_by: me,
                tasks: covered,
                entries: entries.into_iter().map(|(_, e)| e).collect(),
            };
            return Answer::ok(answer.into_json());
        }
        let n = routing.task_count;
        if n == 0 {
            return unknown_task_count();
        }
        let mut merge = Merge::new(n, covered, entries);
        let owners = self.owners(&mut merge, &routing, status.as_ref(), &me, info.stage);
        // The owners read `limit + 1` per task themselves.
        let query = format!(
            "{}&limit={}&local=true",
            params.query(None, false),
            params.limit
        );
        let path = format!("/v1/stores/{}/range", encode(&store));
        let remote = futures::future::join_all(owners.iter().map(|(pod, addr)| {
            let url = format!("http://{addr}{path}?{query}");
            let me = me.clone();
            async move { (pod.clone(), self.get(&url, pod, &me, json!({})).await) }
        }))
        .await;
        for (pod, a) in remote {
            merge.take(&pod, a);
        }
        merge.page(&store, &params, &me, info.stage)
    }

    /// The request, decoded and checked: the 400 or 404 that says what is wrong with it.
    fn range_request(
        &self,
        store: &str,
        query: &HashMap<String, String>,
    ) -> Result<(String, Params, StoreInfo), Answer> {
        let store = decode_segment(store).map_err(Answer::bad)?;
        let params = Params::parse(query, false).map_err(Answer::bad)?;
        let info = self.store_info(&store)?;
        if let super::catalogue::Layout::GlobalTable { .. } = info.layout {
            return Err(Answer::bad(BadRequest(format!(
                "store {store:?} is a global table: it answers point lookups (/v1/stores/{store}/keys/{{key}}), not ranges"
            ))));
        }
        if let (Some(f), Some(t)) = (&params.from, &params.to)
            && f.as_bytes() > t.as_bytes()
        {
            return Err(Answer::bad(BadRequest(format!(
                "from={f:?} is after to={t:?}: the range is [from, to)"
            ))));
        }
        Ok((store, params, info))
    }

    /// The other owners to ask once each for everything they hold actively (pod →
    /// address); tasks no one can answer for go into `merge`'s problems.
    fn owners(
        &self,
        merge: &mut Merge,
        routing: &Routing,
        status: Option<&WorkerStatus>,
        me: &str,
        stage: u32,
    ) -> BTreeMap<String, String> {
        let mut owners = BTreeMap::new();
        for t in merge.uncovered() {
            let task = TaskId::new(stage, t);
            let facts = Facts {
                me,
                task,
                local: self.local_copy(status, task),
                placement: routing.placements.get(&task),
                addresses: &routing.addresses,
                forwarded: false,
                allow_stale: false,
                max_staleness: 0,
            };
            match decide(&facts) {
                Decision::Forward { pod, addr } => {
                    owners.insert(pod, addr);
                }
                Decision::Restoring { retry_after, .. } => {
                    merge.retry_at_least(retry_after);
                    merge
                        .problems
                        .push(format!("task {t} is restoring on {me}"));
                }
                Decision::Unavailable(m) => merge.problems.push(m),
                // Reads of local running actives were done above; stale reads are not
                // asked for here.
                Decision::Local | Decision::StaleLocal { .. } | Decision::StaleForward { .. } => {
                    merge
                        .problems
                        .push(format!("task {t} was not readable on {me}"));
                }
            }
        }
        owners
    }

    /// The range from every task this pod holds actively and running, on the blocking
    /// pool: the tasks read, and their entries sorted by (key, task).
    async fn local_range(
        &self,
        store: &str,
        info: &StoreInfo,
        params: &Params,
        want: usize,
        status: Option<&WorkerStatus>,
    ) -> Result<(Vec<u32>, Vec<Keyed>), QueryError> {
        let dbs: Vec<(TaskId, Arc<TaskDb>)> = status
            .map(|s| {
                s.tasks
                    .iter()
                    .filter(|t| t.role == Role::Active && t.state == TaskState::Running)
                    .filter(|t| t.task.stage == info.stage)
                    .filter_map(|t| self.shared.db(t.task).map(|d| (t.task, d)))
                    .collect()
            })
            .unwrap_or_default();
        let store = StoreName(store.to_string());
        let layout = info.layout.clone();
        let (from, to) = (params.from.clone(), params.to.clone());
        let read = tokio::task::spawn_blocking(move || {
            let mut covered = Vec::new();
            let mut out = Vec::new();
            for (task, db) in dbs {
                for (k, e) in
                    read_range(&db, &store, &layout, from.as_deref(), to.as_deref(), want)?
                {
                    out.push(((k, task.partition), RangeEntry::at_task(e, task)));
                }
                covered.push(task.partition);
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            out.truncate(want);
            Ok::<_, StoreError>((covered, out))
        })
        .await??;
        Ok(read)
    }
}

/// A range being merged from this pod's tasks and the other owners' answers. Pure.
struct Merge {
    /// Tasks per stage.
    n: u32,
    /// Partitions whose entries are in `entries`.
    covered: BTreeSet<u32>,
    entries: Vec<Keyed>,
    /// Why tasks could not be read, for the 503.
    problems: Vec<String>,
    /// The longest Retry-After of a restoring owner.
    retry: Option<u64>,
}

impl Merge {
    fn new(n: u32, covered: Vec<u32>, entries: Vec<Keyed>) -> Self {
        Self {
            n,
            covered: covered.into_iter().collect(),
            entries,
            problems: Vec::new(),
            retry: None,
        }
    }

    /// The partitions no one has answered for yet, in order.
    fn uncovered(&self) -> Vec<u32> {
        (0..self.n).filter(|t| !self.covered.contains(t)).collect()
    }

    fn retry_at_least(&mut self, secs: u64) {
        self.retry = Some(self.retry.map_or(secs, |r| r.max(secs)));
    }

    /// Takes an owner's `local=true` answer: the entries of the tasks it read that no
    /// one else answered for, or why it could not answer.
    fn take(&mut self, pod: &str, a: Answer) {
        if a.status != 200 {
            if let Some(r) = a.retry_after {
                self.retry_at_least(r);
            }
            self.problems.push(format!(
                "{pod} answered {}: {}",
                a.status,
                ErrorBody::message(&a.body)
                    .as_deref()
                    .unwrap_or("no message")
            ));
            return;
        }
        let theirs = match LocalRange::deserialize(&a.body) {
            Ok(r) => r,
            Err(e) => {
                self.problems.push(format!(
                    "{pod} answered 200 with a range that failed to read: {e}"
                ));
                return;
            }
        };
        // A task two pods both claim (a hand-over in flight) is taken once.
        let fresh: BTreeSet<u32> = theirs
            .tasks
            .into_iter()
            .filter(|t| *t < self.n && !self.covered.contains(t))
            .collect();
        for e in theirs.entries {
            if fresh.contains(&e.partition) {
                self.entries
                    .push(((e.key.as_bytes().to_vec(), e.partition), e));
            }
        }
        self.covered.extend(fresh);
    }

    /// The page: the first `limit` entries in key order and the cursor, or the 503 that
    /// names the tasks no one could answer for.
    fn page(mut self, store: &str, params: &Params, me: &str, stage: u32) -> Answer {
        let n = self.n;
        let missing: Vec<String> = self
            .uncovered()
            .into_iter()
            .map(|t| TaskId::new(stage, t).to_string())
            .collect();
        if !missing.is_empty() {
            let mut a = Answer::error(
                503,
                format!(
                    "failed to read every task: {} of {n} tasks could not answer ({})",
                    missing.len(),
                    self.problems.join("; ")
                ),
                json!({ "store": store, "servedBy": me, "missingTasks": missing }),
            );
            a.retry_after = self.retry;
            return a;
        }
        self.entries.sort_by(|a, b| a.0.cmp(&b.0));
        let next = self.entries.get(params.limit).map(|(_, e)| e.key.clone());
        self.entries.truncate(params.limit);
        let entries: Vec<RangeEntry> = self.entries.into_iter().map(|(_, e)| e).collect();
        Answer::ok(json!({
            "store": store,
            "from": params.from,
            "to": params.to,
            "limit": params.limit,
            "servedBy": me,
            "entries": to_json(&entries),
            "next": next,
        }))
    }
}
