//! Fan-out: WebSub subscriptions and the delivery of notifications to their callbacks.
//!
//! - [`websub`]: checking a `POST /hub` subscription request, then (in the background) the
//!   verification of intent and the change it makes.
//! - [`delivery`]: one worker per verified subscription, delivering in seq order, one request
//!   in flight, retrying with backoff; its progress is [`crate::model::DeliveryState`].
//!
//! Elsewhere, and used from here: the retry schedule ([`crate::retry`]), the outbound HTTP
//! client ([`crate::net`]), external topics ([`crate::external`]).
//!
//! [`Fanout`] is the registry of live subscriptions: it starts a worker when a subscription is
//! verified (or found in the store at start-up), hands a re-verified subscription (new secret,
//! new lease) to the running worker, and stops the worker when the subscription ends.

pub mod delivery;
pub mod progress;
mod runtime;
pub mod signing;
pub mod websub;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::batcher::{ChannelFeed, Feeds};
use crate::config::Config;
use crate::external::External;
use crate::model::{DeliveryState, Subscription};
use crate::ownership::Ownership;
use crate::store::{ClusterEvent, Store, StoreError};
use crate::work::Work;
use progress::Progress;
use runtime::DeliveryRuntime;

struct Handle {
    generation: u64,
    sub: watch::Sender<Arc<Subscription>>,
    cancel: CancellationToken,
}

/// Shared by the HTTP handlers, the verification tasks and the delivery workers.
pub struct Fanout {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub feeds: Feeds,
    pub client: reqwest::Client,
    /// What the delivery workers' own callback connections share.
    pub callbacks: Arc<crate::net::callback::Settings>,
    pub external: Arc<External>,
    work: Work,
    live: Mutex<(u64, HashMap<String, Handle>)>,
    /// The channels whose subscriptions this instance delivers (written by the cluster).
    ownership: Arc<Ownership>,
    /// Every worker's delivery state, written to the store coalesced.
    pub progress: Arc<Progress>,
    progress_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Where the delivery workers run (`None`: on the hub's runtime).
    runtime: Mutex<Option<DeliveryRuntime>>,
    /// Subscriptions per topic and per callback host, for the caps.
    counts: websub::SubscriptionCounts,
    /// Subscribers' signatures of shared notifications, eight at a time.
    pub signing: signing::SignGroups,
}

/// What a [`Fanout`] is built from.
pub struct FanoutParts {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub feeds: Feeds,
    pub external: Arc<External>,
    pub client: reqwest::Client,
    pub ownership: Arc<Ownership>,
    pub work: Work,
}

impl Fanout {
    pub fn new(parts: FanoutParts) -> Arc<Fanout> {
        let callbacks = crate::net::callback::Settings::new(
            parts.config.allow_private_callbacks,
            parts.config.delivery_timeout,
        );
        Arc::new(Fanout {
            callbacks,
            config: parts.config,
            store: parts.store,
            feeds: parts.feeds,
            client: parts.client,
            external: parts.external,
            work: parts.work,
            live: Mutex::new((0, HashMap::new())),
            ownership: parts.ownership,
            progress: Arc::new(Progress::default()),
            progress_task: Mutex::default(),
            runtime: Mutex::new(DeliveryRuntime::start()),
            counts: Default::default(),
            signing: Default::default(),
        })
    }

    /// Writes the workers' delivery states (coalesced) until [`Fanout::close`].
    pub fn start_progress(&self) {
        let (progress, store) = (self.progress.clone(), Arc::downgrade(&self.store));
        let task = tokio::spawn(async move { progress.run(store).await });
        *self.progress_task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    }

    /// After the workers stopped: writes the last delivery states.
    pub async fn close(&self) {
        let task = self
            .progress_task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.progress.close(self.store.as_ref()).await;
        if let Some(task) = task {
            let _ = task.await;
        }
        drop(
            self.runtime
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }

    /// Subscription `id`'s newest delivery state (recorded by its worker, or stored).
    pub async fn delivery_state(&self, id: &str) -> Result<Option<DeliveryState>, StoreError> {
        self.progress.latest(self.store.as_ref(), id).await
    }

    /// The newest delivery states of the subscriptions `subs` (recorded by their workers, or
    /// stored), read with one store call per channel; a subscription with none is left out.
    pub async fn delivery_states(
        &self,
        subs: &[Arc<Subscription>],
    ) -> Result<HashMap<String, DeliveryState>, StoreError> {
        let mut by_channel: HashMap<&str, Vec<String>> = HashMap::new();
        for sub in subs {
            by_channel
                .entry(sub.channel.as_str())
                .or_default()
                .push(sub.id.clone());
        }
        let mut states = HashMap::with_capacity(subs.len());
        for (channel, ids) in by_channel {
            states.extend(
                self.progress
                    .latest_of(self.store.as_ref(), channel, &ids)
                    .await?,
            );
        }
        Ok(states)
    }

    /// For an owned `channel`: runs a worker for each of its stored subscriptions, and
    /// none for a subscription no longer stored (called again now and then to stay in sync).
    pub async fn take_channel(self: &Arc<Self>, channel: &str) -> Result<usize, StoreError> {
        let subs: Vec<Subscription> = self
            .store
            .subscriptions()
            .await?
            .into_iter()
            .filter(|s| s.channel == channel)
            .collect();
        // Workers of subscriptions removed meanwhile stop.
        {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.1.retain(|id, h| {
                let gone = h.sub.borrow().channel == channel && !subs.iter().any(|s| &s.id == id);
                if gone {
                    h.cancel.cancel();
                }
                !gone
            });
        }
        let started = subs.len();
        for sub in subs {
            self.refresh(sub).await?;
        }
        // A publish ping that arrived before this instance owned an external topic.
        if let Some(topic) = self.external.by_channel(channel) {
            if topic.take_missed_ping() {
                self.external.ping(topic);
            }
        }
        Ok(started)
    }

    /// This instance no longer owns `channel`: stops the workers of its subscriptions.
    pub fn drop_channel(&self, channel: &str) {
        self.ownership.release(channel);
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.1.retain(|_, h| {
            let mine = h.sub.borrow().channel == channel;
            if mine {
                h.cancel.cancel();
            }
            !mine
        });
    }

    /// Another instance changed subscription `id` of an owned channel: follows the store.
    pub async fn subscription_changed(self: &Arc<Self>, id: &str) -> Result<(), StoreError> {
        let sub = self
            .store
            .subscriptions()
            .await?
            .into_iter()
            .find(|s| s.id == id);
        match sub {
            Some(sub) if self.ownership.owns(&sub.channel) => self.refresh(sub).await,
            Some(_) => Ok(()),
            None => {
                let handle = {
                    let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
                    live.1.remove(id)
                };
                if let Some(h) = handle {
                    h.cancel.cancel();
                }
                Ok(())
            }
        }
    }

    /// Hands a stored subscription to its running worker, or starts one from its stored
    /// delivery state.
    async fn refresh(self: &Arc<Self>, sub: Subscription) -> Result<(), StoreError> {
        let existing = {
            let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.1.get(&sub.id).map(|h| h.sub.clone())
        };
        match existing {
            Some(tx) => {
                tx.send_if_modified(|current| {
                    let changed = **current != sub;
                    if changed {
                        *current = Arc::new(sub);
                    }
                    changed
                });
            }
            None => {
                let state = self.delivery_state(&sub.id).await?.unwrap_or_default();
                self.spawn(sub, state);
            }
        }
        Ok(())
    }

    /// Tells the other instances that subscription `id` changed (shared stores only).
    async fn tell_others(&self, channel: &str, id: &str) {
        if !self.store.shared() {
            return;
        }
        let event = ClusterEvent::Subscription {
            channel: channel.to_string(),
            id: id.to_string(),
        };
        if let Err(e) = self.store.announce(&event).await {
            tracing::warn!(subscription = id, error = %e, "cannot tell the other instances");
        }
    }

    /// Starts a worker for every subscription in the store (at start-up).
    pub async fn resume(self: &Arc<Self>) -> Result<usize, StoreError> {
        let subs = self.store.subscriptions().await?;
        let mut started = 0;
        for sub in subs {
            if self.feed(&sub.channel).is_none() {
                tracing::warn!(channel = %sub.channel, callback = %crate::net::shown(&sub.callback),
                    "subscription to a channel that is no longer configured; keeping it idle");
                continue;
            }
            let state = self.delivery_state(&sub.id).await?.unwrap_or_default();
            self.spawn(sub, state);
            started += 1;
        }
        Ok(started)
    }

    /// Makes a verified subscription active: stores it and starts or updates its worker.
    /// A new subscription starts after the channel's last published seq.
    pub async fn activate(self: &Arc<Self>, sub: Subscription) -> Result<(), StoreError> {
        self.store.put_subscription(&sub).await?;
        let (channel, id) = (sub.channel.clone(), sub.id.clone());
        let existing = {
            let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.1.get(&sub.id).map(|h| h.sub.clone())
        };
        match existing {
            Some(tx) => {
                tx.send_replace(Arc::new(sub));
            }
            None => {
                let state = match self.delivery_state(&sub.id).await? {
                    Some(state) => state,
                    None => {
                        let cursor = self
                            .feed(&sub.channel)
                            .map(|f| f.published_seq())
                            .unwrap_or(0);
                        let state = DeliveryState {
                            cursor,
                            ..DeliveryState::default()
                        };
                        self.store.put_delivery(&sub.id, &state).await?;
                        state
                    }
                };
                // Only where the channel is delivered (see `spawn`).
                self.spawn(sub, state);
            }
        }
        self.tell_others(&channel, &id).await;
        Ok(())
    }

    /// The feed of a hosted channel or of an external topic's internal channel.
    pub fn feed(&self, channel: &str) -> Option<Arc<ChannelFeed>> {
        match self.feeds.feed(channel) {
            Some(feed) => Some(feed),
            None => self.external.by_channel(channel).map(|t| t.feed.clone()),
        }
    }

    /// Delivers again every change after `from - 1`: the subscription's worker is restarted
    /// with its cursor there (any notification being retried is dropped in favour of it).
    /// `None` when no such subscription is active.
    pub async fn redeliver(
        self: &Arc<Self>,
        id: &str,
        from: u64,
    ) -> Result<Option<DeliveryState>, StoreError> {
        let sub = {
            let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            match live.1.get(id) {
                Some(h) => Subscription::clone(&h.sub.borrow()),
                None => return Ok(None),
            }
        };
        let mut state = self.delivery_state(id).await?.unwrap_or_default();
        state.cursor = from.saturating_sub(1);
        state.pending = None;
        self.progress.record(id, &state);
        tracing::info!(subscription = id, from, "redelivery requested");
        // Replaces (and cancels) the running worker.
        self.spawn(sub, state.clone());
        Ok(Some(state))
    }

    /// Ends a subscription: stops its worker and forgets it. True when it existed.
    pub async fn remove(&self, id: &str) -> Result<bool, StoreError> {
        let handle = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.1.remove(id)
        };
        if let Some(h) = &handle {
            h.cancel.cancel();
        }
        self.external.set_retry(id, None);
        let channel = match &handle {
            Some(h) => Some(h.sub.borrow().channel.clone()),
            None if self.store.shared() => self
                .store
                .subscriptions()
                .await?
                .into_iter()
                .find(|s| s.id == id)
                .map(|s| s.channel),
            None => None,
        };
        self.progress.forget(id).await;
        let existed = self.store.delete_subscription(id).await? || handle.is_some();
        self.counts.forget().await;
        if let Some(channel) = channel {
            self.tell_others(&channel, id).await;
        }
        Ok(existed)
    }

    /// Called by a worker that ends its own subscription (410, lease expiry).
    async fn remove_own(&self, id: &str, generation: u64) {
        {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            if live.1.get(id).is_some_and(|h| h.generation == generation) {
                live.1.remove(id);
            } else {
                return; // replaced meanwhile by a new verification
            }
        }
        self.external.set_retry(id, None);
        self.progress.forget(id).await;
        if let Err(e) = self.store.delete_subscription(id).await {
            tracing::warn!(subscription = id, error = %e, "cannot delete subscription");
        }
        self.counts.forget().await;
    }

    /// The subscriptions with a running worker.
    /// True when this instance batches and delivers `channel`.
    pub fn owns(&self, channel: &str) -> bool {
        self.ownership.owns(channel)
    }

    pub fn active(&self) -> Vec<Arc<Subscription>> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.1.values().map(|h| h.sub.borrow().clone()).collect()
    }

    /// Starts (or replaces) the worker of `sub`, where this instance delivers its channel.
    fn spawn(self: &Arc<Self>, sub: Subscription, state: DeliveryState) {
        if !self.ownership.owns(&sub.channel) {
            return;
        }
        let cancel = self.work.cancel.child_token();
        // Content fetched before the subscription was verified is not delivered to it.
        let content_version = self
            .external
            .by_channel(&sub.channel)
            .map_or(0, |t| t.content_baseline(sub.created_at));
        let (id, channel) = (sub.id.clone(), sub.channel.clone());
        let (tx, rx) = watch::channel(Arc::new(sub));
        let generation = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.0 += 1;
            let generation = live.0;
            let handle = Handle {
                generation,
                sub: tx,
                cancel: cancel.clone(),
            };
            if let Some(old) = live.1.insert(id.clone(), handle) {
                old.cancel.cancel();
            }
            generation
        };
        // `drop_channel` releases ownership first and then stops the registered workers: if it
        // ran between the check above and the registration, this worker must not run.
        if !self.ownership.owns(&channel) {
            cancel.cancel();
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            if live.1.get(&id).is_some_and(|h| h.generation == generation) {
                live.1.remove(&id);
            }
            return;
        }
        let fanout = self.clone();
        let worker = async move {
            delivery::run_worker(fanout, rx, state, cancel, generation, content_version).await;
        };
        self.spawn_on_delivery_side(&self.work.tasks, worker);
    }

    /// Spawns `task` on `tracker`, on the delivery runtime (`fanout::runtime`): delivery
    /// workers, and the batchers whose notifications wake them (a wake within one runtime
    /// costs less than one across).
    pub fn spawn_on_delivery_side<F>(&self, tracker: &tokio_util::task::TaskTracker, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let runtime = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        match runtime.as_ref().and_then(DeliveryRuntime::handle) {
            Some(handle) => tracker.spawn_on(task, handle),
            None => tracker.spawn(task),
        };
    }
}
