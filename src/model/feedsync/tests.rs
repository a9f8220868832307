//! The specification's own example sequences (§1.4, §3.1–3.4) as golden tests, and property
//! tests of merge on random histories made by simulated endpoints.

use super::*;
use crate::model::parse_w3c_datetime;

const ID: &str = "item_1_myapp_2005-05-21T11:43:33Z";

fn secs(s: &str) -> i64 {
    parse_w3c_datetime(s).unwrap().unix_timestamp()
}

/// A history from `"sequence by when"` lines, newest first.
fn history(lines: &[&str]) -> Vec<History> {
    lines
        .iter()
        .map(|l| {
            let parts: Vec<&str> = l.split(' ').collect();
            History {
                sequence: parts[0].parse().unwrap(),
                by: Some(parts[1].to_string()),
                when: Some(secs(&format!("2005-05-21T{}Z", parts[2]))),
            }
        })
        .collect()
}

fn item(sync: SyncState, body: &str) -> Item {
    Item {
        sync,
        data: ItemData {
            loc: "http://example.com/groceries".into(),
            lastmod: None,
            hash: Some(format!("md5:{body}")),
            length: None,
            media_type: None,
        },
    }
}

fn when(t: &str) -> Option<i64> {
    Some(secs(&format!("2005-05-21T{t}Z")))
}

/// §3.1, §3.2 #1 and #2: created by REO1750, updated by the same endpoint, then by JEO2000.
#[test]
fn create_then_update_by_the_same_then_by_another_endpoint() {
    let mut sync = SyncState::created(ID.into(), Some("REO1750".into()), when("09:43:33"), false);
    assert_eq!(sync.updates, 1);
    assert_eq!(sync.history, history(&["1 REO1750 09:43:33"]));

    sync.update(Some("REO1750"), when("10:43:33"), false);
    assert_eq!(sync.updates, 2);
    assert_eq!(
        sync.history,
        history(&["2 REO1750 10:43:33", "1 REO1750 09:43:33"])
    );

    sync.update(Some("JEO2000"), when("09:43:33"), false);
    assert_eq!(sync.updates, 3);
    assert_eq!(
        sync.history,
        history(&[
            "3 JEO2000 09:43:33",
            "2 REO1750 10:43:33",
            "1 REO1750 09:43:33"
        ])
    );
    assert!(!sync.deleted && sync.conflicts.is_empty());
}

/// The item of §1.4, from which the conflict example starts.
fn example_1_4() -> SyncState {
    SyncState {
        id: ID.into(),
        updates: 3,
        deleted: false,
        noconflicts: false,
        history: history(&[
            "3 JEO2000 11:43:33",
            "2 REO1750 10:43:33",
            "1 REO1750 09:43:33",
        ]),
        conflicts: vec![],
    }
}

/// §3.3: GPM7383 and JEO2000 update the §1.4 item concurrently; merging either way picks
/// GPM7383's (the later `when`) with JEO2000's as its conflict — the spec's conflict example.
#[test]
fn concurrent_updates_become_a_conflict() {
    let mut gpm = example_1_4();
    gpm.update(Some("GPM7383"), when("12:43:33"), false);
    let gpm = item(gpm, "done");
    let mut jeo = example_1_4();
    jeo.update(Some("JEO2000"), when("12:03:33"), false);
    let jeo = item(jeo, "rolls");

    let merged = merge(Some(&gpm), &jeo);
    assert_eq!(merged, merge(Some(&jeo), &gpm), "either way round");
    assert_eq!(merged.data, gpm.data);
    assert_eq!(merged.sync.updates, 4);
    assert_eq!(
        merged.sync.history,
        history(&[
            "4 GPM7383 12:43:33",
            "3 JEO2000 11:43:33",
            "2 REO1750 10:43:33",
            "1 REO1750 09:43:33"
        ])
    );
    assert_eq!(merged.sync.conflicts, vec![jeo.clone()]);
    assert_eq!(
        merged.sync.conflicts[0].sync.history,
        history(&[
            "4 JEO2000 12:03:33",
            "3 JEO2000 11:43:33",
            "2 REO1750 10:43:33",
            "1 REO1750 09:43:33"
        ])
    );

    // §3.4: GPM7383 keeps its data and resolves: an update, then the conflict merged into
    // the history — the spec's resolved example, history entry for entry.
    let mut resolved = merged.sync.clone();
    resolved.update(Some("GPM7383"), when("12:53:33"), false);
    let conflicts = std::mem::take(&mut resolved.conflicts);
    for c in &conflicts {
        resolved.resolve(&c.sync);
    }
    assert_eq!(resolved.updates, 5);
    assert_eq!(
        resolved.history,
        history(&[
            "5 GPM7383 12:53:33",
            "4 JEO2000 12:03:33",
            "4 GPM7383 12:43:33",
            "3 JEO2000 11:43:33",
            "2 REO1750 10:43:33",
            "1 REO1750 09:43:33"
        ])
    );
    // The resolved item subsumes both versions: merging either again changes nothing.
    let resolved = item(resolved, "done");
    assert_eq!(merge(Some(&resolved), &jeo), resolved);
    assert_eq!(merge(Some(&merged), &resolved), resolved);
}

/// §3.2 step 4: an update by the endpoint whose version is in conflict resolves it.
#[test]
fn an_update_by_the_conflicting_endpoint_resolves_its_conflict() {
    let mut gpm = example_1_4();
    gpm.update(Some("GPM7383"), when("12:43:33"), false);
    let mut jeo = example_1_4();
    jeo.update(Some("JEO2000"), when("12:03:33"), false);
    let mut merged = merge(Some(&item(gpm, "a")), &item(jeo, "b")).sync;
    merged.update(Some("JEO2000"), when("13:00:00"), false);
    assert!(merged.conflicts.is_empty());
    assert_eq!(merged.updates, 5);
    assert_eq!(merged.history[0].sequence, 5);
    // JEO2000's new update subsumes its conflicting one: nothing more to merge in.
    assert_eq!(merged.history[0], history(&["5 JEO2000 13:00:00"])[0]);
    assert_eq!(merged.history[1], history(&["4 GPM7383 12:43:33"])[0]);
}

#[test]
fn deletion_sets_the_tombstone_and_undeletion_clears_it() {
    let mut sync = SyncState::created(ID.into(), Some("a".into()), when("09:00:00"), false);
    sync.update(Some("a"), when("10:00:00"), true);
    assert!(sync.deleted);
    sync.update(Some("b"), when("11:00:00"), false);
    assert!(!sync.deleted);
    assert_eq!(sync.updates, 3);
}

#[test]
fn compaction_keeps_the_newest_update_of_each_endpoint() {
    let mut sync = example_1_4();
    sync.update(Some("GPM7383"), when("12:53:33"), false);
    sync.history
        .insert(1, history(&["4 JEO2000 12:03:33"])[0].clone());
    sync.compact();
    assert_eq!(
        sync.history,
        history(&[
            "4 GPM7383 12:53:33",
            "4 JEO2000 12:03:33",
            "2 REO1750 10:43:33"
        ])
    );
}

#[test]
fn a_sequence_never_repeats_an_endpoints_conflicting_version() {
    // b's version with sequence 6 lost; b's next update must not reuse 6.
    let mut lost = SyncState::created(ID.into(), Some("b".into()), when("09:00:00"), false);
    lost.history[0].sequence = 6;
    let winner = SyncState {
        updates: 4,
        conflicts: vec![item(lost, "x")],
        ..SyncState::created(ID.into(), Some("a".into()), when("09:00:00"), false)
    };
    let mut next = winner;
    next.update(Some("b"), when("10:00:00"), false);
    assert_eq!(next.history[0].sequence, 7);
}

#[test]
fn item_ids_are_nss_and_endpoint_ids_are_publisher_names() {
    let id = item_id("http://example.com/a b%/ü?x=1#f");
    assert!(valid_nss(&id), "{id}");
    assert_eq!(id, "http:%2F%2Fexample.com%2Fa%20b%25%2F%C3%BC%3Fx=1%23f");
    assert_eq!(item_id("http://e.org/x"), item_id("http://e.org/x"));
    assert!(valid_nss(&endpoint_id("alice.example-1_x")));
    for bad in ["", "a b", "a%2", "a%zz", "é", "a&b"] {
        assert!(!valid_nss(bad), "{bad}");
    }
}

#[test]
fn check_refuses_what_the_spec_forbids() {
    let good = example_1_4();
    assert!(good.check().is_ok());
    let mut bad = good.clone();
    bad.history.clear();
    assert!(bad.check().is_err());
    let mut bad = good.clone();
    bad.updates = 0;
    assert!(bad.check().is_err());
    let mut bad = good.clone();
    bad.history[0].by = None;
    bad.history[0].when = None;
    assert!(bad.check().is_err());
    let mut bad = good.clone();
    bad.id = "not an nss".into();
    assert!(bad.check().is_err());
    let mut bad = good.clone();
    let mut other = good.clone();
    other.id = "other".into();
    bad.conflicts.push(item(other, "x"));
    assert!(bad.check().is_err());
}

// Property tests: endpoints that update items and merge each other's in random order.

/// One step of a simulation: `(what, endpoint, other endpoint, when)`.
type Step = (u8, u8, u8, u8);

const ENDPOINTS: usize = 4;

/// Runs `steps` over endpoints `e0`…`e3` that each hold one copy of the item, and returns
/// every version the endpoints held along the way.
fn simulate(steps: &[Step], compact: bool) -> Vec<Item> {
    let mut held: Vec<Option<Item>> = vec![None; ENDPOINTS];
    let mut seen = Vec::new();
    for (n, &(what, a, b, at)) in steps.iter().enumerate() {
        let a = usize::from(a) % ENDPOINTS;
        let b = usize::from(b) % ENDPOINTS;
        // Few distinct times, so that equal `when`s happen.
        let at = Some(1_000_000 + i64::from(at % 8));
        let by = format!("e{a}");
        let next = if what % 3 == 0 && held[b].is_some() {
            // a incorporates b's copy.
            let incoming = held[b].clone().unwrap_or_else(|| unreachable!());
            merge(held[a].as_ref(), &incoming)
        } else {
            let deleted = what % 7 == 1;
            let sync = match held[a].take() {
                None => SyncState::created(ID.into(), Some(by.clone()), at, deleted),
                Some(item) => {
                    let mut sync = item.sync;
                    sync.update(Some(&by), at, deleted);
                    if compact {
                        sync.compact();
                    }
                    sync
                }
            };
            item(sync, &format!("{n}"))
        };
        seen.push(next.clone());
        held[a] = Some(next);
    }
    seen
}

fn check_merge_laws(steps: &[Step], compact: bool) {
    let versions = simulate(steps, compact);
    let pick = |i: usize| &versions[i % versions.len()];
    if versions.is_empty() {
        return;
    }
    for i in 0..versions.len().min(6) {
        for j in 0..versions.len().min(6) {
            let (a, b) = (pick(versions.len() - 1 - i), pick(j * 7 + i));
            let ab = merge(Some(a), b);
            assert_eq!(ab, merge(Some(b), a), "commutative:\n{a:#?}\n{b:#?}");
            assert_eq!(merge(Some(a), a), *a, "idempotent: {a:#?}");
            assert_eq!(merge(Some(&ab), b), ab, "merging again changes nothing");
            assert_eq!(merge(Some(&ab), a), ab, "merging again changes nothing");
        }
    }
}

#[test]
fn merge_is_commutative_and_idempotent_on_random_histories() {
    bolero::check!()
        .with_type::<Vec<Step>>()
        .with_test_time(std::time::Duration::from_secs(3))
        .for_each(|steps| check_merge_laws(steps, false));
}

#[test]
fn merge_is_commutative_and_idempotent_on_compacted_histories() {
    bolero::check!()
        .with_type::<Vec<Step>>()
        .with_test_time(std::time::Duration::from_secs(3))
        .for_each(|steps| check_merge_laws(steps, true));
}
