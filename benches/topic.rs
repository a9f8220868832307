//! Topic benchmark: how big the topic (`changelist.xml`) is and how long it takes to serve at
//! 10⁶ retained changes, now that it holds only the open list, against what it held before the
//! Change List Archive (the newest 50,000 retained changes).
//!
//! One channel (embedded store) takes 10⁶ + 5,000 changes; the hub closes a list every 10,000
//! (the default), so the topic holds 5,000 changes (a topic holds 0 to 9,999). Served by the
//! whole hub over loopback, median of 15 GETs each:
//! - the topic;
//! - the newest 50,000 changes (`changes?after=&limit=50000`): the topic as it was before;
//! - a closed list of 10,000: the largest the topic gets;
//! - the archive (101 closed lists);
//! - baseline: the topic's bytes served from memory by a minimal axum server.
//!
//! Run: `cargo bench --bench topic` (`BENCH_SCALE=0.1` for 10⁵). All traffic stays on
//! 127.0.0.1.

use changehub::store::{EmbeddedStore, Store};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

const BATCH: usize = 5_000;
const RUNS: usize = 15;

#[path = "support/mod.rs"]
mod support;
use support::scale;

/// A change to one of 10,000 resources.
fn change(i: usize) -> changehub::model::NewChange {
    support::change(i % 10_000)
}

/// Median time and size of `RUNS` GETs of `url`.
async fn measure(client: &reqwest::Client, url: &str) -> (Duration, usize) {
    let mut times = Vec::with_capacity(RUNS);
    let mut size = 0;
    for _ in 0..RUNS {
        let started = Instant::now();
        let resp = client.get(url).send().await.unwrap();
        assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
        size = resp.bytes().await.unwrap().len();
        times.push(started.elapsed());
    }
    times.sort();
    (times[RUNS / 2], size)
}

fn report(what: &str, (t, size): (Duration, usize), baseline: Duration) {
    println!(
        "  {what:<48} {:>8.2} MiB  {:>8.1} ms  ({:.1}x the static baseline)",
        size as f64 / 1_048_576.0,
        t.as_secs_f64() * 1000.0,
        t.as_secs_f64() / baseline.as_secs_f64()
    );
}

/// A minimal server that answers every GET with `body`: the baseline.
async fn static_server(body: Vec<u8>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = bytes::Bytes::from(body);
    let app = axum::Router::new().fallback(move || {
        let body = body.clone();
        async move { ([("content-type", "application/xml")], body) }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/")
}

async fn run(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let filled = Instant::now();
    {
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let now = OffsetDateTime::now_utc();
        for start in (0..n).step_by(BATCH) {
            let batch = (start..(start + BATCH).min(n)).map(change).collect();
            store.append("news", batch, None, now).await.unwrap();
        }
    }
    println!(
        "{n} changes appended in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = changehub::config::Config::new(addr, dir.path().to_path_buf())
        .with_channel("news", "bench-token");
    let every = config.channels["news"].retention.list_size as usize;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let hub = tokio::spawn(changehub::run(listener, config, async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::new();
    let base = format!("http://{addr}/channels/news");

    let topic_url = format!("{base}/changelist.xml");
    let topic = client
        .get(&topic_url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let baseline = measure(&client, &static_server(topic.to_vec()).await).await;
    let last_closed = n / every * every;
    let before_after = n.saturating_sub(50_000);
    println!("serving at {n} retained changes, a list closed every {every} (embedded):");
    report("baseline: the topic's bytes, static", baseline, baseline.0);
    report(
        &format!("topic, after ({} changes)", n - last_closed),
        measure(&client, &topic_url).await,
        baseline.0,
    );
    report(
        "topic, before (the newest 50,000 changes)",
        measure(
            &client,
            &format!("{base}/changes?after={before_after}&limit=50000"),
        )
        .await,
        baseline.0,
    );
    if last_closed >= every {
        report(
            &format!("closed list of {every} (the largest topic)"),
            measure(
                &client,
                &format!(
                    "{base}/changelist/{}-{last_closed}.xml",
                    last_closed - every + 1
                ),
            )
            .await,
            baseline.0,
        );
    }
    report(
        &format!("changelist-archive.xml ({} lists)", last_closed / every),
        measure(&client, &format!("{base}/changelist-archive.xml")).await,
        baseline.0,
    );
    let _ = stop.send(());
    let _ = hub.await;
}

fn main() {
    let n = scale(1_000_000) + 5_000;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(n));
}
