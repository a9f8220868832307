//! Several hub instances on one Redis — the topology of `docker-compose.yml` (Redis with AOF,
//! two `changehub serve --redis` processes, readiness by `changehub healthcheck`) as local
//! processes on loopback, with a private `redis-server` per test.

use crate::common::*;
use crate::redis_server::{RedisCluster, RedisServer};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changehub::cluster::LEASE_TTL;
use reqwest::StatusCode;

/// One `changehub serve --redis` process (with more flags in `extra`).
async fn instance(redis: &str, extra: &[&str]) -> HubProcess {
    HubProcess::start(&[&["--redis", redis], extra].concat()).await
}

/// Two instances on `redis`, once one of them owns the channel: (owner, other).
async fn owner_and_other(redis: &str) -> (HubProcess, HubProcess) {
    let a = instance(redis, &[]).await;
    let b = instance(redis, &[]).await;
    if wait_owner(redis, &[&a, &b]).await == 0 {
        (a, b)
    } else {
        (b, a)
    }
}

/// The holder of the channel's ownership lease: the pid part of its instance id.
async fn owner_pid(redis: &str) -> Option<u32> {
    let client = redis::Client::open(redis).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let holder: Option<String> = redis::cmd("GET")
        .arg(format!("changehub:{{{CHANNEL}}}:owner"))
        .query_async(&mut conn)
        .await
        .ok()?;
    holder?.split('-').next()?.parse().ok()
}

async fn wait_owner(redis: &str, instances: &[&HubProcess]) -> usize {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(pid) = owner_pid(redis).await {
            if let Some(i) = instances.iter().position(|i| i.pid() == pid) {
                return i;
            }
        }
        assert!(Instant::now() < end, "no channel owner");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Pushes `n` changes to `hub`; the answer's (first, last) on 202, None otherwise.
async fn push(client: &reqwest::Client, hub: &str, tag: &str, n: usize) -> Option<(u64, u64)> {
    push_to(client, hub, CHANNEL, tag, n).await
}

/// Pushes `n` changes to `channel` on `hub`; as [`push`].
async fn push_to(
    client: &reqwest::Client,
    hub: &str,
    channel: &str,
    tag: &str,
    n: usize,
) -> Option<(u64, u64)> {
    let changes: Vec<_> = (0..n)
        .map(|j| serde_json::json!({"loc": format!("http://example.com/{tag}/{j}"), "change": "updated"}))
        .collect();
    let resp = client
        .post(format!("{hub}/channels/{channel}/changes"))
        .bearer_auth(TOKEN)
        .json(&changes)
        .send()
        .await
        .ok()?;
    if resp.status() != 202 {
        return None;
    }
    let json: serde_json::Value = resp.json().await.ok()?;
    Some((json["first"].as_u64()?, json["last"].as_u64()?))
}

async fn all_seqs(url: &str) -> Vec<u64> {
    let client = reqwest::Client::new();
    let mut next = format!("{url}/channels/{CHANNEL}/changes?after=0&limit=5000");
    let mut seqs = Vec::new();
    loop {
        let body = client
            .get(&next)
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let (header, entries) =
            changehub::resourcesync::parse_change_list(&body, &big_limits()).unwrap();
        seqs.extend(entries.iter().map(|e| e.seq.unwrap()));
        match header.links.iter().find(|l| l.rel == "next") {
            Some(l) => next = l.href.clone(),
            None => return seqs,
        }
    }
}

/// User + system CPU time of a process so far, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses): state is field 3; utime and
    // stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / per_second
}

/// Every delivery starts at most one past the furthest seq delivered before it: nothing is
/// skipped, and order is kept (a redelivery after a takeover may repeat, never jump).
fn assert_no_gaps(receiver: &Receiver) {
    let mut furthest = 0;
    for d in receiver.delivered() {
        let seqs = d.seqs();
        let (first, last) = (seqs[0], *seqs.last().unwrap());
        assert!(
            first <= furthest + 1,
            "delivery {first}-{last} skips after {furthest}"
        );
        assert!(seqs.windows(2).all(|w| w[0] + 1 == w[1]));
        furthest = furthest.max(last);
    }
}

/// Must show 2: two instances, sources alternating between them, 10,000 changes: gapless seqs,
/// and the subscriber (subscribed through the instance that does not own the channel) gets
/// every change exactly once, in order. Both instances serve the same Change Lists, and the
/// non-owner's feed follows every notification (`published` in `/api/channels`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_log_and_deliver_once_in_order() {
    let redis = RedisServer::start(true);
    let (owner, other) = owner_and_other(&redis.url()).await;

    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe_at(&other.url, CHANNEL, &receiver.url).await;
    receiver.wait_verified(1).await;
    wait_until(
        "subscription visible on both instances",
        Duration::from_secs(10),
        || async {
            admin_json(&owner.url, "/api/subscriptions")
                .await
                .as_array()
                .is_some_and(|s| s.len() == 1)
                && admin_json(&other.url, "/api/subscriptions")
                    .await
                    .as_array()
                    .is_some_and(|s| s.len() == 1)
        },
    )
    .await;

    // 4 sources, 250 requests of 10 changes each in all, alternating between the instances.
    let urls = [owner.url.clone(), other.url.clone()];
    let mut sources = Vec::new();
    for s in 0..4 {
        let urls = urls.clone();
        sources.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut acked = Vec::new();
            for i in 0..250 {
                let hub = &urls[i % 2];
                let got = push(&client, hub, &format!("{s}/{i}"), 10).await;
                acked.push(got.expect("202 from a healthy instance"));
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for s in sources {
        acked.extend(s.await.unwrap());
    }
    acked.sort();
    let mut next = 1;
    for (first, last) in &acked {
        assert_eq!(*first, next, "acknowledged ranges are gapless and disjoint");
        assert_eq!(last - first + 1, 10);
        next = last + 1;
    }
    assert_eq!(next - 1, 10_000);

    receiver.wait_seq(10_000, Duration::from_secs(60)).await;
    let delivered = receiver.delivered_seqs();
    assert_eq!(
        delivered,
        (1..=10_000).collect::<Vec<u64>>(),
        "every change exactly once, in order"
    );
    assert_eq!(
        receiver.posts().len(),
        receiver.delivered().len(),
        "no failed attempts"
    );
    for hub in [&owner, &other] {
        assert_eq!(all_seqs(&hub.url).await, (1..=10_000).collect::<Vec<u64>>());
    }
    // The non-owner's feed follows the owner's notifications.
    wait_until(
        "non-owner feed caught up",
        Duration::from_secs(10),
        || async { admin_json(&other.url, "/api/channels").await[0]["published"] == 10_000 },
    )
    .await;
}

/// Must show 3: SIGKILL the owner during a push; the other instance takes over, every
/// acknowledged change reaches the subscriber (at least once, without gaps, in seq order).
/// Prints the takeover time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_owner_hands_the_channel_over() {
    let redis = RedisServer::start(true);
    let (mut owner, survivor) = owner_and_other(&redis.url()).await;

    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe_at(&survivor.url, CHANNEL, &receiver.url).await;
    receiver.wait_verified(1).await;
    wait_subscriptions(&survivor.url, 1).await;

    let acked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut sources = Vec::new();
    for s in 0..2 {
        let urls = [owner.url.clone(), survivor.url.clone()];
        let acked = acked.clone();
        let stop = stop.clone();
        sources.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                // Alternate; a dead instance refuses, and the source goes on with the other.
                if let Some(got) = push(&client, &urls[i % 2], &format!("{s}/{i}"), 5).await {
                    acked.lock().unwrap().push(got);
                }
                i += 1;
            }
        }));
    }
    wait_until("pushing under way", Duration::from_secs(30), || async {
        acked.lock().unwrap().len() >= 100
    })
    .await;
    receiver.wait_seq(50, Duration::from_secs(30)).await;
    owner.kill9();
    let killed = Instant::now();
    wait_until(
        "the survivor owns the channel",
        Duration::from_secs(30),
        || async { owner_pid(&redis.url()).await == Some(survivor.pid()) },
    )
    .await;
    let lease_taken = killed.elapsed();
    // Keep pushing a little after the takeover, then stop and collect.
    let before = acked.lock().unwrap().len();
    wait_until(
        "pushing after takeover",
        Duration::from_secs(30),
        || async { acked.lock().unwrap().len() >= before + 20 },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for s in sources {
        s.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let max_acked = acked.iter().map(|a| a.1).max().unwrap();
    receiver.wait_seq(max_acked, Duration::from_secs(60)).await;
    let delivering_again = killed.elapsed();
    eprintln!(
        "takeover: lease taken {:.2} s after SIGKILL of the owner; every acknowledged change delivered {:.2} s after it",
        lease_taken.as_secs_f64(),
        delivering_again.as_secs_f64()
    );
    assert!(
        lease_taken < Duration::from_secs(10),
        "takeover within a few seconds"
    );

    let mut got = receiver.delivered_seqs();
    got.sort();
    got.dedup();
    let seqs = all_seqs(&survivor.url).await;
    assert_eq!(
        seqs,
        (1..=*seqs.last().unwrap()).collect::<Vec<_>>(),
        "gapless"
    );
    for (first, last) in &acked {
        for seq in *first..=*last {
            assert!(
                got.binary_search(&seq).is_ok(),
                "acknowledged {seq} delivered"
            );
        }
    }
    assert_no_gaps(&receiver);
}

/// Must show 4: Redis (AOF, fsync always) is killed and restarted during a push. While it is
/// down the hub answers 503 to writes and `/readyz` fails; then it recovers by itself, and
/// nothing acknowledged is lost, from the log or from the subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_loses_nothing_acknowledged() {
    let mut redis = RedisServer::start(true);
    let (a, b) = owner_and_other(&redis.url()).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe_at(&a.url, CHANNEL, &receiver.url).await;
    receiver.wait_verified(1).await;
    wait_subscriptions(&a.url, 1).await;

    let acked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let refused = Arc::new(Mutex::new(0usize));
    let stop = Arc::new(AtomicBool::new(false));
    let mut sources = Vec::new();
    for s in 0..2 {
        let urls = [a.url.clone(), b.url.clone()];
        let acked = acked.clone();
        let refused = refused.clone();
        let stop = stop.clone();
        sources.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                match push(&client, &urls[i % 2], &format!("{s}/{i}"), 5).await {
                    Some(got) => acked.lock().unwrap().push(got),
                    None => {
                        *refused.lock().unwrap() += 1;
                        // A refused source backs off a little, as a real one would.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                i += 1;
            }
        }));
    }
    wait_until("pushing under way", Duration::from_secs(30), || async {
        acked.lock().unwrap().len() >= 100
    })
    .await;

    redis.kill();
    let client = reqwest::Client::new();
    for hub in [&a, &b] {
        wait_until("readyz fails", Duration::from_secs(15), || async {
            client
                .get(format!("{}/readyz", hub.url))
                .send()
                .await
                .is_ok_and(|r| r.status() == 503)
        })
        .await;
    }
    let resp = client
        .post(format!("{}/channels/{CHANNEL}/changes", a.url))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"loc": "http://example.com/down", "change": "updated"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503, "writes refused while Redis is down");
    let acked_before_restart = acked.lock().unwrap().clone();

    // No busy loop while Redis is down: over five seconds of outage (long enough for the
    // owner to fail its renewals and step down, so that recovery also means taking the channel
    // again), both processes together use a small fraction of one core — while the sources
    // keep knocking (each refusal answered).
    let cpu_before = cpu_seconds(a.pid()) + cpu_seconds(b.pid());
    let window = Instant::now();
    wait_until(
        "five seconds of outage",
        Duration::from_secs(10),
        || async { window.elapsed() >= LEASE_TTL },
    )
    .await;
    let cpu = cpu_seconds(a.pid()) + cpu_seconds(b.pid()) - cpu_before;
    let share = cpu / window.elapsed().as_secs_f64();
    eprintln!(
        "while Redis was down: {:.1}% of one core for both instances",
        100.0 * share
    );
    assert!(
        share < 0.25,
        "busy loop while Redis is down: {share:.2} of a core"
    );

    redis.restart();
    for hub in [&a, &b] {
        wait_until("readyz again", Duration::from_secs(30), || async {
            client
                .get(format!("{}/readyz", hub.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
    }
    let before = acked.lock().unwrap().len();
    wait_until("writes accepted again", Duration::from_secs(30), || async {
        acked.lock().unwrap().len() >= before + 50
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for s in sources {
        s.await.unwrap();
    }
    assert!(*refused.lock().unwrap() > 0, "the outage was seen");
    let acked = acked.lock().unwrap().clone();
    let seqs = all_seqs(&b.url).await;
    assert_eq!(
        seqs,
        (1..=*seqs.last().unwrap()).collect::<Vec<_>>(),
        "gapless"
    );
    let max_acked = acked.iter().map(|a| a.1).max().unwrap();
    assert!(*seqs.last().unwrap() >= max_acked);
    for (first, last) in &acked_before_restart {
        assert!(
            *last <= *seqs.last().unwrap(),
            "{first}-{last} survived the restart"
        );
    }

    receiver.wait_seq(max_acked, Duration::from_secs(60)).await;
    let mut got = receiver.delivered_seqs();
    got.sort();
    got.dedup();
    for (first, last) in &acked {
        for seq in *first..=*last {
            assert!(
                got.binary_search(&seq).is_ok(),
                "acknowledged {seq} delivered"
            );
        }
    }
    assert_no_gaps(&receiver);
}

/// One hub instance's insides, on a shared store, without HTTP: what every instance's
/// `ChannelFeed::live()` (the source of websocket and SSE notifications) hears.
struct Insides {
    store: Arc<dyn changehub::store::Store>,
    feed: Arc<changehub::batcher::ChannelFeed>,
    cluster: Arc<changehub::cluster::Cluster>,
    stop: tokio_util::sync::CancellationToken,
}

impl Insides {
    async fn start(redis: &str) -> Insides {
        let store: Arc<dyn changehub::store::Store> =
            Arc::new(changehub::store::RedisStore::open(redis).unwrap());
        let mut config = changehub::config::Config::new(
            "127.0.0.1:9".parse().unwrap(),
            std::path::PathBuf::from("unused"),
        )
        .with_channel(CHANNEL, TOKEN);
        config.linger = Duration::from_millis(20);
        config.max_batch = 7;
        let hub = changehub::Hub::start(Arc::new(config), store.clone())
            .await
            .unwrap();
        Insides {
            store,
            feed: hub.feeds.feed(CHANNEL).unwrap(),
            cluster: hub.cluster.clone().expect("a shared store has a cluster"),
            stop: hub.work.batcher_stop.clone(),
        }
    }
}

/// Collects live notifications of `feed` until one reaches `last`; checks they follow each
/// other without a gap or an overlap, each at most `max_batch` changes.
async fn live_until(
    feed: &changehub::batcher::ChannelFeed,
    rx: &mut tokio::sync::broadcast::Receiver<changehub::batcher::Span>,
    mut previous: u64,
    last: u64,
) -> u64 {
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while previous < last {
        let span = tokio::time::timeout_at(end, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("live notifications stopped at {previous} of {last}"))
            .expect("no live notification missed");
        let n = feed.cached(span.first).expect("a recent notification");
        assert_eq!((n.first, n.last), (span.first, span.last));
        assert_eq!(n.first, previous + 1, "contiguous live notifications");
        assert!(n.last - n.first < 7);
        assert_eq!(
            n.changes.iter().map(|c| c.seq).collect::<Vec<_>>(),
            (n.first..=n.last).collect::<Vec<_>>()
        );
        previous = n.last;
    }
    previous
}

/// Every instance's feed publishes every notification of the channel, whoever owns it and
/// whichever instance ingested; when the owner goes, the other cuts from where its feed was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_feed_hears_every_notification() {
    let redis = RedisServer::start(false);
    let a = Insides::start(&redis.url()).await;
    let b = Insides::start(&redis.url()).await;
    let mut live_a = a.feed.live();
    let mut live_b = b.feed.live();
    let now = time::OffsetDateTime::now_utc;
    let batch = |tag: usize| -> Vec<changehub::model::NewChange> {
        (0..10)
            .map(|j| {
                changehub::model::NewChange::new(
                    format!("http://example.com/{tag}/{j}"),
                    changehub::model::ChangeType::Updated,
                )
            })
            .collect()
    };
    for i in 0..30 {
        let via = if i % 2 == 0 { &a.store } else { &b.store };
        via.append(CHANNEL, batch(i), None, now()).await.unwrap();
    }
    assert_eq!(live_until(&a.feed, &mut live_a, 0, 300).await, 300);
    assert_eq!(live_until(&b.feed, &mut live_b, 0, 300).await, 300);

    // The owner stops (and lets go); the other takes over and goes on without a gap.
    let owner = wait_until_owner(&redis.url(), &[&a, &b]).await;
    let (gone, stays, mut live) = if owner == 0 {
        (a, b, live_b)
    } else {
        (b, a, live_a)
    };
    gone.stop.cancel();
    gone.cluster.release_all().await;
    for i in 30..40 {
        stays
            .store
            .append(CHANNEL, batch(i), None, now())
            .await
            .unwrap();
    }
    assert_eq!(live_until(&stays.feed, &mut live, 300, 400).await, 400);
}

async fn wait_until_owner(redis: &str, insides: &[&Insides]) -> usize {
    let client = redis::Client::open(redis).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let holder: Option<String> = redis::cmd("GET")
            .arg(format!("changehub:{{{CHANNEL}}}:owner"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if let Some(i) = insides
            .iter()
            .position(|i| Some(&i.cluster.instance) == holder.as_ref())
        {
            return i;
        }
        assert!(Instant::now() < end, "no owner");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A clean stop (SIGTERM) of the owner gives its lease up: the other instance takes the
/// channel at once, not after the lease would have expired, and delivery goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_hands_the_channel_over_at_once() {
    let redis = RedisServer::start(false);
    let (mut owner, survivor) = owner_and_other(&redis.url()).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe_at(&survivor.url, CHANNEL, &receiver.url).await;
    receiver.wait_verified(1).await;
    wait_subscriptions(&survivor.url, 1).await;
    let client = reqwest::Client::new();
    let (_, last) = push(&client, &owner.url, "before", 10).await.unwrap();
    receiver.wait_seq(last, Duration::from_secs(20)).await;

    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(owner.pid() as i32, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || {
        let status = owner.child.wait().unwrap();
        (owner, status)
    });
    let (owner, status) = tokio::time::timeout(Duration::from_secs(30), status)
        .await
        .expect("the owner stops")
        .unwrap();
    assert!(status.success(), "clean exit: {status}");
    let stopped = Instant::now();
    wait_until(
        "the survivor owns the channel",
        Duration::from_secs(10),
        || async { owner_pid(&redis.url()).await == Some(survivor.pid()) },
    )
    .await;
    let handover = stopped.elapsed();
    eprintln!(
        "clean handover: {:.2} s after the owner exited",
        handover.as_secs_f64()
    );
    assert!(
        handover < LEASE_TTL - Duration::from_secs(2),
        "released, not expired: {handover:?}"
    );
    drop(owner);
    let (_, last) = push(&client, &survivor.url, "after", 10).await.unwrap();
    receiver.wait_seq(last, Duration::from_secs(20)).await;
    let mut got = receiver.delivered_seqs();
    got.dedup();
    assert_eq!(got, (1..=last).collect::<Vec<_>>());
}

/// A subscription removed through the instance that does not deliver it stops at the owner:
/// subscription changes travel between instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_subscription_on_one_instance_stops_delivery_on_the_owner() {
    let redis = RedisServer::start(false);
    let (owner, other) = owner_and_other(&redis.url()).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe_at(&owner.url, CHANNEL, &receiver.url).await;
    receiver.wait_verified(1).await;
    let id: Arc<Mutex<String>> = Arc::default();
    wait_until("subscription listed", Duration::from_secs(10), || async {
        match admin_json(&other.url, "/api/subscriptions").await[0]["id"].as_str() {
            Some(found) => {
                *id.lock().unwrap() = found.to_string();
                true
            }
            None => false,
        }
    })
    .await;
    let id = id.lock().unwrap().clone();
    let client = reqwest::Client::new();
    let (_, last) = push(&client, &other.url, "before", 3).await.unwrap();
    receiver.wait_seq(last, Duration::from_secs(20)).await;

    let resp = client
        .delete(format!("{}/api/subscriptions/{id}", other.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    // Then a marker subscriber, subscribed after the removal, proves that later pushes were
    // delivered by the owner: once it has them, the removed one must not.
    let marker = Receiver::start(Behaviour::default()).await;
    subscribe_at(&other.url, CHANNEL, &marker.url).await;
    marker.wait_verified(1).await;
    wait_until("marker active", Duration::from_secs(10), || async {
        admin_json(&owner.url, "/api/subscriptions")
            .await
            .as_array()
            .is_some_and(|s| s.len() == 1)
    })
    .await;
    // Two rounds: a worker still running for the removed subscription would have been sent
    // the first round's notification by the time the marker has the second.
    let (_, after) = push(&client, &owner.url, "after", 3).await.unwrap();
    marker.wait_seq(after, Duration::from_secs(20)).await;
    let (_, after) = push(&client, &other.url, "after2", 3).await.unwrap();
    marker.wait_seq(after, Duration::from_secs(20)).await;
    assert!(
        receiver.delivered_seqs().iter().all(|&s| s <= last),
        "nothing delivered after the removal"
    );
}

/// A round-robin TCP proxy on loopback, like the compose file's nginx: each new connection
/// goes to the next upstream. Returns how many connections each upstream got.
fn round_robin_proxy(
    listener: tokio::net::TcpListener,
    upstreams: Vec<String>,
) -> Arc<Mutex<Vec<usize>>> {
    let counts = Arc::new(Mutex::new(vec![0; upstreams.len()]));
    let seen = counts.clone();
    tokio::spawn(async move {
        let mut next = 0;
        while let Ok((mut inbound, _)) = listener.accept().await {
            let i = next % upstreams.len();
            next += 1;
            seen.lock().unwrap()[i] += 1;
            let upstream = upstreams[i].clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    counts
}

/// The compose topology end to end: Redis with AOF, two instances, one port in front (a
/// round-robin proxy standing in for nginx), readiness by `changehub healthcheck` through
/// that port. A source and a subscriber that only know the one address get every change once,
/// in order, while both instances take part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_topology_works_through_one_port() {
    let redis = RedisServer::start(true);
    // The one port first: both instances announce it as their public URL, as in the compose
    // file, so topics are the same whichever instance answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hub = format!("http://{}", listener.local_addr().unwrap());
    let a = instance(&redis.url(), &["--public-url", &hub]).await;
    let b = instance(&redis.url(), &["--public-url", &hub]).await;
    let upstreams = [&a, &b]
        .iter()
        .map(|i| i.url.trim_start_matches("http://").to_string())
        .collect();
    let counts = round_robin_proxy(listener, upstreams);
    let ok = tokio::task::spawn_blocking({
        let hub = hub.clone();
        move || {
            Command::new(env!("CARGO_BIN_EXE_changehub"))
                .args(["healthcheck", &hub])
                .status()
                .is_ok_and(|s| s.success())
        }
    })
    .await
    .unwrap();
    assert!(ok, "healthcheck through the one port");

    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe_at(&hub, CHANNEL, &receiver.url).await;
    receiver.wait_verified(1).await;
    wait_until("subscription active", Duration::from_secs(10), || async {
        admin_json(&b.url, "/api/subscriptions")
            .await
            .as_array()
            .is_some_and(|s| s.len() == 1)
    })
    .await;

    // No connection reuse: every request is a new connection, so the proxy alternates.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut last = 0;
    for i in 0..20 {
        let (first, l) = push(&client, &hub, &format!("p/{i}"), 10)
            .await
            .expect("202 through the proxy");
        assert_eq!(first, last + 1);
        last = l;
    }
    receiver.wait_seq(last, Duration::from_secs(30)).await;
    assert_eq!(receiver.delivered_seqs(), (1..=last).collect::<Vec<_>>());
    let delivery = &receiver.delivered()[0];
    assert_eq!(
        delivery.header("link"),
        Some(
            format!(
                "<{hub}/hub>; rel=\"hub\", <{hub}/channels/{CHANNEL}/changelist.xml>; rel=\"self\""
            )
            .as_str()
        ),
        "links name the one public address"
    );
    let counts = counts.lock().unwrap().clone();
    assert!(
        counts.iter().all(|&c| c >= 10),
        "both instances served: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_on_one_instance_sees_changes_ingested_through_the_other() {
    let redis = RedisServer::start(false);
    let (a, b) = owner_and_other(&redis.url()).await;
    // A replays from the start; B follows live.
    let mut on_a = WsClient::connect_to(&a.url, "").await;
    on_a.subscribe(CHANNEL, Some(0)).await;
    assert_eq!(on_a.frame().await["type"], "subscribed");
    let mut on_b = WsClient::connect_to(&b.url, "").await;
    on_b.subscribe(CHANNEL, None).await;
    assert_eq!(on_b.frame().await["type"], "subscribed");

    let client = reqwest::Client::new();
    let mut last = 0;
    for i in 0..30 {
        let (first, l) = push(&client, &b.url, &format!("via-b-{i}"), 10)
            .await
            .expect("push through B");
        assert_eq!(first, last + 1);
        last = l;
    }
    let (seqs, _) = on_a.collect_until(last).await;
    assert_eq!(
        seqs,
        (1..=last).collect::<Vec<_>>(),
        "A saw every change B took"
    );
    let (seqs, _) = on_b.collect_until(last).await;
    assert_eq!(
        seqs,
        (1..=last).collect::<Vec<_>>(),
        "B's own live follower too"
    );
    // And the other way round, live on A.
    let (first, l) = push(&client, &b.url, "late", 5).await.unwrap();
    let (seqs, _) = on_a.collect_until(l).await;
    assert_eq!(seqs, (first..=l).collect::<Vec<_>>());
}

/// Issue 3 on a Redis Cluster: two instances on a three-primary cluster, one channel whose keys
/// live on each node, pushes alternating between the instances: every channel's acknowledged
/// seqs are gapless, and its subscriber (subscribed through alternating instances) gets every
/// change once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_a_redis_cluster_act_as_one_hub() {
    let cluster = RedisCluster::start();
    // `news` and two more channels, so that each node holds one channel's keys.
    let mut channels = vec![CHANNEL.to_string()];
    let mut nodes = vec![cluster.node_of(&format!("changehub:{{{CHANNEL}}}:log"))];
    for n in 0.. {
        let name = format!("c{n}");
        let node = cluster.node_of(&format!("changehub:{{{name}}}:log"));
        if !nodes.contains(&node) {
            channels.push(name);
            nodes.push(node);
        }
        if nodes.len() == cluster.ports().len() {
            break;
        }
    }
    let extra: Vec<String> = channels[1..]
        .iter()
        .flat_map(|c| ["--channel".to_string(), format!("{c}={TOKEN}")])
        .collect();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let a = instance(&cluster.url(), &extra).await;
    let b = instance(&cluster.url(), &extra).await;
    let urls = [a.url.clone(), b.url.clone()];

    let mut receivers = Vec::new();
    for (i, channel) in channels.iter().enumerate() {
        let receiver = Receiver::start(Behaviour::default()).await;
        subscribe_at(&urls[i % 2], channel, &receiver.url).await;
        receiver.wait_verified(1).await;
        receivers.push(receiver);
    }
    wait_until(
        "subscriptions visible on both instances",
        Duration::from_secs(10),
        || async {
            let mut ok = true;
            for url in &urls {
                ok &= admin_json(url, "/api/subscriptions")
                    .await
                    .as_array()
                    .is_some_and(|s| s.len() == channels.len());
            }
            ok
        },
    )
    .await;

    // Per channel, 2 sources of 30 requests of 5 changes, alternating between the instances.
    const REQUESTS: usize = 30;
    const PER_REQUEST: usize = 5;
    let total = (2 * REQUESTS * PER_REQUEST) as u64;
    let mut sources = Vec::new();
    for channel in &channels {
        for s in 0..2 {
            let (urls, channel) = (urls.clone(), channel.clone());
            sources.push(tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut acked = Vec::new();
                for i in 0..REQUESTS {
                    let got = push_to(
                        &client,
                        &urls[(i + s) % 2],
                        &channel,
                        &format!("{s}/{i}"),
                        PER_REQUEST,
                    )
                    .await;
                    acked.push(got.expect("202 from a healthy instance"));
                }
                (channel, acked)
            }));
        }
    }
    let mut acked: std::collections::HashMap<String, Vec<(u64, u64)>> = Default::default();
    for s in sources {
        let (channel, got) = s.await.unwrap();
        acked.entry(channel).or_default().extend(got);
    }
    for channel in &channels {
        let ranges = acked.get_mut(channel).unwrap();
        ranges.sort();
        let mut next = 1;
        for (first, last) in ranges.iter() {
            assert_eq!(
                *first, next,
                "{channel}: acknowledged ranges gapless and disjoint"
            );
            assert_eq!(last - first + 1, PER_REQUEST as u64);
            next = last + 1;
        }
        assert_eq!(next - 1, total, "{channel}");
    }

    for (channel, receiver) in channels.iter().zip(&receivers) {
        receiver.wait_seq(total, Duration::from_secs(30)).await;
        assert_no_gaps(receiver);
        assert_eq!(
            receiver.delivered_seqs(),
            (1..=total).collect::<Vec<u64>>(),
            "{channel}: every change exactly once, in order"
        );
    }
    // The channels' keys really are spread over the nodes.
    for (channel, node) in channels.iter().zip(&nodes) {
        let mut conn = cluster.node(*node);
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("changehub:{{{channel}}}:log"))
            .query(&mut conn)
            .unwrap();
        assert!(exists, "{channel}'s log on node {node}");
    }
    let mut used: Vec<usize> = nodes.clone();
    used.sort();
    used.dedup();
    assert_eq!(used.len(), 3, "one channel per node");
}

/// `PUT /api/channels/{name}` with `body` at `hub`; returns the status.
async fn put_channel(hub: &str, name: &str, body: serde_json::Value) -> reqwest::StatusCode {
    reqwest::Client::new()
        .put(format!("{hub}/api/channels/{name}"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
}

/// Pushes one change to channel `name` at `hub` with `token`; returns the status.
async fn ingest(hub: &str, name: &str, token: &str, loc: &str) -> reqwest::StatusCode {
    reqwest::Client::new()
        .post(format!("{hub}/channels/{name}/changes"))
        .bearer_auth(token)
        .json(&serde_json::json!({"loc": format!("http://example.com/{loc}"), "change": "updated"}))
        .send()
        .await
        .unwrap()
        .status()
}

/// A channel created through the admin API of one instance is ingested into through the
/// other; it survives a restart of both; a rotated-out token is refused everywhere; a
/// removed channel is gone everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_created_at_runtime_is_everyones() {
    let redis = RedisServer::start(true);
    let (a, b) = (
        instance(&redis.url(), &[]).await,
        instance(&redis.url(), &[]).await,
    );
    let old = serde_json::json!({"publishers": {"alice": "alice-token"}, "archive_every": 100});
    assert_eq!(
        put_channel(&a.url, "x", old.clone()).await,
        StatusCode::CREATED
    );
    wait_until(
        "the other instance has x",
        Duration::from_secs(15),
        || async { ingest(&b.url, "x", "alice-token", "one").await == StatusCode::ACCEPTED },
    )
    .await;
    assert_eq!(all_seqs_of(&a.url, "x").await, [1]);

    drop((a, b));
    let (a, b) = (
        instance(&redis.url(), &[]).await,
        instance(&redis.url(), &[]).await,
    );
    assert_eq!(
        ingest(&b.url, "x", "alice-token", "two").await,
        StatusCode::ACCEPTED
    );
    assert_eq!(all_seqs_of(&a.url, "x").await, [1, 2]);

    // Rotation: bob's token in, alice's out.
    let both = serde_json::json!({"publishers": {"alice": "alice-token", "bob": "bob-token"}});
    assert_eq!(put_channel(&a.url, "x", both).await, StatusCode::OK);
    let new = serde_json::json!({"publishers": {"bob": "bob-token"}});
    assert_eq!(put_channel(&a.url, "x", new).await, StatusCode::OK);
    wait_until(
        "the rotated-out token is refused",
        Duration::from_secs(15),
        || async { ingest(&b.url, "x", "alice-token", "three").await == StatusCode::FORBIDDEN },
    )
    .await;
    assert_eq!(
        ingest(&a.url, "x", "alice-token", "three").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        ingest(&b.url, "x", "bob-token", "three").await,
        StatusCode::ACCEPTED
    );

    let deleted = reqwest::Client::new()
        .delete(format!("{}/api/channels/x", a.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    wait_until("x is gone everywhere", Duration::from_secs(15), || async {
        ingest(&b.url, "x", "bob-token", "four").await == StatusCode::NOT_FOUND
    })
    .await;
}

/// Every seq of channel `name` at `hub`.
async fn all_seqs_of(hub: &str, name: &str) -> Vec<u64> {
    let body = reqwest::get(format!("{hub}/channels/{name}/changes?after=0&limit=1000"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.split(" ch:seq=\"")
        .skip(1)
        .map(|p| p.split('"').next().unwrap().parse().unwrap())
        .collect()
}

/// A write Redis never confirms (Redis hung) is a 504 that says it may have happened, not a
/// 503; retrying it with the same Idempotency-Key makes it count exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_write_is_a_504_and_its_retry_counts_once() {
    let redis = RedisServer::start(false);
    let url = redis.url();
    let hub = TestHub::start(move |c| {
        c.store = changehub::config::StoreConfig::Redis { url };
    })
    .await;
    hub.push("before", 1).await;
    let push = || {
        hub.client
            .post(format!("{}/channels/{CHANNEL}/changes", hub.url))
            .bearer_auth(TOKEN)
            .header("idempotency-key", "the-one")
            .json(&serde_json::json!({"loc": "http://example.com/x", "change": "created"}))
            .send()
    };
    redis.pause();
    let resp = tokio::time::timeout(Duration::from_secs(20), push())
        .await
        .expect("an answer while Redis hangs")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("may have happened") && text.contains("Idempotency-Key"),
        "{text}"
    );
    redis.resume();
    let retried = push().await.unwrap();
    assert_eq!(retried.status(), StatusCode::ACCEPTED);
    let answer: serde_json::Value = retried.json().await.unwrap();
    assert_eq!(
        (answer["first"].as_u64(), answer["last"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(all_seqs_of(&hub.url, CHANNEL).await, [1, 2], "exactly once");
}
