//! Signatures of shared notifications, eight subscribers at a time.
//!
//! Every subscriber with a secret gets the same notification body signed with its own key.
//! Subscriptions of a channel that sign with SHA-256 are put in groups of up to eight (one
//! lane each, for as long as the subscription's [`Lane`] lives); the first member of a group
//! to sign a notification signs it for the whole group at once
//! ([`crate::model::signature_lanes`]), and the others take their tag from the group.
//!
//! Invariants:
//! - A tag is only ever taken for the notification and the key it was made for: a group keeps
//!   the notifications it signed by a `Weak` pointer (the allocation cannot be reused for
//!   another notification while it is held) and each lane's key by the id of the lane that
//!   held it then. A member that joined after the group signed a notification, or that is
//!   behind every notification the group keeps, signs alone (the caller's one-key path).
//! - Memory is bounded per group: the tags of its last `KEPT` (16) notifications.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::model::signature_lanes::{self, Sha256Key, LANES};
use crate::model::Notification;

/// Notifications whose tags a group keeps: members up to this many notifications apart (in a
/// burst, workers drift apart) still share them. 336 bytes each (`Signed`).
const KEPT: usize = 16;

/// The groups of every channel.
#[derive(Default)]
pub struct SignGroups {
    channels: Mutex<HashMap<String, Vec<Arc<Group>>>>,
    /// Lane ids, never reused (0: no key).
    ids: AtomicU64,
}

#[derive(Default)]
struct Group {
    state: Mutex<GroupState>,
}

#[derive(Default)]
struct GroupState {
    /// Each lane's key and the id of the lane that holds it.
    keys: [Option<(u64, Sha256Key)>; LANES],
    /// The newest notifications signed, oldest first.
    signed: VecDeque<Signed>,
}

struct Signed {
    notification: Weak<Notification>,
    first: u64,
    /// The lane id each tag was made for (0: the lane was free).
    ids: [u64; LANES],
    tags: [[u8; 32]; LANES],
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One subscription's place in a group; the lane is free again when this is dropped.
pub struct Lane {
    group: Arc<Group>,
    lane: usize,
    id: u64,
}

impl SignGroups {
    /// A lane for a SHA-256 `secret` of a subscription to `channel`; `None` when this CPU
    /// cannot sign eight at once (then every signature is made alone).
    pub fn join(&self, channel: &str, secret: &[u8]) -> Option<Lane> {
        if !signature_lanes::available() {
            return None;
        }
        let key = Sha256Key::new(secret);
        let id = self.ids.fetch_add(1, Ordering::Relaxed) + 1;
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        let groups = channels.entry(channel.to_string()).or_default();
        for group in groups.iter() {
            let mut state = group.lock();
            if let Some(lane) = state.keys.iter().position(Option::is_none) {
                state.keys[lane] = Some((id, key));
                return Some(Lane {
                    group: group.clone(),
                    lane,
                    id,
                });
            }
        }
        let group = Arc::new(Group::default());
        group.lock().keys[0] = Some((id, key));
        groups.push(group.clone());
        Some(Lane { group, lane: 0, id })
    }
}

impl Lane {
    /// The HMAC-SHA256 tag of `n`'s body under this lane's key: the group's when a member
    /// signed `n` for it, else made now for the whole group. `None` when this member must sign
    /// alone (it joined after the group signed `n`, or `n` is older than every notification
    /// the group keeps).
    pub fn sign(&self, n: &Arc<Notification>) -> Option<[u8; 32]> {
        let mut state = self.group.lock();
        // Newest first: members in step look for what the first of them just signed.
        if let Some(signed) = state
            .signed
            .iter()
            .rev()
            .find(|s| std::ptr::eq(s.notification.as_ptr(), Arc::as_ptr(n)))
        {
            return (signed.ids[self.lane] == self.id).then_some(signed.tags[self.lane]);
        }
        // Far behind the group (older than every notification it keeps): alone, so that one
        // slow member does not sign for seven others that are past it.
        if state.signed.len() == KEPT && state.signed.iter().all(|s| n.first < s.first) {
            return None;
        }
        // A free lane is signed with this lane's key, and its tag never handed out.
        let own = state.keys[self.lane].map(|(_, key)| key)?;
        let keys: [Sha256Key; LANES] =
            std::array::from_fn(|i| state.keys[i].map_or(own, |(_, key)| key));
        let ids: [u64; LANES] = std::array::from_fn(|i| state.keys[i].map_or(0, |(id, _)| id));
        let tags = signature_lanes::sign8(&keys, &n.body)?;
        if state.signed.len() == KEPT {
            state.signed.pop_front();
        }
        state.signed.push_back(Signed {
            notification: Arc::downgrade(n),
            first: n.first,
            ids,
            tags,
        });
        Some(tags[self.lane])
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        let mut state = self.group.lock();
        if state.keys[self.lane].is_some_and(|(id, _)| id == self.id) {
            state.keys[self.lane] = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::signature::{signature, Algorithm};
    use bytes::Bytes;

    fn notification(first: u64, body: &str) -> Arc<Notification> {
        Arc::new(Notification {
            channel: "c".into(),
            first,
            last: first,
            changes: Vec::new(),
            body: Bytes::from(body.to_string()),
            entry_bounds: Vec::new(),
            accepted_at: None,
        })
    }

    fn expected(secret: &str, n: &Notification) -> String {
        signature(Algorithm::Sha256, secret.as_bytes(), &n.body)
    }

    fn written(tag: [u8; 32]) -> String {
        format!("sha256={}", hex::encode(tag))
    }

    /// Twenty members (three groups): each gets its own key's tag of each notification, and a
    /// group signs a notification once for all its members.
    #[test]
    fn members_share_a_group_but_each_gets_its_own_tag() {
        if !signature_lanes::available() {
            assert!(SignGroups::default().join("c", b"k").is_none());
            return;
        }
        let groups = SignGroups::default();
        let secrets: Vec<String> = (0..20).map(|i| format!("secret-{i}")).collect();
        let lanes: Vec<Lane> = secrets
            .iter()
            .map(|s| groups.join("c", s.as_bytes()).unwrap())
            .collect();
        assert_eq!(groups.channels.lock().unwrap()["c"].len(), 3);
        for first in 1..=6 {
            let n = notification(first, &format!("<urlset>{first}</urlset>"));
            for (lane, secret) in lanes.iter().zip(&secrets) {
                assert_eq!(written(lane.sign(&n).unwrap()), expected(secret, &n));
            }
            let group = &lanes[0].group;
            let signed = group
                .lock()
                .signed
                .iter()
                .filter(|s| s.first == first)
                .count();
            assert_eq!(signed, 1, "signed once for the group");
            assert!(group.lock().signed.len() <= KEPT);
        }
    }

    /// A member that joins after its group signed a notification signs that one alone; one
    /// behind the group's newest signs alone; a lane left and taken again never gets the
    /// tag made for the key before it.
    #[test]
    fn a_tag_goes_only_to_the_key_it_was_made_for() {
        if !signature_lanes::available() {
            return;
        }
        let groups = SignGroups::default();
        let first = groups.join("c", b"first").unwrap();
        let second = groups.join("c", b"second").unwrap();
        let n1 = notification(1, "one");
        let n2 = notification(2, "two");
        assert_eq!(written(first.sign(&n1).unwrap()), expected("first", &n1));
        // The second lane's key was signed with n1 too.
        assert_eq!(written(second.sign(&n1).unwrap()), expected("second", &n1));
        drop(second);
        let third = groups.join("c", b"third").unwrap();
        assert_eq!(third.lane, 1, "the freed lane is taken again");
        assert_eq!(third.sign(&n1), None, "n1 was signed for the key before it");
        assert_eq!(written(third.sign(&n2).unwrap()), expected("third", &n2));
        assert_eq!(written(first.sign(&n2).unwrap()), expected("first", &n2));
        // n1 gone: the next notification gets tags of its own.
        drop(n1);
        let n3 = notification(3, "three");
        assert_eq!(written(first.sign(&n3).unwrap()), expected("first", &n3));
        assert_eq!(written(third.sign(&n3).unwrap()), expected("third", &n3));
        // Behind the newest but not behind all the group keeps: signed for the group.
        let n0 = notification(0, "zero");
        assert_eq!(written(third.sign(&n0).unwrap()), expected("third", &n0));
        // Behind every notification the group keeps: alone.
        let newer: Vec<_> = (10..10 + KEPT as u64)
            .map(|f| notification(f, &f.to_string()))
            .collect();
        for n in &newer {
            assert_eq!(written(first.sign(n).unwrap()), expected("first", n));
        }
        let late = notification(5, "five");
        assert_eq!(first.sign(&late), None, "far behind the group: alone");
        assert_eq!(first.group.lock().signed.len(), KEPT, "bounded");
    }

    /// Channels have groups of their own.
    #[test]
    fn channels_do_not_share_groups() {
        if !signature_lanes::available() {
            return;
        }
        let groups = SignGroups::default();
        let a = groups.join("a", b"x").unwrap();
        let b = groups.join("b", b"y").unwrap();
        assert!(!Arc::ptr_eq(&a.group, &b.group));
    }
}
