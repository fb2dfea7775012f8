//! The bytes of an aggregate store's values: [`AggState`] (an unwindowed aggregate's
//! group) and [`WindowAgg`] (one window's row), in either stored encoding.
//!
//! Two encodings are read, whatever this worker writes: JSON (the first byte is `{`:
//! every Oxbow before the binary encoding wrote it) and binary version 1 (the first byte
//! is [`BINARY_V1`], which no JSON text starts with). Which one is written is the app's
//! [`StoreEncoding`], chosen by the operator: binary only once no pod that reads JSON
//! alone can see the store or its changelog (`docs/worker.md`, "Store encoding"). A value
//! whose first byte is neither is an error that stops the task, never a record skipped:
//! it is state this worker cannot read (a later version's encoding, or damage).
//!
//! Owns: both encodings of these two types. Must not touch: what the accumulators
//! mean (`accumulators.rs`) or the keys (`keys.rs`).
//!
//! Binary version 1, little-endian, fixed width:
//!
//! ```text
//! WindowAgg: 0x01 window
//! AggState:  0x01 u32:count window*
//! window:    i64:start i64:end u8:emitted u16:count acc*
//! acc:       u8:kind, then by kind
//!            1 count  i64:n
//!            2 sum    i64:int f64:float u8:is_float
//!            3 min    u8:flags(1 = has a value, 2 = is_float) f64:v
//!            4 max    as min
//!            5 avg    f64:sum i64:n
//!            6 last   i64:ts u32:len json(len bytes)
//! ```

use oxbow_crds::StoreEncoding;
use serde_json::Value as Json;

use super::accumulators::{Acc, AggState, WindowAgg};

/// The first byte of a binary version 1 value.
pub const BINARY_V1: u8 = 0x01;

/// A stored aggregate value this worker cannot read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the value is empty")]
    Empty,
    #[error("invalid JSON")]
    Json(#[source] serde_json::Error),
    #[error("unknown store encoding (first byte 0x{0:02x}): written by a later Oxbow, or damaged")]
    UnknownEncoding(u8),
    #[error("binary value cut short at byte {at}")]
    Truncated { at: usize },
    #[error("unknown accumulator kind {kind} at byte {at}")]
    UnknownKind { kind: u8, at: usize },
    #[error("the value of a `last` accumulator is not JSON")]
    LastValue(#[source] serde_json::Error),
    #[error("{extra} byte(s) after the end of the value")]
    Trailing { extra: usize },
}

/// An unwindowed aggregate's group, in `encoding`.
pub fn encode_state(s: &AggState, encoding: StoreEncoding) -> Vec<u8> {
    match encoding {
        // Serializing plain data into a Vec cannot fail.
        StoreEncoding::Json => serde_json::to_vec(s).unwrap_or_default(),
        StoreEncoding::Binary => {
            let mut out = Vec::with_capacity(5 + s.windows.len() * 48);
            out.push(BINARY_V1);
            out.extend_from_slice(&(s.windows.len() as u32).to_le_bytes());
            for w in &s.windows {
                put_window(&mut out, w);
            }
            out
        }
    }
}

/// One window's row, in `encoding`.
pub fn encode_window(w: &WindowAgg, encoding: StoreEncoding) -> Vec<u8> {
    match encoding {
        StoreEncoding::Json => serde_json::to_vec(w).unwrap_or_default(),
        StoreEncoding::Binary => {
            let mut out = Vec::with_capacity(20 + w.acc.len() * 20);
            out.push(BINARY_V1);
            put_window(&mut out, w);
            out
        }
    }
}

/// An unwindowed aggregate's group, in whichever encoding it was stored.
pub fn decode_state(b: &[u8]) -> Result<AggState, DecodeError> {
    match b.first() {
        Some(b'{') => serde_json::from_slice(b).map_err(DecodeError::Json),
        Some(&BINARY_V1) => {
            let mut r = Reader { b, at: 1 };
            let n = r.u32()? as usize;
            let mut windows = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                windows.push(r.window()?);
            }
            r.end()?;
            Ok(AggState { windows })
        }
        Some(other) => Err(DecodeError::UnknownEncoding(*other)),
        None => Err(DecodeError::Empty),
    }
}

/// One window's row, in whichever encoding it was stored.
pub fn decode_window(b: &[u8]) -> Result<WindowAgg, DecodeError> {
    match b.first() {
        Some(b'{') => serde_json::from_slice(b).map_err(DecodeError::Json),
        Some(&BINARY_V1) => {
            let mut r = Reader { b, at: 1 };
            let w = r.window()?;
            r.end()?;
            Ok(w)
        }
        Some(other) => Err(DecodeError::UnknownEncoding(*other)),
        None => Err(DecodeError::Empty),
    }
}

fn put_window(out: &mut Vec<u8>, w: &WindowAgg) {
    out.extend_from_slice(&w.start.to_le_bytes());
    out.extend_from_slice(&w.end.to_le_bytes());
    out.push(u8::from(w.emitted));
    // An aggregate has as many accumulators as the spec has fields (a handful).
    out.extend_from_slice(&(w.acc.len() as u16).to_le_bytes());
    for a in &w.acc {
        put_acc(out, a);
    }
}

fn put_acc(out: &mut Vec<u8>, a: &Acc) {
    let extremum = |out: &mut Vec<u8>, kind: u8, v: &Option<f64>, is_float: bool| {
        out.push(kind);
        out.push(u8::from(v.is_some()) | (u8::from(is_float) << 1));
        out.extend_from_slice(&v.unwrap_or(0.0).to_le_bytes());
    };
    match a {
        Acc::Count { n } => {
            out.push(1);
            out.extend_from_slice(&n.to_le_bytes());
        }
        Acc::Sum {
            int,
            float,
            is_float,
        } => {
            out.push(2);
            out.extend_from_slice(&int.to_le_bytes());
            out.extend_from_slice(&float.to_le_bytes());
            out.push(u8::from(*is_float));
        }
        Acc::Min { v, is_float } => extremum(out, 3, v, *is_float),
        Acc::Max { v, is_float } => extremum(out, 4, v, *is_float),
        Acc::Avg { sum, n } => {
            out.push(5);
            out.extend_from_slice(&sum.to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
        }
        Acc::Last { v, ts } => {
            out.push(6);
            out.extend_from_slice(&ts.to_le_bytes());
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            // Serializing a JSON value into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, v);
            let len = (out.len() - at - 4) as u32;
            out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
    }
}

/// Reads a binary value front to back; every read checks the length.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let bytes = self
            .b
            .get(self.at..self.at + N)
            .ok_or(DecodeError::Truncated { at: self.at })?;
        self.at += N;
        // `get` returned exactly N bytes.
        Ok(bytes.try_into().unwrap_or([0; N]))
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.take()?))
    }
    fn f64(&mut self) -> Result<f64, DecodeError> {
        Ok(f64::from_le_bytes(self.take()?))
    }

    fn window(&mut self) -> Result<WindowAgg, DecodeError> {
        let start = self.i64()?;
        let end = self.i64()?;
        let emitted = self.u8()? != 0;
        let n = self.u16()? as usize;
        let mut acc = Vec::with_capacity(n);
        for _ in 0..n {
            acc.push(self.acc()?);
        }
        Ok(WindowAgg {
            start,
            end,
            emitted,
            acc,
        })
    }

    fn acc(&mut self) -> Result<Acc, DecodeError> {
        let at = self.at;
        Ok(match self.u8()? {
            1 => Acc::Count { n: self.i64()? },
            2 => Acc::Sum {
                int: self.i64()?,
                float: self.f64()?,
                is_float: self.u8()? != 0,
            },
            kind @ (3 | 4) => {
                let flags = self.u8()?;
                let v = self.f64()?;
                let v = (flags & 1 != 0).then_some(v);
                let is_float = flags & 2 != 0;
                if kind == 3 {
                    Acc::Min { v, is_float }
                } else {
                    Acc::Max { v, is_float }
                }
            }
            5 => Acc::Avg {
                sum: self.f64()?,
                n: self.i64()?,
            },
            6 => {
                let ts = self.i64()?;
                let len = self.u32()? as usize;
                let bytes = self
                    .b
                    .get(self.at..self.at + len)
                    .ok_or(DecodeError::Truncated { at: self.at })?;
                self.at += len;
                let v: Json = serde_json::from_slice(bytes).map_err(DecodeError::LastValue)?;
                Acc::Last { v, ts }
            }
            kind => return Err(DecodeError::UnknownKind { kind, at }),
        })
    }

    fn end(&self) -> Result<(), DecodeError> {
        match self.b.len() - self.at {
            0 => Ok(()),
            extra => Err(DecodeError::Trailing { extra }),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn every_kind() -> Vec<Acc> {
        vec![
            Acc::Count { n: -3 },
            Acc::Sum {
                int: i64::MAX,
                float: 1.5,
                is_float: true,
            },
            Acc::Min {
                v: None,
                is_float: false,
            },
            Acc::Min {
                v: Some(-0.25),
                is_float: true,
            },
            Acc::Max {
                v: Some(7.0),
                is_float: false,
            },
            Acc::Avg { sum: 10.0, n: 4 },
            Acc::Last {
                v: json!({"a": [1, "x", null]}),
                ts: -5,
            },
            Acc::Last {
                v: Json::Null,
                ts: 0,
            },
        ]
    }

    fn window(start: i64) -> WindowAgg {
        WindowAgg {
            start,
            end: start + 60_000,
            emitted: start % 2 == 0,
            acc: every_kind(),
        }
    }

    #[test]
    fn every_accumulator_reads_back_from_either_encoding() {
        for enc in [StoreEncoding::Json, StoreEncoding::Binary] {
            let w = window(1_700_000_000_000);
            assert_eq!(decode_window(&encode_window(&w, enc)).expect("reads"), w);
            let s = AggState {
                windows: vec![window(0), window(1), window(i64::MIN)],
            };
            assert_eq!(decode_state(&encode_state(&s, enc)).expect("reads"), s);
            let empty = AggState::default();
            assert_eq!(
                decode_state(&encode_state(&empty, enc)).expect("reads"),
                empty
            );
        }
    }

    #[test]
    fn a_value_stored_as_json_by_an_earlier_worker_still_reads() {
        let stored = br#"{"start":0,"end":10,"emitted":true,"acc":[{"k":"count","n":2},{"k":"last","v":"x","ts":5}]}"#;
        let w = decode_window(stored).expect("reads");
        assert_eq!((w.start, w.end, w.emitted), (0, 10, true));
        assert_eq!(
            w.acc,
            vec![
                Acc::Count { n: 2 },
                Acc::Last {
                    v: json!("x"),
                    ts: 5
                }
            ]
        );
        let state = format!("{{\"windows\":[{}]}}", String::from_utf8_lossy(stored));
        assert_eq!(
            decode_state(state.as_bytes()).expect("reads").windows,
            vec![w]
        );
    }

    #[test]
    fn binary_is_the_smaller_encoding_and_starts_with_its_version() {
        let w = window(1_700_000_000_000);
        let binary = encode_window(&w, StoreEncoding::Binary);
        assert_eq!(binary[0], BINARY_V1);
        assert!(binary.len() < encode_window(&w, StoreEncoding::Json).len());
        let count = WindowAgg {
            acc: vec![Acc::Count { n: 1 }],
            ..window(0)
        };
        // 1 version + 8 + 8 + 1 + 2 + (1 + 8).
        assert_eq!(encode_window(&count, StoreEncoding::Binary).len(), 29);
    }

    #[test]
    fn a_value_this_worker_cannot_read_is_an_error_that_names_why() {
        let good = encode_window(&window(0), StoreEncoding::Binary);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "empty"),
            (vec![0x02, 0, 0], "unknown store encoding (first byte 0x02)"),
            (b"[1]".to_vec(), "unknown store encoding (first byte 0x5b)"),
            (b"{\"start\":".to_vec(), "invalid JSON"),
            (good[..good.len() - 3].to_vec(), "cut short"),
            ([good.as_slice(), &[0]].concat(), "1 byte(s) after the end"),
            (
                [&[BINARY_V1][..], &[0; 17], &[1, 0], &[9]].concat(),
                "unknown accumulator kind 9 at byte 20",
            ),
        ];
        for (bytes, want) in cases {
            let err = decode_window(&bytes).expect_err(want).to_string();
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
        assert!(
            decode_state(&[BINARY_V1, 1, 0, 0, 0])
                .expect_err("a window is missing")
                .to_string()
                .contains("cut short")
        );
    }
}
