//! Idle websockets: resident memory per connection at 10,000 connections, and the time for one
//! notification to reach all of them (p50/p99), each against a baseline from the same run.
//!
//! The hub runs as its own process (the release binary) so that its resident memory can be
//! read from `/proc`. Each connection subscribes to one channel, live. One change is pushed;
//! every client timestamps the arrival of its notification; latency counts from the moment
//! the source sends its request (so it includes ingest, the durable append and the linger). Baseline: a minimal axum websocket server (this same bench binary, started as a child
//! process with `BENCH_ROLE=minimal`) holding the same number of idle connections, which
//! broadcasts one message to all of them on request.
//!
//! Run: `cargo bench --bench websocket_idle` (`BENCH_CONNECTIONS=2000` for a quicker run).
//! Every connection goes to 127.0.0.1; the counts are bounded.

use axum::extract::ws::{Message as AxumMessage, WebSocketUpgrade};
use axum::extract::State;
use axum::routing::{get, post};
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

fn connections() -> usize {
    std::env::var("BENCH_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Resident memory of a process, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn wait_http(url: &str) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.get(url).send().await.is_err() {
        assert!(Instant::now() < deadline, "{url} did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens `n` idle connections; `subscribe` is sent on each; returns a receiver of the arrival
/// times of the first frame after the `ready` frame count is reached on each connection.
async fn open_clients(
    url: &str,
    n: usize,
    subscribe: Option<String>,
    frames_before_ready: usize,
) -> (
    mpsc::UnboundedReceiver<()>,
    mpsc::UnboundedReceiver<Instant>,
) {
    let (ready_tx, ready_rx) = mpsc::unbounded_channel();
    let (arrival_tx, arrival_rx) = mpsc::unbounded_channel();
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let parallel = Arc::new(tokio::sync::Semaphore::new(200));
    for _ in 0..n {
        let url = url.to_string();
        let subscribe = subscribe.clone();
        let ready_tx = ready_tx.clone();
        let arrival_tx = arrival_tx.clone();
        let parallel = parallel.clone();
        tokio::spawn(async move {
            let permit = parallel.acquire_owned().await.unwrap();
            let (mut ws, _) =
                tokio_tungstenite::connect_async_with_config(url.as_str(), Some(config), true)
                    .await
                    .expect("connect");
            if let Some(s) = subscribe {
                ws.send(Message::Text(s.into())).await.unwrap();
            }
            let mut seen = 0;
            while seen < frames_before_ready {
                if let Some(Ok(Message::Text(_))) = ws.next().await {
                    seen += 1;
                }
            }
            drop(permit);
            let _ = ready_tx.send(());
            while let Some(msg) = ws.next().await {
                if let Ok(Message::Text(_)) = msg {
                    let _ = arrival_tx.send(Instant::now());
                }
            }
        });
    }
    (ready_rx, arrival_rx)
}

async fn wait_count<T>(rx: &mut mpsc::UnboundedReceiver<T>, n: usize, what: &str) -> Vec<T> {
    let mut got = Vec::with_capacity(n);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while got.len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(v)) => got.push(v),
            _ => panic!("{what}: only {} of {n}", got.len()),
        }
    }
    got
}

fn percentiles(mut latencies: Vec<Duration>) -> (Duration, Duration) {
    latencies.sort();
    let at = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    (at(0.50), at(0.99))
}

struct Measured {
    bytes_per_connection: f64,
    p50: Duration,
    p99: Duration,
}

async fn measure(
    pid: u32,
    ws_url: &str,
    subscribe: Option<String>,
    frames_before_ready: usize,
    trigger: impl std::future::Future<Output = Instant>,
) -> Measured {
    let n = connections();
    // A few connections first, so that lazily allocated state is not counted per connection.
    let (mut warm_ready, _warm) =
        open_clients(ws_url, 10, subscribe.clone(), frames_before_ready).await;
    wait_count(&mut warm_ready, 10, "warm-up connections").await;
    tokio::time::sleep(Duration::from_millis(500)).await; // let the server settle before reading RSS
    let before = rss(pid);
    let (mut ready, mut arrivals) = open_clients(ws_url, n, subscribe, frames_before_ready).await;
    wait_count(&mut ready, n, "connections ready").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss(pid);
    let start = trigger.await;
    let times = wait_count(&mut arrivals, n, "notification arrivals").await;
    let (p50, p99) = percentiles(
        times
            .into_iter()
            .map(|t| t.saturating_duration_since(start))
            .collect(),
    );
    Measured {
        bytes_per_connection: after.saturating_sub(before) as f64 / n as f64,
        p50,
        p99,
    }
}

async fn bench_hub() -> Measured {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_changehub"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--channel",
            "bench=token",
            "--ws-max-connections-per-ip",
            "100000",
            "--ws-ping",
            "1h",
            "--linger",
            "1ms",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start the hub");
    let server = Server { child, port };
    let base = format!("http://127.0.0.1:{}", server.port);
    wait_http(&format!("{base}/healthz")).await;
    let subscribe = serde_json::json!({"op": "subscribe", "channel": "bench"}).to_string();
    let client = reqwest::Client::new();
    let push = async {
        let sent = Instant::now();
        let resp = client
            .post(format!("{base}/channels/bench/changes"))
            .bearer_auth("token")
            .json(&serde_json::json!({"loc": "http://example.com/one", "change": "updated"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        sent
    };
    // subscribed + caught_up before the connection counts as ready.
    let m = measure(
        server.child.id(),
        &format!("ws://127.0.0.1:{}/ws", server.port),
        Some(subscribe),
        2,
        push,
    )
    .await;
    drop(server);
    m
}

async fn bench_minimal() -> Measured {
    let port = free_port();
    let child = Command::new(std::env::current_exe().unwrap())
        .env("BENCH_ROLE", "minimal")
        .env("BENCH_PORT", port.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the minimal server");
    let server = Server { child, port };
    let base = format!("http://127.0.0.1:{}", server.port);
    wait_http(&format!("{base}/healthz")).await;
    let client = reqwest::Client::new();
    let trigger = async {
        let sent = Instant::now();
        let resp = client
            .post(format!("{base}/broadcast"))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success());
        sent
    };
    let m = measure(
        server.child.id(),
        &format!("ws://127.0.0.1:{}/ws", server.port),
        None,
        0,
        trigger,
    )
    .await;
    drop(server);
    m
}

/// The baseline server: idle websockets that get one broadcast message on `POST /broadcast`.
async fn minimal_server(port: u16) {
    let (tx, _) = broadcast::channel::<String>(16);
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/ws",
            get(
                |ws: WebSocketUpgrade, State(tx): State<broadcast::Sender<String>>| async move {
                    ws.read_buffer_size(1024)
                        .write_buffer_size(0)
                        .on_upgrade(move |mut socket| async move {
                            let mut rx = tx.subscribe();
                            loop {
                                tokio::select! {
                                    msg = rx.recv() => match msg {
                                        Ok(text) => {
                                            if socket.send(AxumMessage::Text(text.into())).await.is_err() {
                                                return;
                                            }
                                        }
                                        Err(_) => return,
                                    },
                                    incoming = socket.recv() => if incoming.is_none() { return },
                                }
                            }
                        })
                },
            ),
        )
        .route(
            "/broadcast",
            post(|State(tx): State<broadcast::Sender<String>>| async move {
                let _ = tx.send(r#"{"type":"notification","changes":[]}"#.to_string());
                "sent"
            }),
        )
        .with_state(tx);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    axum::serve(listener, app).await.unwrap();
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if std::env::var("BENCH_ROLE").as_deref() == Ok("minimal") {
        let port: u16 = std::env::var("BENCH_PORT").unwrap().parse().unwrap();
        runtime.block_on(minimal_server(port));
        return;
    }
    runtime.block_on(async {
        let n = connections();
        let hub = bench_hub().await;
        let minimal = bench_minimal().await;
        let kib = |b: f64| b / 1024.0;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "idle websockets: {n} connections, one subscription each\n  \
             hub:      {:>6.1} KiB/connection   push to all received: p50 {:>7.1} ms  p99 {:>7.1} ms\n  \
             baseline: {:>6.1} KiB/connection   one broadcast to all:    p50 {:>7.1} ms  p99 {:>7.1} ms\n  \
             ratio (hub/baseline): memory {:.2}, p50 {:.2}, p99 {:.2}",
            kib(hub.bytes_per_connection),
            ms(hub.p50),
            ms(hub.p99),
            kib(minimal.bytes_per_connection),
            ms(minimal.p50),
            ms(minimal.p99),
            hub.bytes_per_connection / minimal.bytes_per_connection,
            ms(hub.p50) / ms(minimal.p50),
            ms(hub.p99) / ms(minimal.p99),
        );
    });
}
