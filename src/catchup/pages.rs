//! The `<url>` entries of `changes?after=` pages, kept rendered in blocks of [`BLOCK`] seqs.
//!
//! A log entry never changes once written (retention only drops whole entries from the old
//! end), so the rendering of seqs `k·BLOCK+1 ..= (k+1)·BLOCK` of a channel and epoch is
//! the same for every page that covers them, whatever its `after` and `limit`. A page is its
//! header (rendered per request: its `from`, `until`, seq range and `next` link depend on it)
//! and slices of blocks. Only complete blocks are kept: all of their seqs written and still
//! retained. Bounded by [`CACHE_BYTES`]; the block used least recently goes first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use time::OffsetDateTime;

use crate::model::Change;
use crate::resourcesync::{self, RenderedEntries};

/// Seqs per block.
pub const BLOCK: u64 = 1_000;
/// Most bytes of rendered entries kept, all channels together.
pub const CACHE_BYTES: usize = 64 << 20;

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
        let first = changes.first()?.seq;
        let consecutive = changes
            .iter()
            .enumerate()
            .all(|(i, c)| c.seq == first + i as u64);
        consecutive.then(|| Block {
            first,
            entries: resourcesync::write_change_entries(changes),
            datetimes: changes.iter().map(|c| c.datetime).collect(),
        })
    }

    /// The seq of the last entry.
    pub fn last(&self) -> u64 {
        self.first + self.datetimes.len() as u64 - 1
    }

    fn bytes(&self) -> usize {
        self.entries.bytes.len() + self.entries.ends.len() * 8 + self.datetimes.len() * 16
    }
}

#[derive(Hash, PartialEq, Eq, Clone)]
struct Key {
    channel: String,
    epoch: String,
    block: u64,
}

/// The blocks kept (see the module docs).
pub struct PageCache {
    inner: Mutex<Inner>,
    /// Most bytes kept.
    bound: usize,
}

impl Default for PageCache {
    fn default() -> PageCache {
        PageCache::with_bound(CACHE_BYTES)
    }
}

#[derive(Default)]
struct Inner {
    /// Key → (block, when last used: a counter).
    blocks: HashMap<Key, (Arc<Block>, u64)>,
    clock: u64,
    bytes: usize,
}

impl PageCache {
    /// A cache keeping at most `bound` bytes.
    pub fn with_bound(bound: usize) -> PageCache {
        PageCache {
            inner: Mutex::default(),
            bound,
        }
    }

    /// Block number `block` of `channel` in `epoch`, if kept.
    pub fn get(&self, channel: &str, epoch: &str, block: u64) -> Option<Arc<Block>> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        let key = Key {
            channel: channel.to_string(),
            epoch: epoch.to_string(),
            block,
        };
        let (found, used) = inner.blocks.get_mut(&key)?;
        *used = now;
        Some(found.clone())
    }

    /// Keeps a complete block (`BLOCK` entries from seq `block·BLOCK + 1`); anything else is
    /// not kept.
    pub fn keep(&self, channel: &str, epoch: &str, block: u64, found: Arc<Block>) {
        if found.first != block * BLOCK + 1 || found.datetimes.len() as u64 != BLOCK {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        let key = Key {
            channel: channel.to_string(),
            epoch: epoch.to_string(),
            block,
        };
        let size = found.bytes();
        if let Some((old, _)) = inner.blocks.insert(key, (found, now)) {
            inner.bytes -= old.bytes();
        }
        inner.bytes += size;
        while inner.bytes > self.bound {
            let Some(oldest) = inner
                .blocks
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((gone, _)) = inner.blocks.remove(&oldest) {
                inner.bytes -= gone.bytes();
            }
        }
    }

    /// Forgets a channel's blocks (it was deleted).
    pub fn forget(&self, channel: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner { blocks, bytes, .. } = &mut *inner;
        blocks.retain(|k, (b, _)| {
            let keep = k.channel != channel;
            if !keep {
                *bytes -= b.bytes();
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ChangeType, NewChange};

    fn changes(first: u64, n: u64) -> Vec<Change> {
        (first..first + n)
            .map(|seq| {
                let new = NewChange::new(format!("http://example.com/{seq}"), ChangeType::Updated);
                Change::from_new(seq, new, OffsetDateTime::UNIX_EPOCH)
            })
            .collect()
    }

    fn block(first: u64, n: u64) -> Arc<Block> {
        Arc::new(Block::render(&changes(first, n)).unwrap())
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
        assert_eq!(cache.inner.lock().unwrap().bytes, 0);
    }

    #[test]
    fn gaps_are_not_rendered_and_the_bound_drops_the_least_recently_used() {
        let mut gap = changes(1, 3);
        gap[2].seq = 5;
        assert!(Block::render(&gap).is_none());
        assert!(Block::render(&[]).is_none());

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
        assert!(cache.inner.lock().unwrap().bytes <= size * 2 + size / 2);
    }
}
