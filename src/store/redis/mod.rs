//! The Redis store: every hub instance that points at the same Redis sees the same log,
//! subscriptions, delivery state and idempotency keys, so instances are disposable.
//!
//! Files: `conn` (the `--redis` URL and the command connection), `log` (append, read,
//! head, trim), `group` (group commit: one append script call per channel at a time, for all
//! the appends waiting), `recent` (the changes of the large requests this instance appended
//! last, read back without the log), `head_reads` (one head read shared by the requests that
//! wait for it), `index` (the resource index), `feedsync` (the FeedSync items), `fold` (the
//! index and the items brought up to the log after the append),
//! `subscriptions` (subscriptions and delivery state), `leases` (channel ownership), `events`
//! (pub/sub between instances); the Lua scripts are in `scripts/`.
//!
//! Key layout — every key of channel `c` carries the hash tag `{c}`, so that all of them live
//! in one slot of a Redis Cluster and one script can touch them together:
//!
//! | key | type | what |
//! |---|---|---|
//! | `changehub:{c}:log` | stream | the log, in chunks: an entry holds up to 32 changes with consecutive seqs, id `FIRST-0` (the seq of the first), one field per change in seq order (`e` alone, `c` each when several): the final datetime as a 23-digit sortable key, then the change as the source sent it (JSON, empty fields left out) |
//! | `changehub:{c}:meta` | hash | `last` (newest seq), `oldest` (first retained seq), `folded` (the seq up to which the resource index and the FeedSync items reflect the log; none: all of it, see `fold`), `dt` (latest datetime key), `published` (what the owner announced), `indexed` (the resource index is complete), `created` (when the channel began, a datetime key), `epoch` (the log's epoch, set by the first append or the first origin read: a log lost and begun again gets another) |
//! | `changehub:{c}:res` | hash | resource index: loc → the log entry of its latest change |
//! | `changehub:{c}:res-seq` | sorted set | resource index: loc by the seq of its latest change |
//! | `changehub:{c}:sx` | hash | FeedSync items: loc → its sync metadata, written by the fold (or by the append script, see `fold`): `UPDATES PUBLISHER` for one publisher's updates (the rest implied by the resource's latest change), otherwise JSON |
//! | `changehub:{c}:sx-conflicts` | sorted set | the locs whose FeedSync items carry conflicts (scores 0: loc order) |
//! | `changehub:{c}:idem` | hash | idempotency key → `at first last accepted fingerprint` |
//! | `changehub:{c}:idem-at` | sorted set | idempotency key by time, to forget them after 24 h |
//! | `changehub:{c}:subs` | hash | subscription id → subscription (JSON) |
//! | `changehub:{c}:delivery` | hash | subscription id → delivery state (JSON) |
//! | `changehub:{c}:expiries` | sorted set | subscription id by lease expiry (unix seconds) |
//! | `changehub:{c}:retries` | sorted set | subscription id by next retry (unix seconds), while one is pending |
//! | `changehub:{c}:bridges` | hash | bridge name (`xmpp`) → the last seq it passed on |
//! | `changehub:{c}:owner` | string (PX) | the ownership lease: the holder's instance id |
//! | `changehub:subscription-channels` | hash | subscription id → channel (the one key outside a channel's slot) |
//!
//! **The slot rule**: a script or a transaction (`MULTI`/`EXEC` pipeline) touches keys of one
//! channel only, so that all its keys hash to one slot of a Redis Cluster.
//! `changehub:subscription-channels` has no hash tag and is only ever read or written by
//! single-key commands of its own, never inside a script or a transaction with channel keys
//! (storing a subscription writes the index first, then the channel's keys; removing one does
//! the reverse). Pub/sub needs no key: `PUBLISH` (also from inside a script) reaches the
//! subscribers on every node of a cluster.
//!
//! The connection is either one server (`redis://…`, `redis+unix://…`: a `ConnectionManager`)
//! or a Redis Cluster (`redis+cluster://host:port,host:port,…`: a `ClusterConnection` that
//! routes each command, script and transaction to the primary of its slot and follows
//! `MOVED`/`ASK` and topology changes); both behind `conn::Conn`, so every command and script
//! runs unchanged on either.
//!
//! Appends run as one Lua script (idempotency check, next seqs, datetime clamp, an `XADD` with
//! an explicit id per chunk of 32 changes, meta update, `PUBLISH`; the resource index and the
//! FeedSync items follow later, see `fold`), so concurrent ingest on
//! any number of instances yields gapless seqs. Within one process the appends of a channel
//! are grouped: while one script call for the channel runs, the appends that come wait, and
//! the next call takes them all (each keeps its own idempotency check and outcome); a request
//! of 100 changes or more makes its own call at once. Retention moves `oldest` forward and
//! `XTRIM MINID`s the stream up to the entry that holds the new `oldest` (whole entries only;
//! readers leave out what lies before it).
//!
//! Instances talk through the pub/sub channel `changehub:events` (`head c last`,
//! `published c first last`, `subscription c id`, `released c`, `pinged c`). Pub/sub is at most once, so
//! a listener task also re-reads every known channel's `last` and `published` after each
//! (re)connection and every [`REFRESH`]: a lost message delays, never loses, a notification.
//!
//! Durability is Redis's: an append is answered after Redis executed the script; with
//! `appendonly yes` + `appendfsync always` it is on disk; with `appendfsync everysec` (the
//! usual setting) it survives a crash of Redis (the AOF is written before the reply) but up to
//! a second can be lost if the machine loses power; without AOF, a Redis restart loses
//! everything since the last RDB snapshot. See README.md, "Running on Redis".

use async_trait::async_trait;
use redis::{RedisResult, Script};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use time::OffsetDateTime;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::{
    Appended, ChannelHead, ClusterEvent, IdempotencyKey, Origin, ResourcePage, Store, StoreError,
    SyncPage,
};
use crate::model::feedsync::{MergedChange, Synced};
use crate::model::{Change, ChannelSpec, DeliveryState, NewChange, Retention, Subscription};

mod bridges;
mod conn;
mod events;
mod feedsync;
mod fold;
mod group;
mod head_reads;
mod index;
mod leases;
mod log;
mod recent;
mod subscriptions;

pub use conn::{Target, CLUSTER_SCHEME};
pub use log::datetime_key;

/// The pub/sub channel of [`ClusterEvent`]s and head moves.
pub const EVENTS: &str = "changehub:events";
/// Every command gives up after this long (the hub answers 503 meanwhile).
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the listener re-reads heads and published seqs, in case a message was lost.
pub const REFRESH: Duration = Duration::from_secs(2);

/// The key `what` of `channel`, hash-tagged so that all of a channel's keys share one slot.
fn key(channel: &str, what: &str) -> String {
    format!("changehub:{{{channel}}}:{what}")
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    count_errors(1);
    StoreError::Unavailable(e.to_string())
}

/// Runs one write with the store's deadline. A timeout may come after Redis applied the
/// write: its outcome is unknown. (A connection that fails is taken as a refusal: the
/// connection manager cannot tell a write lost on the way from one whose answer was lost, and
/// a Redis that is down refuses every later write plainly.)
async fn timed_write<T>(f: impl Future<Output = RedisResult<T>>) -> Result<T, StoreError> {
    write_until(tokio::time::Instant::now() + OP_TIMEOUT, 1, f).await
}

/// Runs one write that carries `requests` requests (several appends in one script call) until
/// `deadline`, as [`timed_write`]; a failure counts as one store error per request.
async fn write_until<T>(
    deadline: tokio::time::Instant,
    requests: u64,
    f: impl Future<Output = RedisResult<T>>,
) -> Result<T, StoreError> {
    let e = match tokio::time::timeout_at(deadline, f).await {
        Ok(Ok(v)) => return Ok(v),
        Ok(Err(e)) if e.is_timeout() => StoreError::OutcomeUnknown(e.to_string()),
        Ok(Err(e)) => StoreError::Unavailable(e.to_string()),
        Err(_) => StoreError::OutcomeUnknown("redis did not answer in time".into()),
    };
    count_errors(requests);
    Err(e)
}

fn count_errors(n: u64) {
    metrics::counter!("changehub_store_errors_total").increment(n);
}

/// Runs one Redis call with the store's deadline.
async fn timed<T>(f: impl Future<Output = RedisResult<T>>) -> Result<T, StoreError> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(e)),
        Err(_) => Err(unavailable("redis did not answer in time")),
    }
}

fn encode<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn decode<T: for<'de> serde::Deserialize<'de>>(bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// The Lua scripts, each one loaded once and run by its hash (`EVALSHA`); the append script
/// is the channel writers' (`group`), the merge script `feedsync`'s.
struct Scripts {
    trim: Script,
    lease: Script,
    release: Script,
    published: Script,
    resources: Script,
    backfill: Script,
}

impl Scripts {
    fn load() -> Scripts {
        Scripts {
            trim: Script::new(include_str!("scripts/trim.lua")),
            lease: Script::new(include_str!("scripts/lease.lua")),
            release: Script::new(include_str!("scripts/release.lua")),
            published: Script::new(include_str!("scripts/published.lua")),
            resources: Script::new(include_str!("scripts/resources.lua")),
            backfill: Script::new(include_str!("scripts/backfill.lua")),
        }
    }
}

pub struct RedisStore {
    conn: conn::Conn,
    heads: events::Heads,
    events: broadcast::Sender<ClusterEvent>,
    /// Subscription id → channel, learnt as subscriptions are stored or read (never changes).
    sub_channels: Mutex<HashMap<String, String>>,
    /// Channels whose resource index is known to be complete (checked once per process).
    indexed: Mutex<std::collections::HashSet<String>>,
    scripts: Scripts,
    /// The appends waiting for each channel's writer (group commit).
    appends: Arc<group::Appends>,
    /// Stops the listener task (and the writers of appends) when the store goes away.
    stop: CancellationToken,
    /// Head reads shared by the requests that want one at the same time.
    head_reads: head_reads::HeadReads,
    /// The changes of the large requests this instance appended last, for reading them back
    /// without the log.
    recent: Arc<recent::Recent>,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl RedisStore {
    /// Connects to Redis at `url`: one server (`redis://host:port/db`, `redis+unix://…`) or a
    /// Redis Cluster (`redis+cluster://host:port,host:port,…`, see [`Target`]). Does not wait
    /// for Redis to be up: until it is, every call fails with [`StoreError::Unavailable`] and
    /// the connection is retried on the next call. Must be called within a Tokio runtime.
    pub fn open(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::open_holding(url, recent::HELD_BYTES)
    }

    /// [`RedisStore::open`], holding at most `held` bytes of the changes this instance
    /// appended last for the batcher to read without the log (`recent.rs`; an eighth of
    /// `--cache-size` in `changehub serve`).
    pub fn open_holding(url: &str, held: usize) -> Result<RedisStore, StoreError> {
        let target = Target::parse(url).map_err(StoreError::Unavailable)?;
        // Pub/sub goes over a connection of its own, to one server — on a cluster to one of
        // the seed nodes, the next one at each reconnection. Appends have their own command
        // connection too: on a shared one, every command queued behind the append scripts
        // already sent (Redis runs what one connection sent in order), so under a steady
        // stream of large appends the batcher's reads and every catch-up request waited for
        // several scripts each.
        let ([conn, appending], subscribers) = target.connect()?;
        let heads = events::Heads::default();
        let (events, _) = broadcast::channel(4096);
        let stop = CancellationToken::new();
        tokio::spawn(events::listen(
            subscribers,
            conn.clone(),
            heads.clone(),
            events.clone(),
            stop.clone(),
        ));
        let append = Script::new(concat!(
            include_str!("scripts/feedsync.lua"),
            include_str!("scripts/append.lua")
        ));
        let recent = Arc::new(recent::Recent::new(held));
        let folds = Arc::new(fold::Folds::default());
        tokio::spawn(fold::run(conn.clone(), folds.clone(), stop.clone()));
        let appends = group::Appends::new(
            appending,
            append,
            heads.clone(),
            recent.clone(),
            folds,
            stop.clone(),
        );
        Ok(RedisStore {
            conn,
            heads,
            events,
            sub_channels: Mutex::default(),
            indexed: Mutex::default(),
            scripts: Scripts::load(),
            appends,
            stop,
            head_reads: head_reads::HeadReads::default(),
            recent,
        })
    }

    fn conn(&self) -> conn::Conn {
        self.conn.clone()
    }
}

/// Each operation lives in the file of its kind of data; this only routes to them.
#[async_trait]
impl Store for RedisStore {
    async fn append(
        &self,
        channel: &str,
        changes: Vec<NewChange>,
        idempotency: Option<IdempotencyKey>,
        now: OffsetDateTime,
    ) -> Result<Appended, StoreError> {
        log::append(self, channel, changes, idempotency, now).await
    }

    async fn read(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Change>, StoreError> {
        log::range(self, channel, after.saturating_add(1), limit, false).await
    }

    fn held_after(&self, channel: &str, after: u64) -> usize {
        self.recent.held_from(channel, after.saturating_add(1))
    }

    async fn read_newest(&self, channel: &str, limit: usize) -> Result<Vec<Change>, StoreError> {
        log::range(self, channel, 0, limit, true).await
    }

    async fn head(&self, channel: &str) -> Result<ChannelHead, StoreError> {
        log::head(self, channel).await
    }

    fn watch_head(&self, channel: &str) -> watch::Receiver<u64> {
        log::watch_head(self, channel)
    }

    async fn trim(
        &self,
        channel: &str,
        retention: Retention,
        now: OffsetDateTime,
    ) -> Result<u64, StoreError> {
        log::trim(self, channel, retention, now).await
    }

    async fn origin(&self, channel: &str, now: OffsetDateTime) -> Result<Origin, StoreError> {
        log::origin(self, channel, now).await
    }

    async fn resources(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<ResourcePage, StoreError> {
        index::page(self, channel, after, limit).await
    }

    async fn resource(&self, channel: &str, loc: &str) -> Result<Option<Change>, StoreError> {
        index::one(self, channel, loc).await
    }

    async fn resource_count(&self, channel: &str) -> Result<u64, StoreError> {
        index::count(self, channel).await
    }

    async fn resource_marks(&self, channel: &str, every: usize) -> Result<Vec<u64>, StoreError> {
        index::marks(self, channel, every).await
    }

    async fn sync_items(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<SyncPage, StoreError> {
        feedsync::page(self, channel, after, limit).await
    }

    async fn sync_item(&self, channel: &str, loc: &str) -> Result<Option<Synced>, StoreError> {
        feedsync::one(self, channel, loc).await
    }

    async fn sync_conflicts(&self, channel: &str, limit: usize) -> Result<Vec<Synced>, StoreError> {
        feedsync::conflicted(self, channel, limit).await
    }

    async fn append_merged(
        &self,
        channel: &str,
        changes: Vec<MergedChange>,
        now: OffsetDateTime,
    ) -> Result<Option<Appended>, StoreError> {
        feedsync::append_merged(self, channel, changes, now).await
    }

    async fn put_channel(&self, spec: &ChannelSpec) -> Result<(), StoreError> {
        subscriptions::put_channel(self, spec).await
    }

    async fn delete_channel(&self, name: &str) -> Result<bool, StoreError> {
        self.head_reads.forget(name);
        subscriptions::delete_channel(self, name).await
    }

    async fn stored_channel(&self, name: &str) -> Result<Option<ChannelSpec>, StoreError> {
        subscriptions::stored_channel(self, name).await
    }

    async fn stored_channels(&self) -> Result<Vec<ChannelSpec>, StoreError> {
        subscriptions::stored_channels(self).await
    }

    async fn put_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        subscriptions::put(self, sub).await
    }

    async fn delete_subscription(&self, id: &str) -> Result<bool, StoreError> {
        subscriptions::delete(self, id).await
    }

    async fn subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        subscriptions::all(self).await
    }

    async fn put_delivery(&self, sub_id: &str, state: &DeliveryState) -> Result<(), StoreError> {
        let states = [(sub_id.to_string(), state.clone())];
        subscriptions::put_deliveries(self, &states).await
    }

    async fn put_deliveries(&self, states: &[(String, DeliveryState)]) -> Result<(), StoreError> {
        subscriptions::put_deliveries(self, states).await
    }

    async fn delivery(&self, sub_id: &str) -> Result<Option<DeliveryState>, StoreError> {
        subscriptions::delivery(self, sub_id).await
    }

    async fn deliveries(
        &self,
        channel: &str,
        ids: &[String],
    ) -> Result<HashMap<String, DeliveryState>, StoreError> {
        subscriptions::deliveries(self, channel, ids).await
    }

    async fn put_bridge_cursor(
        &self,
        channel: &str,
        bridge: &str,
        seq: u64,
    ) -> Result<(), StoreError> {
        bridges::put(self, channel, bridge, seq).await
    }

    async fn bridge_cursor(&self, channel: &str, bridge: &str) -> Result<Option<u64>, StoreError> {
        bridges::get(self, channel, bridge).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn();
        timed(redis::cmd("PING").query_async::<()>(&mut conn)).await
    }

    fn shared(&self) -> bool {
        true
    }

    async fn try_lease(
        &self,
        channel: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        leases::try_lease(self, channel, holder, ttl).await
    }

    async fn release_lease(&self, channel: &str, holder: &str) -> Result<(), StoreError> {
        leases::release(self, channel, holder).await
    }

    async fn announce(&self, event: &ClusterEvent) -> Result<(), StoreError> {
        events::announce(self, event).await
    }

    fn events(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        Some(self.events.subscribe())
    }
}
