//! The change log of a channel: appending, reading ranges, the head, and trimming by
//! retention.
//!
//! An append is encoded here ([`Request`]: the log entries and their locs) and handed to the
//! channel's writer (`group.rs`), which appends every request waiting for the channel with one
//! call of the append script (`scripts/append.lua`: for each request in turn, its idempotency
//! check, gapless seqs, the datetime clamp, the index and FeedSync items, its idempotency
//! record; then one head announcement for the call). Each request gets its own outcome
//! ([`outcome`]), as if it had been appended alone.
//!
//! The log is a stream whose entries hold up to 32 changes with consecutive seqs each (a chunk,
//! see the script): entry id `FIRST-0` (the seq of its first change), then one field per
//! change in seq order, `e` when the entry holds one change and `c` for each when it holds
//! more. A field's value is the change's final datetime as a sortable [`datetime_key`], then
//! the change as the source sent it ([`Stored`]). Entries never change; retention removes
//! whole entries only (an entry that holds the first retained change stays whole) and readers
//! leave out what lies before `oldest`.
//!
//! Older hubs wrote an entry per change (field `e`), which reads the same. A hub that knows
//! only those refuses a `c` entry as corrupt instead of reading it wrong.

use redis::{AsyncCommands, Cmd, Script, Value};
use time::OffsetDateTime;
use tokio::sync::watch;

use super::events::raise;
use super::{decode, key, timed, RedisStore, EVENTS};
use crate::model::{Change, ChangeType, Link, NewChange, Retention};
use crate::store::{
    new_epoch, Appended, ChannelHead, IdempotencyKey, Origin, StoreError, IDEMPOTENCY_TTL,
};

/// Entries read per `XRANGE` while looking for the age cut-off.
const SCAN_PAGE: usize = 1000;

/// A datetime as a fixed-width ([`DT_KEY_LEN`]) decimal string that sorts like the datetime
/// (Lua compares it as a string; numbers in Lua are doubles and would lose nanoseconds).
const DT_BIAS: i128 = 1_000_000_000_000_000_000_000;
/// The append script relies on this width.
const DT_KEY_LEN: usize = 23;

pub fn datetime_key(t: OffsetDateTime) -> String {
    let mut key = Vec::with_capacity(DT_KEY_LEN);
    write_datetime_key(t, &mut key);
    String::from_utf8(key).unwrap_or_default()
}

/// 10¹⁹: a key's last 19 digits fit a `u64`, and its first four are the rest.
const TEN_19: u128 = 10_000_000_000_000_000_000;

/// Appends the [`datetime_key`] of `t` to `out`, without a string of its own. The digits are
/// made with `u64` arithmetic (`write!` of an `i128` cost about a tenth of encoding a change).
fn write_datetime_key(t: OffsetDateTime, out: &mut Vec<u8>) {
    let value = t.unix_timestamp_nanos() + DT_BIAS;
    match u128::try_from(value) {
        Ok(v) if v < TEN_19 * 10_000 => {
            let mut digits = [b'0'; DT_KEY_LEN];
            let (head, tail) = digits.split_at_mut(DT_KEY_LEN - 19);
            // Both below 10¹⁹ and 10⁴ (checked above), so neither cast truncates.
            let (mut high, mut low) = ((v / TEN_19) as u64, (v % TEN_19) as u64);
            for d in tail.iter_mut().rev() {
                *d = b'0' + (low % 10) as u8;
                low /= 10;
            }
            for d in head.iter_mut().rev() {
                *d = b'0' + (high % 10) as u8;
                high /= 10;
            }
            out.extend_from_slice(&digits);
        }
        // Never for a datetime the `time` crate holds (years -9999 to 9999); kept exact anyway.
        _ => {
            use std::io::Write;
            // Writing to a Vec cannot fail.
            let _ = write!(out, "{value:023}");
        }
    }
}

fn datetime_from_key(k: &str) -> Result<OffsetDateTime, StoreError> {
    let nanos: i128 = match k.as_bytes() {
        b if b.len() == DT_KEY_LEN && b.iter().all(u8::is_ascii_digit) => {
            let number = |digits: &[u8]| {
                digits
                    .iter()
                    .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'))
            };
            let (head, tail) = b.split_at(DT_KEY_LEN - 19);
            // At most 9,999 × 10¹⁹ + 10¹⁹ - 1: far inside an i128.
            (i128::from(number(head)) * TEN_19 as i128) + i128::from(number(tail))
        }
        _ => k
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("bad datetime key {k:?}")))?,
    };
    OffsetDateTime::from_unix_timestamp_nanos(nanos - DT_BIAS)
        .map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// The datetime of the key read last, kept while entries are read one after the other: the
/// changes of a request nearly always share their key, and parsing it for each was about a
/// fiftieth of the hub's time on requests of 1,000 changes.
#[derive(Default)]
struct LastKey(Option<([u8; DT_KEY_LEN], OffsetDateTime)>);

impl LastKey {
    fn datetime(&mut self, d: &str) -> Result<OffsetDateTime, StoreError> {
        if let Some((key, at)) = &self.0 {
            if key.as_slice() == d.as_bytes() {
                return Ok(*at);
            }
        }
        let at = datetime_from_key(d)?;
        self.0 = d.as_bytes().try_into().ok().map(|key| (key, at));
        Ok(at)
    }
}

/// A change as the log entry keeps it: the source's [`NewChange`], without its empty fields
/// (a third smaller than plain serde output, and Redis's time per append grows with size).
///
/// `scripts/feedsync.lua` reads `loc` and `change` at the start of this JSON and `source` at its
/// end: keep them there.
#[derive(serde::Serialize)]
pub(super) struct Stored<'a> {
    loc: &'a str,
    change: ChangeType,
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    datetime: Option<OffsetDateTime>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    lastmod: Option<OffsetDateTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hash: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    length: Option<u64>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    media_type: Option<&'a str>,
    #[serde(skip_serializing_if = "<[Link]>::is_empty")]
    links: &'a [Link],
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<&'a str>,
}

impl Stored<'_> {
    /// Appends the JSON serde writes for it (`serde_json::to_writer`), byte for byte, but its
    /// strings copied whole where none of their bytes needs escaping (nearly always): serde
    /// looks each byte up in its escape table, which cost about a tenth of the hub's
    /// instructions per change of a large request (`docs/performance.md`, thirty-first pass).
    pub(super) fn write_to(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.extend_from_slice(br#"{"loc":"#);
        json_str(out, self.loc)?;
        out.extend_from_slice(br#","change":""#);
        out.extend_from_slice(self.change.as_str().as_bytes());
        out.push(b'"');
        for (name, at) in [
            (&br#","datetime":"#[..], self.datetime),
            (br#","lastmod":"#, self.lastmod),
        ] {
            if let Some(at) = at {
                out.extend_from_slice(name);
                time::serde::rfc3339::serialize(&at, &mut serde_json::Serializer::new(&mut *out))?;
            }
        }
        if let Some(hash) = self.hash {
            out.extend_from_slice(br#","hash":"#);
            json_str(out, hash)?;
        }
        if let Some(length) = self.length {
            out.extend_from_slice(br#","length":"#);
            out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
        }
        if let Some(media_type) = self.media_type {
            out.extend_from_slice(br#","type":"#);
            json_str(out, media_type)?;
        }
        if !self.links.is_empty() {
            out.extend_from_slice(br#","links":"#);
            serde_json::to_writer(&mut *out, self.links)?;
        }
        if let Some(source) = self.source {
            out.extend_from_slice(br#","source":"#);
            json_str(out, source)?;
        }
        out.push(b'}');
        Ok(())
    }
}

/// Whether JSON writes `bytes` as they are: no quote, backslash or control character (the
/// only bytes serde escapes).
pub(super) fn json_plain(bytes: &[u8]) -> bool {
    // A fold without an early exit: the compiler checks many bytes at a time.
    bytes.iter().fold(true, |plain, &b| {
        plain & (b >= 0x20) & (b != b'"') & (b != b'\\')
    })
}

/// `s` as a JSON string, as serde writes it: copied between quotes when [`json_plain`], else
/// by serde.
fn json_str(out: &mut Vec<u8>, s: &str) -> Result<(), serde_json::Error> {
    if !json_plain(s.as_bytes()) {
        return serde_json::to_writer(&mut *out, s);
    }
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
    Ok(())
}

impl<'a> From<&'a NewChange> for Stored<'a> {
    fn from(c: &'a NewChange) -> Stored<'a> {
        Stored {
            loc: &c.loc,
            change: c.change,
            datetime: c.datetime,
            lastmod: c.lastmod,
            hash: c.hash.as_deref(),
            length: c.length,
            media_type: c.media_type.as_deref(),
            links: &c.links,
            source: c.source.as_deref(),
        }
    }
}

/// Appends the changes of the entries of an `XRANGE` or `XREVRANGE` reply to `out`, in the
/// reply's order and each entry's own (seq order within an entry), those with a seq in `keep`
/// only. The reply is walked as it came, its entries borrowed: converting it to
/// `Vec<(String, Vec<Vec<u8>>)>` first allocated and copied every entry once more.
fn reply_to_changes(
    reply: &Value,
    keep: std::ops::RangeInclusive<u64>,
    out: &mut Vec<Change>,
) -> Result<(), StoreError> {
    let entries = match reply {
        Value::Array(entries) => entries.as_slice(),
        Value::Nil => &[],
        other => return Err(StoreError::Corrupt(format!("bad log reply {other:?}"))),
    };
    for entry in entries {
        entry_to_changes(entry, &keep, out)?;
    }
    Ok(())
}

/// Rebuilds the changes of one entry of a range reply (`[id, [field, value, …]]`) whose seqs
/// are in `keep`: its field `e` (one change, seq `id`) or each of its fields `c` (seqs `id`,
/// `id + 1`, …); other fields are passed over.
fn entry_to_changes(
    entry: &Value,
    keep: &std::ops::RangeInclusive<u64>,
    out: &mut Vec<Change>,
) -> Result<(), StoreError> {
    let bad = || StoreError::Corrupt(format!("bad log entry {entry:?}"));
    let Value::Array(parts) = entry else {
        return Err(bad());
    };
    let [Value::BulkString(id), Value::Array(fields)] = parts.as_slice() else {
        return Err(bad());
    };
    let first: u64 = std::str::from_utf8(id)
        .ok()
        .and_then(|id| id.split_once('-'))
        .and_then(|(s, _)| s.parse().ok())
        .ok_or_else(|| {
            StoreError::Corrupt(format!("bad entry id {:?}", String::from_utf8_lossy(id)))
        })?;
    let mut seq = first;
    let mut found = false;
    let mut keys = LastKey::default();
    for pair in fields.chunks(2) {
        let [Value::BulkString(name), Value::BulkString(value)] = pair else {
            continue;
        };
        if name.as_slice() != b"e" && name.as_slice() != b"c" {
            continue;
        }
        found = true;
        if keep.contains(&seq) {
            out.push(entry_change(seq, value, decode, &mut keys)?);
        }
        seq += 1;
    }
    if !found {
        return Err(StoreError::Corrupt(format!(
            "entry {first} lacks its changes"
        )));
    }
    Ok(())
}

/// Rebuilds change `seq` from its entry (the `e` field of the log, the value of the index).
pub(super) fn decode_entry(seq: u64, entry: &[u8]) -> Result<Change, StoreError> {
    entry_change(seq, entry, decode, &mut LastKey::default())
}

/// Change `seq` of `entry`, whose JSON part `new` turns into the change as sent: the datetime
/// and conflicts count are read from the entry.
fn entry_change(
    seq: u64,
    entry: &[u8],
    new: impl FnOnce(&[u8]) -> Result<NewChange, StoreError>,
    keys: &mut LastKey,
) -> Result<Change, StoreError> {
    if entry.len() < DT_KEY_LEN {
        return Err(StoreError::Corrupt(format!("entry {seq} is too short")));
    }
    let (d, json) = entry.split_at(DT_KEY_LEN);
    let d = std::str::from_utf8(d).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let new = new(json)?;
    // Keep the source's own datetime (and its offset) when it was not raised.
    let datetime = match new.datetime {
        Some(own) if datetime_key(own) == d => own,
        _ => keys.datetime(d)?,
    };
    let mut change = Change::from_new(seq, new, datetime);
    change.conflicts = super::feedsync::tail_conflicts(json);
    Ok(change)
}

/// One append as the append script takes it: its changes already encoded as log entries (by
/// the caller's task, not by the channel's writer), their locs apart (the resource index is
/// keyed by loc).
pub(super) struct Request {
    idempotency: Option<IdempotencyKey>,
    /// Unix seconds: when the request came (the idempotency key's date).
    now: i64,
    /// The entries, one after the other in one buffer (one allocation for the request, not
    /// one per change); entry `i` ends at `ends[i]`.
    entries: Vec<u8>,
    ends: Vec<usize>,
    /// The changes as sent: their locs go to the script apart when it writes the resource
    /// index itself ([`append_call`]), and those stored as sent are kept for reading back
    /// ([`Request::take_changes`]).
    changes: Vec<NewChange>,
    /// Whether the entries' datetime keys never go down from one to the next: the append
    /// script then raises none of them when the first is not below the channel's latest.
    ordered: bool,
}

impl Request {
    /// Encodes `changes`; a change without a datetime takes `now`.
    pub(super) fn new(
        changes: Vec<NewChange>,
        idempotency: Option<IdempotencyKey>,
        now: OffsetDateTime,
    ) -> Result<Request, StoreError> {
        // Each entry takes its datetime key, then the JSON, which takes about this much
        // besides the strings of the change.
        let size: usize = changes
            .iter()
            .map(|c| {
                let strings = [
                    c.hash.as_deref(),
                    c.media_type.as_deref(),
                    c.source.as_deref(),
                ]
                .iter()
                .map(|s| s.map_or(0, str::len))
                .sum::<usize>();
                DT_KEY_LEN + 160 + c.loc.len() + strings + c.links.len() * 128
            })
            .sum();
        let mut entries = Vec::with_capacity(size);
        let mut ends = Vec::with_capacity(changes.len());
        let mut ordered = true;
        // Where the entry before this one starts (its datetime key), and its datetime.
        let mut previous: Option<(usize, OffsetDateTime)> = None;
        for change in &changes {
            let start = entries.len();
            let at = change.datetime.unwrap_or(now);
            match previous {
                // The datetime of the entry before (the changes of a request nearly always
                // share one): its key copied, not worked out again.
                Some((p, before)) if before == at => {
                    entries.extend_from_within(p..p + DT_KEY_LEN);
                }
                _ => {
                    write_datetime_key(at, &mut entries);
                    if let Some((p, _)) = previous {
                        ordered &= entries[p..p + DT_KEY_LEN] <= entries[start..start + DT_KEY_LEN];
                    }
                }
            }
            previous = Some((start, at));
            Stored::from(change)
                .write_to(&mut entries)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            ends.push(entries.len());
        }
        Ok(Request {
            idempotency,
            now: now.unix_timestamp(),
            entries,
            ends,
            changes,
            ordered,
        })
    }

    /// Its changes as the log holds them when the append script stored every entry as sent,
    /// numbered from `first`: what [`decode_entry`] reads from those entries.
    /// Takes the changes: the entries stay, for [`Request::take_entries`].
    pub(super) fn take_changes(&mut self, first: u64) -> Result<Vec<Change>, StoreError> {
        let changes = std::mem::take(&mut self.changes);
        // Sized up front: collecting `Result`s gives no size hint, and growing a vector of a
        // thousand changes by doubling copied them several times over.
        let mut out = Vec::with_capacity(changes.len());
        let mut keys = LastKey::default();
        for ((seq, new), entry) in (first..).zip(changes).zip(self.entries()) {
            // As decode_entry reads the entry, the change as sent standing for its JSON.
            out.push(entry_change(seq, entry, |_| Ok(new), &mut keys)?);
        }
        Ok(out)
    }

    /// Takes the entries, one after the other in one buffer, and where each one ends, as the
    /// append script stored them: each datetime key raised to `floor` and to every key before
    /// it (the script's clamp; see `scripts/append.lua`).
    pub(super) fn take_entries(&mut self, floor: Option<&[u8]>) -> (Vec<u8>, Vec<usize>) {
        let mut entries = std::mem::take(&mut self.entries);
        let ends = std::mem::take(&mut self.ends);
        let mut running = [0u8; DT_KEY_LEN];
        if let Some(floor) = floor.filter(|f| f.len() == DT_KEY_LEN) {
            running.copy_from_slice(floor);
        }
        let mut start = 0;
        for &end in &ends {
            let key = &mut entries[start..start + DT_KEY_LEN];
            if *key < running[..] {
                key.copy_from_slice(&running);
            } else {
                running.copy_from_slice(key);
            }
            start = end;
        }
        (entries, ends)
    }

    /// The number of changes.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// The entries, in order.
    fn entries(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(start, end)| &self.entries[start..end])
    }

    /// The bytes of its arguments (near enough: entries, locs and key).
    pub(super) fn size(&self) -> usize {
        let key = self
            .idempotency
            .as_ref()
            .map_or(0, |k| k.key.len() + k.fingerprint.len());
        let locs: usize = self.changes.iter().map(|c| c.loc.len()).sum();
        key + self.entries.len() + locs
    }
}

/// The call of `script` (the append script, or one that runs it: the merge script) that appends
/// `requests` to `channel` in one go, as one `EVALSHA` command: the keys and arguments of
/// `scripts/append.lua`, written straight into the command's buffer (a `ScriptInvocation`
/// keeps each argument in a `Vec` of its own, then copies them all into the command: about a
/// tenth of the hub's time under a saturating fill of 1,000-change requests). Run it with
/// [`run_script`].
///
/// Without `locs`, the changes' locs are left out: the script reads them only when it writes
/// the resource index itself (inline), and refuses then for want of them
/// ([`locs_needed`]).
pub(super) fn append_call(
    script: &Script,
    channel: &str,
    requests: &[&Request],
    locs: bool,
) -> Cmd {
    const KEYS: [&str; 8] = [
        "log",
        "meta",
        "idem",
        "idem-at",
        "res",
        "res-seq",
        "sx",
        "sx-conflicts",
    ];
    let changes: usize = requests.iter().map(|r| r.len()).sum();
    let bytes: usize = requests.iter().map(|r| r.size()).sum();
    let args = 3 + KEYS.len() + 4 + 5 * requests.len() + (1 + usize::from(locs)) * changes + 1;
    // Room for the entries and locs, the keys, and the short arguments (numbers, the hash).
    let mut cmd = Cmd::with_capacity(args, bytes + 64 * KEYS.len() + 64 + 32 * requests.len());
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(KEYS.len());
    for what in KEYS {
        cmd.arg(key(channel, what));
    }
    cmd.arg(IDEMPOTENCY_TTL.as_secs())
        .arg(EVENTS)
        .arg(channel)
        .arg(requests.len());
    for request in requests {
        match &request.idempotency {
            Some(k) => cmd.arg(&k.key).arg(&k.fingerprint),
            None => cmd.arg("").arg(""),
        };
        cmd.arg(request.now)
            .arg(request.len())
            .arg(if request.ordered { "1" } else { "0" });
    }
    for request in requests {
        for entry in request.entries() {
            cmd.arg(entry);
        }
    }
    if locs {
        for request in requests {
            for change in &request.changes {
                cmd.arg(&change.loc);
            }
        }
    }
    // The channel's epoch, should it have none yet (its first append, or its log lost).
    cmd.arg(new_epoch());
    cmd
}

/// Whether the append script refused a call without locs because it writes the resource
/// index itself for this channel now (some FeedSync item carries conflicts).
pub(super) fn locs_needed(e: &redis::RedisError) -> bool {
    e.to_string().contains("locs needed for")
}

/// What the append script answered (see `scripts/append.lua`): five numbers per request —
/// [`outcome`] reads the first four, the fifth is 1 when the request's entries were stored
/// as sent — the channel's epoch (none only from the merge script when it appended
/// nothing), and per request the datetime key its entries were raised to at least (none
/// when the channel had none; all none from the merge script when it appended nothing).
pub(super) struct Answer {
    pub numbers: Vec<u64>,
    pub epoch: Option<String>,
    pub floors: Vec<Option<Vec<u8>>>,
}

impl Answer {
    /// Reads the script's reply for `requests` requests.
    pub(super) fn read(reply: Value, requests: usize) -> Result<Answer, StoreError> {
        let bad = |reply: &Value| {
            StoreError::Corrupt(format!(
                "the append script answered {reply:?} for {requests} requests"
            ))
        };
        let Value::Array(items) = &reply else {
            return Err(bad(&reply));
        };
        if items.len() <= 5 * requests {
            return Err(bad(&reply));
        }
        let (numbers, rest) = items.split_at(5 * requests);
        let (epoch, floors) = rest.split_first().ok_or_else(|| bad(&reply))?;
        let epoch = match epoch {
            Value::Nil => None,
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => return Err(bad(&reply)),
        };
        let numbers = numbers
            .iter()
            .map(|n| match n {
                Value::Int(n) => u64::try_from(*n).ok(),
                _ => None,
            })
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| bad(&reply))?;
        let floors = match floors.len() {
            0 => vec![None; requests],
            n if n == requests => floors
                .iter()
                .map(|f| match f {
                    Value::BulkString(b) if b.len() == DT_KEY_LEN => Some(b.clone()),
                    _ => None,
                })
                .collect(),
            _ => return Err(bad(&reply)),
        };
        Ok(Answer {
            numbers,
            epoch,
            floors,
        })
    }
}

/// Runs `call`, an `EVALSHA` of `script` (see [`append_call`]); when Redis does not have the
/// script (restarted, or its scripts flushed), loads it and runs the call once more.
pub(super) async fn run_script<T: redis::FromRedisValue>(
    script: &Script,
    call: &Cmd,
    conn: &mut super::conn::Conn,
) -> redis::RedisResult<T> {
    match call.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            call.query_async(conn).await
        }
        other => other,
    }
}

/// What the append script answered for one request: `[status, accepted, first, last, sent]`.
pub(super) fn outcome(answer: &[u64]) -> Result<Appended, StoreError> {
    let &[status, accepted, first, last, _sent] = answer else {
        return Err(StoreError::Corrupt(format!(
            "the append script answered {answer:?}"
        )));
    };
    let appended = |replayed| Appended {
        accepted: accepted as usize,
        first,
        last,
        replayed,
    };
    match status {
        0 => Ok(appended(false)),
        1 => Ok(appended(true)),
        2 => Err(StoreError::IdempotencyConflict),
        other => Err(StoreError::Corrupt(format!(
            "the append script answered status {other}"
        ))),
    }
}

/// Appends `changes` to `channel`: encodes them here, then hands them to the channel's writer,
/// which appends them with whatever else waits for the channel, in one script call (see
/// `group.rs`).
pub(super) async fn append(
    store: &RedisStore,
    channel: &str,
    changes: Vec<NewChange>,
    idempotency: Option<IdempotencyKey>,
    now: OffsetDateTime,
) -> Result<Appended, StoreError> {
    let request = Request::new(changes, idempotency, now)?;
    store.appends.append(channel, request).await
}

/// Up to `limit` changes of `channel`: from seq `from` on, or the newest ones (oldest first
/// either way). Never one before the channel's `oldest`.
pub(super) async fn range(
    store: &RedisStore,
    channel: &str,
    from: u64,
    limit: usize,
    newest: bool,
) -> Result<Vec<Change>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let mut conn = store.conn();
    let from = if newest {
        let last: Option<u64> = timed(conn.hget(key(channel, "meta"), "last")).await?;
        let Some(last) = last.filter(|&l| l > 0) else {
            return Ok(Vec::new());
        };
        (last + 1).saturating_sub(limit as u64).max(1)
    } else {
        from.max(1)
    };
    let upto = from.saturating_add(limit as u64 - 1);
    // What this instance appended last, from `from` on, is taken from memory (`recent.rs`)
    // when Redis still has the epoch it was appended under and retention has not passed
    // `from`; the log is read for the rest of the range, in the same round trip.
    let held = if newest {
        None
    } else {
        store
            .recent
            .take_from_after_calls(channel, from, upto)
            .await
    };
    if let Some((epoch, mut held)) = held {
        let next = from + held.len() as u64;
        let read = read_log(&mut conn, channel, next, upto).await?;
        if read.epoch.as_deref() == Some(epoch.as_str()) && read.oldest <= from {
            held.extend(read.changes);
            return Ok(held);
        }
    }
    let mut out = read_log(&mut conn, channel, from, upto).await?.changes;
    out.truncate(limit);
    Ok(out)
}

/// A range read of the log, with the channel's `oldest` and epoch.
struct LogRead {
    oldest: u64,
    epoch: Option<String>,
    /// The changes `from.max(oldest)..=upto` (none when `from > upto`).
    changes: Vec<Change>,
}

/// Reads changes `from..=upto` of `channel`'s log (none when `from > upto`), never one before
/// its `oldest`, in one round trip with the channel's `oldest` and epoch.
async fn read_log(
    conn: &mut super::conn::Conn,
    channel: &str,
    from: u64,
    upto: u64,
) -> Result<LogRead, StoreError> {
    let log = key(channel, "log");
    // In one round trip: where the log starts and its epoch, the entry before `from` (it may
    // hold `from` and more: an entry holds a chunk of changes), and the entries that begin in
    // `from..=upto` (at most `upto - from + 1` of them: every entry holds one change at least).
    let mut pipe = redis::pipe();
    pipe.cmd("HMGET")
        .arg(key(channel, "meta"))
        .arg("oldest")
        .arg("epoch");
    if from <= upto {
        // From seq 1: `0-0`, before every entry.
        pipe.cmd("XREVRANGE")
            .arg(&log)
            .arg(format!("{}-0", from - 1))
            .arg("-")
            .arg("COUNT")
            .arg(1);
        pipe.cmd("XRANGE")
            .arg(&log)
            .arg(format!("{from}-0"))
            .arg(format!("{upto}-0"));
    }
    let replies: Vec<Value> = timed(pipe.query_async(conn)).await?;
    // The meta, then (when the range is not empty) the entry before it and those in it.
    let mut replies = replies.into_iter();
    let meta = replies.next().unwrap_or(Value::Nil);
    let (oldest, epoch): (Option<u64>, Option<String>) = redis::from_redis_value(meta)
        .map_err(|e| StoreError::Corrupt(format!("bad meta reply: {e}")))?;
    let oldest = oldest.unwrap_or(1);
    let keep = from.max(oldest)..=upto;
    let mut changes = Vec::new();
    for reply in replies {
        reply_to_changes(&reply, keep.clone(), &mut changes)?;
    }
    Ok(LogRead {
        oldest,
        epoch,
        changes,
    })
}

/// The head of `channel`, from a read sent after this call began (see `head_reads.rs`).
pub(super) async fn head(store: &RedisStore, channel: &str) -> Result<ChannelHead, StoreError> {
    store
        .head_reads
        .head(channel, || read_head(store, channel))
        .await
}

async fn read_head(store: &RedisStore, channel: &str) -> Result<ChannelHead, StoreError> {
    let mut conn = store.conn();
    let (oldest, last): (Option<u64>, Option<u64>) = timed(
        redis::cmd("HMGET")
            .arg(key(channel, "meta"))
            .arg("oldest")
            .arg("last")
            .query_async(&mut conn),
    )
    .await?;
    let last = last.unwrap_or(0);
    raise(&store.heads, channel, last);
    Ok(ChannelHead {
        oldest: oldest.unwrap_or(1),
        last,
    })
}

pub(super) fn watch_head(store: &RedisStore, channel: &str) -> watch::Receiver<u64> {
    let mut heads = store.heads.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(tx) = heads.get(channel) {
        return tx.subscribe();
    }
    // Unknown here so far: start from 0 and learn the head from Redis right away (the
    // listener also re-reads it every few seconds).
    let (tx, rx) = watch::channel(0);
    heads.insert(channel.to_string(), tx);
    drop(heads);
    let conn = store.conn();
    let heads = store.heads.clone();
    let channel = channel.to_string();
    tokio::spawn(async move {
        let mut conn = conn;
        let last: Result<Option<u64>, StoreError> =
            timed(conn.hget(key(&channel, "meta"), "last")).await;
        if let Ok(last) = last {
            raise(&heads, &channel, last.unwrap_or(0));
        }
    });
    rx
}

/// When `channel` began: `created` in its meta, set by the first call (`HSETNX`).
pub(super) async fn origin(
    store: &RedisStore,
    channel: &str,
    now: OffsetDateTime,
) -> Result<Origin, StoreError> {
    let mut conn = store.conn();
    let meta = key(channel, "meta");
    let (_, _, created, epoch): (bool, bool, String, String) = timed(
        redis::pipe()
            .atomic()
            .hset_nx(&meta, "created", datetime_key(now))
            .hset_nx(&meta, "epoch", new_epoch())
            .hget(&meta, "created")
            .hget(&meta, "epoch")
            .query_async(&mut conn),
    )
    .await?;
    Ok(Origin {
        created: datetime_from_key(&created)?,
        epoch,
    })
}

/// Drops what `retention` no longer keeps (the newest change always stays) and forgets
/// idempotency keys older than [`IDEMPOTENCY_TTL`]; returns how many changes went.
pub(super) async fn trim(
    store: &RedisStore,
    channel: &str,
    retention: Retention,
    now: OffsetDateTime,
) -> Result<u64, StoreError> {
    // Retention never trims what the index does not reflect yet (trim.lua).
    super::fold::up_to_log(store, channel).await?;
    let head = head(store, channel).await?;
    let retained = (head.last + 1).saturating_sub(head.oldest);
    let mut wanted = head.oldest + retained.saturating_sub(retention.max_changes);
    if let Some(age) = retention.max_age {
        let cutoff = datetime_key(now - age);
        // Walk forward past changes older than the cut-off; the newest always stays.
        'scan: while wanted < head.last {
            let page = range(
                store,
                channel,
                wanted,
                SCAN_PAGE.min((head.last - wanted) as usize),
                false,
            )
            .await?;
            if page.is_empty() {
                break;
            }
            for change in page {
                if change.seq >= head.last || datetime_key(change.datetime) >= cutoff {
                    break 'scan;
                }
                wanted = change.seq + 1;
            }
        }
    }
    let wanted = retention.cut(wanted).max(head.oldest);
    let forget_before = (now - IDEMPOTENCY_TTL).unix_timestamp();
    let mut conn = store.conn();
    let removed: u64 = timed(
        store
            .scripts
            .trim
            .key(key(channel, "log"))
            .key(key(channel, "meta"))
            .key(key(channel, "idem"))
            .key(key(channel, "idem-at"))
            .arg(wanted)
            .arg(forget_before)
            .invoke_async(&mut conn),
    )
    .await?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change with every field, at `datetime`, modified at `lastmod`, from `source`.
    fn full(datetime: &str, lastmod: &str, source: Option<&str>) -> NewChange {
        let t = |s: &str| crate::model::parse_w3c_datetime(s).unwrap();
        NewChange {
            loc: "http://example.com/a".into(),
            change: ChangeType::Deleted,
            datetime: Some(t(datetime)),
            lastmod: Some(t(lastmod)),
            hash: Some("md5:1e0d5cb8ef6ba40c99b14c0237be735e".into()),
            length: Some(8),
            media_type: Some("text/plain".into()),
            links: vec![Link {
                rel: "alternate".into(),
                href: "http://example.com/a.txt".into(),
                attrs: [("type".to_string(), "text/plain".to_string())].into(),
            }],
            source: source.map(Into::into),
        }
    }

    /// The hand-written encoder writes what serde writes, escapes, non-ASCII, links and
    /// datetime offsets included.
    #[test]
    fn entries_are_written_as_serde_writes_them() {
        let odd = "http://example.com/\"q\"\\\u{1}\u{1f}\u{7f}é\u{2028}\u{10348}";
        let mut changes = vec![
            full(
                "2024-01-01T01:00:00+01:00",
                "2023-01-01T00:00:00.123456789Z",
                None,
            ),
            full(
                "2024-01-01T01:00:00-05:30",
                "2023-01-01T00:00:00Z",
                Some("pub\"lisher"),
            ),
            NewChange::new("http://example.com/b", ChangeType::Created),
            NewChange::new(odd, ChangeType::Deleted),
        ];
        let mut every = full("2024-02-29T23:59:59.5Z", "2024-01-01T00:00:00Z", Some(odd));
        every.hash = Some(format!("md5:{odd}"));
        every.media_type = Some("text/\tplain".into());
        every.length = Some(u64::MAX);
        changes.push(every);
        let mut zero = NewChange::new("http://example.com/z", ChangeType::Updated);
        zero.length = Some(0);
        zero.source = Some("".into());
        changes.push(zero);
        for c in &changes {
            let mut ours = b"before".to_vec();
            Stored::from(c).write_to(&mut ours).unwrap();
            let mut serde = b"before".to_vec();
            serde_json::to_writer(&mut serde, &Stored::from(c)).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(serde).unwrap()
            );
        }
    }

    #[test]
    fn stored_changes_read_back_whole() {
        let full = full("2024-01-01T01:00:00+01:00", "2023-01-01T00:00:00Z", None);
        let bare = NewChange::new("http://example.com/b", ChangeType::Created);
        for c in [full, bare] {
            let bytes = serde_json::to_vec(&Stored::from(&c)).unwrap();
            assert_eq!(decode::<NewChange>(&bytes).unwrap(), c);
        }
    }

    /// A request's changes as it keeps them for reading back (`recent.rs`) are what the log's
    /// reader makes of its entries, to the datetime's offset and precision.
    #[test]
    fn a_request_turns_into_the_changes_its_entries_read_back_as() {
        let t = |s: &str| crate::model::parse_w3c_datetime(s).unwrap();
        let now = t("2024-01-01T00:00:00.123456789Z");
        let changes = vec![
            full(
                "2023-12-31T20:00:00.5-04:00",
                "2023-01-01T00:00:00+05:30",
                Some("alice"),
            ),
            NewChange::new("http://example.com/b", ChangeType::Created),
            NewChange {
                datetime: Some(t("2024-02-01T00:00:00+01:00")),
                ..NewChange::new("http://example.com/c\"é", ChangeType::Updated)
            },
        ];
        let mut request = Request::new(changes, None, now).unwrap();
        let decoded: Vec<Change> = request
            .entries()
            .enumerate()
            .map(|(i, e)| decode_entry(7 + i as u64, e).unwrap())
            .collect();
        let kept = request.take_changes(7).unwrap();
        assert_eq!(kept, decoded);
        let rendered = |changes: &[Change]| serde_json::to_string(changes).unwrap();
        assert_eq!(rendered(&kept), rendered(&decoded));
    }

    #[test]
    fn a_request_keeps_each_entry_apart_in_its_one_buffer() {
        let now = crate::model::parse_w3c_datetime("2024-01-01T00:00:00Z").unwrap();
        let own = crate::model::parse_w3c_datetime("2023-06-01T12:00:00Z").unwrap();
        let changes = vec![
            NewChange::new("http://example.com/a", ChangeType::Created),
            NewChange {
                datetime: Some(own),
                hash: Some("md5:1e0d5cb8ef6ba40c99b14c0237be735e".into()),
                ..NewChange::new("http://example.com/b", ChangeType::Updated)
            },
            NewChange::new("http://example.com/c", ChangeType::Deleted),
            // The same datetime as the change before: its key is copied.
            NewChange::new("http://example.com/d", ChangeType::Deleted),
        ];
        let request = Request::new(changes.clone(), None, now).unwrap();
        assert_eq!(request.len(), 4);
        let entries: Vec<&[u8]> = request.entries().collect();
        assert_eq!(entries.len(), 4);
        for (i, (entry, sent)) in entries.iter().zip(&changes).enumerate() {
            let key = datetime_key(sent.datetime.unwrap_or(now));
            assert_eq!(&entry[..DT_KEY_LEN], key.as_bytes(), "entry {i}");
            let read = decode_entry(i as u64 + 1, entry).unwrap();
            assert_eq!(read.seq, i as u64 + 1);
            assert_eq!(read.loc, sent.loc);
            assert_eq!(read.change, sent.change);
            assert_eq!(read.hash, sent.hash);
            assert_eq!(read.datetime, sent.datetime.unwrap_or(now));
        }
        let locs: usize = changes.iter().map(|c| c.loc.len()).sum();
        let bytes: usize = entries.iter().map(|e| e.len()).sum();
        assert_eq!(request.size(), bytes + locs);
        assert_eq!(request.changes, changes);
    }

    #[test]
    fn a_request_knows_whether_its_datetimes_never_go_down() {
        let t = |s: &str| crate::model::parse_w3c_datetime(s).unwrap();
        let now = t("2024-01-01T00:00:00Z");
        let request = |datetimes: &[Option<&str>]| {
            let changes = datetimes
                .iter()
                .map(|d| NewChange {
                    datetime: d.map(t),
                    ..NewChange::new("http://example.com/a", ChangeType::Updated)
                })
                .collect();
            Request::new(changes, None, now).unwrap().ordered
        };
        assert!(request(&[]));
        assert!(request(&[None, None, None]), "all at the request's time");
        assert!(request(&[
            Some("2023-01-01T00:00:00Z"),
            None,
            Some("2024-01-01T00:00:00Z")
        ]));
        assert!(!request(&[None, Some("2023-12-31T23:59:59.999999999Z")]));
        assert!(!request(&[Some("2024-01-02T00:00:00Z"), None]));
        // Before 1970 too (the keys are biased, never negative).
        assert!(request(&[
            Some("1900-01-01T00:00:00Z"),
            Some("1969-12-31T23:59:59Z")
        ]));
        assert!(!request(&[
            Some("1969-12-31T23:59:59Z"),
            Some("1900-01-01T00:00:00Z")
        ]));
    }

    #[test]
    fn entries_taken_for_the_fold_are_clamped_as_the_script_clamps_them() {
        let t = |s: &str| crate::model::parse_w3c_datetime(s).unwrap();
        let key = |s: &str| datetime_key(t(s)).into_bytes();
        let at = [
            "2024-01-01T00:00:05Z",
            "2024-01-01T00:00:03Z",
            "2024-01-01T00:00:07Z",
        ];
        let taken = |floor: Option<&str>| {
            let changes = at
                .iter()
                .map(|d| NewChange {
                    datetime: Some(t(d)),
                    ..NewChange::new("http://example.com/a", ChangeType::Updated)
                })
                .collect();
            let mut request = Request::new(changes, None, t(at[0])).unwrap();
            let sent: Vec<Vec<u8>> = request.entries().map(<[u8]>::to_vec).collect();
            let floor = floor.map(key);
            let (entries, ends) = request.take_entries(floor.as_deref());
            let mut start = 0;
            let mut out = Vec::new();
            for (end, sent) in ends.iter().zip(&sent) {
                let entry = &entries[start..*end];
                // Only the datetime key may differ from the entry as sent.
                assert_eq!(entry[DT_KEY_LEN..], sent[DT_KEY_LEN..]);
                out.push(entry[..DT_KEY_LEN].to_vec());
                start = *end;
            }
            out
        };
        let keys = |ks: [&str; 3]| ks.map(key).to_vec();
        assert_eq!(
            taken(None),
            keys([
                "2024-01-01T00:00:05Z",
                "2024-01-01T00:00:05Z",
                "2024-01-01T00:00:07Z"
            ])
        );
        assert_eq!(
            taken(Some("2024-01-01T00:00:06Z")),
            keys([
                "2024-01-01T00:00:06Z",
                "2024-01-01T00:00:06Z",
                "2024-01-01T00:00:07Z"
            ])
        );
        assert_eq!(
            taken(Some("2024-01-01T00:00:01Z")),
            keys([
                "2024-01-01T00:00:05Z",
                "2024-01-01T00:00:05Z",
                "2024-01-01T00:00:07Z"
            ])
        );
    }

    #[test]
    fn range_replies_are_read_entry_by_entry_and_bad_ones_refused() {
        let now = crate::model::parse_w3c_datetime("2024-01-01T00:00:00Z").unwrap();
        let request = Request::new(
            vec![
                NewChange::new("http://example.com/a", ChangeType::Created),
                NewChange::new("http://example.com/b", ChangeType::Updated),
            ],
            None,
            now,
        )
        .unwrap();
        let bulk = |b: &[u8]| Value::BulkString(b.to_vec());
        let entry = |id: &str, fields: Vec<Value>| {
            Value::Array(vec![bulk(id.as_bytes()), Value::Array(fields)])
        };
        let entries: Vec<&[u8]> = request.entries().collect();
        let read = |reply: &Value, keep| {
            let mut out = Vec::new();
            reply_to_changes(reply, keep, &mut out).map(|()| out)
        };
        let reply = Value::Array(vec![
            entry("7-0", vec![bulk(b"e"), bulk(entries[0])]),
            // Fields other than `e` and `c` are passed over.
            entry(
                "9-0",
                vec![bulk(b"x"), bulk(b"y"), bulk(b"e"), bulk(entries[1])],
            ),
            // A chunk: seqs 10, 11 and 12.
            entry(
                "10-0",
                vec![
                    bulk(b"c"),
                    bulk(entries[1]),
                    bulk(b"c"),
                    bulk(entries[0]),
                    bulk(b"c"),
                    bulk(entries[1]),
                ],
            ),
        ]);
        let got = |changes: Vec<Change>| -> Vec<(u64, String)> {
            changes.into_iter().map(|c| (c.seq, c.loc)).collect()
        };
        let (a, b) = ("http://example.com/a", "http://example.com/b");
        assert_eq!(
            got(read(&reply, 0..=u64::MAX).unwrap()),
            [(7, a), (9, b), (10, b), (11, a), (12, b)].map(|(s, l)| (s, l.to_string()))
        );
        // Only the seqs asked for, also from within a chunk.
        assert_eq!(
            got(read(&reply, 9..=11).unwrap()),
            [(9, b), (10, b), (11, a)].map(|(s, l)| (s, l.to_string()))
        );
        assert!(read(&Value::Nil, 0..=u64::MAX).unwrap().is_empty());
        assert!(read(&Value::Array(Vec::new()), 0..=u64::MAX)
            .unwrap()
            .is_empty());
        let bad = [
            Value::Int(3),
            Value::Array(vec![entry("7-0", vec![bulk(b"x"), bulk(entries[0])])]),
            Value::Array(vec![entry("seven", vec![bulk(b"e"), bulk(entries[0])])]),
            Value::Array(vec![entry("7-0", vec![bulk(b"e"), bulk(b"short")])]),
            Value::Array(vec![entry("7-0", vec![bulk(b"c"), bulk(b"short")])]),
            Value::Array(vec![Value::Array(vec![bulk(b"7-0")])]),
        ];
        for reply in bad {
            assert!(
                matches!(read(&reply, 0..=u64::MAX), Err(StoreError::Corrupt(_))),
                "{reply:?} was taken"
            );
        }
    }

    #[test]
    fn datetime_keys_sort_like_datetimes() {
        let a = crate::model::parse_w3c_datetime("1969-12-31T23:59:59Z").unwrap();
        let b = crate::model::parse_w3c_datetime("2024-01-01T00:00:00.5Z").unwrap();
        let c = crate::model::parse_w3c_datetime("2024-01-01T00:00:00.500000001Z").unwrap();
        assert!(datetime_key(a) < datetime_key(b));
        assert!(datetime_key(b) < datetime_key(c));
        assert_eq!(datetime_from_key(&datetime_key(c)).unwrap(), c);
        assert_eq!(datetime_key(a).len(), DT_KEY_LEN);
        assert_eq!(datetime_key(c).len(), DT_KEY_LEN);
        let far = crate::model::parse_w3c_datetime("9999-12-31T23:59:59.999999999Z").unwrap();
        let early = crate::model::parse_w3c_datetime("0001-01-01T00:00:00Z").unwrap();
        assert_eq!(datetime_key(far).len(), DT_KEY_LEN);
        assert_eq!(datetime_key(early).len(), DT_KEY_LEN);
        for t in [a, b, c, far, early] {
            let mut written = b"x".to_vec();
            write_datetime_key(t, &mut written);
            assert_eq!(written[1..], *datetime_key(t).as_bytes());
        }
    }

    #[test]
    fn the_key_read_last_is_kept_and_any_other_read_anew() {
        let a = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let b = a + time::Duration::nanoseconds(1);
        let mut keys = LastKey::default();
        for t in [a, a, b, b, a] {
            assert_eq!(keys.datetime(&datetime_key(t)).unwrap(), t);
        }
        assert!(keys.datetime("not a key").is_err());
        assert_eq!(keys.datetime(&datetime_key(b)).unwrap(), b);
    }

    #[test]
    fn datetime_keys_are_the_zero_padded_nanoseconds_and_read_back() {
        let min = OffsetDateTime::from_unix_timestamp(-377_705_116_800).unwrap(); // -9999-01-01
        let max = crate::model::parse_w3c_datetime("9999-12-31T23:59:59.999999999Z").unwrap();
        let mut times = vec![min, max, OffsetDateTime::UNIX_EPOCH];
        // Nanoseconds that carry across the 19-digit split, and plain ones.
        for nanos in [
            -1i128,
            1,
            700_000_000_000_000_000_000 - DT_BIAS - 1,
            700_000_000_000_000_000_000 - DT_BIAS,
            1_764_288_000_123_456_789,
            -62_135_596_800_000_000_001,
        ] {
            times.push(OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap());
        }
        for t in times {
            let key = datetime_key(t);
            assert_eq!(key, format!("{:023}", t.unix_timestamp_nanos() + DT_BIAS));
            assert_eq!(datetime_from_key(&key).unwrap(), t, "{key}");
        }
        assert!(datetime_from_key("00000000000000000000x00").is_err());
        assert!(datetime_from_key("12").is_err());
    }
}
