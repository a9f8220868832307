//! `changehub subscribe`, the real binary, against a real hub process and a real file server.
//!
//! The mirror test: a folder of 500 resources served over HTTP is the source; `changehub
//! publish` (from `--scan`, and from hand-written NDJSON) pushes its creates, updates and
//! deletes; `changehub subscribe --mirror` is SIGKILLed and restarted twice, the hub is
//! SIGKILLed and restarted once, and one resource is served with the wrong bytes for a while.
//! At the end the mirror equals the source byte for byte and `--audit` exits 0 — once over
//! WebSub callbacks, once over the websocket. Then: bad input to `subscribe` ends with a clear
//! message and a non-zero exit, and forged deliveries are never applied.

use crate::common::*;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The source's file server: DIR under `/files/`, with some paths answered with other bytes
/// (also the source of the Change Dump tests).
#[derive(Clone)]
pub(crate) struct FileServer {
    dir: PathBuf,
    wrong: Arc<Mutex<HashMap<String, Vec<u8>>>>,
}

async fn serve_file(
    State(server): State<FileServer>,
    UrlPath(path): UrlPath<String>,
) -> axum::response::Response {
    if let Some(bytes) = server.wrong.lock().unwrap().get(&path) {
        return bytes.clone().into_response();
    }
    if path.split('/').any(|s| s == ".." || s.is_empty()) {
        return StatusCode::BAD_REQUEST.into_response();
    }
    match std::fs::read(server.dir.join(&path)) {
        Ok(bytes) => bytes.into_response(),
        Err(_) => StatusCode::NOT_FOUND.into_response(),
    }
}

impl FileServer {
    /// Serves `dir`; returns the server and its base URL (`http://127.0.0.1:P/files/`).
    pub(crate) async fn start(
        dir: &Path,
    ) -> (FileServer, String, tokio::sync::oneshot::Sender<()>) {
        let server = FileServer {
            dir: dir.to_path_buf(),
            wrong: Arc::default(),
        };
        let app = Router::new()
            .route("/files/{*path}", get(serve_file))
            .with_state(server.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/files/", listener.local_addr().unwrap());
        let stop = serve_until_stopped(listener, app);
        (server, base, stop)
    }
}

/// Every file under `dir` (relative path → bytes), hidden ones left out.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if path.is_dir() {
                folders.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                files.insert(rel, bytes);
            }
        }
    }
    files
}

fn content(i: usize, version: usize) -> Vec<u8> {
    format!("resource {i}, version {version}\n")
        .repeat(1 + (i * 7 + version) % 40)
        .into_bytes()
}

fn write(dir: &Path, rel: &str, bytes: &[u8]) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn rel(i: usize) -> String {
    format!("d{}/r {i}.txt", i % 10)
}

fn changehub(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_changehub"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (var, _) in std::env::vars() {
        if var.starts_with("CHANGEHUB_") {
            cmd.env_remove(var);
        }
    }
    cmd
}

/// Runs a command to its end (within 120 s): (exit code, stdout, stderr).
async fn run(args: &[&str]) -> (i32, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(120), changehub(args).output())
        .await
        .unwrap_or_else(|_| panic!("changehub {args:?} did not end"))
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn publish_ok(args: &[&str]) {
    let mut all = vec!["publish"];
    all.extend_from_slice(args);
    let (code, _, err) = run(&all).await;
    assert_eq!(code, 0, "changehub {all:?}: {err}");
}

/// One run of `changehub subscribe`, its stderr appended to a file.
struct Subscriber {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Subscriber {
    /// With stdout discarded (`--mirror … --quiet`).
    fn start(args: &[impl AsRef<std::ffi::OsStr>], log: &Path) -> Subscriber {
        Subscriber::spawn(args, log, Stdio::null())
    }

    fn spawn(args: &[impl AsRef<std::ffi::OsStr>], log: &Path, stdout: Stdio) -> Subscriber {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let mut cmd = changehub(&["subscribe"]);
        cmd.args(args).stdout(stdout).stderr(Stdio::from(file));
        Subscriber {
            child: cmd.spawn().unwrap(),
            log: log.to_path_buf(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn kill9(mut self) {
        self.child.kill().await.unwrap();
    }
}

async fn wait_equal(src: &Path, mirror: &Path, what: &str, deadline: Duration) {
    let end = tokio::time::Instant::now() + deadline;
    loop {
        let (a, b) = (tree(src), tree(mirror));
        if a == b {
            return;
        }
        if tokio::time::Instant::now() >= end {
            let missing: Vec<_> = a.keys().filter(|k| !b.contains_key(*k)).take(5).collect();
            let extra: Vec<_> = b.keys().filter(|k| !a.contains_key(*k)).take(5).collect();
            let differ: Vec<_> = a
                .iter()
                .filter(|(k, v)| b.get(*k).is_some_and(|w| w != *v))
                .map(|(k, _)| k)
                .take(5)
                .collect();
            panic!(
                "timed out after {deadline:?} waiting for {what}: {} vs {} files; missing {missing:?}, extra {extra:?}, differ {differ:?}",
                a.len(),
                b.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Hand-written changes of the files `updated` (with their new hash and length) and
/// `deleted`, as NDJSON.
fn ndjson(base: &str, src: &Path, updated: &[usize], deleted: &[usize]) -> String {
    let loc = |i: usize| format!("{base}{}", rel(i).replace(' ', "%20"));
    let mut lines = String::new();
    for &i in updated {
        let bytes = std::fs::read(src.join(rel(i))).unwrap();
        lines.push_str(
            &serde_json::json!({
                "loc": loc(i),
                "change": "updated",
                "hash": changehub::client::hash::of(&bytes),
                "length": bytes.len(),
            })
            .to_string(),
        );
        lines.push('\n');
    }
    for &i in deleted {
        lines.push_str(&serde_json::json!({"loc": loc(i), "change": "deleted"}).to_string());
        lines.push('\n');
    }
    lines
}

/// What the mirror tests share: a source folder served over HTTP, a hub process with its data
/// folder, and the arguments of `publish --scan` and of `subscribe --mirror`.
struct MirrorSetup {
    dir: tempfile::TempDir,
    src: PathBuf,
    mirror: PathBuf,
    files: FileServer,
    base: String,
    port: u16,
    hub_args: Vec<String>,
    hub: HubProcess,
    subscriber_args: Vec<String>,
    log: PathBuf,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl MirrorSetup {
    /// `hub_flags` are added to the data folder's; the subscriber follows over the websocket
    /// or callbacks, with `subscriber_flags`.
    async fn start(hub_flags: &[&str], via_ws: bool, subscriber_flags: &[&str]) -> MirrorSetup {
        let dir = tempfile::tempdir().unwrap();
        let (src, mirror) = (dir.path().join("src"), dir.path().join("mirror"));
        let (files, base, stop) = FileServer::start(&src).await;
        let port = free_port();
        let mut hub_args = vec!["--data-dir".to_string(), path_arg(&dir.path().join("data"))];
        hub_args.extend(hub_flags.iter().map(|s| s.to_string()));
        let hub = HubProcess::start_on(port, &strs(&hub_args)).await;
        let topic = format!("{}/channels/{CHANNEL}/changelist.xml", hub.url);
        let mut subscriber_args: Vec<String> = [
            topic.as_str(),
            "--state",
            &path_arg(&dir.path().join("subscriber.json")),
            "--mirror",
            &path_arg(&mirror),
            "--base-url",
            &base,
            "--quiet",
        ]
        .map(String::from)
        .to_vec();
        subscriber_args.extend(subscriber_flags.iter().map(|s| s.to_string()));
        if via_ws {
            subscriber_args.extend(["--via".into(), "ws".into()]);
        } else {
            subscriber_args.extend(["--listen".into(), format!("127.0.0.1:{}", free_port())]);
        }
        let log = dir.path().join("subscriber.log");
        MirrorSetup {
            src,
            mirror,
            files,
            base,
            port,
            hub_args,
            hub,
            subscriber_args,
            log,
            dir,
            _stop: stop,
        }
    }

    /// `changehub publish --scan` of the source folder, to its end.
    async fn publish_scan(&self) {
        let scan = [
            "--hub",
            &self.hub.url,
            "--channel",
            CHANNEL,
            "--token",
            TOKEN,
            "--scan",
            &path_arg(&self.src),
            "--base-url",
            &self.base,
            "--state",
            &path_arg(&self.dir.path().join("scan.json")),
        ]
        .map(String::from);
        publish_ok(&strs(&scan)).await;
    }

    /// Everything the subscribers of this setup wrote to stderr.
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn subscriber(&self) -> Subscriber {
        Subscriber::start(&self.subscriber_args, &self.log)
    }

    /// SIGKILLs the hub and starts it again on the same port; `wipe` loses its data first.
    async fn restart_hub(&mut self, wipe: bool) {
        self.hub.kill9();
        if wipe {
            std::fs::remove_dir_all(self.dir.path().join("data")).unwrap();
        }
        self.hub = HubProcess::start_on(self.port, &strs(&self.hub_args)).await;
    }

    /// Waits until the subscriber's state file has saved `seq` as its cursor.
    async fn wait_cursor(&self, seq: u64) {
        let state = self.dir.path().join("subscriber.json");
        wait_until(
            &format!("cursor {seq} saved"),
            Duration::from_secs(30),
            || async {
                std::fs::read(&state)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .is_some_and(|s| s["seq"] == seq)
            },
        )
        .await;
    }

    async fn wait_equal(&self, what: &str) {
        wait_equal(&self.src, &self.mirror, what, Duration::from_secs(60)).await;
    }

    /// `subscribe --audit` of the mirror: (exit code, stdout, stderr).
    async fn audit(&self) -> (i32, String, String) {
        let mut args = vec!["subscribe"];
        // The topic, --state, --mirror and --base-url.
        args.extend(strs(&self.subscriber_args[..7]));
        args.push("--audit");
        run(&args).await
    }
}

fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

async fn mirror_follows_the_source(via_ws: bool) {
    let flags = ["--retry-every", "300ms", "--poll", "1s"];
    let mut setup = MirrorSetup::start(&[], via_ws, &flags).await;
    let (src, mirror) = (setup.src.clone(), setup.mirror.clone());

    // 250 resources before the subscriber starts: its baseline, from the Resource List.
    for i in 0..250 {
        write(&src, &rel(i), &content(i, 0));
    }
    setup.publish_scan().await;
    let subscriber = setup.subscriber();
    setup.wait_equal("the baseline").await;

    // 250 more created, from a scan, while the subscriber is killed and restarted.
    for i in 250..500 {
        write(&src, &rel(i), &content(i, 0));
    }
    let (publishing, scanned) = (setup.publish_scan(), async {
        wait_until(
            "some of the new resources mirrored",
            Duration::from_secs(60),
            || async { tree(&mirror).len() > 250 },
        )
        .await;
        subscriber.kill9().await;
    });
    tokio::join!(publishing, scanned);
    let subscriber = setup.subscriber();
    setup.wait_equal("500 resources").await;

    // The hub restarts; updates and deletes by hand-written NDJSON, one resource served
    // wrong for a while.
    setup.restart_hub(false).await;
    let deleted: Vec<usize> = (4..500).step_by(25).collect();
    let updated: Vec<usize> = (0..500)
        .step_by(9)
        .filter(|i| !deleted.contains(i))
        .collect();
    for &i in &updated {
        write(&src, &rel(i), &content(i, 1));
    }
    for &i in &deleted {
        std::fs::remove_file(src.join(rel(i))).unwrap();
    }
    // Bytes of the right length, but not those the hash was made of.
    let corrupted = rel(9);
    let mut wrong = content(9, 1);
    wrong[0] ^= 1;
    setup
        .files
        .wrong
        .lock()
        .unwrap()
        .insert(corrupted.clone(), wrong.clone());
    let changes_file = setup.dir.path().join("changes.ndjson");
    std::fs::write(&changes_file, ndjson(&setup.base, &src, &updated, &deleted)).unwrap();
    publish_ok(&[
        "--hub",
        &setup.hub.url,
        "--channel",
        CHANNEL,
        "--token",
        TOKEN,
        &path_arg(&changes_file),
    ])
    .await;
    wait_until(
        "the wrong resource is pending",
        Duration::from_secs(60),
        || async { subscriber.log().contains("r%209.txt (seq") },
    )
    .await;
    assert!(subscriber
        .log()
        .contains("r%209.txt (seq 502) is pending: hash: md5 is"));
    assert_ne!(
        std::fs::read(mirror.join(&corrupted)).unwrap(),
        wrong,
        "a resource whose hash does not match was written"
    );
    subscriber.kill9().await;
    // The restarted subscriber still finds it wrong (from its state file's pending resources,
    // or applying the batch again) before the source serves it right.
    let pending = "r%209.txt (seq 502) is pending";
    let before = setup.log_text().matches(pending).count();
    let subscriber = setup.subscriber();
    wait_until(
        "the restarted subscriber finds it wrong too",
        Duration::from_secs(60),
        || async { subscriber.log().matches(pending).count() > before },
    )
    .await;
    setup.files.wrong.lock().unwrap().clear();

    // More changes from a scan: new files, changed files, removed files.
    for i in 500..520 {
        write(&src, &rel(i), &content(i, 0));
    }
    for i in (1..500).step_by(31) {
        if src.join(rel(i)).exists() {
            write(&src, &rel(i), &content(i, 2));
        }
    }
    for i in (2..500).step_by(47) {
        let _ = std::fs::remove_file(src.join(rel(i)));
    }
    setup.publish_scan().await;
    setup.wait_equal("the mirror equals the source").await;

    let (code, out, err) = setup.audit().await;
    assert_eq!(code, 0, "audit: {out}{err}");
    assert!(err.contains("0 difference"), "{err}");
    // The audit notices a file that changed behind the mirror's back.
    std::fs::write(mirror.join(rel(1)), b"tampered").unwrap();
    let (code, out, _) = setup.audit().await;
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("differs\td1/r 1.txt"), "{out}");
    subscriber.kill9().await;
    let log = setup.log_text();
    assert!(log.contains("baseline: 250 resources"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_over_callbacks_equals_its_source_through_kills_and_restarts() {
    mirror_follows_the_source(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_over_the_websocket_equals_its_source_through_kills_and_restarts() {
    mirror_follows_the_source(true).await;
}

/// Stands between the hub and a subscriber's callback server: passes verifications and
/// deliveries on, or, while `lose` is set, acknowledges deliveries without passing them on
/// (`lost`: the last seq of those).
struct Relay {
    url: String,
    lose: Arc<AtomicBool>,
    lost: Arc<AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Clone)]
struct RelayState {
    to: String,
    lose: Arc<AtomicBool>,
    lost: Arc<AtomicUsize>,
    client: reqwest::Client,
}

async fn relay(
    State(relay): State<RelayState>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 64 << 20).await.unwrap();
    let target = format!(
        "{}{}",
        relay.to,
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    if parts.method == axum::http::Method::POST && relay.lose.load(Ordering::SeqCst) {
        // Remember how far the lost deliveries went.
        let last = parts
            .headers
            .get("x-changehub-last")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        relay.lost.fetch_max(last, Ordering::SeqCst);
        return StatusCode::ACCEPTED.into_response();
    }
    let mut forward = relay
        .client
        .request(parts.method.clone(), &target)
        .body(body);
    for (name, value) in &parts.headers {
        if name != axum::http::header::HOST {
            forward = forward.header(name, value);
        }
    }
    match forward.send().await {
        Ok(answer) => {
            let status = answer.status();
            (status, answer.bytes().await.unwrap_or_default()).into_response()
        }
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

impl Relay {
    async fn start(to: &str) -> Relay {
        let (lose, lost) = (Arc::<AtomicBool>::default(), Arc::<AtomicUsize>::default());
        let state = RelayState {
            to: to.to_string(),
            lose: lose.clone(),
            lost: lost.clone(),
            client: reqwest::Client::new(),
        };
        let app = Router::new().fallback(relay).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        Relay {
            url,
            lose,
            lost,
            _stop: serve_until_stopped(listener, app),
        }
    }
}

/// A subscriber printing NDJSON: its stdout's changes collected as they come.
struct Printer {
    sub: Subscriber,
    seqs: Arc<Mutex<Vec<u64>>>,
    locs: Arc<Mutex<Vec<String>>>,
}

impl Printer {
    fn start(args: &[&str], log: &Path) -> Printer {
        use tokio::io::AsyncBufReadExt;
        let mut sub = Subscriber::spawn(args, log, Stdio::piped());
        let stdout = sub.child.stdout.take().unwrap();
        let seqs = Arc::<Mutex<Vec<u64>>>::default();
        let locs = Arc::<Mutex<Vec<String>>>::default();
        let (s, l) = (Arc::clone(&seqs), Arc::clone(&locs));
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let change: serde_json::Value = serde_json::from_str(&line).unwrap();
                s.lock().unwrap().push(change["seq"].as_u64().unwrap());
                l.lock()
                    .unwrap()
                    .push(change["loc"].as_str().unwrap().to_string());
            }
        });
        Printer { sub, seqs, locs }
    }

    fn seqs(&self) -> Vec<u64> {
        self.seqs.lock().unwrap().clone()
    }

    fn log(&self) -> String {
        self.sub.log()
    }

    async fn wait_seq(&self, seq: u64) {
        wait_until(
            &format!("seq {seq} printed"),
            Duration::from_secs(30),
            || async { self.seqs().last().is_some_and(|&s| s >= seq) },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_printed_once_in_order_through_gaps_forgeries_renewals_and_a_kill() {
    let hub = TestHub::start(|c| c.lease_min = Duration::from_secs(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let state_arg = state.display().to_string();
    let log = dir.path().join("subscriber.log");
    let listen = format!("127.0.0.1:{}", free_port());
    let relay = Relay::start(&format!("http://{listen}")).await;
    let callback = format!("{}/changehub-callback", relay.url);
    let topic = hub.topic();
    let args = [
        topic.as_str(),
        "--state",
        &state_arg,
        "--listen",
        &listen,
        "--callback-url",
        &callback,
        "--lease",
        "2s",
        "--poll",
        "1h",
    ];
    hub.push("before", 10).await;
    let mut printer = Printer::start(&args, &log);
    // A new state file starts from everything the hub has.
    printer.wait_seq(10).await;
    hub.wait_subscribed(&callback).await;
    hub.push("live", 10).await;
    printer.wait_seq(20).await;

    // Forged deliveries: unsigned, and signed with another secret. Answered 2xx, not applied.
    let forged = {
        let dt = time::OffsetDateTime::now_utc();
        let change = changehub::model::Change::from_new(
            21,
            changehub::model::NewChange {
                datetime: Some(dt),
                ..changehub::model::NewChange::new(
                    "http://forged.example/x",
                    changehub::model::ChangeType::Created,
                )
            },
            dt,
        );
        changehub::resourcesync::write_change_list(&Default::default(), &[change])
    };
    let direct = format!("http://{listen}/changehub-callback");
    for signature in [
        None,
        Some(changehub::model::signature::signature(
            changehub::model::Algorithm::Sha256,
            b"not the secret",
            &forged,
        )),
    ] {
        let mut request = hub.client.post(&direct).body(forged.clone());
        if let Some(signature) = signature {
            request = request.header("x-hub-signature", signature);
        }
        assert!(request.send().await.unwrap().status().is_success());
    }
    wait_until(
        "both forgeries refused",
        Duration::from_secs(10),
        || async {
            let log = printer.log();
            log.contains("refused a delivery with no signature")
                && log.contains("refused a delivery with a wrong signature")
        },
    )
    .await;
    hub.push("after-forgery", 1).await;
    printer.wait_seq(21).await;
    assert!(
        !printer
            .locs
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("forged")),
        "a forged delivery was applied"
    );

    // Lost deliveries: the relay acknowledges 22..=26 without passing them on; the next
    // notification shows the gap, which the subscriber fills from the archive.
    relay.lose.store(true, Ordering::SeqCst);
    hub.push("lost", 5).await;
    hub.wait_published(26).await;
    wait_until("the relay lost 22..26", Duration::from_secs(10), || async {
        relay.lost.load(Ordering::SeqCst) == 26
    })
    .await;
    relay.lose.store(false, Ordering::SeqCst);
    hub.push("gap", 5).await;
    printer.wait_seq(31).await;
    assert!(
        printer.log().contains("filled a gap: seqs 22..26"),
        "{}",
        printer.log()
    );
    assert_eq!(printer.seqs(), (1..=31).collect::<Vec<_>>());

    // The lease of 2 s is renewed before it ends.
    wait_until("the lease renewed", Duration::from_secs(10), || async {
        printer.log().contains("subscription renewed")
    })
    .await;

    // SIGKILL, more changes, a restart: it goes on right after the saved cursor.
    printer.sub.child.kill().await.unwrap();
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let cursor = saved["seq"].as_u64().unwrap();
    assert_eq!(cursor, 31);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&state).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the state file holds a secret: {mode:o}");
    }
    hub.push("while-down", 5).await;
    let mut again = Printer::start(&args, &log);
    again.wait_seq(36).await;
    assert_eq!(again.seqs(), (32..=36).collect::<Vec<_>>());

    // SIGTERM: it unsubscribes (the hub forgets the callback), then exits 0.
    let pid = again.sub.child.id().unwrap() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(20), again.sub.child.wait())
        .await
        .expect("it exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}: {}", again.log());
    assert!(again.log().contains("unsubscribed"), "{}", again.log());
    wait_until(
        "the subscription is gone",
        Duration::from_secs(10),
        || async { hub.subscriptions().await.is_empty() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_to_subscribe_ends_with_a_clear_message() {
    let hub = TestHub::start(|c| {
        if let Some(channel) = c.channels.get_mut(CHANNEL) {
            channel.read_token = Some("reader".into());
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json").display().to_string();
    let topic = hub.topic();
    // A topic without a hub link.
    let app = Router::new().route("/feed.xml", get(|| async { "<feed/>" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain = format!("http://{}/feed.xml", listener.local_addr().unwrap());
    let _stop = serve_until_stopped(listener, app);
    let unreachable = format!(
        "http://127.0.0.1:{}/channels/news/changelist.xml",
        free_port()
    );
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, b"{not json").unwrap();
    let garbage = garbage.display().to_string();
    let a_file = dir.path().join("a-file");
    std::fs::write(&a_file, b"").unwrap();
    let under_a_file = a_file.join("mirror").display().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![&unreachable, "--state", &state, "--listen", "127.0.0.1:9"],
            "cannot read the topic",
        ),
        (
            vec![&plain, "--state", &state, "--listen", "127.0.0.1:9"],
            "names no hub",
        ),
        (
            vec![&topic, "--state", &state, "--token", "wrong", "--via", "ws"],
            "401",
        ),
        (
            vec![
                &topic, "--state", &garbage, "--token", "reader", "--via", "ws",
            ],
            "is not a state file",
        ),
        (
            vec![
                &topic,
                "--state",
                &state,
                "--token",
                "reader",
                "--mirror",
                &under_a_file,
                "--via",
                "ws",
            ],
            "cannot create the mirror folder",
        ),
        (
            vec![&topic, "--state", &state, "--token", "reader"],
            "--listen ADDR is needed",
        ),
        (
            vec![
                &topic,
                "--state",
                &state,
                "--token",
                "reader",
                "--listen",
                "0.0.0.0:9",
            ],
            "give --callback-url",
        ),
        (
            vec![&topic, "--state", &state, "--token", "reader", "--audit"],
            "go with --mirror",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["subscribe"];
        all.extend(args.iter().copied());
        let (code, _, err) = run(&all).await;
        assert_eq!(code, 2, "{all:?}: {err}");
        assert!(
            err.contains(expected),
            "{all:?}: expected {expected:?} in {err}"
        );
        assert!(err.starts_with("changehub: "), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(!dir.path().join("state.json").exists());
}

/// Retention drops what a stopped mirror missed, then the hub loses its data: each time the
/// mirror starts again from the Resource List and ends equal to the source.
async fn a_mirror_starts_again_when_its_changes_are_gone(via_ws: bool) {
    let retention = [
        "--retain-changes",
        "20",
        "--archive-every",
        "10",
        "--trim-interval",
        "100ms",
    ];
    let mut setup = MirrorSetup::start(&retention, via_ws, &["--poll", "500ms"]).await;
    let src = setup.src.clone();
    for i in 0..30 {
        write(&src, &rel(i), &content(i, 0));
    }
    setup.publish_scan().await;
    let subscriber = setup.subscriber();
    setup.wait_equal("the baseline").await;
    setup.wait_cursor(30).await;
    subscriber.kill9().await;

    // While it is stopped: 65 changes, and retention keeps only the last 20 or so.
    for version in 1..=2 {
        for i in 0..30 {
            write(&src, &rel(i), &content(i, version));
        }
        setup.publish_scan().await;
    }
    for i in 0..5 {
        std::fs::remove_file(src.join(rel(i))).unwrap();
    }
    setup.publish_scan().await;
    let client = reqwest::Client::new();
    let after_baseline = format!("{}/channels/{CHANNEL}/changes?after=30", setup.hub.url);
    wait_until(
        "retention dropped seq 31",
        Duration::from_secs(30),
        || async {
            let status = client.get(&after_baseline).send().await.unwrap().status();
            status == StatusCode::GONE
        },
    )
    .await;
    let subscriber = setup.subscriber();
    setup.wait_equal("the mirror after retention").await;
    let log = subscriber.log();
    assert!(log.contains("retention dropped seqs 31.."), "{log}");

    // The hub loses its data; the source publishes everything again into the new log.
    setup.restart_hub(true).await;
    std::fs::remove_file(setup.dir.path().join("scan.json")).unwrap();
    for i in 30..35 {
        write(&src, &rel(i), &content(i, 0));
    }
    setup.publish_scan().await;
    setup.wait_equal("the mirror of the new log").await;
    let log = subscriber.log();
    assert!(
        log.matches("the mirror starts again from the Resource List")
            .count()
            >= 2,
        "{log}"
    );
    subscriber.kill9().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_over_callbacks_starts_again_when_its_changes_are_gone() {
    a_mirror_starts_again_when_its_changes_are_gone(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_over_the_websocket_starts_again_when_its_changes_are_gone() {
    a_mirror_starts_again_when_its_changes_are_gone(true).await;
}
