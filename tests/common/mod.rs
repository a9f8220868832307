//! Test harness: the real hub on `127.0.0.1:0`, real callback receivers, and helpers that wait
//! for conditions with deadlines.
#![allow(dead_code)]

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use changehub::config::Config;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};

pub const CHANNEL: &str = "news";
pub const TOKEN: &str = "publisher-token";
pub const ADMIN: &str = "admin-token";

/// Waits until `cond` holds, checking whenever `notify` fires or every 20 ms, failing after
/// `deadline`.
pub async fn wait_until<F, Fut>(what: &str, deadline: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if cond().await {
            return;
        }
        if tokio::time::Instant::now() >= end {
            panic!("timed out after {deadline:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running hub.
pub struct TestHub {
    pub addr: SocketAddr,
    pub url: String,
    pub client: reqwest::Client,
    pub data_dir: PathBuf,
    _dir: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestHub {
    /// A hub with channel `news`, an admin token, private callbacks allowed, quick batching
    /// and quick retries; `tweak` adjusts the configuration.
    pub async fn start(tweak: impl FnOnce(&mut Config)) -> TestHub {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().to_path_buf();
        let mut hub = TestHub::start_in(data_dir, tweak).await;
        hub._dir = Some(dir);
        hub
    }

    pub async fn start_in(data_dir: PathBuf, tweak: impl FnOnce(&mut Config)) -> TestHub {
        // Logs when RUST_LOG asks for them.
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut config = Config::new(addr, data_dir.clone()).with_channel(CHANNEL, TOKEN);
        config.admin_token = Some(ADMIN.into());
        config.allow_private_callbacks = true;
        config.linger = Duration::from_millis(20);
        config.retry_initial = Duration::from_millis(100);
        config.retry_max = Duration::from_secs(2);
        config.delivery_timeout = Duration::from_secs(5);
        tweak(&mut config);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            changehub::run(listener, config, async {
                let _ = stopped.await;
            })
            .await
            .expect("hub failed");
        });
        TestHub {
            addr,
            url: format!("http://{addr}"),
            client: reqwest::Client::new(),
            data_dir,
            _dir: None,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Graceful shutdown; waits for the hub to finish.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("hub did not stop in time")
                .unwrap();
        }
    }

    /// The body of `GET {url}{path}` as text (whatever the status).
    pub async fn text(&self, path: &str) -> String {
        self.client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub fn topic(&self) -> String {
        format!("{}/channels/{CHANNEL}/changelist.xml", self.url)
    }

    /// Pushes a JSON body; returns status and parsed JSON answer.
    pub async fn push_json(&self, body: serde_json::Value) -> (StatusCode, serde_json::Value) {
        self.push_json_to(CHANNEL, TOKEN, body).await
    }

    /// Pushes a JSON body to `channel` with its publisher `token`; returns status and parsed
    /// JSON answer.
    pub async fn push_json_to(
        &self,
        channel: &str,
        token: &str,
        body: serde_json::Value,
    ) -> (StatusCode, serde_json::Value) {
        let resp = self
            .client
            .post(format!("{}/channels/{channel}/changes", self.url))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let json = resp.json().await.unwrap_or(serde_json::Value::Null);
        (status, json)
    }

    /// Pushes `n` changes with locs `http://example.com/{prefix}/{i}`; asserts 202; returns
    /// (first, last).
    pub async fn push(&self, prefix: &str, n: usize) -> (u64, u64) {
        self.push_to(CHANNEL, TOKEN, prefix, n).await
    }

    /// [`TestHub::push`] to `channel` with its publisher `token`.
    pub async fn push_to(&self, channel: &str, token: &str, prefix: &str, n: usize) -> (u64, u64) {
        let changes: Vec<_> = (0..n)
            .map(|i| {
                serde_json::json!({"loc": format!("http://example.com/{prefix}/{i}"), "change": "updated"})
            })
            .collect();
        let (status, json) = self
            .push_json_to(channel, token, serde_json::Value::Array(changes))
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{json}");
        (
            json["first"].as_u64().unwrap(),
            json["last"].as_u64().unwrap(),
        )
    }

    /// Form-encoded POST to /hub.
    pub async fn hub_request(&self, params: &[(&str, &str)]) -> (StatusCode, String) {
        hub_request_at(&self.client, &self.url, params).await
    }

    /// Subscribes `callback` to the `news` topic with extra parameters; asserts 202.
    pub async fn subscribe(&self, callback: &str, extra: &[(&str, &str)]) {
        let topic = self.topic();
        let mut params = vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", topic.as_str()),
            ("hub.callback", callback),
        ];
        params.extend_from_slice(extra);
        let (status, text) = self.hub_request(&params).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    }

    /// The admin view of subscriptions.
    pub async fn subscriptions(&self) -> Vec<serde_json::Value> {
        self.client
            .get(format!("{}/api/subscriptions", self.url))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Waits until a subscription with this callback is active.
    pub async fn wait_subscribed(&self, callback: &str) {
        wait_until(
            &format!("{callback} subscribed"),
            Duration::from_secs(10),
            || async {
                self.subscriptions()
                    .await
                    .iter()
                    .any(|s| s["callback"] == callback)
            },
        )
        .await;
    }

    /// Waits until the batcher has published everything up to `seq` (so that a follower
    /// starting now replays it from the log).
    pub async fn wait_published(&self, seq: u64) {
        self.wait_published_in(CHANNEL, seq).await
    }

    /// The same, for channel `channel`.
    pub async fn wait_published_in(&self, channel: &str, seq: u64) {
        wait_until(
            &format!("{channel} published up to {seq}"),
            Duration::from_secs(10),
            || async {
                // The admin API lists private channels too (`/channels` does not).
                let channels: serde_json::Value = self
                    .client
                    .get(format!("{}/api/channels", self.url))
                    .bearer_auth(ADMIN)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                channels.as_array().unwrap().iter().any(|c| {
                    c["name"] == channel && c["published"].as_u64().is_some_and(|p| p >= seq)
                })
            },
        )
        .await;
    }

    /// Waits until retention has trimmed past `after`: `changes?after=after` answers 410.
    pub async fn wait_trimmed_past(&self, after: u64) {
        let url = format!("{}/channels/{CHANNEL}/changes?after={after}", self.url);
        wait_until(
            "retention trims the log",
            Duration::from_secs(10),
            || async { self.client.get(&url).send().await.unwrap().status() == StatusCode::GONE },
        )
        .await;
    }

    /// Every seq in `changes?after=after`, following `rel=next` pages.
    pub async fn catch_up(&self, after: u64) -> Vec<u64> {
        catch_up(&self.client, &self.url, after).await
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A free port on 127.0.0.1 (for processes that must be told their address).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Serves `app` on `listener` in the background until the returned sender is used or dropped.
pub fn serve_until_stopped(listener: tokio::net::TcpListener, app: Router) -> oneshot::Sender<()> {
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    stop
}

/// Form-encoded POST to `{base}/hub`: (status, body).
pub async fn hub_request_at(
    client: &reqwest::Client,
    base: &str,
    params: &[(&str, &str)],
) -> (StatusCode, String) {
    let body: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish();
    let resp = client
        .post(format!("{base}/hub"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.text().await.unwrap())
}

/// Subscribes `callback` to `channel` of the hub at `base`; asserts 202.
pub async fn subscribe_at(base: &str, channel: &str, callback: &str) {
    let topic = format!("{base}/channels/{channel}/changelist.xml");
    let params = [
        ("hub.mode", "subscribe"),
        ("hub.topic", topic.as_str()),
        ("hub.callback", callback),
    ];
    let (status, text) = hub_request_at(&reqwest::Client::new(), base, &params).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
}

/// GET `{base}{path}` with the admin token, as JSON.
pub async fn admin_json(base: &str, path: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits until the hub at `base` lists exactly `n` subscriptions (admin API).
pub async fn wait_subscriptions(base: &str, n: usize) {
    wait_until(
        &format!("{n} subscriptions at {base}"),
        Duration::from_secs(10),
        || async {
            admin_json(base, "/api/subscriptions")
                .await
                .as_array()
                .is_some_and(|s| s.len() == n)
        },
    )
    .await;
}

/// `changehub serve` as a process of its own on a free port: the harness's channel, admin
/// token, private callbacks, quick batching and retries; `args` adds the store flags
/// (`--data-dir …` or `--redis …`) and anything else. Ready as docker-compose sees it:
/// `changehub healthcheck URL` exits 0. Killed when dropped.
pub struct HubProcess {
    pub child: std::process::Child,
    pub url: String,
}

impl HubProcess {
    pub async fn start(args: &[&str]) -> HubProcess {
        HubProcess::start_on(free_port(), args).await
    }

    /// The same on a given port (to come back on the same address after a kill).
    pub async fn start_on(port: u16, args: &[&str]) -> HubProcess {
        use std::process::{Command, Stdio};
        let child = Command::new(env!("CARGO_BIN_EXE_changehub"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--channel",
                &format!("{CHANNEL}={TOKEN}"),
                "--admin-token",
                ADMIN,
            ])
            .args(["--allow-private-callbacks", "--linger", "20ms"])
            .args(["--retry-initial", "100ms", "--retry-max", "1s"])
            .args(args)
            .env("RUST_LOG", "changehub=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start changehub");
        let url = format!("http://127.0.0.1:{port}");
        wait_until("hub process ready", Duration::from_secs(20), || async {
            let url = url.clone();
            tokio::task::spawn_blocking(move || {
                Command::new(env!("CARGO_BIN_EXE_changehub"))
                    .args(["healthcheck", &url])
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .await
            .unwrap()
        })
        .await;
        HubProcess { child, url }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL (what `Child::kill` sends on Unix), then reap.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for HubProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every seq of the `news` channel of the hub at `base` after `after`, following `rel=next`.
pub async fn catch_up(client: &reqwest::Client, base: &str, after: u64) -> Vec<u64> {
    log_after(client, base, after)
        .await
        .into_iter()
        .map(|(seq, _)| seq)
        .collect()
}

/// Every change of the `news` channel after `after`, with its seq, following `rel=next`.
pub async fn log_after(
    client: &reqwest::Client,
    base: &str,
    after: u64,
) -> Vec<(u64, changehub::model::NewChange)> {
    let mut url = format!("{base}/channels/{CHANNEL}/changes?after={after}&limit=5000");
    let mut changes = Vec::new();
    loop {
        let resp = client.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let body = resp.bytes().await.unwrap();
        let (header, entries) =
            changehub::resourcesync::parse_change_list(&body, &big_limits()).unwrap();
        changes.extend(
            entries
                .into_iter()
                .map(|e| (e.seq.expect("seq on every entry"), e.change)),
        );
        match header.links.iter().find(|l| l.rel == "next") {
            Some(next) => url = next.href.clone(),
            None => return changes,
        }
    }
}

pub fn big_limits() -> changehub::resourcesync::Limits {
    changehub::resourcesync::Limits {
        max_bytes: 64 << 20,
        max_entries: 100_000,
    }
}

/// One request a receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The status the receiver answered.
    pub status: StatusCode,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The seqs in the delivered notification.
    pub fn seqs(&self) -> Vec<u64> {
        let (_, entries) =
            changehub::resourcesync::parse_change_list(&self.body, &big_limits()).unwrap();
        entries.iter().map(|e| e.seq.unwrap()).collect()
    }
}

/// How a receiver answers.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Answer GET verifications with this body instead of the challenge (None: echo it).
    pub challenge_answer: Option<String>,
    /// Status for GET verifications.
    pub verify_status: StatusCode,
    /// Fail the first N POSTs with `fail_status` (and `Retry-After: 1` when set).
    pub fail_first: usize,
    pub fail_status: StatusCode,
    pub retry_after: Option<&'static str>,
    /// Answer every POST with this status.
    pub post_status: StatusCode,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            challenge_answer: None,
            verify_status: StatusCode::OK,
            fail_first: 0,
            fail_status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: None,
            post_status: StatusCode::OK,
        }
    }
}

#[derive(Default)]
struct ReceiverLog {
    verifications: Vec<HashMap<String, String>>,
    posts: Vec<Received>,
}

#[derive(Clone)]
struct ReceiverState {
    behaviour: Arc<Mutex<Behaviour>>,
    log: Arc<Mutex<ReceiverLog>>,
    notify: Arc<Notify>,
}

/// A real callback server on loopback that records what it gets.
pub struct Receiver {
    pub url: String,
    state: ReceiverState,
    stop: Option<oneshot::Sender<()>>,
}

impl Receiver {
    pub async fn start(behaviour: Behaviour) -> Receiver {
        Receiver::start_at("127.0.0.1:0".parse().unwrap(), "/callback", behaviour).await
    }

    /// Starts on `addr` (to come back on the same port) with callback path `path`.
    pub async fn start_at(addr: SocketAddr, path: &str, behaviour: Behaviour) -> Receiver {
        let state = ReceiverState {
            behaviour: Arc::new(Mutex::new(behaviour)),
            log: Arc::default(),
            notify: Arc::new(Notify::new()),
        };
        let app = Router::new()
            .route(path, get(on_get).post(on_post))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = serve_until_stopped(listener, app);
        Receiver {
            url: format!("http://{addr}{path}"),
            state,
            stop: Some(stop),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        let u = url::Url::parse(&self.url).unwrap();
        SocketAddr::new(u.host_str().unwrap().parse().unwrap(), u.port().unwrap())
    }

    pub fn set_behaviour(&self, f: impl FnOnce(&mut Behaviour)) {
        f(&mut self.state.behaviour.lock().unwrap());
    }

    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    pub fn verifications(&self) -> Vec<HashMap<String, String>> {
        self.state.log.lock().unwrap().verifications.clone()
    }

    pub fn posts(&self) -> Vec<Received> {
        self.state.log.lock().unwrap().posts.clone()
    }

    /// The successfully answered deliveries.
    pub fn delivered(&self) -> Vec<Received> {
        self.posts()
            .into_iter()
            .filter(|p| p.status.is_success())
            .collect()
    }

    /// Every seq from successfully answered deliveries, in arrival order.
    pub fn delivered_seqs(&self) -> Vec<u64> {
        self.delivered().iter().flat_map(|r| r.seqs()).collect()
    }

    /// Waits until `cond` holds for the log, woken by each request.
    pub async fn wait_for(&self, what: &str, deadline: Duration, cond: impl Fn(&Receiver) -> bool) {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            let notified = self.state.notify.notified();
            if cond(self) {
                return;
            }
            let now = tokio::time::Instant::now();
            if now >= end {
                panic!("timed out after {deadline:?} waiting for: {what}");
            }
            let _ = tokio::time::timeout(end - now, notified).await;
        }
    }

    pub async fn wait_verified(&self, n: usize) {
        self.wait_for("verification request", Duration::from_secs(10), |r| {
            r.verifications().len() >= n
        })
        .await;
    }

    /// Waits until the successfully delivered seqs include every seq up to `last`.
    pub async fn wait_seq(&self, last: u64, deadline: Duration) {
        self.wait_for(&format!("delivery up to seq {last}"), deadline, |r| {
            r.delivered_seqs().iter().any(|&s| s >= last)
        })
        .await;
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn on_get(
    State(state): State<ReceiverState>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let behaviour = state.behaviour.lock().unwrap().clone();
    let answer = behaviour
        .challenge_answer
        .clone()
        .or_else(|| query.get("hub.challenge").cloned())
        .unwrap_or_default();
    state.log.lock().unwrap().verifications.push(query);
    state.notify.notify_waiters();
    (behaviour.verify_status, answer).into_response()
}

async fn on_post(State(state): State<ReceiverState>, headers: HeaderMap, body: Bytes) -> Response {
    let behaviour = state.behaviour.lock().unwrap().clone();
    let mut log = state.log.lock().unwrap();
    let failing = log.posts.len() < behaviour.fail_first;
    let status = if failing {
        behaviour.fail_status
    } else {
        behaviour.post_status
    };
    log.posts.push(Received {
        headers,
        body,
        status,
    });
    drop(log);
    state.notify.notify_waiters();
    let mut response = status.into_response();
    if failing {
        if let Some(ra) = behaviour.retry_after {
            response
                .headers_mut()
                .insert("retry-after", ra.parse().unwrap());
        }
    }
    if status.is_redirection() {
        response
            .headers_mut()
            .insert("location", "http://127.0.0.1:9/elsewhere".parse().unwrap());
    }
    response
}

/// A websocket client of the hub's `/ws`.
pub struct WsClient {
    pub stream: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

/// What a websocket read gave.
#[derive(Debug)]
pub enum WsRead {
    Frame(serde_json::Value),
    Closed(Option<(u16, String)>),
}

impl WsClient {
    pub async fn connect(hub: &TestHub, query: &str) -> WsClient {
        WsClient::connect_to(&hub.url, query).await
    }

    /// Connects to the hub whose base URL is `base` (`http://…`).
    pub async fn connect_to(base: &str, query: &str) -> WsClient {
        let url = format!("{}/ws{query}", base.replacen("http://", "ws://", 1));
        let (stream, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        WsClient { stream }
    }

    pub async fn send(&mut self, frame: serde_json::Value) {
        use futures_util::SinkExt;
        self.stream
            .send(tokio_tungstenite::tungstenite::Message::Text(
                frame.to_string().into(),
            ))
            .await
            .unwrap();
    }

    pub async fn subscribe(&mut self, channel: &str, since: Option<u64>) {
        let mut frame = serde_json::json!({"op": "subscribe", "channel": channel});
        if let Some(s) = since {
            frame["since"] = s.into();
        }
        self.send(frame).await;
    }

    /// The next JSON frame or the close, failing after `deadline`.
    pub async fn read(&mut self, deadline: Duration) -> WsRead {
        use futures_util::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        loop {
            let next = tokio::time::timeout(deadline, self.stream.next())
                .await
                .expect("websocket read timed out");
            match next {
                Some(Ok(Message::Text(t))) => {
                    return WsRead::Frame(serde_json::from_str(t.as_str()).unwrap())
                }
                Some(Ok(Message::Close(frame))) => {
                    return WsRead::Closed(frame.map(|f| (u16::from(f.code), f.reason.to_string())))
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return WsRead::Closed(None),
            }
        }
    }

    /// The next JSON frame; panics on close.
    pub async fn frame(&mut self) -> serde_json::Value {
        match self.read(Duration::from_secs(20)).await {
            WsRead::Frame(f) => f,
            WsRead::Closed(c) => panic!("websocket closed: {c:?}"),
        }
    }

    /// Reads frames until a `notification` carrying seq `last` arrived; returns every seq
    /// received (in order) and every frame type seen.
    pub async fn collect_until(&mut self, last: u64) -> (Vec<u64>, Vec<String>) {
        let mut seqs = Vec::new();
        let mut kinds = Vec::new();
        while seqs.last().copied().unwrap_or(0) < last {
            let f = self.frame().await;
            let kind = f["type"].as_str().unwrap().to_string();
            if kind == "notification" {
                let changes = f["changes"].as_array().unwrap();
                let got: Vec<u64> = changes.iter().map(|c| c["seq"].as_u64().unwrap()).collect();
                assert_eq!(f["first"].as_u64(), got.first().copied());
                assert_eq!(f["last"].as_u64(), got.last().copied());
                seqs.extend(got);
            }
            kinds.push(kind);
        }
        (seqs, kinds)
    }
}
