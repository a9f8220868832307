//! The store: the durable replay log of every channel, the subscriptions and their delivery
//! state, and idempotency keys — one trait, [`Store`], with an implementation per engine,
//! chosen at start-up.
//!
//! The trait is shaped after Redis Streams: a channel's log is an append-only sequence whose
//! entry ids are the seqs (1, 2, 3, … without gaps); appends assign seqs atomically and are
//! durable when they return; reads are ranges by seq; retention trims from the front.
//!
//! Invariants every implementation keeps:
//! - `append` returns only after the changes are durable, and assigns consecutive seqs.
//! - Within a channel, `datetime` never decreases with seq.
//! - An idempotency key seen before (per channel, within [`IDEMPOTENCY_TTL`]) returns the
//!   first answer and appends nothing.
//! - `watch_head` reports the last durable seq of a channel, never a seq that is not durable.
//! - The resource index (the latest change of every `loc`, [`Store::resources`]) is written in
//!   the same atomic write as the log, so the two never disagree; retention trims the log,
//!   never the index.
//! - Every resource of the index has a FeedSync item ([`Store::sync_items`]), written in the same
//!   atomic write as the change it derives from: the hub's own changes update it (§3.1–3.2 of
//!   FeedSync, by the endpoint of the change's publisher), a merge sets it
//!   ([`Store::append_merged`]); each logged change records how many conflicts the item
//!   carries then (`Change::conflicts`).

pub mod embedded;
pub mod redis;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::sync::{broadcast, watch};

use crate::model::feedsync::{MergedChange, Synced};
use crate::model::{Change, ChannelSpec, DeliveryState, NewChange, Retention, Subscription};

pub use embedded::EmbeddedStore;
pub use redis::RedisStore;

/// How long an idempotency key is remembered.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The disk under the store is full: nothing can be written until space is freed. The
    /// store logs this itself (a line when it starts, when it ends, and a bounded reminder).
    #[error("no space left on the store's disk: {0}")]
    Full(String),
    /// The store's file failed (an I/O error, or a full disk for a read) and the store is
    /// reopening it on its own; logged by the store like [`StoreError::Full`].
    #[error("store I/O error: {0}")]
    Io(String),
    /// A write whose answer never came (a timeout, a connection lost while waiting): it may
    /// have happened or not.
    #[error("the store did not confirm the write: {0}")]
    OutcomeUnknown(String),
    #[error("idempotency key was used before with a different request")]
    IdempotencyConflict,
    #[error("corrupt record: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// True for the errors of a broken store ([`StoreError::Full`], [`StoreError::Io`]), which
    /// the store logs itself at a bounded rate: callers that retry need not log each one.
    pub fn logged_by_store(&self) -> bool {
        matches!(self, StoreError::Full(_) | StoreError::Io(_))
    }
}

/// An idempotency key with the fingerprint of the request it came with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyKey {
    pub key: String,
    pub fingerprint: String,
}

/// The result of an append: the seqs given to the changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Appended {
    pub accepted: usize,
    pub first: u64,
    pub last: u64,
    /// True when an earlier request with the same idempotency key already appended these.
    #[serde(skip)]
    pub replayed: bool,
}

/// Where a channel's log stands. `oldest` is the first retained seq (`last + 1` when nothing
/// is retained); `last` is the newest seq (0 when nothing was ever appended).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChannelHead {
    pub oldest: u64,
    pub last: u64,
}

impl ChannelHead {
    pub const EMPTY: ChannelHead = ChannelHead { oldest: 1, last: 0 };
}

/// When a channel began, and the epoch of its log (see [`Store::origin`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub created: OffsetDateTime,
    /// 16 lowercase hex digits, random.
    pub epoch: String,
}

/// A new epoch: 16 random lowercase hex digits.
pub fn new_epoch() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// One page of a channel's resource index (see [`Store::resources`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourcePage {
    /// The latest change of each resource, in the order of their seqs; resources whose latest
    /// change is `deleted` are included.
    pub resources: Vec<Change>,
    /// The channel's newest seq when the page was read: the page reflects every change up to
    /// it.
    pub last: u64,
}

/// One page of a channel's FeedSync items (see [`Store::sync_items`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncPage {
    /// Each resource's latest change and item, in the order of their seqs.
    pub items: Vec<Synced>,
    /// The channel's newest seq when the page was read.
    pub last: u64,
}

/// What hub instances sharing one store tell each other (see [`crate::cluster`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterEvent {
    /// The owner of `channel` published notifications up to seq `last` (`first` is the first
    /// seq of the notification, or 0 when only the position is known).
    Published {
        channel: String,
        first: u64,
        last: u64,
    },
    /// Subscription `id` of `channel` was created, changed or removed by some instance.
    Subscription { channel: String, id: String },
    /// The owner of `channel` gave its lease up: another instance may take over now.
    Released { channel: String },
    /// A publisher pinged the external topic of `channel` at an instance that does not own
    /// it: the owner fetches the topic (it is the one that delivers what the fetch finds).
    Pinged { channel: String },
    /// The stored settings of `channel` were created, changed or removed (admin API): every
    /// instance reloads them.
    Channel { channel: String },
}

/// The store, one trait for every engine. Implementations are cheap to share (`Arc<dyn Store>`).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Appends `changes` (already validated) to `channel` durably, giving them the next seqs.
    /// Each change's datetime is its own or `now`, raised to the channel's latest datetime when
    /// it would go backwards.
    async fn append(
        &self,
        channel: &str,
        changes: Vec<NewChange>,
        idempotency: Option<IdempotencyKey>,
        now: OffsetDateTime,
    ) -> Result<Appended, StoreError>;

    /// Changes with seq > `after`, in seq order, at most `limit`.
    async fn read(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Change>, StoreError>;

    /// How many of the changes with seq > `after` this store holds in memory, in a row: a
    /// [`read`](Store::read) of that many costs about what a read of a few does (the batcher
    /// reads ahead by as many). None by default; Redis holds the large requests this instance
    /// appended last.
    fn held_after(&self, _channel: &str, _after: u64) -> usize {
        0
    }

    /// The newest `limit` retained changes, in seq order.
    async fn read_newest(&self, channel: &str, limit: usize) -> Result<Vec<Change>, StoreError>;

    async fn head(&self, channel: &str) -> Result<ChannelHead, StoreError>;

    /// A receiver of the channel's last durable seq, updated after every append.
    fn watch_head(&self, channel: &str) -> watch::Receiver<u64>;

    /// When `channel` began and the epoch of its log: recorded by the first call (`now` and
    /// [`new_epoch`]), the same ever after. An empty Change List gives `created` as its
    /// `from`; the epoch tells followers whether their cursor is a seq of this log (a store
    /// whose data was lost starts a new epoch).
    async fn origin(&self, channel: &str, now: OffsetDateTime) -> Result<Origin, StoreError>;

    /// Applies retention to `channel` and forgets expired idempotency keys; returns how many
    /// changes were removed. The newest change is always kept.
    async fn trim(
        &self,
        channel: &str,
        retention: Retention,
        now: OffsetDateTime,
    ) -> Result<u64, StoreError>;

    /// The resource index of `channel`: the latest change of each resource (`loc`) whose
    /// latest change has a seq greater than `after`, in seq order, at most `limit`.
    ///
    /// Ordered by seq, pages read one after the other (`after` = the last seq of the previous
    /// page) list every resource at least once, in a state at least as new as the first page's
    /// `last`: a resource that changes meanwhile moves to a later page.
    async fn resources(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<ResourcePage, StoreError>;

    /// The latest change of resource `loc` in the index of `channel` (with the publisher that
    /// sent it), if the index has it.
    async fn resource(&self, channel: &str, loc: &str) -> Result<Option<Change>, StoreError>;

    /// How many resources the index of `channel` describes (deleted ones included).
    async fn resource_count(&self, channel: &str) -> Result<u64, StoreError>;

    /// Page boundaries of the resource index: the seq of the resource at rank `every`,
    /// `2 × every`, … in seq order (ranks from 1; deleted resources count).
    async fn resource_marks(&self, channel: &str, every: usize) -> Result<Vec<u64>, StoreError>;

    /// The FeedSync items of `channel`: like [`Store::resources`] (same order, same paging),
    /// each resource with its item's sync metadata.
    async fn sync_items(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<SyncPage, StoreError>;

    /// Resource `loc` of `channel` with its item's sync metadata, read together.
    async fn sync_item(&self, channel: &str, loc: &str) -> Result<Option<Synced>, StoreError>;

    /// Up to `limit` resources of `channel` whose items carry conflicts, in loc order.
    async fn sync_conflicts(&self, channel: &str, limit: usize) -> Result<Vec<Synced>, StoreError>;

    /// Appends the changes of a FeedSync merge (one per loc) in one atomic write, each item
    /// taking its merged state, if the latest change of every loc still has the seq the merge
    /// read (`expected`); otherwise appends nothing and answers None (read and merge again).
    async fn append_merged(
        &self,
        channel: &str,
        changes: Vec<MergedChange>,
        now: OffsetDateTime,
    ) -> Result<Option<Appended>, StoreError>;

    /// Stores the settings of a channel created or changed at runtime (admin API).
    async fn put_channel(&self, spec: &ChannelSpec) -> Result<(), StoreError>;
    /// Removes a stored channel's settings (its log stays); true when they existed.
    async fn delete_channel(&self, name: &str) -> Result<bool, StoreError>;
    /// The stored settings of one channel.
    async fn stored_channel(&self, name: &str) -> Result<Option<ChannelSpec>, StoreError>;
    /// Every stored channel's settings.
    async fn stored_channels(&self) -> Result<Vec<ChannelSpec>, StoreError>;

    async fn put_subscription(&self, sub: &Subscription) -> Result<(), StoreError>;
    /// Removes a subscription and its delivery state; true when it existed.
    async fn delete_subscription(&self, id: &str) -> Result<bool, StoreError>;
    async fn subscriptions(&self) -> Result<Vec<Subscription>, StoreError>;

    async fn put_delivery(&self, sub_id: &str, state: &DeliveryState) -> Result<(), StoreError>;
    /// Records the delivery state of many subscriptions at once (the fan-out writes them
    /// coalesced). A state for a subscription that no longer exists is dropped.
    async fn put_deliveries(&self, states: &[(String, DeliveryState)]) -> Result<(), StoreError> {
        for (id, state) in states {
            self.put_delivery(id, state).await?;
        }
        Ok(())
    }
    async fn delivery(&self, sub_id: &str) -> Result<Option<DeliveryState>, StoreError>;
    /// The stored delivery states of the subscriptions `ids`, all to `channel`, read at once
    /// (a subscription with no stored state is left out). For listings of every
    /// subscription, such as the metrics' gauges, which would otherwise read one by one.
    async fn deliveries(
        &self,
        channel: &str,
        ids: &[String],
    ) -> Result<HashMap<String, DeliveryState>, StoreError> {
        let _ = channel;
        let mut states = HashMap::with_capacity(ids.len());
        for id in ids {
            if let Some(state) = self.delivery(id).await? {
                states.insert(id.clone(), state);
            }
        }
        Ok(states)
    }

    /// Records that `bridge` (a named follower of the channel's notifications that passes them
    /// on elsewhere, such as the XMPP bridge) has passed on everything up to `seq`. Like
    /// delivery state, losing the last write in a crash only passes a notification on again.
    async fn put_bridge_cursor(
        &self,
        channel: &str,
        bridge: &str,
        seq: u64,
    ) -> Result<(), StoreError>;
    /// The last seq `bridge` passed on for `channel`; `None` when it never recorded one.
    async fn bridge_cursor(&self, channel: &str, bridge: &str) -> Result<Option<u64>, StoreError>;

    /// Succeeds when the store can serve requests (readiness).
    async fn ping(&self) -> Result<(), StoreError>;

    // Several hub instances on one store. The defaults describe a store that only one
    // instance uses (embedded): that instance owns every channel and nobody else listens.

    /// True when several hub instances may share this store, so that channel ownership,
    /// [`ClusterEvent`]s and leases matter.
    fn shared(&self) -> bool {
        false
    }

    /// Takes or renews the ownership lease of `channel` for `holder` for `ttl`; false when
    /// another holder has it.
    async fn try_lease(
        &self,
        _channel: &str,
        _holder: &str,
        _ttl: Duration,
    ) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Gives the lease of `channel` up if `holder` has it.
    async fn release_lease(&self, _channel: &str, _holder: &str) -> Result<(), StoreError> {
        Ok(())
    }

    /// Tells every instance (this one included) about `event`; at most once.
    async fn announce(&self, _event: &ClusterEvent) -> Result<(), StoreError> {
        Ok(())
    }

    /// The events every instance announces (None on an unshared store).
    fn events(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        None
    }
}
