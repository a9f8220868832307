//! Throughput benchmark: ingest events/s and callback deliveries/s, each against a baseline
//! measured in the same run on the same machine, so that the ratio means something on a
//! shared, noisy machine.
//!
//! - Ingest: sources POST JSON batches of changes to the hub (embedded store, fsync on every
//!   commit). Baseline: the same requests from the same clients to a minimal HTTP server that
//!   reads the body and answers 202 — the cost of HTTP alone.
//! - Fan-out: 1,000 WebSub subscribers, each with its own secret, on one minimal receiver;
//!   the hub delivers every notification to all of them. Baseline: a minimal client POSTing the
//!   same body to the same receiver with the same concurrency (one sequential sender per
//!   subscriber).
//!
//! - Change List: time to serve the open `changelist.xml` at its largest (50,000 entries).
//!   Baseline: the same bytes served as a static body by a minimal server.
//!
//! Run: `cargo bench --bench throughput` (set `BENCH_SCALE=0.2` for a quicker, rougher run).
//! All traffic stays on 127.0.0.1; every loop is bounded in count.

use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use changehub::config::Config;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

const TOKEN: &str = "bench-token";

#[path = "support/mod.rs"]
mod support;
use support::scale;

/// A minimal receiver: echoes WebSub challenges, counts POSTs.
#[derive(Clone, Default)]
struct Counter {
    posts: Arc<AtomicU64>,
    notify: Arc<Notify>,
}

async fn echo(Query(q): Query<HashMap<String, String>>) -> String {
    q.get("hub.challenge").cloned().unwrap_or_default()
}

async fn count(State(c): State<Counter>, body: Bytes) -> axum::http::StatusCode {
    drop(body);
    c.posts.fetch_add(1, Ordering::Relaxed);
    c.notify.notify_waiters();
    axum::http::StatusCode::ACCEPTED
}

async fn start_receiver() -> (String, Counter) {
    let counter = Counter::default();
    let app = Router::new()
        .route("/cb", get(echo).post(count))
        .route("/changes", post(count))
        .with_state(counter.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), counter)
}

async fn wait_count(counter: &Counter, target: u64, deadline: Duration) -> bool {
    let end = tokio::time::Instant::now() + deadline;
    loop {
        let notified = counter.notify.notified();
        if counter.posts.load(Ordering::Relaxed) >= target {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
    }
}

async fn start_hub(tweak: impl FnOnce(&mut Config)) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = Config::new(addr, dir.path().to_path_buf()).with_channel("bench", TOKEN);
    config.allow_private_callbacks = true;
    config.admin_token = Some("admin".into());
    tweak(&mut config);
    tokio::spawn(async move {
        changehub::run(listener, config, std::future::pending())
            .await
            .unwrap()
    });
    (format!("http://{addr}"), dir)
}

fn batch_body(source: usize, request: usize, size: usize) -> String {
    let changes: Vec<_> = (0..size)
        .map(|i| {
            serde_json::json!({
                "loc": format!("http://example.com/resource/{source}/{request}/{i}"),
                "change": "updated",
                "hash": "md5:1e0d5cb8ef6ba40c99b14c0237be735e",
            })
        })
        .collect();
    serde_json::to_string(&changes).unwrap()
}

/// `sources` concurrent clients, each sending `requests` POSTs of `size` changes to `url`.
/// Returns changes per second.
async fn push_load(url: &str, auth: bool, sources: usize, requests: usize, size: usize) -> f64 {
    let bodies: Arc<Vec<Vec<String>>> = Arc::new(
        (0..sources)
            .map(|s| (0..requests).map(|r| batch_body(s, r, size)).collect())
            .collect(),
    );
    let client = reqwest::Client::new();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..sources {
        let client = client.clone();
        let url = url.to_string();
        let bodies = bodies.clone();
        tasks.push(tokio::spawn(async move {
            for body in &bodies[s] {
                let mut req = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone());
                if auth {
                    req = req.bearer_auth(TOKEN);
                }
                let resp = req.send().await.unwrap();
                assert_eq!(resp.status(), 202);
                resp.bytes().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (sources * requests * size) as f64 / start.elapsed().as_secs_f64()
}

async fn bench_ingest() {
    let sources = 8;
    let requests = scale(250);
    let size = 100;
    let (receiver, _) = start_receiver().await;
    let (hub, _dir) = start_hub(|_| {}).await;
    // Warm up both.
    push_load(&format!("{receiver}/changes"), false, sources, 5, size).await;
    push_load(
        &format!("{hub}/channels/bench/changes"),
        true,
        sources,
        5,
        size,
    )
    .await;

    let baseline = push_load(
        &format!("{receiver}/changes"),
        false,
        sources,
        requests,
        size,
    )
    .await;
    let hub_rate = push_load(
        &format!("{hub}/channels/bench/changes"),
        true,
        sources,
        requests,
        size,
    )
    .await;
    println!(
        "ingest: {sources} sources x {requests} requests x {size} changes\n  \
         hub (embedded store, durable): {hub_rate:>10.0} changes/s\n  \
         baseline (minimal HTTP server): {baseline:>10.0} changes/s\n  \
         ratio: {:.2}",
        hub_rate / baseline
    );
}

async fn bench_fanout() {
    let subscribers = scale(1000);
    let notifications = 20;
    let changes_per = 10;
    let (receiver, counter) = start_receiver().await;
    let (hub, _dir) = start_hub(|c| {
        c.max_batch = changes_per;
        c.linger = Duration::from_millis(5);
    })
    .await;
    let client = reqwest::Client::new();
    let topic = format!("{hub}/channels/bench/changelist.xml");
    for i in 0..subscribers {
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("hub.mode", "subscribe")
            .append_pair("hub.topic", &topic)
            .append_pair("hub.callback", &format!("{receiver}/cb?subscriber={i}"))
            .append_pair("hub.secret", &format!("secret-of-subscriber-{i}"))
            .finish();
        let resp = client
            .post(format!("{hub}/hub"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
    }
    // Wait until every subscription is verified and active.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let subs: Vec<serde_json::Value> = client
            .get(format!("{hub}/api/subscriptions"))
            .bearer_auth("admin")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if subs.len() == subscribers {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "subscriptions not verified in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Hub: push the notifications; count deliveries at the receiver.
    let start = Instant::now();
    for n in 0..notifications {
        let resp = client
            .post(format!("{hub}/channels/bench/changes"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(batch_body(0, n, changes_per))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
    }
    let target = (subscribers * notifications) as u64;
    assert!(
        wait_count(&counter, target, Duration::from_secs(300)).await,
        "deliveries did not complete"
    );
    let hub_rate = target as f64 / start.elapsed().as_secs_f64();

    // Baseline: the same body, POSTed by a minimal client with the same concurrency.
    let body = client
        .get(format!(
            "{hub}/channels/bench/changes?after=0&limit={changes_per}"
        ))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    counter.posts.store(0, Ordering::Relaxed);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..subscribers {
        let client = client.clone();
        let url = format!("{receiver}/cb?subscriber={i}");
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..notifications {
                let resp = client
                    .post(&url)
                    .header("content-type", "application/xml")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                assert!(resp.status().is_success());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let baseline = target as f64 / start.elapsed().as_secs_f64();
    println!(
        "fan-out: {subscribers} subscribers (own secret each) x {notifications} notifications of {changes_per} changes ({} bytes)\n  \
         hub deliveries:            {hub_rate:>10.0} deliveries/s\n  \
         baseline (minimal client): {baseline:>10.0} posts/s\n  \
         ratio: {:.2}",
        body.len(),
        hub_rate / baseline
    );
}

/// Serving the open Change List at its largest (50,000 entries), against serving a static body
/// of the same size from the minimal server.
async fn bench_changelist() {
    let (hub, _dir) = start_hub(|_| {}).await;
    push_load(&format!("{hub}/channels/bench/changes"), true, 5, 100, 100).await;
    let client = reqwest::Client::new();
    let url = format!("{hub}/channels/bench/changelist.xml");
    let body = client
        .get(&url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let entries = body.windows(5).filter(|w| w == b"<url>").count();

    let static_body = body.clone();
    let app = Router::new().route(
        "/static.xml",
        get(move || async move { static_body.clone() }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let median = |url: String| {
        let client = client.clone();
        async move {
            let mut times = Vec::new();
            for _ in 0..scale(15).max(3) {
                let start = Instant::now();
                let b = client
                    .get(&url)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
                times.push(start.elapsed());
                assert!(!b.is_empty());
            }
            times.sort();
            times[times.len() / 2]
        }
    };
    let hub_time = median(url).await;
    let static_time = median(format!("http://{addr}/static.xml")).await;
    println!(
        "changelist.xml: {entries} entries, {} bytes\n  \
         hub:                       {:>8.1} ms (median)\n  \
         baseline (static bytes):   {:>8.1} ms (median)\n  \
         ratio: {:.2}",
        body.len(),
        hub_time.as_secs_f64() * 1e3,
        static_time.as_secs_f64() * 1e3,
        hub_time.as_secs_f64() / static_time.as_secs_f64()
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        bench_ingest().await;
        bench_fanout().await;
        bench_changelist().await;
    });
}
