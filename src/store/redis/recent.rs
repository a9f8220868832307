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
//! - At most [`MAX_HELD`] changes are held across channels; the ones appended longest ago go
//!   first (those of an instance that appends to a channel another instance batches, say).
//!
//! Only requests of 100 changes or more are held (`group.rs` says why).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use crate::model::Change;

/// Most changes held, across channels: two of the batcher's largest reads (4,000 changes);
/// at a few hundred bytes a change (an estimate, not measured), about 3 MiB.
pub(super) const MAX_HELD: usize = 8192;

/// The changes of large requests appended last by this instance (see the module docs).
#[derive(Default)]
pub(super) struct Recent {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    channels: HashMap<String, Held>,
    /// What each `keep` added, oldest first: (channel, first seq, last seq).
    runs: VecDeque<(String, u64, u64)>,
    /// Changes held across channels.
    held: usize,
}

/// The changes held of one channel, all of one epoch, by seq.
struct Held {
    epoch: String,
    changes: BTreeMap<u64, Change>,
}

impl Recent {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `changes` (in seq order), appended to `channel` in `epoch`. Those held of another
    /// epoch go; then the oldest runs go while more than [`MAX_HELD`] are held.
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
                changes: BTreeMap::new(),
            });
        if held.epoch != epoch {
            inner.held -= held.changes.len();
            held.changes.clear();
            held.epoch = epoch.to_string();
        }
        for change in changes {
            if held.changes.insert(change.seq, change).is_none() {
                inner.held += 1;
            }
        }
        inner.runs.push_back(run);
        // Dropped once the lock is let go.
        let mut gone = Vec::new();
        // A run whose changes were taken or went with an old epoch counts for nothing: runs
        // are bounded too.
        while inner.held > MAX_HELD || inner.runs.len() > MAX_HELD {
            let Some((channel, first, last)) = inner.runs.pop_front() else {
                break;
            };
            if let Some(held) = inner.channels.get_mut(&channel) {
                // The run's seqs still held (a run is at most one script call's).
                let seqs: Vec<u64> = held.changes.range(first..=last).map(|(s, _)| *s).collect();
                gone.extend(seqs.iter().filter_map(|seq| held.changes.remove(seq)));
                inner.held -= seqs.len();
                if held.changes.is_empty() {
                    inner.channels.remove(&channel);
                }
            }
        }
        drop(guard);
        drop(gone);
    }

    /// Takes the changes of `channel` held from `from` on, up to `upto` at most (they stop
    /// where one is not held), with the epoch they were appended in; none when `from` is not
    /// held. They are read once: the batcher reads each new range once, and a second read of
    /// it (a catch-up request) reads the log.
    pub(super) fn take_from(
        &self,
        channel: &str,
        from: u64,
        upto: u64,
    ) -> Option<(String, Vec<Change>)> {
        let mut guard = self.inner();
        let inner = &mut *guard;
        let held = inner.channels.get_mut(channel)?;
        let mut out = Vec::new();
        let mut next = from;
        while next <= upto {
            let Some(change) = held.changes.remove(&next) else {
                break;
            };
            out.push(change);
            next += 1;
        }
        if out.is_empty() {
            return None;
        }
        inner.held -= out.len();
        Some((held.epoch.clone(), out))
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
        assert_eq!(recent.inner().held, 8);
    }

    #[test]
    fn a_new_epoch_drops_what_was_held_of_the_old() {
        let recent = Recent::default();
        recent.keep("c", "e1", run(1, 10));
        recent.keep("c", "e2", run(1, 3));
        assert_eq!(recent.inner().held, 3);
        assert!(recent.take_from("c", 4, 4).is_none());
        assert_eq!(
            seqs(recent.take_from("c", 1, 3)),
            Some(("e2".into(), vec![1, 2, 3]))
        );
        assert_eq!(recent.inner().held, 0);
    }

    #[test]
    fn the_changes_appended_longest_ago_go_first_past_the_bound() {
        let recent = Recent::default();
        let per_run = 1000;
        let runs = MAX_HELD as u64 / per_run + 2;
        // Runs alternate between two channels.
        let channel = |i: u64| if i.is_multiple_of(2) { "c" } else { "d" };
        for i in 0..runs {
            recent.keep(channel(i), "e", run(1 + i * per_run, per_run));
        }
        let held = recent.inner().held;
        assert!(held <= MAX_HELD, "{held} held");
        assert!(held > MAX_HELD - per_run as usize, "{held} held");
        assert!(recent.take_from("c", 1, 1).is_none(), "the first run went");
        let newest = 1 + (runs - 1) * per_run;
        let (_, got) = recent
            .take_from(channel(runs - 1), newest, newest + per_run - 1)
            .unwrap();
        assert_eq!(got.len(), per_run as usize);
    }
}
