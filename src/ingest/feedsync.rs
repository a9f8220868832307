//! FeedSync collections as a way in: a source posts a collection (POX or JSON, parsed by
//! [`crate::feedsync`]); each item is merged with the resource's item (FeedSync §3.3:
//! subsumption, winner picking, conflicts — [`feedsync::merge`]), and every item the merge
//! changes becomes a ResourceSync change in the log, appended with its merged item in one
//! atomic write ([`Store::append_merged`]). Items the hub already knows change nothing, so
//! posting a collection again appends nothing.
//!
//! The merge reads each resource, then appends only if none of them changed meanwhile; when
//! one did (another source's change), it reads and merges again.

use std::collections::HashSet;
use time::OffsetDateTime;

use crate::feedsync::ParseError;
use crate::model::feedsync::{self, Item, MergedChange};
use crate::model::{ChangeType, NewChange};
use crate::store::{Appended, Store, StoreError};

/// Most items in one collection.
pub const MAX_ITEMS: usize = 10_000;
/// How many times a merge is tried again when resources change under it.
const ATTEMPTS: usize = 8;

/// Why a collection was not incorporated; nothing was appended.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// An item that cannot be merged with what the hub holds.
    #[error("item {index}: {reason}")]
    Item { index: usize, reason: String },
    /// Other changes to the same resources kept arriving during the merge.
    #[error("the resources kept changing during the merge; send the collection again")]
    Busy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incorporated {
    /// Items in the collection.
    pub items: usize,
    /// The changes appended (none when the hub already had every item).
    pub appended: Option<Appended>,
    /// The locs whose items carry conflicts after the merge, among those it changed.
    pub conflicts: Vec<String>,
}

/// Merges `items` (from a collection that `publisher` posted) into `channel`.
pub async fn incorporate(
    store: &dyn Store,
    channel: &str,
    publisher: &str,
    items: &[Item],
    now: OffsetDateTime,
) -> Result<Incorporated, MergeError> {
    let mut locs = HashSet::new();
    for (index, item) in items.iter().enumerate() {
        if !locs.insert(item.data.loc.as_str()) {
            return Err(MergeError::Item {
                index,
                reason: format!("loc {:?} appears twice in the collection", item.data.loc),
            });
        }
    }
    for _ in 0..ATTEMPTS {
        let mut changes = Vec::new();
        let mut conflicts = Vec::new();
        for (index, incoming) in items.iter().enumerate() {
            let local = store.sync_item(channel, &incoming.data.loc).await?;
            if let Some(local) = &local {
                if local.sync.id != incoming.sync.id {
                    return Err(MergeError::Item {
                        index,
                        reason: format!(
                            "the item of loc {:?} has id {:?} here, not {:?}",
                            incoming.data.loc, local.sync.id, incoming.sync.id
                        ),
                    });
                }
            }
            let local_item = local.as_ref().map(Item::of);
            let result = feedsync::merge(local_item.as_ref(), incoming);
            if local_item.as_ref() == Some(&result) {
                continue;
            }
            if !result.sync.conflicts.is_empty() {
                conflicts.push(result.data.loc.clone());
            }
            let kind = match &local {
                _ if result.sync.deleted => ChangeType::Deleted,
                Some(l) if l.change.change != ChangeType::Deleted => ChangeType::Updated,
                _ => ChangeType::Created,
            };
            let data = result.data;
            changes.push(MergedChange {
                change: NewChange {
                    lastmod: data.lastmod,
                    hash: data.hash,
                    length: data.length,
                    media_type: data.media_type.map(Into::into),
                    source: Some(publisher.into()),
                    ..NewChange::new(data.loc, kind)
                },
                expected: local.map_or(0, |l| l.change.seq),
                sync: result.sync,
            });
        }
        if changes.is_empty() {
            return Ok(Incorporated {
                items: items.len(),
                appended: None,
                conflicts,
            });
        }
        if let Some(appended) = store.append_merged(channel, changes, now).await? {
            return Ok(Incorporated {
                items: items.len(),
                appended: Some(appended),
                conflicts,
            });
        }
        tracing::debug!(%channel, "resources changed during a merge: merging again");
    }
    Err(MergeError::Busy)
}
