//! Rendered page blocks (see `Store::put_page_block`), keyed by (channel, block). Committed
//! without fsync: they are a cache, rendered again from the log when missing.

use redb::{Database, Durability, ReadableDatabase, Table, TableDefinition};

use super::failed;
use crate::store::StoreError;

/// (channel, block) → the block's bytes.
const PAGES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("page-blocks");

pub(super) fn put(
    db: &Database,
    channel: &str,
    block: u64,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let mut txn = db.begin_write().map_err(failed)?;
    txn.set_durability(Durability::None).map_err(failed)?;
    txn.open_table(PAGES)
        .map_err(failed)?
        .insert((channel, block), bytes)
        .map_err(failed)?;
    txn.commit().map_err(failed)
}

pub(super) fn get(db: &Database, channel: &str, block: u64) -> Result<Option<Vec<u8>>, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let table = match txn.open_table(PAGES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(failed(e)),
    };
    Ok(table
        .get((channel, block))
        .map_err(failed)?
        .map(|v| v.value().to_vec()))
}

/// Drops the blocks `from..to` of `channel` (those a trim removed every seq of), in the
/// trim's transaction.
pub(super) fn drop_blocks(
    txn: &redb::WriteTransaction,
    channel: &str,
    from: u64,
    to: u64,
) -> Result<(), StoreError> {
    if from >= to {
        return Ok(());
    }
    let mut table: Table<(&str, u64), &[u8]> = txn.open_table(PAGES).map_err(failed)?;
    for block in from..to {
        table.remove((channel, block)).map_err(failed)?;
    }
    Ok(())
}
