//! The batcher: turns a channel's durable log into notifications.
//!
//! One task per channel watches the store's durable head. Changes past the last published seq
//! are pending; the batcher cuts them into a [`Notification`] as soon as `max_batch` are pending,
//! or `linger` after the first of them arrived, whichever comes first — and on shutdown, before
//! the store closes. Cutting reads the changes back from the log (log before notify: nothing is
//! ever announced that cannot be replayed; when several full batches are pending, one read
//! takes as many as fit in `READ_AHEAD` changes), renders the Change List once, and publishes it on
//! the channel's [`ChannelFeed`]: the `published` seq that delivery workers follow, a short cache
//! of recent notifications whose bytes they share, and a broadcast of each notification's seqs
//! for live listeners (who take the notification from that cache: a listener that falls
//! behind holds no notification; see [`ChannelFeed::live`]). The feed
//! also counts, per 10-second step of the last 10 minutes, the changes it published and the
//! notifications its workers delivered: the dashboard's rates.

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::catchup::pages::PageCache;
use crate::config::Config;
use crate::model::{Change, Notification};
use crate::resourcesync::{self, ChangeListHeader};
use crate::store::{Origin, Store, StoreError};
use crate::telemetry::{ChannelCounters, RateWindow};

/// Most recent notifications a feed keeps for delivery workers to share. Their memory (bodies
/// and changes) counts toward one bound shared by every feed, [`RecentBudget`], an eighth of
/// `--cache-size`; the newest notification of a feed is always kept. Small notifications (a low
/// `--max-batch`, or a quiet channel lingering) then still cover a useful stretch of the log: a
/// worker that fell behind the window reads and renders each notification from the log
/// (shared with the others behind, see [`ChannelFeed::lagging`]).
const RECENT_MAX: usize = 4096;
/// Bodies rendered again from the log for workers behind the recent ones that a feed keeps to
/// share, at most (see [`ChannelFeed::lagging`]); and at most this many of them.
const LAGGING_BYTES: usize = 1 << 20;
/// See [`LAGGING_BYTES`].
const LAGGING_MAX: usize = 1024;
/// Most changes read from the log at once when the batcher is several full batches behind
/// (at least one batch). Measured on Redis after a 5 s fill of 1,000-change requests: one
/// batch a read left 21–23% published at the end of the fill and 3.1–3.8 s to catch up;
/// 4,000 changes 41% and 1.7 s; 16,000 changes 79–85% and 0.6 s, but the hub's RSS after
/// 10⁶ changes was 599 MiB (289 MiB at 4,000, 167 MiB at one batch): the allocations of big
/// reads leave the heap fragmented. What the store holds in memory is read all at once
/// ([`Store::held_after`]): on Redis under a steady stream of large requests, a read per
/// 4,000 changes left the batcher further and further behind (each read's round trip waits
/// for the append scripts running; see docs/performance.md, thirty-second pass).
const READ_AHEAD: u64 = 4_000;

/// Messages a feed's live broadcast keeps for receivers behind (see [`ChannelFeed::live`]).
const LIVE_BUFFER: usize = 1024;

/// The seqs of a published notification (what a feed's live broadcast carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub first: u64,
    pub last: u64,
}

/// Renders changes `first..=last` of a channel as a notification document. Deterministic: the
/// same changes always give the same bytes, so a retried delivery carries the same body.
pub fn render_notification(
    config: &Config,
    channel: &str,
    epoch: &str,
    changes: Vec<Change>,
) -> Notification {
    let (first, last) = match (changes.first(), changes.last()) {
        (Some(f), Some(l)) => (f.seq, l.seq),
        _ => (0, 0),
    };
    let header = ChangeListHeader {
        from: changes.first().map(|c| c.datetime),
        until: changes.last().map(|c| c.datetime),
        links: crate::catchup::change_list_links(&config.urls, channel),
        epoch: Some(epoch.to_string()),
        seq_range: Some((first, last)),
    };
    // The internal channel of a channel's Change Dumps announces dumps with Change Dump
    // documents.
    let (mut body, entry_bounds) = if crate::dumps::source_of(channel).is_some() {
        (
            crate::dumps::render(config, channel, epoch, &changes),
            Vec::new(),
        )
    } else {
        resourcesync::write_change_list_bounded(&header, &changes)
    };
    // The writer reserves a generous estimate; a kept notification counts its body's length
    // toward the recent budget, so it must not hold more than that. (glibc shrinks a block
    // in place, without a copy.)
    body.shrink_to_fit();
    let body = Bytes::from(body);
    Notification {
        channel: channel.to_string(),
        first,
        last,
        changes,
        body,
        entry_bounds,
        accepted_at: None,
    }
}

/// The hosted channels with their feeds (see [`crate::hosted`]).
pub type Feeds = Arc<crate::hosted::Hosted>;

/// The bound on the memory of the recent notifications that all feeds keep together, for
/// their delivery workers to share: a feed that publishes while the sum is over it drops its
/// own oldest ones, keeping its newest.
#[derive(Debug)]
pub struct RecentBudget {
    limit: usize,
    used: AtomicUsize,
}

impl RecentBudget {
    /// Without `--cache-size`: a feed made on its own (tests, external topics' feeds).
    const ALONE: usize = 4 << 20;

    pub fn new(limit: usize) -> Arc<RecentBudget> {
        Arc::new(RecentBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes counted now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used() > self.limit
    }
}

/// What a channel has published so far.
pub struct ChannelFeed {
    pub name: String,
    /// The channel's origin (its epoch), read from the store once.
    origin: tokio::sync::OnceCell<Origin>,
    published: watch::Sender<u64>,
    /// Recent notifications in seq order (each `first` greater than the one before).
    recent: Mutex<Recent>,
    /// Notifications rendered again from the log for workers behind `recent`.
    lagging: Mutex<Lagging>,
    live: broadcast::Sender<Span>,
    /// Notifications delivered to callbacks (answered 2xx) by this instance since it started.
    delivered: AtomicU64,
    /// Changes published and notifications delivered over the last 10 minutes: the
    /// dashboard's rates.
    pub rates: RateWindow,
    /// Where the blocks of page entries that a notification completes are written.
    pages: Option<Arc<PageCache>>,
    /// The channel's counters, registered on first use (by then the hub has installed its
    /// recorder).
    counters: OnceLock<ChannelCounters>,
}

/// A feed's recent notifications (see [`RECENT_MAX`]), their memory counted in the budget
/// too (and given back when the feed goes).
struct Recent {
    list: VecDeque<Arc<Notification>>,
    /// The `first` of each notification of `list`, at the same index: a lookup searches
    /// these in place instead of reaching into each notification it passes (every delivery
    /// worker looks up each notification it sends).
    firsts: VecDeque<u64>,
    /// What each notification of `list` counts against the budget (its
    /// [`memory`](Notification::memory) when it came, at the same index): taken off again
    /// without a walk of its changes, long gone from the CPU's caches by then.
    counted: VecDeque<usize>,
    budget: Arc<RecentBudget>,
}

impl Recent {
    fn new(budget: Arc<RecentBudget>) -> Recent {
        Recent {
            list: VecDeque::new(),
            firsts: VecDeque::new(),
            counted: VecDeque::new(),
            budget,
        }
    }

    /// Adds `n` at the end and takes out the oldest beyond the bounds, which it returns: the
    /// caller drops them once it has let the feed's lock go (freeing a notification's
    /// thousand changes is not quick). A notification that does not come after the last one
    /// (the log started again) empties the list first, so that it stays in seq order.
    fn push(&mut self, n: Arc<Notification>) -> Vec<Arc<Notification>> {
        let mut gone = Vec::new();
        if self.list.back().is_some_and(|last| last.first >= n.first) {
            gone.extend(std::iter::from_fn(|| self.pop()));
        }
        let memory = n.memory();
        self.budget.used.fetch_add(memory, Ordering::Relaxed);
        self.counted.push_back(memory);
        self.firsts.push_back(n.first);
        self.list.push_back(n);
        while self.list.len() > 1 && (self.budget.over() || self.list.len() > RECENT_MAX) {
            gone.extend(self.pop());
        }
        gone
    }

    /// Takes out the oldest; none when there was none.
    fn pop(&mut self) -> Option<Arc<Notification>> {
        let old = self.list.pop_front()?;
        self.firsts.pop_front();
        // The same figure as when it came: a kept notification does not change.
        let memory = self.counted.pop_front().unwrap_or_else(|| old.memory());
        self.budget.used.fetch_sub(memory, Ordering::Relaxed);
        Some(old)
    }

    fn get(&self, first: u64) -> Option<Arc<Notification>> {
        let at = self.firsts.binary_search(&first).ok()?;
        self.list.get(at).cloned()
    }
}

impl Drop for Recent {
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}

/// One seq range rendered again from the log, once for every worker that needs it: `None`
/// when the log no longer holds it (trimmed).
pub type LaggingCell = Arc<tokio::sync::OnceCell<Option<Arc<Notification>>>>;

/// A feed's notifications rendered again from the log (see [`ChannelFeed::lagging`]), by seq
/// range, oldest first, all of one epoch of the log.
#[derive(Default)]
struct Lagging {
    epoch: String,
    cells: HashMap<(u64, u64), LaggingCell>,
    order: VecDeque<(u64, u64)>,
}

impl Lagging {
    /// The cell of `range`, made when there is none; the oldest go beyond the bounds.
    fn cell(&mut self, epoch: &str, range: (u64, u64)) -> LaggingCell {
        if self.epoch != epoch {
            *self = Lagging {
                epoch: epoch.to_string(),
                ..Lagging::default()
            };
        }
        if let Some(cell) = self.cells.get(&range) {
            return cell.clone();
        }
        let cell = LaggingCell::default();
        self.cells.insert(range, cell.clone());
        self.order.push_back(range);
        let size = |c: &LaggingCell| c.get().and_then(Option::as_ref).map_or(0, |n| n.body.len());
        let mut bytes: usize = self.cells.values().map(size).sum();
        while self.order.len() > 1 && (bytes > LAGGING_BYTES || self.order.len() > LAGGING_MAX) {
            if let Some(old) = self.order.pop_front().and_then(|r| self.cells.remove(&r)) {
                bytes -= size(&old);
            }
        }
        cell
    }
}

impl ChannelFeed {
    /// A feed with a budget of its own for its recent notifications.
    pub fn new(name: &str) -> ChannelFeed {
        ChannelFeed::with_budget(name, RecentBudget::new(RecentBudget::ALONE))
    }

    /// A feed whose recent notifications count toward `budget`, shared with other feeds.
    pub fn with_budget(name: &str, budget: Arc<RecentBudget>) -> ChannelFeed {
        ChannelFeed {
            name: name.to_string(),
            origin: tokio::sync::OnceCell::new(),
            published: watch::channel(0).0,
            recent: Mutex::new(Recent::new(budget)),
            lagging: Mutex::default(),
            live: broadcast::channel(LIVE_BUFFER).0,
            delivered: AtomicU64::new(0),
            rates: RateWindow::default(),
            pages: None,
            counters: OnceLock::new(),
        }
    }

    /// A feed whose notifications also write the blocks of page entries they complete to
    /// `pages` (see [`PageCache::published`]).
    pub fn with_pages(name: &str, budget: Arc<RecentBudget>, pages: Arc<PageCache>) -> ChannelFeed {
        ChannelFeed {
            pages: Some(pages),
            ..ChannelFeed::with_budget(name, budget)
        }
    }

    /// The channel's counters (see [`ChannelCounters`]).
    pub fn counters(&self) -> &ChannelCounters {
        self.counters
            .get_or_init(|| ChannelCounters::register(&self.name))
    }

    /// When the channel began and the epoch of its log (recorded by the first call, see
    /// [`Store::origin`]); read from the store once, then kept.
    pub async fn origin(&self, store: &dyn Store) -> Result<&Origin, StoreError> {
        self.origin
            .get_or_try_init(|| store.origin(&self.name, time::OffsetDateTime::now_utc()))
            .await
    }

    /// The origin, when it was read already.
    pub fn known_origin(&self) -> Option<&Origin> {
        self.origin.get()
    }

    /// The last published seq, and its changes over time.
    pub fn published(&self) -> watch::Receiver<u64> {
        self.published.subscribe()
    }

    pub fn published_seq(&self) -> u64 {
        *self.published.borrow()
    }

    /// The seqs of each notification as it is published; the notification itself is
    /// [`ChannelFeed::cached`] for as long as the feed keeps it. A receiver that lags misses
    /// some and must catch up from the log. Only the seqs go through the broadcast: its
    /// buffer holds the last 1,024 messages until every receiver has read them,
    /// and held notifications would stay in memory as long as the slowest receiver
    /// (measured on Redis, when the buffer held notifications: a saturating fill kept the
    /// cluster's announcements behind, and the hub grew by 18 MiB a second, to 300 MiB
    /// over 16 s).
    pub fn live(&self) -> broadcast::Receiver<Span> {
        self.live.subscribe()
    }

    /// Counts one notification delivered to a callback (a delivery worker's 2xx).
    pub fn count_delivered(&self) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        self.rates.count_delivery();
    }

    /// Notifications delivered to callbacks by this instance since it started.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// A recently published notification that starts at `first`, if still cached.
    pub fn cached(&self, first: u64) -> Option<Arc<Notification>> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.get(first)
    }

    /// Where the notification of seqs `range` (of the log of `epoch`), rendered again from
    /// the log, is shared by the delivery workers that fell behind the recent ones: the first
    /// to need it fills the cell, the others wait for it and send the same bytes. Workers
    /// behind together (a burst published faster than it is delivered) then read and render
    /// each range once, not once each.
    pub fn lagging(&self, epoch: &str, range: (u64, u64)) -> LaggingCell {
        let mut lagging = self.lagging.lock().unwrap_or_else(|e| e.into_inner());
        lagging.cell(epoch, range)
    }

    /// Publishes a notification cut elsewhere: by the instance that owns the channel, read
    /// back from the shared log (see [`crate::cluster`]).
    pub fn announce(&self, n: Notification) {
        self.publish(n);
    }

    fn publish(&self, n: Notification) {
        let n = Arc::new(n);
        let gone = {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            let gone = recent.push(n.clone());
            if let (Some(pages), Some(origin)) = (&self.pages, self.origin.get()) {
                pages.published(&origin.epoch, recent.list.make_contiguous(), &n);
            }
            gone
        };
        drop(gone);
        // The seq first, then the broadcast: a follower that subscribes in between replays
        // this notification from the log (and skips it live); the other order could leave it
        // unseen until the next notification.
        self.published.send_replace(n.last);
        self.rates.count_changes(n.changes.iter());
        let _ = self.live.send(Span {
            first: n.first,
            last: n.last,
        });
    }

    /// Marks everything up to `seq` as published without a notification (start-up: what was
    /// durable before is served from the log).
    pub fn start_at(&self, seq: u64) {
        self.published.send_replace(seq);
    }
}

/// The batcher of one channel.
pub struct Batcher {
    feed: Arc<ChannelFeed>,
    store: Arc<dyn Store>,
    config: Arc<Config>,
    head_rx: watch::Receiver<u64>,
    published: u64,
}

impl Batcher {
    /// Everything already durable counts as published (it is served from the log), so the
    /// feed's starting point is set before this returns.
    pub fn new(feed: Arc<ChannelFeed>, store: Arc<dyn Store>, config: Arc<Config>) -> Batcher {
        feed.start_at(*store.watch_head(&feed.name).borrow());
        Batcher::continuing(feed, store, config)
    }

    /// A batcher that goes on from what `feed` has already published (an instance taking a
    /// channel over from another: what the other announced was followed, the rest is cut).
    pub fn continuing(
        feed: Arc<ChannelFeed>,
        store: Arc<dyn Store>,
        config: Arc<Config>,
    ) -> Batcher {
        let head_rx = store.watch_head(&feed.name);
        let published = feed.published_seq();
        Batcher {
            feed,
            store,
            config,
            head_rx,
            published,
        }
    }

    /// Runs until `cancel`, then publishes what is pending and returns.
    pub async fn run(mut self, cancel: CancellationToken) {
        let max_batch = self.config.max_batch as u64;
        let mut deadline: Option<Instant> = None;
        // When the oldest unpublished change was first seen durable (about its 202).
        let mut seen: Option<std::time::Instant> = None;
        let mut stopping = false;
        loop {
            let head = *self.head_rx.borrow_and_update();
            let pending = head.saturating_sub(self.published);
            if pending > 0 && seen.is_none() {
                seen = Some(std::time::Instant::now());
            }
            let due = stopping || deadline.is_some_and(|d| Instant::now() >= d);
            if pending >= max_batch || (pending > 0 && due) {
                // Behind by several full batches: one read of the log for as many as fit in
                // READ_AHEAD changes (each read waits its turn behind the appends, on Redis
                // most), or as many as the store holds in memory from here on.
                let held = self.store.held_after(&self.feed.name, self.published) as u64;
                let ahead = READ_AHEAD.max(held);
                let batches = (pending / max_batch).clamp(1, (ahead / max_batch).max(1));
                let upto = head.min(self.published + max_batch * batches);
                match cut(
                    &self.feed,
                    self.store.as_ref(),
                    &self.config,
                    (self.published, upto),
                    max_batch,
                    seen,
                )
                .await
                {
                    Ok(()) => {
                        self.published = upto;
                        if upto >= head {
                            seen = None;
                        }
                    }
                    Err(e) => {
                        if !e.logged_by_store() {
                            tracing::warn!(channel = %self.feed.name, error = %e, "cannot read the log to publish; retrying");
                        }
                        if stopping {
                            return;
                        }
                        tokio::select! {
                            _ = cancel.cancelled() => stopping = true,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                }
                continue;
            }
            if stopping {
                return;
            }
            if pending == 0 {
                deadline = None;
            } else if deadline.is_none() {
                deadline = Some(Instant::now() + self.config.linger);
            }
            tokio::select! {
                _ = cancel.cancelled() => stopping = true,
                changed = self.head_rx.changed() => if changed.is_err() { stopping = true },
                _ = sleep_until(deadline) => {}
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Reads the changes after `after` up to `upto` and publishes them as notifications of at
/// most `max_batch` changes each, in order.
async fn cut(
    feed: &ChannelFeed,
    store: &dyn Store,
    config: &Config,
    (after, upto): (u64, u64),
    max_batch: u64,
    seen: Option<std::time::Instant>,
) -> Result<(), crate::store::StoreError> {
    let mut changes = store
        .read(&feed.name, after, (upto - after) as usize)
        .await?;
    // When retention trimmed some of them, the read went on past `upto`: those are the next
    // cut's.
    changes.retain(|c| c.seq <= upto);
    if changes.is_empty() {
        // Trimmed away before it could be published: nothing to announce.
        feed.start_at(upto);
        return Ok(());
    }
    let epoch = &feed.origin(store).await?.epoch;
    for batch in batches(changes, max_batch as usize) {
        let mut n = render_notification(config, &feed.name, epoch, batch);
        n.accepted_at = seen;
        feed.counters().notifications.increment(1);
        tracing::debug!(channel = %feed.name, first = n.first, last = n.last, "notification cut");
        feed.publish(n);
    }
    Ok(())
}

/// `changes` cut into batches of `max` (the last may be shorter), in order, each its own
/// `Vec` sized to it: the feed keeps recent notifications, and a slice of the read's `Vec`
/// would keep the capacity of the whole read. The first batch is the read's `Vec` itself,
/// shrunk in place; only the others are moved out (a read of one batch, the common case when
/// the batcher keeps up, moves nothing: 1,000 changes are a fifth of a megabyte).
fn batches(mut changes: Vec<Change>, max: usize) -> Vec<Vec<Change>> {
    if changes.is_empty() {
        return Vec::new();
    }
    let max = max.max(1);
    let mut out = Vec::with_capacity(changes.len().div_ceil(max));
    while changes.len() > max {
        let last_start = (changes.len() - 1) / max * max;
        out.push(changes.split_off(last_start));
    }
    changes.shrink_to_fit();
    out.push(changes);
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notification(first: u64, last: u64, body_bytes: usize) -> Notification {
        Notification {
            channel: "c".into(),
            first,
            last,
            changes: Vec::new(),
            body: Bytes::from(vec![b'x'; body_bytes]),
            entry_bounds: Vec::new(),
            accepted_at: None,
        }
    }

    #[test]
    fn a_read_is_cut_into_batches_in_order_the_first_without_a_move() {
        let change = |seq| Change {
            seq,
            ..Change::from_new(
                0,
                crate::model::NewChange::new("http://e.com/a", crate::model::ChangeType::Created),
                time::OffsetDateTime::UNIX_EPOCH,
            )
        };
        for (n, max) in [(0u64, 3usize), (1, 3), (3, 3), (7, 3), (9, 3), (5, 1)] {
            let changes: Vec<Change> = (1..=n).map(change).collect();
            let first = changes.as_ptr();
            let cut = batches(changes, max);
            let seqs: Vec<Vec<u64>> = cut
                .iter()
                .map(|b| b.iter().map(|c| c.seq).collect())
                .collect();
            let want: Vec<Vec<u64>> = (1..=n)
                .collect::<Vec<u64>>()
                .chunks(max)
                .map(<[u64]>::to_vec)
                .collect();
            assert_eq!(seqs, want, "{n} changes in batches of {max}");
            assert!(
                cut.iter().all(|b| b.capacity() == b.len()),
                "each sized to it"
            );
            if n > 0 && n as usize <= max {
                assert_eq!(cut[0].as_ptr(), first, "one batch: the read's own vector");
            }
        }
    }

    #[test]
    fn feeds_keep_recent_notifications_within_one_shared_budget() {
        let each = notification(1, 1, 4096).memory();
        assert!(each >= 4096, "the body counts");
        let budget = RecentBudget::new(100 * each);
        // One feed alone fills the budget, then drops its oldest.
        let mut a = Recent::new(budget.clone());
        for first in 1..=150 {
            a.push(Arc::new(notification(first, first, 4096)));
        }
        assert_eq!(a.list.len(), 100);
        assert_eq!(a.list.front().map(|n| n.first), Some(51));
        assert_eq!(budget.used(), 100 * each);
        // The ones dropped are no longer found; each one kept is, by its first seq.
        assert!(a.get(50).is_none());
        for first in 51..=150 {
            assert_eq!(a.get(first).map(|n| n.first), Some(first));
        }
        // A second feed: the one that publishes while the sum is over gives way, and the
        // sum stays within the budget.
        let mut b = Recent::new(budget.clone());
        for first in 1..=30 {
            b.push(Arc::new(notification(first, first, 4096)));
        }
        assert_eq!(b.list.len(), 1, "the newest is kept even over the budget");
        assert_eq!(budget.used(), 101 * each);
        a.push(Arc::new(notification(151, 151, 4096)));
        assert_eq!(a.list.len(), 99);
        assert_eq!(budget.used(), 100 * each);
        // A new log: the old ones go, and their bytes with them.
        a.push(Arc::new(notification(1, 1, 4096)));
        assert_eq!(a.list.len(), 1);
        assert_eq!(a.get(1).map(|n| n.last), Some(1));
        assert!(a.get(151).is_none());
        assert_eq!(budget.used(), 2 * each);
        // A feed that goes gives its bytes back.
        drop(b);
        assert_eq!(budget.used(), each);
        // Changes count too.
        let mut big = notification(2, 3, 10);
        let new =
            || crate::model::NewChange::new("x".repeat(1000), crate::model::ChangeType::Updated);
        let at = time::OffsetDateTime::UNIX_EPOCH;
        big.changes = (2..=3)
            .map(|seq| Change::from_new(seq, new(), at))
            .collect();
        assert!(big.memory() > 2000 + 2 * std::mem::size_of::<Change>());
        // Small notifications: at most RECENT_MAX in one feed.
        let mut c = Recent::new(RecentBudget::new(usize::MAX));
        for first in 1..=(RECENT_MAX as u64 + 10) {
            c.push(Arc::new(notification(first, first, 10)));
        }
        assert_eq!(c.list.len(), RECENT_MAX);
    }

    #[test]
    fn a_live_listener_that_never_reads_keeps_no_notification_in_memory() {
        let each = notification(1, 1, 4096).memory();
        let feed = ChannelFeed::with_budget("c", RecentBudget::new(2 * each));
        let mut slow = feed.live();
        feed.publish(notification(1, 1, 4096));
        let first = Arc::downgrade(&feed.cached(1).expect("kept while recent"));
        for seq in 2..=10 {
            feed.publish(notification(seq, seq, 4096));
        }
        assert!(feed.cached(1).is_none(), "gone from the recent ones");
        assert!(
            first.upgrade().is_none(),
            "nothing else holds it, though the listener has not read a message"
        );
        // The listener still learns each notification's seqs, in order.
        let spans: Vec<Span> = std::iter::from_fn(|| slow.try_recv().ok()).collect();
        let expected: Vec<Span> = (1..=10).map(|s| Span { first: s, last: s }).collect();
        assert_eq!(spans, expected);
    }

    #[test]
    fn a_rendered_notification_holds_no_more_memory_than_its_body_counts() {
        let config = Config::new(([127, 0, 0, 1], 0).into(), "unused".into());
        let at = time::OffsetDateTime::UNIX_EPOCH;
        let changes = (1..=100)
            .map(|seq| {
                let loc = format!("http://example.com/resource/{seq}");
                let new = crate::model::NewChange::new(loc, crate::model::ChangeType::Updated);
                Change::from_new(seq, new, at)
            })
            .collect();
        let n = render_notification(&config, "c", "e", changes);
        let len = n.body.len();
        let body = n
            .body
            .try_into_mut()
            .expect("the only reference to the body");
        assert_eq!(
            body.capacity(),
            len,
            "no spare capacity beyond what is counted"
        );
    }

    #[test]
    fn a_feed_finds_a_recent_notification_by_its_first_seq_and_starts_over_with_a_new_log() {
        let feed = ChannelFeed::new("c");
        for first in (1..=2000).step_by(10) {
            feed.publish(notification(first, first + 9, 100));
        }
        assert_eq!(feed.cached(1).map(|n| n.last), Some(10));
        assert_eq!(feed.cached(1991).map(|n| n.last), Some(2000));
        assert!(feed.cached(5).is_none(), "not the first seq of one");
        // The log started again (a new epoch): seqs from 1 again.
        feed.publish(notification(1, 3, 100));
        assert_eq!(feed.cached(1).map(|n| n.last), Some(3));
        assert!(feed.cached(1991).is_none());
    }

    /// Workers behind the recent window that need the same range get the same cell, and only
    /// the first fills it; the cells stay within their bounds; another epoch starts over.
    #[tokio::test]
    async fn workers_behind_share_one_rendering_of_each_range() {
        let feed = ChannelFeed::new("c");
        let renders = AtomicU64::new(0);
        let render = || async {
            renders.fetch_add(1, Ordering::SeqCst);
            Ok::<_, StoreError>(Some(Arc::new(notification(1, 10, 100))))
        };
        for _ in 0..5 {
            let cell = feed.lagging("e1", (1, 10));
            let n = cell.get_or_try_init(render).await.unwrap().clone().unwrap();
            assert_eq!((n.first, n.last), (1, 10));
        }
        assert_eq!(renders.load(Ordering::SeqCst), 1);
        // A failed rendering is not kept: the next worker tries again.
        let failing = feed.lagging("e1", (11, 20));
        let failed = failing
            .get_or_try_init(|| async {
                Err::<Option<Arc<Notification>>, _>(StoreError::Unavailable("down".into()))
            })
            .await;
        assert!(failed.is_err());
        assert!(feed.lagging("e1", (11, 20)).get().is_none());
        // Bodies beyond LAGGING_BYTES push the oldest out.
        let big = LAGGING_BYTES / 4;
        for first in (21..=81).step_by(10) {
            let cell = feed.lagging("e1", (first, first + 9));
            let _ = cell
                .get_or_try_init(|| async {
                    Ok::<_, StoreError>(Some(Arc::new(notification(first, first + 9, big))))
                })
                .await;
        }
        let lagging = feed.lagging.lock().unwrap();
        let kept: usize = lagging
            .cells
            .values()
            .filter_map(|c| c.get().cloned().flatten())
            .map(|n| n.body.len())
            .sum();
        assert!(kept <= LAGGING_BYTES + big, "{kept} bytes kept");
        assert!(
            !lagging.cells.contains_key(&(1, 10)),
            "the oldest went first"
        );
        assert!(lagging.cells.contains_key(&(81, 90)));
        drop(lagging);
        // Another epoch: the same seqs are other changes.
        assert!(feed.lagging("e2", (81, 90)).get().is_none());
        assert!(feed.lagging("e2", (1, 10)).get().is_none());
    }
}
