//! The delivery worker of one subscription: `post.rs` sends one payload, `settle.rs` keeps
//! the retry bookkeeping, and [`run_worker`] here decides what to send next.
//!
//! Invariants:
//! - Notifications reach the callback in seq order, one request in flight.
//! - The cursor advances only after a 2xx (or when a notification is given up after
//!   `retry_for`): delivery is at least once.
//! - A failing notification keeps its seq range until it succeeds or is given up, so its
//!   delivery id (`{subscription}-{first}-{last}`) and body are the same on every retry.
//! - While the worker is behind, it coalesces up to `max_batch` changes per request, read from
//!   the log; when it is caught up it sends the bytes the batcher rendered (shared by all).
//! - An expired lease or a 410 ends the subscription; nothing is delivered after expiry.
//! - On shutdown (drain), a worker finishes delivering what is published, then stops when it
//!   is caught up or has to wait for a retry.
//! - Subscriptions to an external generic topic (see [`crate::external`]) also follow the
//!   topic's latest [`Content`]: once the log is caught up, a version newer than the last
//!   delivered one is POSTed with the topic's `Content-Type` and links, retried like a
//!   notification (each retry sends the latest version). This state is in memory only.

mod post;
mod settle;

use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;

use super::Fanout;
use crate::batcher::{render_notification, ChannelFeed};
use crate::external::{Content, ContentRetry};
use crate::model::{DeliveryState, Notification, PendingDelivery, Subscription};
use crate::net::callback::{deadline_after, CallbackConn};
use post::{deliver, post, DeliveryId, Payload, Target};
use settle::{settle, ContentAttempts, Policy, Settled, What};

type ContentRx = watch::Receiver<Option<Arc<Content>>>;

/// Runs until the subscription ends or the hub stops.
pub async fn run_worker(
    fanout: Arc<Fanout>,
    sub_rx: watch::Receiver<Arc<Subscription>>,
    state: DeliveryState,
    cancel: CancellationToken,
    generation: u64,
    content_version: u64,
) {
    let channel = sub_rx.borrow().channel.clone();
    let Some(feed) = fanout.feed(&channel) else {
        return;
    };
    let target = Target::of(&fanout, sub_rx.borrow().clone());
    let mut worker = Worker {
        target,
        conn: CallbackConn::new(fanout.callbacks.clone()),
        published_rx: feed.published(),
        content_rx: fanout.external.by_channel(&channel).map(|t| t.content()),
        policy: Policy::of(&fanout.config),
        fanout,
        feed,
        channel,
        sub_rx,
        state,
        cancel,
        generation,
        content_delivered: content_version,
        content_retry: None,
        idle: Box::pin(tokio::time::sleep(Duration::ZERO)),
    };
    while worker.step().await.is_continue() {
        super::runtime::give_way();
    }
}

/// One subscription's worker: what it follows and how far it got.
struct Worker {
    fanout: Arc<Fanout>,
    feed: Arc<ChannelFeed>,
    channel: String,
    policy: Policy,
    /// The subscription as it is now (a re-subscription renews the lease or the secret).
    sub_rx: watch::Receiver<Arc<Subscription>>,
    /// What every POST to the subscription as it is now shares.
    target: Target,
    /// The connection to the callback (one request in flight: the worker's own).
    conn: CallbackConn,
    /// The channel's newest published seq.
    published_rx: watch::Receiver<u64>,
    /// An external generic topic's latest content (`None` for every other channel).
    content_rx: Option<ContentRx>,
    state: DeliveryState,
    /// The content version last delivered or given up (in memory: not replayable).
    content_delivered: u64,
    content_retry: Option<ContentAttempts>,
    /// The end of a wait: one timer for every wait, reset to each wait's end rather than made
    /// anew (see `CallbackConn`'s deadline; an end earlier than the registered one, as a
    /// retry's can be, registers it again).
    idle: Pin<Box<Sleep>>,
    cancel: CancellationToken,
    /// Which registration of the subscription this worker serves (see `Fanout::remove_own`).
    generation: u64,
}

impl Worker {
    /// Delivers or waits once; `Break` when the worker is done.
    async fn step(&mut self) -> ControlFlow<()> {
        let sub = self.sub_rx.borrow_and_update().clone();
        if !Arc::ptr_eq(&self.target.sub, &sub) {
            self.target = Target::of(&self.fanout, sub.clone());
            // The callback may have moved: the next POST opens a new connection.
            self.conn = CallbackConn::new(self.fanout.callbacks.clone());
        }
        let now = OffsetDateTime::now_utc();
        if sub.expires_at <= now {
            tracing::info!(callback = %crate::net::shown(&sub.callback), topic = %sub.topic, "lease expired; subscription removed");
            return self.end(&sub).await;
        }
        let until_expiry = to_std(sub.expires_at - now);
        let range = match &self.state.pending {
            Some(p) if p.next_attempt_at > now => {
                if self.fanout.work.drain.is_cancelled() {
                    return ControlFlow::Break(()); // the retry waits for the next start
                }
                let wait = to_std(p.next_attempt_at - now).min(until_expiry);
                return self.wait(wait, false).await;
            }
            Some(p) => (p.first, p.last),
            None => {
                let published = *self.published_rx.borrow_and_update();
                if published <= self.state.cursor {
                    return self.caught_up(&sub, now, until_expiry).await;
                }
                self.next_range(published)
            }
        };
        self.deliver_range(&sub, range).await
    }

    /// The next range to send when nothing is pending: what the batcher rendered from the
    /// cursor on, else up to `max_batch` changes.
    fn next_range(&self, published: u64) -> (u64, u64) {
        let first = self.state.cursor + 1;
        let last = match self.feed.cached(first) {
            Some(n) => n.last,
            None => published.min(self.state.cursor + self.fanout.config.max_batch as u64),
        };
        (first, last)
    }

    /// The log is delivered: sends the topic's newer content if there is some and no retry of
    /// it is waiting, else waits for something to happen.
    async fn caught_up(
        &mut self,
        sub: &Subscription,
        now: OffsetDateTime,
        until_expiry: Duration,
    ) -> ControlFlow<()> {
        let mut wait = until_expiry;
        let newer = self
            .content_rx
            .as_mut()
            .and_then(|rx| rx.borrow_and_update().clone())
            .filter(|c| c.version > self.content_delivered);
        if let Some(content) = newer {
            match &self.content_retry {
                Some(r) if r.next_attempt_at > now => {
                    wait = wait.min(to_std(r.next_attempt_at - now));
                }
                _ => return self.deliver_content(sub, &content).await,
            }
        }
        if self.fanout.work.drain.is_cancelled() {
            return ControlFlow::Break(()); // shutting down and caught up
        }
        self.wait(wait, true).await
    }

    /// Waits up to `wait` for the subscription to change, shutdown to start, or (when
    /// `for_news`) a new published seq or new content.
    async fn wait(&mut self, wait: Duration, for_news: bool) -> ControlFlow<()> {
        let fanout = self.fanout.clone();
        self.idle.as_mut().reset(deadline_after(wait));
        tokio::select! {
            _ = self.cancel.cancelled() => return ControlFlow::Break(()),
            _ = fanout.work.drain.cancelled() => {}
            _ = self.sub_rx.changed() => {}
            changed = self.published_rx.changed(), if for_news => {
                if changed.is_err() {
                    return ControlFlow::Break(());
                }
            }
            changed = content_changed(&mut self.content_rx), if for_news => {
                if changed.is_err() {
                    self.content_rx = None;
                }
            }
            () = self.idle.as_mut() => {}
        }
        ControlFlow::Continue(())
    }

    /// Sends the seqs `range` as one Change List notification and settles the outcome.
    async fn deliver_range(&mut self, sub: &Subscription, range: (u64, u64)) -> ControlFlow<()> {
        let Some(n) = self.body(sub, range).await? else {
            return ControlFlow::Continue(());
        };
        let (first, last) = (n.first, n.last);
        let epoch = self.feed.known_origin().map(|o| o.epoch.clone());
        let outcome = tokio::select! {
            _ = self.cancel.cancelled() => return ControlFlow::Break(()),
            o = deliver(&mut self.conn, &self.target, &n, epoch.as_deref()) => o,
        };
        let now = OffsetDateTime::now_utc();
        let start = |at| PendingDelivery {
            first,
            last,
            attempts: 0,
            first_attempt_at: at,
            next_attempt_at: at,
        };
        let settled = settle(outcome, &mut self.state.pending, start, &self.policy, now);
        settled.record(&mut self.state, sub, What::Seqs(first, last), now);
        if settled == Settled::Delivered {
            self.feed.count_delivered();
            // From the 202 of these changes, when the body was the batcher's notification.
            if let Some(at) = n.accepted_at {
                metrics::histogram!("changehub_delivery_latency_seconds").record(at.elapsed());
            }
        }
        match settled {
            Settled::Gone => return self.end(sub).await,
            Settled::Delivered | Settled::GaveUp { .. } => self.state.cursor = last,
            Settled::WillRetry { .. } => {}
        }
        self.persist(sub);
        ControlFlow::Continue(())
    }

    /// The body of `range`: the batcher's shared bytes when it rendered exactly this range,
    /// else rendered from the log. `None` when there is nothing to send this time (the range
    /// was trimmed away and skipped, or the log could not be read and will be tried again).
    async fn body(
        &mut self,
        sub: &Subscription,
        (from, to): (u64, u64),
    ) -> ControlFlow<(), Option<Arc<Notification>>> {
        if let Some(n) = self.feed.cached(from).filter(|n| n.last == to) {
            return ControlFlow::Continue(Some(n));
        }
        let limit = (to - from + 1) as usize;
        let (store, config, channel) = (&self.fanout.store, &self.fanout.config, &self.channel);
        let read = async {
            let epoch = self.feed.origin(store.as_ref()).await?.epoch.clone();
            self.feed
                .lagging(&epoch, (from, to))
                .get_or_try_init(|| async {
                    let changes = store.read(channel, from - 1, limit).await?;
                    if changes.is_empty() {
                        return Ok(None);
                    }
                    let mut n = render_notification(config, channel, &epoch, changes);
                    // Only the body is sent; the changes would only hold memory.
                    n.changes = Vec::new();
                    Ok::<_, crate::store::StoreError>(Some(Arc::new(n)))
                })
                .await
                .cloned()
        };
        match read.await {
            Ok(None) => {
                // Trimmed by retention before delivery: skip to what is retained.
                self.state.cursor = to;
                self.state.pending = None;
                self.persist(sub);
                ControlFlow::Continue(None)
            }
            Ok(Some(n)) => ControlFlow::Continue(Some(n)),
            Err(e) => {
                if !e.logged_by_store() {
                    tracing::warn!(error = %e, "cannot read the log for delivery; retrying");
                }
                tokio::select! {
                    _ = self.cancel.cancelled() => ControlFlow::Break(()),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => ControlFlow::Continue(None),
                }
            }
        }
    }

    /// Sends an external topic's content (its latest version) and settles the outcome.
    async fn deliver_content(&mut self, sub: &Subscription, content: &Content) -> ControlFlow<()> {
        let payload = Payload {
            body: content.body.clone(),
            shared: None,
            content_type: content.content_type.as_deref(),
            extra_links: &content.links,
            delivery_id: DeliveryId::Content {
                sub: &sub.id,
                version: content.version,
            },
            seqs: None,
            epoch: None,
        };
        let outcome = tokio::select! {
            _ = self.cancel.cancelled() => return ControlFlow::Break(()),
            o = post(&mut self.conn, &self.target, payload) => o,
        };
        let now = OffsetDateTime::now_utc();
        let (retry, start) = (&mut self.content_retry, ContentAttempts::starting);
        let settled = settle(outcome, retry, start, &self.policy, now);
        settled.record(&mut self.state, sub, What::Content, now);
        match settled {
            Settled::Gone => return self.end(sub).await,
            Settled::Delivered | Settled::GaveUp { .. } => self.content_delivered = content.version,
            Settled::WillRetry { .. } => {}
        }
        let shown = self.content_retry.as_ref().map(|r| ContentRetry {
            version: content.version,
            attempts: r.attempts,
            next_attempt_at: r.next_attempt_at,
        });
        self.fanout.external.set_retry(&sub.id, shown);
        self.persist(sub);
        ControlFlow::Continue(())
    }

    /// Ends the subscription (lease expired, or 410 Gone).
    async fn end(&self, sub: &Subscription) -> ControlFlow<()> {
        self.fanout.remove_own(&sub.id, self.generation).await;
        ControlFlow::Break(())
    }

    /// Records the state (written coalesced: `fanout::progress`). A cancelled worker records
    /// nothing: it was replaced or its subscription removed.
    fn persist(&self, sub: &Subscription) {
        if !self.cancel.is_cancelled() {
            self.fanout.progress.record(&sub.id, &self.state);
        }
    }
}

/// Waits for new content; never returns when there is no content to follow.
async fn content_changed(rx: &mut Option<ContentRx>) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

fn to_std(d: time::Duration) -> Duration {
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}
