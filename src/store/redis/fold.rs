//! The resource index (`res`, `res-seq`) and the FeedSync items (`sx`, `sx-conflicts`)
//! brought up to the log after the append, many calls at once.
//!
//! A plain append writes the log alone (see `scripts/append.lua`): the meta's `folded` is the
//! seq up to which the index and the items reflect the log. This module brings them up to the
//! log's `last`: it reads the log entries after `folded`, works out the latest change of each
//! resource and each item's new state here (what `scripts/feedsync.lua` would have computed
//! change by change, as `model::feedsync::record_local` says), and writes each resource once
//! with `scripts/fold.lua`, which refuses when `folded` moved meanwhile (another instance, or
//! a read, came first; then this one reads again). Writing the index with every append cost
//! Redis about two thirds of a 1,000-change append; folded, a resource changed by many calls
//! is written once (`docs/performance.md`, thirtieth pass).
//!
//! When: every instance folds the channels it appended to every [`FOLD_EVERY`] ([`run`]),
//! and every read of the index or the items, a merge and the retention's trim fold first
//! ([`up_to_log`]), so what they read includes every change appended before they began — as
//! when the index was written with the append. A read that comes in between reports the seq
//! the index reflects (`folded`), never more. Retention never trims past `folded`, so the
//! changes still to fold stay in the log. Appends wait while [`MAX_KEPT`] bytes of entries
//! wait for the fold ([`Folds::wait_for_room`]), so the index stays near the log even where
//! nothing coalesces.
//!
//! Invariant kept with the scripts: while some item carries conflicts every append writes
//! the index and the items itself (inline), and only a merge, which first needs `folded` up
//! to `last`, adds conflicts; so entries never need an item's conflicts while it is behind.

use redis::{Cmd, Value};
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::conn::Conn;
use super::log::{decode_entry, json_plain};
use super::{decode, key, timed, timed_write};
use crate::model::feedsync::{self, SyncState};
use crate::model::ChangeType;
use crate::store::StoreError;

/// How often an instance folds the channels it appended to.
pub const FOLD_EVERY: Duration = Duration::from_millis(250);
/// At most this many changes are read and written by one fold call (a script holds Redis
/// while it runs); a fold of more takes several.
const FOLD_CHUNK: usize = 20_000;
/// Log entries read per range read.
const READ_ENTRIES: usize = 256;
/// Items read per `HMGET`.
const READ_ITEMS: usize = 1000;
/// A fold that keeps losing to other folds gives up after this many rounds (the index then
/// reports an older `folded`; nothing is lost).
const MAX_ROUNDS: usize = 64;

/// The fold script, sent whole with each call (`EVAL`, not `EVALSHA`): a fold runs a few times
/// a second at most, and Redis's command statistics then count folds (`cmdstat_eval`) apart
/// from appends (`cmdstat_evalsha`).
const FOLD: &str = include_str!("scripts/fold.lua");

/// Entries kept for the next fold, in bytes, past which the folder runs at once and new
/// appends wait until it has taken them ([`Folds::wait_for_room`]): the index is never more
/// than about two such loads behind the log (when every change is to a resource of its own,
/// nothing coalesces and the fold is as slow as the append was when it wrote the index).
const MAX_KEPT: usize = 32 << 20;
/// The entries of an append shorter than this, in bytes, are copied onto the piece before
/// ([`Folds::appended`]); those of a large append (about 500 changes and more) keep their
/// own buffer.
const JOIN_BELOW: usize = 64 << 10;
/// An append waits for room at most this long (should the folder be gone).
const MAX_WAIT: Duration = Duration::from_secs(5);

/// The channels this instance appended to since its last fold, with the entries of its
/// appends that the script stored as sent (what the fold would otherwise read from the log).
#[derive(Default)]
pub(super) struct Folds {
    state: Mutex<Kept>,
    /// Wakes the folder before its time when much is kept.
    full: tokio::sync::Notify,
    /// Wakes the appends that wait for room, once the folder has taken what was kept.
    taken: tokio::sync::Notify,
    /// One fold of a channel at a time in this process: readers that come while one runs wait
    /// for it rather than read the same entries and lose the race to write them.
    running: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

#[derive(Default)]
struct Kept {
    channels: HashMap<String, Vec<Piece>>,
    bytes: usize,
}

/// The entries of one append: `entries[..ends[0]]` is seq `first`, and so on.
struct Piece {
    first: u64,
    entries: Vec<u8>,
    ends: Vec<usize>,
}

impl Piece {
    fn last(&self) -> u64 {
        self.first + self.ends.len() as u64 - 1
    }
}

impl Folds {
    fn state(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes an append to `channel` from seq `first` on, with its entries when the script
    /// stored them as sent.
    pub(super) fn appended(
        &self,
        channel: &str,
        first: u64,
        entries: Option<(Vec<u8>, Vec<usize>)>,
    ) {
        let mut state = self.state();
        let kept = &mut *state;
        let pieces = match kept.channels.get_mut(channel) {
            Some(pieces) => pieces,
            None => kept.channels.entry(channel.to_string()).or_default(),
        };
        if let Some((entries, ends)) = entries.filter(|(_, ends)| !ends.is_empty()) {
            kept.bytes += entries.len();
            match pieces.last_mut() {
                // A small append one after the other (the appends of one call, nearly
                // always): copied onto the end of the piece before, so that a stream of small
                // appends keeps a few large buffers, not one of its own each (freed together
                // by the folder, they cost the allocator more than the copy). A large one
                // keeps its own buffer: copying it, and the piece before again each time that
                // one grows, cost more than the buffer.
                Some(piece) if piece.last() + 1 == first && entries.len() < JOIN_BELOW => {
                    let base = piece.entries.len();
                    piece.entries.extend_from_slice(&entries);
                    piece.ends.extend(ends.iter().map(|end| end + base));
                }
                _ => pieces.push(Piece {
                    first,
                    entries,
                    ends,
                }),
            }
        }
        if kept.bytes > MAX_KEPT {
            self.full.notify_one();
        }
    }

    /// Waits while more than [`MAX_KEPT`] bytes are kept for the next fold, until the folder
    /// takes them (at most [`MAX_WAIT`]): appends go no faster than the fold.
    pub(super) async fn wait_for_room(&self) {
        let deadline = tokio::time::Instant::now() + MAX_WAIT;
        loop {
            let taken = self.taken.notified();
            tokio::pin!(taken);
            taken.as_mut().enable();
            if self.state().bytes <= MAX_KEPT {
                return;
            }
            self.full.notify_one();
            if tokio::time::timeout_at(deadline, taken).await.is_err() {
                return;
            }
        }
    }

    /// The lock of `channel`'s folds.
    fn lock_of(&self, channel: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get(channel) {
            Some(lock) => lock.clone(),
            None => running.entry(channel.to_string()).or_default().clone(),
        }
    }

    /// The channels appended to since the last call, each with its kept entries.
    fn take(&self) -> HashMap<String, Vec<Piece>> {
        let taken = {
            let mut state = self.state();
            state.bytes = 0;
            std::mem::take(&mut state.channels)
        };
        self.taken.notify_waiters();
        taken
    }
}

/// Folds the channels appended to every [`FOLD_EVERY`] (or at once when much is kept) until
/// `stop`.
pub(super) async fn run(mut conn: Conn, folds: Arc<Folds>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(FOLD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Failing since the last round: while Redis is away, said once, not four times a second.
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
            _ = folds.full.notified() => {}
        }
        let mut failed = false;
        for (channel, kept) in folds.take() {
            let lock = folds.lock_of(&channel);
            let _running = lock.lock().await;
            if let Err(e) = fold(&mut conn, &channel, kept).await {
                if failing {
                    tracing::debug!(%channel, error = %e, "could not bring the resource index up to the log");
                } else {
                    tracing::warn!(%channel, error = %e, "could not bring the resource index up to the log (retried every 250 ms; reads bring it up first)");
                }
                failed = true;
                folds.appended(&channel, 0, None);
            }
        }
        failing = failed;
    }
}

/// Brings `channel`'s index and items up to the `last` its meta has now.
pub(super) async fn up_to_log(store: &super::RedisStore, channel: &str) -> Result<(), StoreError> {
    let lock = store.appends.folds.lock_of(channel);
    let _running = lock.lock().await;
    fold(&mut store.conn(), channel, Vec::new()).await
}

/// As [`up_to_log`], taking the entries in `kept` from there rather than from the log; with
/// entries kept, only up to the newest of them: appends that ended since are folded next time,
/// from their own entries.
async fn fold(conn: &mut Conn, channel: &str, mut kept: Vec<Piece>) -> Result<(), StoreError> {
    let kept_end = kept.iter().map(Piece::last).max();
    // (Appends of one channel may end out of order: large ones go at once.)
    kept.sort_unstable_by_key(|p| p.first);
    let mut kept = VecDeque::from(kept);
    for _ in 0..MAX_ROUNDS {
        let (last, folded): (Option<u64>, Option<u64>) = timed(
            redis::cmd("HMGET")
                .arg(key(channel, "meta"))
                .arg("last")
                .arg("folded")
                .query_async(conn),
        )
        .await?;
        let (Some(last), Some(folded)) = (last, folded) else {
            // No `folded`: the index is written with every append.
            return Ok(());
        };
        let target = kept_end.map_or(last, |end| end.min(last));
        if folded >= target {
            return Ok(());
        }
        let read = read_entries(conn, channel, folded + 1, target, &mut kept).await?;
        let upto = read.entries.last().map_or(target, |(seq, _, _)| *seq);
        let resources = coalesce(&read)?;
        let call = fold_call(conn, channel, folded, upto, &read, resources).await?;
        let written: i64 = timed_write(call.query_async(conn)).await?;
        if written == 1 && upto >= target {
            return Ok(());
        }
    }
    Ok(())
}

/// Log entries: (seq, buffer, range of the entry in it), in seq order.
#[derive(Default)]
struct Read {
    buffers: Vec<Vec<u8>>,
    entries: Vec<(u64, usize, std::ops::Range<usize>)>,
}

impl Read {
    fn entry(&self, i: usize) -> &[u8] {
        let (_, buffer, range) = &self.entries[i];
        &self.buffers[*buffer][range.clone()]
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The log entries of `channel` from seq `from` to `last`, about [`FOLD_CHUNK`] changes at
/// most: those of the pieces in `kept` (in seq order) while they follow on from `from` (used
/// up), the rest read from the log, whole chunks.
async fn read_entries(
    conn: &mut Conn,
    channel: &str,
    from: u64,
    last: u64,
    kept: &mut VecDeque<Piece>,
) -> Result<Read, StoreError> {
    let mut out = Read::default();
    let mut next = from;
    while out.len() < FOLD_CHUNK && next <= last {
        // `kept` is in seq order: what lies before `next` is folded already.
        while kept.front().is_some_and(|p| p.last() < next) {
            kept.pop_front();
        }
        let piece = match kept.front() {
            Some(p) if p.first <= next => kept.pop_front(),
            _ => None,
        };
        let Some(piece) = piece else {
            break;
        };
        let buffer = out.buffers.len();
        let mut start = 0;
        for (i, &end) in piece.ends.iter().enumerate() {
            let seq = piece.first + i as u64;
            if (next..=last).contains(&seq) {
                out.entries.push((seq, buffer, start..end));
            }
            start = end;
        }
        next = next.max(piece.last().min(last) + 1);
        out.buffers.push(piece.entries);
    }
    if out.len() >= FOLD_CHUNK || next > last {
        return Ok(out);
    }
    let log = key(channel, "log");
    // The chunk that holds `next` (its id is its first seq, which may be below `next`).
    let holder: Value = timed(
        redis::cmd("XREVRANGE")
            .arg(&log)
            .arg(format!("{next}-0"))
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(conn),
    )
    .await?;
    let had = out.len();
    let mut after = entries_of(holder, next, last, &mut out)?;
    while out.len() < FOLD_CHUNK {
        let start = match &after {
            Some(id) => format!("({id}"),
            None => format!("{next}-0"),
        };
        let reply: Value = timed(
            redis::cmd("XRANGE")
                .arg(&log)
                .arg(start)
                .arg(format!("{last}-0"))
                .arg("COUNT")
                .arg(READ_ENTRIES)
                .query_async(conn),
        )
        .await?;
        let Some(id) = entries_of(reply, next, last, &mut out)? else {
            break;
        };
        after = Some(id);
    }
    if out.entries.get(had).is_some_and(|(seq, _, _)| *seq != next) {
        tracing::warn!(%channel, next, "log entries to fold are missing: folding what is there");
    }
    Ok(out)
}

/// Adds the changes of a range reply's entries with a seq from `from` to `last` to `out`;
/// returns the id of the reply's last entry (none when it had none).
fn entries_of(
    reply: Value,
    from: u64,
    last: u64,
    out: &mut Read,
) -> Result<Option<String>, StoreError> {
    let entries = match reply {
        Value::Array(entries) => entries,
        Value::Nil => Vec::new(),
        other => return Err(StoreError::Corrupt(format!("bad log reply {other:?}"))),
    };
    let mut last_id = None;
    for entry in entries {
        let bad = || StoreError::Corrupt("bad log entry".to_string());
        let Value::Array(parts) = entry else {
            return Err(bad());
        };
        let [Value::BulkString(id), Value::Array(fields)] =
            <[Value; 2]>::try_from(parts).map_err(|_| bad())?
        else {
            return Err(bad());
        };
        let id = String::from_utf8_lossy(&id).into_owned();
        let mut seq: u64 = id
            .split_once('-')
            .and_then(|(s, _)| s.parse().ok())
            .ok_or_else(bad)?;
        let mut fields = fields.into_iter();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            let (Value::BulkString(name), Value::BulkString(value)) = (name, value) else {
                continue;
            };
            if name.as_slice() != b"e" && name.as_slice() != b"c" {
                continue;
            }
            if (from..=last).contains(&seq) {
                let len = value.len();
                out.entries.push((seq, out.buffers.len(), 0..len));
                out.buffers.push(value);
            }
            seq += 1;
        }
        last_id = Some(id);
    }
    Ok(last_id)
}

/// What a log entry says about its resource's item: its loc, publisher, time and kind.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    loc: Cow<'a, str>,
    change: ChangeType,
    #[serde(borrow, default)]
    source: Option<Cow<'a, str>>,
}

/// One change of a resource, as its item takes it.
struct Step {
    /// Index into [`Resources::publishers`]; none for a change without a plain publisher.
    by: Option<usize>,
    /// Whole seconds since the epoch, from the entry's datetime key.
    when: i64,
    deleted: bool,
    /// The resource's next change, by its index in [`Resources::steps`].
    next: Option<usize>,
}

/// A resource changed in the entries being folded.
struct Resource {
    /// Its latest change: the seq, and the index of the entry in the read.
    seq: u64,
    entry: usize,
    /// Its first and last changes in [`Resources::steps`], and how many it has.
    first: usize,
    last: usize,
    count: usize,
    /// The publisher of all its changes, when one made them all ([`Step::by`]): known
    /// without a walk of the steps, which lie all over [`Resources::steps`].
    one_by: Option<usize>,
}

/// Keyed by loc as the entries hold it (borrowed: no copy per resource), hashed with
/// foldhash (SipHash was a twentieth of the hub's instructions per change in a fold).
struct Resources<'a> {
    by_loc: foldhash::HashMap<Cow<'a, str>, Resource>,
    /// The changes of every resource, in the read's order, each resource's linked from its
    /// first on: one vector for all (a vector per resource grew again and again where a
    /// resource changes many times between folds).
    steps: Vec<Step>,
    publishers: Vec<String>,
}

impl Resources<'_> {
    /// The changes of `resource`, in order.
    fn steps_of<'s>(&'s self, resource: &Resource) -> impl Iterator<Item = &'s Step> + 's {
        let mut at = Some(resource.first);
        std::iter::from_fn(move || {
            let step = &self.steps[at?];
            at = step.next;
            Some(step)
        })
    }
}

/// The resources of `read`, each with its changes in order.
fn coalesce(read: &Read) -> Result<Resources<'_>, StoreError> {
    let mut out = Resources {
        // Sized for a resource per entry up to a few thousand (sized again as needed).
        by_loc: foldhash::HashMap::with_capacity_and_hasher(
            read.len().min(4096),
            Default::default(),
        ),
        publishers: Vec::new(),
        steps: Vec::with_capacity(read.len()),
    };
    for (i, (seq, _, _)) in read.entries.iter().enumerate() {
        let entry = read.entry(i);
        let bad = || StoreError::Corrupt(format!("log entry {seq} is not readable"));
        let (key, json) = entry.split_at_checked(23).ok_or_else(bad)?;
        let head = match quick_head(json) {
            Some(head) => head,
            None => serde_json::from_slice(json).map_err(|_| bad())?,
        };
        let when = std::str::from_utf8(&key[..14])
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(bad)?
            - 1_000_000_000_000;
        // A publisher whose name JSON escapes is not one (as feedsync.lua reads the entry).
        let by = match head.source.as_deref() {
            Some(s) if json_plain(s.as_bytes()) => {
                Some(match out.publishers.iter().position(|p| p == s) {
                    Some(at) => at,
                    None => {
                        out.publishers.push(s.to_string());
                        out.publishers.len() - 1
                    }
                })
            }
            _ => None,
        };
        let step = out.steps.len();
        out.steps.push(Step {
            by,
            when,
            deleted: head.change == ChangeType::Deleted,
            next: None,
        });
        match out.by_loc.get_mut(head.loc.as_ref()) {
            Some(r) => {
                r.seq = *seq;
                r.entry = i;
                out.steps[r.last].next = Some(step);
                r.last = step;
                r.count += 1;
                if r.one_by != by {
                    r.one_by = None;
                }
            }
            None => {
                out.by_loc.insert(
                    head.loc,
                    Resource {
                        seq: *seq,
                        entry: i,
                        first: step,
                        last: step,
                        count: 1,
                        one_by: by,
                    },
                );
            }
        }
    }
    Ok(out)
}

/// The head of a log entry's JSON read where `log::Stored` writes it — `{"loc":"LOC",
/// "change":"KIND"` at the start, `,"source":"NAME"}` at the end — when neither LOC nor NAME
/// needed escaping (nearly always); none otherwise (then serde reads it). Reading the whole
/// entry with serde was most of the fold's time.
fn quick_head(json: &[u8]) -> Option<Head<'_>> {
    let rest = json.strip_prefix(br#"{"loc":""#)?;
    let end = rest.iter().position(|&b| b == b'"')?;
    let (loc, rest) = rest.split_at(end);
    if loc.contains(&b'\\') {
        return None;
    }
    let rest = rest.strip_prefix(br#"","change":""#)?;
    let change = if rest.starts_with(b"created\"") {
        ChangeType::Created
    } else if rest.starts_with(b"updated\"") {
        ChangeType::Updated
    } else if rest.starts_with(b"deleted\"") {
        ChangeType::Deleted
    } else {
        return None;
    };
    let body = json.strip_suffix(b"\"}")?;
    let at = body.windows(11).rposition(|w| w == br#","source":""#)?;
    let source = &body[at + 11..];
    if source.is_empty() || !json_plain(source) {
        return None;
    }
    Some(Head {
        loc: Cow::Borrowed(std::str::from_utf8(loc).ok()?),
        change,
        source: Some(Cow::Borrowed(std::str::from_utf8(source).ok()?)),
    })
}

/// The fold script's call for `resources`: reads their items (and, for a counted item that
/// does not just count on, the resource's latest change before the fold), works out each
/// one's new item.
async fn fold_call(
    conn: &mut Conn,
    channel: &str,
    folded: u64,
    upto: u64,
    read: &Read,
    resources: Resources<'_>,
) -> Result<Cmd, StoreError> {
    let locs: Vec<&str> = resources.by_loc.keys().map(|loc| loc.as_ref()).collect();
    let mut stored: Vec<Option<Vec<u8>>> = Vec::with_capacity(locs.len());
    for piece in locs.chunks(READ_ITEMS) {
        let items: Vec<Option<Vec<u8>>> = timed(
            redis::cmd("HMGET")
                .arg(key(channel, "sx"))
                .arg(piece)
                .query_async(conn),
        )
        .await?;
        stored.extend(items);
    }
    let mut cmd = Cmd::new();
    cmd.arg("EVAL")
        .arg(FOLD)
        .arg(5)
        .arg(key(channel, "meta"))
        .arg(key(channel, "res"))
        .arg(key(channel, "res-seq"))
        .arg(key(channel, "sx"))
        .arg(key(channel, "sx-conflicts"))
        .arg(folded)
        .arg(upto)
        .arg(locs.len());
    for (loc, stored) in locs.iter().zip(stored) {
        let resource = &resources.by_loc[*loc];
        let (item, conflicts) = match counted_on(stored.as_deref(), resource, &resources) {
            Some(item) => (item, ""),
            None => {
                let before = match stored.as_deref() {
                    Some([b'0'..=b'9', ..]) => {
                        let entry: Option<Vec<u8>> = timed(
                            redis::cmd("HGET")
                                .arg(key(channel, "res"))
                                .arg(*loc)
                                .query_async(conn),
                        )
                        .await?;
                        entry
                    }
                    _ => None,
                };
                recorded(
                    loc,
                    stored.as_deref(),
                    before.as_deref(),
                    resource,
                    &resources,
                )?
            }
        };
        cmd.arg(*loc)
            .arg(read.entry(resource.entry))
            .arg(resource.seq)
            .arg(item)
            .arg(conflicts);
    }
    Ok(cmd)
}

/// The common case, worked out without the item: every change of the resource is by the one
/// publisher its stored item counts (or it has none yet), so the count goes on.
fn counted_on(
    stored: Option<&[u8]>,
    resource: &Resource,
    resources: &Resources<'_>,
) -> Option<String> {
    let by = resource.one_by?;
    let publisher = &resources.publishers[by];
    let before: u64 = match stored {
        None => 0,
        Some(stored) => {
            let text = std::str::from_utf8(stored).ok()?;
            let (updates, of) = text.split_once(' ')?;
            if of != publisher || updates.is_empty() || !updates.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            updates.parse().ok()?
        }
    };
    let updates = (before + resource.count as u64).min(i32::MAX as u64);
    Some(counted_item(updates, publisher))
}

/// A counted item as stored, "UPDATES PUBLISHER", written without `format!` (whose machinery
/// took about 800 instructions per change of a fold where every resource is new).
fn counted_item(updates: u64, publisher: &str) -> String {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(updates);
    let mut item = String::with_capacity(digits.len() + 1 + publisher.len());
    item.push_str(digits);
    item.push(' ');
    item.push_str(publisher);
    item
}

/// Any other case: the item as stored (`before`, the resource's latest change ahead of the
/// fold, makes a counted one whole), each change recorded in turn, then stored counted when it
/// has the common shape, as JSON otherwise; with '+' or '-' when it gained or lost conflicts.
fn recorded(
    loc: &str,
    stored: Option<&[u8]>,
    before: Option<&[u8]>,
    resource: &Resource,
    resources: &Resources<'_>,
) -> Result<(String, &'static str), StoreError> {
    let mut sync: Option<SyncState> = match stored {
        None => None,
        Some(json @ [b'{', ..]) => Some(decode(json)?),
        Some(counted) => {
            let entry = before.ok_or_else(|| {
                StoreError::Corrupt(format!("the FeedSync item of {loc} is not readable"))
            })?;
            Some(super::feedsync::counted(&decode_entry(0, entry)?, counted)?)
        }
    };
    let had = sync.as_ref().is_some_and(|s| !s.conflicts.is_empty());
    for step in resources.steps_of(resource) {
        let by = step.by.map(|b| resources.publishers[b].as_str());
        let when = OffsetDateTime::from_unix_timestamp(step.when)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        sync = Some(feedsync::record_local(sync, loc, by, when, step.deleted));
    }
    let Some(sync) = sync else {
        return Err(StoreError::Corrupt(format!("no change of {loc} to fold")));
    };
    let has = !sync.conflicts.is_empty();
    let last_by = resources.steps[resource.last].by;
    let counted = last_by.filter(|_| {
        sync.history.len() == 1
            && sync.history[0].sequence == sync.updates
            && !has
            && !sync.noconflicts
            && sync.id == feedsync::item_id(loc)
    });
    let item = match counted {
        Some(by) => counted_item(sync.updates.into(), &resources.publishers[by]),
        None => serde_json::to_string(&sync).map_err(|e| StoreError::Corrupt(e.to_string()))?,
    };
    let conflicts = match (had, has) {
        (false, true) => "+",
        (true, false) => "-",
        _ => "",
    };
    Ok((item, conflicts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NewChange;

    /// The quick read of an entry's head agrees with serde's wherever it answers, and leaves
    /// to serde what it cannot read plainly.
    #[test]
    fn the_quick_head_reads_what_serde_reads() {
        let entry = |loc: &str, kind, source: Option<&str>| {
            let change = NewChange {
                source: source.map(Into::into),
                hash: Some("md5:1e0d5cb8ef6ba40c99b14c0237be735e".into()),
                ..NewChange::new(loc.to_string(), kind)
            };
            serde_json::to_vec(&super::super::log::Stored::from(&change)).unwrap()
        };
        let cases = [
            (
                entry("http://example.com/a", ChangeType::Updated, Some("alice")),
                true,
            ),
            (
                entry("http://example.com/b", ChangeType::Created, Some("x.y-z")),
                true,
            ),
            (
                entry(
                    "http://example.com/c",
                    ChangeType::Deleted,
                    Some("pub[a (*+-?^$%)"),
                ),
                true,
            ),
            (
                entry(
                    "http://example.com/\"q\"",
                    ChangeType::Updated,
                    Some("alice"),
                ),
                false,
            ),
            (
                entry("http://example.com/d", ChangeType::Updated, None),
                false,
            ),
            (
                entry("http://example.com/e", ChangeType::Updated, Some("a\"b")),
                false,
            ),
        ];
        for (json, quick) in &cases {
            let full: Head = serde_json::from_slice(json).unwrap();
            match quick_head(json) {
                Some(head) => {
                    assert!(quick, "{}", String::from_utf8_lossy(json));
                    assert_eq!(head.loc, full.loc);
                    assert_eq!(head.change, full.change);
                    assert_eq!(head.source, full.source);
                }
                None => assert!(!quick, "{}", String::from_utf8_lossy(json)),
            }
        }
    }
}
