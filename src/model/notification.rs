//! A notification: a batch of consecutive changes of one channel, rendered once as the Change
//! List document every subscriber receives.

use bytes::Bytes;

use super::Change;

/// A batch of consecutive changes of one channel (seqs `first..=last`), rendered once.
#[derive(Debug)]
pub struct Notification {
    pub channel: String,
    pub first: u64,
    pub last: u64,
    pub changes: Vec<Change>,
    /// The Change List document, as delivered to every subscriber.
    pub body: Bytes,
    /// Where the `<url>` entry of each change is in `body`: that of `changes[i]` is
    /// `body[entry_bounds[i]..entry_bounds[i + 1]]` (as `changes?after=` pages render it).
    /// Empty when the body is no Change List (a Change Dump document), or too large.
    pub entry_bounds: Vec<u32>,
    /// When the hub first saw the first of these changes durable (about when its source got
    /// the 202); `None` for a notification rendered again from the log.
    pub accepted_at: Option<std::time::Instant>,
}

impl Notification {
    /// About how much memory it holds: its body and its changes (what a cache of
    /// notifications counts against its bound).
    pub fn memory(&self) -> usize {
        self.body.len()
            + self.entry_bounds.capacity() * std::mem::size_of::<u32>()
            + self.changes.capacity() * std::mem::size_of::<Change>()
            + self.changes.iter().map(Change::heap_size).sum::<usize>()
    }
}
