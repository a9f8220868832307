//! FeedSync (FeedSync for Collections, draft 2): the sync metadata every resource of a channel
//! carries, and the algorithms that keep it — creation (§3.1), update and deletion (§3.2),
//! merge with subsumption, winner picking and conflicts (§3.3), merging conflict items into a
//! history (§3.4). Pure functions over plain data: no HTTP, no store, no documents (those are
//! in `crate::feedsync`).
//!
//! A resource's item is its [`SyncState`] (`sx:sync`: id, updates, deleted, history,
//! conflicts) and its [`ItemData`] (the resource as its latest change describes it). The hub's
//! own changes update items with [`record_local`]: the §3.2 update by the endpoint of the
//! publisher that sent the change ([`endpoint_id`]), then the clean-up §3.2 allows
//! ([`SyncState::compact`]), so that a history holds one entry per endpoint and does not grow
//! with every change. Incoming collections are incorporated with [`merge`].
//!
//! Two choices the specification leaves open, made here so that every endpoint computes the
//! same result: when winner picking (§3.3) finds two items equal, the one whose JSON form sorts
//! greater wins; conflicts are kept in winner order ([`SyncState::conflicts`] is a set, and
//! this makes it a canonical list). `when` is kept as whole seconds since the Unix epoch.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::HashMap;
use time::OffsetDateTime;

use super::change::{Change, ChangeType, NewChange};

/// The FeedSync namespace (`sx:`).
pub const NAMESPACE: &str = "http://feedsync.org/2007/feedsync";

/// The greatest `updates` and `sequence` value (2^31 − 1).
pub const MAX_COUNT: u32 = i32::MAX as u32;

/// Longest item id, endpoint id or other FeedSync string accepted, in bytes.
pub const MAX_ID_LEN: usize = 8192;

/// One `sx:history`: an update of an item.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct History {
    pub sequence: u32,
    /// When the update happened, in whole seconds since the Unix epoch (UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<i64>,
    /// The endpoint that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// The resource an item describes (`<loc>`, `<lastmod>`, `hash`, `length`, `type`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemData {
    pub loc: String,
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub lastmod: Option<OffsetDateTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// Kept as a string in the stored JSON: the Redis store's Lua reads these records, and its
    /// numbers are doubles.
    #[serde(
        default,
        with = "length_as_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub length: Option<u64>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
}

/// `sx:sync`: the sync metadata of an item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncState {
    pub id: String,
    pub updates: u32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub deleted: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub noconflicts: bool,
    /// Newest first; never empty.
    pub history: Vec<History>,
    /// The conflicting versions (`sx:conflicts`), each without conflicts of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<Item>,
}

/// An item: its sync metadata and the resource it describes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub sync: SyncState,
    pub data: ItemData,
}

/// A resource of a channel as the store keeps it: its latest change (from the resource
/// index) and its item's sync metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synced {
    pub change: Change,
    pub sync: SyncState,
}

/// A change that incorporates a merge result: appended only if its resource's latest change
/// still has seq `expected` (0: the resource is new), and its item becomes `sync`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedChange {
    pub change: NewChange,
    pub expected: u64,
    pub sync: SyncState,
}

fn is_false(b: &bool) -> bool {
    !*b
}

mod length_as_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(n) => s.serialize_str(&n.to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| t.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// The endpoint id (`by`) of a publisher: its name. Publisher names
/// (`[a-z0-9][a-z0-9._-]{0,63}`) are RFC 2141 NSSs; they must be unique in the mesh, so a hub
/// that shares items with other endpoints names its publishers accordingly (for instance
/// `alice.example.org`).
pub fn endpoint_id(publisher: &str) -> String {
    publisher.to_string()
}

/// The id of the item of a resource the hub creates: its `loc`, with every character that is
/// not plain in an RFC 2141 NSS percent-encoded (`%` included), so stable per `loc` and
/// reversible.
pub fn item_id(loc: &str) -> String {
    let mut out = String::with_capacity(loc.len() + 8);
    for b in loc.bytes() {
        if is_nss_plain(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The characters an NSS may hold as they are (RFC 2141 `<trans>` without the reserved ones).
fn is_nss_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"()+,-.:=@;$_!*'".contains(&b)
}

/// True when `s` is an RFC 2141 Namespace Specific String: one or more plain or reserved
/// (`/ ? #`) characters and `%` escapes of two hex digits.
pub fn valid_nss(s: &str) -> bool {
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_ID_LEN {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3);
                if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    return false;
                }
                i += 3;
            }
            b if is_nss_plain(b) || b"/?#".contains(&b) => i += 1,
            _ => return false,
        }
    }
    true
}

impl History {
    /// §3.3, history subsumption: is this update known to `other`?
    pub fn subsumed_by(&self, other: &History) -> bool {
        match &self.by {
            Some(by) => other.by.as_ref() == Some(by) && other.sequence >= self.sequence,
            None => {
                other.by.is_none() && other.when == self.when && other.sequence == self.sequence
            }
        }
    }
}

impl SyncState {
    /// §3.1: the sync metadata of a new item (updates 1, history of sequence 1).
    pub fn created(id: String, by: Option<String>, when: Option<i64>, deleted: bool) -> Self {
        SyncState {
            id,
            updates: 1,
            deleted,
            noconflicts: false,
            history: vec![History {
                sequence: 1,
                when,
                by,
            }],
            conflicts: Vec::new(),
        }
    }

    /// The topmost (newest) history.
    pub fn top(&self) -> Option<&History> {
        self.history.first()
    }

    /// §3.2: a local update (or deletion, or undeletion) by `by` at `when`. The sequence is the
    /// new `updates`, raised above every sequence of `by` in the history and in the conflicts'
    /// histories (the specification allows any greater value; counting the conflicts keeps a
    /// version of `by` that lost a merge from sharing a sequence with a later one). Conflicts
    /// whose topmost update is by `by` are merged into the history (§3.4).
    pub fn update(&mut self, by: Option<&str>, when: Option<i64>, deleted: bool) {
        self.updates = self.updates.saturating_add(1).min(MAX_COUNT);
        let mut sequence = self.updates;
        if let Some(by) = by {
            let own = self
                .history
                .iter()
                .chain(self.conflicts.iter().flat_map(|c| c.sync.history.iter()))
                .filter(|h| h.by.as_deref() == Some(by))
                .map(|h| h.sequence)
                .max()
                .unwrap_or(0);
            if sequence <= own {
                sequence = own.saturating_add(1).min(MAX_COUNT);
            }
        }
        self.history.insert(
            0,
            History {
                sequence,
                when,
                by: by.map(str::to_string),
            },
        );
        if let Some(by) = by {
            let conflicts = std::mem::take(&mut self.conflicts);
            for conflict in conflicts {
                if conflict.sync.top().and_then(|h| h.by.as_deref()) == Some(by) {
                    self.resolve(&conflict.sync);
                } else {
                    self.conflicts.push(conflict);
                }
            }
        }
        self.deleted = deleted;
    }

    /// §3.4, merging a conflict item `x` into the history: each update of `x` this history does
    /// not subsume goes right after the topmost one. (The caller removes `x` from the
    /// conflicts.)
    pub fn resolve(&mut self, x: &SyncState) {
        for hx in &x.history {
            if !self.history.iter().any(|hy| hx.subsumed_by(hy)) {
                let at = 1.min(self.history.len());
                self.history.insert(at, hx.clone());
            }
        }
    }

    /// The clean-up §3.2 and §3.4 allow: of the updates by one endpoint, only the one with
    /// the greatest sequence stays (the first of equals); the topmost update and updates
    /// without `by` always stay. Subsumption and winner picking give the same answers after it.
    pub fn compact(&mut self) {
        let mut best: HashMap<&str, (u32, usize)> = HashMap::new();
        for (i, h) in self.history.iter().enumerate() {
            if let Some(by) = h.by.as_deref() {
                match best.get(by) {
                    Some(&(seq, _)) if seq >= h.sequence => {}
                    _ => {
                        best.insert(by, (h.sequence, i));
                    }
                }
            }
        }
        let keep: Vec<bool> = self
            .history
            .iter()
            .enumerate()
            .map(|(i, h)| match h.by.as_deref() {
                None => true,
                Some(by) => i == 0 || best.get(by).is_some_and(|&(_, at)| at == i),
            })
            .collect();
        let mut keep = keep.into_iter();
        self.history.retain(|_| keep.next().unwrap_or(true));
    }

    /// What is wrong with this sync metadata as an incoming collection gives it (§2.4–2.6):
    /// the id, the counts, the history (one at least; `when` or `by` on each), the conflicts
    /// (same id, none of their own).
    pub fn check(&self) -> Result<(), String> {
        if !valid_nss(&self.id) {
            return Err(format!("id {:?} is not an RFC 2141 NSS", self.id));
        }
        if !(1..=MAX_COUNT).contains(&self.updates) {
            return Err("updates must be from 1 to 2147483647".into());
        }
        if self.history.is_empty() {
            return Err("sx:sync needs at least one sx:history".into());
        }
        for h in &self.history {
            if !(1..=MAX_COUNT).contains(&h.sequence) {
                return Err("sequence must be from 1 to 2147483647".into());
            }
            if h.when.is_none() && h.by.is_none() {
                return Err("sx:history needs when or by".into());
            }
            if let Some(by) = &h.by {
                if !valid_nss(by) {
                    return Err(format!("by {by:?} is not an RFC 2141 NSS"));
                }
            }
        }
        for c in &self.conflicts {
            if c.sync.id != self.id {
                return Err(format!(
                    "a conflict of item {:?} has another id ({:?})",
                    self.id, c.sync.id
                ));
            }
            if !c.sync.conflicts.is_empty() {
                return Err("a conflict item may not have conflicts of its own".into());
            }
            c.sync.check()?;
        }
        Ok(())
    }
}

/// What the hub's own change does to its resource's item: the item of a new resource is
/// created (§3.1), an existing one updated (§3.2) and compacted. `by` is the endpoint of the
/// change's publisher (none for changes without one), `when` the change's datetime.
pub fn record_local(
    current: Option<SyncState>,
    loc: &str,
    by: Option<&str>,
    when: OffsetDateTime,
    deleted: bool,
) -> SyncState {
    let when = Some(when.unix_timestamp());
    match current {
        None => SyncState::created(item_id(loc), by.map(str::to_string), when, deleted),
        Some(mut sync) => {
            sync.update(by, when, deleted);
            sync.compact();
            sync
        }
    }
}

/// The item a resource's latest change implies when the store has no sync metadata for it
/// (data written before the hub kept any): created by that change.
pub fn implied(change: &Change) -> SyncState {
    record_local(
        None,
        &change.loc,
        change.source.as_deref().map(endpoint_id).as_deref(),
        change.datetime,
        change.change == ChangeType::Deleted,
    )
}

impl ItemData {
    /// The resource as `change` describes it.
    pub fn of(change: &Change) -> ItemData {
        ItemData {
            loc: change.loc.clone(),
            lastmod: change.lastmod,
            hash: change.hash.clone(),
            length: change.length,
            media_type: change.media_type.as_deref().map(String::from),
        }
    }
}

impl Item {
    /// The item of a stored resource.
    pub fn of(synced: &Synced) -> Item {
        Item {
            sync: synced.sync.clone(),
            data: ItemData::of(&synced.change),
        }
    }

    /// §3.3, item subsumption: is this item's topmost update known to `other`?
    pub fn subsumed_by(&self, other: &Item) -> bool {
        self.sync
            .top()
            .is_some_and(|hx| other.sync.history.iter().any(|hy| hx.subsumed_by(hy)))
    }

    /// The JSON form, the last tie-breaker of winner picking.
    fn canonical(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// §3.3, winner picking, as an order: `Greater` when `x` wins over `y`. More updates win;
/// then a later topmost `when` (any `when` beats none); then a greater topmost `by` (any beats
/// none); then, where the specification sees no difference, the greater JSON form.
pub fn winner_order(x: &Item, y: &Item) -> Ordering {
    let (tx, ty) = (x.sync.top(), y.sync.top());
    x.sync
        .updates
        .cmp(&y.sync.updates)
        .then_with(|| tx.and_then(|h| h.when).cmp(&ty.and_then(|h| h.when)))
        .then_with(|| {
            tx.and_then(|h| h.by.as_deref())
                .cmp(&ty.and_then(|h| h.by.as_deref()))
        })
        .then_with(|| x.canonical().cmp(&y.canonical()))
}

/// §3.3, merging an incoming item into the local one (none: the resource is new here). The
/// result is the winner of every version neither side subsumes, with the others as its
/// conflicts (unless it says `noconflicts`), conflicts in winner order.
pub fn merge(local: Option<&Item>, incoming: &Item) -> Item {
    let Some(local) = local else {
        let mut result = incoming.clone();
        result.sync.conflicts.sort_by(|a, b| winner_order(b, a));
        return result;
    };
    let flatten = |item: &Item| -> Vec<Item> {
        let mut top = item.clone();
        let mut all = std::mem::take(&mut top.sync.conflicts);
        all.push(top);
        all
    };
    let mut outer = flatten(local);
    let inner = flatten(incoming);
    outer.retain(|x| !inner.iter().any(|y| x.subsumed_by(y)));
    let kept: Vec<Item> = inner
        .into_iter()
        .filter(|y| !outer.iter().any(|x| y.subsumed_by(x)))
        .collect();
    let mut versions = outer;
    versions.extend(kept);
    versions.sort_by(|a, b| winner_order(b, a));
    let mut versions = versions.into_iter();
    // Both sides are never all subsumed: the last item compared is checked against what is
    // left of the other side.
    let Some(mut winner) = versions.next() else {
        return local.clone();
    };
    if !winner.sync.noconflicts {
        winner.sync.conflicts = versions.collect();
    }
    winner
}

#[cfg(test)]
mod tests;
