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
//!   the notifications of that time, which at-least-once delivery allows.
//! - Readers see the newest state: [`Progress::latest`] looks in memory before the store,
//!   including at the states of a batch being written, until the store holds them.
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

/// How long states gather before they are written. Each write dirties the store's pages of
/// every subscription served meanwhile, and the next append's fsync has to flush them: at
/// 1,000 subscribers, writing every 500 ms instead of every 50 ms took the publish's 202 p99
/// from 5.0 to 4.0 ms on average (six alternating benchmark runs, docs/performance.md). The
/// cost: a crash redelivers up to half a second more of notifications.
pub const EVERY: Duration = Duration::from_millis(500);

/// The delivery states not yet written (see the module docs).
#[derive(Default)]
pub struct Progress {
    states: Mutex<States>,
    wake: Notify,
    /// Held while a batch is being written.
    writing: tokio::sync::Mutex<()>,
    closed: CancellationToken,
}

/// The states that readers must take from memory. Every delivery looks its subscription up
/// here: the maps hash with foldhash (seeded per process), not SipHash, which took about 2%
/// of the hub's CPU samples at 1,000 subscribers.
#[derive(Default)]
struct States {
    /// Recorded since the last batch was taken.
    dirty: foldhash::HashMap<String, DeliveryState>,
    /// The batch being written: the store may not hold it yet.
    writing: foldhash::HashMap<String, DeliveryState>,
}

impl States {
    fn newest(&self, id: &str) -> Option<&DeliveryState> {
        self.dirty.get(id).or_else(|| self.writing.get(id))
    }
}

impl Progress {
    /// Keeps `state` as subscription `id`'s newest; written within [`EVERY`].
    pub fn record(&self, id: &str, state: &DeliveryState) {
        let mut states = self.lock();
        let dirty = &mut states.dirty;
        match dirty.get_mut(id) {
            Some(old) => old.clone_from(state),
            None => {
                dirty.insert(id.to_string(), state.clone());
            }
        }
        drop(states);
        self.wake.notify_one();
    }

    /// The newest state of subscription `id`: recorded and not yet written, else stored.
    pub async fn latest(
        &self,
        store: &dyn Store,
        id: &str,
    ) -> Result<Option<DeliveryState>, StoreError> {
        if let Some(state) = self.lock().newest(id) {
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
            let newest = self.lock();
            let mut states = HashMap::with_capacity(ids.len());
            let mut missing = Vec::new();
            for id in ids {
                match newest.newest(id) {
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
        self.drop_state(id);
        drop(self.writing.lock().await);
    }

    /// Drops `id`'s state from memory, the batch being written included: should that write
    /// fail, [`Progress::written`] puts back only what is left of the batch.
    fn drop_state(&self, id: &str) {
        let mut states = self.lock();
        states.dirty.remove(id);
        states.writing.remove(id);
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
        let batch = self.take_batch();
        if batch.is_empty() {
            return;
        }
        self.written(store.put_deliveries(&batch).await);
    }

    /// Takes every recorded state for a write; readers keep seeing them until it ends.
    fn take_batch(&self) -> Vec<(String, DeliveryState)> {
        let mut states = self.lock();
        let taken = std::mem::take(&mut states.dirty);
        states.writing = taken.clone();
        taken.into_iter().collect()
    }

    /// Ends the write of the batch taken last. On failure its states go back to be written
    /// with the next batch, save those recorded anew meanwhile (newer) and those forgotten.
    fn written(&self, result: Result<(), StoreError>) {
        let mut states = self.lock();
        let batch = std::mem::take(&mut states.writing);
        if let Err(e) = result {
            if !e.logged_by_store() {
                tracing::warn!(error = %e, states = batch.len(), "cannot save delivery state; retrying");
            }
            for (id, state) in batch {
                states.dirty.entry(id).or_insert(state);
            }
            drop(states);
            self.wake.notify_one();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, States> {
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Algorithm, Subscription};
    use crate::store::embedded::EmbeddedStore;
    use std::sync::Arc;
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

    /// A subscription forgotten while a write holds its state is not written by the next one
    /// when that write fails (before, the failed batch went back whole, the forgotten state
    /// with it).
    #[test]
    fn a_state_forgotten_during_a_write_that_fails_is_not_kept_for_the_next() {
        let progress = Progress::default();
        progress.record("gone", &state(3));
        progress.record("kept", &state(4));
        assert_eq!(progress.take_batch().len(), 2);
        // What `forget` does before it waits for the write to end.
        progress.drop_state("gone");
        progress.written(Err(StoreError::Unavailable("test".into())));
        let states = progress.lock();
        assert_eq!(states.dirty.get("gone"), None, "forgotten, then put back");
        assert_eq!(
            states.dirty.get("kept"),
            Some(&state(4)),
            "to be tried again"
        );
        assert!(states.writing.is_empty());
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

    /// While a batch is being written, readers see its states, not the older ones the store
    /// still holds (before, the batch left memory when the write began: the metrics showed a
    /// failing subscription as delivering for the length of a commit).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_state_being_written_is_still_read_as_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
        let sub = subscription("sub-1");
        store.put_subscription(&sub).await.unwrap();
        let progress = Arc::new(Progress::default());
        let ids = [sub.id.clone()];
        let mut reads_during_writes = 0;
        for cursor in 1..=40 {
            progress.record(&sub.id, &state(cursor));
            let writer = tokio::spawn({
                let (progress, store) = (progress.clone(), store.clone());
                async move { progress.write(store.as_ref()).await }
            });
            loop {
                let done = writer.is_finished();
                let one = progress.latest(store.as_ref(), &sub.id).await.unwrap();
                assert_eq!(
                    one.map(|s| s.cursor),
                    Some(cursor),
                    "latest, write {cursor}"
                );
                let many = progress.latest_of(store.as_ref(), "c", &ids).await.unwrap();
                assert_eq!(many.get(&sub.id).map(|s| s.cursor), Some(cursor));
                if done {
                    break;
                }
                reads_during_writes += 1;
            }
            writer.await.unwrap();
        }
        assert!(reads_during_writes > 0, "no read overlapped a write");
    }
}
