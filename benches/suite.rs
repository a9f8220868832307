//! The benchmark suite of issue 13 ("Delivery at the speed of the wire"): every figure of the
//! issue, each against a baseline measured in the same run on the same machine, printed as a
//! table while it runs and written to `BENCHMARKS.md` at the end.
//!
//! Run: `bash scripts/bench.sh` (installs nginx, wrk and redis when missing, raises the
//! open-file limit, then `cargo bench --bench suite`). Environment:
//! - `BENCH_SCALE` (default 1): counts and durations times this (`0.1` for a quick check).
//! - `BENCH_RETAINED`: the largest retained level of the documents figure (default 10⁶ times
//!   `BENCH_SCALE`); `10000000` adds 10⁷ (and every power of ten between) to the cost-growth
//!   table. At 10⁷: about ten minutes more per hub binary, 13 GB of disk while the embedded
//!   store is filled (the store and the block files), Redis's memory past 9 GB.
//! - `BENCH_HUB_BIN`: the hub binary under test (default: this package's release binary).
//! - `BENCH_BEFORE_BIN`: an older `changehub` binary; every hub figure is measured for it too,
//!   in the same run, and the table gets before columns.
//! - `BENCH_BEFORE_LABEL`, `BENCH_HUB_LABEL`: how the report names the before binary and the
//!   hub binary (default: the path, relative when inside the repository).
//! - `BENCH_REPORT`: where to write the report (default `BENCHMARKS.md` at the repo root).
//! - `BENCH_ONLY`: some of `fanout,callback,ingest,documents,websockets,steady` (default: all
//!   but `steady`, which runs only when named: it takes 10 minutes, 20 with a before binary).
//! - `BENCH_VERBOSE`: print every wrk output.
//! - `BENCH_SUBSCRIBERS`: the fan-out figure at these counts only (e.g. `100,1000`; for
//!   profiling one of them).
//! - `BENCH_STEADY_CACHE`: the steady run's `--cache-size` in MiB (default 64); its goal for
//!   the peak moves with it (`--cache-size` + 32 MiB).
//!
//! The hub runs as its own process (`changehub serve`, embedded store in a temporary folder,
//! or `--redis` on a private redis-server), as it does in production; so do the baselines:
//! nginx (started from a config written to a temporary folder), wrk and redis-benchmark. All
//! load stays on 127.0.0.1; every loop is bounded in count and time.
//!
//! Figures:
//! 1. **Fan-out** at 1, 100, 1,000 and 5,000 subscribers (own secret each, callbacks on nginx
//!    answering 202): 10-change requests (`--max-batch 10`: one notification each) until every
//!    delivery is counted in `/metrics`; deliveries/s and hub CPU per delivery. Baseline: wrk
//!    with as many connections POSTing the same body with the same headers to the same nginx.
//! 2. **Publish 202 latency while 1,000 subscribers are served**: single-change POSTs on another
//!    channel every 5 ms while a steady stream is fanned out; baseline: the same probe with no
//!    delivery running.
//! 3. **202 → callback p99** at linger 0 and 100 ms, on a receiver inside the bench.
//! 4. **Ingest**: 1,000-change requests (wrk -c8) against `redis-benchmark -P 100 XADD` on the
//!    same private redis; 1-change requests (wrk -c64) against nginx answering 202. Each rate
//!    on a fresh hub, after 1 s of the same load that is not counted; each baseline before and
//!    after the hubs, the higher one kept. Three floors beside 1-change ingest: a bare axum
//!    server answering 202 at once, one answering after a group-committed `fdatasync`, and
//!    one answering after one `XADD` per group to the private redis; the hub's 1-change
//!    rates are also given against the floor of their own store.
//! 5. **Catch-up documents** at 10⁵ retained on both stores: the topic (also gzip), a closed
//!    list and `changes?after=` pages of 1,000 (random `after`), each against nginx serving the
//!    same bytes as a static file (wrk -c8).
//! 6. **Memory**: hub RSS per idle websocket at 10,000 against a minimal axum websocket server;
//!    RSS left after they close; RSS at N retained.
//! 7. **Steady run** (`BENCH_ONLY=steady` only): 10 minutes (times `BENCH_SCALE`) of 2,000
//!    changes/s in 10-change requests to a hub with `--cache-size 64` whose log is already at
//!    its retention (and turns over), 100 callback subscribers, 10 live websockets and
//!    catch-up reads every second; VmRSS every 10 s: its growth from the first minute to the end (flat: ≤ 1.10) and
//!    its largest sample against the cache size plus a fixed allowance; nothing lost.
//! 8. **Cost growth**: fan-out at 1 … 10,000 subscribers; documents at 10³ … 10⁶ retained
//!    (10⁷ with `BENCH_RETAINED`).

use axum::extract::ws::{Message as AxumMessage, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::time::MissedTickBehavior;

#[path = "support/mod.rs"]
mod support;
use support::procs::{self, wrk, Hub, HubOpts, Nginx, Redis, Script, TOKEN};
use support::report::{si, Goal, Report, Row, Unit};
use support::scale;

/// Deliveries timed at each point of figure 1 (and requests of its floor).
const DELIVERIES: usize = 150_000;
/// Subscribers of figure 2's steady stream.
const PROBE_SUBSCRIBERS: usize = 1000;
/// The topic's entries on top of each retained level (a list closes every 10,000).
const OPEN: u64 = 5_000;
/// Disk the block files of `changes?after=` pages take per change of this benchmark (about
/// 310 bytes), with room to spare: `--page-files-size` for the documents figure's largest
/// level, when the default is smaller.
const PAGE_FILE_BYTES_PER_CHANGE: u64 = 400;

fn scale_f() -> f64 {
    std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0)
}

/// Seconds of one wrk run (or probe): `base` scaled, at least 1.
fn secs(base: u64) -> u64 {
    (scale(base as usize) as u64).max(1)
}

/// A JSON array of `n` changes, each to a resource no other change of the run names.
fn changes_body(n: usize) -> Bytes {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let first = NEXT.fetch_add(n as u64, Ordering::Relaxed);
    let changes: Vec<_> = (first..first + n as u64)
        .map(|i| {
            serde_json::json!({
                "loc": format!("http://example.com/resource/{i}"),
                "change": "updated",
                "hash": "md5:1e0d5cb8ef6ba40c99b14c0237be735e",
                "length": 1234,
                "type": "text/plain",
            })
        })
        .collect();
    Bytes::from(serde_json::to_vec(&changes).unwrap())
}

/// 10000 → "10,000".
fn count(n: impl std::fmt::Display) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// (p50, p99) in ms.
fn percentiles(mut ms: Vec<f64>) -> (f64, f64) {
    if ms.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    ms.sort_by(f64::total_cmp);
    let at = |p: f64| ms[((ms.len() as f64 * p) as usize).min(ms.len() - 1)];
    (at(0.50), at(0.99))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What every figure shares: the binaries, the baselines' servers, the report.
struct Ctx {
    /// The hub under test, then `BENCH_BEFORE_BIN` when given.
    bins: Vec<PathBuf>,
    nginx: Nginx,
    redis: Redis,
    scripts: tempfile::TempDir,
    report: Report,
}

impl Ctx {
    /// A row from one `(value, own baseline)` per binary; the first binary's baseline is the
    /// row's.
    fn row(&mut self, figure: String, unit: Unit, goal: Goal, per_bin: &[(f64, Option<f64>)]) {
        let (value, baseline) = per_bin[0];
        self.report.row(Row {
            figure,
            unit,
            value,
            baseline,
            goal,
            before: per_bin.get(1).copied(),
        });
    }

    fn script(&self, name: &str, script: Script) -> PathBuf {
        script.write(self.scripts.path(), name)
    }

    /// The wrk script POSTing `body` to the hub's ingest with the publisher token.
    fn ingest_script(&self, name: &str, body: &[u8]) -> PathBuf {
        self.script(
            name,
            Script {
                method: "POST",
                body: Some(body),
                headers: &[
                    ("Authorization", format!("Bearer {TOKEN}")),
                    ("Content-Type", "application/json".into()),
                ],
                random_after: None,
            },
        )
    }
}

fn progress(text: &str) {
    eprintln!("[{}] {text}", support::report::load_average());
}

// ---------------------------------------------------------------------------------------------
// Figures 1, 2 and the fan-out cost growth.

struct FanoutPoint {
    rate: f64,
    cpu_us: f64,
    complete: bool,
    failed: u64,
}

struct Probe {
    busy: (f64, f64),
    idle: (f64, f64),
    busy_rate: f64,
    probes: usize,
}

struct FanoutRun {
    points: Vec<FanoutPoint>,
    probe: Option<Probe>,
    /// A 10-change notification as the hub renders it (`changes?after=0&limit=10`).
    body: Bytes,
    topic: String,
}

async fn subscribe(hub: &Hub, nginx: &Nginx, from: usize, to: usize) {
    let topic = format!("{}/channels/bench/changelist.xml", hub.base);
    futures_util::stream::iter(from..to)
        .map(|i| {
            let body = form_urlencoded::Serializer::new(String::new())
                .append_pair("hub.mode", "subscribe")
                .append_pair("hub.topic", &topic)
                .append_pair("hub.callback", &format!("{}/cb?s={i}", nginx.base))
                .append_pair("hub.secret", &format!("secret-of-subscriber-{i}"))
                .finish();
            async move {
                let resp = hub
                    .client
                    .post(format!("{}/hub", hub.base))
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(body)
                    .send()
                    .await
                    .expect("POST /hub");
                assert_eq!(resp.status(), 202, "subscribe {i}");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    // Verified and active, each at the channel's head.
    procs::poll(
        "subscriptions verified",
        Duration::from_secs(180),
        Duration::from_millis(250),
        || async {
            let subs: Vec<serde_json::Value> =
                serde_json::from_slice(&hub.get("/api/subscriptions", &[]).await).ok()?;
            let ready = subs
                .iter()
                .filter(|s| s["channel"] == "bench" && s["lag"].as_u64().unwrap_or(0) == 0)
                .count();
            (ready >= to).then_some(())
        },
    )
    .await;
}

/// POSTs `requests` 10-change requests (8 at a time) and waits for `subscribers` deliveries of
/// each (or `limit`).
async fn burst(
    hub: &Hub,
    subscribers: usize,
    notifications: usize,
    limit: Duration,
) -> FanoutPoint {
    // Requests of up to 100 changes (`--max-batch 10` cuts them into notifications of 10), so
    // that ingest never holds back delivery, even to one subscriber.
    let bodies: Vec<Bytes> = (0..notifications)
        .step_by(10)
        .map(|n| changes_body(10 * (notifications - n).min(10)))
        .collect();
    let (d0, f0) = hub.deliveries().await;
    let cpu0 = hub.cpu_seconds();
    let started = Instant::now();
    futures_util::stream::iter(bodies)
        .map(|b| hub.post_changes("bench", b))
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    let target = d0 + (subscribers * notifications) as u64;
    let deadline = started + limit;
    let (delivered, failed) = loop {
        let (d, f) = hub.deliveries().await;
        if d >= target || Instant::now() >= deadline {
            break (d, f);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = started.elapsed().as_secs_f64();
    let count = delivered - d0;
    FanoutPoint {
        rate: count as f64 / took,
        cpu_us: (hub.cpu_seconds() - cpu0) * 1e6 / count.max(1) as f64,
        complete: delivered >= target,
        failed: failed - f0,
    }
}

/// Sequential single-change POSTs to channel `probe`, one every 5 ms for `seconds`: the
/// latency of each 202, ms.
async fn probe(hub: &Hub, seconds: u64) -> Vec<f64> {
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut latencies = Vec::new();
    while Instant::now() < end {
        tick.tick().await;
        let body = changes_body(1);
        let sent = Instant::now();
        hub.post_changes("probe", body).await;
        latencies.push(ms(sent.elapsed()));
    }
    latencies
}

/// Figure 2: a steady stream to `subscribers` (1.2× the notifications/s `rate` allows, so
/// that delivery never idles) with the probe beside it; then, once drained, the probe alone.
async fn steady_probe(hub: &Hub, subscribers: usize, rate: f64) -> Probe {
    let seconds = secs(8);
    let per_second = (rate / subscribers as f64 * 1.2).max(1.0);
    let (d0, _) = hub.deliveries().await;
    let started = Instant::now();
    let feeder = async {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut posted = 0;
        while started.elapsed() < Duration::from_secs(seconds) {
            tick.tick().await;
            hub.post_changes("bench", changes_body(10)).await;
            posted += 1;
        }
        posted
    };
    let (posted, busy) = tokio::join!(feeder, probe(hub, seconds));
    let (d1, _) = hub.deliveries().await;
    let busy_rate = (d1 - d0) as f64 / started.elapsed().as_secs_f64();
    let target = d0 + (posted * subscribers) as u64;
    procs::poll(
        "the steady stream to drain",
        Duration::from_secs(180),
        Duration::from_millis(100),
        || async { (hub.deliveries().await.0 >= target).then_some(()) },
    )
    .await;
    let probes = busy.len();
    let idle = probe(hub, seconds.min(secs(4))).await;
    Probe {
        busy: percentiles(busy),
        idle: percentiles(idle),
        busy_rate,
        probes,
    }
}

async fn fanout_run(ctx: &Ctx, bin: &Path, counts: &[usize]) -> FanoutRun {
    let opts = HubOpts {
        max_batch: 10,
        linger_ms: 0,
        ..HubOpts::default()
    };
    let hub = Hub::start(bin, &opts).await;
    let mut points = Vec::new();
    let mut probe = None;
    let mut body = Bytes::new();
    let mut subscribed = 0;
    for &subscribers in counts {
        progress(&format!("fan-out: {subscribers} subscribers"));
        subscribe(&hub, &ctx.nginx, subscribed, subscribers).await;
        subscribed = subscribers;
        // One notification to every subscriber first, so that each delivery worker has its
        // connection open (as in a hub that has been running); then about DELIVERIES
        // deliveries (10,000 notifications at most), timed.
        burst(&hub, subscribers, 10, Duration::from_secs(60)).await;
        let notifications = (scale(DELIVERIES) / subscribers).clamp(10, scale(10_000).max(10));
        let point = burst(&hub, subscribers, notifications, Duration::from_secs(120)).await;
        if body.is_empty() {
            body = hub
                .get("/channels/bench/changes?after=0&limit=10", &[])
                .await;
        }
        if subscribers == PROBE_SUBSCRIBERS.min(*counts.last().unwrap()) && probe.is_none() {
            progress("publish latency under fan-out");
            probe = Some(steady_probe(&hub, subscribers, point.rate).await);
        }
        points.push(point);
    }
    FanoutRun {
        points,
        probe,
        body,
        topic: format!("{}/channels/bench/changelist.xml", hub.base),
    }
}

/// How a fan-out floor (figure 1b) speaks HTTP.
#[derive(Clone, Copy)]
enum FloorClient {
    /// hyper's HTTP/1 client: each connection driven by a task of its own (the hub's
    /// callback connections until the seventh pass).
    Hyper,
    /// Each task writes its request and reads the answer on its own connection (as the
    /// hub's `net::http1` does): one buffer write, `httparse` for the answer's head.
    Direct,
}

/// CPU seconds the calling thread has used (user and kernel).
fn thread_cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// The client's floor for figure 1: one thread (a current-thread runtime; the hub's delivery
/// runtime also has one thread on two cores) with `conns` keep-alive connections to nginx,
/// each POSTing `body` to `/cb?s=I` with the headers a delivery carries (its delivery id
/// formatted and its HMAC-SHA256 signature computed per request, as the hub does) until
/// `total` requests are answered. Nothing is read from a store, no notification is rendered,
/// nothing is recorded. Returns (requests/s, CPU µs of that thread per request, kernel time
/// included).
fn fanout_floor(
    client: FloorClient,
    nginx: &str,
    conns: usize,
    total: usize,
    body: Bytes,
    link: String,
) -> (f64, f64) {
    let host = nginx.trim_start_matches("http://").to_string();
    let addr: std::net::SocketAddr = host.parse().expect("nginx listens on an IP address");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut streams = Vec::new();
        for _ in 0..conns {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            streams.push(stream);
        }
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let cpu0 = thread_cpu_seconds();
        let mut tasks = tokio::task::JoinSet::new();
        for (i, stream) in streams.into_iter().enumerate() {
            let (next, body, link, host) = (next.clone(), body.clone(), link.clone(), host.clone());
            tasks.spawn(async move {
                // The signing key made once per connection, as the hub makes it once per
                // subscription.
                let signer = changehub::model::signature::Signer::new(
                    changehub::model::signature::Algorithm::Sha256,
                    format!("secret-of-subscriber-{i}").as_bytes(),
                );
                let path = format!("/cb?s={i}");
                // What changes per request: the delivery id, the seqs, the signature.
                let each = |n: usize| {
                    let mut signature = Vec::with_capacity(80);
                    signer.write(&body, &mut signature);
                    let signature = String::from_utf8_lossy(&signature).into_owned();
                    (format!("sub-{i}-5f3a9c0d2b7e4a61-{n}-{n}"), signature)
                };
                let run = FloorRun {
                    next: &next,
                    total,
                    path: &path,
                    host: &host,
                    link: &link,
                    body: &body,
                };
                match client {
                    FloorClient::Hyper => floor_hyper(stream, run, each).await,
                    FloorClient::Direct => floor_direct(stream, run, each).await,
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        let took = started.elapsed().as_secs_f64();
        let cpu = thread_cpu_seconds() - cpu0;
        (total as f64 / took, cpu * 1e6 / total as f64)
    })
}

/// What one connection of a fan-out floor sends, and how many requests all send together.
struct FloorRun<'a> {
    next: &'a AtomicUsize,
    total: usize,
    path: &'a str,
    host: &'a str,
    link: &'a str,
    body: &'a Bytes,
}

async fn floor_hyper(
    stream: tokio::net::TcpStream,
    run: FloorRun<'_>,
    each: impl Fn(usize) -> (String, String),
) {
    use http_body_util::{BodyExt, Full};
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    loop {
        let n = run.next.fetch_add(1, Ordering::Relaxed);
        if n >= run.total {
            break;
        }
        let (id, signature) = each(n);
        let request = http::Request::post(run.path)
            .header(http::header::HOST, run.host)
            .header(http::header::CONTENT_TYPE, "application/xml")
            .header(http::header::LINK, run.link)
            .header("x-changehub-channel", "bench")
            .header("x-changehub-delivery", id.as_str())
            .header("webhook-id", id.as_str())
            .header("x-changehub-first", n)
            .header("x-changehub-last", n)
            .header("x-changehub-epoch", "5f3a9c0d2b7e4a61")
            .header("x-hub-signature", signature)
            .body(Full::new(run.body.clone()))
            .unwrap();
        let answer = sender.send_request(request).await.unwrap();
        assert!(
            answer.status().is_success(),
            "nginx answered {}",
            answer.status()
        );
        answer.into_body().collect().await.unwrap();
    }
}

async fn floor_direct(
    mut stream: tokio::net::TcpStream,
    run: FloorRun<'_>,
    each: impl Fn(usize) -> (String, String),
) {
    use std::io::Write;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::with_capacity(1024);
    let mut answer = Vec::with_capacity(4096);
    loop {
        let n = run.next.fetch_add(1, Ordering::Relaxed);
        if n >= run.total {
            break;
        }
        let (id, signature) = each(n);
        head.clear();
        write!(
            head,
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/xml\r\n\
             link: {}\r\nx-changehub-channel: bench\r\nx-changehub-delivery: {id}\r\n\
             webhook-id: {id}\r\nx-changehub-first: {n}\r\nx-changehub-last: {n}\r\n\
             x-changehub-epoch: 5f3a9c0d2b7e4a61\r\nx-hub-signature: {signature}\r\n\
             content-length: {}\r\n\r\n",
            run.path,
            run.host,
            run.link,
            run.body.len()
        )
        .unwrap();
        let mut out = bytes::Buf::chain(&head[..], &run.body[..]);
        stream.write_all_buf(&mut out).await.unwrap();
        answer.clear();
        loop {
            assert!(
                stream.read_buf(&mut answer).await.unwrap() > 0,
                "nginx closed"
            );
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut parsed = httparse::Response::new(&mut headers);
            if parsed.parse(&answer).unwrap().is_complete() {
                // nginx's 202 has no body.
                assert!(
                    parsed.code.unwrap() < 300,
                    "nginx answered {:?}",
                    parsed.code
                );
                break;
            }
        }
    }
}

async fn fanout(ctx: &mut Ctx) {
    let mut counts: Vec<usize> = [1, 100, 1000, 5000].iter().map(|&n| scale(n)).collect();
    if scale_f() >= 1.0 {
        counts.push(10_000);
    }
    if let Ok(only) = std::env::var("BENCH_SUBSCRIBERS") {
        counts = only
            .split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .expect("BENCH_SUBSCRIBERS: counts, comma-separated")
            })
            .collect();
        counts.sort_unstable();
    }
    counts.dedup();
    let mut runs = Vec::new();
    for bin in ctx.bins.clone() {
        runs.push(fanout_run(ctx, &bin, &counts).await);
    }
    // Baseline: wrk POSTing the same body with the same headers to the same receiver.
    let hub = runs[0]
        .topic
        .trim_end_matches("/channels/bench/changelist.xml");
    let script = ctx.script(
        "fanout",
        Script {
            method: "POST",
            body: Some(&runs[0].body),
            headers: &[
                ("Content-Type", "application/xml".into()),
                (
                    "Link",
                    format!(
                        "<{hub}/hub>; rel=\"hub\", <{}>; rel=\"self\"",
                        runs[0].topic
                    ),
                ),
                ("X-Hub-Signature", format!("sha256={}", "0f".repeat(32))),
                ("X-Changehub-First", "1".into()),
                ("X-Changehub-Last", "10".into()),
                ("X-Changehub-Epoch", "5f3a9c0d2b7e4a61".into()),
            ],
            random_after: None,
        },
    );
    let mut baselines = Vec::new();
    for &s in &counts {
        progress(&format!("fan-out baseline: wrk -c{s}"));
        let url = format!("{}/cb?s=0", ctx.nginx.base);
        baselines.push(wrk(&url, s, secs(4), Some(&script)).await.rate);
    }
    // The client's floor: the same requests from one thread, nothing else; the hub's way
    // (each task on its own connection) and through hyper's client.
    let link = format!(
        "<{hub}/hub>; rel=\"hub\", <{}>; rel=\"self\"",
        runs[0].topic
    );
    let mut floors = Vec::new();
    for &s in &counts {
        let mut floor = Vec::new();
        for client in [FloorClient::Direct, FloorClient::Hyper] {
            progress(&format!("fan-out floor: one thread, {s} connections"));
            let (nginx, body, link) = (ctx.nginx.base.clone(), runs[0].body.clone(), link.clone());
            let total = scale(DELIVERIES);
            floor.push(
                tokio::task::spawn_blocking(move || {
                    fanout_floor(client, &nginx, s, total, body, link)
                })
                .await
                .unwrap(),
            );
        }
        floors.push(floor);
    }
    let goals = HashMap::from([(100, 0.5), (1000, 0.5), (5000, 0.3)]);
    for (i, &s) in counts.iter().enumerate() {
        if s == 10_000 {
            continue; // the cost-growth table only
        }
        let goal = goals.get(&s).map_or(Goal::None, |&r| Goal::Ratio(r));
        let per_bin: Vec<_> = runs
            .iter()
            .map(|r| (r.points[i].rate, Some(baselines[i])))
            .collect();
        ctx.row(
            format!(
                "1. fan-out, {} subscriber{}",
                count(s),
                if s == 1 { "" } else { "s" }
            ),
            Unit::Rate("deliveries"),
            goal,
            &per_bin,
        );
    }
    for (i, &s) in counts.iter().enumerate() {
        if s == 1 || s == 10_000 {
            continue;
        }
        ctx.row(
            format!(
                "1b. fan-out floor: one thread, its own connections, {} of them",
                count(s)
            ),
            Unit::Rate("req"),
            Goal::None,
            &vec![(floors[i][0].0, Some(baselines[i])); runs.len()],
        );
    }
    let mut rows = Vec::new();
    for (i, &s) in counts.iter().enumerate() {
        let mut row = vec![count(s), si(baselines[i])];
        for (rate, cpu) in &floors[i] {
            row.push(format!("{} ({:.2})", si(*rate), rate / baselines[i]));
            row.push(format!("{cpu:.1}"));
        }
        for r in &runs {
            let p = &r.points[i];
            let mark = if p.complete { "" } else { " (incomplete)" };
            row.push(format!("{}{mark}", si(p.rate)));
            row.push(format!("{:.2}", p.rate / baselines[i]));
            row.push(format!("{:.1}", p.cpu_us));
            if p.failed > 0 {
                row.push(format!("{} failed", p.failed));
            } else {
                row.push(String::new());
            }
        }
        rows.push(row);
    }
    let mut header = vec![
        "subscribers",
        "wrk -c S posts/s",
        "floor: one thread, req/s (ratio)",
        "floor CPU µs/req",
        "floor through hyper, req/s (ratio)",
        "CPU µs/req",
    ];
    header.extend(["hub deliveries/s", "ratio", "hub CPU µs/delivery", "errors"]);
    if runs.len() > 1 {
        header.extend(["before: deliveries/s", "ratio", "CPU µs/delivery", "errors"]);
    }
    ctx.report.table("Fan-out by subscribers", &header, &rows);
    ctx.report.note(format!(
        "**1. Fan-out**: `changehub serve --max-batch 10 --linger 0ms` (embedded store); \
         subscribers added through `POST /hub`, each with its own secret and callback \
         `nginx/cb?s=I` (nginx answers 202), until `/api/subscriptions` lists them all at the \
         head; one notification to every subscriber, untimed, so that every delivery worker \
         has its connection open; then about {} deliveries' worth of notifications of 10 \
         changes ({} bytes each; at most 10,000 notifications), POSTed as 100-change requests 8 at a time (cut \
         into notifications by `--max-batch 10`, so that ingest never holds delivery back), and \
         the clock stops when `changehub_deliveries_total{{outcome=\"delivered\"}}` (polled \
         every 50 ms) has grown by subscribers × notifications (120 s at most). Hub CPU = utime + stime from /proc over the \
         same span (ingest and batching included). Baseline: `wrk -c S -t min(S,2) -d {}s` \
         POSTing the same body with the same headers (Content-Type, Link, X-Hub-Signature, \
         X-Changehub-*) to the same nginx. The row \"fan-out floor\" (1b) is what an \
         HTTP client alone reaches on one thread (as the hub's delivery runtime has on two \
         cores): S keep-alive connections POSTing the same body and headers to the same \
         nginx, each request's delivery id formatted and its signature computed, {} requests, \
         each task writing and reading its own connection as the hub does (`httparse` for the \
         answer); the table below also has the same through hyper's HTTP/1 client (a task per \
         connection). CPU is that thread's (kernel time included).",
        count(scale(DELIVERIES)),
        runs[0].body.len(),
        secs(4),
        count(scale(DELIVERIES))
    ));
    let probes: Vec<&Probe> = runs.iter().filter_map(|r| r.probe.as_ref()).collect();
    if let Some(p) = probes.first() {
        let n = PROBE_SUBSCRIBERS.min(*counts.last().unwrap());
        let p99: Vec<_> = probes.iter().map(|p| (p.busy.1, Some(p.idle.1))).collect();
        ctx.row(
            format!(
                "2. publish 202 p99 while {} subscribers are served",
                count(n)
            ),
            Unit::Ms,
            Goal::AtMost(5.0),
            &p99,
        );
        let p50: Vec<_> = probes.iter().map(|p| (p.busy.0, Some(p.idle.0))).collect();
        ctx.row(
            format!(
                "2. publish 202 p50 while {} subscribers are served",
                count(n)
            ),
            Unit::Ms,
            Goal::None,
            &p50,
        );
        ctx.report.note(format!(
            "**2. Publish latency under fan-out**: while a steady stream of 10-change \
             notifications (1.2× what figure 1 measured at {n} subscribers, so delivery never \
             idles; {} deliveries/s achieved) is fanned out, a probe POSTs one change to \
             another channel (`probe`, same store) every 5 ms, sequentially, {} probes; \
             latency of each 202. Baseline: the same probe on the same hub once every delivery \
             is done.",
            si(p.busy_rate),
            p.probes
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Figure 3: 202 → callback.

/// A minimal callback receiver: echoes challenges, records each POST's seq range and arrival.
#[derive(Clone, Default)]
struct Receiver {
    arrivals: Arc<Mutex<Vec<(u64, u64, Instant)>>>,
}

async fn start_receiver() -> (String, Receiver) {
    let receiver = Receiver::default();
    async fn echo(
        axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
    ) -> String {
        q.get("hub.challenge").cloned().unwrap_or_default()
    }
    async fn record(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
        let at = Instant::now();
        drop(body);
        let seq = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
        };
        if let (Some(first), Some(last)) = (seq("x-changehub-first"), seq("x-changehub-last")) {
            r.arrivals.lock().unwrap().push((first, last, at));
        }
        StatusCode::ACCEPTED
    }
    let app = Router::new()
        .route("/cb", get(echo).post(record))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), receiver)
}

/// p99 (and p50) ms from each change's 202 to the arrival of the notification holding it.
async fn callback_latency(bin: &Path, linger_ms: u64, url: &str, rx: &Receiver) -> (f64, f64) {
    let hub = Hub::start(
        bin,
        &HubOpts {
            linger_ms,
            ..HubOpts::default()
        },
    )
    .await;
    let topic = format!("{}/channels/bench/changelist.xml", hub.base);
    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("hub.mode", "subscribe")
        .append_pair("hub.topic", &topic)
        .append_pair("hub.callback", &format!("{url}/cb?linger={linger_ms}"))
        .append_pair("hub.secret", "a-secret")
        .finish();
    let resp = hub
        .client
        .post(format!("{}/hub", hub.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    procs::poll(
        "the subscription",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            let subs: Vec<serde_json::Value> =
                serde_json::from_slice(&hub.get("/api/subscriptions", &[]).await).ok()?;
            (!subs.is_empty()).then_some(())
        },
    )
    .await;
    rx.arrivals.lock().unwrap().clear();
    let n = scale(250).max(20);
    let mut tick =
        tokio::time::interval(Duration::from_millis(if linger_ms == 0 { 10 } else { 20 }));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut accepted = Vec::with_capacity(n);
    for _ in 0..n {
        tick.tick().await;
        let (first, _) = hub.post_changes("bench", changes_body(1)).await;
        accepted.push((first, Instant::now()));
    }
    let last = accepted.last().unwrap().0;
    procs::poll(
        "every change at the callback",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async {
            let got = rx.arrivals.lock().unwrap().iter().map(|a| a.1).max();
            (got >= Some(last)).then_some(())
        },
    )
    .await;
    let arrivals = rx.arrivals.lock().unwrap().clone();
    let latencies = accepted
        .iter()
        .filter_map(|&(seq, at)| {
            arrivals
                .iter()
                .filter(|a| a.0 <= seq && seq <= a.1)
                .map(|a| a.2)
                .min()
                .map(|arrived| ms(arrived.saturating_duration_since(at)))
        })
        .collect();
    percentiles(latencies)
}

/// p99 ms of a bare POST of a small notification to the receiver: the wire.
async fn wire_p99(url: &str) -> f64 {
    let client = reqwest::Client::new();
    let body = changes_body(1);
    let mut latencies = Vec::new();
    for _ in 0..scale(250).max(20) {
        let sent = Instant::now();
        let resp = client
            .post(format!("{url}/cb"))
            .header("x-changehub-first", "0")
            .header("x-changehub-last", "0")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        latencies.push(ms(sent.elapsed()));
    }
    percentiles(latencies).1
}

async fn callback(ctx: &mut Ctx) {
    let (url, rx) = start_receiver().await;
    let wire = wire_p99(&url).await;
    for linger in [0, 100] {
        progress(&format!("202 → callback at linger {linger} ms"));
        let mut per_bin = Vec::new();
        for bin in ctx.bins.clone() {
            let (_, p99) = callback_latency(&bin, linger, &url, &rx).await;
            per_bin.push((p99, Some(linger as f64 + wire)));
        }
        ctx.row(
            format!("3. 202 → callback p99, linger {linger} ms"),
            Unit::Ms,
            Goal::AtMost(linger as f64 + 10.0),
            &per_bin,
        );
    }
    ctx.report.note(format!(
        "**3. 202 → callback**: `changehub serve --linger L` with one subscriber on a minimal \
         axum receiver inside the bench; {} single-change POSTs, one every 10 ms (linger 0) or \
         20 ms (linger 100 ms); for each change, from its 202 to the arrival of the \
         notification whose `X-Changehub-First`..`-Last` holds its seq. Baseline: L + the p99 \
         of a bare POST of a small body to the same receiver ({wire:.2} ms).",
        scale(250).max(20)
    ));
}

// ---------------------------------------------------------------------------------------------
// Figure 4: ingest.

/// This bench binary as a child process in `role` (see `main`) on a free port: its base URL
/// and the process (stopped when dropped).
fn spawn_role(role: &str, name: &str) -> (String, procs::Proc) {
    spawn_role_with(role, name, &[])
}

/// [`spawn_role`], with more environment for the role (`BENCH_DIR`, `BENCH_REDIS`).
fn spawn_role_with(
    role: &str,
    name: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> (String, procs::Proc) {
    let port = procs::free_port();
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .env("BENCH_ROLE", role)
        .env("BENCH_PORT", port.to_string())
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null());
    let server = procs::Proc::spawn(name, &mut command, None);
    (format!("http://127.0.0.1:{port}"), server)
}

/// Where a minimal ingest server puts a body before it answers (see
/// [`minimal_ingest_server`]).
enum Floor {
    /// Nowhere: it answers once the body is read.
    Answer,
    /// Into a file in this folder, `fdatasync`ed (group commit).
    Disk(PathBuf),
    /// Into a stream of the Redis server at this URL (one `XADD` for every body waiting).
    Redis(String),
}

/// The floors of figure 4b: axum on a tokio runtime, as the hub has, answering every `POST
/// /channels/{name}/changes` 202 with a small JSON body once the body is read; nothing
/// parsed, nothing stored. `/ready` answers when it listens.
///
/// With [`Floor::Disk`], it answers only once the body is on disk: each request hands its
/// body to one writer thread, which appends every body waiting to one file there, `fdatasync`s
/// it once for all of them (group commit, as the hub's embedded store does) and then lets each
/// request answer. The cheapest server that keeps the hub's promise (202 once the change is
/// durable), with none of the hub's own work: no parse, no log, no indexes.
///
/// With [`Floor::Redis`], it answers only once Redis has the body: one task takes every body
/// waiting, appends them to a stream as one entry with one `XADD` (one command and one round
/// trip for the group, as the hub's Redis store has one script call per group and keeps a
/// group's changes in entries of up to 32) and then lets each request answer. The cheapest
/// answer on the Redis store's terms, with none of the hub's own work: no parse, no script, no
/// indexes.
async fn minimal_ingest_server(port: u16, floor: Floor) {
    type Job = (Bytes, tokio::sync::oneshot::Sender<()>);
    type Writer = Arc<dyn Fn(Job) + Send + Sync>;
    async fn accept(
        State(writer): State<Option<Writer>>,
        body: Bytes,
    ) -> (StatusCode, [(&'static str, &'static str); 1], String) {
        let n = body.len();
        if let Some(writer) = writer {
            let (written, stored) = tokio::sync::oneshot::channel();
            writer((body, written));
            stored.await.unwrap();
        }
        (
            StatusCode::ACCEPTED,
            [("content-type", "application/json")],
            format!(r#"{{"accepted":1,"first":{n},"last":{n}}}"#),
        )
    }
    let writer: Option<Writer> = match floor {
        Floor::Answer => None,
        Floor::Disk(dir) => {
            use std::io::Write;
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("bodies"))
                .unwrap();
            std::thread::spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut group = vec![first];
                    group.extend(rx.try_iter());
                    for (body, _) in &group {
                        file.write_all(body).unwrap();
                    }
                    file.sync_data().unwrap();
                    for (_, written) in group {
                        let _ = written.send(());
                    }
                }
            });
            Some(Arc::new(move |job| tx.send(job).unwrap()))
        }
        Floor::Redis(url) => {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            tokio::spawn(async move {
                while let Some(first) = rx.recv().await {
                    let mut group = vec![first];
                    while let Ok(job) = rx.try_recv() {
                        group.push(job);
                    }
                    // One entry holding the group's bodies, as the hub's log keeps a
                    // group's changes in chunks: one command, one round trip.
                    let mut xadd = redis::cmd("XADD");
                    xadd.arg("bench-floor").arg("*");
                    for (body, _) in &group {
                        xadd.arg("b").arg(body.as_ref());
                    }
                    xadd.query_async::<()>(&mut conn).await.unwrap();
                    for (_, written) in group {
                        let _ = written.send(());
                    }
                }
            });
            Some(Arc::new(move |job| tx.send(job).unwrap()))
        }
    };
    let app = Router::new()
        .route("/ready", get(|| async { "ready" }))
        .route("/channels/{name}/changes", axum::routing::post(accept))
        .with_state(writer);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    axum::serve(listener, app).await.unwrap();
}

/// req/s of `script` (wrk -c64, like figure 4b) against a minimal axum server in `role`:
/// `minimal-ingest`, `minimal-durable-ingest` (its file in a temporary directory) or
/// `minimal-redis-ingest` (on `redis`, flushed after it).
async fn minimal_ingest_rate(role: &str, script: &Path, redis: &Redis) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("BENCH_DIR", dir.path().as_os_str()),
        ("BENCH_REDIS", std::ffi::OsStr::new(&redis.url)),
    ];
    let (base, server) = spawn_role_with(role, "the minimal ingest server", &env);
    let client = reqwest::Client::new();
    procs::poll(
        "the minimal ingest server",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || {
            let request = client.get(format!("{base}/ready")).send();
            async move { request.await.ok().filter(|r| r.status().is_success()) }
        },
    )
    .await;
    let rate = warm_wrk(&format!("{base}/channels/bench/changes"), 64, script).await;
    drop(server);
    redis.flush().await;
    rate
}

struct Ingest {
    /// changes/s of 1,000-change requests, wrk -c8.
    big: f64,
    /// requests/s of 1-change requests, wrk -c64.
    small: f64,
}

async fn ingest_run(ctx: &Ctx, bin: &Path, redis: bool, big: &Path, small: &Path) -> Ingest {
    Ingest {
        big: ingest_rate(ctx, bin, redis, 8, big).await * 1000.0,
        small: ingest_rate(ctx, bin, redis, 64, small).await,
    }
}

/// 2xx/s of `script` from `connections` connections against a fresh hub on an empty store: the
/// two parts of figure 4 do not share a hub, so the 1-change figure is not measured while the
/// hub still publishes what the 1,000-change figure appended.
async fn ingest_rate(ctx: &Ctx, bin: &Path, redis: bool, connections: usize, script: &Path) -> f64 {
    if redis {
        ctx.redis.flush().await;
    }
    let opts = HubOpts {
        redis: redis.then(|| ctx.redis.url.clone()),
        ..HubOpts::default()
    };
    let hub = Hub::start(bin, &opts).await;
    let rate = warm_wrk(
        &format!("{}/channels/bench/changes", hub.base),
        connections,
        script,
    )
    .await;
    drop(hub);
    if redis {
        ctx.redis.flush().await;
    }
    rate
}

/// 2xx/s of `script` against `url` for [`secs`]`(3)`, after [`INGEST_WARM_UP`] of the same load
/// that is not counted (connections opened, scripts loaded, the first allocations made): the
/// same for the hub and for the baselines.
async fn warm_wrk(url: &str, connections: usize, script: &Path) -> f64 {
    wrk(url, connections, INGEST_WARM_UP, Some(script)).await;
    wrk(url, connections, secs(3), Some(script)).await.rate
}

/// Figure 4's baselines: `redis-benchmark XADD` ops/s on the bench's redis-server (flushed
/// before and after), and nginx's 202 req/s for `small` from 64 connections.
async fn ingest_baselines(ctx: &Ctx, small: &Path) -> (f64, f64) {
    ctx.redis.flush().await;
    let xadd = ctx.redis.xadd_benchmark(scale(2_000_000)).await;
    ctx.redis.flush().await;
    let nginx = warm_wrk(
        &format!("{}/channels/bench/changes", ctx.nginx.base),
        64,
        small,
    )
    .await;
    (xadd, nginx)
}

/// Seconds of load before each rate of figure 4 is measured.
const INGEST_WARM_UP: u64 = 1;

async fn ingest(ctx: &mut Ctx) {
    let big = ctx.ingest_script("ingest-1000", &changes_body(1000));
    let small = ctx.ingest_script("ingest-1", &changes_body(1));
    progress("ingest baselines: redis-benchmark XADD, nginx 202");
    let (xadd, nginx) = ingest_baselines(ctx, &small).await;
    progress("ingest baselines: a minimal axum server answering 202, and ones that write first");
    let axum_floor = minimal_ingest_rate("minimal-ingest", &small, &ctx.redis).await;
    let durable_floor = minimal_ingest_rate("minimal-durable-ingest", &small, &ctx.redis).await;
    let redis_floor = minimal_ingest_rate("minimal-redis-ingest", &small, &ctx.redis).await;
    let mut runs: Vec<(Ingest, Ingest)> = Vec::new();
    for bin in ctx.bins.clone() {
        progress("ingest: embedded, redis");
        let embedded = ingest_run(ctx, &bin, false, &big, &small).await;
        let redis = ingest_run(ctx, &bin, true, &big, &small).await;
        runs.push((embedded, redis));
    }
    // Again after the hubs, and the higher of each pair kept: a baseline measured in a slow
    // moment of the machine would flatter the hub's ratio (nginx's 202 rate has moved
    // between 89k and 134k requests/s from one run to the next).
    progress("ingest baselines again");
    let (xadd_after, nginx_after) = ingest_baselines(ctx, &small).await;
    let (xadd, nginx) = (xadd.max(xadd_after), nginx.max(nginx_after));
    let pick = |f: &dyn Fn(&(Ingest, Ingest)) -> f64, base: f64| -> Vec<(f64, Option<f64>)> {
        runs.iter().map(|r| (f(r), Some(base))).collect()
    };
    let rows = [
        (
            "4a. ingest, 1,000-change requests, Redis (wrk -c8) vs XADD",
            pick(&|r| r.1.big, xadd),
            Unit::Rate("changes"),
            Goal::Ratio(0.5),
        ),
        (
            "4a. ingest, 1,000-change requests, embedded (wrk -c8) vs XADD",
            pick(&|r| r.0.big, xadd),
            Unit::Rate("changes"),
            Goal::None,
        ),
        (
            "4b. ingest, 1-change requests, embedded (wrk -c64) vs nginx 202",
            pick(&|r| r.0.small, nginx),
            Unit::Rate("req"),
            Goal::Ratio(0.5),
        ),
        (
            "4b. ingest, 1-change requests, Redis (wrk -c64) vs nginx 202",
            pick(&|r| r.1.small, nginx),
            Unit::Rate("req"),
            Goal::Ratio(0.5),
        ),
    ];
    for (figure, per_bin, unit, goal) in rows {
        ctx.row(figure.into(), unit, goal, &per_bin);
    }
    // The floors, the same for every binary, then the hub against the floor of its own store's
    // promise: what of 4b is the hub's work.
    let same = |floor: f64| vec![(floor, Some(nginx)); runs.len()];
    let floors = [
        (
            "4b. minimal axum server answering 202 (wrk -c64) vs nginx 202",
            same(axum_floor),
        ),
        (
            "4b. minimal axum server, body fdatasynced before the 202 (wrk -c64) vs nginx 202",
            same(durable_floor),
        ),
        (
            "4b. minimal axum server, body XADDed to Redis before the 202 (wrk -c64) vs nginx 202",
            same(redis_floor),
        ),
        (
            "4b. ingest, 1-change requests, embedded, vs the fdatasynced floor",
            pick(&|r| r.0.small, durable_floor),
        ),
        (
            "4b. ingest, 1-change requests, Redis, vs the XADDed floor",
            pick(&|r| r.1.small, redis_floor),
        ),
    ];
    for (figure, per_bin) in floors {
        ctx.row(figure.into(), Unit::Rate("req"), Goal::None, &per_bin);
    }
    ctx.report.note(format!(
        "**4. Ingest**: a fresh hub on an empty store for each of (a) and (b) and each store \
         (defaults: `--max-batch 1000 --linger 100ms`; Redis: `--redis` on the bench's private \
         redis-server, `--save \"\" --appendonly no`, flushed before and after). Every wrk \
         rate, the hub's, nginx's and the minimal server's, is measured after {w} s of the \
         same load that is not counted (`redis-benchmark` is not warmed up). (a) `wrk -c8 -t2 \
         -d{s}s` POSTing a JSON array of 1,000 changes with the publisher token; changes/s = \
         2xx/s × 1,000. Baseline: `redis-benchmark -P 100 -n {} XADD bench-stream '*' f v` \
         on the same redis-server, ops/s. (b) `wrk -c64 -t2 -d{s}s` POSTing one change; baseline: the same wrk and \
         script against nginx answering 202 to the same path. Both baselines are measured \
         before the hubs and again after them, and the higher of the two is used. The row \"minimal axum server\" is \
         the web framework's floor, measured the same way: axum on tokio, as in the hub, \
         answering 202 with a small JSON body once the body is read (this bench binary as a \
         child process, `BENCH_ROLE=minimal-ingest`). The row \"body fdatasynced before the \
         202\" is the floor of a durable answer: the same server, but each body goes to one \
         writer thread that appends every body waiting to a file, `fdatasync`s it once for all \
         of them and only then lets them answer (`BENCH_ROLE=minimal-durable-ingest`); no \
         parse, no log, no indexes. The row \"body XADDed to Redis before the 202\" is the \
         floor of an answer on the Redis store's terms: the same server, but one task takes \
         every body waiting, appends them to a stream of the bench's redis-server as one entry \
         (one `XADD`) and only then lets them answer (`BENCH_ROLE=minimal-redis-ingest`); no parse, no \
         script, no indexes. The two rows \"vs the … floor\" give the hub's 1-change rate \
         against the floor of its own store: the share of the floor's rate that the hub's own \
         work (token, parse, log, indexes, batcher) leaves.",
        scale(2_000_000),
        s = secs(3),
        w = INGEST_WARM_UP
    ));
}

// ---------------------------------------------------------------------------------------------
// Figure 5 and the documents' cost growth; RSS at N retained (figure 6).

/// (hub req/s, nginx req/s for the same bytes).
type Pair = (f64, f64);

struct Level {
    retained: u64,
    topic_bytes: usize,
    topic: Pair,
    topic_gzip: Option<Pair>,
    closed: Option<(Pair, usize)>,
    pages: Pair,
    rss: u64,
}

struct Documents {
    empty_rss: u64,
    levels: Vec<Level>,
}

/// Appends changes in 1,000-change requests, 8 at a time, until the head is `to`; returns
/// the last request's body.
/// Appends changes `from`..`to` to `bench` in 1,000-change requests, 8 at a time, and
/// returns the body of the request that got the highest seqs: with 8 in flight, the request
/// sent last is not always appended last, so its changes need not be the newest.
async fn fill(hub: &Hub, from: u64, to: u64) -> Bytes {
    let mut newest = (0, Bytes::new());
    let mut answers = futures_util::stream::iter((from..to).step_by(1000))
        .map(|start| {
            let body = changes_body((to - start).min(1000) as usize);
            async move {
                let (_, last) = hub.post_changes("bench", body.clone()).await;
                (last, body)
            }
        })
        .buffer_unordered(8);
    while let Some((last, body)) = answers.next().await {
        if last >= newest.0 {
            newest = (last, body);
        }
    }
    newest.1
}

async fn static_pair(
    ctx: &Ctx,
    hub_url: &str,
    script: Option<&Path>,
    name: &str,
    bytes: &[u8],
    gzip: bool,
    seconds: u64,
) -> Pair {
    let static_url = ctx.nginx.put(name, bytes, gzip);
    let hub = wrk(hub_url, 8, seconds, script).await;
    let baseline = wrk(&static_url, 8, seconds, script).await;
    (hub.rate, baseline.rate)
}

async fn documents_run(
    ctx: &Ctx,
    bin: &Path,
    redis: bool,
    levels: &[u64],
    main: u64,
    page_files_mib: Option<u64>,
    tag: &str,
) -> Documents {
    if redis {
        ctx.redis.flush().await;
    }
    let opts = HubOpts {
        redis: redis.then(|| ctx.redis.url.clone()),
        page_files_mib,
        ..HubOpts::default()
    };
    let hub = Hub::start(bin, &opts).await;
    let empty_rss = hub.rss();
    let topic_path = "/channels/bench/changelist.xml";
    let mut head = 0;
    let mut out = Vec::new();
    for &n in levels {
        progress(&format!("documents ({tag}): filling to {n}"));
        let last = fill(&hub, head, n).await;
        let head_before = head;
        head = n;
        // The topic holds the last change once it is published.
        let last: serde_json::Value = serde_json::from_slice(&last).unwrap();
        let last_loc = last.as_array().unwrap().last().unwrap()["loc"]
            .as_str()
            .unwrap()
            .to_string();
        // A minute more per million changes for the hub to digest a large fill.
        let digest = Duration::from_secs(60 * (n - head_before) / 1_000_000);
        let topic = procs::poll(
            "the topic to show the last change",
            Duration::from_secs(60) + digest,
            Duration::from_millis(50),
            || async {
                let t = hub.get(topic_path, &[]).await;
                String::from_utf8_lossy(&t).contains(&last_loc).then_some(t)
            },
        )
        .await;
        // And the hub has published every change (its batcher can lag behind a fill on a busy
        // machine, on Redis most; what is retained is measured, not the digestion of a burst).
        procs::poll(
            "the hub to publish every change",
            Duration::from_secs(120) + digest,
            Duration::from_millis(50),
            || async {
                let channels: serde_json::Value =
                    serde_json::from_slice(&hub.get("/channels", &[]).await).ok()?;
                let bench = channels.as_array()?.iter().find(|c| c["name"] == "bench")?;
                (bench["published"].as_u64()? >= n).then_some(())
            },
        )
        .await;
        // On Redis the resource index follows the log (the fold, `store/redis/fold.rs`): after
        // a fill where every change is to a resource of its own nothing coalesces, and the
        // fold's tail would run during the measurement. A read of the Resource List folds
        // first; its time is the digestion of the burst, shown in the progress line.
        let started = Instant::now();
        hub.get("/channels/bench/resourcelist.xml", &[]).await;
        progress(&format!(
            "documents ({tag}): the resource index caught up in {:.2} s",
            started.elapsed().as_secs_f64()
        ));
        let seconds = if n == main { secs(3) } else { secs(2) };
        let name = format!("{tag}-{n}");
        let topic_url = format!("{}{topic_path}", hub.base);
        progress(&format!("documents ({tag}): {n} retained"));
        let topic_pair = static_pair(
            ctx,
            &topic_url,
            None,
            &format!("{name}-topic.xml"),
            &topic,
            false,
            seconds,
        )
        .await;
        let mut topic_gzip = None;
        let mut closed = None;
        if n == main {
            let gz = hub.get(topic_path, &[("accept-encoding", "gzip")]).await;
            if gz.starts_with(&[0x1f, 0x8b]) {
                let script = ctx.script(
                    "gzip",
                    Script {
                        method: "GET",
                        body: None,
                        headers: &[("Accept-Encoding", "gzip".into())],
                        random_after: None,
                    },
                );
                topic_gzip = Some(
                    static_pair(
                        ctx,
                        &topic_url,
                        Some(&script),
                        &format!("{name}-topic.xml"),
                        &gz,
                        true,
                        seconds,
                    )
                    .await,
                );
            }
            let archive = hub.get("/channels/bench/changelist-archive.xml", &[]).await;
            let archive = String::from_utf8_lossy(&archive);
            let list = archive
                .match_indices("/channels/bench/changelist/")
                .filter_map(|(i, _)| {
                    let rest = &archive[i..];
                    rest.find(".xml").map(|end| rest[..end + 4].to_string())
                })
                .last();
            if let Some(path) = list {
                let bytes = hub.get(&path, &[]).await;
                let url = format!("{}{path}", hub.base);
                let pair = static_pair(
                    ctx,
                    &url,
                    None,
                    &format!("{name}-closed.xml"),
                    &bytes,
                    false,
                    seconds,
                )
                .await;
                closed = Some((pair, bytes.len()));
            }
        }
        let hi = n.saturating_sub(1000);
        let script = ctx.script(
            &format!("pages-{name}"),
            Script {
                method: "GET",
                body: None,
                headers: &[],
                random_after: Some(("/channels/bench/changes", 0, hi, 1000)),
            },
        );
        let page = hub
            .get(
                &format!("/channels/bench/changes?after={}&limit=1000", hi / 2),
                &[],
            )
            .await;
        let static_url = ctx.nginx.put(&format!("{name}-page.xml"), &page, false);
        let pages = (
            wrk(&format!("{}/", hub.base), 8, seconds, Some(&script))
                .await
                .rate,
            wrk(&static_url, 8, seconds, None).await.rate,
        );
        out.push(Level {
            retained: n,
            topic_bytes: topic.len(),
            topic: topic_pair,
            topic_gzip,
            closed,
            pages,
            rss: hub.rss(),
        });
    }
    drop(hub);
    if redis {
        ctx.redis.flush().await;
    }
    Documents {
        empty_rss,
        levels: out,
    }
}

async fn documents(ctx: &mut Ctx) {
    let main = scale(100_000) as u64 + OPEN;
    let mut levels = vec![1_000, main];
    let largest = std::env::var("BENCH_RETAINED")
        .ok()
        .and_then(|v| v.replace([',', '_'], "").parse().ok())
        .unwrap_or(scale(1_000_000) as u64);
    let mut n = 1_000_000;
    while n < largest {
        levels.push(n + OPEN);
        n *= 10;
    }
    levels.push(largest + OPEN);
    levels.sort();
    levels.dedup();
    let largest = levels.last().copied().unwrap_or(0);
    // Block files for every page of the largest level, when the hub's default is too small
    // for them (docs/cli.md, `--page-files-size`).
    let default_mib = changehub::catchup::pages::FILES_BYTES >> 20;
    let page_files_mib =
        Some((largest * PAGE_FILE_BYTES_PER_CHANGE) >> 20).filter(|&mib| mib > default_mib);
    let mut rss_rows = Vec::new();
    for (redis, store) in [(false, "embedded"), (true, "Redis")] {
        let mut runs = Vec::new();
        for (i, bin) in ctx.bins.clone().iter().enumerate() {
            let tag = format!("{store}-{i}");
            runs.push(documents_run(ctx, bin, redis, &levels, main, page_files_mib, &tag).await);
        }
        fn at(d: &Documents, n: u64) -> &Level {
            d.levels.iter().find(|l| l.retained == n).unwrap()
        }
        let at_main = |d| at(d, main);
        let m = at_main(&runs[0]);
        let figure = |what: &str| format!("5. {what}, {store}, {} retained", count(main));
        type Get = fn(&Level) -> Option<Pair>;
        let docs: [(String, Get, f64); 4] = [
            (
                format!("topic ({} KiB)", m.topic_bytes / 1024),
                |l| Some(l.topic),
                0.33,
            ),
            ("topic, gzip".into(), |l| l.topic_gzip, 0.33),
            (
                format!("closed list ({} KiB)", m.closed.map_or(0, |c| c.1) / 1024),
                |l| l.closed.map(|c| c.0),
                0.33,
            ),
            (
                "changes?after= pages of 1,000".into(),
                |l| Some(l.pages),
                0.3,
            ),
        ];
        for (what, get, goal) in docs {
            let per_bin: Option<Vec<(f64, Option<f64>)>> = runs
                .iter()
                .map(|d| get(at_main(d)).map(|(h, s)| (h, Some(s))))
                .collect();
            if let Some(per_bin) = per_bin {
                ctx.row(
                    figure(&what),
                    Unit::Rate("req"),
                    Goal::Ratio(goal),
                    &per_bin,
                );
            }
        }
        for &n in &levels {
            let per_bin: Vec<_> = runs
                .iter()
                .map(|d| {
                    let l = d.levels.iter().find(|l| l.retained == n).unwrap();
                    (
                        l.rss as f64 / 1_048_576.0,
                        Some(d.empty_rss as f64 / 1_048_576.0),
                    )
                })
                .collect();
            rss_rows.push((
                format!("6. hub RSS at {} retained, {store}", count(n)),
                Unit::MiB,
                Goal::None,
                per_bin,
            ));
        }
        let mut rows = Vec::new();
        for (i, &n) in levels.iter().enumerate() {
            let mut row = vec![count(n)];
            for d in &runs {
                let l = &d.levels[i];
                row.push(format!(
                    "{} ({}, {:.2})",
                    si(l.topic.0),
                    si(l.topic.1),
                    l.topic.0 / l.topic.1
                ));
                row.push(format!(
                    "{} ({}, {:.2})",
                    si(l.pages.0),
                    si(l.pages.1),
                    l.pages.0 / l.pages.1
                ));
                row.push(format!("{:.0}", l.rss as f64 / 1_048_576.0));
            }
            rows.push(row);
        }
        let mut header = vec![
            "retained",
            "topic req/s (static, ratio)",
            "pages req/s (static, ratio)",
            "RSS MiB",
        ];
        if runs.len() > 1 {
            header.extend(["before: topic", "pages", "RSS MiB"]);
        }
        ctx.report.table(
            &format!("Catch-up documents by retained changes, {store}"),
            &header,
            &rows,
        );
    }
    for (figure, unit, goal, per_bin) in rss_rows {
        ctx.row(figure, unit, goal, &per_bin);
    }
    ctx.report.note(format!(
        "**5. Catch-up documents**: a fresh hub per store filled with 1,000-change requests \
         (8 at a time) to each retained level in turn (1,000, then N + {} so that the topic \
         holds {} changes; a list closes every 10,000); at each level, once the topic shows \
         the last change, `/channels` shows every change published and a read of the Resource \
         List has brought the resource index up to the log (Redis folds it after the append), \
         `wrk -c8 -t2` for \
         {}s ({}s at levels other than {}) on the topic, and at {} also on the topic with \
         `Accept-Encoding: gzip` and on the newest closed list (from `changelist-archive.xml`); \
         `changes?after=R&limit=1000` with R uniform over the log (a Lua script). Baseline: \
         nginx serving the bytes the hub served (a page: the one at the middle of the log; \
         gzip: the hub's gzip bytes with `Content-Encoding: gzip`) as a static file, same wrk. \
         **6. RSS at N retained**: VmRSS of the hub after those runs; baseline: right after \
         it started, empty.{}",
        count(OPEN),
        count(OPEN),
        secs(3),
        secs(2),
        count(main),
        count(main),
        match page_files_mib {
            Some(mib) => format!(
                " The block files of {} changes' pages do not fit the default \
                 `--page-files-size` ({} MiB): the hubs of this figure ran with `--page-files-size {}` \
                 ({} bytes per change of the largest level).",
                count(largest),
                count(default_mib),
                mib,
                PAGE_FILE_BYTES_PER_CHANGE
            ),
            None => String::new(),
        }
    ));
}

// ---------------------------------------------------------------------------------------------
// Figure 6: idle websockets.

struct WsMemory {
    per_connection: f64,
    unreturned: f64,
}

/// The settled RSS of `pid`: read until two reads 250 ms apart differ by less than 64 KiB
/// (5 s at most).
async fn settled_rss(pid: u32) -> u64 {
    let mut last = procs::rss(pid);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = procs::rss(pid);
        if now.abs_diff(last) < 64 << 10 {
            return now;
        }
        last = now;
    }
    last
}

/// Opens `n` websockets to `url` (sending `subscribe` and waiting for a `caught_up` frame when
/// given); returns them running, each reading until it is aborted.
async fn open_websockets(url: &str, n: usize, subscribe: Option<&str>) -> tokio::task::JoinSet<()> {
    use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
    use tokio_tungstenite::tungstenite::Message;
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel();
    let parallel = Arc::new(tokio::sync::Semaphore::new(200));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (url, ready_tx, parallel) = (url.to_string(), ready_tx.clone(), parallel.clone());
        let subscribe = subscribe.map(str::to_string);
        set.spawn(async move {
            let permit = parallel.acquire_owned().await.unwrap();
            let (mut ws, _) =
                tokio_tungstenite::connect_async_with_config(url.as_str(), Some(config), true)
                    .await
                    .expect("websocket connect");
            if let Some(s) = subscribe {
                ws.send(Message::Text(s.into())).await.unwrap();
                while let Some(Ok(msg)) = ws.next().await {
                    if msg.to_text().is_ok_and(|t| t.contains("caught_up")) {
                        break;
                    }
                }
            }
            drop(permit);
            let _ = ready_tx.send(());
            while ws.next().await.is_some() {}
        });
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    for i in 0..n {
        match tokio::time::timeout_at(deadline, ready_rx.recv()).await {
            Ok(Some(())) => {}
            _ => panic!("websockets: only {i} of {n} ready"),
        }
    }
    set
}

/// Bytes per idle websocket, and what is left after they close.
async fn measure_websockets<F, Fut>(
    pid: u32,
    url: &str,
    subscribe: Option<&str>,
    open: F,
) -> WsMemory
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<u64>>,
{
    let n = scale(10_000);
    // A few first, so that lazily made state is not counted per connection.
    let warm = open_websockets(url, 10, subscribe).await;
    let before = settled_rss(pid).await;
    let mut set = open_websockets(url, n, subscribe).await;
    let after = settled_rss(pid).await;
    set.abort_all();
    while set.join_next().await.is_some() {}
    procs::poll(
        "the websockets to close",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async { open().await.filter(|&c| c <= 10).map(|_| ()) },
    )
    .await;
    let closed = settled_rss(pid).await;
    drop(warm);
    WsMemory {
        per_connection: after.saturating_sub(before) as f64 / n as f64,
        unreturned: closed as f64 - before as f64,
    }
}

async fn websockets_hub(bin: &Path) -> WsMemory {
    let hub = Hub::start(bin, &HubOpts::default()).await;
    let url = format!("{}/ws", hub.base.replace("http://", "ws://"));
    let subscribe = serde_json::json!({"op": "subscribe", "channel": "bench"}).to_string();
    measure_websockets(hub.pid(), &url, Some(&subscribe), || async {
        let live: serde_json::Value =
            serde_json::from_slice(&hub.get("/api/live", &[]).await).ok()?;
        live["connections"].as_u64()
    })
    .await
}

async fn websockets_minimal() -> WsMemory {
    let (base, server) = spawn_role("minimal-websocket", "the minimal websocket server");
    let client = reqwest::Client::new();
    let count = || {
        let (client, url) = (client.clone(), format!("{base}/count"));
        async move {
            client
                .get(url)
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?
                .parse()
                .ok()
        }
    };
    procs::poll(
        "the minimal server",
        Duration::from_secs(20),
        Duration::from_millis(50),
        count,
    )
    .await;
    measure_websockets(
        server.pid(),
        &format!("{}/ws", base.replacen("http://", "ws://", 1)),
        None,
        count,
    )
    .await
}

/// The baseline server: idle websockets, each a task waiting on its socket, and their count.
async fn minimal_websocket_server(port: u16) {
    let open = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route(
            "/count",
            get(|State(open): State<Arc<AtomicUsize>>| async move {
                open.load(Ordering::Relaxed).to_string()
            }),
        )
        .route(
            "/ws",
            get(
                |ws: WebSocketUpgrade, State(open): State<Arc<AtomicUsize>>| async move {
                    ws.read_buffer_size(1024).write_buffer_size(0).on_upgrade(
                        move |mut socket| async move {
                            open.fetch_add(1, Ordering::Relaxed);
                            while let Some(Ok(msg)) = socket.recv().await {
                                if let AxumMessage::Close(_) = msg {
                                    break;
                                }
                            }
                            open.fetch_sub(1, Ordering::Relaxed);
                        },
                    )
                },
            ),
        )
        .with_state(open);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    axum::serve(listener, app).await.unwrap();
}

async fn websockets(ctx: &mut Ctx) {
    let n = scale(10_000);
    progress(&format!("{n} idle websockets: minimal server"));
    let minimal = websockets_minimal().await;
    let mut runs = Vec::new();
    for bin in ctx.bins.clone() {
        progress(&format!("{n} idle websockets: hub"));
        runs.push(websockets_hub(&bin).await);
    }
    let per_conn: Vec<_> = runs
        .iter()
        .map(|r| {
            (
                r.per_connection / 1024.0,
                Some(minimal.per_connection / 1024.0),
            )
        })
        .collect();
    ctx.row(
        format!("6. RSS per idle websocket at {}", count(n)),
        Unit::KiB,
        Goal::AtMost(4.0),
        &per_conn,
    );
    let left: Vec<_> = runs
        .iter()
        .map(|r| {
            (
                r.unreturned / 1_048_576.0,
                Some(minimal.unreturned / 1_048_576.0),
            )
        })
        .collect();
    ctx.row(
        format!("6. RSS not returned after {} websockets closed", count(n)),
        Unit::MiB,
        Goal::None,
        &left,
    );
    ctx.report.note(format!(
        "**6. Idle websockets**: a fresh hub (embedded store, `--ws-ping 1h`); 10 websockets \
         first, then {} more on `/ws`, each subscribed live to `bench` and past its \
         `caught_up`; VmRSS once settled (two reads 250 ms apart within 64 KiB) before and \
         after, per connection; then they close, and RSS once `/api/live` counts only the 10 \
         again, minus the RSS before. Baseline: a minimal axum websocket server (this bench \
         binary as a child process, `BENCH_ROLE=minimal-websocket`), the same clients.",
        count(n)
    ));
}

// ---------------------------------------------------------------------------------------------
// Figure 7: a steady run (only when BENCH_ONLY names `steady`).

/// `--cache-size` of the steady run, MiB, unless `BENCH_STEADY_CACHE` gives another.
const STEADY_CACHE_MIB: usize = 64;

/// The steady run's `--cache-size`, MiB.
fn steady_cache_mib() -> usize {
    std::env::var("BENCH_STEADY_CACHE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&mib| mib > 0)
        .unwrap_or(STEADY_CACHE_MIB)
}

/// What the steady run's hub may hold beside its caches, MiB. `--cache-size` bounds them all
/// together (the store's file, the page blocks kept in memory, the closed lists kept rendered);
/// this is for the rest. Measured (heaptrack, live allocations at the peak of a 3-minute run,
/// when the page blocks and closed lists still had 64 MiB each of their own): 17 MB outside
/// the caches. Memory that malloc keeps after it was freed is not allowed for: that is what the
/// figure is there to show.
const STEADY_ALLOWANCE_MIB: usize = 32;
/// Changes per second the steady run publishes, in 10-change requests.
const STEADY_RATE: f64 = 2_000.0;
/// The steady run's retention (times `BENCH_SCALE`): the log turns over 4 times.
const STEADY_RETAIN: usize = 300_000;
const STEADY_SUBSCRIBERS: usize = 100;
const STEADY_WEBSOCKETS: usize = 10;
/// `changes?after=` pages read each second in the steady run.
const STEADY_PAGES: usize = 4;
/// RSS samples of the steady run after the one at its start, one per step.
const STEADY_STEPS: u32 = 60;
/// The sample taken once the first minute is over.
const STEADY_WARM: usize = 6;

/// One step of the steady run: 10 s, times `BENCH_SCALE`.
fn steady_step() -> Duration {
    Duration::from_secs_f64(10.0 * scale_f()).max(Duration::from_millis(100))
}

/// "10 min", "30 s", "0.5 s".
fn span(d: Duration) -> String {
    let tenths = (d.as_secs_f64() * 10.0).round() as u64;
    if tenths >= 600 && tenths.is_multiple_of(600) {
        format!("{} min", tenths / 600)
    } else if tenths.is_multiple_of(10) {
        format!("{} s", tenths / 10)
    } else {
        format!("{:.1} s", tenths as f64 / 10.0)
    }
}

struct Sample {
    rss: u64,
    published: u64,
    delivered: u64,
}

struct Steady {
    /// VmRSS once settled after the start, before anything was subscribed or posted.
    empty_rss: u64,
    /// At the start of the load, then one per step.
    samples: Vec<Sample>,
    /// The last seq a 202 acknowledged.
    posted: u64,
    /// `published` of `bench` in `/channels` once the load stopped (and drained, or 120 s).
    published: u64,
    /// The subscriptions' lag summed, at the same time.
    behind: u64,
    /// Deliveries with another outcome than `delivered`.
    failed: u64,
    /// Changes per second acknowledged.
    rate: f64,
    /// Hub CPU over the load, percent of one core.
    cpu: f64,
    reads: u64,
    read_errors: u64,
}

impl Steady {
    fn warm(&self) -> u64 {
        self.samples[STEADY_WARM].rss
    }

    fn end(&self) -> u64 {
        self.samples.last().unwrap().rss
    }

    fn max(&self) -> u64 {
        self.samples.iter().map(|s| s.rss).max().unwrap()
    }

    fn lost(&self) -> u64 {
        self.posted.saturating_sub(self.published) + self.behind
    }
}

/// `bench` in `/channels`: (oldest, last, published).
async fn bench_channel(hub: &Hub) -> Option<(u64, u64, u64)> {
    let channels: serde_json::Value =
        serde_json::from_slice(&hub.get("/channels", &[]).await).ok()?;
    let bench = channels.as_array()?.iter().find(|c| c["name"] == "bench")?;
    Some((
        bench["oldest"].as_u64()?,
        bench["last"].as_u64()?,
        bench["published"].as_u64()?,
    ))
}

/// The lag of `bench`'s subscriptions, summed.
async fn bench_lag(hub: &Hub) -> Option<u64> {
    let subs: Vec<serde_json::Value> =
        serde_json::from_slice(&hub.get("/api/subscriptions", &[]).await).ok()?;
    Some(
        subs.iter()
            .filter(|s| s["channel"] == "bench")
            .map(|s| s["lag"].as_u64().unwrap_or(0))
            .sum(),
    )
}

/// GET `path`, reading the whole body; what went wrong unless it answered 2xx.
async fn read_ok(hub: &Hub, path: &str, gzip: bool) -> Result<(), String> {
    let mut req = hub.client.get(format!("{}{path}", hub.base));
    if gzip {
        req = req.header("accept-encoding", "gzip");
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
    }
}

/// One round of catch-up reads: the topic (plain and gzip), a closed list picked at random
/// from the archive, and [`STEADY_PAGES`] `changes?after=R&limit=1000` pages with R uniform
/// over the newer 90% of the retained log (the older tenth may be trimmed before the read).
/// Returns (reads, not 2xx); each read that failed is printed.
async fn steady_reads(hub: &Hub) -> (u64, u64) {
    let topic = "/channels/bench/changelist.xml";
    let mut reads = vec![(topic.to_string(), false), (topic.to_string(), true)];
    let archive = hub.get("/channels/bench/changelist-archive.xml", &[]).await;
    let archive = String::from_utf8_lossy(&archive);
    let closed: Vec<String> = archive
        .match_indices("/channels/bench/changelist/")
        .filter_map(|(i, _)| {
            let rest = &archive[i..];
            rest.find(".xml").map(|end| rest[..end + 4].to_string())
        })
        .collect();
    if !closed.is_empty() {
        let pick = rand::random_range(0..closed.len());
        reads.push((closed[pick].clone(), false));
    }
    if let Some((oldest, last, _)) = bench_channel(hub).await {
        let lo = oldest + (last - oldest) / 10;
        let hi = last.saturating_sub(1000).max(lo);
        for _ in 0..STEADY_PAGES {
            let after = rand::random_range(lo..=hi);
            reads.push((
                format!("/channels/bench/changes?after={after}&limit=1000"),
                false,
            ));
        }
    }
    let mut failed = 0;
    for (path, gzip) in &reads {
        if let Err(e) = read_ok(hub, path, *gzip).await {
            progress(&format!("steady run: GET {path}: {e}"));
            failed += 1;
        }
    }
    // The archive too (read with `Hub::get`, which stops the bench unless it answers 2xx).
    (reads.len() as u64 + 1, failed)
}

async fn steady_run(ctx: &Ctx, bin: &Path) -> Steady {
    let opts = HubOpts {
        cache_mib: Some(steady_cache_mib()),
        retain_changes: scale(STEADY_RETAIN) as u64,
        ..HubOpts::default()
    };
    let hub = Hub::start(bin, &opts).await;
    let empty_rss = settled_rss(hub.pid()).await;
    // The log at its retention from the start (as in a hub that has run for a while), so
    // that what the run reads can fill the hub's bounded caches within its first minute.
    let retained = opts.retain_changes;
    progress(&format!(
        "steady run: filling the log to {}",
        count(retained)
    ));
    fill(&hub, 0, retained).await;
    procs::poll(
        "the hub to publish the fill",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async { (bench_channel(&hub).await?.2 >= retained).then_some(()) },
    )
    .await;
    subscribe(&hub, &ctx.nginx, 0, STEADY_SUBSCRIBERS).await;
    let ws_url = format!("{}/ws", hub.base.replace("http://", "ws://"));
    let live = serde_json::json!({"op": "subscribe", "channel": "bench"}).to_string();
    let mut websockets = open_websockets(&ws_url, STEADY_WEBSOCKETS, Some(&live)).await;

    let step = steady_step();
    let length = step * STEADY_STEPS;
    let cpu0 = hub.cpu_seconds();
    let start = tokio::time::Instant::now();
    let stop = start + length;
    let feeder = async {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(10.0 / STEADY_RATE));
        // A stall is made up for afterwards: the run publishes rate × length in all.
        tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
        let (mut requests, mut last) = (0u64, 0);
        loop {
            tick.tick().await;
            if tokio::time::Instant::now() >= stop {
                break;
            }
            last = hub
                .post_changes("bench", changes_body(10))
                .await
                .1
                .max(last);
            requests += 1;
        }
        (requests, last)
    };
    let reader = async {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let (mut reads, mut failed) = (0, 0);
        loop {
            tick.tick().await;
            if tokio::time::Instant::now() >= stop {
                break;
            }
            let (r, f) = steady_reads(&hub).await;
            reads += r;
            failed += f;
        }
        (reads, failed)
    };
    let sampler = async {
        let mut samples = Vec::new();
        for k in 0..=STEADY_STEPS {
            tokio::time::sleep_until(start + step * k).await;
            let rss = hub.rss();
            let published = bench_channel(&hub).await.map_or(0, |c| c.2);
            let (delivered, _) = hub.deliveries().await;
            if k % 6 == 0 {
                progress(&format!(
                    "steady run: {} of {}, RSS {:.0} MiB",
                    span(step * k),
                    span(length),
                    rss as f64 / 1_048_576.0
                ));
            }
            samples.push(Sample {
                rss,
                published,
                delivered,
            });
        }
        samples
    };
    let ((requests, posted), (reads, read_errors), samples) = tokio::join!(feeder, reader, sampler);
    let cpu = (hub.cpu_seconds() - cpu0) * 100.0 / length.as_secs_f64();

    // Nothing lost: every acknowledged change published, every subscriber at the head.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (published, behind) = loop {
        let published = bench_channel(&hub).await.map_or(0, |c| c.2);
        let behind = bench_lag(&hub).await.unwrap_or(u64::MAX);
        if (published >= posted && behind == 0) || Instant::now() >= deadline {
            break (published, behind);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let (_, failed) = hub.deliveries().await;
    websockets.abort_all();
    while websockets.join_next().await.is_some() {}
    Steady {
        empty_rss,
        samples,
        posted,
        published,
        behind,
        failed,
        rate: (requests * 10) as f64 / length.as_secs_f64(),
        cpu,
        reads,
        read_errors,
    }
}

async fn steady(ctx: &mut Ctx) {
    let step = steady_step();
    let length = step * STEADY_STEPS;
    let mut runs = Vec::new();
    for bin in ctx.bins.clone() {
        progress(&format!("steady run: {}", span(length)));
        runs.push(steady_run(ctx, &bin).await);
    }
    fn mib(bytes: u64) -> f64 {
        bytes as f64 / 1_048_576.0
    }
    let name = format!("7. steady run of {}", span(length));
    let warm = span(step * STEADY_WARM as u32);
    type Get = fn(&Steady) -> (f64, Option<f64>);
    let rows: [(String, Unit, Goal, Get); 5] = [
        (
            format!("{name}: hub RSS at {warm} (baseline: empty)"),
            Unit::MiB,
            Goal::None,
            |r| (mib(r.warm()), Some(mib(r.empty_rss))),
        ),
        (
            format!("{name}: hub RSS at the end (baseline: at {warm})"),
            Unit::MiB,
            Goal::RatioAtMost(1.10),
            |r| (mib(r.end()), Some(mib(r.warm()))),
        ),
        (
            format!(
                "{name}: hub RSS at most, `--cache-size {}`",
                steady_cache_mib()
            ),
            Unit::MiB,
            Goal::AtMost((steady_cache_mib() + STEADY_ALLOWANCE_MIB) as f64),
            |r| (mib(r.max()), None),
        ),
        (
            format!("{name}: changes not published or not delivered at the end"),
            Unit::Count,
            Goal::AtMost(0.0),
            |r| (r.lost() as f64, None),
        ),
        (
            format!("{name}: failed deliveries"),
            Unit::Count,
            Goal::AtMost(0.0),
            |r| (r.failed as f64, None),
        ),
    ];
    for (figure, unit, goal, get) in rows {
        let per_bin: Vec<_> = runs.iter().map(get).collect();
        ctx.row(figure, unit, goal, &per_bin);
    }
    let mut rows = Vec::new();
    for k in (0..=STEADY_STEPS as usize).step_by(STEADY_WARM) {
        let mut row = vec![span(step * k as u32)];
        for r in &runs {
            let s = &r.samples[k];
            let minute = &r.samples[k.saturating_sub(STEADY_WARM - 1)..=k];
            let top = minute.iter().map(|s| s.rss).max().unwrap();
            row.push(format!("{:.0}", mib(s.rss)));
            row.push(format!("{:.0}", mib(top)));
            row.push(count(s.published));
            row.push(count(s.delivered));
        }
        rows.push(row);
    }
    let mut header = vec![
        "time",
        "RSS MiB",
        "largest sample since the last row, MiB",
        "changes published",
        "deliveries",
    ];
    if runs.len() > 1 {
        header.extend(["before: RSS MiB", "largest", "published", "deliveries"]);
    }
    ctx.report.table(
        &format!("Steady run: hub RSS over {}", span(length)),
        &header,
        &rows,
    );
    let r = &runs[0];
    ctx.report.note(format!(
        "**7. Steady run** (only with `BENCH_ONLY=steady`): a fresh hub, embedded store, \
         `--cache-size {cache} --retain-changes {retain}` (defaults otherwise: \
         `--max-batch 1000 --linger 100ms`), its log filled to the retention first \
         (1,000-change requests, 8 at a time, until `/channels` shows them published), then \
         {STEADY_SUBSCRIBERS} subscribers on nginx as in figure 1 and {STEADY_WEBSOCKETS} \
         websockets subscribed live to `bench`; then for {length}: 10-change requests to \
         `bench` one at a time on a fixed schedule of {rate} changes/s (each change to a new \
         resource; {achieved} changes/s acknowledged, the last seq {posted}), and once a \
         second the topic, the topic with gzip, the archive, a closed list picked from it at \
         random and {STEADY_PAGES} `changes?after=R&limit=1000` pages with R uniform over the \
         newer 90% of the retained log ({reads} reads, {read_errors} not 2xx). VmRSS at the \
         start of the load and every {step}: the first row is the sample at {warm} against \
         the RSS of the hub once settled after its start, empty; the second the last sample \
         against it (the ratio is the growth); the third the largest sample, against \
         `--cache-size` + {STEADY_ALLOWANCE_MIB} MiB (the caches, all bounded by `--cache-size` \
         and filled by the reads, plus {STEADY_ALLOWANCE_MIB} MiB for the rest). Once the load stopped (at most 120 s more): the changes acknowledged but not \
         in `/channels`' `published`, plus the subscriptions' lag summed ({published} \
         published; lag {behind}); failed deliveries: outcomes other than `delivered` in \
         `/metrics`. Hub CPU over the load: {cpu:.0}% of one core.",
        cache = steady_cache_mib(),
        retain = count(scale(STEADY_RETAIN)),
        length = span(length),
        rate = count(STEADY_RATE as u64),
        achieved = si(r.rate),
        posted = count(r.posted),
        reads = count(r.reads),
        read_errors = r.read_errors,
        step = span(step),
        warm = span(step * STEADY_WARM as u32),
        published = count(r.published),
        behind = r.behind,
        cpu = r.cpu
    ));
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let role = std::env::var("BENCH_ROLE").unwrap_or_default();
    if !role.is_empty() {
        let port: u16 = std::env::var("BENCH_PORT").unwrap().parse().unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        match role.as_str() {
            "minimal-websocket" => runtime.block_on(minimal_websocket_server(port)),
            "minimal-ingest" => runtime.block_on(minimal_ingest_server(port, Floor::Answer)),
            "minimal-durable-ingest" => {
                let dir = PathBuf::from(std::env::var_os("BENCH_DIR").unwrap());
                runtime.block_on(minimal_ingest_server(port, Floor::Disk(dir)))
            }
            "minimal-redis-ingest" => {
                let url = std::env::var("BENCH_REDIS").unwrap();
                runtime.block_on(minimal_ingest_server(port, Floor::Redis(url)))
            }
            other => panic!("unknown BENCH_ROLE {other}"),
        }
        return;
    }
    let nofile = procs::raise_nofile();
    if nofile < 11_000 {
        eprintln!(
            "warning: the open-file limit is {nofile}; 10,000 subscribers and websockets need \
             more than 20,000 (run through scripts/bench.sh, or raise `ulimit -n`)"
        );
    }
    let hub = std::env::var_os("BENCH_HUB_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_changehub")));
    let mut bins = vec![hub];
    bins.extend(std::env::var_os("BENCH_BEFORE_BIN").map(PathBuf::from));
    for bin in &bins {
        assert!(bin.exists(), "no hub binary at {}", bin.display());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut ctx = Ctx {
            nginx: Nginx::start(nofile).await,
            redis: Redis::start().await,
            scripts: tempfile::tempdir().unwrap(),
            report: Report::new(bins.len() > 1),
            bins,
        };
        let only = std::env::var("BENCH_ONLY").unwrap_or_default();
        let run = |group: &str| only.is_empty() || only.split(',').any(|g| g.trim() == group);
        if run("fanout") {
            fanout(&mut ctx).await;
        }
        if run("callback") {
            callback(&mut ctx).await;
        }
        if run("ingest") {
            ingest(&mut ctx).await;
        }
        if run("documents") {
            documents(&mut ctx).await;
        }
        if run("websockets") {
            websockets(&mut ctx).await;
        }
        // Ten minutes: only when named.
        if only.split(',').any(|g| g.trim() == "steady") {
            steady(&mut ctx).await;
        }

        // How the report names the binary of BENCH_HUB_BIN or BENCH_BEFORE_BIN, when given.
        let label = |var: &str| match var {
            "BENCH_HUB_BIN" => std::env::var("BENCH_HUB_LABEL").ok(),
            "BENCH_BEFORE_BIN" => std::env::var("BENCH_BEFORE_LABEL").ok(),
            _ => None,
        };
        let mut command =
            std::env::var("BENCH_COMMAND").unwrap_or_else(|_| "cargo bench --bench suite".into());
        for var in [
            "BENCH_SCALE",
            "BENCH_ONLY",
            "BENCH_RETAINED",
            "BENCH_SUBSCRIBERS",
            "BENCH_HUB_BIN",
            "BENCH_BEFORE_BIN",
        ] {
            if let Ok(v) = std::env::var(var) {
                let v = label(var).map_or(v, |label| format!("<{label}>"));
                command = format!("{var}={v} {command}");
            }
        }
        // A binary inside the repository is shown by its relative path; the hub by
        // BENCH_HUB_LABEL and the before binary by BENCH_BEFORE_LABEL when given (e.g. "the
        // release build of commit abc1234"): a path outside the repository means nothing to
        // a reader of the report.
        let shown = |bin: &Path| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            bin.strip_prefix(root)
                .map_or_else(|_| bin.display().to_string(), |p| p.display().to_string())
        };
        let hub = label("BENCH_HUB_BIN").unwrap_or_else(|| shown(&ctx.bins[0]));
        let mut bins = vec![("hub".to_string(), hub)];
        if let Some(b) = ctx.bins.get(1) {
            let before = label("BENCH_BEFORE_BIN").unwrap_or_else(|| shown(b));
            bins.push(("before".into(), before));
        }
        let path = std::env::var_os("BENCH_REPORT")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("BENCHMARKS.md"));
        ctx.report.write(&path, &command, &bins);
    });
}
