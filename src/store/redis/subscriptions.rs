//! Subscriptions and their delivery state, kept in their channel's slot, plus the one index
//! outside any slot ([`SUB_CHANNELS`]: subscription id → channel) that finds them by id.

use redis::AsyncCommands;
use std::collections::HashMap;

use super::{decode, encode, key, timed, RedisStore};
use crate::model::{ChannelSpec, DeliveryState, Subscription};
use crate::store::StoreError;

/// The one key outside a channel's slot: subscription id → channel.
const SUB_CHANNELS: &str = "changehub:subscription-channels";
/// Channels created at runtime: name → their settings (JSON). Outside any channel's slot.
const CHANNEL_SPECS: &str = "changehub:channel-specs";

pub(super) async fn put_channel(store: &RedisStore, spec: &ChannelSpec) -> Result<(), StoreError> {
    let mut conn = store.conn();
    timed(conn.hset::<_, _, _, ()>(CHANNEL_SPECS, &spec.name, encode(spec)?)).await
}

pub(super) async fn delete_channel(store: &RedisStore, name: &str) -> Result<bool, StoreError> {
    let mut conn = store.conn();
    let removed: u64 = timed(conn.hdel(CHANNEL_SPECS, name)).await?;
    Ok(removed > 0)
}

pub(super) async fn stored_channel(
    store: &RedisStore,
    name: &str,
) -> Result<Option<ChannelSpec>, StoreError> {
    let mut conn = store.conn();
    let found: Option<Vec<u8>> = timed(conn.hget(CHANNEL_SPECS, name)).await?;
    found.map(|v| decode(&v)).transpose()
}

pub(super) async fn stored_channels(store: &RedisStore) -> Result<Vec<ChannelSpec>, StoreError> {
    let mut conn = store.conn();
    let all: HashMap<String, Vec<u8>> = timed(conn.hgetall(CHANNEL_SPECS)).await?;
    all.values().map(|v| decode(v)).collect()
}

fn remember(store: &RedisStore, id: &str, channel: &str) {
    let mut map = store.sub_channels.lock().unwrap_or_else(|e| e.into_inner());
    map.insert(id.to_string(), channel.to_string());
}

/// The channel of subscription `id`, if it exists.
async fn channel_of(store: &RedisStore, id: &str) -> Result<Option<String>, StoreError> {
    {
        let map = store.sub_channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(id) {
            return Ok(Some(c.clone()));
        }
    }
    let mut conn = store.conn();
    let channel: Option<String> = timed(conn.hget(SUB_CHANNELS, id)).await?;
    if let Some(c) = &channel {
        remember(store, id, c);
    }
    Ok(channel)
}

pub(super) async fn put(store: &RedisStore, sub: &Subscription) -> Result<(), StoreError> {
    let mut conn = store.conn();
    // The index first: a subscription is never stored where it cannot be found.
    timed(conn.hset::<_, _, _, ()>(SUB_CHANNELS, &sub.id, &sub.channel)).await?;
    remember(store, &sub.id, &sub.channel);
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

pub(super) async fn delete(store: &RedisStore, id: &str) -> Result<bool, StoreError> {
    let Some(channel) = channel_of(store, id).await? else {
        return Ok(false);
    };
    let mut conn = store.conn();
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
    store
        .sub_channels
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(id);
    Ok(existed > 0)
}

pub(super) async fn all(store: &RedisStore) -> Result<Vec<Subscription>, StoreError> {
    let mut conn = store.conn();
    let index: HashMap<String, String> = timed(conn.hgetall(SUB_CHANNELS)).await?;
    let mut channels: Vec<&String> = index.values().collect();
    channels.sort();
    channels.dedup();
    let mut out = Vec::new();
    for channel in channels {
        let values: Vec<Vec<u8>> = timed(conn.hvals(key(channel, "subs"))).await?;
        for v in values {
            let sub: Subscription = decode(&v)?;
            remember(store, &sub.id, &sub.channel);
            out.push(sub);
        }
    }
    Ok(out)
}

/// Records delivery states: one atomic pipeline per channel (its keys share a slot). States of
/// unknown subscriptions (removed meanwhile) are dropped.
pub(super) async fn put_deliveries(
    store: &RedisStore,
    states: &[(String, DeliveryState)],
) -> Result<(), StoreError> {
    let mut by_channel: HashMap<String, redis::Pipeline> = HashMap::new();
    for (sub_id, state) in states {
        let Some(channel) = channel_of(store, sub_id).await? else {
            continue;
        };
        let pipe = by_channel.entry(channel.clone()).or_insert_with(|| {
            let mut pipe = redis::pipe();
            pipe.atomic();
            pipe
        });
        pipe.hset(key(&channel, "delivery"), sub_id, encode(state)?)
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
    }
    let mut conn = store.conn();
    for pipe in by_channel.values() {
        timed(pipe.query_async::<()>(&mut conn)).await?;
    }
    Ok(())
}

pub(super) async fn delivery(
    store: &RedisStore,
    sub_id: &str,
) -> Result<Option<DeliveryState>, StoreError> {
    let Some(channel) = channel_of(store, sub_id).await? else {
        return Ok(None);
    };
    let mut conn = store.conn();
    let v: Option<Vec<u8>> = timed(conn.hget(key(&channel, "delivery"), sub_id)).await?;
    v.map(|v| decode(&v)).transpose()
}

/// The states of `ids` in `channel`'s delivery hash, in one `HMGET`.
pub(super) async fn deliveries(
    store: &RedisStore,
    channel: &str,
    ids: &[String],
) -> Result<HashMap<String, DeliveryState>, StoreError> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let mut conn = store.conn();
    let values: Vec<Option<Vec<u8>>> = timed(
        redis::cmd("HMGET")
            .arg(key(channel, "delivery"))
            .arg(ids)
            .query_async(&mut conn),
    )
    .await?;
    let mut states = HashMap::with_capacity(ids.len());
    for (id, value) in ids.iter().zip(values) {
        if let Some(v) = value {
            states.insert(id.clone(), decode(&v)?);
        }
    }
    Ok(states)
}
