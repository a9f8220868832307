//! The embedded store's resource index: the latest change of every `loc` of a channel,
//! written by the append that logs the change, in the same redb transaction.
//!
//! Two tables: [`RESOURCES`] maps (channel, loc) to the change (its seq as 8 big-endian
//! bytes, then the change as JSON, like the log), and [`RESOURCE_ORDER`] maps (channel, seq)
//! to the loc whose latest change that seq is, so that pages come in seq order. When a loc
//! changes again, its old seq leaves [`RESOURCE_ORDER`].

use redb::{Database, ReadableDatabase, ReadableTable, Table, TableDefinition, WriteTransaction};

use super::{decode, failed, ChannelMeta, CHANGES, CHANNELS};
use crate::model::Change;
use crate::store::{ResourcePage, StoreError};

pub(super) const RESOURCES: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("resources");
pub(super) const RESOURCE_ORDER: TableDefinition<(&str, u64), &str> =
    TableDefinition::new("resource-order");

/// Writes index entries inside a write transaction.
pub(super) struct IndexWriter<'txn> {
    resources: Table<'txn, (&'static str, &'static str), &'static [u8]>,
    order: Table<'txn, (&'static str, u64), &'static str>,
    entry: Vec<u8>,
}

impl<'txn> IndexWriter<'txn> {
    pub(super) fn open(txn: &'txn WriteTransaction) -> Result<IndexWriter<'txn>, StoreError> {
        Ok(IndexWriter {
            resources: txn.open_table(RESOURCES).map_err(failed)?,
            order: txn.open_table(RESOURCE_ORDER).map_err(failed)?,
            entry: Vec::new(),
        })
    }

    /// Makes `change` (whose JSON is `json`) the latest of its loc; true when the loc is new
    /// to the index.
    pub(super) fn record(
        &mut self,
        channel: &str,
        change: &Change,
        json: &[u8],
    ) -> Result<bool, StoreError> {
        self.entry.clear();
        self.entry.extend_from_slice(&change.seq.to_be_bytes());
        self.entry.extend_from_slice(json);
        let previous = self
            .resources
            .insert((channel, change.loc.as_str()), self.entry.as_slice())
            .map_err(failed)?
            .map(|old| seq_of(old.value()))
            .transpose()?;
        if let Some(old) = previous {
            self.order.remove((channel, old)).map_err(failed)?;
        }
        self.order
            .insert((channel, change.seq), change.loc.as_str())
            .map_err(failed)?;
        Ok(previous.is_none())
    }
}

pub(super) fn seq_of(entry: &[u8]) -> Result<u64, StoreError> {
    entry
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| StoreError::Corrupt("resource entry too short".into()))
}

/// One page of the index (see `Store::resources`), read in one transaction.
pub(super) fn read_page(
    db: &Database,
    channel: &str,
    after: u64,
    limit: usize,
) -> Result<ResourcePage, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let meta = match txn
        .open_table(CHANNELS)
        .map_err(failed)?
        .get(channel)
        .map_err(failed)?
    {
        Some(v) => decode::<ChannelMeta>(v.value())?,
        None => ChannelMeta::default(),
    };
    let order = txn.open_table(RESOURCE_ORDER).map_err(failed)?;
    let resources = txn.open_table(RESOURCES).map_err(failed)?;
    let mut page = ResourcePage {
        resources: Vec::with_capacity(limit.min(50_000)),
        last: meta.last,
    };
    if after == u64::MAX {
        return Ok(page);
    }
    for entry in order
        .range((channel, after + 1)..=(channel, u64::MAX))
        .map_err(failed)?
        .take(limit)
    {
        let (_, loc) = entry.map_err(failed)?;
        let stored = resources
            .get((channel, loc.value()))
            .map_err(failed)?
            .ok_or_else(|| StoreError::Corrupt(format!("no index entry for {}", loc.value())))?;
        let bytes = stored.value();
        seq_of(bytes)?;
        page.resources.push(decode(&bytes[8..])?);
    }
    Ok(page)
}

/// The index entry of `loc`.
pub(super) fn read_one(
    db: &Database,
    channel: &str,
    loc: &str,
) -> Result<Option<Change>, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let resources = txn.open_table(RESOURCES).map_err(failed)?;
    let Some(stored) = resources.get((channel, loc)).map_err(failed)? else {
        return Ok(None);
    };
    let bytes = stored.value();
    seq_of(bytes)?;
    Ok(Some(decode(&bytes[8..])?))
}

/// The seq at every `every`-th position of the index, in seq order.
pub(super) fn marks(db: &Database, channel: &str, every: usize) -> Result<Vec<u64>, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let order = txn.open_table(RESOURCE_ORDER).map_err(failed)?;
    let mut out = Vec::new();
    if every == 0 {
        return Ok(out);
    }
    for (i, entry) in order
        .range((channel, 0)..=(channel, u64::MAX))
        .map_err(failed)?
        .enumerate()
    {
        if (i + 1) % every == 0 {
            let (k, _) = entry.map_err(failed)?;
            out.push(k.value().1);
        }
    }
    Ok(out)
}

/// Builds the index of every channel whose log was written before the index existed, from
/// what its log retains. Runs once per channel (the channel's meta then says `indexed`).
pub(super) fn backfill(db: &Database) -> Result<(), StoreError> {
    let pending: Vec<(String, ChannelMeta)> = {
        let txn = db.begin_read().map_err(failed)?;
        let table = txn.open_table(CHANNELS).map_err(failed)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(failed)? {
            let (k, v) = entry.map_err(failed)?;
            let meta: ChannelMeta = decode(v.value())?;
            if !meta.indexed {
                out.push((k.value().to_string(), meta));
            }
        }
        out
    };
    for (channel, mut meta) in pending {
        let txn = db.begin_write().map_err(failed)?;
        {
            let log = txn.open_table(CHANGES).map_err(failed)?;
            let mut index = IndexWriter::open(&txn)?;
            for entry in log
                .range((channel.as_str(), meta.oldest)..=(channel.as_str(), u64::MAX))
                .map_err(failed)?
            {
                let (_, v) = entry.map_err(failed)?;
                let change: Change = decode(v.value())?;
                if index.record(&channel, &change, v.value())? {
                    meta.resources += 1;
                }
            }
            meta.indexed = true;
            txn.open_table(CHANNELS)
                .map_err(failed)?
                .insert(channel.as_str(), super::encode(&meta)?.as_slice())
                .map_err(failed)?;
        }
        txn.commit().map_err(failed)?;
        tracing::info!(%channel, resources = meta.resources, "resource index built from the log");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::EmbeddedStore;
    use super::*;
    use crate::model::{ChangeType, NewChange};
    use crate::store::Store;
    use time::OffsetDateTime;

    fn change(loc: &str) -> NewChange {
        NewChange::new(format!("http://example.com/{loc}"), ChangeType::Updated)
    }

    /// A store written before the index existed (no index entries, `indexed` unset) gets its
    /// index built from the retained log when it is opened.
    #[tokio::test]
    async fn an_older_store_is_indexed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let now = OffsetDateTime::now_utc();
        {
            let store = EmbeddedStore::open(dir.path()).unwrap();
            let batch = vec![change("a"), change("b"), change("a")];
            store.append("c", batch, None, now).await.unwrap();
            // Make it look like an older store.
            let txn = store.handle.db(true).unwrap().begin_write().unwrap();
            {
                txn.open_table(RESOURCES)
                    .unwrap()
                    .retain(|_, _| false)
                    .unwrap();
                txn.open_table(RESOURCE_ORDER)
                    .unwrap()
                    .retain(|_, _| false)
                    .unwrap();
                let mut channels = txn.open_table(CHANNELS).unwrap();
                let mut meta: ChannelMeta =
                    decode(channels.get("c").unwrap().unwrap().value()).unwrap();
                meta.indexed = false;
                meta.resources = 0;
                channels
                    .insert("c", super::super::encode(&meta).unwrap().as_slice())
                    .unwrap();
            }
            txn.commit().unwrap();
            assert_eq!(store.resources("c", 0, 10).await.unwrap().resources, vec![]);
        }
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let page = store.resources("c", 0, 10).await.unwrap();
        let got: Vec<(u64, &str)> = page
            .resources
            .iter()
            .map(|c| (c.seq, c.loc.as_str()))
            .collect();
        assert_eq!(
            got,
            [(2, "http://example.com/b"), (3, "http://example.com/a")]
        );
        assert_eq!(store.resource_count("c").await.unwrap(), 2);
    }
}
