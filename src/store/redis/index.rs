//! The resource index on Redis: `changehub:{c}:res` (hash: loc → the log entry of its latest
//! change) and `changehub:{c}:res-seq` (sorted set: loc scored by that change's seq), written
//! by the append script with the log entry, in the channel's slot.
//!
//! A channel whose log was written before the index existed has no `indexed` field in its
//! meta; the first read of its index completes it from the retained log (`backfill.lua`, a
//! chunk at a time, never over a newer entry).

use redis::AsyncCommands;

use super::log::decode_entry;
use super::{key, timed, RedisStore};
use crate::model::Change;
use crate::store::{ResourcePage, StoreError};

/// Log entries indexed per backfill call.
const BACKFILL_CHUNK: usize = 1000;
/// Most resources read per script call (a script holds Redis while it runs).
const READ_CHUNK: usize = 5000;

pub(super) async fn page(
    store: &RedisStore,
    channel: &str,
    after: u64,
    limit: usize,
) -> Result<ResourcePage, StoreError> {
    ensure_indexed(store, channel).await?;
    super::fold::up_to_log(store, channel).await?;
    let mut page = ResourcePage::default();
    let mut cursor = after;
    let mut first_call = true;
    while page.resources.len() < limit {
        let want = (limit - page.resources.len()).min(READ_CHUNK);
        let mut conn = store.conn();
        let reply: Vec<redis::Value> = timed(
            store
                .scripts
                .resources
                .key(key(channel, "meta"))
                .key(key(channel, "res"))
                .key(key(channel, "res-seq"))
                .arg(cursor)
                .arg(want)
                .invoke_async(&mut conn),
        )
        .await?;
        let mut values = reply.into_iter();
        let last: u64 = number(values.next())?;
        if first_call {
            page.last = last;
            first_call = false;
        }
        let mut got = 0;
        while let Some(seq) = values.next() {
            let seq = number(Some(seq))?;
            let entry: Vec<u8> = match values.next() {
                Some(redis::Value::BulkString(bytes)) => bytes,
                _ => return Err(StoreError::Corrupt(format!("no index entry for seq {seq}"))),
            };
            page.resources.push(decode_entry(seq, &entry)?);
            cursor = seq;
            got += 1;
        }
        if got < want {
            break;
        }
    }
    Ok(page)
}

/// The index entry of `loc`: its log entry (`res`) and seq (`res-seq`), read together.
pub(super) async fn one(
    store: &RedisStore,
    channel: &str,
    loc: &str,
) -> Result<Option<Change>, StoreError> {
    ensure_indexed(store, channel).await?;
    super::fold::up_to_log(store, channel).await?;
    let mut conn = store.conn();
    let (entry, seq): (Option<Vec<u8>>, Option<u64>) = timed(
        redis::pipe()
            .atomic()
            .hget(key(channel, "res"), loc)
            .zscore(key(channel, "res-seq"), loc)
            .query_async(&mut conn),
    )
    .await?;
    match (entry, seq) {
        (Some(entry), Some(seq)) => Ok(Some(decode_entry(seq, &entry)?)),
        _ => Ok(None),
    }
}

pub(super) async fn count(store: &RedisStore, channel: &str) -> Result<u64, StoreError> {
    ensure_indexed(store, channel).await?;
    super::fold::up_to_log(store, channel).await?;
    let mut conn = store.conn();
    timed(conn.zcard(key(channel, "res-seq"))).await
}

pub(super) async fn marks(
    store: &RedisStore,
    channel: &str,
    every: usize,
) -> Result<Vec<u64>, StoreError> {
    let total = count(store, channel).await?;
    if every == 0 {
        return Ok(Vec::new());
    }
    let ranks: Vec<u64> = (1..)
        .map(|k| k * every as u64)
        .take_while(|&r| r <= total)
        .collect();
    let mut out = Vec::with_capacity(ranks.len());
    let mut conn = store.conn();
    for chunk in ranks.chunks(500) {
        let mut pipe = redis::pipe();
        for rank in chunk {
            let at = rank - 1;
            pipe.cmd("ZRANGE")
                .arg(key(channel, "res-seq"))
                .arg(at)
                .arg(at)
                .arg("WITHSCORES");
        }
        let replies: Vec<Vec<(String, u64)>> = timed(pipe.query_async(&mut conn)).await?;
        out.extend(replies.into_iter().flatten().map(|(_, seq)| seq));
    }
    Ok(out)
}

/// Completes the index of a channel logged before the index existed. Once a channel's index
/// is known complete, this process does not ask Redis again.
pub(super) async fn ensure_indexed(store: &RedisStore, channel: &str) -> Result<(), StoreError> {
    let known = store
        .indexed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(channel);
    if known {
        return Ok(());
    }
    complete_index(store, channel).await?;
    store
        .indexed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(channel.to_string());
    Ok(())
}

async fn complete_index(store: &RedisStore, channel: &str) -> Result<(), StoreError> {
    let mut conn = store.conn();
    let (indexed, oldest): (Option<String>, Option<u64>) = timed(
        redis::cmd("HMGET")
            .arg(key(channel, "meta"))
            .arg("indexed")
            .arg("oldest")
            .query_async(&mut conn),
    )
    .await?;
    if indexed.is_some() {
        return Ok(());
    }
    let mut from = oldest.unwrap_or(1);
    loop {
        let next: u64 = timed(
            store
                .scripts
                .backfill
                .key(key(channel, "log"))
                .key(key(channel, "meta"))
                .key(key(channel, "res"))
                .key(key(channel, "res-seq"))
                .arg(from)
                .arg(BACKFILL_CHUNK)
                .invoke_async(&mut conn),
        )
        .await?;
        if next == 0 {
            tracing::info!(%channel, "resource index built from the log");
            return Ok(());
        }
        from = next;
    }
}

/// A number in a script's reply (Lua returns seqs as strings or integers).
pub(super) fn number(value: Option<redis::Value>) -> Result<u64, StoreError> {
    let parsed = match &value {
        Some(redis::Value::Int(n)) => u64::try_from(*n).ok(),
        Some(redis::Value::BulkString(b)) => {
            std::str::from_utf8(b).ok().and_then(|s| s.parse().ok())
        }
        Some(redis::Value::SimpleString(s)) => s.parse().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| StoreError::Corrupt(format!("unexpected reply {value:?}")))
}
