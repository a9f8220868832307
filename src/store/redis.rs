//! The Redis store: every hub instance that points at the same Redis sees the same log,
//! subscriptions, delivery state and idempotency keys, so instances are disposable.
//!
//! Key layout — every key of channel `c` carries the hash tag `{c}`, so that all of them live
//! in one slot of a Redis Cluster and one script can touch them together:
//!
//! | key | type | what |
//! |---|---|---|
//! | `changehub:{c}:log` | stream | the log; entry id `SEQ-0`, one field `e`: the final datetime as a 23-digit sortable key, then the change as the source sent it (JSON, empty fields left out) |
//! | `changehub:{c}:meta` | hash | `last` (newest seq), `oldest` (first retained seq), `dt` (latest datetime key), `published` (what the owner announced) |
//! | `changehub:{c}:idem` | hash | idempotency key → `at first last accepted fingerprint` |
//! | `changehub:{c}:idem-at` | sorted set | idempotency key by time, to forget them after 24 h |
//! | `changehub:{c}:subs` | hash | subscription id → subscription (JSON) |
//! | `changehub:{c}:delivery` | hash | subscription id → delivery state (JSON) |
//! | `changehub:{c}:expiries` | sorted set | subscription id by lease expiry (unix seconds) |
//! | `changehub:{c}:retries` | sorted set | subscription id by next retry (unix seconds), while one is pending |
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
//! The connection is either one server (`redis://…`, `redis+unix://…`: a [`ConnectionManager`])
//! or a Redis Cluster (`redis+cluster://host:port,host:port,…`: a [`ClusterConnection`] that
//! routes each command, script and transaction to the primary of its slot and follows
//! `MOVED`/`ASK` and topology changes); both behind [`Conn`], so every command and script
//! runs unchanged on either.
//!
//! Appends run as one Lua script (idempotency check, next seqs, datetime clamp, `XADD` with
//! explicit ids, meta update, `PUBLISH`), so concurrent ingest on any number of instances
//! yields gapless seqs. Retention moves `oldest` forward and `XTRIM MINID`s the stream.
//!
//! Instances talk through the pub/sub channel `changehub:events` (`head c last`,
//! `published c first last`, `subscription c id`, `released c`). Pub/sub is at most once, so
//! a listener task also re-reads every known channel's `last` and `published` after each
//! (re)connection and every [`REFRESH`]: a lost message delays, never loses, a notification.
//!
//! Durability is Redis's: an append is answered after Redis executed the script; with
//! `appendonly yes` + `appendfsync always` it is on disk; with `appendfsync everysec` (the
//! usual setting) it survives a crash of Redis (the AOF is written before the reply) but up to
//! a second can be lost if the machine loses power; without AOF, a Redis restart loses
//! everything since the last RDB snapshot. See README.md, "Running on Redis".

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Cmd, Pipeline, RedisFuture, RedisResult, Script, Value};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use time::OffsetDateTime;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::{
    Appended, ChannelHead, ClusterEvent, IdempotencyKey, Store, StoreError, IDEMPOTENCY_TTL,
};
use crate::model::{Change, ChangeType, DeliveryState, Link, NewChange, Retention, Subscription};
use crate::retry::Reconnect;

/// The pub/sub channel of [`ClusterEvent`]s and head moves.
pub const EVENTS: &str = "changehub:events";
/// The one key outside a channel's slot: subscription id → channel.
const SUB_CHANNELS: &str = "changehub:subscription-channels";
/// Every command gives up after this long (the hub answers 503 meanwhile).
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the listener re-reads heads and published seqs, in case a message was lost.
pub const REFRESH: Duration = Duration::from_secs(2);
/// Entries read per `XRANGE` while looking for the age cut-off.
const SCAN_PAGE: usize = 1000;

const APPEND: &str = r#"
-- KEYS: log, meta, idem, idem-at
-- ARGV: idempotency key ('' for none), fingerprint, now (unix s), ttl (s), events channel,
--       channel name, then one entry per change: its datetime key (23 digits) and its JSON
local key = ARGV[1]
local now = tonumber(ARGV[3])
if key ~= '' then
  local rec = redis.call('HGET', KEYS[3], key)
  if rec then
    local at, first, last, accepted, fp = string.match(rec, '^(%d+) (%d+) (%d+) (%d+) (.*)$')
    if at and tonumber(at) + tonumber(ARGV[4]) > now then
      if fp ~= ARGV[2] then return {2, 0, 0, 0} end
      return {1, tonumber(accepted), tonumber(first), tonumber(last)}
    end
  end
end
local meta = redis.call('HMGET', KEYS[2], 'last', 'dt')
local last = tonumber(meta[1] or '0')
local latest = meta[2] or ''
local first = last + 1
local n = #ARGV - 6
for i = 0, n - 1 do
  local e = ARGV[7 + i]
  local d = string.sub(e, 1, 23)
  if d < latest then
    d = latest
    e = latest .. string.sub(e, 24)
  end
  last = last + 1
  redis.call('XADD', KEYS[1], string.format('%d-0', last), 'e', e)
  latest = d
end
if n > 0 then
  redis.call('HSET', KEYS[2], 'last', string.format('%d', last), 'dt', latest)
  redis.call('HSETNX', KEYS[2], 'oldest', '1')
  redis.call('PUBLISH', ARGV[5], string.format('head %s %d', ARGV[6], last))
end
if key ~= '' then
  redis.call('HSET', KEYS[3], key, string.format('%d %d %d %d ', now, first, last, n) .. ARGV[2])
  redis.call('ZADD', KEYS[4], now, key)
end
return {0, n, first, last}
"#;

const TRIM: &str = r#"
-- KEYS: log, meta, idem, idem-at; ARGV: wanted oldest seq, forget keys dated at or before (unix s)
local meta = redis.call('HMGET', KEYS[2], 'oldest', 'last')
local oldest = tonumber(meta[1] or '1')
local last = tonumber(meta[2] or '0')
local want = tonumber(ARGV[1])
if want > last then want = last end
local removed = 0
if want > oldest then
  redis.call('XTRIM', KEYS[1], 'MINID', string.format('%d-0', want))
  redis.call('HSET', KEYS[2], 'oldest', string.format('%d', want))
  removed = want - oldest
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[2])
for _, k in ipairs(expired) do redis.call('HDEL', KEYS[3], k) end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[2])
return removed
"#;

const LEASE: &str = r#"
-- KEYS: owner; ARGV: holder, ttl (ms)
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

const RELEASE: &str = r#"
-- KEYS: owner; ARGV: holder, events channel, channel name
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released ' .. ARGV[3])
end
return 0
"#;

const PUBLISHED: &str = r#"
-- KEYS: meta; ARGV: first, last, events channel, channel name
local p = tonumber(redis.call('HGET', KEYS[1], 'published') or '0')
if tonumber(ARGV[2]) > p then redis.call('HSET', KEYS[1], 'published', ARGV[2]) end
redis.call('PUBLISH', ARGV[3], 'published ' .. ARGV[4] .. ' ' .. ARGV[1] .. ' ' .. ARGV[2])
return 0
"#;

fn key(channel: &str, what: &str) -> String {
    format!("changehub:{{{channel}}}:{what}")
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// Runs one Redis call with the store's deadline.
async fn timed<T>(f: impl Future<Output = RedisResult<T>>) -> Result<T, StoreError> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(e)),
        Err(_) => Err(StoreError::Unavailable(
            "redis did not answer in time".into(),
        )),
    }
}

/// A datetime as a fixed-width ([`DT_KEY_LEN`]) decimal string that sorts like the datetime
/// (Lua compares it as a string; numbers in Lua are doubles and would lose nanoseconds).
const DT_BIAS: i128 = 1_000_000_000_000_000_000_000;
/// The APPEND script relies on this width.
const DT_KEY_LEN: usize = 23;

pub fn datetime_key(t: OffsetDateTime) -> String {
    format!("{:023}", t.unix_timestamp_nanos() + DT_BIAS)
}

fn datetime_from_key(k: &str) -> Result<OffsetDateTime, StoreError> {
    let nanos: i128 = k
        .parse()
        .map_err(|_| StoreError::Corrupt(format!("bad datetime key {k:?}")))?;
    OffsetDateTime::from_unix_timestamp_nanos(nanos - DT_BIAS)
        .map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn encode<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn decode<T: for<'de> serde::Deserialize<'de>>(bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// The URL scheme of a Redis Cluster: `redis+cluster://[user:password@]host:port[,host:port…][/]`
/// names seed nodes (any few of the cluster's nodes; the rest is discovered).
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// Where the store's data lives, as given by `--redis`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One server: any URL the redis crate opens (`redis://host:port/db`, `redis+unix://…`).
    Single(String),
    /// A Redis Cluster: its seed nodes, as `redis://` URLs (credentials repeated on each).
    Cluster(Vec<String>),
}

impl Target {
    /// Reads a `--redis` URL: [`CLUSTER_SCHEME`] for a cluster, anything else for one server.
    pub fn parse(url: &str) -> Result<Target, String> {
        let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) else {
            return Ok(Target::Single(url.to_string()));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (format!("{auth}@"), hosts),
            None => (String::new(), rest),
        };
        let usage = || {
            format!(
                "{url:?}: a cluster URL names seed nodes only, \
                 {CLUSTER_SCHEME}[user:password@]host:port[,host:port…] (no database, no query)"
            )
        };
        if hosts.contains(['/', '?', '#', '@']) {
            return Err(usage());
        }
        let seeds: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{auth}{h}/"))
            .collect();
        if seeds.is_empty() {
            return Err(usage());
        }
        for seed in &seeds {
            redis::Client::open(seed.as_str()).map_err(|e| format!("{}: {e}", usage()))?;
        }
        Ok(Target::Cluster(seeds))
    }
}

/// The store's command connection: one server or a cluster. Both reconnect by themselves;
/// both run the same commands, pipelines and scripts (on a cluster each goes to the primary
/// of its keys' slot — hence the slot rule in the module documentation).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

type Heads = Arc<Mutex<HashMap<String, watch::Sender<u64>>>>;

/// Raises a head watch to `last` (heads never go back).
fn raise(heads: &Heads, channel: &str, last: u64) {
    let mut heads = heads.lock().unwrap_or_else(|e| e.into_inner());
    match heads.get(channel) {
        Some(tx) => {
            tx.send_if_modified(|v| {
                if last > *v {
                    *v = last;
                    true
                } else {
                    false
                }
            });
        }
        None => {
            heads.insert(channel.to_string(), watch::channel(last).0);
        }
    }
}

pub struct RedisStore {
    conn: Conn,
    heads: Heads,
    events: broadcast::Sender<ClusterEvent>,
    /// Subscription id → channel, learnt as subscriptions are stored or read (never changes).
    sub_channels: Mutex<HashMap<String, String>>,
    append: Script,
    trim: Script,
    lease: Script,
    release: Script,
    published: Script,
    /// Stops the listener task when the store goes away.
    stop: CancellationToken,
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
        let target = Target::parse(url).map_err(StoreError::Unavailable)?;
        // Pub/sub goes over a connection of its own, to one server — on a cluster to one of
        // the seed nodes, the next one at each reconnection: classic pub/sub reaches every
        // node's subscribers whichever node a message was published on.
        let (conn, subscribers) = match &target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str()).map_err(unavailable)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(Some(OP_TIMEOUT))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)
                    .map_err(unavailable)?;
                (Conn::Single(conn), vec![client])
            }
            Target::Cluster(seeds) => {
                let client = ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(Duration::from_secs(2))
                    .response_timeout(OP_TIMEOUT)
                    .retries(3)
                    .max_retry_wait(500)
                    .build()
                    .map_err(unavailable)?;
                let config = ClusterConfig::new()
                    .set_connection_timeout(Duration::from_secs(2))
                    .set_response_timeout(OP_TIMEOUT);
                let conn = client.get_pending_async_connection_with_config(config);
                let subscribers = seeds
                    .iter()
                    .map(|s| redis::Client::open(s.as_str()))
                    .collect::<RedisResult<Vec<_>>>()
                    .map_err(unavailable)?;
                (Conn::Cluster(conn), subscribers)
            }
        };
        let heads: Heads = Arc::default();
        let (events, _) = broadcast::channel(4096);
        let stop = CancellationToken::new();
        tokio::spawn(listen(
            subscribers,
            conn.clone(),
            heads.clone(),
            events.clone(),
            stop.clone(),
        ));
        Ok(RedisStore {
            conn,
            heads,
            events,
            sub_channels: Mutex::default(),
            append: Script::new(APPEND),
            trim: Script::new(TRIM),
            lease: Script::new(LEASE),
            release: Script::new(RELEASE),
            published: Script::new(PUBLISHED),
            stop,
        })
    }

    fn conn(&self) -> Conn {
        self.conn.clone()
    }

    fn remember(&self, id: &str, channel: &str) {
        let mut map = self.sub_channels.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(id.to_string(), channel.to_string());
    }

    /// The channel of subscription `id`, if it exists.
    async fn channel_of(&self, id: &str) -> Result<Option<String>, StoreError> {
        {
            let map = self.sub_channels.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = map.get(id) {
                return Ok(Some(c.clone()));
            }
        }
        let mut conn = self.conn();
        let channel: Option<String> = timed(conn.hget(SUB_CHANNELS, id)).await?;
        if let Some(c) = &channel {
            self.remember(id, c);
        }
        Ok(channel)
    }

    async fn range(
        &self,
        channel: &str,
        from: u64,
        limit: usize,
        newest: bool,
    ) -> Result<Vec<Change>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn();
        let log = key(channel, "log");
        let mut cmd = if newest {
            let mut c = redis::cmd("XREVRANGE");
            c.arg(&log).arg("+").arg("-");
            c
        } else {
            let mut c = redis::cmd("XRANGE");
            c.arg(&log).arg(format!("{from}-0")).arg("+");
            c
        };
        cmd.arg("COUNT").arg(limit);
        let entries: Vec<(String, Vec<Vec<u8>>)> = timed(cmd.query_async(&mut conn)).await?;
        let mut out = Vec::with_capacity(entries.len());
        for (id, fields) in entries {
            out.push(entry_to_change(&id, &fields)?);
        }
        if newest {
            out.reverse();
        }
        Ok(out)
    }
}

/// A change as the log entry keeps it: the source's [`NewChange`], without its empty fields
/// (a third smaller than plain serde output, and Redis's time per append grows with size).
#[derive(serde::Serialize)]
struct Stored<'a> {
    loc: &'a str,
    change: ChangeType,
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    datetime: Option<OffsetDateTime>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    lastmod: Option<OffsetDateTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hash: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    length: Option<u64>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    media_type: Option<&'a str>,
    #[serde(skip_serializing_if = "<[Link]>::is_empty")]
    links: &'a [Link],
}

impl<'a> From<&'a NewChange> for Stored<'a> {
    fn from(c: &'a NewChange) -> Stored<'a> {
        Stored {
            loc: &c.loc,
            change: c.change,
            datetime: c.datetime,
            lastmod: c.lastmod,
            hash: c.hash.as_deref(),
            length: c.length,
            media_type: c.media_type.as_deref(),
            links: &c.links,
        }
    }
}

/// Rebuilds a change from its stream entry.
fn entry_to_change(id: &str, fields: &[Vec<u8>]) -> Result<Change, StoreError> {
    let seq: u64 = id
        .split_once('-')
        .and_then(|(s, _)| s.parse().ok())
        .ok_or_else(|| StoreError::Corrupt(format!("bad entry id {id:?}")))?;
    let entry = fields
        .chunks(2)
        .find_map(|pair| match pair {
            [name, value] if name.as_slice() == b"e" => Some(value),
            _ => None,
        })
        .ok_or_else(|| StoreError::Corrupt(format!("entry {id} lacks its change")))?;
    if entry.len() < DT_KEY_LEN {
        return Err(StoreError::Corrupt(format!("entry {id} is too short")));
    }
    let (d, c) = entry.split_at(DT_KEY_LEN);
    let d = std::str::from_utf8(d).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let new: NewChange = decode(c)?;
    // Keep the source's own datetime (and its offset) when it was not raised.
    let datetime = match new.datetime {
        Some(own) if datetime_key(own) == d => own,
        _ => datetime_from_key(d)?,
    };
    Ok(Change::from_new(seq, new, datetime))
}

/// Follows `changehub:events` on a dedicated pub/sub connection, reconnecting with backoff
/// (to the next of `servers` each time: one server, or a cluster's seed nodes); after every
/// (re)connection and every [`REFRESH`] re-reads what a lost message could hide.
async fn listen(
    servers: Vec<redis::Client>,
    conn: Conn,
    heads: Heads,
    events: broadcast::Sender<ClusterEvent>,
    stop: CancellationToken,
) {
    let mut backoff = Reconnect::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut next = 0;
    loop {
        let client = &servers[next % servers.len()];
        next += 1;
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            c = tokio::time::timeout(Duration::from_secs(3), client.get_async_pubsub()) => c,
        };
        let mut pubsub = match connected {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "redis pub/sub: cannot connect; retrying");
                if backoff.sleep_or_stop(&stop).await {
                    return;
                }
                continue;
            }
            Err(_) => {
                if backoff.sleep_or_stop(&stop).await {
                    return;
                }
                continue;
            }
        };
        if let Err(e) = pubsub.subscribe(EVENTS).await {
            tracing::debug!(error = %e, "redis pub/sub: cannot subscribe; retrying");
            if backoff.sleep_or_stop(&stop).await {
                return;
            }
            continue;
        }
        backoff.reset();
        refresh(&conn, &heads, &events).await;
        let mut messages = pubsub.into_on_message();
        let mut tick = tokio::time::interval(REFRESH);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                msg = messages.next() => match msg {
                    Some(msg) => {
                        let payload: Vec<u8> = msg.get_payload_bytes().to_vec();
                        handle_message(&payload, &heads, &events);
                    }
                    None => {
                        tracing::warn!("redis pub/sub connection lost; reconnecting");
                        break;
                    }
                },
                _ = tick.tick() => refresh(&conn, &heads, &events).await,
            }
        }
        if backoff.sleep_or_stop(&stop).await {
            return;
        }
    }
}

fn handle_message(payload: &[u8], heads: &Heads, events: &broadcast::Sender<ClusterEvent>) {
    let Ok(text) = std::str::from_utf8(payload) else {
        return;
    };
    let parts: Vec<&str> = text.split(' ').collect();
    let num = |s: &str| s.parse::<u64>().ok();
    match parts.as_slice() {
        ["head", channel, last] => {
            if let Some(last) = num(last) {
                raise(heads, channel, last);
            }
        }
        ["published", channel, first, last] => {
            if let (Some(first), Some(last)) = (num(first), num(last)) {
                let _ = events.send(ClusterEvent::Published {
                    channel: channel.to_string(),
                    first,
                    last,
                });
            }
        }
        ["subscription", channel, id] => {
            let _ = events.send(ClusterEvent::Subscription {
                channel: channel.to_string(),
                id: id.to_string(),
            });
        }
        ["released", channel] => {
            let _ = events.send(ClusterEvent::Released {
                channel: channel.to_string(),
            });
        }
        _ => tracing::debug!(message = text, "unknown event"),
    }
}

/// Re-reads `last` and `published` of every channel this process follows.
async fn refresh(conn: &Conn, heads: &Heads, events: &broadcast::Sender<ClusterEvent>) {
    let channels: Vec<String> = {
        let heads = heads.lock().unwrap_or_else(|e| e.into_inner());
        heads.keys().cloned().collect()
    };
    let mut conn = conn.clone();
    for channel in channels {
        let got: Result<(Option<u64>, Option<u64>), StoreError> = timed(
            redis::cmd("HMGET")
                .arg(key(&channel, "meta"))
                .arg("last")
                .arg("published")
                .query_async(&mut conn),
        )
        .await;
        match got {
            Ok((last, published)) => {
                raise(heads, &channel, last.unwrap_or(0));
                if let Some(p) = published {
                    let _ = events.send(ClusterEvent::Published {
                        channel,
                        first: 0,
                        last: p,
                    });
                }
            }
            Err(_) => return, // Redis is down: the next tick or reconnection tries again
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn append(
        &self,
        channel: &str,
        changes: Vec<NewChange>,
        idempotency: Option<IdempotencyKey>,
        now: OffsetDateTime,
    ) -> Result<Appended, StoreError> {
        let mut invocation = self.append.prepare_invoke();
        invocation
            .key(key(channel, "log"))
            .key(key(channel, "meta"))
            .key(key(channel, "idem"))
            .key(key(channel, "idem-at"));
        match &idempotency {
            Some(k) => invocation.arg(&k.key).arg(&k.fingerprint),
            None => invocation.arg("").arg(""),
        };
        invocation
            .arg(now.unix_timestamp())
            .arg(IDEMPOTENCY_TTL.as_secs())
            .arg(EVENTS)
            .arg(channel);
        for change in &changes {
            let mut entry = datetime_key(change.datetime.unwrap_or(now)).into_bytes();
            serde_json::to_writer(&mut entry, &Stored::from(change))
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            invocation.arg(entry);
        }
        let mut conn = self.conn();
        let (status, accepted, first, last): (u8, u64, u64, u64) =
            timed(invocation.invoke_async(&mut conn)).await?;
        match status {
            0 => {
                raise(&self.heads, channel, last);
                Ok(Appended {
                    accepted: accepted as usize,
                    first,
                    last,
                    replayed: false,
                })
            }
            1 => Ok(Appended {
                accepted: accepted as usize,
                first,
                last,
                replayed: true,
            }),
            _ => Err(StoreError::IdempotencyConflict),
        }
    }

    async fn read(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Change>, StoreError> {
        self.range(channel, after.saturating_add(1), limit, false)
            .await
    }

    async fn read_newest(&self, channel: &str, limit: usize) -> Result<Vec<Change>, StoreError> {
        self.range(channel, 0, limit, true).await
    }

    async fn head(&self, channel: &str) -> Result<ChannelHead, StoreError> {
        let mut conn = self.conn();
        let (oldest, last): (Option<u64>, Option<u64>) = timed(
            redis::cmd("HMGET")
                .arg(key(channel, "meta"))
                .arg("oldest")
                .arg("last")
                .query_async(&mut conn),
        )
        .await?;
        let last = last.unwrap_or(0);
        raise(&self.heads, channel, last);
        Ok(ChannelHead {
            oldest: oldest.unwrap_or(1),
            last,
        })
    }

    fn watch_head(&self, channel: &str) -> watch::Receiver<u64> {
        let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = heads.get(channel) {
            return tx.subscribe();
        }
        // Unknown here so far: start from 0 and learn the head from Redis right away (the
        // listener also re-reads it every few seconds).
        let (tx, rx) = watch::channel(0);
        heads.insert(channel.to_string(), tx);
        drop(heads);
        let conn = self.conn();
        let heads = self.heads.clone();
        let channel = channel.to_string();
        tokio::spawn(async move {
            let mut conn = conn;
            let last: Result<Option<u64>, StoreError> =
                timed(conn.hget(key(&channel, "meta"), "last")).await;
            if let Ok(last) = last {
                raise(&heads, &channel, last.unwrap_or(0));
            }
        });
        rx
    }

    async fn trim(
        &self,
        channel: &str,
        retention: Retention,
        now: OffsetDateTime,
    ) -> Result<u64, StoreError> {
        let head = self.head(channel).await?;
        let retained = (head.last + 1).saturating_sub(head.oldest);
        let mut wanted = head.oldest + retained.saturating_sub(retention.max_changes);
        if let Some(age) = retention.max_age {
            let cutoff = datetime_key(now - age);
            // Walk forward past changes older than the cut-off; the newest always stays.
            'scan: while wanted < head.last {
                let page = self
                    .range(
                        channel,
                        wanted,
                        SCAN_PAGE.min((head.last - wanted) as usize),
                        false,
                    )
                    .await?;
                if page.is_empty() {
                    break;
                }
                for change in page {
                    if change.seq >= head.last || datetime_key(change.datetime) >= cutoff {
                        break 'scan;
                    }
                    wanted = change.seq + 1;
                }
            }
        }
        let forget_before = (now - IDEMPOTENCY_TTL).unix_timestamp();
        let mut conn = self.conn();
        let removed: u64 = timed(
            self.trim
                .key(key(channel, "log"))
                .key(key(channel, "meta"))
                .key(key(channel, "idem"))
                .key(key(channel, "idem-at"))
                .arg(wanted)
                .arg(forget_before)
                .invoke_async(&mut conn),
        )
        .await?;
        Ok(removed)
    }

    async fn put_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        let mut conn = self.conn();
        // The index first: a subscription is never stored where it cannot be found.
        timed(conn.hset::<_, _, _, ()>(SUB_CHANNELS, &sub.id, &sub.channel)).await?;
        self.remember(&sub.id, &sub.channel);
        timed(
            redis::pipe()
                .atomic()
                .hset(key(&sub.channel, "subs"), &sub.id, encode(sub)?)
                .ignore()
                .zadd(
                    key(&sub.channel, "expiries"),
                    &sub.id,
                    sub.expires_at.unix_timestamp(),
                )
                .ignore()
                .query_async::<()>(&mut conn),
        )
        .await
    }

    async fn delete_subscription(&self, id: &str) -> Result<bool, StoreError> {
        let Some(channel) = self.channel_of(id).await? else {
            return Ok(false);
        };
        let mut conn = self.conn();
        let (existed,): (u64,) = timed(
            redis::pipe()
                .atomic()
                .hdel(key(&channel, "subs"), id)
                .hdel(key(&channel, "delivery"), id)
                .ignore()
                .zrem(key(&channel, "expiries"), id)
                .ignore()
                .zrem(key(&channel, "retries"), id)
                .ignore()
                .query_async(&mut conn),
        )
        .await?;
        timed(conn.hdel::<_, _, ()>(SUB_CHANNELS, id)).await?;
        self.sub_channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        Ok(existed > 0)
    }

    async fn subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        let mut conn = self.conn();
        let index: HashMap<String, String> = timed(conn.hgetall(SUB_CHANNELS)).await?;
        let mut channels: Vec<&String> = index.values().collect();
        channels.sort();
        channels.dedup();
        let mut out = Vec::new();
        for channel in channels {
            let values: Vec<Vec<u8>> = timed(conn.hvals(key(channel, "subs"))).await?;
            for v in values {
                let sub: Subscription = decode(&v)?;
                self.remember(&sub.id, &sub.channel);
                out.push(sub);
            }
        }
        Ok(out)
    }

    async fn put_delivery(&self, sub_id: &str, state: &DeliveryState) -> Result<(), StoreError> {
        // Unknown subscription (removed meanwhile): nothing to record.
        let Some(channel) = self.channel_of(sub_id).await? else {
            return Ok(());
        };
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hset(key(&channel, "delivery"), sub_id, encode(state)?)
            .ignore();
        match &state.pending {
            Some(p) => pipe
                .zadd(
                    key(&channel, "retries"),
                    sub_id,
                    p.next_attempt_at.unix_timestamp(),
                )
                .ignore(),
            None => pipe.zrem(key(&channel, "retries"), sub_id).ignore(),
        };
        let mut conn = self.conn();
        timed(pipe.query_async::<()>(&mut conn)).await
    }

    async fn delivery(&self, sub_id: &str) -> Result<Option<DeliveryState>, StoreError> {
        let Some(channel) = self.channel_of(sub_id).await? else {
            return Ok(None);
        };
        let mut conn = self.conn();
        let v: Option<Vec<u8>> = timed(conn.hget(key(&channel, "delivery"), sub_id)).await?;
        v.map(|v| decode(&v)).transpose()
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
        let mut conn = self.conn();
        let got: u8 = timed(
            self.lease
                .key(key(channel, "owner"))
                .arg(holder)
                .arg(ttl.as_millis() as u64)
                .invoke_async(&mut conn),
        )
        .await?;
        Ok(got == 1)
    }

    async fn release_lease(&self, channel: &str, holder: &str) -> Result<(), StoreError> {
        let mut conn = self.conn();
        timed(
            self.release
                .key(key(channel, "owner"))
                .arg(holder)
                .arg(EVENTS)
                .arg(channel)
                .invoke_async::<()>(&mut conn),
        )
        .await
    }

    async fn announce(&self, event: &ClusterEvent) -> Result<(), StoreError> {
        let mut conn = self.conn();
        match event {
            ClusterEvent::Published {
                channel,
                first,
                last,
            } => {
                timed(
                    self.published
                        .key(key(channel, "meta"))
                        .arg(first)
                        .arg(last)
                        .arg(EVENTS)
                        .arg(channel)
                        .invoke_async::<()>(&mut conn),
                )
                .await
            }
            ClusterEvent::Subscription { channel, id } => {
                timed(conn.publish::<_, _, ()>(EVENTS, format!("subscription {channel} {id}")))
                    .await
            }
            ClusterEvent::Released { channel } => {
                timed(conn.publish::<_, _, ()>(EVENTS, format!("released {channel}"))).await
            }
        }
    }

    fn events(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        Some(self.events.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_changes_read_back_whole() {
        let full = NewChange {
            loc: "http://example.com/a".into(),
            change: ChangeType::Deleted,
            datetime: Some(crate::model::parse_w3c_datetime("2024-01-01T01:00:00+01:00").unwrap()),
            lastmod: Some(crate::model::parse_w3c_datetime("2023-01-01T00:00:00Z").unwrap()),
            hash: Some("md5:1e0d5cb8ef6ba40c99b14c0237be735e".into()),
            length: Some(8),
            media_type: Some("text/plain".into()),
            links: vec![Link {
                rel: "alternate".into(),
                href: "http://example.com/a.txt".into(),
                attrs: [("type".to_string(), "text/plain".to_string())].into(),
            }],
        };
        let bare = NewChange {
            loc: "http://example.com/b".into(),
            change: ChangeType::Created,
            datetime: None,
            lastmod: None,
            hash: None,
            length: None,
            media_type: None,
            links: vec![],
        };
        for c in [full, bare] {
            let bytes = serde_json::to_vec(&Stored::from(&c)).unwrap();
            assert_eq!(decode::<NewChange>(&bytes).unwrap(), c);
        }
    }

    #[test]
    fn cluster_urls_name_seed_nodes() {
        assert_eq!(
            Target::parse("redis://127.0.0.1:6379/2").unwrap(),
            Target::Single("redis://127.0.0.1:6379/2".into())
        );
        assert_eq!(
            Target::parse("redis+unix:///tmp/r.sock").unwrap(),
            Target::Single("redis+unix:///tmp/r.sock".into())
        );
        assert_eq!(
            Target::parse("redis+cluster://10.0.0.1:7000,10.0.0.2:7001/").unwrap(),
            Target::Cluster(vec![
                "redis://10.0.0.1:7000/".into(),
                "redis://10.0.0.2:7001/".into()
            ])
        );
        assert_eq!(
            Target::parse("redis+cluster://u:p%40ss@h1:7000,h2:7000").unwrap(),
            Target::Cluster(vec![
                "redis://u:p%40ss@h1:7000/".into(),
                "redis://u:p%40ss@h2:7000/".into()
            ])
        );
        for bad in [
            "redis+cluster://",
            "redis+cluster://,",
            "redis+cluster://h1:7000/1",
            "redis+cluster://h1:7000?protocol=3",
            "redis+cluster://h1:notaport",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn datetime_keys_sort_like_datetimes() {
        let a = crate::model::parse_w3c_datetime("1969-12-31T23:59:59Z").unwrap();
        let b = crate::model::parse_w3c_datetime("2024-01-01T00:00:00.5Z").unwrap();
        let c = crate::model::parse_w3c_datetime("2024-01-01T00:00:00.500000001Z").unwrap();
        assert!(datetime_key(a) < datetime_key(b));
        assert!(datetime_key(b) < datetime_key(c));
        assert_eq!(datetime_from_key(&datetime_key(c)).unwrap(), c);
        assert_eq!(datetime_key(a).len(), DT_KEY_LEN);
        assert_eq!(datetime_key(c).len(), DT_KEY_LEN);
        let far = crate::model::parse_w3c_datetime("9999-12-31T23:59:59.999999999Z").unwrap();
        let early = crate::model::parse_w3c_datetime("0001-01-01T00:00:00Z").unwrap();
        assert_eq!(datetime_key(far).len(), DT_KEY_LEN);
        assert_eq!(datetime_key(early).len(), DT_KEY_LEN);
    }
}
