//! Several hub instances on one shared store (Redis): who batches and delivers each channel,
//! and how every instance's [`ChannelFeed`] still sees every notification.
//!
//! Every instance ingests and serves reads. Per channel, one task on every instance plays one
//! of two roles:
//! - **owner** — holds the channel's ownership lease in the store ([`LEASE_TTL`], renewed
//!   every [`RENEW_EVERY`]); runs the channel's [`Batcher`] and the delivery workers of its
//!   subscriptions; announces each notification it cuts ([`ClusterEvent::Published`]), and
//!   starts or stops workers when another instance changes a subscription
//!   ([`ClusterEvent::Subscription`]). It steps down when the lease is lost or cannot be
//!   renewed before it would expire (Redis unreachable): workers and batcher stop.
//! - **follower** — tries to take the lease every [`RENEW_EVERY`] (at once when the owner
//!   announces [`ClusterEvent::Released`] on a clean shutdown), and meanwhile re-renders the
//!   owner's announced notifications from the shared log and publishes them on its own feed,
//!   so that live listeners (websockets, SSE) on every instance get every notification, with
//!   the same seq ranges as the owner's.
//!
//! Invariants:
//! - At most one instance delivers a channel at a time, except for the moments around a
//!   takeover (an old owner's request still in flight): delivery is at least once, and
//!   delivery state lives in the store, so the new owner resumes from the stored cursors.
//! - An owner gives up before its lease can expire in the store: it measures the lease from
//!   the moment it *sent* the renewal, which precedes the moment Redis applied it.
//! - A taking-over owner's batcher goes on from what its feed had followed, so live
//!   listeners see no gap; delivery workers go on from the stored cursors.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batcher::{render_notification, Batcher, ChannelFeed, Feeds};
use crate::config::Config;
use crate::fanout::Fanout;
use crate::ownership::Ownership;
use crate::store::{ClusterEvent, Store};
use crate::work::Work;

/// How long an ownership lease lasts without renewal: the longest a channel's delivery
/// stalls when its owner dies.
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// How often owners renew and followers try to take over.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);

/// Every this many renewals, an owner reloads its channel's subscriptions.
const RESYNC_TICKS: u64 = 10;

pub struct Cluster {
    /// This instance's lease holder id (random, per process).
    pub instance: String,
    store: Arc<dyn Store>,
    config: Arc<Config>,
    fanout: Arc<Fanout>,
    /// Which channels this instance owns (shared with the fan-out, which delivers only those).
    ownership: Arc<Ownership>,
    /// Every channel with a role task: hosted ones, and external topics' internal channels.
    channels: Mutex<Vec<String>>,
    /// Role tasks run on the batchers' tracker and stop with their token (an owner flushes
    /// its batcher first).
    work: Work,
    /// The tasks keeping leases, and their stop (cancelled by `release_all`).
    leases: TaskTracker,
    released: CancellationToken,
}

impl Cluster {
    /// `ownership` must be [`Ownership::leased`]: the cluster takes and releases channels in it.
    pub fn new(
        store: Arc<dyn Store>,
        config: Arc<Config>,
        fanout: Arc<Fanout>,
        ownership: Arc<Ownership>,
        work: &Work,
    ) -> Arc<Cluster> {
        let instance = format!("{}-{:016x}", std::process::id(), rand::random::<u64>());
        Arc::new(Cluster {
            instance,
            store,
            config,
            fanout,
            ownership,
            channels: Mutex::new(Vec::new()),
            work: work.clone(),
            leases: TaskTracker::new(),
            released: CancellationToken::new(),
        })
    }

    /// Starts the role task of a channel whose feed is new (an external topic registered
    /// while the hub runs); its starting point is already set.
    pub fn add_channel(self: &Arc<Self>, feed: Arc<ChannelFeed>) {
        self.add_removable_channel(feed, CancellationToken::new());
    }

    /// Starts the role task of a channel created while the hub runs, until `removed`: then
    /// this instance stops batching and delivering it and gives its lease up.
    pub fn add_removable_channel(
        self: &Arc<Self>,
        feed: Arc<ChannelFeed>,
        removed: CancellationToken,
    ) {
        self.remember(&feed.name);
        let stop = self.work.batcher_stop.clone();
        self.work
            .batchers
            .spawn(self.clone().run_channel(feed, true, stop, removed));
    }

    /// Forgets a removed channel: gives its lease up if this instance holds it.
    async fn forget(&self, channel: &str) {
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| c != channel);
        self.ownership.release(channel);
        if let Err(e) = self.store.release_lease(channel, &self.instance).await {
            tracing::warn!(%channel, error = %e, "cannot release the ownership lease");
        }
    }

    fn remember(&self, channel: &str) {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if !channels.iter().any(|c| c == channel) {
            channels.push(channel.to_string());
        }
    }

    /// Starts the role task of every hosted channel.
    pub async fn start(self: &Arc<Self>, feeds: &Feeds) {
        let (tasks, stop) = (&self.work.batchers, self.work.batcher_stop.clone());
        for feed in feeds.feeds() {
            self.remember(&feed.name);
            // What is durable already counts as published, as on a single instance.
            let started = match self.store.head(&feed.name).await {
                Ok(head) => {
                    feed.start_at(head.last);
                    true
                }
                Err(e) => {
                    tracing::warn!(channel = %feed.name, error = %e, "store unavailable at start-up; will retry");
                    false
                }
            };
            tasks.spawn(self.clone().run_channel(
                feed.clone(),
                started,
                stop.clone(),
                CancellationToken::new(),
            ));
        }
    }

    /// Gives up every lease this instance holds (clean shutdown, after the workers stopped),
    /// so that another instance takes over at once.
    pub async fn release_all(&self) {
        self.released.cancel();
        self.leases.close();
        // No renewal may land after the release.
        let _ = tokio::time::timeout(LEASE_TTL, self.leases.wait()).await;
        let channels = self
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for channel in &channels {
            if let Err(e) = self.store.release_lease(channel, &self.instance).await {
                tracing::warn!(%channel, error = %e, "cannot release the ownership lease");
            }
        }
    }

    async fn run_channel(
        self: Arc<Self>,
        feed: Arc<ChannelFeed>,
        mut started: bool,
        stop: CancellationToken,
        removed: CancellationToken,
    ) {
        let channel = feed.name.clone();
        let Some(mut events) = self.store.events() else {
            return;
        };
        while !started {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = removed.cancelled() => return,
                _ = tokio::time::sleep(RENEW_EVERY) => {}
            }
            if let Ok(head) = self.store.head(&channel).await {
                feed.start_at(head.last);
                started = true;
            }
        }
        loop {
            // Follower: until the lease is ours.
            let acquired_at = loop {
                let attempt = Instant::now();
                match self
                    .store
                    .try_lease(&channel, &self.instance, LEASE_TTL)
                    .await
                {
                    Ok(true) => break attempt,
                    Ok(false) => {}
                    Err(e) => tracing::debug!(%channel, error = %e, "cannot try the lease"),
                }
                let next_try = Instant::now() + RENEW_EVERY;
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = removed.cancelled() => return self.forget(&channel).await,
                        _ = tokio::time::sleep_until(next_try) => break,
                        event = events.recv() => match event {
                            Ok(ClusterEvent::Published { channel: c, last, .. }) if c == channel => {
                                self.follow(&feed, last).await;
                            }
                            Ok(ClusterEvent::Released { channel: c }) if c == channel => break,
                            Ok(_) | Err(RecvError::Lagged(_)) => {}
                            Err(RecvError::Closed) => {
                                tokio::select! {
                                    _ = stop.cancelled() => return,
                                    _ = tokio::time::sleep_until(next_try) => break,
                                }
                            }
                        }
                    }
                }
            };

            // Owner: batch, deliver, announce. The lease is kept by its own task, which stops
            // the workers itself the moment the lease is in doubt.
            tracing::info!(%channel, instance = %self.instance, published = feed.published_seq(), "owning channel");
            self.ownership.take(&channel);
            let lost = CancellationToken::new();
            self.leases.spawn(
                self.clone()
                    .keep_lease(channel.clone(), acquired_at, lost.clone()),
            );
            let owner_stop = CancellationToken::new();
            let batcher =
                Batcher::continuing(feed.clone(), self.store.clone(), self.config.clone());
            let batcher_task = tokio::spawn(batcher.run(owner_stop.clone()));
            let mut live = feed.live();
            let mut workers_started = self.start_workers(&channel).await;
            let mut tick = tokio::time::interval(RENEW_EVERY);
            tick.tick().await;
            let mut ticks: u64 = 0;
            let mut events_open = true;
            let stepped_down = loop {
                tokio::select! {
                    _ = stop.cancelled() => break false,
                    _ = lost.cancelled() => break true,
                    _ = removed.cancelled() => break true,
                    span = live.recv() => match span {
                        Ok(s) => self.announce_published(&channel, s.first, s.last).await,
                        Err(RecvError::Lagged(_)) => {
                            self.announce_published(&channel, 0, feed.published_seq()).await
                        }
                        Err(RecvError::Closed) => {}
                    },
                    _ = tick.tick() => {
                        // Now and then, and after a failure, resynchronise the workers with
                        // the stored subscriptions (an announcement may have been lost).
                        ticks += 1;
                        if !workers_started || ticks.is_multiple_of(RESYNC_TICKS) {
                            workers_started = self.start_workers(&channel).await;
                        }
                    }
                    event = events.recv(), if events_open => match event {
                        Ok(ClusterEvent::Subscription { channel: c, id }) if c == channel => {
                            if let Err(e) = self.fanout.subscription_changed(&id).await {
                                tracing::warn!(%channel, subscription = %id, error = %e, "cannot follow a subscription change");
                                workers_started = false; // reload them all on the next tick
                            }
                        }
                        Err(RecvError::Closed) => events_open = false,
                        _ => {}
                    },
                }
            };
            owner_stop.cancel();
            let _ = batcher_task.await;
            // Announce what the batcher flushed on its way out.
            while let Ok(s) = live.try_recv() {
                self.announce_published(&channel, s.first, s.last).await;
            }
            if !stepped_down {
                // Shutting down: the lease is kept while the workers drain; `release_all`.
                return;
            }
            self.fanout.drop_channel(&channel);
            if removed.is_cancelled() {
                lost.cancel(); // stops renewing the lease
                return self.forget(&channel).await;
            }
        }
    }

    /// Renews the lease of `channel` every [`RENEW_EVERY`] until `lost` or `release_all`.
    /// When the lease is taken, or not renewed within `LEASE_TTL - RENEW_EVERY` of sending the
    /// last successful renewal (so before Redis can give it to anyone else), stops the
    /// channel's workers at once and cancels `lost`.
    async fn keep_lease(
        self: Arc<Self>,
        channel: String,
        acquired_at: Instant,
        lost: CancellationToken,
    ) {
        let mut renewed = acquired_at;
        let step_down = |reason: &str| {
            tracing::warn!(%channel, reason, "stepping down as owner");
            self.fanout.drop_channel(&channel);
            lost.cancel();
        };
        loop {
            let deadline = renewed + LEASE_TTL - RENEW_EVERY;
            tokio::select! {
                _ = lost.cancelled() => return,
                _ = self.released.cancelled() => return,
                _ = tokio::time::sleep(RENEW_EVERY) => {}
            }
            let attempt = Instant::now();
            tokio::select! {
                _ = lost.cancelled() => return,
                _ = self.released.cancelled() => return,
                r = self.store.try_lease(&channel, &self.instance, LEASE_TTL) => match r {
                    Ok(true) => renewed = attempt,
                    Ok(false) => return step_down("the lease was taken"),
                    Err(e) => tracing::debug!(%channel, error = %e, "cannot renew the lease"),
                },
                _ = tokio::time::sleep_until(deadline) => {}
            }
            if Instant::now() >= renewed + LEASE_TTL - RENEW_EVERY {
                return step_down("the lease could not be renewed in time");
            }
        }
    }

    /// Starts the delivery workers of an owned channel; false when the store failed.
    async fn start_workers(self: &Arc<Self>, channel: &str) -> bool {
        match self.fanout.take_channel(channel).await {
            Ok(n) => {
                tracing::debug!(%channel, subscriptions = n, "delivery workers running");
                true
            }
            Err(e) => {
                tracing::warn!(%channel, error = %e, "cannot load subscriptions; retrying");
                false
            }
        }
    }

    async fn announce_published(&self, channel: &str, first: u64, last: u64) {
        let event = ClusterEvent::Published {
            channel: channel.to_string(),
            first,
            last,
        };
        if let Err(e) = self.store.announce(&event).await {
            // Followers re-read the published seq periodically; nothing is lost.
            tracing::debug!(%channel, error = %e, "cannot announce a notification");
        }
    }

    /// Re-renders the owner's notifications up to `last` from the log, in pieces of at most
    /// `max_batch` changes, onto this instance's feed.
    async fn follow(&self, feed: &ChannelFeed, last: u64) {
        let max = self.config.max_batch.max(1) as u64;
        let mut published = feed.published_seq();
        let epoch = match feed.origin(self.store.as_ref()).await {
            Ok(origin) => origin.epoch.clone(),
            Err(e) => {
                tracing::debug!(channel = %feed.name, error = %e, "cannot follow the owner now");
                return;
            }
        };
        while published < last {
            let upto = last.min(published + max);
            match self
                .store
                .read(&feed.name, published, (upto - published) as usize)
                .await
            {
                Ok(changes) if changes.is_empty() => feed.start_at(upto),
                Ok(changes) => feed.announce(render_notification(
                    &self.config,
                    &feed.name,
                    &epoch,
                    changes,
                )),
                Err(e) => {
                    tracing::debug!(channel = %feed.name, error = %e, "cannot follow the owner now");
                    return; // the periodic refresh brings it back
                }
            }
            published = feed.published_seq();
        }
    }
}
