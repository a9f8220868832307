//! Channel ownership leases: `changehub:{c}:owner` holds the holder's instance id with a
//! time to live; taking, renewing and releasing each run as one script.

use std::time::Duration;

use super::{key, timed, RedisStore, EVENTS};
use crate::store::StoreError;

/// Takes or renews the lease of `channel` for `holder`; false when another instance holds it.
pub(super) async fn try_lease(
    store: &RedisStore,
    channel: &str,
    holder: &str,
    ttl: Duration,
) -> Result<bool, StoreError> {
    let mut conn = store.conn();
    let got: u8 = timed(
        store
            .scripts
            .lease
            .key(key(channel, "owner"))
            .arg(holder)
            .arg(ttl.as_millis() as u64)
            .invoke_async(&mut conn),
    )
    .await?;
    Ok(got == 1)
}

/// Gives the lease up if `holder` has it, and tells the other instances (`released c`).
pub(super) async fn release(
    store: &RedisStore,
    channel: &str,
    holder: &str,
) -> Result<(), StoreError> {
    let mut conn = store.conn();
    timed(
        store
            .scripts
            .release
            .key(key(channel, "owner"))
            .arg(holder)
            .arg(EVENTS)
            .arg(channel)
            .invoke_async::<()>(&mut conn),
    )
    .await
}
