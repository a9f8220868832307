//! Bridge cursors: how far each bridge (see `Store::put_bridge_cursor`) passed a channel's
//! notifications on, keyed by (channel, bridge). Committed without fsync, like delivery
//! state: a crash that loses the last write only makes the bridge pass a notification on
//! again.

use redb::{Database, Durability, ReadableDatabase, TableDefinition};

use super::failed;
use crate::store::StoreError;

/// (channel, bridge) → the last seq the bridge passed on.
const BRIDGES: TableDefinition<(&str, &str), u64> = TableDefinition::new("bridges");

pub(super) fn put(db: &Database, channel: &str, bridge: &str, seq: u64) -> Result<(), StoreError> {
    let mut txn = db.begin_write().map_err(failed)?;
    txn.set_durability(Durability::None).map_err(failed)?;
    txn.open_table(BRIDGES)
        .map_err(failed)?
        .insert((channel, bridge), seq)
        .map_err(failed)?;
    txn.commit().map_err(failed)
}

pub(super) fn get(db: &Database, channel: &str, bridge: &str) -> Result<Option<u64>, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let table = match txn.open_table(BRIDGES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(failed(e)),
    };
    Ok(table
        .get((channel, bridge))
        .map_err(failed)?
        .map(|v| v.value()))
}
