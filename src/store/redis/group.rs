//! Group commit of appends: the appends of one channel that come while an append script call
//! for that channel runs wait, and the next call takes all of them together (up to
//! [`MAX_CHANGES`] changes or [`MAX_BYTES`] bytes of arguments; a request is never split).
//! Each caller gets its own outcome; the script treats every request of a call as a call of
//! its own (`scripts/append.lua`).
//!
//! A channel has at most one such call in flight per process: appends gather while Redis runs
//! the previous one, as in the embedded store's writer. An append that finds no call running
//! for its channel makes its own at once, alone, from its own task: a lone append waits for
//! nothing (no linger) and costs what it did before grouping. The appends that come meanwhile
//! wait; when that call ends, a writer task for the channel takes them, one call for all of
//! them after the other, and ends as soon as nothing waits (or once the store is dropped).
//!
//! A request of [`ALONE_FROM`] changes or more makes its own call at once whatever runs, as
//! every append did before grouping: the cost of a call is small beside that of its changes,
//! so sharing one would save it little, while waiting would leave Redis idle between calls
//! (measured on a two-core machine, requests from 8 connections each waiting their turn:
//! 0.65–0.8 of the rate of sending them at once with 1,000 changes, 0.8 with 500).
//!
//! Deadlines are the callers': each request has [`OP_TIMEOUT`] from its arrival. One whose
//! time ran out before its call began is refused without being sent; a call gives up at the
//! earliest deadline of its requests, and then (or when it fails) every request of it gets the
//! error — an outcome unknown for a timeout, as for one append alone.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::conn::Conn;
use super::events::{known_head, raise, Heads};
use super::fold::Folds;
use super::log::{append_call, locs_needed, outcome, run_script, Answer, Request};
use super::recent::Recent;
use super::{count_errors, write_until, OP_TIMEOUT};
use crate::store::{Appended, StoreError};

/// A request of this many changes or more makes its own call at once, alone.
const ALONE_FROM: usize = 100;
/// The changes of a request of this many or more are kept for the batcher's read
/// (`recent.rs`); smaller ones are read back from the log. Measured with 1-change requests from
/// 64 connections on two cores: keeping every request's changes cost the hub about 5 µs more
/// per request than reading them back (their many small allocations, made by the web layer's
/// threads, then lived on and were freed by the batcher's: malloc's slow paths doubled), while
/// with 1,000-change requests keeping them took a third off the hub's CPU (3.8 → 2.6 ms per
/// request; docs/performance.md, twenty-second pass).
const KEEP_FROM: usize = ALONE_FROM;
/// A call takes no more waiting requests once it holds this many changes.
const MAX_CHANGES: usize = 1000;
/// … or this many bytes of entries and locs.
const MAX_BYTES: usize = 4 << 20;

/// How long a channel's calls send their locs after the script last refused one without them.
/// Appends are written inline only while some FeedSync item carries conflicts (after a
/// merge): meanwhile one call a minute is sent twice (refused without its locs, then with
/// them), and within a minute of the last conflict's end calls go without them again.
const INLINE_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// An append waiting for its call.
struct Waiting {
    request: Request,
    /// When its caller stops waiting ([`OP_TIMEOUT`] after it came).
    deadline: Instant,
    reply: oneshot::Sender<Result<Appended, StoreError>>,
}

/// The appends of a store: what waits, per channel, and what the writers need.
pub(super) struct Appends {
    conn: Conn,
    /// The append script (`feedsync.lua` + `append.lua`).
    script: redis::Script,
    heads: Heads,
    /// Where the changes stored as sent are kept for the batcher's read.
    recent: Arc<Recent>,
    /// Where the entries stored as sent are kept for the fold of the resource index.
    pub(super) folds: Arc<Folds>,
    /// Cancelled when the store is dropped.
    stop: CancellationToken,
    /// The channels with a call running (an append's own, or a writer task's), each with the
    /// appends waiting for the next call (no entry: no call runs). Changed only under the
    /// lock, so that no append is ever left without a call to come.
    waiting: Mutex<HashMap<String, VecDeque<Waiting>>>,
    /// The channels whose appends the script lately wrote inline (it then needs the changes'
    /// locs, which a call leaves out otherwise), with when to try without them again.
    inline: Mutex<HashMap<String, Instant>>,
}

impl Appends {
    pub(super) fn new(
        conn: Conn,
        script: redis::Script,
        heads: Heads,
        recent: Arc<Recent>,
        folds: Arc<Folds>,
        stop: CancellationToken,
    ) -> Arc<Appends> {
        Arc::new(Appends {
            conn,
            script,
            heads,
            recent,
            folds,
            stop,
            waiting: Mutex::default(),
            inline: Mutex::default(),
        })
    }

    /// Whether a call for `channel` sends its changes' locs: only while the channel's appends
    /// are written inline, as far as this process last heard (see [`INLINE_FOR`]).
    fn sends_locs(&self, channel: &str) -> bool {
        let mut inline = self.inline.lock().unwrap_or_else(|e| e.into_inner());
        match inline.get(channel) {
            Some(&until) if Instant::now() < until => true,
            Some(_) => {
                inline.remove(channel);
                false
            }
            None => false,
        }
    }

    /// Notes that the script refused a call for `channel` for want of its locs.
    fn inline_for_now(&self, channel: &str) {
        let mut inline = self.inline.lock().unwrap_or_else(|e| e.into_inner());
        inline.insert(channel.to_string(), Instant::now() + INLINE_FOR);
    }

    fn waiting(&self) -> MutexGuard<'_, HashMap<String, VecDeque<Waiting>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `waiting` for the channel's next call when one runs; else marks the channel's
    /// call as running and gives `waiting` back, for its own call.
    fn wait_or_lead(&self, channel: &str, waiting: Waiting) -> Option<Waiting> {
        let mut queues = self.waiting();
        match queues.get_mut(channel) {
            Some(queue) => {
                queue.push_back(waiting);
                None
            }
            None => {
                queues.insert(channel.to_string(), VecDeque::new());
                Some(waiting)
            }
        }
    }

    /// Appends `request` to `channel`: at once when no call for the channel runs, else with
    /// the next call of the channel's writer.
    pub(super) async fn append(
        self: &Arc<Self>,
        channel: &str,
        request: Request,
    ) -> Result<Appended, StoreError> {
        // No faster than the resource index follows (fold.rs).
        self.folds.wait_for_room().await;
        let (reply, answer) = oneshot::channel();
        let waiting = Waiting {
            request,
            deadline: Instant::now() + OP_TIMEOUT,
            reply,
        };
        // A large request goes at once, alone, whatever else runs (as every append did before
        // grouping): sharing a call would save it little, and waiting for the channel's call
        // would leave Redis idle between calls.
        let large = waiting.request.len() >= ALONE_FROM || waiting.request.size() >= MAX_BYTES;
        if large {
            call(self, channel, vec![waiting]).await;
        } else if let Some(waiting) = self.wait_or_lead(channel, waiting) {
            // This append makes the call itself, from its own task (a lone append costs what
            // it did before grouping: no task to start, no hand-off); the appends that come
            // meanwhile wait, and a writer takes them afterwards — also should this call be
            // dropped half-way.
            let _hand_over = HandOver {
                appends: self,
                channel,
            };
            call(self, channel, vec![waiting]).await;
        }
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::OutcomeUnknown(
                "the channel's writer stopped".into(),
            ))
        })
    }
}

/// Ends an append's own call ([`Appends::append`]): the channel is free again if nothing
/// waits, else a writer task takes what waits.
struct HandOver<'a> {
    appends: &'a Arc<Appends>,
    channel: &'a str,
}

impl Drop for HandOver<'_> {
    fn drop(&mut self) {
        let mut queues = self.appends.waiting();
        if queues.get(self.channel).is_some_and(|q| !q.is_empty()) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(write(self.appends.clone(), self.channel.to_string()));
                return;
            }
        }
        // Nothing waits (or no runtime is left to write it: then it is refused).
        let queue = queues.remove(self.channel);
        drop(queues);
        fail(queue.into_iter().flatten());
    }
}

/// Refuses appends that no writer will take.
fn fail(waiting: impl Iterator<Item = Waiting>) {
    for w in waiting {
        let _ = w.reply.send(Err(StoreError::Unavailable(
            "the channel's writer stopped".into(),
        )));
    }
}

/// The writer of `channel`, started when appends wait after an append's own call: one script
/// call after the other, each for everything that waits, until nothing does.
async fn write(appends: Arc<Appends>, channel: String) {
    // Should the task end otherwise (a panic, the runtime shutting down), the channel must not
    // be left with appends that no writer will ever take.
    let mut running = Running {
        appends: &appends,
        channel: &channel,
        done: false,
    };
    loop {
        let batch = {
            let mut queues = appends.waiting();
            let batch = match queues.get_mut(&channel) {
                Some(queue) => take(queue, Instant::now()),
                None => Vec::new(),
            };
            if batch.is_empty() {
                queues.remove(&channel);
                running.done = true;
                return;
            }
            batch
        };
        if appends.stop.is_cancelled() {
            for w in batch {
                let _ = w
                    .reply
                    .send(Err(StoreError::Unavailable("store closed".into())));
            }
            continue;
        }
        call(&appends, &channel, batch).await;
    }
}

/// Removes the channel's queue when its writer ends early, failing what waits in it.
struct Running<'a> {
    appends: &'a Appends,
    channel: &'a str,
    done: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let queue = self.appends.waiting().remove(self.channel);
        fail(queue.into_iter().flatten());
    }
}

/// Takes the requests of the next call from the front of `queue`: the first one whatever its
/// size, then the following ones while they fit in [`MAX_CHANGES`] and [`MAX_BYTES`]. Requests
/// whose caller went away are dropped unsent; those whose deadline passed before `now` are
/// refused unsent.
fn take(queue: &mut VecDeque<Waiting>, now: Instant) -> Vec<Waiting> {
    let mut batch = Vec::new();
    let (mut changes, mut bytes) = (0, 0);
    while let Some(next) = queue.front() {
        if next.reply.is_closed() {
            queue.pop_front();
            continue;
        }
        if next.deadline <= now {
            if let Some(late) = queue.pop_front() {
                count_errors(1);
                let _ = late.reply.send(Err(StoreError::Unavailable(
                    "redis did not answer in time".into(),
                )));
            }
            continue;
        }
        // An empty request counts as one change, so that a call holds at most MAX_CHANGES
        // requests.
        let (c, b) = (next.request.len().max(1), next.request.size());
        if !batch.is_empty() && (changes + c > MAX_CHANGES || bytes + b > MAX_BYTES) {
            break;
        }
        changes += c;
        bytes += b;
        batch.extend(queue.pop_front());
    }
    batch
}

/// Appends `batch` to `channel` with one script call, then answers each request.
async fn call(appends: &Appends, channel: &str, batch: Vec<Waiting>) {
    let Some(deadline) = batch.iter().map(|w| w.deadline).min() else {
        return;
    };
    let requests: Vec<&Request> = batch.iter().map(|w| &w.request).collect();
    let locs = appends.sends_locs(channel);
    let call = append_call(&appends.script, channel, &requests, locs);
    // Reads that find nothing held wait for this call to end when it may keep changes: the
    // head can move before its answer is in (recent.rs). Ends when dropped, after the keep.
    let _running = requests.iter().any(|r| r.len() >= KEEP_FROM).then(|| {
        appends
            .recent
            .begin(channel, known_head(&appends.heads, channel))
    });
    let mut conn = appends.conn.clone();
    let answer: Result<Answer, StoreError> = write_until(deadline, batch.len() as u64, async {
        match run_script::<redis::Value>(&appends.script, &call, &mut conn).await {
            // Refused before it wrote anything: sent again with the locs.
            Err(e) if !locs && locs_needed(&e) => {
                appends.inline_for_now(channel);
                let call = append_call(&appends.script, channel, &requests, true);
                run_script(&appends.script, &call, &mut conn).await
            }
            other => other,
        }
    })
    .await
    .and_then(|reply| Answer::read(reply, batch.len()));
    let (outcomes, epoch): (Vec<Result<Appended, StoreError>>, _) = match &answer {
        Ok(answer) => (
            answer.numbers.chunks(5).map(outcome).collect(),
            answer.epoch.as_deref(),
        ),
        Err(e) => (batch.iter().map(|_| Err(e.clone())).collect(), None),
    };
    let mut replies = Vec::with_capacity(batch.len());
    for (i, (w, o)) in batch.into_iter().zip(outcomes).enumerate() {
        // (The script answers 0 for a replay or a conflict.)
        let as_sent = answer.as_ref().is_ok_and(|a| a.numbers[5 * i + 4] == 1);
        let large = w.request.len() >= KEEP_FROM;
        let mut request = w.request;
        if let (true, true, Some(epoch), Ok(appended)) = (large, as_sent, epoch, &o) {
            // The changes stored as sent are kept before the head moves (the batcher reads
            // them as soon as it does), as the request's own vector. Encoded by this process
            // a moment ago, so they read back; should they not, the batcher reads them from
            // the log.
            if let Ok(changes) = request.take_changes(appended.first) {
                appends.recent.keep(channel, epoch, changes);
            }
        }
        match &o {
            Ok(appended) if !appended.replayed => {
                let floor = answer.as_ref().ok().and_then(|a| a.floors[i].as_deref());
                let entries = request.take_entries(floor);
                appends
                    .folds
                    .appended(channel, appended.first, Some(entries));
            }
            _ => {}
        }
        replies.push((w.reply, o));
    }
    // The head moves before anyone hears of the append, as for one append alone.
    let last = replies
        .iter()
        .filter_map(|(_, o)| o.as_ref().ok())
        .filter(|a| !a.replayed)
        .map(|a| a.last)
        .max();
    if let Some(last) = last {
        raise(&appends.heads, channel, last);
    }
    for (reply, o) in replies {
        let _ = reply.send(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ChangeType, NewChange};
    use std::time::Duration;
    use time::OffsetDateTime;

    fn waiting(
        changes: usize,
        deadline: Instant,
    ) -> (Waiting, oneshot::Receiver<Result<Appended, StoreError>>) {
        let changes = (0..changes)
            .map(|i| NewChange::new(format!("http://example.com/{i}"), ChangeType::Updated))
            .collect();
        let request = Request::new(changes, None, OffsetDateTime::UNIX_EPOCH).unwrap();
        let (reply, answer) = oneshot::channel();
        let w = Waiting {
            request,
            deadline,
            reply,
        };
        (w, answer)
    }

    fn sizes(batch: &[Waiting]) -> Vec<usize> {
        batch.iter().map(|w| w.request.len()).collect()
    }

    #[test]
    fn a_call_takes_what_fits_and_never_splits_a_request() {
        let later = Instant::now() + Duration::from_secs(60);
        let mut answers = Vec::new();
        let mut queue = VecDeque::new();
        for n in [1500, 400, 500, 100, 1, 0, 999] {
            let (w, a) = waiting(n, later);
            queue.push_back(w);
            answers.push(a);
        }
        let now = Instant::now();
        assert_eq!(sizes(&take(&mut queue, now)), [1500], "a large one alone");
        assert_eq!(sizes(&take(&mut queue, now)), [400, 500, 100]);
        assert_eq!(sizes(&take(&mut queue, now)), [1, 0]);
        assert_eq!(sizes(&take(&mut queue, now)), [999]);
        assert!(take(&mut queue, now).is_empty());
    }

    #[test]
    fn gone_callers_are_dropped_and_late_ones_refused_unsent() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut queue = VecDeque::new();
        let (gone, answer) = waiting(1, later);
        drop(answer);
        queue.push_back(gone);
        let (late, mut late_answer) = waiting(2, now);
        queue.push_back(late);
        let (kept, _answer) = waiting(3, later);
        queue.push_back(kept);
        assert_eq!(sizes(&take(&mut queue, now)), [3]);
        assert!(matches!(
            late_answer.try_recv(),
            Ok(Err(StoreError::Unavailable(_)))
        ));
        assert!(queue.is_empty());
    }
}
