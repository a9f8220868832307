//! The embedded store's FeedSync items: the sync metadata of every resource, written by the
//! append that logs the resource's change, in the same redb transaction (like the resource
//! index, `index.rs`).
//!
//! [`ITEMS`] maps (channel, loc) to the item's [`SyncState`] as JSON; [`CONFLICTS`] maps
//! (channel, loc) to the seq of the latest change of each resource whose item carries
//! conflicts. A resource indexed before the hub kept items has none: its item is the one its
//! latest change implies ([`feedsync::implied`]), until its next change creates it.
//!
//! A merge ([`append_merged`]) runs in a write transaction of its own: it checks that no
//! resource it touches changed since it was read, appends through the ordinary append (which
//! updates the items as the hub's own changes would), then gives each item its merged state
//! and each logged change its number of conflicts.

use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, Table, TableDefinition};
use redb::{TableError, WriteTransaction};
use time::OffsetDateTime;
use tokio::sync::oneshot;

use super::index::{seq_of, IndexWriter, RESOURCES, RESOURCE_ORDER};
use super::{
    append_in, decode, encode, failed, AppendJob, AppendTables, EmbeddedStore, CHANGES, CHANNELS,
};
use crate::model::feedsync::{self, MergedChange, SyncState, Synced};
use crate::model::{Change, ChangeType};
use crate::store::{Appended, StoreError, SyncPage};

pub(super) const ITEMS: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("feedsync-items");
pub(super) const CONFLICTS: TableDefinition<(&str, &str), u64> =
    TableDefinition::new("feedsync-conflicts");

/// Writes items inside a write transaction.
pub(super) struct SyncWriter<'txn> {
    items: Table<'txn, (&'static str, &'static str), &'static [u8]>,
    conflicts: Table<'txn, (&'static str, &'static str), u64>,
}

impl<'txn> SyncWriter<'txn> {
    pub(super) fn open(txn: &'txn WriteTransaction) -> Result<SyncWriter<'txn>, StoreError> {
        Ok(SyncWriter {
            items: txn.open_table(ITEMS).map_err(failed)?,
            conflicts: txn.open_table(CONFLICTS).map_err(failed)?,
        })
    }

    /// Updates the item of `change`'s resource as the hub's own change (§3.1–3.2); returns
    /// how many conflicts the item carries then.
    pub(super) fn record(&mut self, channel: &str, change: &Change) -> Result<u32, StoreError> {
        let current = self
            .items
            .get((channel, change.loc.as_str()))
            .map_err(failed)?
            .map(|v| decode::<SyncState>(v.value()))
            .transpose()?;
        let had_conflicts = current.as_ref().is_some_and(|c| !c.conflicts.is_empty());
        let by = change.source.as_deref().map(feedsync::endpoint_id);
        let sync = feedsync::record_local(
            current,
            &change.loc,
            by.as_deref(),
            change.datetime,
            change.change == ChangeType::Deleted,
        );
        self.put(channel, &change.loc, change.seq, &sync, had_conflicts)
    }

    /// Makes `sync` the item of `loc`, whose latest change is `seq`; returns its number of
    /// conflicts. `had_conflicts`: whether its item may have carried conflicts until now (the
    /// conflicts table has an entry to remove only then).
    fn put(
        &mut self,
        channel: &str,
        loc: &str,
        seq: u64,
        sync: &SyncState,
        had_conflicts: bool,
    ) -> Result<u32, StoreError> {
        self.items
            .insert((channel, loc), encode(sync)?.as_slice())
            .map_err(failed)?;
        if sync.conflicts.is_empty() {
            if had_conflicts {
                self.conflicts.remove((channel, loc)).map_err(failed)?;
            }
        } else {
            self.conflicts.insert((channel, loc), seq).map_err(failed)?;
        }
        Ok(u32::try_from(sync.conflicts.len()).unwrap_or(u32::MAX))
    }
}

/// A table of a read transaction, or none when nothing ever wrote it.
fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match txn.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(failed(e)),
    }
}

/// The resource `loc` with its item, read in `txn`.
fn synced(txn: &ReadTransaction, channel: &str, loc: &str) -> Result<Option<Synced>, StoreError> {
    let resources = txn.open_table(RESOURCES).map_err(failed)?;
    let Some(stored) = resources.get((channel, loc)).map_err(failed)? else {
        return Ok(None);
    };
    let bytes = stored.value();
    seq_of(bytes)?;
    let change: Change = decode(&bytes[8..])?;
    let sync = match table(txn, ITEMS)? {
        Some(items) => items
            .get((channel, loc))
            .map_err(failed)?
            .map(|v| decode::<SyncState>(v.value()))
            .transpose()?,
        None => None,
    };
    let sync = sync.unwrap_or_else(|| feedsync::implied(&change));
    Ok(Some(Synced { change, sync }))
}

/// The items of the resources whose latest change is after `after`, in seq order.
pub(super) fn page(
    db: &Database,
    channel: &str,
    after: u64,
    limit: usize,
) -> Result<SyncPage, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let last = match txn
        .open_table(CHANNELS)
        .map_err(failed)?
        .get(channel)
        .map_err(failed)?
    {
        Some(v) => decode::<super::ChannelMeta>(v.value())?.last,
        None => 0,
    };
    let mut page = SyncPage {
        items: Vec::new(),
        last,
    };
    if after == u64::MAX {
        return Ok(page);
    }
    let order = txn.open_table(RESOURCE_ORDER).map_err(failed)?;
    for entry in order
        .range((channel, after + 1)..=(channel, u64::MAX))
        .map_err(failed)?
        .take(limit)
    {
        let (_, loc) = entry.map_err(failed)?;
        let found = synced(&txn, channel, loc.value())?;
        page.items.extend(found);
    }
    Ok(page)
}

/// The resource `loc` and its item.
pub(super) fn one(db: &Database, channel: &str, loc: &str) -> Result<Option<Synced>, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    synced(&txn, channel, loc)
}

/// Up to `limit` resources whose items carry conflicts, in loc order.
pub(super) fn conflicted(
    db: &Database,
    channel: &str,
    limit: usize,
) -> Result<Vec<Synced>, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let Some(conflicts) = table(&txn, CONFLICTS)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for entry in conflicts.range((channel, "")..).map_err(failed)? {
        let (key, _) = entry.map_err(failed)?;
        let (ch, loc) = key.value();
        if ch != channel || out.len() >= limit {
            break;
        }
        out.extend(synced(&txn, channel, loc)?);
    }
    Ok(out)
}

/// Appends the changes of a merge if no resource they touch changed since it was read; each
/// item takes its merged state. None when one changed (nothing is written).
pub(super) async fn append_merged(
    store: &EmbeddedStore,
    channel: &str,
    changes: Vec<MergedChange>,
    now: OffsetDateTime,
) -> Result<Option<Appended>, StoreError> {
    let name = channel.to_string();
    let appended = store
        .blocking(true, move |db| merge_in(db, &name, changes, now))
        .await?;
    if let Some(a) = &appended {
        let heads = store.heads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = heads.get(channel) {
            tx.send_if_modified(|head| {
                let moved = a.last > *head;
                *head = (*head).max(a.last);
                moved
            });
        }
    }
    Ok(appended)
}

fn merge_in(
    db: &Database,
    channel: &str,
    changes: Vec<MergedChange>,
    now: OffsetDateTime,
) -> Result<Option<Appended>, StoreError> {
    let txn = db.begin_write().map_err(failed)?;
    {
        let resources = txn.open_table(RESOURCES).map_err(failed)?;
        for m in &changes {
            let seq = resources
                .get((channel, m.change.loc.as_str()))
                .map_err(failed)?
                .map(|v| seq_of(v.value()))
                .transpose()?
                .unwrap_or(0);
            if seq != m.expected {
                return Ok(None);
            }
        }
    }
    let (news, syncs): (Vec<_>, Vec<_>) = changes.into_iter().map(|m| (m.change, m.sync)).unzip();
    let job = AppendJob {
        channel: channel.to_string(),
        changes: Vec::new(),
        idempotency: None,
        now,
        reply: oneshot::channel().0,
    };
    let appended = {
        let mut tables = AppendTables::open(&txn)?;
        let appended = append_in(&mut tables, &job, news)?;
        tables.finish()?;
        appended
    };
    {
        let mut items = SyncWriter::open(&txn)?;
        let mut log = txn.open_table(CHANGES).map_err(failed)?;
        let mut index = IndexWriter::open(&txn)?;
        for (seq, sync) in (appended.first..).zip(&syncs) {
            let mut change: Change = match log.get((channel, seq)).map_err(failed)? {
                Some(v) => decode(v.value())?,
                None => return Err(StoreError::Corrupt(format!("merged seq {seq} missing"))),
            };
            // The append just recorded the hub's own update, which may carry conflicts.
            change.conflicts = items.put(channel, &change.loc, seq, sync, true)?;
            let json = encode(&change)?;
            log.insert((channel, seq), json.as_slice())
                .map_err(failed)?;
            index.record(channel, &change, &json)?;
        }
    }
    txn.commit().map_err(failed)?;
    Ok(Some(appended))
}
