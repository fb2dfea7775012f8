//! The byte layout of every built-in step's store: the one place that builds and parses
//! store keys and the fixed-width values beside them. The steps write through it and the
//! queries (`crate::query`) read through it, so the two cannot drift apart.
//!
//! Store layouts (keys are bytes in the step's column family):
//! - dedupe: `k<id>` → first-seen event time (8 bytes, big-endian).
//! - aggregate without a window: `k<group key>` → [`AggState`] (one window), encoded by
//!   [`super::encoding`] (JSON or binary).
//! - windowed aggregate: `w<group key>\0<start><end>` → [`WindowAgg`] (`encoding`), one row per
//!   window (`start`, `end` as 8 order-preserving bytes), so a record rewrites only its
//!   windows and a key's stored value does not grow with its windows; and
//!   `t<due><group key>\0<start><end>` → empty, one per window: when it closes or
//!   expires, so closing windows is a range read. `m:window-rows` marks a store in this
//!   layout (older stores held every window of a key in one `k` value, with a due index
//!   `d<due><group>` per key; they are converted once).
//! - dedupe and aggregate: `m:stream-time` → the step's stream time (8 bytes,
//!   big-endian). It does not start with `k`, so no scan of the `k` keys meets it.
//! - stream–stream join: `bl<join key>` / `br<join key>` → the JSON list of that side's
//!   buffered records of the key; `m:stream-time` as above.
//! - batch: `h<group>` → JSON [`OpenBatch`]; `r<group>\0<seq:be32>` → a buffered record.
//!   With several source topics `<group>` is `<user's group>\x1f<topic>`, one open batch
//!   per topic.
//!
//! Owns: the prefixes, separators and fixed-width encodings. Must not touch: the stores
//! themselves (no I/O here) or the JSON values' shapes, which belong to the step that
//! writes them ([`AggState`], [`OpenBatch`]).
//!
//! [`AggState`]: super::AggState
//! [`WindowAgg`]: super::WindowAgg
//! [`OpenBatch`]: super::OpenBatch

/// Prefix of user keys in a dedupe store (ids) and an aggregate store (group keys).
pub const KEY_PREFIX: &[u8] = b"k";
/// Prefix of a batch store's open-batch headers.
pub const HEADER_PREFIX: &[u8] = b"h";
/// Prefix of a batch store's buffered records.
pub const RECORD_PREFIX: &[u8] = b"r";
/// A dedupe or aggregate step's stream time: not a user key.
pub const STREAM_TIME: &[u8] = b"m:stream-time";
/// Prefix of the per-key due index of a windowed aggregate store from before window
/// rows (read once, to convert it).
pub const DUE_PREFIX: &[u8] = b"d";
/// Marked a per-key due index as complete, before window rows.
pub const DUE_INDEX_MARK: &[u8] = b"m:due-index";
/// Prefix of a windowed aggregate's window rows.
pub const WINDOW_PREFIX: &[u8] = b"w";
/// Prefix of a windowed aggregate's per-window due index.
pub const WINDOW_DUE_PREFIX: &[u8] = b"t";
/// Present once a windowed aggregate store holds one row per window.
pub const WINDOW_ROWS_MARK: &[u8] = b"m:window-rows";
/// Ends the group in a window row's key, before its start and end.
const GROUP_END: u8 = 0;
/// Separates the user's group from the topic in a batch group (several source topics).
pub const TOPIC_SEPARATOR: char = '\u{1f}';
/// [`TOPIC_SEPARATOR`] as the byte it is in a key (it is ASCII).
const TOPIC_SEPARATOR_BYTE: u8 = TOPIC_SEPARATOR as u8;
/// Ends the group in a buffered record's key, before the sequence number.
const RECORD_SEPARATOR: &[u8] = b"\0";

/// `prefix` followed by the user's key bytes.
pub fn prefixed(prefix: &[u8], user: &[u8]) -> Vec<u8> {
    [prefix, user].concat()
}

/// A dedupe store's key for `id`: `k<id>`.
pub fn dedupe_key(id: &str) -> Vec<u8> {
    prefixed(KEY_PREFIX, id.as_bytes())
}

/// An aggregate store's key for `group`: `k<group>`.
pub fn aggregate_key(group: &str) -> Vec<u8> {
    prefixed(KEY_PREFIX, group.as_bytes())
}

/// The user key (a dedupe id or an aggregate group) of a `k` key; `None` for any other
/// key of the store (such as [`STREAM_TIME`]).
pub fn user_key(key: &[u8]) -> Option<&[u8]> {
    key.strip_prefix(KEY_PREFIX)
}

/// A batch store's open-batch header key for `group`: `h<group>`.
pub fn header_key(group: &str) -> Vec<u8> {
    prefixed(HEADER_PREFIX, group.as_bytes())
}

/// The group of a header key; `None` for a buffered record's key.
pub fn header_group(key: &[u8]) -> Option<&[u8]> {
    key.strip_prefix(HEADER_PREFIX)
}

/// Whether `key` (found under the header key `header`) is that group's header or one of
/// its per-topic headers (`h<group>\x1f<topic>`), not another group that merely starts
/// with the same bytes.
pub fn is_header_of(header: &[u8], key: &[u8]) -> bool {
    key.len() == header.len() || key.get(header.len()) == Some(&TOPIC_SEPARATOR_BYTE)
}

/// A batch store's key for the `seq`-th buffered record of `group`:
/// `r<group>\0<seq:be32>`. Big-endian so a group's records sort in arrival order.
pub fn record_key(group: &str, seq: u32) -> Vec<u8> {
    [
        RECORD_PREFIX,
        group.as_bytes(),
        RECORD_SEPARATOR,
        &seq.to_be_bytes(),
    ]
    .concat()
}

/// The batch group of a record from `topic` when a step reads several source topics: a
/// batch id's offsets must all belong to one topic.
pub fn topic_group(group: &str, topic: &str) -> String {
    format!("{group}{TOPIC_SEPARATOR}{topic}")
}

/// A batch group split into the user's group and, with several source topics, the topic.
pub fn split_topic_group(group: &str) -> (&str, Option<&str>) {
    match group.split_once(TOPIC_SEPARATOR) {
        Some((g, t)) => (g, Some(t)),
        None => (group, None),
    }
}

/// Prefix of a stream–stream join's buffers.
pub const JOIN_BUFFER_PREFIX: &[u8] = b"b";

/// The side of a stream–stream join a record is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum JoinSide {
    /// The records that flow through the steps to the join.
    Left,
    /// The other stream's records.
    Right,
}

impl JoinSide {
    pub fn other(self) -> Self {
        match self {
            Self::Left => Self::Right,
            Self::Right => Self::Left,
        }
    }
    fn byte(self) -> u8 {
        match self {
            Self::Left => b'l',
            Self::Right => b'r',
        }
    }
}

/// A join buffer's key: `b<l|r><join key>`.
pub fn join_buffer_key(side: JoinSide, key: &str) -> Vec<u8> {
    [JOIN_BUFFER_PREFIX, &[side.byte()], key.as_bytes()].concat()
}

/// The side and join key of a [`join_buffer_key`]; `None` for any other key.
pub fn parse_join_buffer_key(k: &[u8]) -> Option<(JoinSide, String)> {
    let rest = k.strip_prefix(JOIN_BUFFER_PREFIX)?;
    let (side, key) = rest.split_first()?;
    let side = match side {
        b'l' => JoinSide::Left,
        b'r' => JoinSide::Right,
        _ => return None,
    };
    Some((side, String::from_utf8_lossy(key).into_owned()))
}

/// The first key past every key that starts with `prefix` (`k` → `l`): the open end of a
/// scan of the whole prefix. `None` for the empty prefix (scan to the end).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    prefix
        .split_last()
        .map(|(last, head)| [head, &[last.saturating_add(1)]].concat())
}

/// `t` as 8 bytes that sort as the numbers do (sign bit flipped, big-endian).
fn ordered(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

/// The due index key of `group`, due at `at`: `d<at><group>`.
pub fn due_key(at: i64, group: &str) -> Vec<u8> {
    [DUE_PREFIX, &ordered(at), group.as_bytes()].concat()
}

/// The first due index key due at `at` or later: keys below it are due before `at`.
pub fn due_bound(at: i64) -> Vec<u8> {
    [DUE_PREFIX, &ordered(at)].concat()
}

/// The due time and group of a due index key.
pub fn split_due_key(key: &[u8]) -> Option<(i64, &[u8])> {
    let rest = key.strip_prefix(DUE_PREFIX)?;
    let (at, group) = rest.split_at_checked(8)?;
    let at = u64::from_be_bytes(<[u8; 8]>::try_from(at).ok()?) ^ (1 << 63);
    Some((at as i64, group))
}

/// Whether `group` can key a window row: its end is marked by a NUL byte.
pub fn windowable_group(group: &str) -> bool {
    !group.as_bytes().contains(&GROUP_END)
}

/// Every window row of `group` starts with this: `w<group>\0`.
pub fn window_group_prefix(group: &str) -> Vec<u8> {
    [WINDOW_PREFIX, group.as_bytes(), &[GROUP_END]].concat()
}

/// A window row's key: `w<group>\0<start><end>`.
pub fn window_key(group: &str, start: i64, end: i64) -> Vec<u8> {
    [
        window_group_prefix(group).as_slice(),
        &ordered(start),
        &ordered(end),
    ]
    .concat()
}

fn unordered(b: &[u8]) -> Option<i64> {
    let v = u64::from_be_bytes(<[u8; 8]>::try_from(b).ok()?) ^ (1 << 63);
    Some(v as i64)
}

/// The group, start and end of a window row's key.
pub fn split_window_key(key: &[u8]) -> Option<(&[u8], i64, i64)> {
    let rest = key.strip_prefix(WINDOW_PREFIX)?;
    let (head, times) = rest.split_at_checked(rest.len().checked_sub(16)?)?;
    let (group, end_mark) = head.split_last().map(|(l, g)| (g, *l))?;
    if end_mark != GROUP_END {
        return None;
    }
    Some((group, unordered(&times[..8])?, unordered(&times[8..])?))
}

/// The due index key of the window row `window`, due at `at`: `t<at><group>\0<start><end>`.
pub fn window_due_key(at: i64, window: &[u8]) -> Vec<u8> {
    let row = window.strip_prefix(WINDOW_PREFIX).unwrap_or(window);
    [WINDOW_DUE_PREFIX, &ordered(at), row].concat()
}

/// The first window due key due at `at` or later.
pub fn window_due_bound(at: i64) -> Vec<u8> {
    [WINDOW_DUE_PREFIX, &ordered(at)].concat()
}

/// The due time and the window row's key of a window due key.
pub fn split_window_due_key(key: &[u8]) -> Option<(i64, Vec<u8>)> {
    let rest = key.strip_prefix(WINDOW_DUE_PREFIX)?;
    let (at, row) = rest.split_at_checked(8)?;
    Some((unordered(at)?, [WINDOW_PREFIX, row].concat()))
}

/// An event time as stored (a dedupe mark, a stream time): 8 bytes, big-endian.
pub fn encode_time(t: i64) -> Vec<u8> {
    t.to_be_bytes().to_vec()
}

/// Reads [`encode_time`]'s bytes; `None` unless exactly 8 bytes.
pub fn decode_time(v: &[u8]) -> Option<i64> {
    <[u8; 8]>::try_from(v).ok().map(i64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_keys_sort_by_time_then_group_and_round_trip() {
        let times = [i64::MIN, -5, -1, 0, 1, 1_700_000_000_000, i64::MAX];
        let keys: Vec<Vec<u8>> = times.iter().map(|t| due_key(*t, "g")).collect();
        assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "ordered like the numbers"
        );
        for t in times {
            assert_eq!(split_due_key(&due_key(t, "u-1")), Some((t, &b"u-1"[..])));
            assert!(due_key(t, "") >= due_bound(t));
            assert!(due_key(t.saturating_sub(1), "zzz") < due_bound(t) || t == i64::MIN);
        }
        assert!(
            due_key(i64::MAX, "g").as_slice() < KEY_PREFIX,
            "the index sorts before the groups"
        );
    }

    #[test]
    fn window_rows_sort_by_group_then_start_and_round_trip() {
        let a = window_key("u", -60_000, 0);
        let b = window_key("u", 0, 60_000);
        let c = window_key("u", 60_000, 120_000);
        let d = window_key("u1", -120_000, 0);
        assert!(a < b && b < c && c < d, "by group, then start");
        let p = window_group_prefix("u");
        assert!([&a, &b, &c].iter().all(|k| k.starts_with(&p)));
        assert!(!d.starts_with(&p), "another group is not under the prefix");
        assert_eq!(split_window_key(&b), Some((&b"u"[..], 0, 60_000)));
        assert_eq!(
            split_window_key(&window_key("", i64::MIN, i64::MAX)),
            Some((&b""[..], i64::MIN, i64::MAX))
        );
        assert_eq!(split_window_key(b"wu"), None);
        assert!(!windowable_group("a\0b") && windowable_group("a b"));
        let due = window_due_key(5, &b);
        assert_eq!(split_window_due_key(&due), Some((5, b.clone())));
        assert!(due >= window_due_bound(5) && due < window_due_bound(6));
        assert!(window_due_key(i64::MAX, &b).as_slice() < WINDOW_PREFIX);
    }

    #[test]
    fn the_layout_bytes_stay_what_existing_stores_hold() {
        assert_eq!(dedupe_key("id"), b"kid");
        assert_eq!(aggregate_key("g"), b"kg");
        assert_eq!(header_key("g"), b"hg");
        assert_eq!(record_key("g", 258), b"rg\0\0\0\x01\x02");
        assert_eq!(topic_group("g", "t"), "g\u{1f}t");
        assert_eq!(encode_time(1), vec![0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(prefix_end(KEY_PREFIX), Some(b"l".to_vec()));
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn keys_parse_back() {
        assert_eq!(user_key(&dedupe_key("id")), Some(b"id".as_slice()));
        assert_eq!(user_key(STREAM_TIME), None);
        assert_eq!(header_group(&header_key("g")), Some(b"g".as_slice()));
        assert_eq!(header_group(&record_key("g", 0)), None);
        assert_eq!(split_topic_group(&topic_group("g", "t")), ("g", Some("t")));
        assert_eq!(split_topic_group("g"), ("g", None));
        assert_eq!(decode_time(&encode_time(-5)), Some(-5));
        assert_eq!(decode_time(b"xy"), None);
        let h = header_key("g");
        assert!(is_header_of(&h, &h));
        assert!(is_header_of(
            &h,
            header_key(&topic_group("g", "t")).as_slice()
        ));
        assert!(!is_header_of(&h, &header_key("gg")));
        assert_eq!(join_buffer_key(JoinSide::Right, "u1"), b"bru1");
        assert_eq!(
            parse_join_buffer_key(&join_buffer_key(JoinSide::Left, "u1")),
            Some((JoinSide::Left, "u1".to_string()))
        );
        assert_eq!(parse_join_buffer_key(STREAM_TIME), None);
    }
}
