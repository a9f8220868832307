//! Reads of a channel's head shared by the requests that want it at the same time.
//!
//! Every topic `GET` and `changes?after=` page needs the channel's head: one `HMGET` round
//! trip each, which Redis serves on the CPU the hub shares with it. So the requests of one channel take turns: one read at a time is in flight, and a request
//! that comes while it is takes the *next* read, which one of the requests that waited makes
//! for all of them. Measured with 8 clients on the gzip topic: 0.35 reads per request instead
//! of 1, and about a tenth more requests a second; the hub's own CPU per request is as before
//! (docs/performance.md, tenth pass).
//!
//! Invariant (read your writes): a request is only ever answered by a read that was sent after
//! it came, so it sees every append acknowledged before it asked, by this instance or any
//! other. A read that was already on its way when the request came is never reused for it.
//!
//! A request that is dropped while it reads (a client gone, a deadline) lets the next waiting
//! request make its own read; nothing is stored for it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

use crate::store::{ChannelHead, StoreError};

/// The shared head reads of every channel this process has read.
#[derive(Default)]
pub(super) struct HeadReads {
    channels: Mutex<HashMap<String, Arc<Turns>>>,
}

/// One channel's turns.
#[derive(Default)]
struct Turns {
    state: Mutex<State>,
    /// Told when a read ends (or its request is dropped): every waiting request looks again.
    ended: Notify,
}

#[derive(Default)]
struct State {
    /// How many reads have been sent (the number of the newest).
    sent: u64,
    /// A read is in flight.
    reading: bool,
    /// The newest finished read: its number and what it gave.
    last: Option<(u64, Result<ChannelHead, StoreError>)>,
}

impl Turns {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ends the read in flight: with its result when it finished, without one when its request
/// was dropped (then a waiting request sends the next).
struct Reading<'a> {
    turns: &'a Turns,
    finished: Option<(u64, Result<ChannelHead, StoreError>)>,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let mut state = self.turns.lock();
        state.reading = false;
        if let Some(finished) = self.finished.take() {
            state.last = Some(finished);
        }
        drop(state);
        self.turns.ended.notify_waiters();
    }
}

impl HeadReads {
    /// `channel`'s head: from a read sent after this call began, made by `read` unless another
    /// request's read serves.
    pub(super) async fn head<F, Fut>(
        &self,
        channel: &str,
        read: F,
    ) -> Result<ChannelHead, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<ChannelHead, StoreError>>,
    {
        let turns = self.turns(channel);
        // Any read numbered above this one is sent after now.
        let came = turns.lock().sent;
        let number = loop {
            // Registered before looking, so that an end between the look and the wait is seen.
            let ended = turns.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            {
                let mut state = turns.lock();
                if let Some((number, result)) = &state.last {
                    if *number > came {
                        return result.clone();
                    }
                }
                if !state.reading {
                    state.reading = true;
                    state.sent += 1;
                    break state.sent;
                }
            }
            ended.await;
        };
        let mut reading = Reading {
            turns: &turns,
            finished: None,
        };
        let result = read().await;
        reading.finished = Some((number, result.clone()));
        result
    }

    fn turns(&self, channel: &str) -> Arc<Turns> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        match channels.get(channel) {
            Some(turns) => turns.clone(),
            None => {
                let turns = Arc::new(Turns::default());
                channels.insert(channel.to_string(), turns.clone());
                turns
            }
        }
    }

    /// Forgets `channel` (deleted): its next read starts afresh.
    pub(super) fn forget(&self, channel: &str) {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        channels.remove(channel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;
    use tokio::sync::oneshot;

    fn head(last: u64) -> ChannelHead {
        ChannelHead { oldest: 1, last }
    }

    /// A request that comes while a read is in flight is not answered by it: it gets a later
    /// read (here the value "written" after the first read was sent), which the requests that
    /// came meanwhile share.
    #[tokio::test]
    async fn a_request_takes_only_a_read_sent_after_it_came_and_those_waiting_share_one() {
        let reads = Arc::new(HeadReads::default());
        let sent = Arc::new(AtomicU64::new(0));
        // The value Redis holds; the first read sees 1 and is held until released.
        let value = Arc::new(AtomicU64::new(1));
        let (release, released) = oneshot::channel::<()>();
        let first = tokio::spawn({
            let (reads, sent, value) = (reads.clone(), sent.clone(), value.clone());
            async move {
                reads
                    .head("c", || async move {
                        sent.fetch_add(1, Ordering::SeqCst);
                        let seen = value.load(Ordering::SeqCst);
                        released.await.ok();
                        Ok(head(seen))
                    })
                    .await
            }
        });
        tokio::time::timeout(Duration::from_secs(10), async {
            while sent.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the first read is sent");
        // An append is acknowledged after the first read was sent; then more requests come.
        value.store(2, Ordering::SeqCst);
        let later: Vec<_> = (0..5)
            .map(|_| {
                let (reads, sent, value) = (reads.clone(), sent.clone(), value.clone());
                tokio::spawn(async move {
                    reads
                        .head("c", || async move {
                            sent.fetch_add(1, Ordering::SeqCst);
                            Ok(head(value.load(Ordering::SeqCst)))
                        })
                        .await
                })
            })
            .collect();
        // On this one-thread runtime, each yield lets every spawned request run until it waits.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), head(1));
        for request in later {
            assert_eq!(
                request.await.unwrap().unwrap(),
                head(2),
                "a request must see the append acknowledged before it came"
            );
        }
        assert_eq!(
            sent.load(Ordering::SeqCst),
            2,
            "the five later requests share one read"
        );
    }

    /// The request whose read is in flight is dropped: a request waiting for the next read
    /// makes it instead of waiting for ever.
    #[tokio::test]
    async fn a_dropped_reader_hands_its_turn_on() {
        let reads = Arc::new(HeadReads::default());
        let (sent_tx, sent_rx) = oneshot::channel::<()>();
        let stuck = tokio::spawn({
            let reads = reads.clone();
            async move {
                reads
                    .head("c", || async move {
                        sent_tx.send(()).ok();
                        std::future::pending().await
                    })
                    .await
            }
        });
        sent_rx.await.unwrap();
        let waiting = tokio::spawn({
            let reads = reads.clone();
            async move { reads.head("c", || async { Ok(head(5)) }).await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "waits for the read in flight");
        stuck.abort();
        let got = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiting request reads once the reader is gone");
        assert_eq!(got.unwrap().unwrap(), head(5));
    }

    /// A read that fails answers its waiters with the error; the next request reads again.
    #[tokio::test]
    async fn a_failed_read_is_not_kept() {
        let reads = HeadReads::default();
        let failed = reads
            .head("c", || async {
                Err(StoreError::Unavailable("down".into()))
            })
            .await;
        assert!(matches!(failed, Err(StoreError::Unavailable(_))));
        let again = reads.head("c", || async { Ok(head(7)) }).await;
        assert_eq!(again.unwrap(), head(7));
    }
}
