//! Rendered page blocks (see `Store::put_page_block`): one hash per channel
//! (`changehub:{c}:pages`, block number → bytes, in the channel's slot). `scripts/trim.lua`
//! drops the blocks whose seqs it removed all of.

use redis::AsyncCommands;

use super::{key, timed, RedisStore};
use crate::store::StoreError;

pub(super) async fn put(
    store: &RedisStore,
    channel: &str,
    block: u64,
    bytes: Vec<u8>,
) -> Result<(), StoreError> {
    let mut conn = store.conn();
    timed(conn.hset::<_, _, _, ()>(key(channel, "pages"), block, bytes)).await
}

pub(super) async fn get(
    store: &RedisStore,
    channel: &str,
    block: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    let mut conn = store.conn();
    timed(conn.hget(key(channel, "pages"), block)).await
}
