//! Resource index benchmark: what the per-resource index costs on disk (embedded store) and in
//! memory (Redis) at 10⁶ resources, and how long the Resource List takes to serve.
//!
//! Each store takes the same 10⁶ changes twice, on two channels: once all to one `loc` (the
//! index holds one entry; the log holds everything) and once each to its own `loc` (the index
//! holds 10⁶ entries). The difference is the index's cost, measured in the same run:
//! - embedded: the size of the two redb files;
//! - Redis: `MEMORY USAGE` of the index keys (`res`, `res-seq`) against that of the log
//!   stream, on a private `redis-server`.
//!
//! Then the Resource List of the big channel is served by the whole hub (embedded store): the
//! index document and every page, against a `changes?after=` page of the same size as a
//! baseline.
//!
//! Run: `cargo bench --bench resource_index` (`BENCH_SCALE=0.1` for 10⁵). Needs
//! `redis-server`. All traffic stays on 127.0.0.1.

use changehub::store::{EmbeddedStore, RedisStore, Store};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// The tests' private `redis-server` (a unix socket in a temporary folder, no persistence).
#[path = "../tests/common/redis_server.rs"]
mod redis_server;

const BATCH: usize = 1000;

#[path = "support/mod.rs"]
mod support;
use support::{change, scale};

/// Appends `n` changes to `channel`: to `n` different locs, or all to one.
async fn fill(store: &dyn Store, channel: &str, n: usize, distinct: bool) -> Duration {
    let started = Instant::now();
    let now = OffsetDateTime::now_utc();
    for start in (0..n).step_by(BATCH) {
        let batch = (start..(start + BATCH).min(n))
            .map(|i| change(if distinct { i } else { 0 }))
            .collect();
        store.append(channel, batch, None, now).await.unwrap();
    }
    started.elapsed()
}

fn file_size(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join("changehub.redb")).unwrap().len()
}

async fn embedded(n: usize) {
    let one = tempfile::tempdir().unwrap();
    let many = tempfile::tempdir().unwrap();
    let t_one = {
        let store = EmbeddedStore::open(one.path()).unwrap();
        fill(&store, "c", n, false).await
    };
    let t_many = {
        let store = EmbeddedStore::open(many.path()).unwrap();
        fill(&store, "c", n, true).await
    };
    let (a, b) = (file_size(one.path()), file_size(many.path()));
    println!("embedded, {n} changes:");
    println!(
        "  one loc:   file {:>6.1} MiB, appended in {:.1} s",
        a as f64 / 1048576.0,
        t_one.as_secs_f64()
    );
    println!(
        "  {n} locs: file {:>6.1} MiB, appended in {:.1} s",
        b as f64 / 1048576.0,
        t_many.as_secs_f64()
    );
    println!(
        "  index: {:.0} bytes per resource on disk ({:.2}x the file without it); appends {:.2}x the time",
        b.saturating_sub(a) as f64 / n as f64,
        b as f64 / a as f64,
        t_many.as_secs_f64() / t_one.as_secs_f64()
    );
}

async fn memory_usage(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    let used: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await
        .unwrap();
    used.unwrap_or(0)
}

async fn redis(n: usize) {
    let server = redis_server::RedisServer::start(false);
    let url = server.url();
    let store = RedisStore::open(&url).unwrap();
    let t_one = fill(&store, "one", n, false).await;
    let t_many = fill(&store, "many", n, true).await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let log = memory_usage(&mut conn, "changehub:{many}:log").await;
    let res = memory_usage(&mut conn, "changehub:{many}:res").await;
    let res_seq = memory_usage(&mut conn, "changehub:{many}:res-seq").await;
    println!("redis, {n} changes:");
    println!(
        "  log stream {:.1} MiB; index: hash {:.1} MiB + sorted set {:.1} MiB = {:.0} bytes per resource ({:.2}x the log)",
        log as f64 / 1048576.0,
        res as f64 / 1048576.0,
        res_seq as f64 / 1048576.0,
        (res + res_seq) as f64 / n as f64,
        (res + res_seq) as f64 / log as f64
    );
    println!(
        "  appends: {:.1} s with {n} locs, {:.1} s all to one loc ({:.2}x)",
        t_many.as_secs_f64(),
        t_one.as_secs_f64(),
        t_many.as_secs_f64() / t_one.as_secs_f64()
    );
}

/// Serves the Resource List of `n` resources through the hub, against `changes?after=` pages.
async fn serving(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = EmbeddedStore::open(dir.path()).unwrap();
        fill(&store, "news", n, true).await;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = changehub::config::Config::new(addr, dir.path().to_path_buf())
        .with_channel("news", "bench-token");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let hub = tokio::spawn(changehub::run(listener, config, async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::new();
    let base = format!("http://{addr}");
    let get = |url: String| {
        let client = client.clone();
        async move {
            let started = Instant::now();
            let body = client.get(url).send().await.unwrap().bytes().await.unwrap();
            (started.elapsed(), body)
        }
    };
    let (t_index, index) = get(format!("{base}/channels/news/resourcelist.xml")).await;
    let text = String::from_utf8_lossy(&index).to_string();
    // Up to 50,000 resources the answer is the Resource List itself (its <loc>s are the
    // resources, not to be fetched); above, an index whose <loc>s are this hub's pages.
    let pages: Vec<String> = if text.contains("<sitemapindex") {
        text.split("<loc>")
            .skip(1)
            .filter_map(|p| p.split_once("</loc>").map(|(l, _)| l.replace("&amp;", "&")))
            .filter(|page| page.starts_with(&base))
            .collect()
    } else {
        Vec::new()
    };
    // A single Resource List counts as its own one page.
    let (mut t_pages, mut bytes) = if pages.is_empty() {
        (t_index, index.len())
    } else {
        (Duration::ZERO, 0)
    };
    for page in &pages {
        let (t, body) = get(page.clone()).await;
        t_pages += t;
        bytes += body.len();
    }
    let mut t_changes = Duration::ZERO;
    let per_page = 50_000.min(n);
    for i in 0..pages.len().max(1) {
        let after = (i * per_page) as u64;
        let url = format!("{base}/channels/news/changes?after={after}&limit={per_page}");
        t_changes += get(url).await.0;
    }
    println!("serving, {n} resources (embedded):");
    println!(
        "  resourcelist.xml: {} bytes in {:.1} ms ({} pages)",
        index.len(),
        t_index.as_secs_f64() * 1000.0,
        pages.len()
    );
    println!(
        "  all pages: {:.1} MiB in {:.0} ms; the same number of changes?after= pages of {per_page}: {:.0} ms ({:.2}x)",
        bytes as f64 / 1048576.0,
        t_pages.as_secs_f64() * 1000.0,
        t_changes.as_secs_f64() * 1000.0,
        t_pages.as_secs_f64() / t_changes.as_secs_f64()
    );
    let _ = stop.send(());
    let _ = hub.await;
}

fn main() {
    let n = scale(1_000_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        embedded(n).await;
        redis(n).await;
        serving(n).await;
    });
}
