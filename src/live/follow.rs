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

use crate::batcher::{ChannelFeed, Span};
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
    /// The cursor cannot be continued (`reason`); replay continues from `oldest`. `last` is
    /// the log's newest seq.
    Reset {
        oldest: u64,
        last: u64,
        reason: ResetReason,
    },
}

/// Why a cursor could not be continued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// It is older than retention: the changes after it are gone.
    Retention,
    /// It is beyond the newest seq: not a seq of this log (the log was started again, or the
    /// cursor is of another channel or hub).
    Ahead,
    /// It is of another epoch of the log.
    Epoch,
}

impl ResetReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ResetReason::Retention => "retention",
            ResetReason::Ahead => "ahead",
            ResetReason::Epoch => "epoch",
        }
    }
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
    live: broadcast::Receiver<Span>,
    /// The last seq handed out.
    cursor: u64,
    replaying: bool,
    /// The epoch the client's cursor belongs to (checked once, then the log's epoch).
    epoch: Option<String>,
    /// Whether the cursor was checked against the log (its epoch, its newest seq).
    checked: bool,
    /// The cursor the client gave (`None`: live only).
    since: Option<u64>,
}

impl Follower {
    /// Follows `feed` from `since` (the last seq the client has; `None`: live only, which
    /// starts with an immediate `CaughtUp`). `epoch`: the epoch that cursor belongs to, when
    /// the client knows it; a cursor of another epoch, or beyond the newest seq, is reset.
    pub fn new(
        feed: Arc<ChannelFeed>,
        store: Arc<dyn Store>,
        since: Option<u64>,
        epoch: Option<String>,
    ) -> Follower {
        let live = feed.live();
        let cursor = since.unwrap_or_else(|| feed.published_seq());
        Follower {
            feed,
            store,
            live,
            cursor,
            replaying: true,
            epoch,
            checked: false,
            since,
        }
    }

    /// The epoch of the log being followed, once the first event was taken.
    pub fn epoch(&self) -> Option<&str> {
        self.epoch.as_deref().filter(|_| self.checked)
    }

    /// The first step: a cursor that is not of this log (another epoch, or beyond its newest
    /// seq) is reset to the beginning of what is retained.
    async fn check(&mut self) -> Result<Option<Event>, StoreError> {
        let origin = self.feed.origin(self.store.as_ref()).await?;
        let given = self.epoch.replace(origin.epoch.clone());
        self.checked = true;
        let reason = if given.is_some_and(|e| e != origin.epoch) {
            ResetReason::Epoch
        } else {
            let head = self.store.head(&self.feed.name).await?;
            match self.since {
                Some(since) if since > head.last => ResetReason::Ahead,
                _ => return Ok(None),
            }
        };
        let head = self.store.head(&self.feed.name).await?;
        self.cursor = head.oldest - 1;
        self.replaying = true;
        Ok(Some(Event::Reset {
            oldest: head.oldest,
            last: head.last,
            reason,
        }))
    }

    /// The last seq handed out.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// The next event; `Ok(None)` when the channel's feed is gone (shutdown).
    pub async fn next(&mut self) -> Result<Option<Event>, StoreError> {
        if !self.checked {
            // Boxed: it runs once, and its state would otherwise take room in the future of
            // every follower for as long as it follows.
            if let Some(reset) = Box::pin(self.check()).await? {
                return Ok(Some(reset));
            }
        }
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
                        last: head.last,
                        reason: ResetReason::Retention,
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
                Ok(s) if s.last <= self.cursor => continue,
                Ok(s) if s.first > self.cursor + 1 => {
                    // Something between the cursor and this notification was not seen live.
                    self.replaying = true;
                }
                Ok(s) => match self.feed.cached(s.first) {
                    Some(n) => {
                        let skip = (self.cursor + 1 - n.first) as usize;
                        self.cursor = n.last;
                        return Ok(Some(Event::Live(n, skip)));
                    }
                    // No longer among the feed's recent ones (far behind): from the log.
                    None => self.replaying = true,
                },
                Err(broadcast::error::RecvError::Lagged(_)) => self.replaying = true,
                Err(broadcast::error::RecvError::Closed) => return Ok(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batcher::{render_notification, RecentBudget};
    use crate::config::Config;
    use crate::model::{ChangeType, NewChange};
    use crate::store::embedded::EmbeddedStore;

    fn seqs(changes: &[Change]) -> Vec<u64> {
        changes.iter().map(|c| c.seq).collect()
    }

    /// Appends 10 changes to channel `c` and publishes them on `feed`, as the batcher does.
    async fn publish(store: &dyn Store, feed: &ChannelFeed, config: &Config, epoch: &str) {
        let new = (0..10)
            .map(|i| NewChange::new(format!("http://example.com/{i}"), ChangeType::Updated))
            .collect();
        let now = time::OffsetDateTime::now_utc();
        let appended = store.append("c", new, None, now).await.unwrap();
        let changes = store.read("c", appended.first - 1, 10).await.unwrap();
        feed.announce(render_notification(config, "c", epoch, changes));
    }

    /// The broadcast tells a follower only which seqs were published; a notification the
    /// feed no longer keeps is read from the log, and nothing is sent twice.
    #[tokio::test]
    async fn a_live_notification_the_feed_no_longer_keeps_is_read_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
        let config = Config::new(([127, 0, 0, 1], 0).into(), dir.path().into());
        // Room for one notification: publishing one drops the one before.
        let feed = Arc::new(ChannelFeed::with_budget("c", RecentBudget::new(1)));
        let epoch = feed.origin(store.as_ref()).await.unwrap().epoch.clone();
        let mut follower = Follower::new(feed.clone(), store.clone(), None, None);
        assert!(matches!(
            follower.next().await,
            Ok(Some(Event::CaughtUp(0)))
        ));

        publish(store.as_ref(), &feed, &config, &epoch).await;
        publish(store.as_ref(), &feed, &config, &epoch).await;
        assert!(feed.cached(1).is_none() && feed.cached(11).is_some());
        // 1..=10 left the feed when 11..=20 came: both from the log.
        match follower.next().await {
            Ok(Some(Event::Replay(changes))) => {
                assert_eq!(seqs(&changes), (1..=20).collect::<Vec<_>>())
            }
            other => panic!("expected a replay of 1..=20, got {other:?}"),
        }
        assert!(matches!(
            follower.next().await,
            Ok(Some(Event::CaughtUp(20)))
        ));

        // A notification the feed still keeps comes live, once.
        publish(store.as_ref(), &feed, &config, &epoch).await;
        match follower.next().await {
            Ok(Some(event @ Event::Live(..))) => {
                assert_eq!(seqs(event.changes()), (21..=30).collect::<Vec<_>>())
            }
            other => panic!("expected 21..=30 live, got {other:?}"),
        }
    }
}
