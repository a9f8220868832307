//! How far each subscription's delivery got, written to the store coalesced.
//!
//! A delivery worker records its [`DeliveryState`] after every attempt; writing each one to
//! the store would cost a store write per delivery (at a thousand subscribers, a thousand
//! writes per notification, queued beside the appends). Instead [`Progress::record`] keeps the
//! newest state of each subscription in memory, and [`Progress::run`] writes what changed
//! every [`EVERY`] in one batch ([`Store::put_deliveries`]).
//!
//! Invariants:
//! - A recorded state is never ahead of what was delivered (workers record after the 2xx), so
//!   the stored cursor lags the truth by at most [`EVERY`] plus one write: a crash redelivers
//!   the last few notifications, which at-least-once delivery allows.
//! - Readers see the newest state: [`Progress::latest`] looks in memory before the store.
//! - On shutdown the hub calls [`Progress::close`] after the workers stopped and before the
//!   store closes, so a clean stop redelivers nothing.
//! - A forgotten subscription's state is never written after [`Progress::forget`] returns.

use std::collections::HashMap;
use std::sync::{Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::model::DeliveryState;
use crate::store::{Store, StoreError};

/// How long states gather before they are written.
pub const EVERY: Duration = Duration::from_millis(50);

/// The delivery states not yet written (see the module docs).
#[derive(Default)]
pub struct Progress {
    dirty: Mutex<HashMap<String, DeliveryState>>,
    wake: Notify,
    /// Held while a batch is being written.
    writing: tokio::sync::Mutex<()>,
    closed: CancellationToken,
}

impl Progress {
    /// Keeps `state` as subscription `id`'s newest; written within [`EVERY`].
    pub fn record(&self, id: &str, state: &DeliveryState) {
        let mut dirty = self.lock();
        match dirty.get_mut(id) {
            Some(old) => old.clone_from(state),
            None => {
                dirty.insert(id.to_string(), state.clone());
            }
        }
        drop(dirty);
        self.wake.notify_one();
    }

    /// The newest state of subscription `id`: recorded and not yet written, else stored.
    pub async fn latest(
        &self,
        store: &dyn Store,
        id: &str,
    ) -> Result<Option<DeliveryState>, StoreError> {
        if let Some(state) = self.lock().get(id) {
            return Ok(Some(state.clone()));
        }
        store.delivery(id).await
    }

    /// The newest states of the subscriptions `ids`, all to `channel`: those recorded and not
    /// yet written, the others read from the store in one call. A subscription with no state
    /// at all is left out.
    pub async fn latest_of(
        &self,
        store: &dyn Store,
        channel: &str,
        ids: &[String],
    ) -> Result<HashMap<String, DeliveryState>, StoreError> {
        let (mut states, missing) = {
            let dirty = self.lock();
            let mut states = HashMap::with_capacity(ids.len());
            let mut missing = Vec::new();
            for id in ids {
                match dirty.get(id) {
                    Some(state) => {
                        states.insert(id.clone(), state.clone());
                    }
                    None => missing.push(id.clone()),
                }
            }
            (states, missing)
        };
        if !missing.is_empty() {
            for (id, stored) in store.deliveries(channel, &missing).await? {
                // Recorded while the store was read: the recorded state is the newer.
                states.entry(id).or_insert(stored);
            }
        }
        Ok(states)
    }

    /// Drops subscription `id`'s unwritten state and waits for a write under way, so that
    /// nothing of it is written after this returns (call it before deleting the subscription).
    pub async fn forget(&self, id: &str) {
        self.lock().remove(id);
        drop(self.writing.lock().await);
    }

    /// Writes what is recorded every [`EVERY`] until [`Progress::close`], or until the
    /// store is dropped (this loop does not keep it open).
    pub async fn run(&self, store: Weak<dyn Store>) {
        loop {
            tokio::select! {
                _ = self.closed.cancelled() => return,
                _ = self.wake.notified() => {}
            }
            tokio::select! {
                _ = self.closed.cancelled() => return,
                _ = tokio::time::sleep(EVERY) => {}
            }
            let Some(store) = store.upgrade() else { return };
            self.write(store.as_ref()).await;
        }
    }

    /// Stops [`Progress::run`] and writes what is left.
    pub async fn close(&self, store: &dyn Store) {
        self.closed.cancel();
        self.write(store).await;
    }

    /// Writes every recorded state in one batch. On failure the states are kept (unless newer
    /// ones were recorded meanwhile) and tried again with the next batch.
    pub async fn write(&self, store: &dyn Store) {
        let _writing = self.writing.lock().await;
        let batch: Vec<(String, DeliveryState)> =
            std::mem::take(&mut *self.lock()).into_iter().collect();
        if batch.is_empty() {
            return;
        }
        if let Err(e) = store.put_deliveries(&batch).await {
            if !e.logged_by_store() {
                tracing::warn!(error = %e, states = batch.len(), "cannot save delivery state; retrying");
            }
            let mut dirty = self.lock();
            for (id, state) in batch {
                dirty.entry(id).or_insert(state);
            }
            drop(dirty);
            self.wake.notify_one();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, DeliveryState>> {
        self.dirty.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Algorithm, Subscription};
    use crate::store::embedded::EmbeddedStore;
    use time::OffsetDateTime;

    fn state(cursor: u64) -> DeliveryState {
        DeliveryState {
            cursor,
            ..DeliveryState::default()
        }
    }

    fn subscription(id: &str) -> Subscription {
        let now = OffsetDateTime::now_utc();
        Subscription {
            id: id.into(),
            channel: "c".into(),
            topic: "http://hub/channels/c/changelist.xml".into(),
            callback: "http://127.0.0.1:1/cb".into(),
            secret: None,
            algorithm: Algorithm::Sha256,
            lease_seconds: 600,
            expires_at: now + time::Duration::minutes(10),
            created_at: now,
        }
    }

    #[tokio::test]
    async fn the_newest_state_is_written_once_and_read_before_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let sub = subscription("sub-1");
        store.put_subscription(&sub).await.unwrap();
        let progress = Progress::default();
        for cursor in 1..=5 {
            progress.record(&sub.id, &state(cursor));
        }
        assert_eq!(
            store.delivery(&sub.id).await.unwrap(),
            None,
            "not written yet"
        );
        let latest = progress.latest(&store, &sub.id).await.unwrap();
        assert_eq!(latest, Some(state(5)));
        progress.write(&store).await;
        assert_eq!(store.delivery(&sub.id).await.unwrap(), Some(state(5)));

        // Forgotten: never written; and a state of a deleted subscription is dropped.
        progress.record(&sub.id, &state(9));
        progress.forget(&sub.id).await;
        progress.close(&store).await;
        assert_eq!(store.delivery(&sub.id).await.unwrap(), Some(state(5)));
        store.delete_subscription(&sub.id).await.unwrap();
        progress.record(&sub.id, &state(10));
        progress.write(&store).await;
        assert_eq!(store.delivery(&sub.id).await.unwrap(), None);
    }

    #[tokio::test]
    async fn many_states_are_read_from_memory_first_then_from_the_store_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        for id in ["a", "b", "c", "d"] {
            store.put_subscription(&subscription(id)).await.unwrap();
        }
        store
            .put_deliveries(&[("a".into(), state(1)), ("b".into(), state(2))])
            .await
            .unwrap();
        let progress = Progress::default();
        progress.record("b", &state(20));
        progress.record("c", &state(30));
        let ids = ["a", "b", "c", "d"].map(String::from);
        let states = progress.latest_of(&store, "c", &ids).await.unwrap();
        let mut got: Vec<_> = states.into_iter().map(|(id, s)| (id, s.cursor)).collect();
        got.sort();
        assert_eq!(
            got,
            [("a".into(), 1), ("b".into(), 20), ("c".into(), 30)],
            "stored a, recorded b (newer than stored) and c, nothing for d"
        );
    }
}
