//! The changes of the large requests this instance appended last, as the log holds them: the
//! batcher reads every range it publishes right after it was appended, and what is held of a
//! range is taken from here instead of read (and decoded) from the log.
//!
//! Invariants:
//! - A change is held only when the append script stored it exactly as it was sent (it says so
//!   per request: no datetime raised, no conflicts count added), built as [`super::log`]
//!   decodes that entry, under the seq the script gave it and the channel's epoch at that
//!   moment. So what is held is what the log holds under that seq in that epoch.
//! - What is held from a range's first seq on is served from here only when the channel's epoch
//!   in Redis is still the one it was appended under (a log lost and begun again has another)
//!   and retention has not passed that seq (`oldest`); the rest of the range is read from the
//!   log in the same round trip ([`super::log`]). Otherwise the whole range is read from the
//!   log, which stays the record.
//! - A change is served once (taken): the batcher reads each new range once, and any later
//!   read of it reads the log.
//! - At most the budget given to [`Recent::new`] is held across channels, in bytes (an eighth
//!   of `--cache-size`); the changes appended longest ago go first (those of an instance that
//!   appends to a channel another instance batches, say).
//! - A range the batcher reads right after a call of this instance appended it is not missed
//!   for want of waiting: the head can move before the call's answer is in (the script's head
//!   message reaches the listener first, or a later call ends first), and a read that finds
//!   nothing held at its first seq waits for the calls that may keep changes and were running
//!   then ([`Recent::begin`], [`Recent::take_from_after_calls`]) — never for later ones, never
//!   for a read that starts at or below the head this instance knew when the call began (the
//!   call's seqs are all above it: a catch-up read of older changes does not wait), and never
//!   past [`WAIT_MOST`].
//!
//! Only requests of 100 changes or more are held (`group.rs` says why). They are held as runs
//! of consecutive seqs, one `VecDeque` each: taking a range moves its changes out, front first,
//! without a search per change.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;

use crate::model::Change;

/// The bytes held at most when no budget is given ([`RedisStore::open`](super::RedisStore::open)):
/// an eighth of `--cache-size`'s default.
pub(super) const HELD_BYTES: usize = 32 << 20;

/// Most runs held (a run whose changes were taken counts until it is the oldest).
const MAX_RUNS: usize = 8192;

/// The longest a read waits for the calls that were running when it found nothing held (a
/// call ends by its own deadline sooner or later; this bounds the wait should one not).
pub(super) const WAIT_MOST: Duration = Duration::from_millis(500);

/// The changes of large requests appended last by this instance (see the module docs).
pub(super) struct Recent {
    inner: Mutex<Inner>,
    /// Told whenever a call that may keep changes ends.
    ended: Notify,
    /// Most bytes held ([`weight`]).
    budget: usize,
}

/// The tests' store: the default budget.
#[cfg(test)]
impl Default for Recent {
    fn default() -> Recent {
        Recent::new(HELD_BYTES)
    }
}

/// The memory a held change takes, near enough: the change and its strings.
fn weight(change: &Change) -> usize {
    std::mem::size_of::<Change>() + change.heap_size()
}

fn weight_of<'a>(changes: impl IntoIterator<Item = &'a Change>) -> usize {
    changes.into_iter().map(weight).sum()
}

#[derive(Default)]
struct Inner {
    channels: HashMap<String, Held>,
    /// What each `keep` added, oldest first: (channel, first seq, last seq).
    runs: VecDeque<(String, u64, u64)>,
    /// The [`weight`] of the changes held across channels.
    bytes: usize,
    /// The calls running that may keep changes, by channel: their tickets, in the order they
    /// began, each with the channel's head as this instance knew it then (every seq the call
    /// appends is above it).
    calls: HashMap<String, BTreeMap<u64, u64>>,
    next_ticket: u64,
}

/// The changes held of one channel, all of one epoch: runs of consecutive seqs, by their first.
struct Held {
    epoch: String,
    runs: BTreeMap<u64, VecDeque<Change>>,
}

/// A call that may keep changes, running (see [`Recent::begin`]); its end is told when it is
/// dropped.
pub(super) struct Call<'a> {
    recent: &'a Recent,
    channel: String,
    ticket: u64,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        {
            let mut inner = self.recent.inner();
            if let Some(tickets) = inner.calls.get_mut(&self.channel) {
                tickets.remove(&self.ticket);
                if tickets.is_empty() {
                    inner.calls.remove(&self.channel);
                }
            }
        }
        self.recent.ended.notify_waiters();
    }
}

impl Recent {
    /// Holds at most `budget` bytes of changes.
    pub(super) fn new(budget: usize) -> Recent {
        Recent {
            inner: Mutex::default(),
            ended: Notify::new(),
            budget,
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a call to `channel` that may keep changes as running, until the [`Call`] is
    /// dropped (after its [`keep`](Recent::keep)); `head` is the channel's head as this
    /// instance knows it now.
    pub(super) fn begin(&self, channel: &str, head: u64) -> Call<'_> {
        let mut inner = self.inner();
        let ticket = inner.next_ticket;
        inner.next_ticket += 1;
        inner
            .calls
            .entry(channel.to_string())
            .or_default()
            .insert(ticket, head);
        Call {
            recent: self,
            channel: channel.to_string(),
            ticket,
        }
    }

    /// Holds `changes` (in seq order), appended to `channel` in `epoch`. Those held of another
    /// epoch go; then the oldest runs go while more than the budget is held.
    pub(super) fn keep(&self, channel: &str, epoch: &str, changes: Vec<Change>) {
        let (Some(first), Some(last)) = (changes.first(), changes.last()) else {
            return;
        };
        let run = (channel.to_string(), first.seq, last.seq);
        let mut guard = self.inner();
        let inner = &mut *guard;
        let held = inner
            .channels
            .entry(channel.to_string())
            .or_insert_with(|| Held {
                epoch: epoch.to_string(),
                runs: BTreeMap::new(),
            });
        // Dropped once the lock is let go.
        let mut gone = Vec::new();
        if held.epoch != epoch {
            inner.bytes -= weight_of(held.runs.values().flatten());
            gone.extend(std::mem::take(&mut held.runs).into_values());
            held.epoch = epoch.to_string();
        }
        inner.bytes += weight_of(&changes);
        held.insert(changes);
        inner.runs.push_back(run);
        // A run whose changes were taken or went with an old epoch counts for nothing: runs
        // are bounded too.
        while inner.bytes > self.budget || inner.runs.len() > MAX_RUNS {
            let Some((channel, first, last)) = inner.runs.pop_front() else {
                break;
            };
            if let Some(held) = inner.channels.get_mut(&channel) {
                // What is still held of a keep's changes lies in runs that begin within them.
                let starts: Vec<u64> = held.runs.range(first..=last).map(|(s, _)| *s).collect();
                for start in starts {
                    if let Some(run) = held.runs.remove(&start) {
                        inner.bytes -= weight_of(&run);
                        gone.push(run);
                    }
                }
                if held.runs.is_empty() {
                    inner.channels.remove(&channel);
                }
            }
        }
        drop(guard);
        drop(gone);
    }

    /// How many changes of `channel` are held from `from` on without a gap: a read of that many
    /// from `from` costs no round trip more than a read of one.
    pub(super) fn held_from(&self, channel: &str, from: u64) -> usize {
        let inner = self.inner();
        let Some(held) = inner.channels.get(channel) else {
            return 0;
        };
        let mut next = from;
        while let Some((&first, run)) = held.runs.range(..=next).next_back() {
            let end = first + run.len() as u64;
            if next >= end {
                break;
            }
            next = end;
        }
        usize::try_from(next - from).unwrap_or(usize::MAX)
    }

    /// [`Inner::take_from`], without waiting.
    #[cfg(test)]
    fn take_from(&self, channel: &str, from: u64, upto: u64) -> Option<(String, Vec<Change>)> {
        self.inner().take_from(channel, from, upto)
    }

    /// Takes the changes of `channel` held from `from` on ([`Inner::take_from`]); but when
    /// nothing is held at `from`, first waits for the calls to `channel` that may keep changes
    /// and are running now to end (at most [`WAIT_MOST`]), then takes what they kept. Only
    /// calls that may append `from` count: those that began with the head below it.
    pub(super) async fn take_from_after_calls(
        &self,
        channel: &str,
        from: u64,
        upto: u64,
    ) -> Option<(String, Vec<Change>)> {
        let deadline = tokio::time::Instant::now() + WAIT_MOST;
        // The newest ticket running when nothing was found first.
        let mut newest = None;
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            // From here on, an end is not missed.
            ended.as_mut().enable();
            {
                let mut inner = self.inner();
                if let Some(taken) = inner.take_from(channel, from, upto) {
                    return Some(taken);
                }
                // The calls running that may append `from`, by ticket.
                let mut running = inner
                    .calls
                    .get(channel)
                    .into_iter()
                    .flatten()
                    .filter(|&(_, &head)| head < from)
                    .map(|(&ticket, _)| ticket);
                let oldest = running.next()?;
                let newest = *newest.get_or_insert_with(|| running.next_back().unwrap_or(oldest));
                if oldest > newest {
                    return None;
                }
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return None;
            }
        }
    }
}

impl Inner {
    /// Changes held across channels.
    #[cfg(test)]
    fn held(&self) -> usize {
        let runs = self.channels.values().flat_map(|held| held.runs.values());
        runs.map(VecDeque::len).sum()
    }

    /// Takes the changes of `channel` held from `from` on, up to `upto` at most (they stop
    /// where one is not held), with the epoch they were appended in; none when `from` is not
    /// held. They are read once: the batcher reads each new range once, and a second read of
    /// it (a catch-up request) reads the log.
    fn take_from(&mut self, channel: &str, from: u64, upto: u64) -> Option<(String, Vec<Change>)> {
        let held = self.channels.get_mut(channel)?;
        // The runs taken, whole or in part, in seq order: joined below.
        let mut taken: Vec<VecDeque<Change>> = Vec::new();
        let mut next = from;
        while next <= upto {
            // The run that holds `next`, if any.
            let Some((&first, run)) = held.runs.range(..=next).next_back() else {
                break;
            };
            if next - first >= run.len() as u64 {
                break;
            }
            let Some(mut run) = held.runs.remove(&first) else {
                break;
            };
            if next > first {
                // What comes before `next` stays held.
                let rest = run.split_off((next - first) as usize);
                held.runs.insert(first, run);
                run = rest;
            }
            let wanted = usize::try_from((upto - next).saturating_add(1)).unwrap_or(usize::MAX);
            if run.len() > wanted {
                let rest = run.split_off(wanted);
                held.runs.insert(next + wanted as u64, rest);
                taken.push(run);
                break;
            }
            next += run.len() as u64;
            taken.push(run);
        }
        let out = joined(taken)?;
        self.bytes -= weight_of(&out);
        let epoch = held.epoch.clone();
        if held.runs.is_empty() {
            self.channels.remove(channel);
        }
        Some((epoch, out))
    }
}

/// The runs one after the other in one vector; none when there are none. The first becomes
/// the vector without a copy (a run is a `Vec` turned into a `VecDeque` by [`Held::insert`],
/// so its changes start at the front of its buffer), which is then grown once for the rest:
/// the batcher takes several requests' runs at once, and each copy of 1,000 changes is a fifth
/// of a megabyte.
fn joined(runs: Vec<VecDeque<Change>>) -> Option<Vec<Change>> {
    let rest: usize = runs.iter().skip(1).map(VecDeque::len).sum();
    let mut runs = runs.into_iter();
    let mut out = Vec::from(runs.next()?);
    out.reserve_exact(rest);
    for run in runs {
        out.extend(run);
    }
    (!out.is_empty()).then_some(out)
}

impl Held {
    /// Adds `changes` (in seq order, none held already), one run per stretch of consecutive
    /// seqs (a replayed request leaves a gap), cut at each gap from the back. Without a gap,
    /// the common case, the `Vec` becomes the run's `VecDeque` without a copy.
    fn insert(&mut self, mut changes: Vec<Change>) {
        while let Some(gap) = changes
            .windows(2)
            .rposition(|pair| pair[1].seq != pair[0].seq + 1)
        {
            let run = changes.split_off(gap + 1);
            self.put(run);
        }
        self.put(changes);
    }

    fn put(&mut self, run: Vec<Change>) {
        if let Some(first) = run.first().map(|c| c.seq) {
            self.runs.insert(first, VecDeque::from(run));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ChangeType, NewChange};
    use time::OffsetDateTime;

    fn run(first: u64, n: u64) -> Vec<Change> {
        (first..first + n)
            .map(|seq| {
                let new = NewChange::new(format!("http://example.com/{seq}"), ChangeType::Updated);
                Change::from_new(seq, new, OffsetDateTime::UNIX_EPOCH)
            })
            .collect()
    }

    fn seqs(got: Option<(String, Vec<Change>)>) -> Option<(String, Vec<u64>)> {
        got.map(|(epoch, changes)| (epoch, changes.iter().map(|c| c.seq).collect()))
    }

    #[test]
    fn what_is_held_is_taken_from_the_start_of_a_range_to_its_first_gap() {
        let recent = Recent::default();
        recent.keep("c", "e1", run(1, 10));
        // 11..=12 never kept (not stored as sent); 13.. kept.
        recent.keep("c", "e1", run(13, 5));
        assert_eq!(
            seqs(recent.take_from("c", 2, 4)),
            Some(("e1".into(), vec![2, 3, 4]))
        );
        assert!(recent.take_from("c", 2, 4).is_none(), "taken once");
        assert_eq!(
            seqs(recent.take_from("c", 9, 14)).map(|s| s.1),
            Some(vec![9, 10]),
            "to the gap"
        );
        assert_eq!(
            seqs(recent.take_from("c", 16, 20)).map(|s| s.1),
            Some(vec![16, 17])
        );
        assert!(recent.take_from("c", 11, 14).is_none(), "not held");
        assert!(recent.take_from("d", 1, 1).is_none(), "another channel");
        // Left: 1, 5..=8, 13..=15.
        assert_eq!(recent.inner().held(), 8);
    }

    #[test]
    fn a_range_taken_from_within_a_run_leaves_the_rest_of_it_held() {
        let recent = Recent::default();
        recent.keep("c", "e1", run(1, 10));
        assert_eq!(
            seqs(recent.take_from("c", 4, 6)).map(|s| s.1),
            Some(vec![4, 5, 6])
        );
        assert_eq!(
            seqs(recent.take_from("c", 1, 2)).map(|s| s.1),
            Some(vec![1, 2])
        );
        assert_eq!(
            seqs(recent.take_from("c", 3, 100)).map(|s| s.1),
            Some(vec![3])
        );
        assert_eq!(
            seqs(recent.take_from("c", 7, 100)).map(|s| s.1),
            Some(vec![7, 8, 9, 10])
        );
        assert_eq!(recent.inner().held(), 0);
        assert!(recent.inner().channels.is_empty());
    }

    #[test]
    fn changes_kept_with_a_gap_are_taken_up_to_it() {
        let recent = Recent::default();
        // A call whose middle request was a replay: 1..=3 and 6..=7 stored as sent.
        let mut changes = run(1, 3);
        changes.extend(run(6, 2));
        recent.keep("c", "e1", changes);
        assert_eq!(
            seqs(recent.take_from("c", 1, 7)).map(|s| s.1),
            Some(vec![1, 2, 3])
        );
        assert!(recent.take_from("c", 4, 7).is_none());
        assert_eq!(
            seqs(recent.take_from("c", 6, 7)).map(|s| s.1),
            Some(vec![6, 7])
        );
    }

    #[tokio::test]
    async fn a_read_that_finds_nothing_held_waits_for_the_calls_running_then() {
        let recent = std::sync::Arc::new(Recent::default());
        // Nothing held and no call running: no wait.
        assert!(recent.take_from_after_calls("c", 1, 10).await.is_none());
        // A call runs; the head has moved already (its answer is not in yet).
        let call = recent.begin("c", 0);
        let read = {
            let recent = recent.clone();
            tokio::spawn(async move { seqs(recent.take_from_after_calls("c", 1, 10).await) })
        };
        tokio::task::yield_now().await;
        assert!(!read.is_finished());
        recent.keep("c", "e1", run(1, 5));
        drop(call);
        let got = tokio::time::timeout(WAIT_MOST / 2, read)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, Some(("e1".into(), vec![1, 2, 3, 4, 5])));
    }

    #[tokio::test]
    async fn a_read_does_not_wait_for_calls_begun_after_it_or_past_the_bound() {
        let recent = std::sync::Arc::new(Recent::default());
        let first = recent.begin("c", 0);
        let read = {
            let recent = recent.clone();
            tokio::spawn(async move { recent.take_from_after_calls("c", 1, 10).await.is_none() })
        };
        tokio::task::yield_now().await;
        // A later call begins, then the first ends without keeping anything: the read gives up
        // at once, whatever the later one will do.
        let _later = recent.begin("c", 0);
        drop(first);
        let started = tokio::time::Instant::now();
        assert!(read.await.unwrap());
        assert!(started.elapsed() < WAIT_MOST);
        // A call that never ends holds a read back for WAIT_MOST at most.
        let started = tokio::time::Instant::now();
        assert!(recent.take_from_after_calls("c", 1, 10).await.is_none());
        assert!(started.elapsed() >= WAIT_MOST);
        // Calls of another channel are not waited for.
        assert!(recent.take_from_after_calls("d", 1, 10).await.is_none());
    }

    #[tokio::test]
    async fn a_read_at_or_below_the_head_a_call_began_with_does_not_wait_for_it() {
        let recent = Recent::default();
        // The head was 100 when the call began: it appends 101 and up.
        let _call = recent.begin("c", 100);
        let started = std::time::Instant::now();
        assert!(recent.take_from_after_calls("c", 100, 110).await.is_none());
        assert!(recent.take_from_after_calls("c", 1, 10).await.is_none());
        assert!(started.elapsed() < WAIT_MOST);
    }

    #[test]
    fn a_new_epoch_drops_what_was_held_of_the_old() {
        let recent = Recent::default();
        recent.keep("c", "e1", run(1, 10));
        recent.keep("c", "e2", run(1, 3));
        assert_eq!(recent.inner().held(), 3);
        assert!(recent.take_from("c", 4, 4).is_none());
        assert_eq!(
            seqs(recent.take_from("c", 1, 3)),
            Some(("e2".into(), vec![1, 2, 3]))
        );
        assert_eq!(recent.inner().held(), 0);
    }

    #[test]
    fn the_changes_appended_longest_ago_go_first_past_the_budget() {
        let per_run = 1000;
        let one = weight_of(&run(1, per_run));
        let recent = Recent::new(5 * one + one / 2);
        let runs = 8;
        // Runs alternate between two channels.
        let channel = |i: u64| if i.is_multiple_of(2) { "c" } else { "d" };
        for i in 0..runs {
            recent.keep(channel(i), "e", run(1 + i * per_run, per_run));
        }
        let (held, bytes) = {
            let inner = recent.inner();
            (inner.held(), inner.bytes)
        };
        assert_eq!(held, 5 * per_run as usize, "{bytes} bytes of {}", 5 * one);
        assert!(recent.take_from("c", 1, 1).is_none(), "the first run went");
        let newest = 1 + (runs - 1) * per_run;
        let (_, got) = recent
            .take_from(channel(runs - 1), newest, newest + per_run - 1)
            .unwrap();
        assert_eq!(got.len(), per_run as usize);
        assert_eq!(recent.inner().held(), 4 * per_run as usize);
        assert_eq!(
            recent.inner().bytes,
            bytes - one,
            "what is taken counts no more"
        );
    }

    #[test]
    fn what_is_held_from_a_seq_on_is_counted_to_the_first_gap() {
        let recent = Recent::default();
        assert_eq!(recent.held_from("c", 1), 0);
        recent.keep("c", "e", run(1, 10));
        recent.keep("c", "e", run(11, 5));
        recent.keep("c", "e", run(20, 5));
        assert_eq!(recent.held_from("c", 1), 15, "two runs back to back");
        assert_eq!(recent.held_from("c", 4), 12);
        assert_eq!(recent.held_from("c", 16), 0, "a gap");
        assert_eq!(recent.held_from("c", 22), 3);
        assert_eq!(recent.held_from("d", 1), 0, "another channel");
        recent.take_from("c", 1, 5);
        assert_eq!(recent.held_from("c", 1), 0, "taken");
        assert_eq!(recent.held_from("c", 6), 10);
    }
}
