//! The log writer of external topics: new changes (from a fetch or a fat ping) are appended to
//! the topic's internal channel, and the log is trimmed to [`RETENTION`].

use time::OffsetDateTime;

use super::topic::Topic;
use super::External;
use crate::model::{Lists, NewChange, Retention};
use crate::store::StoreError;

/// How an external topic's log is cut into Change Lists.
pub const LISTS: Lists = Lists {
    size: RETENTION.list_size,
};

/// Retention of an external topic's log.
const RETENTION: Retention = Retention {
    max_changes: 1_000_000,
    list_size: crate::model::DEFAULT_LIST_SIZE,
    max_age: None,
};

impl External {
    /// The newest datetime recorded for the topic.
    pub(super) async fn newest(&self, topic: &Topic) -> Result<Option<OffsetDateTime>, StoreError> {
        let mut seen = topic.seen.lock().await;
        seen.load(self.store.as_ref(), &topic.channel).await?;
        Ok(seen.newest())
    }

    /// Appends the changes of `changes` not seen before to the topic's log; returns how many.
    pub async fn record(
        &self,
        topic: &Topic,
        changes: Vec<NewChange>,
    ) -> Result<usize, StoreError> {
        let mut seen = topic.seen.lock().await;
        seen.load(self.store.as_ref(), &topic.channel).await?;
        let mut fresh = seen.fresh(changes);
        if fresh.changes.is_empty() {
            return Ok(0);
        }
        let n = fresh.changes.len();
        let batch = std::mem::take(&mut fresh.changes);
        self.store
            .append(&topic.channel, batch, None, OffsetDateTime::now_utc())
            .await?;
        seen.remember(fresh);
        if let Err(e) = self
            .store
            .trim(&topic.channel, RETENTION, OffsetDateTime::now_utc())
            .await
        {
            tracing::warn!(topic = %topic.url, error = %e, "retention failed");
        }
        tracing::info!(topic = %topic.url, new = n, "external topic changes recorded");
        Ok(n)
    }
}
