//! The query parameters and the percent-encoding of keys in paths. Pure.
//!
//! Owns: [`Params`] (what every endpoint accepts, checked with messages that name the
//! parameter), [`WindowFilter`], [`BadRequest`], [`parse_time`], and [`encode`] /
//! [`decode_segment`]. Must not touch: routing, stores or I/O.

use std::collections::HashMap;

use super::{DEFAULT_LIMIT, DEFAULT_MAX_STALENESS, MAX_LIMIT};

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

/// Window starts a window fetch keeps: `[from, to)`, either end open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowFilter {
    pub from: Option<i64>,
    pub to: Option<i64>,
}

impl WindowFilter {
    pub(crate) fn keeps(&self, start: i64) -> bool {
        self.from.is_none_or(|f| start >= f) && self.to.is_none_or(|t| start < t)
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
    pub(crate) fn query(&self, task: Option<u32>, windows: bool) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn keys_survive_percent_encoding_round_trips() {
        for k in ["plain", "a/b c", "ünï", "%2F", ""] {
            assert_eq!(decode_segment(&encode(k)).as_deref(), Ok(k));
        }
        assert!(decode_segment("%zz").is_err());
    }
}
