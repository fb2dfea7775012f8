//! The blocking reads of a local store: one key's entry, or a key range, decoded into
//! answer fields. Callers run these on the blocking pool.
//!
//! Owns: [`read_entry`] and [`read_range`] (which keys of a layout are user keys, the
//! per-topic batch headers of a group, the stream time shown beside windowed entries).
//! Must not touch: key bytes by hand (`crate::steps::keys` builds and splits them),
//! routing, or anything async.

use base64::Engine as _;
use oxbow_crds::StoreName;
use serde_json::{Value as Json, json};

use super::catalogue::{Layout, decode_entry, decode_window_rows};
use super::params::WindowFilter;
use crate::steps::keys;
use crate::store::{StoreError, TaskDb};

/// How many per-topic open batches a group's lookup reads at most.
const MAX_BATCHES_PER_GROUP: usize = 1024;
/// How many windows of a key a lookup reads at most.
const MAX_WINDOWS_PER_KEY: usize = 100_000;
/// Window rows a range read takes from the store at a time.
const ROWS_PER_READ: usize = 1024;

/// A windowed aggregate's stream time (it says which windows are closed); `None` for
/// other layouts or before the step stored one.
fn stream_time(db: &TaskDb, store: &StoreName, layout: &Layout) -> Result<Option<i64>, StoreError> {
    if !layout.windowed() {
        return Ok(None);
    }
    Ok(db
        .get(store, keys::STREAM_TIME)?
        .as_deref()
        .and_then(keys::decode_time))
}

/// A key's decoded entry in a local store, or `None` when absent. Blocks.
pub fn read_entry(
    db: &TaskDb,
    store: &StoreName,
    layout: &Layout,
    key: &str,
    filter: WindowFilter,
) -> Result<Option<Json>, StoreError> {
    if layout.windowed() {
        let rows: Vec<Vec<u8>> = db
            .prefixed(store, &keys::window_group_prefix(key), MAX_WINDOWS_PER_KEY)?
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        if rows.is_empty() {
            return Ok(None);
        }
        let st = stream_time(db, store, layout)?;
        let mut e = decode_window_rows(layout, &rows, st, filter);
        if let (Some(st), Some(o)) = (st, e.as_object_mut()) {
            o.insert("streamTime".into(), json!(st));
        }
        return Ok(Some(e));
    }
    let full = keys::prefixed(layout.prefix(), key.as_bytes());
    if *layout == Layout::Batch {
        // With several source topics a group has one open batch per topic.
        let batches: Vec<Json> = db
            .prefixed(store, &full, MAX_BATCHES_PER_GROUP)?
            .into_iter()
            .filter(|(k, _)| keys::is_header_of(&full, k))
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
    let start = keys::prefixed(prefix, from.unwrap_or("").as_bytes());
    let end = match to {
        Some(t) => Some(keys::prefixed(prefix, t.as_bytes())),
        None => keys::prefix_end(prefix),
    };
    let st = stream_time(db, store, layout)?;
    if layout.windowed() {
        return read_window_range(db, store, layout, start, end, limit, st);
    }
    Ok(db
        .range(store, &start, end.as_deref(), limit)?
        .into_iter()
        .map(|(k, v)| {
            let user = k.get(prefix.len()..).unwrap_or_default().to_vec();
            let e = decode_entry(layout, &v, st, WindowFilter::default());
            let e = range_entry(layout, &user, e);
            (user, e)
        })
        .collect())
}

/// [`read_range`] of a windowed aggregate: its window rows grouped by key, up to
/// `limit` keys, each with all its windows.
fn read_window_range(
    db: &TaskDb,
    store: &StoreName,
    layout: &Layout,
    mut from: Vec<u8>,
    end: Option<Vec<u8>>,
    limit: usize,
    st: Option<i64>,
) -> Result<Vec<(Vec<u8>, Json)>, StoreError> {
    let mut groups: Vec<(Vec<u8>, Vec<Vec<u8>>)> = Vec::new();
    loop {
        let rows = db.range(store, &from, end.as_deref(), ROWS_PER_READ)?;
        let more = rows.len() == ROWS_PER_READ;
        for (k, v) in rows {
            from = [k.as_slice(), &[0]].concat();
            let Some((group, _, _)) = keys::split_window_key(&k) else {
                continue;
            };
            let same = groups.last().is_some_and(|(g, _)| g.as_slice() == group);
            if same {
                if let Some((_, vs)) = groups.last_mut() {
                    vs.push(v);
                }
            } else if groups.len() == limit {
                // The next key: every kept key has all its windows.
                return Ok(finish_groups(layout, groups, st));
            } else {
                groups.push((group.to_vec(), vec![v]));
            }
        }
        if !more {
            return Ok(finish_groups(layout, groups, st));
        }
    }
}

fn finish_groups(
    layout: &Layout,
    groups: Vec<(Vec<u8>, Vec<Vec<u8>>)>,
    st: Option<i64>,
) -> Vec<(Vec<u8>, Json)> {
    groups
        .into_iter()
        .map(|(user, rows)| {
            let e = decode_window_rows(layout, &rows, st, WindowFilter::default());
            let e = range_entry(layout, &user, e);
            (user, e)
        })
        .collect()
}

/// A range entry: the decoded fields with the key shown as text, the source topic of a
/// per-topic batch, and the key's bytes when they are not UTF-8.
fn range_entry(layout: &Layout, user: &[u8], mut e: Json) -> Json {
    let shown = String::from_utf8_lossy(user);
    let (key, topic) = match (layout, keys::split_topic_group(&shown)) {
        (Layout::Batch, (g, Some(t))) => (g.to_string(), Some(t.to_string())),
        _ => (shown.into_owned(), None),
    };
    if let Some(o) = e.as_object_mut() {
        o.insert("key".into(), json!(key));
        if let Some(t) = topic {
            o.insert("sourceTopic".into(), json!(t));
        }
        if std::str::from_utf8(user).is_err() {
            o.insert(
                "keyBase64".into(),
                json!(base64::engine::general_purpose::STANDARD.encode(user)),
            );
        }
    }
    e
}
