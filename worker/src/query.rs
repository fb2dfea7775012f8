//! Interactive queries: read a store's committed state over HTTP, from any worker.
//!
//! A store belongs to one stage, and every key of a keyed store lives in exactly one task
//! of that stage (the steps repartition to make it so, see `oxbow_crds::topology`). A
//! point lookup finds the key's partition (the source partitioner for a stage-0 store,
//! murmur2 behind a repartition topic), then the task's owner in the routing table, and
//! answers locally or forwards to the owner. Only a store that is not keyed by what its
//! records are partitioned by (a `batch` without `groupBy`, a custom processor's store)
//! is asked on every task of its stage. A range asks every pod for the tasks of the
//! store's stage it holds actively and merges the answers in key order.
//!
//! The pieces that decide are pure (partitioners, [`decide`], [`decode_entry`], parameter
//! parsing) and unit-tested; [`Queries`] does the I/O: RocksDB reads on the blocking pool,
//! forwarding with reqwest. A forwarded request carries [`HOP_HEADER`] and is never
//! forwarded again, so requests cannot loop while the assignment moves.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use oxbow_crds::assignment::TaskPlacement;
use oxbow_crds::topology::KeyRoute;
use oxbow_crds::{Partitioner, RecordFormat, StoreName, TaskId};
use serde_json::{Value as Json, json};

use crate::config::App;
use crate::status::{RestoreProgress, Role, Routing, Shared, TaskState, WorkerStatus};
use crate::steps::{AggState, WindowAgg};
use crate::store::{StoreError, TaskDb};
use crate::window::{Window, WindowRules};

/// Set on a forwarded query (value: the forwarding pod): the receiver answers from what
/// it holds and never forwards again.
pub const HOP_HEADER: &str = "x-oxbow-forwarded-by";
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 10_000;
/// Default bound for `?allowStale=true`: changelog records a standby may be behind.
pub const DEFAULT_MAX_STALENESS: i64 = 10_000;
/// Retry-After bounds: a client should come back soon enough to see the restore end,
/// and not hammer a pod whose restore rate is not measured yet.
const RETRY_AFTER_MAX: u64 = 300;
const RETRY_AFTER_UNKNOWN: u64 = 5;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);
/// The aggregate step's stream-time entry (see `steps.rs`): not a group key.
const STREAM_TIME: &[u8] = b"m:stream-time";

// ---------------------------------------------------------------------------------------
// Partitioners
// ---------------------------------------------------------------------------------------

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), as the Java clients
/// and librdkafka's `murmur2` partitioners compute it.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Java hashes an int length; keys beyond 2 GiB do not exist in Kafka.
    let mut h = SEED ^ (data.len() as u32);
    let chunks = data.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    // Java's switch falls through from 3 to 1; the bytes land in disjoint bits.
    let tail = match *rest {
        [a, b, c] => Some(u32::from(a) | u32::from(b) << 8 | u32::from(c) << 16),
        [a, b] => Some(u32::from(a) | u32::from(b) << 8),
        [a] => Some(u32::from(a)),
        _ => None,
    };
    if let Some(t) = tail {
        h ^= t;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC-32 (IEEE), librdkafka's `rd_crc32`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for b in data {
        c = CRC_TABLE[((c ^ u32::from(*b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// librdkafka's `rd_fnv1a`: 32-bit FNV-1a on a signed accumulator, then its absolute
/// value (Sarama's hash partitioner), `i32::MIN` staying as is.
pub fn fnv1a(data: &[u8]) -> u32 {
    let mut h = 0x811c_9dc5_u32 as i32;
    for b in data {
        h ^= i32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.wrapping_abs() as u32
}

/// The partition a producer using `p` sends `key` to; `None` without partitions.
pub fn partition_for(p: Partitioner, key: &[u8], partitions: u32) -> Option<u32> {
    if partitions == 0 {
        return None;
    }
    Some(match p {
        // Utils.toPositive masks the sign bit (not abs).
        Partitioner::Murmur2 => (murmur2(key) as u32 & 0x7fff_ffff) % partitions,
        Partitioner::Crc32 => crc32(key) % partitions,
        Partitioner::Fnv1a => fnv1a(key) % partitions,
    })
}

// ---------------------------------------------------------------------------------------
// The stores this worker knows, and how their entries read
// ---------------------------------------------------------------------------------------

/// How a store's entries are laid out (see the module docs of `steps.rs`).
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// `k<group>` → JSON `AggState`; fields in the spec's (sorted) order.
    Aggregate {
        fields: Vec<String>,
        rules: Option<WindowRules>,
    },
    /// `k<id>` → first-seen event time.
    Dedupe { within: i64 },
    /// `h<group>` → the open batch's header.
    Batch,
    /// A custom processor's store: raw bytes.
    Custom,
}

impl Layout {
    /// The prefix of user keys in the store.
    fn prefix(&self) -> &'static [u8] {
        match self {
            Layout::Aggregate { .. } | Layout::Dedupe { .. } => b"k",
            Layout::Batch => b"h",
            Layout::Custom => b"",
        }
    }
    fn windowed(&self) -> bool {
        matches!(self, Layout::Aggregate { rules: Some(_), .. })
    }
    fn name(&self) -> &'static str {
        match self {
            Layout::Aggregate { rules: Some(_), .. } => "windowed aggregate",
            Layout::Aggregate { .. } => "aggregate",
            Layout::Dedupe { .. } => "dedupe",
            Layout::Batch => "batch",
            Layout::Custom => "custom",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoreInfo {
    pub layout: Layout,
    /// The stage whose tasks hold the store.
    pub stage: u32,
    /// How a key maps to one of those tasks.
    pub route: KeyRoute,
}

/// What queries need from the app: its stores and how keys map to tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    pub partitioner: Partitioner,
    pub key_format: RecordFormat,
    pub stores: BTreeMap<String, StoreInfo>,
}

impl Catalog {
    pub fn from_app(app: &App) -> Self {
        let spec = &app.manifest.spec;
        let topology = &app.topology;
        let mut stores = BTreeMap::new();
        for step in &spec.steps {
            let layout = if let Some(d) = &step.dedupe {
                let within = oxbow_crds::duration::parse_duration(&d.within)
                    .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                    .unwrap_or(i64::MAX);
                Layout::Dedupe { within }
            } else if let Some(a) = &step.aggregate {
                Layout::Aggregate {
                    fields: a.fields.keys().cloned().collect(),
                    // The spec was compiled at load: a bad window cannot get here.
                    rules: a
                        .window
                        .as_ref()
                        .and_then(|w| WindowRules::from_spec(w).ok()),
                }
            } else if step.batch.is_some() {
                Layout::Batch
            } else {
                continue;
            };
            let Some(store) = oxbow_crds::validate::step_store(step) else {
                continue;
            };
            let mut route = topology
                .routes
                .get(&store)
                .copied()
                .unwrap_or(KeyRoute::EveryTask);
            // A JSON source key is hashed as its JSON text, which a store key (the
            // expression's string) is not: such a key can be on any task of stage 0.
            if route == KeyRoute::Source && spec.source.key_format == RecordFormat::Json {
                route = KeyRoute::EveryTask;
            }
            stores.insert(
                store.0.clone(),
                StoreInfo {
                    layout,
                    stage: topology.stage_of_store(&store),
                    route,
                },
            );
        }
        // Stores of processors compiled into a custom worker: their keys are unknown.
        let last = topology.stage_count() - 1;
        for f in app.stage_steps(last) {
            for s in f(TaskId::new(last, 0)).stores() {
                stores.entry(s.0).or_insert(StoreInfo {
                    layout: Layout::Custom,
                    stage: last,
                    route: KeyRoute::EveryTask,
                });
            }
        }
        Self {
            partitioner: spec.source.partitioner,
            key_format: spec.source.key_format,
            stores,
        }
    }

    /// The partition of the store's stage that holds `key`, when the key says.
    pub fn partition_of(
        &self,
        info: &StoreInfo,
        key: &str,
        partitions: u32,
    ) -> Result<Option<u32>, String> {
        Ok(match info.route {
            KeyRoute::Source => partition_for(self.partitioner, &self.source_key(key)?, partitions),
            KeyRoute::Murmur2 => partition_for(Partitioner::Murmur2, key.as_bytes(), partitions),
            KeyRoute::EveryTask => None,
        })
    }

    fn known(&self) -> String {
        if self.stores.is_empty() {
            "this app has no stores".into()
        } else {
            format!(
                "known stores: {}",
                self.stores.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        }
    }

    /// The source record key bytes a query key stands for.
    fn source_key(&self, key: &str) -> Result<Vec<u8>, String> {
        match self.key_format {
            RecordFormat::Bytes => base64::engine::general_purpose::STANDARD
                .decode(key)
                .map_err(|e| {
                    format!("failed to decode key {key:?} as base64 (keyFormat: bytes): {e}")
                }),
            _ => Ok(key.as_bytes().to_vec()),
        }
    }
}

fn fields_json(fields: &[String], w: &WindowAgg) -> Json {
    Json::Object(
        fields
            .iter()
            .zip(&w.acc)
            .map(|(f, a)| (f.clone(), a.result()))
            .collect(),
    )
}

fn raw(value: &[u8], note: String) -> Json {
    json!({
        "valueBase64": base64::engine::general_purpose::STANDARD.encode(value),
        "note": note,
    })
}

/// Window starts a window fetch keeps: `[from, to)`, either end open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowFilter {
    pub from: Option<i64>,
    pub to: Option<i64>,
}

impl WindowFilter {
    fn keeps(&self, start: i64) -> bool {
        self.from.is_none_or(|f| start >= f) && self.to.is_none_or(|t| start < t)
    }
}

/// One entry's answer fields: `value` (aggregate), `windows` (windowed aggregate),
/// `seen`/`firstSeen`/`forgetAfter` (dedupe), `batches` (batch), or `valueBase64` with a
/// `note` (a layout this worker cannot read).
pub fn decode_entry(
    layout: &Layout,
    value: &[u8],
    stream_time: Option<i64>,
    filter: WindowFilter,
) -> Json {
    match layout {
        Layout::Aggregate { fields, rules } => {
            let s = match serde_json::from_slice::<AggState>(value) {
                Ok(s) => s,
                Err(e) => return raw(value, format!("failed to decode the aggregate state: {e}")),
            };
            match rules {
                None => match s.windows.first() {
                    Some(w) => json!({ "value": fields_json(fields, w) }),
                    None => json!({ "value": Json::Null }),
                },
                Some(r) => {
                    let windows: Vec<Json> = s
                        .windows
                        .iter()
                        .filter(|w| filter.keeps(w.start))
                        .map(|w| {
                            let win = Window {
                                start: w.start,
                                end: w.end,
                            };
                            json!({
                                "windowStart": w.start,
                                "windowEnd": w.end,
                                "closed": stream_time.is_some_and(|st| r.is_closed(win, st)),
                                "value": fields_json(fields, w),
                            })
                        })
                        .collect();
                    json!({ "windows": windows })
                }
            }
        }
        Layout::Dedupe { within } => match <[u8; 8]>::try_from(value) {
            Ok(b) => {
                let seen = i64::from_be_bytes(b);
                json!({
                    "seen": true,
                    "firstSeen": seen,
                    "forgetAfter": seen.saturating_add(*within),
                })
            }
            Err(_) => raw(
                value,
                "failed to decode the dedupe mark (not 8 bytes)".into(),
            ),
        },
        Layout::Batch => match serde_json::from_slice::<Json>(value) {
            Ok(h) => json!({ "batches": [h] }),
            Err(e) => raw(value, format!("failed to decode the open batch: {e}")),
        },
        Layout::Custom => raw(
            value,
            "store written by a custom processor: its value is returned as stored".into(),
        ),
    }
}

// ---------------------------------------------------------------------------------------
// Routing: who answers for a task
// ---------------------------------------------------------------------------------------

/// This worker's copy of a task, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalCopy {
    pub role: Role,
    pub state: TaskState,
    /// Changelog records the local state is behind (standbys, restoring actives).
    pub state_lag: Option<i64>,
    pub restore: Option<RestoreProgress>,
    pub last_error: Option<String>,
    /// Its store is open for reads.
    pub open: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Facts<'a> {
    pub me: &'a str,
    pub task: TaskId,
    pub local: Option<LocalCopy>,
    pub placement: Option<&'a TaskPlacement>,
    pub addresses: &'a BTreeMap<String, String>,
    /// The request came from another pod: answer from here or not at all.
    pub forwarded: bool,
    pub allow_stale: bool,
    pub max_staleness: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// This pod holds the task actively and it is running.
    Local,
    /// Another pod is the active: ask it.
    Forward {
        pod: String,
        addr: String,
    },
    /// `allowStale`: a local copy within the staleness bound.
    StaleLocal {
        lag: i64,
    },
    /// `allowStale`: the active cannot answer; ask a standby (it checks its own lag).
    StaleForward {
        pod: String,
        addr: String,
    },
    /// The owner is this pod and it is restoring or starting.
    Restoring {
        retry_after: u64,
        progress: Option<RestoreProgress>,
    },
    Unavailable(String),
}

/// Seconds until a restore should be done, for `Retry-After`.
pub fn retry_after(progress: Option<&RestoreProgress>) -> u64 {
    match progress {
        Some(p) if p.records_per_second > 0.0 => {
            let secs = (p.remaining as f64 / p.records_per_second).ceil();
            (secs as u64).clamp(1, RETRY_AFTER_MAX)
        }
        _ => RETRY_AFTER_UNKNOWN,
    }
}

/// Standbys of the task on other pods with a known address, in assignment order.
pub fn stale_candidates(f: &Facts<'_>) -> Vec<(String, String)> {
    f.placement
        .map(|p| {
            p.standbys
                .iter()
                .filter(|s| s.as_str() != f.me)
                .filter_map(|s| f.addresses.get(s).map(|a| (s.clone(), a.clone())))
                .collect()
        })
        .unwrap_or_default()
}

pub fn decide(f: &Facts<'_>) -> Decision {
    let t = f.task;
    if let Some(l) = &f.local {
        if l.role == Role::Active && l.state == TaskState::Running && l.open {
            return Decision::Local;
        }
        // A local copy that is close enough, when the caller accepts that.
        if f.allow_stale
            && l.open
            && matches!(l.state, TaskState::Running | TaskState::Restoring)
            && let Some(lag) = l.state_lag
            && lag <= f.max_staleness
        {
            return Decision::StaleLocal { lag: lag.max(0) };
        }
        if l.role == Role::Active {
            if l.state == TaskState::Failed {
                return Decision::Unavailable(format!(
                    "task {t} failed on {}: {}",
                    f.me,
                    l.last_error.as_deref().unwrap_or("no reason recorded")
                ));
            }
            if f.allow_stale
                && !f.forwarded
                && let Some((pod, addr)) = stale_candidates(f).into_iter().next()
            {
                return Decision::StaleForward { pod, addr };
            }
            return Decision::Restoring {
                retry_after: retry_after(l.restore.as_ref()),
                progress: l.restore.clone(),
            };
        }
    }
    if f.forwarded {
        return Decision::Unavailable(format!(
            "{} was asked for task {t} but does not hold it actively{} (the assignment may be moving); retry",
            f.me,
            if f.allow_stale {
                " nor within the staleness bound"
            } else {
                ""
            }
        ));
    }
    let stale_fallback = |why: String| {
        if f.allow_stale
            && let Some((pod, addr)) = stale_candidates(f).into_iter().next()
        {
            return Decision::StaleForward { pod, addr };
        }
        Decision::Unavailable(why)
    };
    match f.placement {
        Some(p) if p.active == f.me => Decision::Restoring {
            // Assigned here, not started yet: the engine picks it up within a second.
            retry_after: 1,
            progress: None,
        },
        Some(p) => match f.addresses.get(&p.active) {
            Some(addr) => Decision::Forward {
                pod: p.active.clone(),
                addr: addr.clone(),
            },
            None => stale_fallback(format!(
                "the owner of task {t}, {}, has no known address (standalone workers need --peers)",
                p.active
            )),
        },
        None => stale_fallback(format!("no owner of task {t} is known yet")),
    }
}

// ---------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// Epoch milliseconds or an RFC 3339 time.
pub fn parse_time(name: &str, v: &str) -> Result<i64, BadRequest> {
    if let Ok(ms) = v.parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            BadRequest(format!(
                "failed to read {name}={v:?}: expected epoch milliseconds or an RFC 3339 time ({e})"
            ))
        })
}

fn parse_bool(name: &str, v: Option<&String>) -> Result<bool, BadRequest> {
    match v.map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("" | "true") => Ok(true),
        Some(v) => Err(BadRequest(format!(
            "failed to read {name}={v:?}: expected true or false"
        ))),
    }
}

/// The query parameters every endpoint shares, plus the window and range ones.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Params {
    pub allow_stale: bool,
    pub max_staleness: i64,
    pub task: Option<u32>,
    pub window: WindowFilter,
    /// Range: keys in `[from, to)`.
    pub from: Option<String>,
    pub to: Option<String>,
    pub limit: usize,
    pub local: bool,
}

impl Params {
    pub fn parse(q: &HashMap<String, String>, windows: bool) -> Result<Self, BadRequest> {
        let max_staleness = match q.get("maxStaleness") {
            None => DEFAULT_MAX_STALENESS,
            Some(v) => v.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                BadRequest(format!(
                    "failed to read maxStaleness={v:?}: expected a number of records (0 or more)"
                ))
            })?,
        };
        let task = q
            .get("task")
            .map(|v| {
                v.parse::<u32>().map_err(|_| {
                    BadRequest(format!("failed to read task={v:?}: expected a task number"))
                })
            })
            .transpose()?;
        let limit = match q.get("limit") {
            None => DEFAULT_LIMIT,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    BadRequest(format!(
                        "failed to read limit={v:?}: expected 1 to {MAX_LIMIT}"
                    ))
                })?,
        };
        let (window, from, to) = if windows {
            let w = WindowFilter {
                from: q.get("from").map(|v| parse_time("from", v)).transpose()?,
                to: q.get("to").map(|v| parse_time("to", v)).transpose()?,
            };
            (w, None, None)
        } else {
            (
                WindowFilter::default(),
                q.get("from").cloned(),
                q.get("to").cloned(),
            )
        };
        Ok(Self {
            allow_stale: parse_bool("allowStale", q.get("allowStale"))?,
            max_staleness,
            task,
            window,
            from,
            to,
            limit,
            local: parse_bool("local", q.get("local"))?,
        })
    }

    /// The query string of a forwarded request.
    fn query(&self, task: Option<u32>, windows: bool) -> String {
        let mut q = vec![
            format!("allowStale={}", self.allow_stale),
            format!("maxStaleness={}", self.max_staleness),
        ];
        if let Some(t) = task {
            q.push(format!("task={t}"));
        }
        if windows {
            if let Some(f) = self.window.from {
                q.push(format!("from={f}"));
            }
            if let Some(t) = self.window.to {
                q.push(format!("to={t}"));
            }
        } else {
            if let Some(f) = &self.from {
                q.push(format!("from={}", encode(f)));
            }
            if let Some(t) = &self.to {
                q.push(format!("to={}", encode(t)));
            }
        }
        q.join("&")
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters (a path segment or a
/// query value).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes a percent-encoded path segment (warp hands path parameters over raw).
pub fn decode_segment(s: &str) -> Result<String, BadRequest> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| BadRequest(format!("failed to decode path segment {s:?}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| BadRequest(format!("failed to decode path segment {s:?}: not UTF-8")))
}

// ---------------------------------------------------------------------------------------
// Answers and I/O
// ---------------------------------------------------------------------------------------

/// An HTTP answer: status, JSON body, and `Retry-After` for a restoring owner.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Json,
    pub retry_after: Option<u64>,
}

impl Answer {
    fn ok(body: Json) -> Self {
        Self {
            status: 200,
            body,
            retry_after: None,
        }
    }
    fn error(status: u16, message: impl Into<String>, mut extra: Json) -> Self {
        if let Some(o) = extra.as_object_mut() {
            o.insert("error".into(), json!(message.into()));
        } else {
            extra = json!({ "error": message.into() });
        }
        Self {
            status,
            body: extra,
            retry_after: None,
        }
    }
    fn bad(e: BadRequest) -> Self {
        Self::error(400, e.0, json!({}))
    }
}

#[derive(Debug, thiserror::Error)]
enum QueryError {
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
}

/// The query service behind the HTTP routes.
pub struct Queries {
    shared: Arc<Shared>,
    catalog: Catalog,
    client: Result<reqwest::Client, String>,
}

impl Queries {
    /// The store's catalog entry, or the 404 that names the stores there are.
    fn store_info(&self, store: &str) -> Result<StoreInfo, Answer> {
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

    fn me(routing: &Routing, status: Option<&WorkerStatus>) -> String {
        if routing.me.is_empty() {
            format!("instance-{}", status.map(|s| s.instance).unwrap_or(0))
        } else {
            routing.me.clone()
        }
    }

    fn local_copy(&self, status: Option<&WorkerStatus>, task: TaskId) -> Option<LocalCopy> {
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
        let (store, key) = match (decode_segment(store), decode_segment(key)) {
            (Ok(s), Ok(k)) => (s, k),
            (Err(e), _) | (_, Err(e)) => return Answer::bad(e),
        };
        let params = match Params::parse(query, windows) {
            Ok(p) => p,
            Err(e) => return Answer::bad(e),
        };
        let info = match self.store_info(&store) {
            Ok(i) => i,
            Err(a) => return a,
        };
        if windows && !info.layout.windowed() {
            return Answer::bad(BadRequest(format!(
                "store {store:?} is a {} store, not a windowed aggregate: it has no windows; use /v1/stores/{store}/keys/{{key}}",
                info.layout.name()
            )));
        }
        let routing = self.shared.routing();
        let n = routing.task_count;
        let lookup = Lookup {
            store,
            key,
            info,
            windows,
            params,
            forwarded,
        };
        let stage = lookup.info.stage;
        let task = match lookup.params.task {
            Some(t) if n > 0 && t >= n => {
                return Answer::bad(BadRequest(format!(
                    "task={t} does not exist: the app has {n} tasks per stage (0 to {})",
                    n - 1
                )));
            }
            Some(t) => Some(t),
            None if n == 0 => return unknown_task_count(),
            None => match self.catalog.partition_of(&lookup.info, &lookup.key, n) {
                Ok(p) => p,
                Err(e) => return Answer::bad(BadRequest(e)),
            },
        };
        match task {
            Some(t) => self.one_task(&lookup, TaskId::new(stage, t)).await,
            None => self.scatter(&lookup, n).await,
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
        let context = json!({
            "store": lookup.store, "key": lookup.key, "task": task.to_string(), "partition": task.partition, "servedBy": me,
        });
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
                let mut last = None;
                for (pod, addr) in
                    std::iter::once((pod, addr)).chain(stale_candidates(&facts).into_iter().skip(1))
                {
                    let s = self.forward(&addr, &pod, lookup, task, &me).await;
                    if s.status != 503 {
                        return s;
                    }
                    last = Some(s);
                }
                last.unwrap_or_else(|| {
                    Answer::error(503, format!("no copy of task {task} could answer"), context)
                })
            }
            Decision::Restoring {
                retry_after,
                progress,
            } => {
                let mut body = context;
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
            Decision::Unavailable(msg) => Answer::error(503, msg, context),
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
        let context = json!({
            "store": lookup.store, "key": lookup.key, "task": task.to_string(), "partition": task.partition, "servedBy": me,
        });
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
                    o.insert("found".into(), json!(found.is_some()));
                    o.insert("role".into(), json!(role));
                    o.insert("stale".into(), json!(stale.is_some()));
                    if let Some(lag) = stale {
                        o.insert("lagRecords".into(), json!(lag));
                    }
                    if let Some(Json::Object(fields)) = &found {
                        o.extend(fields.clone());
                    }
                }
                Answer {
                    status: if found.is_some() { 200 } else { 404 },
                    body,
                    retry_after: None,
                }
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
        let context = json!({
            "store": lookup.store, "key": lookup.key, "task": task.to_string(), "partition": task.partition, "servedBy": me,
        });
        self.get(&url, pod, me, context).await
    }

    /// A GET to another pod, passed through: its status, JSON body and Retry-After.
    async fn get(&self, url: &str, pod: &str, me: &str, context: Json) -> Answer {
        let client = match &self.client {
            Ok(c) => c,
            Err(e) => return Answer::error(503, e.clone(), context),
        };
        let resp = match client.get(url).header(HOP_HEADER, me).send().await {
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

    /// `GET /v1/stores/{store}/range?from=&to=&limit=[&local=true]`.
    pub async fn range(
        &self,
        store: &str,
        query: &HashMap<String, String>,
        forwarded: bool,
    ) -> Answer {
        let store = match decode_segment(store) {
            Ok(s) => s,
            Err(e) => return Answer::bad(e),
        };
        let params = match Params::parse(query, false) {
            Ok(p) => p,
            Err(e) => return Answer::bad(e),
        };
        let info = match self.store_info(&store) {
            Ok(i) => i,
            Err(a) => return a,
        };
        if let (Some(f), Some(t)) = (&params.from, &params.to)
            && f.as_bytes() > t.as_bytes()
        {
            return Answer::bad(BadRequest(format!(
                "from={f:?} is after to={t:?}: the range is [from, to)"
            )));
        }
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
            return Answer::ok(json!({
                "store": store,
                "servedBy": me,
                "tasks": covered,
                "entries": entries.into_iter().map(|(_, e)| e).collect::<Vec<_>>(),
            }));
        }
        let n = routing.task_count;
        if n == 0 {
            return unknown_task_count();
        }
        let mut covered: BTreeSet<u32> = covered.into_iter().collect();
        // Ask each other owner once for everything it holds actively.
        let mut problems: Vec<String> = Vec::new();
        let mut retry = None::<u64>;
        let mut owners: BTreeMap<String, String> = BTreeMap::new();
        for t in (0..n).filter(|t| !covered.contains(t)) {
            let task = TaskId::new(info.stage, t);
            let facts = Facts {
                me: &me,
                task,
                local: self.local_copy(status.as_ref(), task),
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
                    retry = Some(retry.map_or(retry_after, |r| r.max(retry_after)));
                    problems.push(format!("task {t} is restoring on {me}"));
                }
                Decision::Unavailable(m) => problems.push(m),
                // Reads of local running actives were done above; stale reads are not
                // asked for here.
                Decision::Local | Decision::StaleLocal { .. } | Decision::StaleForward { .. } => {
                    problems.push(format!("task {t} was not readable on {me}"));
                }
            }
        }
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
            if a.status != 200 {
                if let Some(r) = a.retry_after {
                    retry = Some(retry.map_or(r, |x| x.max(r)));
                }
                problems.push(format!(
                    "{pod} answered {}: {}",
                    a.status,
                    a.body["error"].as_str().unwrap_or("no message")
                ));
                continue;
            }
            let theirs: Vec<u32> = a.body["tasks"]
                .as_array()
                .map(|ts| {
                    ts.iter()
                        .filter_map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                        .collect()
                })
                .unwrap_or_default();
            // A task two pods both claim (a hand-over in flight) is taken once.
            let fresh: BTreeSet<u32> = theirs
                .into_iter()
                .filter(|t| *t < n && !covered.contains(t))
                .collect();
            for e in a.body["entries"].as_array().into_iter().flatten() {
                let t = e["partition"].as_u64().and_then(|t| u32::try_from(t).ok());
                if let (Some(t), Some(k)) = (t, e["key"].as_str())
                    && fresh.contains(&t)
                {
                    entries.push(((k.as_bytes().to_vec(), t), e.clone()));
                }
            }
            covered.extend(fresh);
        }
        let missing: Vec<String> = (0..n)
            .filter(|t| !covered.contains(t))
            .map(|t| TaskId::new(info.stage, t).to_string())
            .collect();
        if !missing.is_empty() {
            let mut a = Answer::error(
                503,
                format!(
                    "failed to read every task: {} of {n} tasks could not answer ({})",
                    missing.len(),
                    problems.join("; ")
                ),
                json!({ "store": store, "servedBy": me, "missingTasks": missing }),
            );
            a.retry_after = retry;
            return a;
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let next = entries
            .get(params.limit)
            .and_then(|(_, e)| e["key"].as_str().map(str::to_string));
        entries.truncate(params.limit);
        Answer::ok(json!({
            "store": store,
            "from": params.from,
            "to": params.to,
            "limit": params.limit,
            "servedBy": me,
            "entries": entries.into_iter().map(|(_, e)| e).collect::<Vec<_>>(),
            "next": next,
        }))
    }

    /// The range from every task this pod holds actively and running, on the blocking
    /// pool: the tasks read, and their entries sorted by (key, task).
    #[allow(clippy::type_complexity)]
    async fn local_range(
        &self,
        store: &str,
        info: &StoreInfo,
        params: &Params,
        want: usize,
        status: Option<&WorkerStatus>,
    ) -> Result<(Vec<u32>, Vec<((Vec<u8>, u32), Json)>), QueryError> {
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
                    let mut e = e;
                    if let Some(o) = e.as_object_mut() {
                        o.insert("task".into(), json!(task.to_string()));
                        o.insert("partition".into(), json!(task.partition));
                    }
                    out.push(((k, task.partition), e));
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

fn unknown_task_count() -> Answer {
    Answer::error(
        503,
        "the source partition count is not known yet (the worker is starting); retry",
        json!({}),
    )
}

fn stream_time(db: &TaskDb, store: &StoreName, layout: &Layout) -> Result<Option<i64>, StoreError> {
    if !layout.windowed() {
        return Ok(None);
    }
    Ok(db
        .get(store, STREAM_TIME)?
        .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
        .map(i64::from_be_bytes))
}

/// A key's decoded entry in a local store, or `None` when absent. Blocks.
pub fn read_entry(
    db: &TaskDb,
    store: &StoreName,
    layout: &Layout,
    key: &str,
    filter: WindowFilter,
) -> Result<Option<Json>, StoreError> {
    let full = [layout.prefix(), key.as_bytes()].concat();
    if *layout == Layout::Batch {
        // With several source topics a group has one open batch per topic, stored as
        // `h<group>\x1f<topic>` (see `steps.rs`).
        let batches: Vec<Json> = db
            .prefixed(store, &full, 1024)?
            .into_iter()
            .filter(|(k, _)| k.len() == full.len() || k.get(full.len()) == Some(&0x1f))
            .filter_map(|(_, v)| serde_json::from_slice::<Json>(&v).ok())
            .collect();
        return Ok((!batches.is_empty()).then(|| json!({ "batches": batches })));
    }
    let Some(v) = db.get(store, &full)? else {
        return Ok(None);
    };
    let st = stream_time(db, store, layout)?;
    let mut e = decode_entry(layout, &v, st, filter);
    if let (Some(st), Some(o)) = (st, e.as_object_mut()) {
        o.insert("streamTime".into(), json!(st));
    }
    Ok(Some(e))
}

/// Up to `limit` decoded entries with keys in `[from, to)`, in key order. Blocks.
#[allow(clippy::type_complexity)]
pub fn read_range(
    db: &TaskDb,
    store: &StoreName,
    layout: &Layout,
    from: Option<&str>,
    to: Option<&str>,
    limit: usize,
) -> Result<Vec<(Vec<u8>, Json)>, StoreError> {
    let prefix = layout.prefix();
    let start = [prefix, from.unwrap_or("").as_bytes()].concat();
    let end = match to {
        Some(t) => Some([prefix, t.as_bytes()].concat()),
        // The first key past the prefix: `k` → `l`.
        None => prefix
            .split_last()
            .map(|(last, head)| [head, &[last.saturating_add(1)]].concat()),
    };
    let st = stream_time(db, store, layout)?;
    Ok(db
        .range(store, &start, end.as_deref(), limit)?
        .into_iter()
        .map(|(k, v)| {
            let user = k.get(prefix.len()..).unwrap_or_default().to_vec();
            let mut e = decode_entry(layout, &v, st, WindowFilter::default());
            let shown = String::from_utf8_lossy(&user);
            let (key, topic) = match (layout, shown.split_once('\u{1f}')) {
                (Layout::Batch, Some((g, t))) => (g.to_string(), Some(t.to_string())),
                _ => (shown.into_owned(), None),
            };
            if let Some(o) = e.as_object_mut() {
                o.insert("key".into(), json!(key));
                if let Some(t) = topic {
                    o.insert("sourceTopic".into(), json!(t));
                }
                if std::str::from_utf8(&user).is_err() {
                    o.insert(
                        "keyBase64".into(),
                        json!(base64::engine::general_purpose::STANDARD.encode(&user)),
                    );
                }
            }
            (user, e)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::Acc;

    #[test]
    fn murmur2_matches_the_java_clients() {
        // Kafka's UtilsTest.testMurmur2.
        let cases: [(&str, i32); 6] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
        ];
        for (k, want) in cases {
            assert_eq!(murmur2(k.as_bytes()), want, "murmur2({k:?})");
        }
    }

    #[test]
    fn murmur2_partitions_mask_the_sign_bit_like_to_positive() {
        // toPositive(-973932308) = 1173551340; % 4 = 0, % 7 = 3.
        assert_eq!(partition_for(Partitioner::Murmur2, b"21", 4), Some(0));
        assert_eq!(partition_for(Partitioner::Murmur2, b"21", 7), Some(3));
        // toPositive(479470107) = 479470107; % 4 = 3.
        assert_eq!(partition_for(Partitioner::Murmur2, b"abc", 4), Some(3));
        assert_eq!(partition_for(Partitioner::Murmur2, b"abc", 0), None);
    }

    #[test]
    fn crc32_and_fnv1a_match_librdkafka() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
        // librdkafka's rdfnv1a.c unit test vectors.
        assert_eq!(fnv1a(b"kafka") as i32, 0x0d33_c4e1);
        assert_eq!(fnv1a(b"giberish123456789") as i32, 0x77a5_8295);
        assert_eq!(fnv1a(b"1234") as i32, 0x023b_dd03);
        assert_eq!(fnv1a(b"") as i32, 0x7ee3_623b);
        assert_eq!(
            partition_for(Partitioner::Crc32, b"123456789", 10),
            Some(0xcbf4_3926 % 10)
        );
        assert_eq!(
            partition_for(Partitioner::Fnv1a, b"kafka", 6),
            Some(0x0d33_c4e1 % 6)
        );
    }

    fn placement(active: &str, standbys: &[&str]) -> TaskPlacement {
        TaskPlacement {
            active: active.into(),
            standbys: standbys.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn copy(role: Role, state: TaskState, lag: Option<i64>) -> LocalCopy {
        LocalCopy {
            role,
            state,
            state_lag: lag,
            restore: None,
            last_error: None,
            open: true,
        }
    }

    fn facts<'a>(
        local: Option<LocalCopy>,
        p: Option<&'a TaskPlacement>,
        addrs: &'a BTreeMap<String, String>,
    ) -> Facts<'a> {
        Facts {
            me: "a",
            task: TaskId::new(0, 3),
            local,
            placement: p,
            addresses: addrs,
            forwarded: false,
            allow_stale: false,
            max_staleness: DEFAULT_MAX_STALENESS,
        }
    }

    fn addrs() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("a".into(), "10.0.0.1:8080".into()),
            ("b".into(), "10.0.0.2:8080".into()),
            ("c".into(), "10.0.0.3:8080".into()),
        ])
    }

    #[test]
    fn a_running_local_active_answers_here() {
        let a = addrs();
        let p = placement("a", &["b"]);
        let f = facts(
            Some(copy(Role::Active, TaskState::Running, None)),
            Some(&p),
            &a,
        );
        assert_eq!(decide(&f), Decision::Local);
    }

    #[test]
    fn another_active_gets_the_request_forwarded_once() {
        let a = addrs();
        let p = placement("b", &["a"]);
        let mut f = facts(
            Some(copy(Role::Standby, TaskState::Running, Some(3))),
            Some(&p),
            &a,
        );
        assert_eq!(
            decide(&f),
            Decision::Forward {
                pod: "b".into(),
                addr: "10.0.0.2:8080".into()
            }
        );
        f.forwarded = true;
        assert!(
            matches!(decide(&f), Decision::Unavailable(m) if m.contains("does not hold it actively")),
            "a forwarded request is never forwarded again"
        );
    }

    #[test]
    fn allow_stale_reads_a_local_standby_within_the_bound_only() {
        let a = addrs();
        let p = placement("b", &["a"]);
        let mut f = facts(
            Some(copy(Role::Standby, TaskState::Running, Some(40))),
            Some(&p),
            &a,
        );
        f.allow_stale = true;
        assert_eq!(decide(&f), Decision::StaleLocal { lag: 40 });
        f.max_staleness = 39;
        assert!(matches!(decide(&f), Decision::Forward { .. }));
        f.local = Some(copy(Role::Standby, TaskState::Running, None));
        f.max_staleness = DEFAULT_MAX_STALENESS;
        assert!(
            matches!(decide(&f), Decision::Forward { .. }),
            "an unknown lag is not within any bound"
        );
    }

    #[test]
    fn a_restoring_local_active_answers_503_with_retry_after_from_the_rate() {
        let a = addrs();
        let p = placement("a", &["b"]);
        let mut l = copy(Role::Active, TaskState::Restoring, Some(50_000));
        let progress = RestoreProgress {
            remaining: 25_000,
            records_per_second: 10_000.0,
            ..Default::default()
        };
        l.restore = Some(progress.clone());
        let mut f = facts(Some(l), Some(&p), &a);
        assert_eq!(
            decide(&f),
            Decision::Restoring {
                retry_after: 3,
                progress: Some(progress)
            }
        );
        f.allow_stale = true;
        assert_eq!(
            decide(&f),
            Decision::StaleForward {
                pod: "b".into(),
                addr: "10.0.0.2:8080".into()
            },
            "with allowStale a standby elsewhere is asked instead"
        );
    }

    #[test]
    fn retry_after_is_at_least_one_second_and_bounded() {
        let p = |remaining, rate| RestoreProgress {
            remaining,
            records_per_second: rate,
            ..Default::default()
        };
        assert_eq!(retry_after(Some(&p(1, 1e9))), 1);
        assert_eq!(retry_after(Some(&p(0, 5.0))), 1);
        assert_eq!(retry_after(Some(&p(u64::MAX, 1.0))), RETRY_AFTER_MAX);
        assert_eq!(retry_after(Some(&p(10, 0.0))), RETRY_AFTER_UNKNOWN);
        assert_eq!(retry_after(None), RETRY_AFTER_UNKNOWN);
    }

    #[test]
    fn an_owner_without_address_or_no_owner_is_unavailable_with_a_reason() {
        let none = BTreeMap::new();
        let p = placement("b", &[]);
        let f = facts(None, Some(&p), &none);
        assert!(matches!(decide(&f), Decision::Unavailable(m) if m.contains("--peers")));
        let f = facts(None, None, &none);
        assert!(matches!(decide(&f), Decision::Unavailable(m) if m.contains("no owner")));
    }

    #[test]
    fn a_failed_local_active_says_why() {
        let a = addrs();
        let p = placement("a", &[]);
        let mut l = copy(Role::Active, TaskState::Failed, None);
        l.last_error = Some("boom".into());
        let f = facts(Some(l), Some(&p), &a);
        assert!(matches!(decide(&f), Decision::Unavailable(m) if m.contains("boom")));
    }

    #[test]
    fn a_task_assigned_here_but_not_started_asks_to_retry_shortly() {
        let a = addrs();
        let p = placement("a", &[]);
        let f = facts(None, Some(&p), &a);
        assert_eq!(
            decide(&f),
            Decision::Restoring {
                retry_after: 1,
                progress: None
            }
        );
    }

    fn agg_state(windows: Vec<(i64, i64, Vec<Acc>)>) -> Vec<u8> {
        let s = AggState {
            windows: windows
                .into_iter()
                .map(|(start, end, acc)| WindowAgg {
                    start,
                    end,
                    emitted: false,
                    acc,
                })
                .collect(),
        };
        serde_json::to_vec(&s).expect("state")
    }

    #[test]
    fn an_unwindowed_aggregate_reads_as_its_fields() {
        let layout = Layout::Aggregate {
            fields: vec!["n".into(), "total".into()],
            rules: None,
        };
        let v = agg_state(vec![(
            0,
            0,
            vec![
                Acc::Count { n: 3 },
                Acc::Sum {
                    int: 42,
                    float: 0.5,
                    is_float: true,
                },
            ],
        )]);
        assert_eq!(
            decode_entry(&layout, &v, None, WindowFilter::default()),
            json!({"value": {"n": 3, "total": 42.5}})
        );
    }

    #[test]
    fn a_windowed_aggregate_reads_as_its_windows_filtered_by_start() {
        let spec: oxbow_crds::WindowSpec = serde_yaml::from_str("{tumbling: 10s}").expect("yaml");
        let rules = WindowRules::from_spec(&spec).expect("rules");
        let layout = Layout::Aggregate {
            fields: vec!["n".into()],
            rules: Some(rules),
        };
        let v = agg_state(vec![
            (0, 10_000, vec![Acc::Count { n: 1 }]),
            (10_000, 20_000, vec![Acc::Count { n: 2 }]),
        ]);
        assert_eq!(
            decode_entry(&layout, &v, Some(15_000), WindowFilter::default()),
            json!({"windows": [
                {"windowStart": 0, "windowEnd": 10_000, "closed": true, "value": {"n": 1}},
                {"windowStart": 10_000, "windowEnd": 20_000, "closed": false, "value": {"n": 2}},
            ]})
        );
        let f = WindowFilter {
            from: Some(5_000),
            to: Some(10_001),
        };
        assert_eq!(
            decode_entry(&layout, &v, Some(15_000), f)["windows"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn dedupe_batch_and_unknown_layouts_decode_or_fall_back_to_base64() {
        let d = Layout::Dedupe { within: 1_000 };
        assert_eq!(
            decode_entry(&d, &5_000i64.to_be_bytes(), None, WindowFilter::default()),
            json!({"seen": true, "firstSeen": 5_000, "forgetAfter": 6_000})
        );
        assert_eq!(
            decode_entry(&d, b"xy", None, WindowFilter::default())["valueBase64"],
            json!("eHk=")
        );
        assert_eq!(
            decode_entry(
                &Layout::Batch,
                br#"{"count":2}"#,
                None,
                WindowFilter::default()
            ),
            json!({"batches": [{"count": 2}]})
        );
        let c = decode_entry(&Layout::Custom, b"\x00\x01", None, WindowFilter::default());
        assert_eq!(c["valueBase64"], json!("AAE="));
        assert!(c["note"].as_str().is_some_and(|n| n.contains("custom")));
        let broken = Layout::Aggregate {
            fields: vec![],
            rules: None,
        };
        assert!(
            decode_entry(&broken, b"not json", None, WindowFilter::default())["note"]
                .as_str()
                .is_some_and(|n| n.starts_with("failed to decode"))
        );
    }

    #[test]
    fn parameters_are_checked_with_clear_messages() {
        let q = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let p = Params::parse(&q(&[]), false).expect("defaults");
        assert_eq!(
            (p.limit, p.max_staleness, p.allow_stale),
            (100, 10_000, false)
        );
        assert!(Params::parse(&q(&[("limit", "0")]), false).is_err());
        assert!(Params::parse(&q(&[("limit", "10001")]), false).is_err());
        assert!(
            Params::parse(&q(&[("allowStale", "yes")]), false)
                .is_err_and(|e| e.0.contains("allowStale"))
        );
        assert!(Params::parse(&q(&[("maxStaleness", "-1")]), false).is_err());
        let w = Params::parse(
            &q(&[("from", "1970-01-01T00:00:10Z"), ("to", "20000")]),
            true,
        )
        .expect("times");
        assert_eq!(
            w.window,
            WindowFilter {
                from: Some(10_000),
                to: Some(20_000)
            }
        );
        assert!(
            Params::parse(&q(&[("from", "yesterday")]), true)
                .is_err_and(|e| e.0.contains("RFC 3339"))
        );
    }

    #[test]
    fn stores_route_by_the_source_partitioner_or_by_murmur2_behind_a_repartition() {
        let text = r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {name: cat}
spec:
  kafka: {bootstrapServers: "127.0.0.1:1"}
  source: {topics: [in], partitioner: crc32}
  steps:
  - dedupe: {store: seen, id: key, within: 1h}
  - aggregate: {store: by-key, groupBy: key, window: {tumbling: 1m}, fields: {n: {count: {}}}}
  - aggregate: {store: by-colour, groupBy: value.colour, fields: {n: {count: {}}}}
  - aggregate: {store: rekeyed, groupBy: key, fields: {n: {count: {}}}}
"#;
        let m =
            crate::config::parse_manifest(std::path::Path::new("t.yaml"), text).expect("manifest");
        let app = App::from_manifest(m, BTreeMap::new()).expect("app");
        let c = Catalog::from_app(&app);
        assert_eq!(c.partitioner, Partitioner::Crc32);
        let route = |s: &str| c.stores.get(s).map(|i| (i.stage, i.route));
        assert_eq!(route("seen"), Some((0, KeyRoute::Source)));
        assert_eq!(route("by-key"), Some((0, KeyRoute::Source)));
        assert_eq!(
            route("by-colour"),
            Some((1, KeyRoute::Murmur2)),
            "grouped by a field: behind a repartition topic"
        );
        assert_eq!(
            route("rekeyed"),
            Some((1, KeyRoute::Murmur2)),
            "after an aggregate by colour the key is the colour, already co-located"
        );
        let info = c.stores.get("by-colour").cloned().expect("store");
        assert_eq!(
            c.partition_of(&info, "red", 8),
            Ok(partition_for(Partitioner::Murmur2, b"red", 8)),
            "the key's own partition, as the repartitioning stage wrote it"
        );
        assert!(matches!(
            c.stores.get("by-key").map(|i| &i.layout),
            Some(Layout::Aggregate { rules: Some(_), fields }) if fields == &["n".to_string()]
        ));
        assert_eq!(c.known(), "known stores: by-colour, by-key, rekeyed, seen");
    }

    #[test]
    fn keys_survive_percent_encoding_round_trips() {
        for k in ["plain", "a/b c", "ünï", "%2F", ""] {
            assert_eq!(decode_segment(&encode(k)).as_deref(), Ok(k));
        }
        assert!(decode_segment("%zz").is_err());
    }
}
