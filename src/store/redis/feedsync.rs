//! FeedSync items on Redis: `changehub:{c}:sx` (hash: loc → the item's `SyncState` as JSON,
//! or counted: `UPDATES PUBLISHER` for the common item, one update after another by one
//! publisher, whose other fields the resource's latest change implies) and
//! `changehub:{c}:sx-conflicts` (sorted set, all scores 0: the locs whose items carry
//! conflicts, in loc order), in the channel's slot.
//!
//! The items of a plain append's changes are updated after it, with the resource index
//! (`fold.rs`). While some item carries conflicts, the append script updates the items of the
//! changes it logs itself (`scripts/feedsync.lua`, loaded in front of `append.lua`), and adds
//! the number of conflicts to a log entry as its last field ([`tail_conflicts`] reads it
//! back). A merge runs `feedsync_merge.lua`, then `append.lua` as a
//! function, as one script: the seqs it read are checked first, then the append runs with the
//! merged items in place of the update.

use redis::Script;
use std::sync::LazyLock;
use time::OffsetDateTime;

use super::events::raise;
use super::log::{append_call, decode_entry, outcome, run_script, Answer, Request};
use super::{decode, key, timed, timed_write, RedisStore};
use crate::model::feedsync::{self, MergedChange, SyncState, Synced};
use crate::store::{Appended, StoreError, SyncPage};

/// The merge script.
static MERGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/feedsync.lua"),
        include_str!("scripts/feedsync_merge.lua"),
        "local function sx_append()\n",
        include_str!("scripts/append.lua"),
        "\nend\nreturn sx_append()\n"
    ))
});

/// Reads a page of resources with their items.
static PAGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/feedsync_page.lua")));

/// Most resources read per script call.
const READ_CHUNK: usize = 1000;

/// The number of conflicts the append script put at the end of a log entry's JSON
/// (`…,"conflicts":N}`), 0 when it put none.
pub(super) fn tail_conflicts(json: &[u8]) -> u32 {
    let Some(body) = json.strip_suffix(b"}") else {
        return 0;
    };
    let digits = body.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    let (head, number) = body.split_at(body.len() - digits);
    if digits == 0 || !head.ends_with(b",\"conflicts\":") {
        return 0;
    }
    std::str::from_utf8(number)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The item of a resource whose latest change is `change`: stored as JSON, stored counted, or
/// (none stored) implied by that change.
fn item(change: &crate::model::Change, stored: &[u8]) -> Result<SyncState, StoreError> {
    match stored.first() {
        None => Ok(feedsync::implied(change)),
        Some(b'{') => decode(stored),
        Some(_) => counted(change, stored),
    }
}

/// A counted item (`UPDATES PUBLISHER`, see `scripts/feedsync.lua`): the item of `change`'s
/// publisher with one history entry, whose sequence is the number of updates; the rest is what
/// `change`, the resource's latest change, implies.
pub(super) fn counted(
    change: &crate::model::Change,
    stored: &[u8],
) -> Result<SyncState, StoreError> {
    let bad = || {
        StoreError::Corrupt(format!(
            "the FeedSync item of {} is not readable: {:?}",
            change.loc,
            String::from_utf8_lossy(stored)
        ))
    };
    let text = std::str::from_utf8(stored).map_err(|_| bad())?;
    let (updates, by) = text.split_once(' ').ok_or_else(bad)?;
    let updates: u32 = updates.parse().map_err(|_| bad())?;
    let mut sync = feedsync::implied(change);
    let own = sync.history.first().and_then(|h| h.by.as_deref());
    if updates == 0 || own != Some(by) {
        return Err(bad());
    }
    sync.updates = updates;
    sync.history[0].sequence = updates;
    Ok(sync)
}

pub(super) async fn page(
    store: &RedisStore,
    channel: &str,
    after: u64,
    limit: usize,
) -> Result<SyncPage, StoreError> {
    super::index::ensure_indexed(store, channel).await?;
    super::fold::up_to_log(store, channel).await?;
    let mut page = SyncPage::default();
    let mut cursor = after;
    let mut first_call = true;
    while page.items.len() < limit {
        let want = (limit - page.items.len()).min(READ_CHUNK);
        let mut conn = store.conn();
        let reply: Vec<redis::Value> = timed(
            PAGE.key(key(channel, "meta"))
                .key(key(channel, "res"))
                .key(key(channel, "res-seq"))
                .key(key(channel, "sx"))
                .arg(cursor)
                .arg(want)
                .invoke_async(&mut conn),
        )
        .await?;
        let mut values = reply.into_iter();
        let last = super::index::number(values.next())?;
        if first_call {
            page.last = last;
            first_call = false;
        }
        let mut got = 0;
        while let Some(seq) = values.next() {
            let seq = super::index::number(Some(seq))?;
            let (entry, stored) = match (values.next(), values.next()) {
                (Some(redis::Value::BulkString(e)), Some(redis::Value::BulkString(s))) => (e, s),
                _ => return Err(StoreError::Corrupt(format!("no index entry for seq {seq}"))),
            };
            let change = decode_entry(seq, &entry)?;
            let sync = item(&change, &stored)?;
            page.items.push(Synced { change, sync });
            cursor = seq;
            got += 1;
        }
        if got < want {
            break;
        }
    }
    Ok(page)
}

/// Resource `loc` with its item, read together.
pub(super) async fn one(
    store: &RedisStore,
    channel: &str,
    loc: &str,
) -> Result<Option<Synced>, StoreError> {
    super::index::ensure_indexed(store, channel).await?;
    super::fold::up_to_log(store, channel).await?;
    let mut conn = store.conn();
    let (entry, seq, stored): (Option<Vec<u8>>, Option<u64>, Option<Vec<u8>>) = timed(
        redis::pipe()
            .atomic()
            .hget(key(channel, "res"), loc)
            .zscore(key(channel, "res-seq"), loc)
            .hget(key(channel, "sx"), loc)
            .query_async(&mut conn),
    )
    .await?;
    let (Some(entry), Some(seq)) = (entry, seq) else {
        return Ok(None);
    };
    let change = decode_entry(seq, &entry)?;
    let sync = item(&change, stored.as_deref().unwrap_or_default())?;
    Ok(Some(Synced { change, sync }))
}

pub(super) async fn conflicted(
    store: &RedisStore,
    channel: &str,
    limit: usize,
) -> Result<Vec<Synced>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    super::fold::up_to_log(store, channel).await?;
    let mut conn = store.conn();
    let locs: Vec<String> = timed(
        redis::cmd("ZRANGE")
            .arg(key(channel, "sx-conflicts"))
            .arg(0)
            .arg(limit - 1)
            .query_async(&mut conn),
    )
    .await?;
    let mut out = Vec::with_capacity(locs.len());
    for loc in locs {
        out.extend(one(store, channel, &loc).await?);
    }
    Ok(out)
}

pub(super) async fn append_merged(
    store: &RedisStore,
    channel: &str,
    changes: Vec<MergedChange>,
    now: OffsetDateTime,
) -> Result<Option<Appended>, StoreError> {
    let mut merged = Vec::with_capacity(changes.len());
    let mut news = Vec::with_capacity(changes.len());
    for m in changes {
        let sync = serde_json::to_vec(&m.sync).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        merged.push((m.expected, sync));
        news.push(m.change);
    }
    let request = Request::new(news, None, now)?;
    // The merge script refuses while the index is behind the log (answered as a moved loc).
    super::fold::up_to_log(store, channel).await?;
    let mut call = append_call(&MERGE, channel, &[&request], true);
    for (expected, sync) in &merged {
        call.arg(expected).arg(sync);
    }
    call.arg(merged.len());
    let mut conn = store.conn();
    let reply: redis::Value = timed_write(run_script(&MERGE, &call, &mut conn)).await?;
    let answer = Answer::read(reply, 1)?.numbers;
    if answer.first() == Some(&3) {
        return Ok(None);
    }
    // Merged changes are not kept for reading back (recent.rs): the batcher reads them from
    // the log.
    let appended = outcome(&answer)?;
    raise(&store.heads, channel, appended.last);
    Ok(Some(appended))
}

#[cfg(test)]
mod tests {
    use super::tail_conflicts;

    #[test]
    fn the_conflicts_the_script_appended_are_read_back() {
        assert_eq!(tail_conflicts(br#"{"loc":"x","conflicts":12}"#), 12);
        assert_eq!(tail_conflicts(br#"{"loc":"x","source":"a"}"#), 0);
        assert_eq!(tail_conflicts(br#"{"links":[{"conflicts":"3"}]}"#), 0);
        assert_eq!(tail_conflicts(br#"{"loc":"x","conflicts":}"#), 0);
    }
}
