//! The redb database behind a handle that can be swapped, so that the store recovers from a
//! full disk (or another I/O error) without a restart.
//!
//! After one failed write redb refuses everything ("Previous I/O error") until the file is
//! opened again. The first I/O error breaks the [`Handle`]: from then on every request is
//! refused at once without touching the file — writes with [`StoreError::Full`] (507) when
//! the disk is full, everything else with [`StoreError::Io`] (503) — and readiness fails.
//! The writer thread calls [`Handle::recover`] every [`RETRY`]: once the disk takes a probe
//! write again ([`file::has_room`]) and the last reader has let the old database go, it opens
//! the file again, as a restart would. Every commit that returned (every acknowledged change)
//! is in the file; a commit that failed was answered with an error and never acknowledged.
//!
//! Logs: one line when the store breaks, one when it is back, and at most one reminder every
//! [`REPEAT`] in between (with how many requests were refused). A store that breaks again
//! within [`REPEAT`] of reopening (a disk with just enough room for the probe) waits twice as
//! long as last time before its next try, up to [`REPEAT`], so that a flapping disk logs a
//! couple of lines a minute, not two a second.

use redb::Database;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::file::{self, DiskFull};
use super::{failed, index};
use super::{CHANGES, CHANNELS, CHANNEL_SPECS, DELIVERY, IDEMPOTENCY, SUBSCRIPTIONS};
use crate::store::StoreError;

/// How often a broken store tries to reopen.
pub(super) const RETRY: Duration = Duration::from_secs(1);
/// At most one reminder line this often while the store is broken.
const REPEAT: Duration = Duration::from_secs(60);

/// The open database, or why there is none.
pub(super) struct Handle {
    dir: PathBuf,
    full: Arc<DiskFull>,
    /// Bytes of the file kept in memory (redb's cache).
    cache: usize,
    state: Mutex<State>,
}

enum State {
    /// `reopened`: when it was last reopened, and after how long a wait.
    Open {
        db: Arc<Database>,
        reopened: Option<(Instant, Duration)>,
    },
    Broken(Broken),
}

struct Broken {
    /// The disk is full (writes are answered 507); false for another I/O error.
    full: bool,
    /// The error that broke the store.
    cause: String,
    since: Instant,
    /// The failed database until the last reader lets it go: the file can only be opened
    /// again once it is closed.
    old: Option<Arc<Database>>,
    /// Requests refused: since the store broke, and since the last log line.
    refused: u64,
    refused_since_log: u64,
    logged: Instant,
    /// The wait between tries to reopen.
    wait: Duration,
    next_try: Instant,
}

impl Broken {
    fn error(&self, write: bool) -> StoreError {
        if self.full && write {
            StoreError::Full("writes are refused until space is freed".into())
        } else if self.full {
            StoreError::Io("the disk is full; the store reopens once space is freed".into())
        } else {
            StoreError::Io(format!("{}; the store is reopening", self.cause))
        }
    }

    fn what(&self) -> &'static str {
        if self.full {
            "the store's disk is full"
        } else {
            "the store's file failed"
        }
    }

    /// Logs a reminder when the last line is [`REPEAT`] old.
    fn remind(&mut self) {
        if self.logged.elapsed() >= REPEAT {
            tracing::warn!(
                cause = %self.cause,
                refused = self.refused_since_log,
                broken_for_s = self.since.elapsed().as_secs(),
                "{}: still refusing requests; the store reopens on its own",
                self.what()
            );
            self.logged = Instant::now();
            self.refused_since_log = 0;
        }
    }
}

impl Handle {
    /// Opens (or creates) the database of `dir`.
    pub(super) fn open(
        dir: &Path,
        full: Arc<DiskFull>,
        cache: usize,
    ) -> Result<Handle, StoreError> {
        let db = open_db(&dir.join(FILE), &full, cache)?;
        Ok(Handle {
            dir: dir.to_path_buf(),
            full,
            cache,
            state: Mutex::new(State::Open {
                db: Arc::new(db),
                reopened: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The database, or the error a request gets while the store is broken (`write`: the
    /// request would write).
    pub(super) fn db(&self, write: bool) -> Result<Arc<Database>, StoreError> {
        self.db_for(write, 1)
    }

    /// The same for `requests` requests at once (the writer thread's group of writes).
    pub(super) fn db_for(&self, write: bool, requests: usize) -> Result<Arc<Database>, StoreError> {
        match &mut *self.lock() {
            State::Open { db, .. } => Ok(db.clone()),
            State::Broken(broken) => {
                metrics::counter!("changehub_store_errors_total").increment(requests as u64);
                broken.refused += requests as u64;
                broken.refused_since_log += requests as u64;
                broken.remind();
                Err(broken.error(write))
            }
        }
    }

    /// Passes `result` on; an I/O error breaks the store (see the module docs) and is answered
    /// like every request while it is broken.
    pub(super) fn check<T>(
        &self,
        result: Result<T, StoreError>,
        write: bool,
    ) -> Result<T, StoreError> {
        let e = match result {
            Err(e @ (StoreError::Full(_) | StoreError::Io(_))) => e,
            other => return other,
        };
        let mut state = self.lock();
        if let State::Open { db, reopened } = &*state {
            let full = matches!(e, StoreError::Full(_));
            let now = Instant::now();
            let wait = match reopened {
                Some((at, wait)) if at.elapsed() < REPEAT => (*wait * 2).min(REPEAT),
                _ => RETRY,
            };
            let broken = Broken {
                full,
                cause: e.to_string(),
                since: now,
                old: Some(db.clone()),
                refused: 0,
                refused_since_log: 0,
                logged: now,
                wait,
                next_try: now + wait,
            };
            if full {
                tracing::error!(cause = %broken.cause, "the store's disk is full: writes are refused (507) until space is freed; the store reopens on its own");
            } else {
                tracing::error!(cause = %broken.cause, "the store's file failed: requests are refused (503); the store reopens on its own");
            }
            *state = State::Broken(broken);
        }
        match &*state {
            State::Broken(broken) => Err(broken.error(write)),
            State::Open { .. } => Err(e),
        }
    }

    /// When the store is broken and its retry is due: reopens the file if the disk takes
    /// writes again. Returns the new database when it did.
    pub(super) fn recover(&self) -> Option<Arc<Database>> {
        let old = {
            let mut state = self.lock();
            let State::Broken(broken) = &mut *state else {
                return None;
            };
            let now = Instant::now();
            if now < broken.next_try {
                return None;
            }
            broken.next_try = now + broken.wait;
            broken.old.take()
        };
        if let Some(old) = old {
            match Arc::try_unwrap(old) {
                Ok(db) => drop(db),
                Err(old) => {
                    // A reader still holds it (and is being refused by it): next time.
                    if let State::Broken(broken) = &mut *self.lock() {
                        broken.old = Some(old);
                    }
                    return None;
                }
            }
        }
        let reopened = file::has_room(&self.dir, &self.full)
            .map_err(failed)
            .and_then(|()| open_db(&self.dir.join(FILE), &self.full, self.cache));
        let mut state = self.lock();
        let State::Broken(broken) = &mut *state else {
            return None;
        };
        match reopened {
            Ok(db) => {
                tracing::info!(
                    refused = broken.refused,
                    broken_for_s = broken.since.elapsed().as_secs(),
                    "the store is reopened: requests are served again"
                );
                let db = Arc::new(db);
                *state = State::Open {
                    db: db.clone(),
                    reopened: Some((Instant::now(), broken.wait)),
                };
                Some(db)
            }
            Err(e) => {
                broken.full |= matches!(e, StoreError::Full(_));
                broken.remind();
                None
            }
        }
    }
}

/// The database file in the data folder.
const FILE: &str = "changehub.redb";

/// Opens the database file and makes sure every table exists, so that readers never meet a
/// missing one.
fn open_db(path: &Path, full: &Arc<DiskFull>, cache: usize) -> Result<Database, StoreError> {
    let db = file::open(path, full, cache).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable(format!(
            "{} is in use by another process (another changehub serving the same \
             --data-dir?); one hub at a time per data folder",
            path.display()
        )),
        other => match failed(other) {
            StoreError::Unavailable(e) => {
                StoreError::Unavailable(format!("{}: {e}", path.display()))
            }
            e => e,
        },
    })?;
    let txn = db.begin_write().map_err(failed)?;
    {
        txn.open_table(CHANGES).map_err(failed)?;
        txn.open_table(CHANNELS).map_err(failed)?;
        txn.open_table(IDEMPOTENCY).map_err(failed)?;
        txn.open_table(SUBSCRIPTIONS).map_err(failed)?;
        txn.open_table(DELIVERY).map_err(failed)?;
        txn.open_table(CHANNEL_SPECS).map_err(failed)?;
        txn.open_table(index::RESOURCES).map_err(failed)?;
        txn.open_table(index::RESOURCE_ORDER).map_err(failed)?;
    }
    txn.commit().map_err(failed)?;
    index::backfill(&db)?;
    Ok(db)
}

#[cfg(test)]
mod tests {
    use super::super::{EmbeddedStore, DEFAULT_CACHE};
    use super::*;
    use crate::model::{ChangeType, NewChange};
    use crate::store::Store;
    use time::OffsetDateTime;

    fn changes(prefix: &str, n: usize) -> Vec<NewChange> {
        (0..n)
            .map(|i| {
                NewChange::new(
                    format!("http://example.com/{prefix}/{i}"),
                    ChangeType::Updated,
                )
            })
            .collect()
    }

    /// Waits until the store answers `ping`, failing after `deadline`.
    async fn ready_within(store: &EmbeddedStore, deadline: Duration) -> bool {
        tokio::time::timeout(deadline, async {
            while store.ping().await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .is_ok()
    }

    /// The disk fills under the store (writes fail with "No space left on device", injected at
    /// the file): writes are refused as `Full`, reads and readiness fail; once the disk takes
    /// writes again the store reopens on its own, without losing an acknowledged change.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_disk_is_refused_then_the_store_reopens_on_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let full = Arc::new(DiskFull::default());
        let store = EmbeddedStore::open_with(dir.path(), full.clone(), DEFAULT_CACHE).unwrap();
        let now = OffsetDateTime::now_utc();
        let acked = store
            .append("c", changes("a", 10), None, now)
            .await
            .unwrap();
        assert_eq!((acked.first, acked.last), (1, 10));
        let mut head = store.watch_head("c");

        full.set(true);
        for _ in 0..3 {
            let refused = store.append("c", changes("b", 5), None, now).await;
            assert!(matches!(refused, Err(StoreError::Full(_))), "{refused:?}");
        }
        let read = store.read("c", 0, 100).await;
        assert!(matches!(read, Err(StoreError::Io(_))), "{read:?}");
        assert!(store.ping().await.is_err());
        // Still full: it stays closed across several attempts to reopen.
        assert!(!ready_within(&store, 3 * RETRY).await);
        let refused = store.append("c", changes("b", 5), None, now).await;
        assert!(matches!(refused, Err(StoreError::Full(_))), "{refused:?}");

        full.set(false);
        assert!(ready_within(&store, Duration::from_secs(10)).await);
        let after = store.append("c", changes("c", 3), None, now).await.unwrap();
        assert_eq!(
            (after.first, after.last),
            (11, 13),
            "refused writes took no seq"
        );
        tokio::time::timeout(Duration::from_secs(10), head.wait_for(|&last| last == 13))
            .await
            .expect("the head moves after the reopen")
            .unwrap();

        // Full again right after the reopen (a flapping disk): the next try waits twice as long.
        full.set(true);
        let refused = store.append("c", changes("d", 5), None, now).await;
        assert!(matches!(refused, Err(StoreError::Full(_))), "{refused:?}");
        full.set(false);
        assert!(!ready_within(&store, RETRY * 3 / 2).await, "backs off");
        assert!(ready_within(&store, Duration::from_secs(10)).await);

        // Everything acknowledged is there, now and after a restart.
        let locs = |changes: Vec<crate::model::Change>| -> Vec<(u64, String)> {
            changes.into_iter().map(|c| (c.seq, c.loc)).collect()
        };
        let expected: Vec<(u64, String)> = (0..10)
            .map(|i| format!("http://example.com/a/{i}"))
            .chain((0..3).map(|i| format!("http://example.com/c/{i}")))
            .zip(1..)
            .map(|(loc, seq)| (seq, loc))
            .collect();
        assert_eq!(locs(store.read("c", 0, 100).await.unwrap()), expected);
        drop(store);
        let store = EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(locs(store.read("c", 0, 100).await.unwrap()), expected);
    }
}
