//! Following a channel from a cursor: replay from the log, then live, without a gap or a
//! duplicate. Shared by the websocket and server-sent events.
//!
//! The follower subscribes to the channel's live broadcast *first*, then replays the log up to
//! the published seq (the feed updates that seq before it broadcasts), then forwards live notifications, skipping every change whose seq it has
//! already sent. A notification published while the replay runs is therefore both in the log
//! and in the broadcast, and is sent once. A follower that falls behind the broadcast (it
//! lagged) goes back to replaying from the log at its cursor.

use std::sync::Arc;
use tokio::sync::broadcast;

use crate::batcher::ChannelFeed;
use crate::model::Change;
use crate::model::Notification;
use crate::store::{Store, StoreError};

/// Most changes read from the log for one replay step.
const REPLAY_PAGE: usize = 1000;

/// What a follower yields.
#[derive(Debug)]
pub enum Event {
    /// Changes read back from the log (consecutive seqs).
    Replay(Vec<Change>),
    /// A live notification; the first `skip` changes were already sent.
    Live(Arc<Notification>, usize),
    /// The replay reached the published seq: from now on, live.
    CaughtUp(u64),
    /// The cursor was older than retention; replay continues from `oldest`.
    Reset { oldest: u64 },
}

impl Event {
    /// The changes this event carries, in seq order.
    pub fn changes(&self) -> &[Change] {
        match self {
            Event::Replay(c) => c,
            Event::Live(n, skip) => &n.changes[(*skip).min(n.changes.len())..],
            _ => &[],
        }
    }
}

pub struct Follower {
    feed: Arc<ChannelFeed>,
    store: Arc<dyn Store>,
    live: broadcast::Receiver<Arc<Notification>>,
    /// The last seq handed out.
    cursor: u64,
    replaying: bool,
}

impl Follower {
    /// Follows `feed` from `since` (the last seq the client has; `None`: live only, which
    /// starts with an immediate `CaughtUp`).
    pub fn new(feed: Arc<ChannelFeed>, store: Arc<dyn Store>, since: Option<u64>) -> Follower {
        let live = feed.live();
        let cursor = since.unwrap_or_else(|| feed.published_seq());
        Follower {
            feed,
            store,
            live,
            cursor,
            replaying: true,
        }
    }

    /// The last seq handed out.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// The next event; `Ok(None)` when the channel's feed is gone (shutdown).
    pub async fn next(&mut self) -> Result<Option<Event>, StoreError> {
        loop {
            if self.replaying {
                let published = self.feed.published_seq();
                if self.cursor >= published {
                    self.replaying = false;
                    return Ok(Some(Event::CaughtUp(self.cursor)));
                }
                let head = self.store.head(&self.feed.name).await?;
                if self.cursor + 1 < head.oldest {
                    self.cursor = head.oldest - 1;
                    return Ok(Some(Event::Reset {
                        oldest: head.oldest,
                    }));
                }
                let want = ((published - self.cursor) as usize).min(REPLAY_PAGE);
                let changes = self.store.read(&self.feed.name, self.cursor, want).await?;
                match changes.last() {
                    Some(last) => {
                        self.cursor = last.seq;
                        return Ok(Some(Event::Replay(changes)));
                    }
                    // Trimmed between head() and read(): the next head() shows the reset.
                    None => continue,
                }
            }
            match self.live.recv().await {
                Ok(n) if n.last <= self.cursor => continue,
                Ok(n) if n.first > self.cursor + 1 => {
                    // Something between the cursor and this notification was not seen live.
                    self.replaying = true;
                }
                Ok(n) => {
                    let skip = (self.cursor + 1 - n.first) as usize;
                    self.cursor = n.last;
                    return Ok(Some(Event::Live(n, skip)));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => self.replaying = true,
                Err(broadcast::error::RecvError::Closed) => return Ok(None),
            }
        }
    }
}
