//! The `<url>` entries of a log's Change Lists (`changes?after=` pages, the topic, closed
//! lists), kept rendered in blocks of [`BLOCK`] seqs.
//!
//! A log entry never changes once written (retention only drops whole entries from the old
//! end), so the rendering of seqs `k·BLOCK+1 ..= (k+1)·BLOCK` of a channel and epoch is
//! the same for every document that covers them, whatever its range. A page (or topic, or
//! closed list) is its header (rendered per request: its `from`, `until`, seq range and
//! links depend on it) and slices of blocks. Only complete blocks are kept: all of their seqs written and still
//! retained. Two tiers, each bounded, the block used least recently going first:
//!
//! - **memory** ([`PageCache`], a quarter of `--cache-size`): the blocks rendered from the
//!   store on a miss, and blocks read whole from a file while there is room;
//! - **files** ([`PageFiles`], [`FILES_BYTES`] by default): blocks written into segment
//!   files, one per [`SEGMENT`] consecutive block numbers of a channel and epoch (a file
//!   created per block cost more than the write of its bytes), each block at a place reserved
//!   at the end of its segment. A block is written when it is rendered, and as soon as a
//!   channel's feed publishes the notification that completes it (its entries copied from
//!   the bodies of the notifications still in the feed's recent cache, which keep where each
//!   entry is, so no store read and no second rendering; a block they do not cover is
//!   written on its first miss). The notifications held by blocks waiting to be
//!   written count toward a bound (`Backlog`); past it, a block completed meanwhile is also
//!   left to its first miss: writes that fall behind (a slow disk, a hub short of CPU)
//!   neither fill memory nor hold publishing back. The bound on disk drops whole segments,
//!   the one used least recently first. A miss in memory reads only what the page needs from
//!   the file (the offsets and datetimes of its first and last entries, then the byte range):
//!   the operating system's page cache does the caching, not the hub's memory. A segment
//!   keeps its file open once read, and a read that costs no wait (that file open, its bytes
//!   in the page cache) is made on the caller's thread; any other on a blocking thread
//!   (`Wait`).
//!
//! What a page takes from a block is [`Entries`]: its bytes as [`Bytes`] that share the
//! block's memory, or that the file was read into, so that a page is sent as its header and
//! these pieces without being copied into one buffer first.
//!
//! The folder of the files is a cache that outlives the process: a hub started again on the
//! same data directory finds the blocks it left (see [`PageFiles::open`]), each checked
//! against its checksum on its first read, and keeps only those of each channel's current
//! epoch whose seqs are all at or before the log's newest ([`PageFiles::retain`], before any
//! page is served: a store put back to an earlier state may have other changes under later
//! seqs). Anything else in the folder is removed. With Redis the folder is temporary, made and
//! removed by the process. Neither tier knows about retention: the caller checks that the seqs
//! it asks for are retained before it uses a block (`changes_after` does).
//!
//! A segment file is named `SEGMENT_NUMBER-GENERATION` (the generation tells a segment from
//! an earlier one of the same blocks that was dropped). A block in it, at the offset the
//! index gives, is a header, then the rendered entries:
//!
//! ```text
//! "CHPAGES2"  first seq: u64  count: u64  checksum: u64        (little endian)
//! count × (end: u64, datetime: i128 unix nanoseconds, UTC)
//! the entries' bytes (entry i is bytes end[i-1] .. end[i], end[-1] = 0)
//! ```
//!
//! The checksum is the CRC-32 of everything after the fixed header (the records and the
//! entries). A block forgotten while its segment file stays (its read failed, or it was not
//! kept at start-up) has `"CHPAGES-"` in place of its magic number, so that the next process
//! skips it.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::{Range, RangeInclusive};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use time::OffsetDateTime;

use crate::model::{Change, Notification};
use crate::resourcesync::{self, RenderedEntries};

/// Seqs per block.
pub const BLOCK: u64 = 1_000;
/// Most bytes of rendered entries kept in memory, all channels together, when no bound is
/// given (a quarter of `--cache-size` in `changehub serve`).
pub const CACHE_BYTES: usize = 64 << 20;
/// Most bytes of block files kept on disk, all channels together (`--page-files-size`).
pub const FILES_BYTES: u64 = 2 << 30;

/// The rendered entries of consecutive seqs, with the datetime of each (a page's `from` and
/// `until` are those of its first and last entry).
pub struct Block {
    /// The seq of the first entry.
    pub first: u64,
    pub entries: RenderedEntries,
    pub datetimes: Vec<OffsetDateTime>,
}

impl Block {
    /// Renders `changes`, whose seqs must follow each other; `None` if they do not.
    pub fn render(changes: &[Change]) -> Option<Block> {
        Block::render_parts(&[changes])
    }

    /// Renders the changes of `parts` in order, as one block; `None` unless their seqs follow
    /// each other (across parts too) and there is at least one.
    pub fn render_parts(parts: &[&[Change]]) -> Option<Block> {
        let first = consecutive(parts.iter().flat_map(|p| p.iter()))?;
        let mut entries = RenderedEntries {
            bytes: Vec::new(),
            ends: Vec::new(),
        };
        let mut datetimes = Vec::new();
        for part in parts {
            let rendered = resourcesync::write_change_entries(part);
            let base = entries.bytes.len();
            entries.bytes.extend_from_slice(&rendered.bytes);
            entries.ends.extend(rendered.ends.iter().map(|e| base + e));
            datetimes.extend(part.iter().map(|c| c.datetime));
        }
        Some(Block {
            first,
            entries,
            datetimes,
        })
    }

    /// The block of changes `parts` of notifications (each a range of indices into a
    /// notification's changes), its entries copied from their bodies rather than rendered
    /// again; `None` unless each body has the bounds of its entries and the seqs follow each
    /// other (across parts too) and there is at least one.
    pub fn copy_parts(parts: &[(&Notification, Range<usize>)]) -> Option<Block> {
        let mut size = 0;
        for (n, range) in parts {
            n.changes.get(range.clone())?;
            let bounds = n.entry_bounds.get(range.start..=range.end)?;
            size += (bounds[bounds.len() - 1] - bounds[0]) as usize;
        }
        let first = consecutive(
            parts
                .iter()
                .flat_map(|(n, range)| &n.changes[range.clone()]),
        )?;
        let mut entries = RenderedEntries {
            bytes: Vec::with_capacity(size),
            ends: Vec::new(),
        };
        let mut datetimes = Vec::new();
        for (n, range) in parts {
            let bounds = &n.entry_bounds[range.start..=range.end];
            let (start, end) = (bounds[0] as usize, bounds[bounds.len() - 1] as usize);
            let base = entries.bytes.len();
            entries.bytes.extend_from_slice(n.body.get(start..end)?);
            entries
                .ends
                .extend(bounds[1..].iter().map(|e| base + *e as usize - start));
            datetimes.extend(n.changes[range.clone()].iter().map(|c| c.datetime));
        }
        Some(Block {
            first,
            entries,
            datetimes,
        })
    }

    /// The seq of the last entry.
    pub fn last(&self) -> u64 {
        self.first + self.datetimes.len() as u64 - 1
    }

    /// Entries `seqs` of this block, their bytes shared with it (not copied); `None` unless
    /// it holds them all.
    pub fn entries(self: &Arc<Block>, seqs: RangeInclusive<u64>) -> Option<Entries> {
        let (first, last) = (*seqs.start(), *seqs.end());
        if first < self.first || last > self.last() || first > last {
            return None;
        }
        let (i, j) = ((first - self.first) as usize, (last - self.first) as usize);
        let start = if i == 0 { 0 } else { self.entries.ends[i - 1] };
        let bytes = Bytes::from_owner(SharedBytes(self.clone())).slice(start..self.entries.ends[j]);
        Some(Entries {
            first,
            last,
            bytes,
            from: self.datetimes[i],
            until: self.datetimes[j],
        })
    }

    /// Whether this is block number `number`, complete.
    fn is_complete(&self, number: u64) -> bool {
        self.first == number * BLOCK + 1 && self.datetimes.len() as u64 == BLOCK
    }

    fn bytes(&self) -> usize {
        self.entries.bytes.len() + self.entries.ends.len() * 8 + self.datetimes.len() * 16
    }
}

/// The seq of the first of `changes` when their seqs follow each other; `None` when they do
/// not, or there are none.
fn consecutive<'a>(changes: impl Iterator<Item = &'a Change> + Clone) -> Option<u64> {
    let first = changes.clone().next()?.seq;
    changes
        .enumerate()
        .all(|(i, c)| c.seq == first + i as u64)
        .then_some(first)
}

/// A block's rendered bytes as the owner of [`Bytes`] that share them.
struct SharedBytes(Arc<Block>);

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0.entries.bytes
    }
}

/// Consecutive entries of one block, as a page uses them: their rendered bytes and the
/// datetimes of the first and the last (a page's `from` and `until`).
#[derive(Clone, Debug)]
pub struct Entries {
    /// The seq of the first entry.
    pub first: u64,
    /// The seq of the last entry.
    pub last: u64,
    pub bytes: Bytes,
    /// The datetime of the first entry.
    pub from: OffsetDateTime,
    /// The datetime of the last entry.
    pub until: OffsetDateTime,
}

#[derive(Hash, PartialEq, Eq, Clone)]
struct Key {
    channel: String,
    epoch: String,
    block: u64,
}

impl Key {
    fn new(channel: &str, epoch: &str, block: u64) -> Key {
        Key {
            channel: channel.to_string(),
            epoch: epoch.to_string(),
            block,
        }
    }
}

/// Entries kept up to a bound of bytes, the one used least recently dropped first: the
/// bookkeeping both tiers share (`V`: the block in memory, a segment file on disk).
struct Lru<V> {
    /// Key → (what is kept, its size, when last used: a counter).
    entries: HashMap<Key, (V, u64, u64)>,
    clock: u64,
    bytes: u64,
    bound: u64,
}

impl<V> Lru<V> {
    fn new(bound: u64) -> Lru<V> {
        Lru {
            entries: HashMap::new(),
            clock: 0,
            bytes: 0,
            bound,
        }
    }

    /// What is kept under `key`, which counts as used now.
    fn touch(&mut self, key: &Key) -> Option<&mut V> {
        self.clock += 1;
        let now = self.clock;
        let (found, _, used) = self.entries.get_mut(key)?;
        *used = now;
        Some(found)
    }

    /// What is kept under `key`, without counting as used.
    fn peek(&self, key: &Key) -> Option<&V> {
        self.entries.get(key).map(|(found, _, _)| found)
    }

    /// Keeps `value`; returns what was dropped to stay within the bound (`value` itself when
    /// it alone is larger).
    fn insert(&mut self, key: Key, value: V, size: u64) -> Vec<(Key, V)> {
        self.clock += 1;
        if let Some((_, old, _)) = self.entries.insert(key, (value, size, self.clock)) {
            self.bytes -= old;
        }
        self.bytes += size;
        let mut dropped = Vec::new();
        while self.bytes > self.bound {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, _, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(value) = self.remove(&oldest) {
                dropped.push((oldest, value));
            }
        }
        dropped
    }

    fn remove(&mut self, key: &Key) -> Option<V> {
        let (value, size, _) = self.entries.remove(key)?;
        self.bytes -= size;
        Some(value)
    }

    fn forget_all(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Drops every entry of `channel`.
    fn forget(&mut self, channel: &str) {
        self.entries.retain(|k, _| k.channel != channel);
        self.bytes = self.entries.values().map(|(_, size, _)| size).sum();
    }
}

impl<V: Clone> Lru<V> {
    fn get(&mut self, key: &Key) -> Option<V> {
        self.touch(key).cloned()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The notifications that blocks waiting for their files hold (see
/// [`PageCache::published`]), in bytes, and the bound past which no more such writes start.
/// Without it, a disk slower than the feeds (or a hub short of CPU) would leave a write
/// queued, and a blocking thread, for every block published meanwhile, each holding its
/// notifications.
struct Backlog {
    bound: usize,
    bytes: AtomicUsize,
}

impl Backlog {
    fn new(bound: usize) -> Arc<Backlog> {
        Arc::new(Backlog {
            bound,
            bytes: AtomicUsize::new(0),
        })
    }

    /// Counts `bytes` until the share given back is dropped (its write ended).
    fn hold(self: &Arc<Backlog>, bytes: usize) -> Held {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        Held {
            backlog: self.clone(),
            bytes,
        }
    }

    fn over(&self) -> bool {
        self.bytes.load(Ordering::Acquire) > self.bound
    }
}

/// What one waiting write holds of a [`Backlog`].
struct Held {
    backlog: Arc<Backlog>,
    bytes: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.backlog.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The blocks kept (see the module docs): in memory, and in files when a folder is given.
pub struct PageCache {
    memory: Mutex<Lru<Arc<Block>>>,
    files: Option<Arc<PageFiles>>,
    /// Notifications held by blocks waiting for their files: a quarter of the memory bound
    /// (at least [`BACKLOG_MIN`]) before blocks are left to their first miss.
    backlog: Arc<Backlog>,
}

/// See [`PageCache::backlog`]: room for a few notifications of 1,000 changes however small
/// `--cache-size` is.
const BACKLOG_MIN: usize = 2 << 20;

impl Default for PageCache {
    fn default() -> PageCache {
        PageCache::with_bound(CACHE_BYTES)
    }
}

impl PageCache {
    /// A cache keeping at most `bound` bytes in memory, and no files.
    pub fn with_bound(bound: usize) -> PageCache {
        PageCache {
            memory: Mutex::new(Lru::new(bound as u64)),
            files: None,
            backlog: Backlog::new((bound / 4).max(BACKLOG_MIN)),
        }
    }

    /// A cache keeping at most `bound` bytes in memory, and block files in `files`.
    pub fn with_files(bound: usize, files: PageFiles) -> PageCache {
        PageCache {
            files: Some(Arc::new(files)),
            ..PageCache::with_bound(bound)
        }
    }

    /// Block number `block` of `channel` in `epoch`, if kept in memory.
    pub fn get(&self, channel: &str, epoch: &str, block: u64) -> Option<Arc<Block>> {
        lock(&self.memory).get(&Key::new(channel, epoch, block))
    }

    /// Entries `seqs` of block number `block` of `channel` in `epoch` (a range within that
    /// block, not empty), from its file if there is one. The whole block is read when memory
    /// has room for it, and kept there. Read on the caller's thread when the page cache of the
    /// operating system holds the bytes and the segment file is open, else on a blocking
    /// thread (see `Wait`).
    pub async fn read(
        &self,
        channel: &str,
        epoch: &str,
        block: u64,
        seqs: Range<u64>,
    ) -> Option<Entries> {
        let first = block * BLOCK + 1;
        if seqs.start < first || seqs.end > first + BLOCK || seqs.is_empty() {
            return None;
        }
        let files = self.files.clone()?;
        let key = Key::new(channel, epoch, block);
        let size = files.size(&key)?;
        let whole = {
            let memory = lock(&self.memory);
            memory.bytes + size <= memory.bound
        };
        if whole {
            let found = match files.read(&key, Wait::Never) {
                Ok(found) => found?,
                Err(WouldWait) => {
                    let key = key.clone();
                    tokio::task::spawn_blocking(move || files.read(&key, Wait::Allowed))
                        .await
                        .ok()?
                        .ok()??
                }
            };
            let found = Arc::new(found);
            self.keep_in_memory(key, found.clone());
            return found.entries(seqs.start..=seqs.end - 1);
        }
        let entries = (seqs.start - first) as usize..(seqs.end - first) as usize;
        match files.read_entries(&key, entries.clone(), Wait::Never) {
            Ok(found) => found,
            Err(WouldWait) => tokio::task::spawn_blocking(move || {
                files.read_entries(&key, entries, Wait::Allowed)
            })
            .await
            .ok()?
            .ok()?,
        }
    }

    /// Keeps the blocks of the files found at start-up only for the logs `last` names, as
    /// far as their newest seq (see [`PageFiles::retain`]). Blocking.
    pub fn retain_files(&self, last: impl Fn(&str, &str) -> Option<u64>) {
        if let Some(files) = &self.files {
            files.retain(last);
        }
    }

    /// Keeps a complete block (`BLOCK` entries from seq `block·BLOCK + 1`) in memory and, on
    /// a blocking thread, in its file; anything else is not kept.
    pub fn keep(&self, channel: &str, epoch: &str, block: u64, found: Arc<Block>) {
        if !found.is_complete(block) {
            return;
        }
        let key = Key::new(channel, epoch, block);
        self.write_file(key.clone(), found.clone());
        self.keep_in_memory(key, found);
    }

    fn keep_in_memory(&self, key: Key, found: Arc<Block>) {
        let size = found.bytes() as u64;
        lock(&self.memory).insert(key, found, size);
    }

    /// Writes the file of a complete block in the background, unless it has one.
    fn write_file(&self, key: Key, found: Arc<Block>) {
        let Some(files) = self.files.clone() else {
            return;
        };
        if files.size(&key).is_some() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        tokio::task::spawn_blocking(move || {
            if let Err(e) = files.write(&key, &found) {
                tracing::warn!(channel = %key.channel, block = key.block, error = %e, "cannot write a block of rendered page entries");
            }
        });
    }

    /// A channel's feed published `n`, with `recent` (its recent notifications, in order,
    /// `n` last): each block that `n` completes gets its file, rendered from `recent` in the
    /// background, when `recent` covers it (otherwise it is rendered on its first miss).
    /// The notifications each such write holds count toward a bound until it ends; while
    /// the writes behind hold more, a block is left to its first miss too (see `Backlog`).
    pub fn published(&self, epoch: &str, recent: &[Arc<Notification>], n: &Notification) {
        let Some(files) = &self.files else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        // Blocks whose last seq is in n.first..=n.last.
        for number in n.first.div_ceil(BLOCK).saturating_sub(1)..n.last / BLOCK {
            let key = Key::new(&n.channel, epoch, number);
            let (first, last) = (number * BLOCK + 1, (number + 1) * BLOCK);
            if files.size(&key).is_some() {
                continue;
            }
            let parts: Vec<Arc<Notification>> = recent
                .iter()
                .filter(|m| m.last >= first && m.first <= last)
                .cloned()
                .collect();
            if parts.first().is_none_or(|p| p.first > first) {
                continue;
            }
            if self.backlog.over() {
                tracing::debug!(channel = %n.channel, block = number, "block of page entries left to its first read: the writes before it are behind");
                continue;
            }
            let files = files.clone();
            let held = self.backlog.hold(parts.iter().map(|m| m.memory()).sum());
            tokio::task::spawn_blocking(move || {
                let _held = held;
                let ranges: Vec<(&Notification, Range<usize>)> = parts
                    .iter()
                    .map(|m| {
                        let from = m.changes.partition_point(|c| c.seq < first);
                        let to = m.changes.partition_point(|c| c.seq <= last);
                        (&**m, from..to)
                    })
                    .collect();
                // Copied from the bodies when they say where their entries are.
                let block = Block::copy_parts(&ranges).or_else(|| {
                    let slices: Vec<&[Change]> =
                        ranges.iter().map(|(m, r)| &m.changes[r.clone()]).collect();
                    Block::render_parts(&slices)
                });
                // Not complete: a gap between the notifications (left to its first miss).
                let Some(block) = block.filter(|b| b.is_complete(number)) else {
                    return;
                };
                if let Err(e) = files.write(&key, &block) {
                    tracing::warn!(channel = %key.channel, block = number, error = %e, "cannot write a block of rendered page entries");
                }
            });
        }
    }

    /// The hub stops: a temporary folder of files is removed (files being read meanwhile
    /// stay readable; later reads miss). Blocking.
    pub fn close(&self) {
        if let Some(files) = &self.files {
            files.close();
        }
    }

    /// Forgets a channel's blocks (it was deleted), in memory and on disk.
    pub fn forget(&self, channel: &str) {
        lock(&self.memory).forget(channel);
        if let Some(files) = &self.files {
            files.forget(channel);
        }
    }
}

/// The block files (see the module docs): a folder per channel and epoch, in it a segment
/// file per [`SEGMENT`] consecutive blocks, at most a bound of bytes in all (the segment used
/// least recently removed first, with all its blocks). The index of the blocks is in memory;
/// bytes this index does not place are never read.
pub struct PageFiles {
    dir: PathBuf,
    /// Blocks per segment file ([`SEGMENT`]; fewer in tests).
    segment: u64,
    index: Mutex<Index>,
    /// A folder made for this process, when no folder was given: removed by
    /// [`PageCache::close`], or when dropped.
    temporary: Mutex<Option<tempfile::TempDir>>,
}

/// Blocks per segment file. Creating a file costs far more than writing a block into one
/// that exists (on ext4, about 0.9 ms against 0.05 ms for a block's 300 KB), and a block is
/// written for every 1,000 changes published.
pub const SEGMENT: u64 = 64;

/// Where the blocks are: which segment file, where in it.
struct Index {
    /// Block key → its place, including blocks being written (not yet readable).
    blocks: HashMap<Key, Place>,
    /// Segment key (the key of its first block's number divided by the segment size) → the
    /// segment; its size is the bytes reserved in its file.
    segments: Lru<Segment>,
    /// The generation the next segment file gets (a part of its name, so that a file
    /// removed with its segment is never mistaken for a newer one of the same blocks).
    generation: u64,
}

/// Where a block is in its segment file.
#[derive(Clone, Copy, Debug)]
struct Place {
    generation: u64,
    offset: u64,
    size: u64,
    /// Its bytes are written: it can be read.
    written: bool,
    /// Its checksum was checked against its bytes, or this process wrote them. A block found
    /// in its file at start-up is not, until its first read (see [`PageFiles::open`]).
    verified: bool,
}

/// A segment file's generation, the bytes reserved in it, and the numbers of the blocks
/// placed there.
struct Segment {
    generation: u64,
    length: u64,
    blocks: Vec<u64>,
    /// The file, open for reading once a block of it was read (closed when the segment is
    /// dropped and the last read of it ends).
    file: Option<Arc<File>>,
}

/// Whether a read of a block file may wait for the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// Only what costs no wait: the segment file already open, its bytes in the operating
    /// system's page cache (`preadv2` with `RWF_NOWAIT`). Otherwise the read gives
    /// [`WouldWait`] and nothing else happens. For the async threads that serve requests:
    /// a read of a block read recently costs a copy, not a trip through the blocking pool
    /// (two thread wake-ups, which under load cost more than the copy).
    Never,
    /// The read may wait for the file to open and for the disk (on a blocking thread).
    Allowed,
}

/// A read with [`Wait::Never`] would have had to wait: read again with [`Wait::Allowed`].
#[derive(Debug)]
struct WouldWait;

/// The magic number at the start of a block (its format's version).
const MAGIC: &[u8; 8] = b"CHPAGES2";
/// What a block forgotten while its segment file stays has in place of its magic number: a
/// later process skips it when it walks the file (see [`PageFiles::open`]).
const DEAD: &[u8; 8] = b"CHPAGES-";
/// Bytes of a block's fixed header: magic, first seq, count, checksum.
const FIXED: u64 = 32;
/// Bytes per entry in the header: end offset, datetime.
const RECORD: u64 = 24;

impl PageFiles {
    /// Block files in `dir`, at most `bound` bytes of them, with the blocks an earlier
    /// process left there: each segment file is walked block by block (two small reads per
    /// block: its fixed header and its last record), as far as its blocks are whole and of
    /// that segment; the rest of the file is left to be written over. Anything else in the
    /// folder is removed, and so are segments beyond the bound, the oldest generations
    /// first. A block found this way is checked against its checksum on its first read
    /// (see `verify`), and the caller says which channels and epochs still hold its seqs
    /// ([`PageFiles::retain`]). Blocking.
    pub fn open(dir: &Path, bound: u64) -> io::Result<PageFiles> {
        PageFiles::open_in(dir, bound, SEGMENT)
    }

    /// [`PageFiles::open`], with `segment` blocks per segment file.
    fn open_in(dir: &Path, bound: u64, segment: u64) -> io::Result<PageFiles> {
        std::fs::create_dir_all(dir)?;
        let mut files = PageFiles::new(dir.to_path_buf(), bound, None);
        files.segment = segment;
        let mut found = Vec::new();
        for (channel, path) in folder(dir)? {
            if !plain_name(&channel) || !path.is_dir() {
                remove_any(&path);
                continue;
            }
            for (epoch, path) in folder(&path)? {
                if !plain_name(&epoch) || !path.is_dir() {
                    remove_any(&path);
                    continue;
                }
                for (name, path) in folder(&path)? {
                    match segment_name(&name).filter(|_| path.is_file()) {
                        Some((number, generation)) => {
                            let key = Key::new(&channel, &epoch, number);
                            found.push((generation, key, path));
                        }
                        None => remove_any(&path),
                    }
                }
            }
        }
        // Oldest generation first: the newest count as used last.
        found.sort_by_key(|(generation, ..)| *generation);
        for (generation, segment_key, path) in found {
            files.restore(segment_key, generation, &path);
        }
        Ok(files)
    }

    /// Places the whole blocks of the segment file at `path` (segment `segment_key`, its
    /// generation `generation`) in the index; removes the file when it has none, or when it
    /// is dropped for the bound or for a newer file of the same segment.
    fn restore(&self, segment_key: Key, generation: u64, path: &Path) {
        let blocks = File::open(path)
            .and_then(|file| self.whole_blocks(&file, segment_key.block, generation))
            .unwrap_or_default();
        let Some(length) = blocks.iter().map(|(_, p)| p.offset + p.size).max() else {
            remove_any(path);
            return;
        };
        let mut index = lock(&self.index);
        index.generation = index.generation.max(generation);
        if let Some(older) = index.segments.remove(&segment_key) {
            self.forget_segment(&mut index, &segment_key, &older);
        }
        for &(number, place) in &blocks {
            index.blocks.insert(
                Key {
                    block: number,
                    ..segment_key.clone()
                },
                place,
            );
        }
        let segment = Segment {
            generation,
            length,
            blocks: blocks.iter().map(|(number, _)| *number).collect(),
            file: None,
        };
        let dropped = index.segments.insert(segment_key, segment, length);
        for (dropped_key, segment) in dropped {
            self.forget_segment(&mut index, &dropped_key, &segment);
        }
    }

    /// Takes the blocks of a dropped segment out of the index and removes its file.
    fn forget_segment(&self, index: &mut Index, segment_key: &Key, segment: &Segment) {
        for block in &segment.blocks {
            index.blocks.remove(&Key {
                block: *block,
                ..segment_key.clone()
            });
        }
        let first_block = Key {
            block: segment_key.block * self.segment,
            ..segment_key.clone()
        };
        remove_any(&self.segment_path(&first_block, segment.generation));
    }

    /// The whole blocks at the start of the file of segment number `number`, one after the
    /// other, each with its place: as far as each has the magic number (or that of a block
    /// forgotten, which is skipped), a first seq of its segment, at least one entry and no
    /// more than a block's, and all its bytes within the file. A block found again further on
    /// is the newer: a block is written again only once forgotten.
    fn whole_blocks(
        &self,
        file: &File,
        number: u64,
        generation: u64,
    ) -> io::Result<Vec<(u64, Place)>> {
        let length = file.metadata()?.len();
        let mut blocks: Vec<(u64, Place)> = Vec::new();
        let mut offset = 0;
        while offset + FIXED <= length {
            let fixed = read_new(file, FIXED as usize, offset, Wait::Allowed)?;
            let (first, count) = (u64_at(&fixed, 8), u64_at(&fixed, 16));
            let block = first.saturating_sub(1) / BLOCK;
            let live = &fixed[..8] == MAGIC;
            let whole = (live || &fixed[..8] == DEAD)
                && first % BLOCK == 1
                && block / self.segment == number
                && (1..=BLOCK).contains(&count);
            let records = offset + FIXED + count * RECORD;
            if !whole || records > length {
                break;
            }
            let last = read_new(file, RECORD as usize, records - RECORD, Wait::Allowed)?;
            let size = FIXED + count * RECORD + u64_at(&last, 0);
            if offset.checked_add(size).is_none_or(|end| end > length) {
                break;
            }
            let place = Place {
                generation,
                offset,
                size,
                written: true,
                verified: false,
            };
            blocks.retain(|(b, _)| *b != block);
            if live {
                blocks.push((block, place));
            }
            offset += size;
        }
        Ok(blocks)
    }

    /// Keeps the blocks of a channel and epoch only while `last(channel, epoch)` is the
    /// newest seq of that log and the block's seqs are all at or before it: the others (a
    /// channel gone, a log begun again, a store put back to an earlier state) are forgotten,
    /// with the files of segments left without blocks and the folders of logs not kept. For
    /// the blocks found at start-up, before any page is served. Blocking.
    pub fn retain(&self, last: impl Fn(&str, &str) -> Option<u64>) {
        let mut index = lock(&self.index);
        let mut folders = Vec::new();
        let keys: Vec<Key> = index.blocks.keys().cloned().collect();
        let found = keys.len();
        for key in keys {
            let kept = last(&key.channel, &key.epoch);
            if kept.is_some_and(|last| (key.block + 1) * BLOCK <= last) {
                continue;
            }
            if kept.is_none() {
                folders.push(self.dir.join(&key.channel).join(&key.epoch));
            }
            let Some(place) = index.blocks.remove(&key) else {
                continue;
            };
            let segment_key = self.segment_of(&key);
            let Some(segment) = index.segments.touch(&segment_key) else {
                continue;
            };
            segment.blocks.retain(|b| *b != key.block);
            if segment.blocks.is_empty() {
                index.segments.remove(&segment_key);
                remove_any(&self.segment_path(&key, place.generation));
            } else {
                self.mark_dead(&key, place);
            }
        }
        let kept = index.blocks.len();
        drop(index);
        if found > 0 {
            tracing::info!(
                found,
                kept,
                "block files of Change List entries found from before the start"
            );
        }
        folders.sort();
        folders.dedup();
        for folder in folders {
            remove_any(&folder);
        }
    }

    /// Block files in a new temporary folder (`changehub-pages-…` in the system's), removed
    /// by [`PageCache::close`] or when this is dropped. Blocking.
    pub fn temporary(bound: u64) -> io::Result<PageFiles> {
        let dir = tempfile::Builder::new()
            .prefix("changehub-pages-")
            .tempdir()?;
        Ok(PageFiles::new(dir.path().to_path_buf(), bound, Some(dir)))
    }

    fn new(dir: PathBuf, bound: u64, temporary: Option<tempfile::TempDir>) -> PageFiles {
        PageFiles {
            dir,
            segment: SEGMENT,
            index: Mutex::new(Index {
                blocks: HashMap::new(),
                segments: Lru::new(bound),
                generation: 0,
            }),
            temporary: Mutex::new(temporary),
        }
    }

    /// The same, with `blocks` blocks per segment file.
    #[cfg(test)]
    fn with_segment(mut self, blocks: u64) -> PageFiles {
        self.segment = blocks;
        self
    }

    /// The segment file that holds the block of `key` (written or being written).
    #[cfg(test)]
    fn path(&self, key: &Key) -> Option<PathBuf> {
        let place = *lock(&self.index).blocks.get(key)?;
        Some(self.segment_path(key, place.generation))
    }

    /// [`PageFiles::read`] that may wait.
    #[cfg(test)]
    fn read_waiting(&self, key: &Key) -> Option<Block> {
        self.read(key, Wait::Allowed).ok().flatten()
    }

    /// [`PageFiles::read_entries`] that may wait.
    #[cfg(test)]
    fn entries_waiting(&self, key: &Key, entries: Range<usize>) -> Option<Entries> {
        self.read_entries(key, entries, Wait::Allowed)
            .ok()
            .flatten()
    }

    /// Where the files are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of the segment that holds block `key`.
    fn segment_of(&self, key: &Key) -> Key {
        Key {
            block: key.block / self.segment,
            ..key.clone()
        }
    }

    /// The file of generation `generation` of the segment that holds block `key`.
    fn segment_path(&self, key: &Key, generation: u64) -> PathBuf {
        self.dir
            .join(&key.channel)
            .join(&key.epoch)
            .join(format!("{}-{generation}", key.block / self.segment))
    }

    /// The size of the block of `key`, if its bytes are written (its segment counts as used).
    fn size(&self, key: &Key) -> Option<u64> {
        self.place(key).map(|(place, _)| place.size)
    }

    /// Where the block of `key` is, if its bytes are written (its segment counts as used),
    /// and its segment file if it is open for reading.
    fn place(&self, key: &Key) -> Option<(Place, Option<Arc<File>>)> {
        let segment = self.segment_of(key);
        let mut index = lock(&self.index);
        let place = *index.blocks.get(key).filter(|p| p.written)?;
        let file = index
            .segments
            .touch(&segment)
            .and_then(|s| s.file.clone().filter(|_| s.generation == place.generation));
        Some((place, file))
    }

    /// The segment file of the block of `key` at `place`, open for reading: the one its
    /// segment keeps, else (when the read may wait) opened and kept with the segment.
    fn segment_file(
        &self,
        key: &Key,
        place: Place,
        kept: Option<Arc<File>>,
        wait: Wait,
    ) -> io::Result<Arc<File>> {
        if let Some(file) = kept {
            return Ok(file);
        }
        if wait == Wait::Never {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let file = Arc::new(File::open(self.segment_path(key, place.generation))?);
        let mut index = lock(&self.index);
        if let Some(segment) = index.segments.touch(&self.segment_of(key)) {
            if segment.generation == place.generation && segment.file.is_none() {
                segment.file = Some(file.clone());
            }
        }
        Ok(file)
    }

    /// Writes a complete block into its segment file, at a place reserved for it, and
    /// removes the segments used least recently beyond the bound. Nothing is written when
    /// the block is written or being written already. Blocking.
    fn write(&self, key: &Key, block: &Block) -> io::Result<()> {
        if !plain_name(&key.channel) || !plain_name(&key.epoch) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a channel or epoch that is no plain file name",
            ));
        }
        let mut header =
            Vec::with_capacity((FIXED + RECORD * block.datetimes.len() as u64) as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&block.first.to_le_bytes());
        header.extend_from_slice(&(block.datetimes.len() as u64).to_le_bytes());
        header.extend_from_slice(&[0; 8]);
        for (end, datetime) in block.entries.ends.iter().zip(&block.datetimes) {
            header.extend_from_slice(&(*end as u64).to_le_bytes());
            header.extend_from_slice(&datetime.unix_timestamp_nanos().to_le_bytes());
        }
        let sum = checksum(&[&header[FIXED as usize..], &block.entries.bytes]);
        header[24..32].copy_from_slice(&sum.to_le_bytes());
        let size = (header.len() + block.entries.bytes.len()) as u64;
        match self.reserve(key, size) {
            Some(place) => self.fill(key, place, &[&header, &block.entries.bytes]),
            None => Ok(()),
        }
    }

    /// Writes `parts` (a block's bytes) at `place`, reserved for block `key`, which then can
    /// be read; unless its segment was dropped meanwhile: then the segment's file is removed
    /// (again: the writer that opened it last removes it).
    fn fill(&self, key: &Key, place: Place, parts: &[&[u8]]) -> io::Result<()> {
        let path = self.segment_path(key, place.generation);
        let written = write_at(&path, place.offset, parts);
        let segment = self.segment_of(key);
        let mut index = lock(&self.index);
        match index.blocks.get_mut(key) {
            Some(p) if p.generation == place.generation && !p.written => {
                if written.is_ok() {
                    p.written = true;
                } else {
                    index.blocks.remove(key);
                }
            }
            _ => {}
        }
        let gone = index
            .segments
            .peek(&segment)
            .is_none_or(|s| s.generation != place.generation);
        drop(index);
        if gone {
            let _ = std::fs::remove_file(&path);
        }
        written
    }

    /// Reserves `size` bytes at the end of the segment file of block `key` (a new segment
    /// when it has none), dropping the segments used least recently beyond the bound, and
    /// removes their files. `None` when the block is placed already, or when its segment
    /// was dropped itself (the bound is smaller than it).
    fn reserve(&self, key: &Key, size: u64) -> Option<Place> {
        let segment_key = self.segment_of(key);
        let mut index = lock(&self.index);
        if index.blocks.contains_key(key) {
            return None;
        }
        let mut segment = match index.segments.remove(&segment_key) {
            Some(segment) => segment,
            None => {
                index.generation += 1;
                Segment {
                    generation: index.generation,
                    length: 0,
                    blocks: Vec::new(),
                    file: None,
                }
            }
        };
        let place = Place {
            generation: segment.generation,
            offset: segment.length,
            size,
            written: false,
            verified: true,
        };
        segment.length += size;
        segment.blocks.push(key.block);
        let length = segment.length;
        let dropped = index.segments.insert(segment_key.clone(), segment, length);
        let mut gone = Vec::new();
        let mut kept = true;
        for (dropped_key, segment) in dropped {
            for block in &segment.blocks {
                index.blocks.remove(&Key {
                    block: *block,
                    ..dropped_key.clone()
                });
            }
            kept &= dropped_key != segment_key;
            gone.push((dropped_key, segment.generation));
        }
        if kept {
            index.blocks.insert(key.clone(), place);
        }
        drop(index);
        for (dropped_key, generation) in gone {
            // Already out of the index: a failure only leaves a file nobody reads.
            let first_block = Key {
                block: dropped_key.block * self.segment,
                ..dropped_key
            };
            let _ = std::fs::remove_file(self.segment_path(&first_block, generation));
        }
        kept.then_some(place)
    }

    /// Reads the whole block of `key`. `None` when it is not written or is not what it
    /// should be. Blocking.
    fn read(&self, key: &Key, wait: Wait) -> Result<Option<Block>, WouldWait> {
        let Some((place, kept)) = self.place(key) else {
            return Ok(None);
        };
        let read = self.segment_file(key, place, kept, wait).and_then(|file| {
            self.verify(key, place, &file, wait)?;
            read_block(&file, place, key.block * BLOCK + 1, wait)
        });
        self.checked(key, place, read)
    }

    /// Reads the entries `entries` (indices within the block) of the block of `key`: only the
    /// offsets and datetimes of the first and the last, then their bytes. `None` when it is
    /// not written or is not what it should be. Blocking.
    fn read_entries(
        &self,
        key: &Key,
        entries: Range<usize>,
        wait: Wait,
    ) -> Result<Option<Entries>, WouldWait> {
        let Some((place, kept)) = self.place(key) else {
            return Ok(None);
        };
        let read = self.segment_file(key, place, kept, wait).and_then(|file| {
            self.verify(key, place, &file, wait)?;
            read_entries(&file, place, key.block * BLOCK + 1, entries, wait)
        });
        self.checked(key, place, read)
    }

    /// Checks, once, that a block found in its file at start-up is what was written: its
    /// first read reads it whole and compares its checksum (a block cut short or left half
    /// written by a crash). Such a read may wait (a blocking thread's); blocks this process
    /// wrote need no check.
    fn verify(&self, key: &Key, place: Place, file: &File, wait: Wait) -> io::Result<()> {
        if place.verified {
            return Ok(());
        }
        if wait == Wait::Never {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let block = open_block(file, place, key.block * BLOCK + 1, wait)?;
        let rest = block.read_bytes(FIXED, (place.size.saturating_sub(FIXED)) as usize)?;
        if checksum(&[&rest]) != block.checksum {
            return Err(corrupt("a block whose checksum does not match its bytes"));
        }
        if let Some(p) = lock(&self.index).blocks.get_mut(key) {
            if p.generation == place.generation {
                p.verified = true;
            }
        }
        Ok(())
    }

    /// What was read of the block of `key` at `place`; when that failed, the block is
    /// forgotten, and its segment with it when no other block is placed in it — unless the
    /// read only would have had to wait.
    fn checked<T>(
        &self,
        key: &Key,
        place: Place,
        read: io::Result<T>,
    ) -> Result<Option<T>, WouldWait> {
        let e = match read {
            Ok(found) => return Ok(Some(found)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(WouldWait),
            Err(e) => e,
        };
        tracing::warn!(channel = %key.channel, block = key.block, error = %e, "cannot read a block of rendered page entries; rendering it again");
        let segment_key = self.segment_of(key);
        let mut index = lock(&self.index);
        if index
            .blocks
            .get(key)
            .is_none_or(|p| p.generation != place.generation)
        {
            return Ok(None);
        }
        index.blocks.remove(key);
        let Some(segment) = index.segments.touch(&segment_key) else {
            return Ok(None);
        };
        segment.blocks.retain(|b| *b != key.block);
        if segment.blocks.is_empty() {
            index.segments.remove(&segment_key);
            drop(index);
            let _ = std::fs::remove_file(self.segment_path(key, place.generation));
        } else {
            drop(index);
            self.mark_dead(key, place);
        }
        Ok(None)
    }

    /// Overwrites the magic number of a forgotten block whose segment file stays, so that a
    /// later process skips it instead of finding it again (a failure leaves it to the
    /// checks at start-up: its checksum, and the newest seq of its log).
    fn mark_dead(&self, key: &Key, place: Place) {
        let path = self.segment_path(key, place.generation);
        if let Ok(file) = File::options().write(true).open(path) {
            let _ = file.write_all_at(DEAD, place.offset);
        }
    }

    /// Forgets every block, and the files of a temporary folder.
    fn close(&self) {
        let mut index = lock(&self.index);
        index.blocks.clear();
        index.segments.forget_all();
        drop(index);
        drop(lock(&self.temporary).take());
    }

    /// Forgets and removes a channel's files.
    fn forget(&self, channel: &str) {
        let mut index = lock(&self.index);
        index.blocks.retain(|k, _| k.channel != channel);
        index.segments.forget(channel);
        drop(index);
        if !plain_name(channel) {
            return;
        }
        // Moved aside at once (a channel of the same name may come back), removed in the
        // background.
        let aside = self
            .dir
            .join(format!(".forgotten-{:016x}", rand::random::<u64>()));
        if std::fs::rename(self.dir.join(channel), &aside).is_ok() {
            let remove = move || {
                let _ = std::fs::remove_dir_all(&aside);
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(remove)),
                Err(_) => remove(),
            }
        }
    }
}

/// Writes `parts` one after the other into the file at `path` from `offset` on, making the
/// file (and its folder) when there is none.
fn write_at(path: &Path, offset: u64, parts: &[&[u8]]) -> io::Result<()> {
    let open = || {
        File::options()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
    };
    let file = match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(folder) = path.parent() {
                std::fs::create_dir_all(folder)?;
            }
            open()?
        }
        opened => opened?,
    };
    let mut at = offset;
    for part in parts {
        file.write_all_at(part, at)?;
        at += part.len() as u64;
    }
    Ok(())
}

/// The entries of the folder `dir`: each name (when it is UTF-8) and path.
fn folder(dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        match path.file_name().and_then(|n| n.to_str()) {
            Some(name) => entries.push((name.to_string(), path.clone())),
            None => remove_any(&path),
        }
    }
    Ok(entries)
}

/// Removes a file or a folder with what it holds; a failure only leaves bytes nobody reads.
fn remove_any(path: &Path) {
    let _ = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
}

/// The segment number and generation of a segment file's name (`NUMBER-GENERATION`).
fn segment_name(name: &str) -> Option<(u64, u64)> {
    let (number, generation) = name.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(number) || !digits(generation) {
        return None;
    }
    Some((number.parse().ok()?, generation.parse().ok()?))
}

/// Whether `name` can be a folder's name under the folder of the files as it is (channel
/// names and epochs always can; this only makes sure).
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn corrupt(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// A block open for reading: its segment file, where the block starts in it, its size, the
/// number of its entries, whether its reads may wait.
struct BlockFile<'f> {
    file: &'f File,
    base: u64,
    length: u64,
    count: usize,
    /// The checksum of the bytes after the fixed header.
    checksum: u64,
    wait: Wait,
}

/// Reads `len` bytes of `file` at `offset` into a new buffer. With [`Wait::Never`] only from
/// the operating system's page cache: an error of kind `WouldBlock` when that would have to
/// wait for the disk (or the file system cannot tell). `UnexpectedEof` when the file ends
/// first.
///
/// The buffer is not zeroed before the read: a page's entries are hundreds of KB, and zeroing
/// them was 5% of the hub's CPU for a page read from the files (docs/performance.md,
/// forty-eighth pass).
#[cfg(target_os = "linux")]
fn read_new(file: &File, len: usize, offset: u64, wait: Wait) -> io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let mut bytes: Vec<u8> = Vec::with_capacity(len);
    let mut done = 0;
    while done < len {
        let at = offset
            .checked_add(done as u64)
            .and_then(|at| libc::off_t::try_from(at).ok())
            .ok_or_else(|| corrupt("an offset beyond what the system can read"))?;
        let spare = &mut bytes.spare_capacity_mut()[done..len];
        let (buf, count) = (spare.as_mut_ptr().cast::<libc::c_void>(), spare.len());
        // SAFETY: the kernel writes at most `count` bytes at `buf`, all of them inside `spare`
        // (the vector's own capacity, held mutably here); uninitialised bytes need no drop.
        let read = unsafe {
            match wait {
                Wait::Allowed => libc::pread(fd, buf, count, at),
                Wait::Never => {
                    let iov = libc::iovec {
                        iov_base: buf,
                        iov_len: count,
                    };
                    libc::preadv2(fd, &iov, 1, at, libc::RWF_NOWAIT)
                }
            }
        };
        match read {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => done += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    // Not in the page cache; or a kernel or file system without RWF_NOWAIT.
                    Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::ENOSYS) if wait == Wait::Never => {
                        return Err(io::ErrorKind::WouldBlock.into())
                    }
                    _ => return Err(e),
                }
            }
        }
    }
    // SAFETY: the loop ends only once the kernel has written all `len` bytes.
    unsafe { bytes.set_len(len) };
    Ok(bytes)
}

/// Elsewhere every read is left to a blocking thread.
#[cfg(not(target_os = "linux"))]
fn read_new(file: &File, len: usize, offset: u64, wait: Wait) -> io::Result<Vec<u8>> {
    match wait {
        Wait::Allowed => {
            let mut bytes = vec![0; len];
            file.read_exact_at(&mut bytes, offset)?;
            Ok(bytes)
        }
        Wait::Never => Err(io::ErrorKind::WouldBlock.into()),
    }
}

/// Opens the block at `place` of the segment file `file`, which must be the block starting
/// at seq `first` (see the module docs for the format).
fn open_block(file: &File, place: Place, first: u64, wait: Wait) -> io::Result<BlockFile<'_>> {
    let mut file = BlockFile {
        file,
        base: place.offset,
        length: place.size,
        count: 0,
        checksum: 0,
        wait,
    };
    let fixed = file.read_bytes(0, FIXED as usize)?;
    if &fixed[..8] != MAGIC || u64_at(&fixed, 8) != first {
        return Err(corrupt("not the block expected"));
    }
    let count = u64_at(&fixed, 16);
    if count == 0 || count > BLOCK {
        return Err(corrupt("a block with no entries or too many"));
    }
    file.count = count as usize;
    file.checksum = u64_at(&fixed, 24);
    Ok(file)
}

/// The checksum of a block's bytes after its fixed header (CRC-32), given in pieces.
fn checksum(parts: &[&[u8]]) -> u64 {
    let mut hasher = crc32fast::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    u64::from(hasher.finalize())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Record `i` of `records` (records of the header, read from some record on): the end
/// offset and the datetime of an entry.
fn record_at(records: &[u8], i: usize) -> io::Result<(u64, OffsetDateTime)> {
    let at = i * RECORD as usize;
    let mut nanos = [0u8; 16];
    nanos.copy_from_slice(&records[at + 8..at + 24]);
    let datetime = OffsetDateTime::from_unix_timestamp_nanos(i128::from_le_bytes(nanos))
        .map_err(|_| corrupt("a datetime out of range"))?;
    Ok((u64_at(records, at), datetime))
}

impl BlockFile<'_> {
    /// Reads `len` bytes at `at` (from the block's start) into a new buffer; an error, before
    /// anything is allocated, when the block is shorter.
    fn read_bytes(&self, at: u64, len: usize) -> io::Result<Vec<u8>> {
        if at
            .checked_add(len as u64)
            .is_none_or(|end| end > self.length)
        {
            return Err(corrupt("offsets beyond the end of the block"));
        }
        read_new(self.file, len, self.base + at, self.wait).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => corrupt("a segment file cut short"),
            _ => e,
        })
    }
}

/// Reads the whole block at `place` of the segment file `file`, which must be the block
/// starting at seq `first`.
fn read_block(file: &File, place: Place, first: u64, wait: Wait) -> io::Result<Block> {
    let file = open_block(file, place, first, wait)?;
    let count = file.count;
    let records = file.read_bytes(FIXED, count * RECORD as usize)?;
    let mut ends = Vec::with_capacity(count);
    let mut datetimes = Vec::with_capacity(count);
    let mut previous = 0;
    for i in 0..count {
        let (end, datetime) = record_at(&records, i)?;
        if end < previous {
            return Err(corrupt("entry offsets going backwards"));
        }
        previous = end;
        ends.push(end as usize);
        datetimes.push(datetime);
    }
    let bytes = file.read_bytes(FIXED + count as u64 * RECORD, previous as usize)?;
    Ok(Block {
        first,
        entries: RenderedEntries { bytes, ends },
        datetimes,
    })
}

/// Reads entries `entries` (indices within the block, not empty) of the block at `place` of
/// the segment file `file`, which must be the block starting at seq `first`: the records
/// of the entry before them (where their bytes start), of the first and of the last, then
/// their bytes.
fn read_entries(
    file: &File,
    place: Place,
    first: u64,
    entries: Range<usize>,
    wait: Wait,
) -> io::Result<Entries> {
    let file = open_block(file, place, first, wait)?;
    let count = file.count;
    if entries.is_empty() || entries.end > count {
        return Err(corrupt("no such entries in the block"));
    }
    // Records entries.start − 1 (when there is one) and entries.start.
    let from = entries.start.saturating_sub(1);
    let head = file.read_bytes(
        FIXED + from as u64 * RECORD,
        (entries.start - from + 1) * RECORD as usize,
    )?;
    let start = if entries.start == 0 {
        0
    } else {
        record_at(&head, 0)?.0
    };
    let (first_end, from_datetime) = record_at(&head, entries.start - from)?;
    let (end, until) = if entries.len() == 1 {
        (first_end, from_datetime)
    } else {
        let tail = file.read_bytes(FIXED + (entries.end - 1) as u64 * RECORD, RECORD as usize)?;
        record_at(&tail, 0)?
    };
    if first_end < start || end < first_end {
        return Err(corrupt("entry offsets going backwards"));
    }
    let data = FIXED + count as u64 * RECORD;
    let bytes = file.read_bytes(data + start, (end - start) as usize)?;
    Ok(Entries {
        first: first + entries.start as u64,
        last: first + entries.end as u64 - 1,
        bytes: Bytes::from(bytes),
        from: from_datetime,
        until,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ChangeType, NewChange};

    fn changes(first: u64, n: u64) -> Vec<Change> {
        (first..first + n)
            .map(|seq| {
                let new = NewChange::new(format!("http://example.com/{seq}"), ChangeType::Updated);
                // Datetimes with nanoseconds, some before 1970, all different.
                let at = OffsetDateTime::UNIX_EPOCH
                    + time::Duration::new(seq as i64 * 3_601 - 7_200, seq as i32 * 1_013);
                Change::from_new(seq, new, at)
            })
            .collect()
    }

    fn block(first: u64, n: u64) -> Arc<Block> {
        Arc::new(Block::render(&changes(first, n)).unwrap())
    }

    fn key(block: u64) -> Key {
        Key::new("c", "e", block)
    }

    /// The bytes block 0 of [`block`] takes in a file.
    fn block_size_on_disk() -> u64 {
        let probe = PageFiles::temporary(FILES_BYTES).unwrap();
        probe.write(&key(0), &block(1, BLOCK)).unwrap();
        probe.size(&key(0)).unwrap()
    }

    fn memory_bytes(cache: &PageCache) -> u64 {
        lock(&cache.memory).bytes
    }

    #[tokio::test]
    async fn blocks_completed_while_the_writes_behind_hold_too_much_are_left_to_their_first_miss() {
        let cache = PageCache::with_files(0, PageFiles::temporary(FILES_BYTES).unwrap());
        let files = cache.files.clone().unwrap();
        let notification = |first: u64| {
            Arc::new(Notification {
                channel: "c".into(),
                first,
                last: first + BLOCK - 1,
                changes: changes(first, BLOCK),
                body: Default::default(),
                entry_bounds: Vec::new(),
                accepted_at: None,
            })
        };
        // Writes behind hold more than the bound: block 0 is not written, and its
        // notification is not held.
        let behind = cache.backlog.hold(cache.backlog.bound + 1);
        let held = cache.backlog.bytes.load(Ordering::Acquire);
        let zero = notification(1);
        cache.published("e", std::slice::from_ref(&zero), &zero);
        assert_eq!(cache.backlog.bytes.load(Ordering::Acquire), held);
        assert_eq!(Arc::strong_count(&zero), 1, "no write holds it");
        // Once they are done, the next block is written as usual.
        drop(behind);
        let one = notification(BLOCK + 1);
        cache.published("e", &[zero.clone(), one.clone()], &one);
        assert!(written(&files, &key(1)).await);
        assert!(files.size(&key(0)).is_none(), "left to its first miss");
    }

    #[test]
    fn only_complete_aligned_blocks_are_kept_per_channel_and_epoch() {
        let cache = PageCache::default();
        cache.keep("c", "e1", 0, block(1, BLOCK - 1));
        cache.keep("c", "e1", 1, block(2, BLOCK));
        assert!(cache.get("c", "e1", 0).is_none() && cache.get("c", "e1", 1).is_none());
        cache.keep("c", "e1", 1, block(BLOCK + 1, BLOCK));
        let kept = cache.get("c", "e1", 1).unwrap();
        assert_eq!((kept.first, kept.last()), (BLOCK + 1, 2 * BLOCK));
        assert!(cache.get("c", "e2", 1).is_none(), "another epoch");
        assert!(cache.get("d", "e1", 1).is_none(), "another channel");
        cache.forget("c");
        assert!(cache.get("c", "e1", 1).is_none());
        assert_eq!(memory_bytes(&cache), 0);
    }

    #[test]
    fn gaps_are_not_rendered_and_the_bound_drops_the_least_recently_used() {
        let mut gap = changes(1, 3);
        gap[2].seq = 5;
        assert!(Block::render(&gap).is_none());
        assert!(Block::render(&[]).is_none());
        let (a, b) = gap.split_at(2);
        assert!(
            Block::render_parts(&[a, b]).is_none(),
            "a gap between parts"
        );

        let size = block(1, BLOCK).bytes();
        let cache = PageCache::with_bound(size * 2 + size / 2);
        cache.keep("c", "e", 0, block(1, BLOCK));
        cache.keep("c", "e", 1, block(BLOCK + 1, BLOCK));
        assert!(
            cache.get("c", "e", 0).is_some(),
            "0 is now the most recently used"
        );
        cache.keep("c", "e", 2, block(2 * BLOCK + 1, BLOCK));
        assert!(cache.get("c", "e", 1).is_none(), "1 went");
        assert!(cache.get("c", "e", 0).is_some() && cache.get("c", "e", 2).is_some());
        assert!(memory_bytes(&cache) <= (size * 2 + size / 2) as u64);
    }

    #[test]
    fn a_block_rendered_in_parts_is_the_block_rendered_whole() {
        let all = changes(1, BLOCK);
        let whole = Block::render(&all).unwrap();
        let parts = Block::render_parts(&[&all[..1], &all[1..400], &[], &all[400..]]).unwrap();
        assert_eq!(parts.first, whole.first);
        assert_eq!(parts.entries.bytes, whole.entries.bytes);
        assert_eq!(parts.entries.ends, whole.entries.ends);
        assert_eq!(parts.datetimes, whole.datetimes);
    }

    /// A notification rendered as the batcher renders it, with the bounds of its entries.
    fn rendered(changes: Vec<Change>) -> Notification {
        let header = resourcesync::ChangeListHeader {
            from: changes.first().map(|c| c.datetime),
            until: changes.last().map(|c| c.datetime),
            epoch: Some("e".into()),
            ..Default::default()
        };
        let (body, entry_bounds) = resourcesync::write_change_list_bounded(&header, &changes);
        Notification {
            channel: "c".into(),
            first: changes.first().map_or(0, |c| c.seq),
            last: changes.last().map_or(0, |c| c.seq),
            changes,
            body: body.into(),
            entry_bounds,
            accepted_at: None,
        }
    }

    /// A block copied from the bodies of the notifications that hold its changes is the block
    /// rendered from the changes, byte for byte; without the bounds of their entries, nothing
    /// is copied.
    #[test]
    fn a_block_copied_from_notifications_is_the_block_rendered() {
        let mut all = changes(1, BLOCK + 300);
        all[5].loc = "http://example.com/a?b=1&c=<d>\"e\"".into();
        all[6].links = vec![crate::model::Link {
            rel: "alternate".into(),
            href: "http://example.com/x&y".into(),
            attrs: [("type".to_string(), "text/html".to_string())].into(),
        }];
        all[7].hash = Some("md5:1e0d5cb8ef6ba40c99b14c0237be735e".into());
        let (one, two, three) = (
            rendered(all[..1].to_vec()),
            rendered(all[1..600].to_vec()),
            rendered(all[600..].to_vec()),
        );
        let whole = Block::render(&all[..BLOCK as usize]).unwrap();
        let copied = Block::copy_parts(&[(&one, 0..1), (&two, 0..599), (&three, 0..400)]).unwrap();
        assert_eq!(copied.first, 1);
        assert_eq!(copied.entries.bytes, whole.entries.bytes);
        assert_eq!(copied.entries.ends, whole.entries.ends);
        assert_eq!(copied.datetimes, whole.datetimes);
        // A part from the middle of a notification.
        let middle = Block::copy_parts(&[(&two, 99..599), (&three, 0..10)]).unwrap();
        let rendered_middle = Block::render(&all[100..610]).unwrap();
        assert_eq!(middle.first, 101);
        assert_eq!(middle.entries.bytes, rendered_middle.entries.bytes);
        assert_eq!(middle.entries.ends, rendered_middle.entries.ends);
        // A gap, or a body without bounds: not copied.
        assert!(Block::copy_parts(&[(&one, 0..1), (&three, 0..10)]).is_none());
        let mut bare = rendered(all[..1].to_vec());
        bare.entry_bounds = Vec::new();
        assert!(Block::copy_parts(&[(&bare, 0..1), (&two, 0..599)]).is_none());
    }

    /// The entries of a block a page takes: the bytes of those entries, shared with the
    /// block, and the datetimes of the first and the last.
    #[test]
    fn entries_of_a_block_share_its_bytes() {
        let b = block(BLOCK + 1, BLOCK);
        for (i, j) in [(0, 999), (0, 0), (999, 999), (1, 998), (17, 639)] {
            let e = b.entries(BLOCK + 1 + i..=BLOCK + 1 + j).unwrap();
            assert_eq!((e.first, e.last), (BLOCK + 1 + i, BLOCK + 1 + j));
            assert_eq!(&e.bytes[..], b.entries.slice(i as usize..j as usize + 1));
            assert_eq!(
                (e.from, e.until),
                (b.datetimes[i as usize], b.datetimes[j as usize])
            );
        }
        let whole = b.entries(BLOCK + 1..=2 * BLOCK).unwrap();
        assert_eq!(whole.bytes.as_ptr(), b.entries.bytes.as_ptr(), "not copied");
        assert!(b.entries(BLOCK..=BLOCK + 1).is_none(), "before the block");
        assert!(b.entries(2 * BLOCK..=2 * BLOCK + 1).is_none(), "beyond it");
        let (from, to) = (BLOCK + 5, BLOCK + 4);
        assert!(b.entries(from..=to).is_none(), "empty");
    }

    /// What a block file gives back is what was written: the bytes and the datetimes (to the
    /// nanosecond) of the first and last of any range of entries; or the whole block, with
    /// the boundary and datetime of every entry.
    #[test]
    fn block_files_give_back_any_range_of_their_entries() {
        let files = PageFiles::temporary(FILES_BYTES).unwrap();
        let written = block(BLOCK + 1, BLOCK);
        files.write(&key(1), &written).unwrap();
        assert!(files.size(&key(1)).is_some());
        for range in [0..1000, 0..1, 999..1000, 1..999, 500..501, 17..640, 1..2] {
            let read = files.entries_waiting(&key(1), range.clone()).unwrap();
            assert_eq!(read.first, BLOCK + 1 + range.start as u64, "{range:?}");
            assert_eq!(read.last, BLOCK + range.end as u64, "{range:?}");
            assert_eq!(&read.bytes[..], written.entries.slice(range.clone()));
            assert_eq!(read.from, written.datetimes[range.start], "{range:?}");
            assert_eq!(read.until, written.datetimes[range.end - 1], "{range:?}");
        }
        let whole = files.read_waiting(&key(1)).unwrap();
        assert_eq!(whole.first, BLOCK + 1);
        assert_eq!(whole.entries.bytes, written.entries.bytes);
        assert_eq!(whole.entries.ends, written.entries.ends);
        assert_eq!(whole.datetimes, written.datetimes);
        assert!(
            files.entries_waiting(&key(1), 0..1001).is_none(),
            "no entry 1000"
        );
    }

    #[test]
    fn a_damaged_or_misplaced_block_is_a_miss_and_forgotten() {
        // A file per block: each block at the start of its own file.
        let files = PageFiles::temporary(FILES_BYTES).unwrap().with_segment(1);
        files.write(&key(0), &block(1, BLOCK)).unwrap();
        files.write(&key(1), &block(BLOCK + 1, BLOCK)).unwrap();
        let (zero, one) = (files.path(&key(0)).unwrap(), files.path(&key(1)).unwrap());
        // Block 0 in the place of block 1.
        std::fs::copy(&zero, &one).unwrap();
        assert!(files.entries_waiting(&key(1), 0..10).is_none());
        assert!(files.size(&key(1)).is_none(), "forgotten");
        assert!(
            !one.exists(),
            "removed with its segment, which holds nothing else"
        );
        // Cut short.
        let file = File::options().write(true).open(&zero).unwrap();
        file.set_len(FIXED + RECORD * BLOCK + 10).unwrap();
        assert!(files.entries_waiting(&key(0), 990..1000).is_none());
        assert!(files.size(&key(0)).is_none(), "forgotten");
        assert!(!zero.exists(), "removed");
        // An entry's end offset far beyond the block: refused before anything is allocated
        // for it, whole block or range.
        for whole in [true, false] {
            files.write(&key(2), &block(2 * BLOCK + 1, BLOCK)).unwrap();
            let file = File::options()
                .write(true)
                .open(files.path(&key(2)).unwrap())
                .unwrap();
            file.write_all_at(&(u64::MAX / 2).to_le_bytes(), FIXED + RECORD * (BLOCK - 1))
                .unwrap();
            let read = if whole {
                files.read_waiting(&key(2)).map(|_| ())
            } else {
                files.entries_waiting(&key(2), 990..1000).map(|_| ())
            };
            assert!(read.is_none(), "whole: {whole}");
            assert!(files.size(&key(2)).is_none(), "forgotten");
        }
    }

    /// Overwrites the magic number of the block of `key` in its segment file; the file's path.
    fn damage_magic(files: &PageFiles, key: &Key) -> PathBuf {
        let path = files.path(key).unwrap();
        let offset = lock(&files.index).blocks[key].offset;
        let file = File::options().write(true).open(&path).unwrap();
        file.write_all_at(b"NOTPAGES", offset).unwrap();
        path
    }

    /// A damaged block in a segment file is forgotten alone: the others of the file are still
    /// read, and the block is written again at the file's end.
    #[test]
    fn a_damaged_block_leaves_the_rest_of_its_segment() {
        let files = PageFiles::temporary(FILES_BYTES).unwrap();
        for n in 0..3 {
            files.write(&key(n), &block(n * BLOCK + 1, BLOCK)).unwrap();
        }
        let offset = lock(&files.index).blocks[&key(1)].offset;
        let path = damage_magic(&files, &key(1));
        assert!(files.entries_waiting(&key(1), 0..1).is_none());
        assert!(files.size(&key(1)).is_none(), "forgotten");
        assert!(path.exists(), "the file holds other blocks");
        for n in [0, 2] {
            let read = files.read_waiting(&key(n)).unwrap();
            assert_eq!(
                read.entries.bytes,
                block(n * BLOCK + 1, BLOCK).entries.bytes
            );
        }
        files.write(&key(1), &block(BLOCK + 1, BLOCK)).unwrap();
        assert!(
            lock(&files.index).blocks[&key(1)].offset > offset,
            "at the end"
        );
        let read = files.read_waiting(&key(1)).unwrap();
        assert_eq!(read.entries.bytes, block(BLOCK + 1, BLOCK).entries.bytes);
    }

    #[test]
    fn block_files_are_bounded_the_least_recently_used_removed() {
        let size = block_size_on_disk();
        let files = PageFiles::temporary(size * 2 + size / 2)
            .unwrap()
            .with_segment(1);
        files.write(&key(0), &block(1, BLOCK)).unwrap();
        files.write(&key(1), &block(BLOCK + 1, BLOCK)).unwrap();
        let one = files.path(&key(1)).unwrap();
        assert!(
            files.size(&key(0)).is_some(),
            "0 is now the most recently used"
        );
        files.write(&key(2), &block(2 * BLOCK + 1, BLOCK)).unwrap();
        assert!(files.size(&key(1)).is_none(), "1 went");
        assert!(!one.exists(), "and its file");
        for kept in [0, 2] {
            assert!(files.entries_waiting(&key(kept), 0..1).is_some());
        }
        let kept = files.size(&key(0)).unwrap() + files.size(&key(2)).unwrap();
        assert_eq!(lock(&files.index).segments.bytes, kept);
        files.forget("c");
        assert_eq!(lock(&files.index).segments.bytes, 0);
        assert!(lock(&files.index).blocks.is_empty());
        assert!(
            !files.dir().join("c").exists(),
            "the channel's folder moved aside"
        );
    }

    /// A read that must not wait is answered from the segment file kept open and the page
    /// cache, the same bytes as a read that may wait; before the file is open it says it would
    /// have to wait, and the block stays placed.
    #[test]
    fn a_block_read_before_is_read_again_without_waiting() {
        let files = PageFiles::temporary(FILES_BYTES).unwrap();
        let written = block(BLOCK + 1, BLOCK);
        files.write(&key(1), &written).unwrap();
        assert!(matches!(
            files.read_entries(&key(1), 0..10, Wait::Never),
            Err(WouldWait)
        ));
        assert!(files.size(&key(1)).is_some(), "still placed");
        assert!(files.entries_waiting(&key(1), 0..10).is_some());
        for range in [0..1000, 0..1, 999..1000, 17..640] {
            let Ok(Some(read)) = files.read_entries(&key(1), range.clone(), Wait::Never) else {
                panic!("{range:?} not read from the open file and the page cache");
            };
            assert_eq!(read.first, BLOCK + 1 + range.start as u64);
            assert_eq!(&read.bytes[..], written.entries.slice(range.clone()));
            assert_eq!(read.from, written.datetimes[range.start]);
            assert_eq!(read.until, written.datetimes[range.end - 1]);
        }
        let Ok(Some(whole)) = files.read(&key(1), Wait::Never) else {
            panic!("the whole block not read without waiting");
        };
        assert_eq!(whole.entries.bytes, written.entries.bytes);
        assert_eq!(whole.datetimes, written.datetimes);
        // A block written later into the same segment is read through the same open file.
        let later = block(2 * BLOCK + 1, BLOCK);
        files.write(&key(2), &later).unwrap();
        let Ok(Some(read)) = files.read_entries(&key(2), 0..1000, Wait::Never) else {
            panic!("a later block of the open segment not read without waiting");
        };
        assert_eq!(&read.bytes[..], later.entries.slice(0..1000));
        // Damage found by a read that must not wait forgets the block, as any other read.
        damage_magic(&files, &key(1));
        assert!(matches!(
            files.read_entries(&key(1), 0..1, Wait::Never),
            Ok(None)
        ));
        assert!(files.size(&key(1)).is_none(), "forgotten");
    }

    /// A segment dropped by the bound takes its open file with it: the same blocks written
    /// again go to a new file, and reads give the new file's bytes, never the old one's.
    #[test]
    fn a_segment_written_again_is_read_from_its_new_file() {
        let size = block_size_on_disk();
        let files = PageFiles::temporary(size + size / 2)
            .unwrap()
            .with_segment(1);
        files.write(&key(0), &block(1, BLOCK)).unwrap();
        assert!(files.entries_waiting(&key(0), 0..1).is_some());
        let old = files.path(&key(0)).unwrap();
        files.write(&key(1), &block(BLOCK + 1, BLOCK)).unwrap();
        assert!(files.size(&key(0)).is_none(), "dropped by the bound");
        assert!(!old.exists());
        // Block 0 again, with other datetimes (other bytes in the header).
        let mut changes = changes(1, BLOCK);
        for change in &mut changes {
            change.datetime += time::Duration::seconds(1);
        }
        let again = Block::render(&changes).unwrap();
        files.write(&key(0), &again).unwrap();
        assert_ne!(files.path(&key(0)).unwrap(), old);
        for wait in [Wait::Allowed, Wait::Never] {
            let Ok(Some(read)) = files.read_entries(&key(0), 0..1, wait) else {
                panic!("block 0 not read ({wait:?})");
            };
            assert_eq!(read.from, again.datetimes[0], "{wait:?}");
        }
    }

    /// Blocks share a segment file per `segment` consecutive block numbers, whatever the order
    /// they are written in, and even when written at once; the bound drops the segment used
    /// least recently, with all its blocks and its file.
    #[test]
    fn blocks_share_segment_files_and_leave_with_them() {
        let size = block_size_on_disk();
        let files = PageFiles::temporary(size * 8 + size / 2)
            .unwrap()
            .with_segment(4);
        std::thread::scope(|scope| {
            for n in [5, 0, 3, 1, 2, 4, 6, 7] {
                let files = &files;
                scope.spawn(move || files.write(&key(n), &block(n * BLOCK + 1, BLOCK)).unwrap());
            }
        });
        let folder = files.dir().join("c/e");
        assert_eq!(
            std::fs::read_dir(&folder).unwrap().count(),
            2,
            "two segments"
        );
        // (Sizes counted before the reads below decide which segment is used last.)
        let bytes = |blocks: &[u64]| blocks.iter().map(|n| files.size(&key(*n)).unwrap()).sum();
        let all: u64 = bytes(&[0, 1, 2, 3, 4, 5, 6, 7]);
        for n in [4, 5, 6, 7, 0, 1, 2, 3] {
            let read = files.read_waiting(&key(n)).unwrap();
            assert_eq!(read.first, n * BLOCK + 1);
            assert_eq!(
                read.entries.bytes,
                block(n * BLOCK + 1, BLOCK).entries.bytes
            );
        }
        // Written again: nothing changes.
        files.write(&key(3), &block(3 * BLOCK + 1, BLOCK)).unwrap();
        assert_eq!(lock(&files.index).segments.bytes, all);
        // Segment 0 was used last: segment 1 goes for block 8's.
        let one = files.path(&key(4)).unwrap();
        files.write(&key(8), &block(8 * BLOCK + 1, BLOCK)).unwrap();
        for n in 4..8 {
            assert!(files.size(&key(n)).is_none(), "block {n} went");
        }
        assert!(!one.exists(), "with its file");
        for n in [0, 1, 2, 3, 8] {
            assert!(
                files.entries_waiting(&key(n), 0..1).is_some(),
                "block {n} kept"
            );
        }
        assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 2);
        let kept: u64 = bytes(&[0, 1, 2, 3, 8]);
        assert_eq!(lock(&files.index).segments.bytes, kept);
        assert!(kept < all);
    }

    /// A block written into a segment dropped while it was written is not kept, and does not
    /// leave the segment's file behind.
    #[test]
    fn a_segment_dropped_while_written_leaves_no_file() {
        let size = block_size_on_disk();
        let files = PageFiles::temporary(size + size / 2)
            .unwrap()
            .with_segment(1);
        let place = files.reserve(&key(0), size).unwrap();
        let path = files.path(&key(0)).unwrap();
        // Block 1 takes the room: segment 0 is dropped before its block is written.
        files.write(&key(1), &block(BLOCK + 1, BLOCK)).unwrap();
        assert!(files.path(&key(0)).is_none());
        files.fill(&key(0), place, &[b"the block"]).unwrap();
        assert!(files.size(&key(0)).is_none(), "not kept");
        assert!(!path.exists(), "no file left");
        assert!(files.read_waiting(&key(1)).is_some());
    }

    #[test]
    fn a_temporary_folder_is_removed_when_the_cache_closes() {
        let cache = PageCache::with_files(0, PageFiles::temporary(FILES_BYTES).unwrap());
        let files = cache.files.clone().unwrap();
        files.write(&key(0), &block(1, BLOCK)).unwrap();
        assert!(files.dir().is_dir());
        cache.close();
        assert!(!files.dir().exists());
        assert!(files.size(&key(0)).is_none());
    }

    /// Whether the block of `key` was checked against its checksum (or written here).
    fn verified(files: &PageFiles, key: &Key) -> bool {
        lock(&files.index).blocks[key].verified
    }

    /// What is left in the folder of block files that is no segment file of a channel and
    /// epoch is removed when it is opened; a file of another format has no blocks.
    #[test]
    fn what_is_no_segment_file_is_removed_when_the_folder_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let pages = dir.path().join("pages");
        std::fs::create_dir_all(pages.join("c/e")).unwrap();
        std::fs::create_dir_all(pages.join(".forgotten-00ff/e")).unwrap();
        std::fs::write(pages.join("c/e/0-1"), b"CHPAGES1 left from before").unwrap();
        std::fs::write(pages.join("c/e/notes"), b"no segment").unwrap();
        std::fs::write(pages.join("c/stray"), b"no epoch").unwrap();
        std::fs::write(pages.join("stray"), b"no channel").unwrap();
        let files = PageFiles::open(&pages, FILES_BYTES).unwrap();
        let left: Vec<_> = walkdir(&pages);
        assert_eq!(left, ["c", "c/e"], "only the folders are left");
        assert!(files.size(&key(0)).is_none());
    }

    /// The paths under `dir`, relative, sorted.
    fn walkdir(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                out.push(path.strip_prefix(dir).unwrap().display().to_string());
                if path.is_dir() {
                    todo.push(path);
                }
            }
        }
        out.sort();
        out
    }

    /// The blocks an earlier process wrote are found again when the folder is opened: the
    /// same entries, checked against their checksums on their first read (which may wait),
    /// in segments of the same generations; a new segment gets a newer generation.
    #[test]
    fn blocks_left_in_the_folder_are_found_again_when_it_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let pages = dir.path().join("pages");
        let written: Vec<_> = (0..3).map(|b| block(b * BLOCK + 1, BLOCK)).collect();
        let paths = {
            let files = PageFiles::open_in(&pages, FILES_BYTES, 2).unwrap();
            for (b, block) in written.iter().enumerate() {
                files.write(&key(b as u64), block).unwrap();
            }
            (0..3)
                .map(|b| files.path(&key(b)).unwrap())
                .collect::<Vec<_>>()
        };
        let files = PageFiles::open_in(&pages, FILES_BYTES, 2).unwrap();
        for (b, block) in written.iter().enumerate() {
            let key = key(b as u64);
            assert_eq!(files.path(&key).as_ref(), Some(&paths[b]), "block {b}");
            assert!(!verified(&files, &key), "block {b}: not checked yet");
            let place = files.place(&key).unwrap().0;
            assert!(
                matches!(files.read_entries(&key, 0..10, Wait::Never), Err(WouldWait)),
                "block {b}: the first read must be allowed to wait"
            );
            assert_eq!(files.place(&key).unwrap().0.offset, place.offset);
            let read = files.entries_waiting(&key, 3..700).unwrap();
            assert_eq!(&read.bytes[..], block.entries.slice(3..700), "block {b}");
            assert_eq!(read.from, block.datetimes[3]);
            assert!(verified(&files, &key), "block {b}: checked");
            let whole = files.read_waiting(&key).unwrap();
            assert_eq!(whole.entries.bytes, block.entries.bytes);
            assert_eq!(whole.datetimes, block.datetimes);
        }
        // Block 3 shares block 2's segment (generation kept), block 4 starts a new one.
        files.write(&key(3), &block(3 * BLOCK + 1, BLOCK)).unwrap();
        files.write(&key(4), &block(4 * BLOCK + 1, BLOCK)).unwrap();
        assert_eq!(files.path(&key(3)), files.path(&key(2)));
        let generation = |k: u64| lock(&files.index).blocks[&key(k)].generation;
        assert!(generation(4) > generation(0).max(generation(2)));
        assert!(files.read_waiting(&key(3)).is_some());
        assert!(files.read_waiting(&key(2)).is_some(), "not written over");
    }

    /// A block changed in its file after it was written (a crash while it was written, the
    /// disk) is found again, but its first read sees the checksum differ: a miss, and the
    /// block is forgotten, and marked so in its file. A segment file cut short keeps the whole blocks before the cut,
    /// and the next block is written over what is left of the cut one.
    #[test]
    fn a_block_changed_or_cut_short_in_its_file_is_not_served_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let pages = dir.path().join("pages");
        let (path, second) = {
            let files = PageFiles::open(&pages, FILES_BYTES).unwrap();
            for b in 0..3 {
                files.write(&key(b), &block(b * BLOCK + 1, BLOCK)).unwrap();
            }
            let place = |b| lock(&files.index).blocks[&key(b)];
            (files.path(&key(0)).unwrap(), (place(1), place(2)))
        };
        let (one, two) = second;
        let file = File::options().write(true).open(&path).unwrap();
        // One byte of block 0's entries, and block 2 cut in its entries.
        file.write_all_at(b"#", FIXED + RECORD * BLOCK + 40)
            .unwrap();
        file.set_len(two.offset + two.size - 5).unwrap();
        drop(file);
        let files = PageFiles::open(&pages, FILES_BYTES).unwrap();
        assert!(files.size(&key(0)).is_some(), "its header is whole");
        assert!(files.entries_waiting(&key(0), 900..901).is_none());
        assert!(files.size(&key(0)).is_none(), "forgotten");
        assert!(files.size(&key(2)).is_none(), "cut short: not found");
        let read = files.entries_waiting(&key(1), 0..1000).unwrap();
        assert_eq!(read.bytes.len() as u64 + FIXED + RECORD * BLOCK, one.size);
        files.write(&key(2), &block(2 * BLOCK + 1, BLOCK)).unwrap();
        assert_eq!(lock(&files.index).blocks[&key(2)].offset, two.offset);
        assert!(files.read_waiting(&key(2)).is_some());
        assert!(files.read_waiting(&key(1)).is_some());
        // The forgotten block 0 is marked so in its file: the next process skips it and
        // finds the blocks after it.
        drop(files);
        let files = PageFiles::open(&pages, FILES_BYTES).unwrap();
        assert!(files.size(&key(0)).is_none(), "marked forgotten");
        assert!(files.entries_waiting(&key(1), 0..1000).is_some());
        assert!(files.entries_waiting(&key(2), 0..1000).is_some());
    }

    /// Of the blocks found when the folder is opened, only those of the logs named, with
    /// all of their seqs at or before the log's newest, are kept; the folders of the others
    /// are removed.
    #[test]
    fn only_the_blocks_of_the_logs_as_they_are_now_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let pages = dir.path().join("pages");
        {
            let files = PageFiles::open_in(&pages, FILES_BYTES, 2).unwrap();
            for (channel, epoch) in [("c", "e"), ("c", "old"), ("gone", "e")] {
                for b in 0..4 {
                    let key = Key::new(channel, epoch, b);
                    files.write(&key, &block(b * BLOCK + 1, BLOCK)).unwrap();
                }
            }
        }
        let files = PageFiles::open_in(&pages, FILES_BYTES, 2).unwrap();
        assert!(files.size(&Key::new("gone", "e", 3)).is_some());
        let third = files.path(&key(2)).unwrap();
        files.retain(|channel, epoch| (channel == "c" && epoch == "e").then_some(2 * BLOCK + 999));
        assert!(files.size(&key(0)).is_some());
        assert!(files.size(&key(1)).is_some());
        assert!(files.size(&key(2)).is_none(), "seqs beyond the newest");
        assert!(files.size(&key(3)).is_none());
        assert!(!third.exists(), "a segment left with no blocks is removed");
        assert!(files.size(&Key::new("c", "old", 0)).is_none());
        assert!(files.size(&Key::new("gone", "e", 0)).is_none());
        assert_eq!(walkdir(&pages), ["c", "c/e", "c/e/0-1", "gone"]);
        assert!(files.read_waiting(&key(1)).is_some());
    }

    /// Waits (bounded) until `files` has the file of `key`.
    async fn written(files: &PageFiles, key: &Key) -> bool {
        for _ in 0..500 {
            if files.size(key).is_some() {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_block_is_written_when_a_notification_completes_it() {
        let cache = PageCache::with_files(0, PageFiles::temporary(FILES_BYTES).unwrap());
        let files = cache.files.clone().unwrap();
        // Rendered as the batcher renders them: blocks are copied from their bodies.
        let notification =
            |first: u64, last: u64| Arc::new(rendered(changes(first, last - first + 1)));
        // 1..=1500 in three notifications: block 0 is complete with the second.
        let recent = [
            notification(1, 600),
            notification(601, 1200),
            notification(1201, 1500),
        ];
        cache.published("e", &recent[..1], &recent[0]);
        cache.published("e", &recent[..2], &recent[1]);
        assert!(written(&files, &key(0)).await);
        let read = files.read_waiting(&key(0)).unwrap();
        assert_eq!(read.entries.bytes, block(1, BLOCK).entries.bytes);
        // Block 1 completes with a notification whose first part is no longer in `recent`:
        // left to its first miss.
        let fourth = notification(1501, 2100);
        cache.published("e", &[recent[2].clone(), fourth.clone()], &fourth);
        let fifth = notification(2101, 3000);
        cache.published("e", &[fourth.clone(), fifth.clone()], &fifth);
        assert!(written(&files, &key(2)).await, "block 2: two notifications");
        assert!(files.size(&key(1)).is_none());

        // A miss in memory (which keeps nothing here) reads what the page needs from the file.
        let page = cache.read("c", "e", 2, 2501..2601).await.unwrap();
        assert_eq!((page.first, page.last), (2501, 2600));
        assert_eq!(&page.bytes[..], block(2001, BLOCK).entries.slice(500..600));
        assert!(cache.get("c", "e", 2).is_none());
        assert!(
            cache.read("c", "e", 1, 1001..1002).await.is_none(),
            "no file"
        );
        assert!(cache.read("c", "other", 2, 2001..2002).await.is_none());
    }

    #[tokio::test]
    async fn a_block_read_from_its_file_is_kept_in_memory_while_there_is_room() {
        let cache = PageCache::with_files(CACHE_BYTES, PageFiles::temporary(FILES_BYTES).unwrap());
        let files = cache.files.clone().unwrap();
        files.write(&key(0), &block(1, BLOCK)).unwrap();
        let found = cache.read("c", "e", 0, 5..7).await.unwrap();
        assert_eq!((found.first, found.last), (5, 6));
        let kept = cache.get("c", "e", 0).unwrap();
        assert_eq!((kept.first, kept.last()), (1, BLOCK), "the whole block");
        assert_eq!(&found.bytes[..], kept.entries.slice(4..6));
    }
}
