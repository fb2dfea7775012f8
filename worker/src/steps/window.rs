//! Window assignment and closing rules of the `aggregate` step. Pure.
//!
//! Times are epoch milliseconds. A window is `[start, end)`. Stream time is the largest
//! record timestamp a task has seen; a window closes once stream time reaches
//! `end + grace`, and a record whose every window is closed is late and dropped.
//!
//! Owns: reading a `window` spec and the timing rules (assign, closed, expired). Must
//! not touch: state or stores; the aggregate step and the queries apply these rules to
//! what they hold.

use std::time::Duration;

use oxbow_crds::WindowSpec;
use oxbow_crds::duration::parse_duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Window {
    pub start: i64,
    pub end: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Windows {
    Tumbling {
        size: i64,
    },
    Hopping {
        size: i64,
        advance: i64,
    },
    /// Sessions are merged by the store; assignment gives the record's own span.
    Session {
        gap: i64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRules {
    pub windows: Windows,
    pub grace: i64,
    pub retention: i64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WindowError {
    #[error("failed to read window: {0}")]
    Duration(#[from] oxbow_crds::duration::DurationError),
    #[error("failed to read window: {0}")]
    Shape(&'static str),
}

fn ms(s: &str) -> Result<i64, WindowError> {
    Ok(i64::try_from(parse_duration(s)?.as_millis()).unwrap_or(i64::MAX))
}

impl WindowRules {
    pub fn from_spec(spec: &WindowSpec) -> Result<Self, WindowError> {
        let windows = match (&spec.tumbling, &spec.hopping, &spec.session) {
            (Some(t), None, None) => Windows::Tumbling { size: ms(t)? },
            (None, Some(h), None) => {
                let (size, advance) = (ms(&h.size)?, ms(&h.advance)?);
                if advance == 0 || advance > size {
                    return Err(WindowError::Shape(
                        "hopping.advance must be greater than 0 and at most hopping.size",
                    ));
                }
                Windows::Hopping { size, advance }
            }
            (None, None, Some(s)) => Windows::Session { gap: ms(&s.gap)? },
            _ => {
                return Err(WindowError::Shape(
                    "a window is exactly one of tumbling, hopping or session",
                ));
            }
        };
        if matches!(
            windows,
            Windows::Tumbling { size: 0 } | Windows::Session { gap: 0 }
        ) {
            return Err(WindowError::Shape(
                "a window size or session gap must be greater than 0",
            ));
        }
        let grace = spec.grace.as_deref().map(ms).transpose()?.unwrap_or(0);
        let span = match windows {
            Windows::Tumbling { size } | Windows::Hopping { size, .. } => size,
            Windows::Session { gap } => gap,
        };
        let retention = spec
            .retention
            .as_deref()
            .map(ms)
            .transpose()?
            .unwrap_or(span.saturating_add(grace));
        Ok(Self {
            windows,
            grace,
            retention,
        })
    }

    /// The windows a record at `ts` belongs to, oldest first.
    pub fn assign(&self, ts: i64) -> Vec<Window> {
        match self.windows {
            Windows::Tumbling { size } => {
                let start = ts - ts.rem_euclid(size);
                vec![Window {
                    start,
                    end: start + size,
                }]
            }
            Windows::Hopping { size, advance } => {
                let last = ts - ts.rem_euclid(advance);
                let mut out = Vec::new();
                let mut start = last;
                while start > ts - size {
                    out.push(Window {
                        start,
                        end: start + size,
                    });
                    start -= advance;
                }
                out.reverse();
                out
            }
            Windows::Session { gap } => vec![Window {
                start: ts,
                end: ts + gap,
            }],
        }
    }

    /// Closed: no record may change it any more, and `onWindowClose` may emit it.
    pub fn is_closed(&self, w: Window, stream_time: i64) -> bool {
        stream_time >= w.end.saturating_add(self.grace)
    }

    /// Past retention: the window may be purged from the store.
    pub fn is_expired(&self, w: Window, stream_time: i64) -> bool {
        stream_time
            >= w.start
                .saturating_add(self.retention.max(w.end - w.start + self.grace))
    }

    /// The record's windows that are still open; empty means the record is late.
    pub fn open_windows(&self, ts: i64, stream_time: i64) -> Vec<Window> {
        self.assign(ts)
            .into_iter()
            .filter(|w| !self.is_closed(*w, stream_time))
            .collect()
    }

    pub fn grace(&self) -> Duration {
        Duration::from_millis(self.grace.max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(yaml: &str) -> WindowRules {
        let spec: WindowSpec = serde_yaml::from_str(yaml).expect("window yaml");
        WindowRules::from_spec(&spec).expect("valid window")
    }

    #[test]
    fn tumbling_windows_align_to_the_epoch_and_include_the_start() {
        let r = rules("{tumbling: 10s}");
        assert_eq!(
            r.assign(0),
            vec![Window {
                start: 0,
                end: 10_000
            }]
        );
        assert_eq!(
            r.assign(9_999),
            vec![Window {
                start: 0,
                end: 10_000
            }]
        );
        assert_eq!(
            r.assign(10_000),
            vec![Window {
                start: 10_000,
                end: 20_000
            }]
        );
        assert_eq!(
            r.assign(-1),
            vec![Window {
                start: -10_000,
                end: 0
            }]
        );
    }

    #[test]
    fn hopping_windows_give_every_window_containing_the_record() {
        let r = rules("{hopping: {size: 10s, advance: 5s}}");
        assert_eq!(
            r.assign(12_000),
            vec![
                Window {
                    start: 5_000,
                    end: 15_000
                },
                Window {
                    start: 10_000,
                    end: 20_000
                }
            ]
        );
        assert_eq!(r.assign(10_000).len(), 2);
    }

    #[test]
    fn a_window_closes_at_end_plus_grace_and_late_records_have_no_open_window() {
        let r = rules("{tumbling: 10s, grace: 2s}");
        let w = Window {
            start: 0,
            end: 10_000,
        };
        assert!(!r.is_closed(w, 11_999));
        assert!(r.is_closed(w, 12_000));
        assert_eq!(
            r.open_windows(5_000, 11_000),
            vec![w],
            "late but within grace"
        );
        assert!(
            r.open_windows(5_000, 12_000).is_empty(),
            "outside grace: dropped"
        );
    }

    #[test]
    fn retention_defaults_to_size_plus_grace() {
        let r = rules("{tumbling: 10s, grace: 2s}");
        assert_eq!(r.retention, 12_000);
        assert!(!r.is_expired(
            Window {
                start: 0,
                end: 10_000
            },
            11_999
        ));
        assert!(r.is_expired(
            Window {
                start: 0,
                end: 10_000
            },
            12_000
        ));
    }

    #[test]
    fn an_advance_larger_than_the_size_is_refused() {
        let spec: WindowSpec =
            serde_yaml::from_str("{hopping: {size: 5s, advance: 10s}}").expect("yaml");
        assert!(matches!(
            WindowRules::from_spec(&spec),
            Err(WindowError::Shape(_))
        ));
    }
}
