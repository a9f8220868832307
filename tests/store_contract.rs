//! The store contract: one suite of behaviours every [`Store`] engine must show. Each engine
//! gets the whole suite through `contract_tests!`, with a factory that opens a store and can
//! open it again on the same data (to check durability).

use changehub::model::feedsync::{self, SyncState};
use changehub::model::Algorithm;
use changehub::model::Retention;
use changehub::model::{parse_w3c_datetime, ChangeType, NewChange};
use changehub::model::{DeliveryState, PendingDelivery, Subscription};
use changehub::store::{ChannelHead, IdempotencyKey, Store, StoreError};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

#[path = "common/redis_server.rs"]
mod redis_server;

fn change(loc: &str) -> NewChange {
    NewChange::new(format!("http://example.com/{loc}"), ChangeType::Updated)
}

fn changes(prefix: &str, n: usize) -> Vec<NewChange> {
    (0..n).map(|i| change(&format!("{prefix}/{i}"))).collect()
}

fn at(s: &str) -> OffsetDateTime {
    parse_w3c_datetime(s).unwrap()
}

fn key(k: &str, fp: &str) -> Option<IdempotencyKey> {
    Some(IdempotencyKey {
        key: k.into(),
        fingerprint: fp.into(),
    })
}

fn subscription(n: u32) -> Subscription {
    Subscription {
        id: format!("sub-{n}"),
        channel: "c".into(),
        topic: "http://hub/channels/c/changelist.xml".into(),
        callback: format!("http://example.com/cb/{n}"),
        secret: Some("s3cret".into()),
        algorithm: Algorithm::Sha512,
        lease_seconds: 600,
        expires_at: at("2030-01-01T00:00:00Z"),
        created_at: at("2029-12-31T00:00:00Z"),
    }
}

/// Opens stores for the suite: `open(n)` opens data set `n`; opening the same `n` again gives
/// the same data.
pub trait Engine {
    fn open(&self) -> Arc<dyn Store>;
}

pub async fn appends_number_changes_from_one_without_gaps(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    assert_eq!(s.head("c").await.unwrap(), ChannelHead::EMPTY);
    let a = s.append("c", changes("a", 3), None, now).await.unwrap();
    assert_eq!((a.accepted, a.first, a.last, a.replayed), (3, 1, 3, false));
    let b = s.append("c", changes("b", 2), None, now).await.unwrap();
    assert_eq!((b.first, b.last), (4, 5));
    let other = s.append("d", changes("x", 1), None, now).await.unwrap();
    assert_eq!(
        (other.first, other.last),
        (1, 1),
        "channels are independent"
    );
    assert_eq!(
        s.head("c").await.unwrap(),
        ChannelHead { oldest: 1, last: 5 }
    );

    let all = s.read("c", 0, 100).await.unwrap();
    assert_eq!(
        all.iter().map(|c| c.seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(all[3].loc, "http://example.com/b/0");
    assert_eq!(
        all[0].datetime, now,
        "receipt time when the source gives none"
    );
    let page = s.read("c", 2, 2).await.unwrap();
    assert_eq!(page.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![3, 4]);
    assert!(s.read("c", 5, 10).await.unwrap().is_empty());
    let newest = s.read_newest("c", 2).await.unwrap();
    assert_eq!(newest.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![4, 5]);
    assert_eq!(s.read_newest("c", 100).await.unwrap().len(), 5);
}

pub async fn concurrent_appends_stay_gapless(e: &dyn Engine) {
    let s = e.open();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..25 {
                let a = s
                    .append(
                        "c",
                        changes(&format!("{t}/{i}"), 1 + (i % 4)),
                        None,
                        OffsetDateTime::now_utc(),
                    )
                    .await
                    .unwrap();
                got.push((a.first, a.last));
            }
            got
        }));
    }
    let mut ranges = Vec::new();
    for t in tasks {
        ranges.extend(t.await.unwrap());
    }
    ranges.sort();
    let mut next = 1;
    for (first, last) in ranges {
        assert_eq!(first, next);
        next = last + 1;
    }
    let all = s.read("c", 0, 10_000).await.unwrap();
    assert_eq!(all.len() as u64, next - 1);
    assert!(all
        .windows(2)
        .all(|w| w[0].seq + 1 == w[1].seq && w[0].datetime <= w[1].datetime));
}

pub async fn datetimes_never_go_backwards(e: &dyn Engine) {
    let s = e.open();
    let mut early = change("early");
    early.datetime = Some(at("2020-01-01T00:00:00Z"));
    let mut late = change("late");
    late.datetime = Some(at("2030-01-01T00:00:00Z"));
    let mut own = change("own");
    own.datetime = Some(at("2021-01-01T00:00:00Z"));
    own.lastmod = Some(at("2019-01-01T00:00:00Z"));
    s.append(
        "c",
        vec![late, early, own],
        None,
        at("2024-01-01T00:00:00Z"),
    )
    .await
    .unwrap();
    let all = s.read("c", 0, 10).await.unwrap();
    assert!(all.iter().all(|c| c.datetime == at("2030-01-01T00:00:00Z")));
    assert_eq!(
        all[1].lastmod,
        Some(at("2020-01-01T00:00:00Z")),
        "source time kept"
    );
    assert_eq!(
        all[2].lastmod,
        Some(at("2019-01-01T00:00:00Z")),
        "own lastmod wins"
    );
    // Receipt time earlier than the latest change also takes the latest.
    s.append("c", changes("now", 1), None, at("2024-06-01T00:00:00Z"))
        .await
        .unwrap();
    assert_eq!(
        s.read("c", 3, 1).await.unwrap()[0].datetime,
        at("2030-01-01T00:00:00Z")
    );
    // Datetimes in order, from the latest on, are kept as they are; the channel's latest is
    // then the last of them, not the first.
    let mut ordered = changes("ordered", 3);
    for (c, t) in ordered
        .iter_mut()
        .zip(["2031-01-01", "2031-01-01", "2032-01-01"])
    {
        c.datetime = Some(at(&format!("{t}T00:00:00Z")));
    }
    s.append("c", ordered, None, at("2024-06-01T00:00:00Z"))
        .await
        .unwrap();
    let mut between = change("between");
    between.datetime = Some(at("2031-06-01T00:00:00Z"));
    s.append("c", vec![between], None, at("2024-06-01T00:00:00Z"))
        .await
        .unwrap();
    let datetimes: Vec<_> = s
        .read("c", 4, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.datetime)
        .collect();
    assert_eq!(
        datetimes,
        ["2031-01-01", "2031-01-01", "2032-01-01", "2032-01-01"]
            .map(|t| at(&format!("{t}T00:00:00Z")))
    );
    // Every change of a large request received before the latest is raised too (on Redis,
    // an instance reads the changes of its large requests back from memory: the raised ones
    // must not be read as they were sent).
    let large = s
        .append("c", changes("large", 100), None, at("2024-06-01T00:00:00Z"))
        .await
        .unwrap();
    let read = s.read("c", large.first - 1, 100).await.unwrap();
    assert_eq!(read.len(), 100);
    assert!(read
        .iter()
        .all(|c| c.datetime == at("2032-01-01T00:00:00Z")));
}

pub async fn idempotency_keys_replay_and_conflict(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    let first = s
        .append("c", changes("a", 2), key("k1", "fp"), now)
        .await
        .unwrap();
    let again = s
        .append("c", changes("a", 2), key("k1", "fp"), now)
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(
        (again.first, again.last, again.accepted),
        (first.first, first.last, 2)
    );
    assert_eq!(s.head("c").await.unwrap().last, 2, "nothing appended twice");
    let conflict = s
        .append("c", changes("b", 1), key("k1", "other"), now)
        .await;
    assert!(
        matches!(conflict, Err(StoreError::IdempotencyConflict)),
        "{conflict:?}"
    );
    // Keys are per channel.
    let d = s
        .append("d", changes("a", 1), key("k1", "fp"), now)
        .await
        .unwrap();
    assert!(!d.replayed);
    // Keys expire: after the TTL (and a trim), the same key appends again.
    let later = now + Duration::from_secs(25 * 3600);
    let retention = Retention {
        max_changes: 1_000,
        max_age: None,
        list_size: 1,
    };
    s.trim("c", retention, later).await.unwrap();
    let fresh = s
        .append("c", changes("a", 2), key("k1", "fp"), later)
        .await
        .unwrap();
    assert!(!fresh.replayed);
    assert_eq!((fresh.first, fresh.last), (3, 4));
}

pub async fn retention_trims_by_count_and_age(e: &dyn Engine) {
    let s = e.open();
    for day in 1..=9 {
        let mut c = change(&format!("d{day}"));
        c.datetime = Some(at(&format!("2024-01-0{day}T00:00:00Z")));
        s.append("c", vec![c], None, at("2024-02-01T00:00:00Z"))
            .await
            .unwrap();
    }
    let now = at("2024-01-09T12:00:00Z");
    let by_count = Retention {
        max_changes: 6,
        max_age: None,
        list_size: 1,
    };
    assert_eq!(s.trim("c", by_count, now).await.unwrap(), 3);
    assert_eq!(
        s.head("c").await.unwrap(),
        ChannelHead { oldest: 4, last: 9 }
    );
    assert_eq!(s.read("c", 0, 100).await.unwrap()[0].seq, 4);
    // Older than 3 days: days 4, 5 and 6 (before Jan 6 12:00) go.
    let by_age = Retention {
        max_changes: 100,
        max_age: Some(Duration::from_secs(3 * 86_400)),
        list_size: 1,
    };
    assert_eq!(s.trim("c", by_age, now).await.unwrap(), 3);
    assert_eq!(
        s.head("c").await.unwrap(),
        ChannelHead { oldest: 7, last: 9 }
    );
    // The newest change is always kept, however old.
    let far = at("2030-01-01T00:00:00Z");
    s.trim("c", by_age, far).await.unwrap();
    assert_eq!(
        s.head("c").await.unwrap(),
        ChannelHead { oldest: 9, last: 9 }
    );
    // Seqs continue after trimming.
    let a = s.append("c", changes("z", 1), None, far).await.unwrap();
    assert_eq!(a.first, 10);
}

pub async fn watch_head_follows_appends(e: &dyn Engine) {
    let s = e.open();
    s.append("c", changes("a", 2), None, OffsetDateTime::now_utc())
        .await
        .unwrap();
    let mut rx = s.watch_head("c");
    assert_eq!(*rx.borrow_and_update(), 2);
    s.append("c", changes("b", 3), None, OffsetDateTime::now_utc())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*rx.borrow_and_update(), 5);
}

pub async fn subscriptions_and_delivery_state(e: &dyn Engine) {
    let s = e.open();
    assert!(s.subscriptions().await.unwrap().is_empty());
    s.put_subscription(&subscription(1)).await.unwrap();
    s.put_subscription(&subscription(2)).await.unwrap();
    let mut replaced = subscription(1);
    replaced.secret = None;
    s.put_subscription(&replaced).await.unwrap();
    let mut subs = s.subscriptions().await.unwrap();
    subs.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(subs, vec![replaced, subscription(2)]);

    assert_eq!(s.delivery("sub-1").await.unwrap(), None);
    let state = DeliveryState {
        cursor: 41,
        pending: Some(PendingDelivery {
            first: 42,
            last: 50,
            attempts: 3,
            first_attempt_at: at("2024-01-01T00:00:00Z"),
            next_attempt_at: at("2024-01-01T00:05:00Z"),
        }),
        last_success: Some(at("2023-12-31T00:00:00Z")),
        last_error: Some("callback answered 503".into()),
    };
    s.put_delivery("sub-1", &state).await.unwrap();
    assert_eq!(s.delivery("sub-1").await.unwrap(), Some(state.clone()));

    // Read at once: a subscription without a state (sub-2) or unknown (sub-9) is left out.
    let ids = ["sub-1", "sub-2", "sub-9"].map(String::from);
    let states = s.deliveries("c", &ids).await.unwrap();
    assert_eq!(states.len(), 1, "{states:?}");
    assert_eq!(states.get("sub-1"), Some(&state));
    let other = DeliveryState {
        cursor: 7,
        ..DeliveryState::default()
    };
    s.put_deliveries(&[("sub-2".into(), other.clone())])
        .await
        .unwrap();
    let states = s.deliveries("c", &ids).await.unwrap();
    assert_eq!(states.get("sub-1"), Some(&state));
    assert_eq!(states.get("sub-2"), Some(&other));
    assert!(s.deliveries("c", &[]).await.unwrap().is_empty());

    assert!(s.delete_subscription("sub-1").await.unwrap());
    assert!(!s.delete_subscription("sub-1").await.unwrap());
    assert_eq!(
        s.delivery("sub-1").await.unwrap(),
        None,
        "delivery state goes with it"
    );
    assert_eq!(s.subscriptions().await.unwrap().len(), 1);
    s.ping().await.unwrap();
}

pub async fn data_survives_reopening(e: &dyn Engine) {
    {
        let s = e.open();
        s.append(
            "c",
            changes("a", 4),
            key("k", "fp"),
            OffsetDateTime::now_utc(),
        )
        .await
        .unwrap();
        s.put_subscription(&subscription(7)).await.unwrap();
        s.put_delivery(
            "sub-7",
            &DeliveryState {
                cursor: 3,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
    let s = e.open();
    assert_eq!(s.head("c").await.unwrap().last, 4);
    assert_eq!(s.read("c", 0, 10).await.unwrap().len(), 4);
    assert_eq!(s.subscriptions().await.unwrap(), vec![subscription(7)]);
    let replay = s
        .append(
            "c",
            changes("a", 4),
            key("k", "fp"),
            OffsetDateTime::now_utc(),
        )
        .await
        .unwrap();
    assert!(replay.replayed, "idempotency keys are durable");
    let next = s
        .append("c", changes("b", 1), None, OffsetDateTime::now_utc())
        .await
        .unwrap();
    assert_eq!(next.first, 5);
}

pub async fn one_lease_holder_at_a_time(e: &dyn Engine) {
    let s = e.open();
    let ttl = Duration::from_millis(300);
    if !s.shared() {
        // A store of one instance: that instance owns everything.
        assert!(s.try_lease("c", "a", ttl).await.unwrap());
        assert!(s.events().is_none());
        return;
    }
    assert!(s.try_lease("c", "a", ttl).await.unwrap());
    assert!(!s.try_lease("c", "b", ttl).await.unwrap(), "held by a");
    assert!(s.try_lease("c", "a", ttl).await.unwrap(), "a renews");
    assert!(
        s.try_lease("d", "b", ttl).await.unwrap(),
        "leases are per channel"
    );
    s.release_lease("c", "b").await.unwrap();
    assert!(
        !s.try_lease("c", "b", ttl).await.unwrap(),
        "only the holder releases"
    );
    s.release_lease("c", "a").await.unwrap();
    assert!(s.try_lease("c", "b", ttl).await.unwrap(), "released");
    // Not renewed: it expires and another instance takes it.
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while !s.try_lease("c", "a", ttl).await.unwrap() {
        assert!(tokio::time::Instant::now() < end, "lease never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn events_reach_every_instance(e: &dyn Engine) {
    let a = e.open();
    if !a.shared() {
        assert!(a.events().is_none(), "one instance has nobody to hear");
        return;
    }
    let b = e.open();
    let mut events = b.events().expect("a shared store has events");
    let event = changehub::store::ClusterEvent::Subscription {
        channel: "c".into(),
        id: "sub-1".into(),
    };
    // The listener subscribes in the background: announce until it hears.
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        a.announce(&event).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(200), events.recv()).await {
            Ok(Ok(got)) if got == event => break,
            _ => assert!(tokio::time::Instant::now() < end, "event never arrived"),
        }
    }
    // Every other kind of event arrives as it was sent.
    for event in [
        changehub::store::ClusterEvent::Released {
            channel: "c".into(),
        },
        changehub::store::ClusterEvent::Pinged {
            channel: "_ext-0123abcd".into(),
        },
    ] {
        a.announce(&event).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match events.recv().await {
                    Ok(got) if got == event => return true,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return false,
                }
            }
        })
        .await;
        assert_eq!(got, Ok(true), "{event:?} never arrived");
    }
    // Heads move on every instance.
    let mut head = b.watch_head("c");
    a.append("c", changes("x", 3), None, OffsetDateTime::now_utc())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), head.wait_for(|&h| h == 3))
        .await
        .expect("head seen by the other instance")
        .unwrap();
}

fn described(loc: &str, kind: ChangeType, hash: &str) -> NewChange {
    NewChange {
        change: kind,
        hash: Some(hash.into()),
        length: Some(hash.len() as u64),
        media_type: Some("text/plain".into()),
        lastmod: Some(at("2023-06-01T00:00:00Z")),
        ..change(loc)
    }
}

/// The latest change of every loc, in the order of their seqs, deleted ones included.
async fn whole_index(s: &dyn Store, channel: &str) -> Vec<(String, u64, ChangeType)> {
    let page = s.resources(channel, 0, 1_000_000).await.unwrap();
    page.resources
        .iter()
        .map(|c| (c.loc.clone(), c.seq, c.change))
        .collect()
}

pub async fn resource_index_keeps_the_latest_change_of_each_loc(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    assert_eq!(s.resource_count("c").await.unwrap(), 0);
    assert_eq!(s.resources("c", 0, 10).await.unwrap().resources, vec![]);
    let first = vec![
        described("a", ChangeType::Created, "md5:aa"),
        described("b", ChangeType::Created, "md5:bb"),
        described("c", ChangeType::Created, "md5:cc"),
    ];
    s.append("c", first, None, now).await.unwrap();
    let later = vec![
        described("b", ChangeType::Updated, "md5:b2"),
        described("a", ChangeType::Deleted, "md5:aa"),
    ];
    s.append("c", later, key("k", "f"), now).await.unwrap();
    s.append("other", changes("x", 2), None, now).await.unwrap();
    let url = |l: &str| format!("http://example.com/{l}");
    assert_eq!(
        whole_index(s.as_ref(), "c").await,
        vec![
            (url("c"), 3, ChangeType::Created),
            (url("b"), 4, ChangeType::Updated),
            (url("a"), 5, ChangeType::Deleted),
        ]
    );
    assert_eq!(s.resource_count("c").await.unwrap(), 3);
    assert_eq!(s.resource_count("other").await.unwrap(), 2);
    // Within one append, the later change of a loc wins.
    let twice = vec![
        described("x", ChangeType::Created, "md5:x1"),
        described("x", ChangeType::Updated, "md5:x2"),
    ];
    s.append("dup", twice, None, now).await.unwrap();
    assert_eq!(
        whole_index(s.as_ref(), "dup").await,
        vec![(url("x"), 2, ChangeType::Updated)]
    );
    // Every field of the latest change is kept.
    let page = s.resources("c", 3, 1).await.unwrap();
    assert_eq!(page.last, 5);
    let b = &page.resources[0];
    assert_eq!(b.hash.as_deref(), Some("md5:b2"));
    assert_eq!(b.length, Some(6));
    assert_eq!(b.media_type.as_deref(), Some("text/plain"));
    assert_eq!(b.lastmod, Some(at("2023-06-01T00:00:00Z")));
    assert_eq!(b.datetime, now);
    // A replayed request changes nothing.
    let replay = vec![described("c", ChangeType::Deleted, "md5:zz")];
    assert!(matches!(
        s.append("c", replay, key("k", "f"), now).await,
        Ok(a) if a.replayed
    ));
    assert_eq!(whole_index(s.as_ref(), "c").await.len(), 3);
    assert_eq!(whole_index(s.as_ref(), "c").await[0].1, 3);
}

/// Pages by seq list every resource at least once even when resources change between pages.
pub async fn resource_pages_lose_nothing_while_resources_change(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    s.append("c", changes("r", 10), None, now).await.unwrap();
    let first = s.resources("c", 0, 4).await.unwrap();
    assert_eq!(first.last, 10);
    let seqs: Vec<u64> = first.resources.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    // r/0 (already listed) and r/6 (not yet) change before the next pages.
    s.append("c", vec![change("r/0"), change("r/6")], None, now)
        .await
        .unwrap();
    let mut after = 4;
    let mut listed: Vec<String> = first.resources.iter().map(|c| c.loc.clone()).collect();
    loop {
        let page = s.resources("c", after, 4).await.unwrap();
        let Some(last) = page.resources.last() else {
            break;
        };
        after = last.seq;
        listed.extend(page.resources.iter().map(|c| c.loc.clone()));
    }
    for i in 0..10 {
        let loc = format!("http://example.com/r/{i}");
        assert!(listed.contains(&loc), "{loc} listed");
    }
    assert_eq!(listed.len(), 11, "only the changed r/0 comes twice");
    assert_eq!(s.resource_count("c").await.unwrap(), 10);
}

pub async fn resource_marks_cut_the_index_into_pages(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    assert_eq!(s.resource_marks("c", 3).await.unwrap(), Vec::<u64>::new());
    s.append("c", changes("r", 10), None, now).await.unwrap();
    // r/1 moves to the end: the index order is 1, 3, 4, …, 10, 11.
    s.append("c", vec![change("r/1")], None, now).await.unwrap();
    assert_eq!(s.resource_marks("c", 3).await.unwrap(), [4, 7, 10]);
    assert_eq!(s.resource_marks("c", 10).await.unwrap(), [11]);
    assert_eq!(s.resource_marks("c", 11).await.unwrap(), Vec::<u64>::new());
}

pub async fn channel_origin_is_recorded_once(e: &dyn Engine) {
    let s = e.open();
    let first = at("2024-01-01T00:00:00.123456789Z");
    let origin = s.origin("c", first).await.unwrap();
    assert_eq!(origin.created, first);
    assert_eq!(origin.epoch.len(), 16);
    assert!(origin.epoch.bytes().all(|b| b.is_ascii_hexdigit()));
    let later = at("2024-02-01T00:00:00Z");
    assert_eq!(s.origin("c", later).await.unwrap(), origin);
    s.append("c", changes("x", 2), None, later).await.unwrap();
    assert_eq!(s.origin("c", later).await.unwrap(), origin);
    let other = s.origin("d", later).await.unwrap();
    assert_eq!(other.created, later);
    assert_ne!(other.epoch, origin.epoch, "each log has its own epoch");
    drop(s);
    assert_eq!(e.open().origin("c", later).await.unwrap(), origin);
}

pub async fn the_index_remembers_who_sent_each_resource(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    let by = |loc: &str, who: &str| NewChange {
        source: Some(who.into()),
        ..change(loc)
    };
    s.append("c", vec![by("a", "alice"), by("b", "alice")], None, now)
        .await
        .unwrap();
    s.append("c", vec![by("a", "bob")], None, now)
        .await
        .unwrap();
    let a = s
        .resource("c", "http://example.com/a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((a.seq, a.source.as_deref()), (3, Some("bob")));
    let b = s
        .resource("c", "http://example.com/b")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((b.seq, b.source.as_deref()), (2, Some("alice")));
    assert!(s
        .resource("c", "http://example.com/none")
        .await
        .unwrap()
        .is_none());
    assert!(s
        .resource("other", "http://example.com/a")
        .await
        .unwrap()
        .is_none());
    // The log keeps it too, and both survive a reopen.
    let log = s.read("c", 0, 10).await.unwrap();
    let sources: Vec<_> = log.iter().map(|c| c.source.as_deref()).collect();
    assert_eq!(sources, vec![Some("alice"), Some("alice"), Some("bob")]);
    drop(s);
    let s = e.open();
    let a = s
        .resource("c", "http://example.com/a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.source.as_deref(), Some("bob"));
}

pub async fn channels_created_at_runtime_are_stored(e: &dyn Engine) {
    use changehub::model::ChannelSpec;
    let s = e.open();
    assert!(s.stored_channels().await.unwrap().is_empty());
    assert!(s.stored_channel("x").await.unwrap().is_none());
    let mut x = ChannelSpec::new("x", "t1", Retention::DEFAULT);
    x.set_publisher("alice", "t2");
    x.read_token = Some("r".into());
    x.retention.max_age = Some(Duration::from_secs(3600));
    s.put_channel(&x).await.unwrap();
    s.put_channel(&ChannelSpec::new("y", "t3", Retention::DEFAULT))
        .await
        .unwrap();
    assert_eq!(s.stored_channel("x").await.unwrap().as_ref(), Some(&x));
    // A change replaces the whole settings.
    x.publishers.remove(0);
    s.put_channel(&x).await.unwrap();
    drop(s);
    let s = e.open();
    let mut all = s.stored_channels().await.unwrap();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(all.len(), 2);
    assert_eq!(all[0], x);
    assert!(s.delete_channel("y").await.unwrap());
    assert!(!s.delete_channel("y").await.unwrap());
    assert_eq!(s.stored_channels().await.unwrap(), vec![x]);
}

pub async fn retention_drops_only_whole_closed_lists(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    s.append("c", changes("r", 23), None, now).await.unwrap();
    let retention = Retention {
        max_changes: 6,
        max_age: None,
        list_size: 5,
    };
    // Keeping 6 would start at 18, inside the closed list 16..=20: the whole list stays.
    assert_eq!(s.trim("c", retention, now).await.unwrap(), 15);
    assert_eq!(
        s.head("c").await.unwrap(),
        ChannelHead {
            oldest: 16,
            last: 23
        }
    );
    // By age: everything is older than a day, but the newest change always stays, and with it
    // the open list 21..=23.
    let by_age = Retention {
        max_changes: 100,
        max_age: Some(Duration::from_secs(86_400)),
        list_size: 5,
    };
    let later = at("2024-01-03T00:00:00Z");
    assert_eq!(s.trim("c", by_age, later).await.unwrap(), 5);
    assert_eq!(s.head("c").await.unwrap().oldest, 21);
    assert_eq!(s.read("c", 0, 100).await.unwrap()[0].seq, 21);
}

pub async fn retention_never_trims_the_index(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    s.append("c", changes("r", 20), None, now).await.unwrap();
    let retention = Retention {
        max_changes: 2,
        max_age: None,
        list_size: 1,
    };
    s.trim("c", retention, now).await.unwrap();
    assert_eq!(s.head("c").await.unwrap().oldest, 19);
    assert_eq!(s.resource_count("c").await.unwrap(), 20);
    assert_eq!(whole_index(s.as_ref(), "c").await.len(), 20);
    drop(s);
    let reopened = e.open();
    assert_eq!(
        whole_index(reopened.as_ref(), "c").await.len(),
        20,
        "durable"
    );
}

/// Whatever the interleaving of concurrent appends, the index is the fold of the log.
pub async fn index_matches_the_log_after_concurrent_appends(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..20u64 {
                let batch = (0..3)
                    .map(|j| change(&format!("r/{}", (t * 7 + i * 3 + j) % 30)))
                    .collect();
                s.append("c", batch, None, now).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let log = s.read("c", 0, 10_000).await.unwrap();
    assert_eq!(log.len(), 480);
    let mut latest = std::collections::BTreeMap::new();
    for c in &log {
        latest.insert(c.seq, c.loc.clone());
        latest.retain(|seq, loc| *seq == c.seq || *loc != c.loc);
    }
    let expected: Vec<(String, u64)> = latest.into_iter().map(|(seq, loc)| (loc, seq)).collect();
    let index: Vec<(String, u64)> = whole_index(s.as_ref(), "c")
        .await
        .into_iter()
        .map(|(loc, seq, _)| (loc, seq))
        .collect();
    assert_eq!(index, expected);
    assert_eq!(s.resource_count("c").await.unwrap(), 30);
}

/// What one append of [`start_burst`] sent.
struct Sent {
    changes: Vec<NewChange>,
}

/// The appends [`start_burst`] makes before its burst, whose keys the burst uses again.
async fn before_burst(s: &dyn Store) -> Vec<changehub::store::Appended> {
    let mut seen = Vec::new();
    for g in 0..8 {
        let key = key(&format!("seen-{g}"), "fp");
        seen.push(
            s.append(
                "c",
                changes(&format!("seen/{g}"), 1),
                key,
                at("2024-01-01T00:00:00Z"),
            )
            .await
            .unwrap(),
        );
    }
    seen
}

/// The appends [`start_burst`] started.
type Started = Vec<(
    Sent,
    tokio::task::JoinHandle<Result<changehub::store::Appended, StoreError>>,
)>;

/// Starts 64 appends to channel `c` at once, of every kind: without a key, with a key of
/// their own, the same key twice with the same body (one must append, the other replay it),
/// the same key twice with different bodies (one must append, the other conflict), a key an
/// earlier append used ([`before_burst`]: a replay). Every append also changes one of a few
/// shared resources, from one of a few publishers.
fn start_burst(s: &Arc<dyn Store>) -> Started {
    let go = Arc::new(tokio::sync::Barrier::new(64));
    let mut started = Vec::new();
    for i in 0..64usize {
        let g = i / 8;
        let (key, body, n) = match i % 8 {
            0 | 1 => (key(&format!("same-{g}"), "fp"), format!("same/{g}"), 2),
            2 => (key(&format!("clash-{g}"), "fp-a"), format!("r/{i}"), 2),
            3 => (key(&format!("clash-{g}"), "fp-b"), format!("r/{i}"), 3),
            4 => (None, format!("r/{i}"), 1),
            5 => (key(&format!("own-{i}"), "fp"), format!("r/{i}"), 3),
            6 => (None, format!("r/{i}"), 5),
            _ => (key(&format!("seen-{g}"), "fp"), format!("seen/{g}"), 1),
        };
        let mut batch = changes(&body, n);
        let mut shared = change(&format!("shared/{}", g % 4));
        shared.source = Some(format!("p{}", g % 3).into());
        batch.push(shared);
        let sent = Sent {
            changes: batch.clone(),
        };
        let (s, go) = (s.clone(), go.clone());
        let task = tokio::spawn(async move {
            go.wait().await;
            s.append("c", batch, key, at("2024-01-01T00:00:00Z")).await
        });
        started.push((sent, task));
    }
    started
}

/// What the appends of [`start_burst`] answered.
type Answers = Vec<(Sent, Result<changehub::store::Appended, StoreError>)>;

async fn wait_burst(started: Started) -> Answers {
    let mut answers = Vec::new();
    for (sent, task) in started {
        answers.push((sent, task.await.unwrap()));
    }
    answers
}

/// Checks what the appends of [`start_burst`] answered: each one its own seqs (the log holds
/// its changes there, in its order), gapless together; each key appended once.
async fn check_burst(s: &dyn Store, seen: &[changehub::store::Appended], answers: Answers) {
    let log = s.read("c", 0, 10_000).await.unwrap();
    let mut appended = Vec::new();
    for (i, (sent, got)) in answers.iter().enumerate() {
        let g = i / 8;
        match (i % 8, got) {
            (0 | 2, _) => {
                // Of two appends with one key, exactly one appended.
                let (other, other_got) = (&answers[i + 1].0, &answers[i + 1].1);
                let (winner, won) = match (got, other_got) {
                    (Ok(a), Ok(b)) if i % 8 == 0 => {
                        assert_ne!(a.replayed, b.replayed, "{i}: one appends, one replays");
                        assert_eq!((a.first, a.last, a.accepted), (b.first, b.last, b.accepted));
                        if a.replayed {
                            (other, b)
                        } else {
                            (sent, a)
                        }
                    }
                    (Ok(a), Err(StoreError::IdempotencyConflict)) if i % 8 == 2 => (sent, a),
                    (Err(StoreError::IdempotencyConflict), Ok(b)) if i % 8 == 2 => (other, b),
                    other => panic!("{i}: {other:?}"),
                };
                assert!(!won.replayed);
                appended.push((winner.changes.clone(), *won));
            }
            (1 | 3, _) => {}
            (7, Ok(a)) => {
                assert!(a.replayed, "{i}: its key was used before the burst");
                assert_eq!(
                    (a.first, a.last, a.accepted),
                    (seen[g].first, seen[g].last, 1)
                );
            }
            (_, Ok(a)) => {
                assert!(!a.replayed, "{i}");
                appended.push((sent.changes.clone(), *a));
            }
            (_, Err(e)) => panic!("{i}: {e}"),
        }
    }
    assert_eq!(appended.len(), 40, "5 appends of every 8");
    appended.sort_by_key(|(_, a)| a.first);
    let mut next = seen.last().map_or(1, |a| a.last + 1);
    for (changes, a) in &appended {
        assert_eq!((a.first, a.accepted as u64), (next, a.last + 1 - a.first));
        assert_eq!(a.accepted, changes.len());
        let locs: Vec<&str> = log[(a.first - 1) as usize..a.last as usize]
            .iter()
            .map(|c| c.loc.as_str())
            .collect();
        let sent: Vec<&str> = changes.iter().map(|c| c.loc.as_str()).collect();
        assert_eq!(locs, sent, "{a:?}: its own changes at its own seqs");
        next = a.last + 1;
    }
    assert_eq!(log.len() as u64, next - 1, "nothing else appended");
    assert_eq!(s.head("c").await.unwrap().last, next - 1);
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
    // The index and the FeedSync items of the shared resources are the fold of the log.
    let mut items: std::collections::BTreeMap<String, (u64, SyncState)> = Default::default();
    for c in &log {
        let current = items.remove(&c.loc).map(|(_, sync)| sync);
        let sync = feedsync::record_local(
            current,
            &c.loc,
            c.source.as_deref(),
            c.datetime,
            c.change == ChangeType::Deleted,
        );
        items.insert(c.loc.clone(), (c.seq, sync));
    }
    for g in 0..4 {
        let loc = format!("http://example.com/shared/{g}");
        let got = s.sync_item("c", &loc).await.unwrap().unwrap();
        assert_eq!(
            (got.change.seq, &got.sync),
            (items[&loc].0, &items[&loc].1),
            "{loc}"
        );
    }
    let index: Vec<(String, u64)> = whole_index(s, "c")
        .await
        .into_iter()
        .map(|(loc, seq, _)| (loc, seq))
        .collect();
    let mut expected: Vec<(String, u64)> = items
        .into_iter()
        .map(|(loc, (seq, _))| (loc, seq))
        .collect();
    expected.sort_by_key(|(_, seq)| *seq);
    assert_eq!(index, expected);
}

/// 64 appends started at once, of every kind (with and without idempotency keys, one key
/// twice at once with the same body and with another), each get their own seqs.
pub async fn concurrent_appends_each_get_their_own_outcome(e: &dyn Engine) {
    let s = e.open();
    let seen = before_burst(s.as_ref()).await;
    let started = start_burst(&s);
    let answers = wait_burst(started).await;
    check_burst(s.as_ref(), &seen, answers).await;
}

/// A change of `loc` of kind `kind` sent by publisher `who` (none: no publisher).
fn sent(loc: &str, kind: ChangeType, who: Option<&str>, when: &str) -> NewChange {
    NewChange {
        source: who.map(Into::into),
        datetime: Some(at(when)),
        ..NewChange::new(format!("http://example.com/{loc}"), kind)
    }
}

/// FeedSync items by loc.
type Items = std::collections::BTreeMap<String, SyncState>;

/// What change `new` makes of its resource's item in `items`, as the model computes it.
fn record(items: &mut Items, new: &NewChange) {
    let current = items.remove(&new.loc);
    let sync = feedsync::record_local(
        current,
        &new.loc,
        new.source.as_deref(),
        new.datetime.unwrap(),
        new.change == ChangeType::Deleted,
    );
    items.insert(new.loc.clone(), sync);
}

/// Every change updates its resource's FeedSync item as `feedsync::record_local` says
/// (creation, updates by the same and by another endpoint, a tombstone, a change without a
/// publisher), on every engine and across a reopening.
pub async fn feedsync_items_follow_every_change(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    let script = [
        sent(
            "a",
            ChangeType::Created,
            Some("alice"),
            "2024-01-01T00:00:01Z",
        ),
        sent("b", ChangeType::Created, None, "2024-01-01T00:00:02Z"),
        sent(
            "a",
            ChangeType::Updated,
            Some("alice"),
            "2024-01-01T00:00:03.5Z",
        ),
        sent(
            "c",
            ChangeType::Created,
            Some("alice"),
            "2024-01-01T00:00:03.6Z",
        ),
        sent(
            "a",
            ChangeType::Updated,
            Some("bob"),
            "2024-01-01T00:00:04Z",
        ),
        sent(
            "a",
            ChangeType::Deleted,
            Some("alice"),
            "2024-01-01T00:00:05Z",
        ),
        sent(
            "b",
            ChangeType::Updated,
            Some("bob"),
            "2024-01-01T00:00:06Z",
        ),
        sent(
            "c",
            ChangeType::Deleted,
            Some("alice"),
            "2024-01-01T00:00:07Z",
        ),
        sent(
            "c",
            ChangeType::Created,
            Some("alice"),
            "2024-01-01T00:00:08Z",
        ),
    ];
    let mut expected = Items::default();
    for new in &script {
        record(&mut expected, new);
    }
    // Three appends: one item is updated twice in one append, and again in the next; another
    // is updated by the same endpoint in later appends (deleted, then created again).
    s.append("c", script[..4].to_vec(), None, now)
        .await
        .unwrap();
    s.append("c", script[4..8].to_vec(), None, now)
        .await
        .unwrap();
    s.append("c", script[8..].to_vec(), None, now)
        .await
        .unwrap();
    let a = &expected["http://example.com/a"];
    assert_eq!(a.updates, 4);
    assert!(a.deleted);
    assert_eq!(a.id, "http:%2F%2Fexample.com%2Fa");
    assert_eq!(
        a.history
            .iter()
            .map(|h| (h.sequence, h.by.as_deref()))
            .collect::<Vec<_>>(),
        [(4, Some("alice")), (3, Some("bob"))],
        "compacted: one update per endpoint"
    );
    let c = &expected["http://example.com/c"];
    assert_eq!((c.updates, c.deleted, c.history.len()), (3, false, 1));
    check_items(s.as_ref(), &expected).await;
    drop(s);
    check_items(e.open().as_ref(), &expected).await;
}

async fn check_items(s: &dyn Store, expected: &Items) {
    let page = s.sync_items("c", 0, 10).await.unwrap();
    assert_eq!(page.last, 9);
    let got: Vec<(u64, &str)> = page
        .items
        .iter()
        .map(|i| (i.change.seq, i.change.loc.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (6, "http://example.com/a"),
            (7, "http://example.com/b"),
            (9, "http://example.com/c")
        ]
    );
    for item in &page.items {
        assert_eq!(item.sync, expected[&item.change.loc], "{}", item.change.loc);
        assert_eq!(item.change.conflicts, 0);
    }
    let one = s.sync_item("c", "http://example.com/a").await.unwrap();
    assert_eq!(one.unwrap().sync, expected["http://example.com/a"]);
    assert!(s
        .sync_item("c", "http://example.com/z")
        .await
        .unwrap()
        .is_none());
    assert_eq!(s.sync_items("c", 7, 10).await.unwrap().items.len(), 1);
}

/// A publisher whose name holds characters that mean something in a pattern (Redis's script
/// finds counted items with one) has its items updated like any other's.
pub async fn feedsync_items_of_a_publisher_with_pattern_characters(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    let who = "pub[lisher (a.k.a. *+-?^$%)";
    let m = |kind, when| sent("m", kind, Some(who), when);
    let script = [
        m(ChangeType::Created, "2024-01-01T00:00:01Z"),
        m(ChangeType::Updated, "2024-01-01T00:00:02Z"),
        m(ChangeType::Updated, "2024-01-01T00:00:03Z"),
        m(ChangeType::Deleted, "2024-01-01T00:00:04Z"),
    ];
    let mut expected = Items::default();
    for new in &script {
        record(&mut expected, new);
    }
    // Two changes in one append, then one in each of two more.
    for part in [&script[..2], &script[2..3], &script[3..]] {
        s.append("c", part.to_vec(), None, now).await.unwrap();
    }
    let item = s
        .sync_item("c", "http://example.com/m")
        .await
        .unwrap()
        .expect("an item");
    assert_eq!(item.sync, expected["http://example.com/m"]);
    assert_eq!((item.sync.updates, item.sync.deleted), (4, true));
}

/// Within one append an item changes hands and back: each change sees the item the one before
/// it left, whatever form the store keeps it in (on Redis, counted items are expanded from the
/// change before them in the same call, or from the index).
pub async fn feedsync_items_change_endpoints_within_one_append(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    let y = |kind, who, when| sent("y", kind, Some(who), when);
    let z = |kind, who, when| sent("z", kind, Some(who), when);
    let seconds = |when: &str| Some(at(when).unix_timestamp());
    let appends = [
        vec![
            y(ChangeType::Created, "alice", "2024-01-01T00:00:01Z"),
            z(ChangeType::Created, "alice", "2024-01-01T00:00:02Z"),
            y(ChangeType::Deleted, "alice", "2024-01-01T00:00:03Z"),
            y(ChangeType::Created, "bob", "2024-01-01T00:00:04Z"),
            z(ChangeType::Updated, "alice", "2024-01-01T00:00:05Z"),
        ],
        vec![
            z(ChangeType::Updated, "bob", "2024-01-01T00:00:06Z"),
            z(ChangeType::Deleted, "bob", "2024-01-01T00:00:07Z"),
            y(ChangeType::Updated, "alice", "2024-01-01T00:00:08Z"),
        ],
    ];
    let entry = |seq: u32, by: &str, when| (seq, Some(by.to_string()), seconds(when));
    // After each append, the history of the item that changed hands in it: alice's entry of y
    // is her deletion's, not her creation's; alice's entry of z her latest update's.
    let handed = [
        (
            "y",
            [
                entry(3, "bob", "2024-01-01T00:00:04Z"),
                entry(2, "alice", "2024-01-01T00:00:03Z"),
            ],
        ),
        (
            "z",
            [
                entry(4, "bob", "2024-01-01T00:00:07Z"),
                entry(2, "alice", "2024-01-01T00:00:05Z"),
            ],
        ),
    ];
    let mut expected = Items::default();
    for (changes, (name, history)) in appends.into_iter().zip(handed) {
        for new in &changes {
            record(&mut expected, new);
        }
        s.append("c", changes, None, now).await.unwrap();
        for (loc, sync) in &expected {
            let got = s.sync_item("c", loc).await.unwrap().unwrap();
            assert_eq!(&got.sync, sync, "{loc}");
        }
        let model: Vec<_> = expected[&format!("http://example.com/{name}")]
            .history
            .iter()
            .map(|h| (h.sequence, h.by.clone(), h.when))
            .collect();
        assert_eq!(model, history, "{name}");
    }
}

/// Bridge cursors are kept apart per channel and per bridge, and move only when put.
pub async fn bridge_cursors_are_kept_per_channel_and_bridge(e: &dyn Engine) {
    let s = e.open();
    assert_eq!(s.bridge_cursor("c", "xmpp").await.unwrap(), None);
    s.put_bridge_cursor("c", "xmpp", 7).await.unwrap();
    s.put_bridge_cursor("d", "xmpp", 3).await.unwrap();
    s.put_bridge_cursor("c", "other", 1).await.unwrap();
    assert_eq!(s.bridge_cursor("c", "xmpp").await.unwrap(), Some(7));
    assert_eq!(s.bridge_cursor("d", "xmpp").await.unwrap(), Some(3));
    assert_eq!(s.bridge_cursor("c", "other").await.unwrap(), Some(1));
    assert_eq!(s.bridge_cursor("e", "xmpp").await.unwrap(), None);
    s.put_bridge_cursor("c", "xmpp", 9).await.unwrap();
    assert_eq!(s.bridge_cursor("c", "xmpp").await.unwrap(), Some(9));
}

/// A merge is appended only if nothing it read has moved; its items take their merged state,
/// their changes record the conflicts, the conflicts are listed, and an update by the
/// conflicting endpoint resolves them.
pub async fn merges_are_appended_only_onto_what_they_read(e: &dyn Engine) {
    let s = e.open();
    let now = at("2024-01-01T00:00:00Z");
    let loc = "http://example.com/m";
    s.append(
        "c",
        vec![sent(
            "m",
            ChangeType::Created,
            Some("alice"),
            "2024-01-01T00:00:01Z",
        )],
        None,
        now,
    )
    .await
    .unwrap();
    let local = s.sync_item("c", loc).await.unwrap().unwrap();
    let mut theirs = local.sync.clone();
    theirs.update(
        Some("carol"),
        Some(at("2024-01-01T00:00:02Z").unix_timestamp()),
        false,
    );
    let mut ours = local.sync.clone();
    ours.update(
        Some("alice"),
        Some(at("2024-01-01T00:00:03Z").unix_timestamp()),
        false,
    );
    let data = |hash: &str| feedsync::ItemData {
        hash: Some(hash.into()),
        ..feedsync::ItemData::of(&local.change)
    };
    let merged = feedsync::merge(
        Some(&feedsync::Item {
            sync: ours,
            data: data("md5:aa"),
        }),
        &feedsync::Item {
            sync: theirs,
            data: data("md5:cc"),
        },
    );
    assert_eq!(merged.sync.conflicts.len(), 1);
    let change = |expected: u64| feedsync::MergedChange {
        change: NewChange {
            hash: merged.data.hash.clone(),
            source: Some("carol".into()),
            ..NewChange::new(loc, ChangeType::Updated)
        },
        expected,
        sync: merged.sync.clone(),
    };
    assert_eq!(
        s.append_merged("c", vec![change(7)], now).await.unwrap(),
        None
    );
    assert_eq!(
        s.head("c").await.unwrap().last,
        1,
        "a stale merge appends nothing"
    );
    let done = s
        .append_merged("c", vec![change(1)], now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((done.first, done.last), (2, 2));
    let read = s.read("c", 1, 10).await.unwrap();
    assert_eq!(read[0].conflicts, 1);
    assert_eq!(read[0].hash.as_deref(), Some("md5:aa"));
    let stored = s.sync_item("c", loc).await.unwrap().unwrap();
    assert_eq!(stored.sync, merged.sync);
    assert_eq!(stored.change.conflicts, 1);
    let open = s.sync_conflicts("c", 10).await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].change.loc, loc);

    // Another endpoint's update keeps the conflict (the store computes what the model does),
    // here in a large request (on Redis, an instance reads the changes of its large requests
    // back from memory: the conflicts count must be there too) …
    let mut update = vec![sent(
        "m",
        ChangeType::Updated,
        Some("bob"),
        "2024-01-01T00:00:04Z",
    )];
    update.extend((0..99).map(|i| {
        sent(
            &format!("other/{i}"),
            ChangeType::Updated,
            Some("bob"),
            "2024-01-01T00:00:04Z",
        )
    }));
    let bobs = s.append("c", update, None, now).await.unwrap();
    let mut expected = merged.sync.clone();
    expected.update(
        Some("bob"),
        Some(at("2024-01-01T00:00:04Z").unix_timestamp()),
        false,
    );
    expected.compact();
    let stored = s.sync_item("c", loc).await.unwrap().unwrap();
    assert_eq!(stored.sync, expected);
    let read = s.read("c", bobs.first - 1, 100).await.unwrap();
    assert_eq!(read[0].conflicts, 1);
    // … and carol's resolves hers.
    s.append(
        "c",
        vec![sent(
            "m",
            ChangeType::Updated,
            Some("carol"),
            "2024-01-01T00:00:05Z",
        )],
        None,
        now,
    )
    .await
    .unwrap();
    expected.update(
        Some("carol"),
        Some(at("2024-01-01T00:00:05Z").unix_timestamp()),
        false,
    );
    expected.compact();
    let stored = s.sync_item("c", loc).await.unwrap().unwrap();
    assert_eq!(stored.sync, expected);
    assert!(stored.sync.conflicts.is_empty());
    assert_eq!(s.read("c", bobs.last, 1).await.unwrap()[0].conflicts, 0);
    assert!(s.sync_conflicts("c", 10).await.unwrap().is_empty());
}

macro_rules! contract_tests {
    ($engine:ident, $make:expr) => {
        mod $engine {
            use super::*;
            contract_tests!(@each $make;
                appends_number_changes_from_one_without_gaps,
                concurrent_appends_stay_gapless,
                datetimes_never_go_backwards,
                idempotency_keys_replay_and_conflict,
                retention_trims_by_count_and_age,
                watch_head_follows_appends,
                subscriptions_and_delivery_state,
                data_survives_reopening,
                one_lease_holder_at_a_time,
                events_reach_every_instance,
                resource_index_keeps_the_latest_change_of_each_loc,
                resource_pages_lose_nothing_while_resources_change,
                retention_never_trims_the_index,
                retention_drops_only_whole_closed_lists,
                channels_created_at_runtime_are_stored,
                the_index_remembers_who_sent_each_resource,
                channel_origin_is_recorded_once,
                resource_marks_cut_the_index_into_pages,
                index_matches_the_log_after_concurrent_appends,
                concurrent_appends_each_get_their_own_outcome,
                feedsync_items_follow_every_change,
                feedsync_items_change_endpoints_within_one_append,
                feedsync_items_of_a_publisher_with_pattern_characters,
                merges_are_appended_only_onto_what_they_read,
                bridge_cursors_are_kept_per_channel_and_bridge,
            );
        }
    };
    (@each $make:expr; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let engine = $make;
                super::$test(&engine).await;
            }
        )*
    };
}

/// The embedded store, in a temporary folder.
struct Embedded {
    dir: tempfile::TempDir,
}

impl Engine for Embedded {
    fn open(&self) -> Arc<dyn Store> {
        Arc::new(changehub::store::EmbeddedStore::open(self.dir.path()).unwrap())
    }
}

contract_tests!(
    embedded,
    Embedded {
        dir: tempfile::tempdir().unwrap()
    }
);

/// The Redis store, on a private `redis-server` with AOF.
struct Redis {
    server: redis_server::RedisServer,
}

impl Engine for Redis {
    fn open(&self) -> Arc<dyn Store> {
        Arc::new(changehub::store::RedisStore::open(&self.server.url()).unwrap())
    }
}

contract_tests!(
    redis,
    Redis {
        server: redis_server::RedisServer::start(true)
    }
);

/// The Redis store on a private Redis Cluster (three primaries): every script and transaction
/// must keep to one slot, or the cluster refuses it.
struct RedisCluster {
    cluster: redis_server::RedisCluster,
}

impl Engine for RedisCluster {
    fn open(&self) -> Arc<dyn Store> {
        Arc::new(changehub::store::RedisStore::open(&self.cluster.url()).unwrap())
    }
}

contract_tests!(
    redis_cluster,
    RedisCluster {
        cluster: redis_server::RedisCluster::start()
    }
);

/// Announces subscription `id` from `from` until `events` hears it.
async fn hear(
    from: &dyn Store,
    events: &mut tokio::sync::broadcast::Receiver<changehub::store::ClusterEvent>,
    id: &str,
) {
    let event = changehub::store::ClusterEvent::Subscription {
        channel: "c".into(),
        id: id.into(),
    };
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let _ = from.announce(&event).await;
        let heard = tokio::time::timeout(Duration::from_millis(200), async {
            loop {
                match events.recv().await {
                    Ok(got) if got == event => return true,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return false,
                }
            }
        })
        .await;
        if heard == Ok(true) {
            return;
        }
        assert!(tokio::time::Instant::now() < end, "{id} never heard");
    }
}

/// A Redis store written before the resource index existed (no index keys, no `indexed` in
/// the meta) completes its index from the retained log on first use; appends made meanwhile
/// are never overwritten by older log entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_older_data_is_indexed_on_first_use() {
    let server = redis_server::RedisServer::start(false);
    let s = changehub::store::RedisStore::open(&server.url()).unwrap();
    let now = at("2024-01-01T00:00:00Z");
    let batch: Vec<NewChange> = (0..2500)
        .map(|i| change(&format!("r/{}", i % 1200)))
        .collect();
    s.append("c", batch, None, now).await.unwrap();
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = ::redis::pipe()
        .del("changehub:{c}:res")
        .del("changehub:{c}:res-seq")
        .hdel("changehub:{c}:meta", "indexed")
        .query_async(&mut conn)
        .await
        .unwrap();
    let log = s.read("c", 0, 10_000).await.unwrap();
    let mut expected = std::collections::BTreeMap::new();
    for c in &log {
        expected.insert(c.loc.clone(), c.seq);
    }
    assert_eq!(s.resource_count("c").await.unwrap(), 1200);
    let page = s.resources("c", 0, 10_000).await.unwrap();
    let got: std::collections::BTreeMap<String, u64> = page
        .resources
        .iter()
        .map(|c| (c.loc.clone(), c.seq))
        .collect();
    assert_eq!(got, expected);
    let indexed: Option<String> = ::redis::cmd("HGET")
        .arg("changehub:{c}:meta")
        .arg("indexed")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(indexed.as_deref(), Some("1"));
}

/// Redis forgets its scripts when it restarts or when they are flushed: the next append loads
/// the append script again and goes through, numbered on from the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_appends_go_on_after_the_scripts_are_flushed() {
    let server = redis_server::RedisServer::start(false);
    let s = changehub::store::RedisStore::open(&server.url()).unwrap();
    let now = at("2024-01-01T00:00:00Z");
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut expected = Vec::new();
    for (round, n) in [3, 2, 4].into_iter().enumerate() {
        let batch = changes(&format!("round{round}"), n);
        expected.extend(batch.iter().map(|c| c.loc.clone()));
        let appended = s.append("c", batch, None, now).await.unwrap();
        assert_eq!(appended.last, expected.len() as u64);
        let _: () = ::redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let log = s.read("c", 0, 100).await.unwrap();
    let got: Vec<(u64, String)> = log.iter().map(|c| (c.seq, c.loc.clone())).collect();
    let want: Vec<(u64, String)> = (1..).zip(expected).collect();
    assert_eq!(got, want);
}

/// On Redis the changes of a large request are held for the batcher's next read: the store
/// says how many from a seq on (what the batcher reads ahead by), within its byte budget, and
/// a read takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_large_requests_are_held_for_the_next_read() {
    let server = redis_server::RedisServer::start(false);
    let s = changehub::store::RedisStore::open(&server.url()).unwrap();
    let now = at("2024-01-01T00:00:00Z");
    assert_eq!(s.held_after("c", 0), 0);
    s.append("c", changes("small", 3), None, now).await.unwrap();
    assert_eq!(
        s.held_after("c", 0),
        0,
        "small requests are read from the log"
    );
    s.append("c", changes("large", 500), None, now)
        .await
        .unwrap();
    s.append("c", changes("next", 500), None, now)
        .await
        .unwrap();
    assert_eq!(s.held_after("c", 3), 1000, "two requests in a row");
    assert_eq!(s.held_after("c", 503), 500);
    let read = s.read("c", 3, 600).await.unwrap();
    assert_eq!(read.first().map(|c| c.seq), Some(4));
    assert_eq!(read.len(), 600);
    assert_eq!(s.held_after("c", 3), 0, "taken by the read");
    assert_eq!(s.held_after("c", 603), 400);
    // A budget smaller than one request holds none of it.
    let small = changehub::store::RedisStore::open_holding(&server.url(), 1024).unwrap();
    small
        .append("d", changes("large", 500), None, now)
        .await
        .unwrap();
    assert_eq!(small.held_after("d", 0), 0);
}

/// On Redis the common FeedSync item (one publisher's updates) is stored counted, not as JSON;
/// an item stored as JSON (as older hubs stored every item) is read as it is, and counted from
/// its next update once it has the common shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_common_items_are_counted_and_older_ones_read() {
    use ::redis::AsyncCommands;
    let server = redis_server::RedisServer::start(false);
    let s = changehub::store::RedisStore::open(&server.url()).unwrap();
    let now = at("2024-01-01T00:00:00Z");
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let sx = "changehub:{c}:sx";
    let loc = |name: &str| format!("http://example.com/{name}");
    let by_alice = |name, kind, when| sent(name, kind, Some("alice"), when);
    s.append(
        "c",
        vec![
            by_alice("o", ChangeType::Created, "2024-01-01T00:00:01Z"),
            by_alice("o", ChangeType::Updated, "2024-01-01T00:00:02Z"),
            by_alice("p", ChangeType::Created, "2024-01-01T00:00:03Z"),
        ],
        None,
        now,
    )
    .await
    .unwrap();
    // (A read brings the items up to the log: see redis_the_index_follows_the_log.)
    s.sync_item("c", &loc("o")).await.unwrap();
    let stored: String = conn.hget(sx, loc("o")).await.unwrap();
    assert_eq!(stored, "2 alice");

    // Items as an older hub wrote them: o in the common shape, p with its sequence ahead of
    // its updates (as a merge can leave it).
    let older = |name: &str, updates: u32, sequence: u32| {
        format!(
            r#"{{"id":"http:%2F%2Fexample.com%2F{name}","updates":{updates},"history":[{{"sequence":{sequence},"when":1704067203,"by":"alice"}}]}}"#
        )
    };
    let _: () = conn
        .hset_multiple(
            sx,
            &[(loc("o"), older("o", 5, 5)), (loc("p"), older("p", 5, 7))],
        )
        .await
        .unwrap();
    let mut expected = Items::default();
    for name in ["o", "p"] {
        let read = s.sync_item("c", &loc(name)).await.unwrap().unwrap();
        assert_eq!(read.sync.updates, 5);
        expected.insert(loc(name), read.sync);
    }
    assert_eq!(expected[&loc("p")].history[0].sequence, 7);
    for (round, when) in ["2024-01-01T00:00:04Z", "2024-01-01T00:00:05Z"]
        .into_iter()
        .enumerate()
    {
        let changes = ["o", "p"].map(|name| by_alice(name, ChangeType::Deleted, when));
        for new in &changes {
            record(&mut expected, new);
        }
        s.append("c", changes.to_vec(), None, now).await.unwrap();
        for name in ["o", "p"] {
            let read = s.sync_item("c", &loc(name)).await.unwrap().unwrap();
            assert_eq!(read.sync, expected[&loc(name)], "{name}, round {round}");
        }
        let o: String = conn.hget(sx, loc("o")).await.unwrap();
        let p: String = conn.hget(sx, loc("p")).await.unwrap();
        assert_eq!(o, format!("{} alice", 6 + round), "counted from now on");
        assert!(p.starts_with('{'), "the sequence stays ahead: JSON ({p})");
    }
}

/// A plain append writes the log alone; the resource index and the FeedSync items follow: at
/// once for a read, and within a moment without one (the instance folds what it appended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_the_index_follows_the_log() {
    use ::redis::AsyncCommands;
    let server = redis_server::RedisServer::start(false);
    let s = changehub::store::RedisStore::open(&server.url()).unwrap();
    let now = at("2024-01-01T00:00:00Z");
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let meta = "changehub:{c}:meta";
    let by_alice = |name, when| sent(name, ChangeType::Updated, Some("alice"), when);
    let folded = |conn: &mut ::redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let (last, folded): (Option<u64>, Option<u64>) = ::redis::cmd("HMGET")
                .arg(meta)
                .arg("last")
                .arg("folded")
                .query_async(&mut conn)
                .await
                .unwrap();
            (last, folded)
        }
    };

    // Right after the append, the index is behind the log; a read brings it up first.
    s.append("c", vec![by_alice("a", "2024-01-01T00:00:01Z")], None, now)
        .await
        .unwrap();
    let behind = folded(&mut conn).await;
    assert_eq!(behind.0, Some(1));
    assert!(behind.1 < Some(1), "the index waits: {behind:?}");
    let page = s.resources("c", 0, 10).await.unwrap();
    assert_eq!((page.last, page.resources.len()), (1, 1));
    assert_eq!(folded(&mut conn).await, (Some(1), Some(1)));

    // Without a read, the instance folds what it appended within a moment: from the entries
    // it sent, and from the log for those the script changed (the last ten, whose datetimes
    // are raised to the channel's latest).
    let many: Vec<NewChange> = (0..50)
        .map(|i| {
            let when = if i < 40 {
                "2024-01-01T00:00:02Z"
            } else {
                "2024-01-01T00:00:01.5Z"
            };
            by_alice(if i % 2 == 0 { "a" } else { "b" }, when)
        })
        .collect();
    for piece in many.chunks(10) {
        s.append("c", piece.to_vec(), None, now).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (last, folded) = folded(&mut conn).await;
        if last == Some(51) && folded == Some(51) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not folded: last {last:?}, folded {folded:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a: String = conn
        .hget("changehub:{c}:sx", "http://example.com/a")
        .await
        .unwrap();
    let b: String = conn
        .hget("changehub:{c}:sx", "http://example.com/b")
        .await
        .unwrap();
    assert_eq!((a.as_str(), b.as_str()), ("26 alice", "25 alice"));
    let seq: u64 = conn
        .zscore("changehub:{c}:res-seq", "http://example.com/a")
        .await
        .unwrap();
    assert_eq!(seq, 50, "the latest change of a");
    let raised = changehub::store::redis::datetime_key(at("2024-01-01T00:00:02Z"));
    for name in ["a", "b"] {
        let entry: String = conn
            .hget("changehub:{c}:res", format!("http://example.com/{name}"))
            .await
            .unwrap();
        assert!(entry.starts_with(&raised), "{name}: {entry}");
    }
}

/// The fold writes the index and the items as the append script does when it writes them
/// itself (as it does while some item carries conflicts): the same changes, appended to a
/// channel of each kind, leave the same keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_the_fold_writes_what_the_append_script_writes() {
    use ::redis::AsyncCommands;
    let server = redis_server::RedisServer::start(false);
    let s = changehub::store::RedisStore::open(&server.url()).unwrap();
    let now = at("2024-01-01T00:00:00Z");
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // A conflict on a resource no change touches keeps channel `inline` inline.
    let _: () = conn
        .zadd(
            "changehub:{inline}:sx-conflicts",
            "http://example.com/elsewhere",
            0,
        )
        .await
        .unwrap();
    let odd = "pub[lisher (a.k.a. *+-?^$%)";
    let kinds = [
        ChangeType::Created,
        ChangeType::Updated,
        ChangeType::Deleted,
    ];
    let mut calls: Vec<Vec<NewChange>> = Vec::new();
    for call in 0..12 {
        let mut changes = Vec::new();
        for i in 0..(3 + call % 4) {
            let n = (call * 7 + i * 3) % 9;
            let who = match (call + i) % 5 {
                0 => None,
                1 => Some(odd),
                2 => Some("bob"),
                _ => Some("alice"),
            };
            let when = format!("2024-01-01T00:{:02}:{:02}Z", call, i);
            changes.push(sent(&format!("r{n}"), kinds[(call + i) % 3], who, &when));
        }
        // Resources of one publisher, whose items stay counted.
        let when = format!("2024-01-01T00:{call:02}:59Z");
        changes.push(sent("s0", ChangeType::Updated, Some("alice"), &when));
        if call % 2 == 0 {
            changes.push(sent("s1", ChangeType::Updated, Some(odd), &when));
        }
        calls.push(changes);
    }
    // An item as an older hub wrote it, on both channels: its sequence ahead of its updates.
    for channel in ["inline", "folded"] {
        s.append(channel, calls[0].clone(), None, now)
            .await
            .unwrap();
        s.resources(channel, 0, 100).await.unwrap();
        let older = r#"{"id":"http:%2F%2Fexample.com%2Fr3","updates":5,"history":[{"sequence":7,"when":1704067203,"by":"alice"}]}"#;
        let _: () = conn
            .hset(
                format!("changehub:{{{channel}}}:sx"),
                "http://example.com/r3",
                older,
            )
            .await
            .unwrap();
        for changes in &calls[1..] {
            s.append(channel, changes.clone(), None, now).await.unwrap();
        }
    }
    let inline_meta: Option<u64> = conn
        .hget("changehub:{inline}:meta", "folded")
        .await
        .unwrap();
    assert_eq!(
        inline_meta, None,
        "the inline channel never waits for a fold"
    );
    let folded = s.resources("folded", 0, 100).await.unwrap();
    let inline = s.resources("inline", 0, 100).await.unwrap();
    assert_eq!(folded.last, inline.last);
    assert_eq!(folded.resources, inline.resources);

    let res = |channel: &str| format!("changehub:{{{channel}}}:res");
    let res_seq = |channel: &str| format!("changehub:{{{channel}}}:res-seq");
    let sx = |channel: &str| format!("changehub:{{{channel}}}:sx");
    let a: std::collections::BTreeMap<String, Vec<u8>> = conn.hgetall(res("inline")).await.unwrap();
    let b: std::collections::BTreeMap<String, Vec<u8>> = conn.hgetall(res("folded")).await.unwrap();
    assert_eq!(a, b, "res");
    let a: Vec<(String, u64)> = conn
        .zrange_withscores(res_seq("inline"), 0, -1)
        .await
        .unwrap();
    let b: Vec<(String, u64)> = conn
        .zrange_withscores(res_seq("folded"), 0, -1)
        .await
        .unwrap();
    assert_eq!(a, b, "res-seq");
    let a: std::collections::BTreeMap<String, String> = conn.hgetall(sx("inline")).await.unwrap();
    let b: std::collections::BTreeMap<String, String> = conn.hgetall(sx("folded")).await.unwrap();
    assert_eq!(a.len(), 11);
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let mut counted = 0;
    for (loc, inline) in &a {
        let folded = &b[loc];
        assert_eq!(
            inline.starts_with('{'),
            folded.starts_with('{'),
            "{loc}: {inline} / {folded}"
        );
        if inline.starts_with('{') {
            // JSON: written by two encoders, the same item.
            let x: SyncState = serde_json::from_str(inline).unwrap();
            let y: SyncState = serde_json::from_str(folded).unwrap();
            assert_eq!(x, y, "{loc}");
        } else {
            assert_eq!(inline, folded, "{loc}");
            counted += 1;
        }
    }
    assert!(counted > 0 && counted < a.len(), "both forms are compared");
    for loc in a.keys() {
        let x = s.sync_item("inline", loc).await.unwrap().unwrap();
        let y = s.sync_item("folded", loc).await.unwrap().unwrap();
        assert_eq!(x.sync, y.sync, "{loc}");
    }
}

/// How many `EVALSHA` calls `server` ran since its statistics were last reset.
async fn evalsha_calls(conn: &mut ::redis::aio::MultiplexedConnection) -> u64 {
    command_calls(conn, "evalsha").await
}

/// How many calls of `command` (lower case) the server of `conn` ran since its statistics
/// were last reset.
async fn command_calls(conn: &mut ::redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The log's range reads (`XRANGE`, `XREVRANGE`) the server of `conn` ran since its
/// statistics were last reset.
async fn range_reads(conn: &mut ::redis::aio::MultiplexedConnection) -> u64 {
    command_calls(conn, "xrange").await + command_calls(conn, "xrevrange").await
}

/// An instance reads the changes of the large requests it appended a moment ago from what it
/// keeps of them, not from the log — and reads exactly what the log holds (a datetime raised,
/// a datetime's own offset, every field) — but never keeps a change the script did not store
/// as sent, nor serves a range that retention passed or one of a log that was lost and begun
/// again; what it kept is read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_instance_reads_back_its_appends_as_the_log_holds_them() {
    use changehub::model::{Change, Link};
    let server = redis_server::RedisServer::start(false);
    // `a` appends; `b` appends nothing, so it reads the log.
    let a = changehub::store::RedisStore::open(&server.url()).unwrap();
    let b = changehub::store::RedisStore::open(&server.url()).unwrap();
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let now = at("2024-01-01T00:00:00Z");
    let full = NewChange {
        datetime: Some(at("2024-01-01T00:59:59.123456789+01:00")),
        lastmod: Some(at("2023-12-31T00:00:00-05:00")),
        hash: Some("md5:1e0d5cb8ef6ba40c99b14c0237be735e".into()),
        length: Some(1234),
        media_type: Some("text/plain".into()),
        links: vec![Link {
            rel: "describedby".into(),
            href: "http://example.com/full.json".into(),
            attrs: [("type".to_string(), "application/json".to_string())].into(),
        }],
        source: Some("alice".into()),
        ..NewChange::new("http://example.com/full", ChangeType::Created)
    };
    let dated = |prefix: &str, n: usize, when: &str| {
        let mut out = changes(prefix, n);
        for c in &mut out {
            c.datetime = Some(at(when));
        }
        out
    };
    let mut first = vec![full];
    first.extend(changes("plain", 99));
    // (changes, kept: large and stored as sent)
    let requests = [
        (first, true),
        (dated("late", 100, "2030-01-01T00:00:00Z"), true),
        // Received before the latest: raised to it, not stored as sent.
        (changes("raised", 100), false),
        (dated("after", 100, "2031-01-01T00:00:00+01:00"), true),
        // Small: read back from the log.
        (dated("small", 2, "2031-01-01T00:00:00Z"), false),
    ];
    let mut ranges = Vec::new();
    for (request, kept) in requests {
        let n = request.len();
        let appended = a.append("c", request, None, now).await.unwrap();
        ranges.push((appended.first - 1, n, kept));
    }
    let json = |changes: &[Change]| serde_json::to_string(changes).unwrap();
    let _: () = ::redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    for &(after, n, kept) in &ranges {
        let before = range_reads(&mut conn).await;
        let read = a.read("c", after, n).await.unwrap();
        let read_log = range_reads(&mut conn).await > before;
        assert_eq!(read_log, !kept, "range after {after}: the log read or not");
        let logged = b.read("c", after, n).await.unwrap();
        assert!(range_reads(&mut conn).await > before, "b reads the log");
        assert_eq!(read.len(), n);
        assert_eq!(json(&read), json(&logged), "range after {after}");
    }
    assert_eq!(
        b.read("c", 200, 1).await.unwrap()[0].datetime,
        at("2030-01-01T00:00:00Z"),
        "raised"
    );
    // Read once: again, from the log.
    let (after, n, _) = ranges[0];
    let before = range_reads(&mut conn).await;
    assert_eq!(a.read("c", after, n).await.unwrap().len(), n);
    assert!(range_reads(&mut conn).await > before);

    // A range kept in part (the raised changes are not kept): what is kept from its start
    // from memory, the rest from the log.
    let kept = a
        .append("c", dated("kept", 100, "2032-01-01T00:00:00Z"), None, now)
        .await
        .unwrap();
    a.append("c", changes("raised-too", 100), None, now)
        .await
        .unwrap();
    a.append(
        "c",
        dated("after-too", 100, "2033-01-01T00:00:00Z"),
        None,
        now,
    )
    .await
    .unwrap();
    let read = a.read("c", kept.first - 1, 1000).await.unwrap();
    assert_eq!(read.len(), 300);
    assert_eq!(
        json(&read),
        json(&b.read("c", kept.first - 1, 1000).await.unwrap())
    );

    // Retention past a range's start: read from the log, from `oldest` on.
    let kept = a
        .append(
            "c",
            dated("trimmed", 100, "2034-01-01T00:00:00Z"),
            None,
            now,
        )
        .await
        .unwrap();
    b.trim(
        "c",
        Retention {
            max_changes: 5,
            max_age: None,
            list_size: 1,
        },
        now,
    )
    .await
    .unwrap();
    let seqs: Vec<u64> = a
        .read("c", kept.first - 1, 100)
        .await
        .unwrap()
        .iter()
        .map(|c| c.seq)
        .collect();
    assert_eq!(seqs, (kept.last - 4..=kept.last).collect::<Vec<u64>>());

    // The log lost (Redis emptied) and begun again by another instance: its seqs start over
    // under another epoch, and `a` reads them, not what it kept of the lost log.
    a.append("e", changes("lost", 100), None, now)
        .await
        .unwrap();
    let _: () = ::redis::cmd("FLUSHALL")
        .query_async(&mut conn)
        .await
        .unwrap();
    let again = b
        .append("e", changes("again", 100), None, now)
        .await
        .unwrap();
    assert_eq!((again.first, again.last), (1, 100));
    let read = a.read("e", 0, 100).await.unwrap();
    assert_eq!(json(&read), json(&b.read("e", 0, 100).await.unwrap()));
    assert_eq!(read[0].loc, "http://example.com/again/0");
}

/// A private redis-server with a store on it, ready for a burst (`before_burst`), and a
/// connection of its own whose command statistics were just reset.
async fn burst_on_private_redis() -> (
    redis_server::RedisServer,
    Arc<dyn Store>,
    ::redis::aio::MultiplexedConnection,
    Vec<changehub::store::Appended>,
) {
    let server = redis_server::RedisServer::start(false);
    let s: Arc<dyn Store> = Arc::new(changehub::store::RedisStore::open(&server.url()).unwrap());
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let seen = before_burst(s.as_ref()).await;
    let _: () = ::redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    (server, s, conn, seen)
}

/// Appends to one channel started together share script calls (group commit): 64 at once
/// take fewer than 64 `EVALSHA`s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_appends_started_together_share_script_calls() {
    let (_server, s, mut conn, seen) = burst_on_private_redis().await;
    let answers = wait_burst(start_burst(&s)).await;
    let calls = evalsha_calls(&mut conn).await;
    assert!(
        (1..32).contains(&calls),
        "{calls} script calls for 64 appends"
    );
    check_burst(s.as_ref(), &seen, answers).await;
}

/// The appends that wait while the channel's script call runs (here: while Redis is stopped)
/// all go in the next call, which treats each as an append of its own: a key used twice in
/// the call appends once, a conflict or a replay leaves the others alone. Another channel's
/// call does not hold them, and a large append does not wait for the channel's call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_appends_that_wait_together_go_in_one_call() {
    let (server, s, mut conn, seen) = burst_on_private_redis().await;
    server.pause();
    let append = |channel: &'static str, tag: &'static str, n: usize| {
        let s = s.clone();
        tokio::spawn(async move {
            s.append(channel, changes(tag, n), None, at("2024-01-01T00:00:00Z"))
                .await
        })
    };
    // Calls in flight (Redis holds them unread): one for channel d, then one for c …
    let other_channel = append("d", "x", 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = append("c", "first", 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // … the burst waits behind the latter; a large append goes at once.
    let started = start_burst(&s);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let large = append("c", "large", 150);
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.resume();
    other_channel.await.unwrap().unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!((first.first, first.last), (9, 10));
    let large = large.await.unwrap().unwrap();
    assert_eq!(
        (large.first, large.last),
        (11, 160),
        "sent before the burst"
    );
    let answers = wait_burst(started).await;
    assert_eq!(
        evalsha_calls(&mut conn).await,
        4,
        "one call for channel d, one for the first append to c, one for the large one, one for the burst"
    );
    let log = s.read("c", 10, 150).await.unwrap();
    assert!(log
        .iter()
        .enumerate()
        .all(|(i, c)| c.loc == format!("http://example.com/large/{i}")));
    let before: Vec<_> = seen.iter().copied().chain([first, large]).collect();
    check_burst(s.as_ref(), &before, answers).await;
}

/// An append dropped while its call runs (its caller went away) leaves no append behind: those
/// that waited for the call still go, in the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_appends_waiting_behind_a_dropped_append_still_go() {
    let server = redis_server::RedisServer::start(false);
    let s: Arc<dyn Store> = Arc::new(changehub::store::RedisStore::open(&server.url()).unwrap());
    s.append("c", changes("warm", 1), None, at("2024-01-01T00:00:00Z"))
        .await
        .unwrap();
    server.pause();
    let append = |tag: &'static str| {
        let s = s.clone();
        tokio::spawn(async move {
            s.append("c", changes(tag, 2), None, at("2024-01-01T00:00:00Z"))
                .await
        })
    };
    let dropped = append("dropped");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiting = append("waiting");
    tokio::time::sleep(Duration::from_millis(100)).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.resume();
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting append is answered")
        .unwrap()
        .unwrap();
    assert_eq!(got.last, s.head("c").await.unwrap().last);
    let log = s.read("c", 0, 100).await.unwrap();
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
    assert_eq!(
        log[got.first as usize - 1].loc,
        "http://example.com/waiting/0"
    );
}

/// On a cluster, a store listens for events on one seed node: when that node dies, the
/// listener reconnects to the next seed and goes on hearing the other instances, and heads
/// keep following appends made elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_listener_moves_to_the_next_seed() {
    let mut cluster = redis_server::RedisCluster::start();
    let a = changehub::store::RedisStore::open(&cluster.url()).unwrap();
    let b = changehub::store::RedisStore::open(&cluster.url()).unwrap();
    // A channel served by another node than the first seed, which dies below.
    let channel = (0..)
        .map(|n| format!("c{n}"))
        .find(|c| cluster.node_of(&format!("changehub:{{{c}}}:log")) != 0)
        .unwrap();
    let mut events = b.events().unwrap();
    hear(&a, &mut events, "before").await;
    cluster.kill_node(0);
    hear(&a, &mut events, "after").await;
    let mut head = b.watch_head(&channel);
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while a
        .append(&channel, changes("x", 2), None, OffsetDateTime::now_utc())
        .await
        .is_err()
    {
        assert!(tokio::time::Instant::now() < end, "append on a live node");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::timeout(Duration::from_secs(5), head.wait_for(|&h| h >= 2))
        .await
        .expect("head seen by the other instance")
        .unwrap();
}

/// A whole cluster restart (SIGKILL of every node, without persistence): calls fail meanwhile
/// (the hub answers 503), and once the cluster is back the same store works again — commands,
/// scripts, and the listener that hears other instances — without being reopened; a store
/// opened while the cluster was down connects too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_store_reconnects_after_a_cluster_restart() {
    let mut cluster = redis_server::RedisCluster::start();
    let a = changehub::store::RedisStore::open(&cluster.url()).unwrap();
    let b = changehub::store::RedisStore::open(&cluster.url()).unwrap();
    let mut events = b.events().unwrap();
    a.append("c", changes("x", 2), None, OffsetDateTime::now_utc())
        .await
        .unwrap();
    hear(&a, &mut events, "before").await;
    cluster.kill();
    assert!(a.ping().await.is_err(), "no cluster, no answer");
    // A store opened while the cluster is down connects once it is up.
    let late = changehub::store::RedisStore::open(&cluster.url()).unwrap();
    assert!(late.ping().await.is_err());
    cluster.restart();
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    while a
        .append("c", changes("y", 3), None, OffsetDateTime::now_utc())
        .await
        .is_err()
    {
        assert!(tokio::time::Instant::now() < end, "store never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(a.head("c").await.unwrap().last >= 3);
    hear(&a, &mut events, "after").await;
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    while late.head("c").await.is_err() {
        assert!(
            tokio::time::Instant::now() < end,
            "late store never connected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(late.head("c").await.unwrap(), a.head("c").await.unwrap());
    hear(&late, &mut events, "from-late").await;
}

/// The Redis log holds up to 32 changes per stream entry (a chunk): a request of 100 changes
/// takes four entries, older entries of one change each read as before, every range reads
/// exactly its seqs from wherever it starts in a chunk, and retention drops whole entries
/// while readers never see a change before the new oldest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_the_log_holds_chunks_of_changes() {
    let server = redis_server::RedisServer::start(false);
    let s = changehub::store::RedisStore::open(&server.url()).unwrap();
    let now = at("2024-01-01T00:00:00Z");
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // Three changes as older hubs wrote them: one entry each, field `e`.
    let old_key = format!(
        "{:023}",
        now.unix_timestamp_nanos() + 1_000_000_000_000_000_000_000
    );
    for seq in 1..=3 {
        let entry =
            format!(r#"{old_key}{{"loc":"http://example.com/old/{seq}","change":"created"}}"#);
        let _: String = ::redis::cmd("XADD")
            .arg("changehub:{c}:log")
            .arg(seq)
            .arg("e")
            .arg(entry)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let _: () = ::redis::cmd("HSET")
        .arg("changehub:{c}:meta")
        .arg("last")
        .arg(3)
        .arg("oldest")
        .arg(1)
        .arg("dt")
        .arg(&old_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let appended = s
        .append("c", changes("bulk", 100), None, now)
        .await
        .unwrap();
    assert_eq!((appended.first, appended.last), (4, 103));
    let ones = (0..5).map(|i| s.append("c", changes(&format!("one{i}"), 1), None, now));
    for appended in futures_util::future::join_all(ones).await {
        assert_eq!(appended.unwrap().accepted, 1);
    }
    let last = 108;
    /// The log's stream entries as Redis holds them: id, then field-value pairs.
    async fn log_entries(
        conn: &mut ::redis::aio::MultiplexedConnection,
    ) -> Vec<(String, Vec<(String, String)>)> {
        ::redis::cmd("XRANGE")
            .arg("changehub:{c}:log")
            .arg("-")
            .arg("+")
            .query_async(conn)
            .await
            .unwrap()
    }
    let entries = log_entries(&mut conn).await;
    let ids: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids[..7],
        ["1-0", "2-0", "3-0", "4-0", "36-0", "68-0", "100-0"]
    );
    assert!(entries[3..7]
        .iter()
        .all(|(_, f)| f.iter().all(|(n, _)| n == "c")));
    assert_eq!(entries[6].1.len(), 4);
    assert!(entries.len() <= 12, "{} entries", entries.len());

    let seqs = |changes: Vec<changehub::model::Change>| -> Vec<u64> {
        changes.iter().map(|c| c.seq).collect()
    };
    for after in 0..=last {
        for limit in [1, 2, 31, 33, 200] {
            let want: Vec<u64> = (after + 1..=last.min(after + limit as u64)).collect();
            let got = seqs(s.read("c", after, limit).await.unwrap());
            assert_eq!(got, want, "after {after}, limit {limit}");
        }
    }
    let all = s.read("c", 0, 1000).await.unwrap();
    assert_eq!(all[0].loc, "http://example.com/old/1");
    assert_eq!(all[3].loc, "http://example.com/bulk/0");
    assert_eq!(all[102].loc, "http://example.com/bulk/99");
    for n in [1, 5, 40, 500] {
        let want: Vec<u64> = (last.saturating_sub(n as u64) + 1..=last).collect();
        assert_eq!(
            seqs(s.read_newest("c", n).await.unwrap()),
            want,
            "newest {n}"
        );
    }

    // Keep the newest 50: seq 59 is inside the entry of seqs 36 to 67, which stays whole.
    let retention = Retention {
        max_changes: 50,
        max_age: None,
        list_size: 1,
    };
    assert_eq!(s.trim("c", retention, now).await.unwrap(), 58);
    assert_eq!(s.head("c").await.unwrap(), ChannelHead { oldest: 59, last });
    assert_eq!(log_entries(&mut conn).await[0].0, "36-0");
    let kept: Vec<u64> = (59..=last).collect();
    assert_eq!(seqs(s.read("c", 0, 1000).await.unwrap()), kept);
    assert_eq!(seqs(s.read("c", 40, 1000).await.unwrap()), kept);
    assert_eq!(seqs(s.read("c", 58, 3).await.unwrap()), [59, 60, 61]);
    assert_eq!(seqs(s.read_newest("c", 1000).await.unwrap()), kept);
}
