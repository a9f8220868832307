//! Redis ingest benchmark: changes/s appended to the Redis store, against raw
//! `redis-benchmark -P 100 XADD` ops/s measured on the same private `redis-server` in the same
//! run (the design's target: ingest ≥ 50% of raw XADD, counted per change).
//!
//! - Baseline: `redis-benchmark -p PORT -P 100 -n N -q XADD bench-stream '*' f v`.
//! - Store: `RedisStore::append` of batches of 100 changes from 16 concurrent tasks (the Lua
//!   script: idempotency check, seq assignment, datetime clamp, 100 `XADD`s, meta, `PUBLISH`).
//! - HTTP: the whole hub (`changehub::run --redis`) taking JSON batches of 100 changes from 16
//!   concurrent sources, 202 after Redis answered.
//!
//! The server runs without persistence by default, like the baseline; `BENCH_REDIS_AOF=everysec`
//! (or `always`) turns the AOF on for all three. Run: `cargo bench --bench redis_ingest`
//! (`BENCH_SCALE=0.2` for a quicker run). Needs `redis-server` and `redis-benchmark`.

use changehub::config::{Config, StoreConfig};
use changehub::model::{ChangeType, NewChange};
use changehub::store::{RedisStore, Store};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BATCH: usize = 100;
const TASKS: usize = 16;
const TOKEN: &str = "bench-token";

#[path = "support/mod.rs"]
mod support;
use support::scale;

struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis() -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let aof = std::env::var("BENCH_REDIS_AOF").ok();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            if aof.is_some() { "yes" } else { "no" },
            "--appendfsync",
            aof.as_deref().unwrap_or("everysec"),
            "--dir",
            dir.path().to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    let end = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < end, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    Server {
        child,
        port,
        _dir: dir,
    }
}

/// ops/s of `redis-benchmark ... -P 100 XADD`.
fn redis_benchmark_xadd(port: u16, n: usize) -> f64 {
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-P",
            "100",
            "-n",
            &n.to_string(),
            "-q",
            "XADD",
            "bench-stream",
            "*",
            "f",
            "v",
        ])
        .output()
        .expect("redis-benchmark");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // "XADD bench-stream * f v: 398406.38 requests per second, p50=…"
    text.split("requests per second")
        .next()
        .and_then(|s| s.rsplit(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("cannot read redis-benchmark output: {text:?}"))
}

fn change(i: usize) -> NewChange {
    NewChange {
        loc: format!("http://example.com/resource/{i}"),
        change: ChangeType::Updated,
        datetime: None,
        lastmod: None,
        hash: Some("md5:1e0d5cb8ef6ba40c99b14c0237be735e".into()),
        length: Some(1234),
        media_type: None,
        links: vec![],
        source: None,
    }
}

/// CPU seconds of Redis's main thread so far (`INFO cpu`).
async fn redis_busy_usec(url: &str) -> f64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| {
            l.starts_with("used_cpu_sys_main_thread:")
                || l.starts_with("used_cpu_user_main_thread:")
        })
        .filter_map(|l| l.split(':').nth(1))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum::<f64>()
        * 1e6
}

/// Changes/s, and the share of the wall time Redis spent executing commands.
async fn store_ingest(url: &str, total: usize) -> (f64, f64) {
    let store: Arc<dyn Store> = Arc::new(RedisStore::open(url).unwrap());
    store.ping().await.unwrap();
    let per_task = total / TASKS / BATCH;
    // The changes are made before the clock starts: this measures the store.
    let work: Vec<Vec<Vec<NewChange>>> = (0..TASKS)
        .map(|t| {
            (0..per_task)
                .map(|b| {
                    (0..BATCH)
                        .map(|i| change((t * per_task + b) * BATCH + i))
                        .collect()
                })
                .collect()
        })
        .collect();
    let busy_before = redis_busy_usec(url).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for batches in work {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for changes in batches {
                store
                    .append("bench", changes, None, time::OffsetDateTime::now_utc())
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let wall = started.elapsed().as_secs_f64();
    let busy = (redis_busy_usec(url).await - busy_before) / 1e6 / wall;
    ((per_task * TASKS * BATCH) as f64 / wall, busy)
}

async fn http_ingest(url: &str, total: usize) -> (f64, f64) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = Config::new(addr, "unused".into()).with_channel("web", TOKEN);
    config.store = StoreConfig::Redis { url: url.into() };
    config.max_body = 64 << 20;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let hub = tokio::spawn(changehub::run(listener, config, async {
        let _ = stopped.await;
    }));
    let hub_url = format!("http://{addr}");
    let client = reqwest::Client::new();
    let end = Instant::now() + Duration::from_secs(10);
    while !client
        .get(format!("{hub_url}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(Instant::now() < end, "hub not ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let per_task = total / TASKS / BATCH;
    let body: Vec<serde_json::Value> = (0..BATCH)
        .map(|i| {
            serde_json::json!({"loc": format!("http://example.com/r/{i}"), "change": "updated",
                "hash": "md5:1e0d5cb8ef6ba40c99b14c0237be735e", "length": 1234})
        })
        .collect();
    let body = Arc::new(serde_json::to_vec(&body).unwrap());
    let busy_before = redis_busy_usec(url).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let client = client.clone();
        let body = body.clone();
        let url = format!("{hub_url}/channels/web/changes");
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_task {
                let resp = client
                    .post(&url)
                    .bearer_auth(TOKEN)
                    .header("content-type", "application/json")
                    .body(body.as_ref().clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 202);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let wall = started.elapsed().as_secs_f64();
    let busy = (redis_busy_usec(url).await - busy_before) / 1e6 / wall;
    let rate = (per_task * TASKS * BATCH) as f64 / wall;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), hub).await;
    (rate, busy)
}

#[tokio::main]
async fn main() {
    let server = start_redis();
    let url = format!("redis://127.0.0.1:{}/", server.port);
    let n = scale(200_000);
    let xadd = redis_benchmark_xadd(server.port, n);
    let (store, store_busy) = store_ingest(&url, n).await;
    let (http, http_busy) = http_ingest(&url, n).await;
    let aof = std::env::var("BENCH_REDIS_AOF").unwrap_or_else(|_| "off".into());
    println!("redis ingest (AOF {aof}), {n} changes each, batches of {BATCH}, {TASKS} concurrent:");
    println!("  raw redis-benchmark -P 100 XADD: {xadd:>12.0} ops/s");
    println!(
        "  RedisStore::append:              {store:>12.0} changes/s  ({:.0}% of XADD; Redis busy {:.0}% of the time)",
        100.0 * store / xadd,
        100.0 * store_busy
    );
    println!(
        "  HTTP ingest (whole hub):         {http:>12.0} changes/s  ({:.0}% of XADD; Redis busy {:.0}% of the time)",
        100.0 * http / xadd,
        100.0 * http_busy
    );
    println!(
        "  (machine: {} CPUs, load average {})",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split(' ')
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
}
