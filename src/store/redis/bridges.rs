//! Bridge cursors: how far each bridge (see `Store::put_bridge_cursor`) passed a channel's
//! notifications on, one hash per channel (`changehub:{c}:bridges`, in the channel's slot).

use redis::AsyncCommands;

use super::{key, timed, RedisStore};
use crate::store::StoreError;

pub(super) async fn put(
    store: &RedisStore,
    channel: &str,
    bridge: &str,
    seq: u64,
) -> Result<(), StoreError> {
    let mut conn = store.conn();
    timed(conn.hset::<_, _, _, ()>(key(channel, "bridges"), bridge, seq)).await
}

pub(super) async fn get(
    store: &RedisStore,
    channel: &str,
    bridge: &str,
) -> Result<Option<u64>, StoreError> {
    let mut conn = store.conn();
    timed(conn.hget(key(channel, "bridges"), bridge)).await
}
