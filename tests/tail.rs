//! `changehub tail`, the real binary, against a real hub on loopback; and the websocket frames
//! the hub really sends, checked against `proto/ws/*.schema.json`.

#[path = "common/mod.rs"]
mod common;

use common::*;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(30);

fn tail_command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_changehub"));
    cmd.arg("tail")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in [
        "CHANGEHUB_TAIL_CHANNEL",
        "CHANGEHUB_TAIL_SINCE",
        "CHANGEHUB_TAIL_EPOCH",
        "CHANGEHUB_TAIL_TOKEN",
        "CHANGEHUB_TAIL_ONCE",
        "CHANGEHUB_TAIL_URL",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// Runs `changehub tail ARGS` to its end; returns (success, stdout, stderr).
async fn tail_to_end(args: &[&str]) -> (bool, String, String) {
    let output = tokio::time::timeout(WAIT, tail_command(args).output())
        .await
        .expect("changehub tail did not exit in time")
        .expect("cannot run changehub tail");
    (
        output.status.success(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// The seqs of tail's stdout; every line must be `seq<TAB>change<TAB>datetime<TAB>loc`.
fn seqs(stdout: &str) -> Vec<u64> {
    stdout
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 4, "{line:?}");
            assert!(
                ["created", "updated", "deleted"].contains(&fields[1]),
                "{line:?}"
            );
            assert!(fields[2].contains('T'), "datetime in {line:?}");
            assert!(fields[3].starts_with("http://example.com/"), "{line:?}");
            fields[0].parse().unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_once_prints_the_replay_exactly() {
    let hub = TestHub::start(|c| c.max_batch = 7).await;
    hub.push("a", 30).await;
    hub.push("b", 15).await;
    hub.wait_published(45).await;

    let (ok, stdout, stderr) =
        tail_to_end(&["--channel", CHANNEL, "--since", "0", "--once", &hub.url]).await;
    assert!(ok, "{stderr}");
    assert_eq!(seqs(&stdout), (1..=45).collect::<Vec<_>>(), "{stderr}");
    assert!(stdout.starts_with("1\tupdated\t"), "{stdout}");
    assert!(stdout.contains("\thttp://example.com/b/14\n"), "{stdout}");
    assert!(stderr.contains("subscribed news since=0"), "{stderr}");
    assert!(stderr.contains("caught_up news seq=45"), "{stderr}");

    // From a cursor: exactly what comes after it.
    let (ok, stdout, stderr) =
        tail_to_end(&["--channel", CHANNEL, "--since", "40", "--once", &hub.url]).await;
    assert!(ok, "{stderr}");
    assert_eq!(seqs(&stdout), (41..=45).collect::<Vec<_>>());
}

/// A running `changehub tail` whose output lines are collected as they come.
struct RunningTail {
    child: tokio::process::Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl RunningTail {
    fn spawn(args: &[&str]) -> RunningTail {
        let mut child = tail_command(args)
            .spawn()
            .expect("cannot run changehub tail");
        let collect = |pipe: Box<dyn tokio::io::AsyncRead + Send + Unpin>| {
            let lines = Arc::new(Mutex::new(Vec::new()));
            let sink = lines.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    sink.lock().unwrap().push(line);
                }
            });
            lines
        };
        let stdout = collect(Box::new(child.stdout.take().unwrap()));
        let stderr = collect(Box::new(child.stderr.take().unwrap()));
        RunningTail {
            child,
            stdout,
            stderr,
        }
    }

    fn seqs(&self) -> Vec<u64> {
        let lines = self.stdout.lock().unwrap();
        seqs(&lines.iter().map(|l| format!("{l}\n")).collect::<String>())
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    async fn wait_stderr(&self, what: &str) {
        wait_until(&format!("tail's stderr shows {what:?}"), WAIT, || async {
            self.stderr().contains(what)
        })
        .await;
    }

    async fn wait_seq(&self, last: u64) {
        wait_until(&format!("tail printed seq {last}"), WAIT, || async {
            self.seqs().last().is_some_and(|&s| s >= last)
        })
        .await;
    }
}

/// A hub on `addr` over `data_dir`: the one a stopped [`TestHub`] left, back on its address.
async fn restart_at(addr: SocketAddr, data_dir: PathBuf) -> oneshot::Sender<()> {
    let end = tokio::time::Instant::now() + WAIT;
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) if tokio::time::Instant::now() < end => {
                eprintln!("rebinding {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot listen on {addr} again: {e}"),
        }
    };
    let mut config = changehub::config::Config::new(addr, data_dir).with_channel(CHANNEL, TOKEN);
    config.linger = Duration::from_millis(20);
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        changehub::run(listener, config, async {
            let _ = stopped.await;
        })
        .await
        .expect("hub failed");
    });
    stop
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follows_live_across_a_hub_restart_then_exits_0_on_ctrl_c() {
    let mut hub = TestHub::start(|_| {}).await;
    hub.push("old", 5).await;
    hub.wait_published(5).await;

    // Live only: what was published before it started is not printed.
    let mut tail = RunningTail::spawn(&["--channel", CHANNEL, &hub.url]);
    tail.wait_stderr("subscribed news live from seq 5").await;
    hub.push("a", 10).await;
    tail.wait_seq(15).await;

    // The hub goes away (close 1001); changes come in before tail is back, and after.
    hub.stop().await;
    tail.wait_stderr("disconnected").await;
    let stop = restart_at(hub.addr, hub.data_dir.clone()).await;
    // Same address, new server: no pooled connection to the old one.
    hub.client = reqwest::Client::new();
    hub.push("b", 10).await;
    tail.wait_stderr("subscribed news since=15").await;
    hub.push("c", 10).await;
    tail.wait_seq(35).await;
    assert_eq!(
        tail.seqs(),
        (6..=35).collect::<Vec<_>>(),
        "nothing missed, nothing twice; stderr:\n{}",
        tail.stderr()
    );
    assert!(tail.stderr().contains("1001"), "{}", tail.stderr());

    // Ctrl-C ends it with status 0.
    let pid = tail.child.id().expect("tail is running") as libc::pid_t;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let status = tokio::time::timeout(WAIT, tail.child.wait())
        .await
        .expect("tail did not exit on SIGINT")
        .unwrap();
    assert!(status.success(), "{status:?}; stderr:\n{}", tail.stderr());
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_refuses_what_retrying_cannot_fix() {
    let hub = TestHub::start(|c| {
        c.channels.get_mut(CHANNEL).unwrap().read_token = Some("reader".into());
    })
    .await;
    hub.push("a", 3).await;
    hub.wait_published(3).await;

    let (ok, stdout, stderr) = tail_to_end(&["--channel", "nope", "--since", "0", &hub.url]).await;
    assert!(!ok, "unknown channel: {stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("unknown_channel"), "{stderr}");

    let (ok, _, stderr) = tail_to_end(&["--channel", CHANNEL, &hub.url]).await;
    assert!(!ok, "private channel without its token: {stderr}");
    assert!(stderr.contains("unauthorized"), "{stderr}");

    let (ok, stdout, stderr) = tail_to_end(&[
        "--channel",
        CHANNEL,
        "--token",
        "reader",
        "--since",
        "1",
        "--once",
        &hub.url,
    ])
    .await;
    assert!(ok, "{stderr}");
    assert_eq!(seqs(&stdout), [2, 3]);

    let (ok, _, stderr) = tail_to_end(&["--channel", CHANNEL, "https://127.0.0.1:9"]).await;
    assert!(!ok);
    assert!(stderr.contains("TLS"), "{stderr}");
    let (ok, _, stderr) = tail_to_end(&["--channel", "Not A Channel", &hub.url]).await;
    assert!(!ok);
    assert!(stderr.contains("not a channel name"), "{stderr}");
}

// ---- proto/ws/*.schema.json against the frames the hub really sends ----

/// A JSON Schema validator for the keywords `proto/ws/` uses (every other constraining
/// keyword fails the test, so a schema cannot silently rely on one this does not check).
/// `pattern` and `format` are not checked here; `python3 -m jsonschema` checks them (see
/// proto/README.md).
fn validate(
    root: &serde_json::Value,
    schema: &serde_json::Value,
    value: &serde_json::Value,
    at: &str,
) -> Vec<String> {
    use serde_json::Value;
    let mut errors = Vec::new();
    let Some(schema) = schema.as_object() else {
        match schema {
            Value::Bool(true) => return errors,
            _ => return vec![format!("{at}: not allowed")],
        }
    };
    for (keyword, arg) in schema {
        match keyword.as_str() {
            "$schema" | "$id" | "$defs" | "title" | "description" | "examples" | "$comment"
            | "format" | "pattern" => {}
            "$ref" => {
                let path = arg
                    .as_str()
                    .unwrap()
                    .strip_prefix("#/$defs/")
                    .expect("local $ref");
                errors.extend(validate(root, &root["$defs"][path], value, at));
            }
            "type" => {
                let types: Vec<&str> = match arg {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(ts) => ts.iter().map(|t| t.as_str().unwrap()).collect(),
                    _ => panic!("type {arg}"),
                };
                let ok = types.iter().any(|t| match *t {
                    "object" => value.is_object(),
                    "array" => value.is_array(),
                    "string" => value.is_string(),
                    "integer" => value.is_u64() || value.is_i64(),
                    "number" => value.is_number(),
                    "boolean" => value.is_boolean(),
                    "null" => value.is_null(),
                    other => panic!("type {other}"),
                });
                if !ok {
                    errors.push(format!("{at}: {value} is not {types:?}"));
                }
            }
            "const" if value != arg => errors.push(format!("{at}: {value} is not {arg}")),
            "enum" if !arg.as_array().unwrap().contains(value) => {
                errors.push(format!("{at}: {value} is not one of {arg}"))
            }
            "const" | "enum" => {}
            "minimum" | "maximum" => {
                if let (Some(v), Some(limit)) = (value.as_f64(), arg.as_f64()) {
                    if (keyword == "minimum" && v < limit) || (keyword == "maximum" && v > limit) {
                        errors.push(format!("{at}: {value} beyond {keyword} {arg}"));
                    }
                }
            }
            "minLength" | "maxLength" => {
                if let Some(s) = value.as_str() {
                    let n = s.chars().count() as u64;
                    let limit = arg.as_u64().unwrap();
                    if (keyword == "minLength" && n < limit)
                        || (keyword == "maxLength" && n > limit)
                    {
                        errors.push(format!("{at}: length {n} beyond {keyword} {limit}"));
                    }
                }
            }
            "minItems" => {
                if value
                    .as_array()
                    .is_some_and(|a| (a.len() as u64) < arg.as_u64().unwrap())
                {
                    errors.push(format!("{at}: fewer than {arg} items"));
                }
            }
            "items" => {
                for (i, item) in value.as_array().into_iter().flatten().enumerate() {
                    errors.extend(validate(root, arg, item, &format!("{at}/{i}")));
                }
            }
            "required" => {
                if let Some(object) = value.as_object() {
                    for name in arg.as_array().unwrap() {
                        if !object.contains_key(name.as_str().unwrap()) {
                            errors.push(format!("{at}: {name} missing"));
                        }
                    }
                }
            }
            "properties" | "additionalProperties" => {
                let Some(object) = value.as_object() else {
                    continue;
                };
                let properties = schema.get("properties").and_then(Value::as_object);
                for (name, member) in object {
                    let at = format!("{at}/{name}");
                    match properties.and_then(|p| p.get(name)) {
                        Some(sub) if keyword == "properties" => {
                            errors.extend(validate(root, sub, member, &at))
                        }
                        None if keyword == "additionalProperties" => {
                            errors.extend(validate(root, arg, member, &at))
                        }
                        _ => {}
                    }
                }
            }
            other => panic!("{at}: schema keyword {other:?} is not checked by this test"),
        }
    }
    errors
}

struct Schemas(std::collections::HashMap<String, serde_json::Value>);

impl Schemas {
    fn load() -> Schemas {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("proto/ws");
        let mut schemas = std::collections::HashMap::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap();
            if let Some(stem) = name.strip_suffix(".schema.json") {
                let text = std::fs::read_to_string(&path).unwrap();
                let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
                // Each schema's own examples are valid.
                for example in schema["examples"].as_array().expect("examples") {
                    let errors = validate(&schema, &schema, example, "");
                    assert!(errors.is_empty(), "{name} example {example}: {errors:?}");
                }
                schemas.insert(stem.to_string(), schema);
            }
        }
        Schemas(schemas)
    }

    fn errors(&self, name: &str, frame: &serde_json::Value) -> Vec<String> {
        let schema = self
            .0
            .get(name)
            .unwrap_or_else(|| panic!("no {name}.schema.json"));
        validate(schema, schema, frame, "")
    }

    /// Asserts that a frame from the hub matches the schema named by its type.
    fn check_server(&self, frame: &serde_json::Value) {
        let name = frame["type"].as_str().expect("type").replace('_', "-");
        let errors = self.errors(&name, frame);
        assert!(errors.is_empty(), "{frame}: {errors:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_frames_match_the_schemas() {
    let schemas = Schemas::load();
    assert_eq!(schemas.0.len(), 8, "{:?}", schemas.0.keys());
    let hub = TestHub::start(|c| {
        c.live.max_subscriptions = 2;
        let news = c.channels.get_mut(CHANNEL).unwrap();
        news.retention.max_changes = 10;
        news.retention.list_size = 1;
        let mut secret = news.clone();
        secret.name = "secret".into();
        secret.read_token = Some("reader".into());
        c.channels.insert("secret".into(), secret.clone());
        secret.name = "other".into();
        secret.read_token = None;
        c.channels.insert("other".into(), secret);
        c.trim_interval = Duration::from_millis(20);
    })
    .await;
    hub.push("a", 30).await;
    hub.wait_trimmed_past(0).await;
    // A change with every optional field.
    let (status, json) = hub
        .push_json(serde_json::json!({
            "loc": "http://example.com/rich", "change": "created",
            "datetime": "2024-05-01T10:15:00+02:00", "lastmod": "2024-05-01",
            "hash": "md5:1584abdf8ebdc9802ac0c6a7402c03b6 sha-256:00ff", "length": 8876,
            "type": "text/html",
            "links": [{"rel": "describedby", "href": "http://example.com/rich.json",
                       "type": "application/json", "length": "12"}],
        }))
        .await;
    assert_eq!(status, 202, "{json}");
    hub.wait_published(31).await;

    let mut ws = WsClient::connect(&hub, "").await;
    let mut seen = std::collections::BTreeSet::new();
    // Every frame checked, as `{"schema", "valid", "frame"}` (see dump_frames).
    let checked = std::cell::RefCell::new(Vec::new());
    let mut check = |frame: serde_json::Value| {
        schemas.check_server(&frame);
        let kind = frame["type"].as_str().unwrap().to_string();
        checked.borrow_mut().push(serde_json::json!({
            "schema": kind.replace('_', "-"), "valid": true, "frame": frame}));
        seen.insert(kind);
        frame
    };
    // Replay from a trimmed cursor: subscribed, reset, notifications, caught_up.
    ws.subscribe(CHANNEL, Some(2)).await;
    loop {
        let frame = check(ws.frame().await);
        if frame["type"] == "notification" {
            let rich = frame["changes"].as_array().unwrap().iter().any(|c| {
                ["lastmod", "hash", "length", "type", "links"]
                    .iter()
                    .all(|f| c.get(*f).is_some())
            });
            if frame["last"] == 31 {
                assert!(rich, "{frame}");
            }
        }
        if frame["type"] == "caught_up" {
            break;
        }
    }
    // Live only, then a live notification.
    ws.subscribe("other", None).await;
    assert_eq!(check(ws.frame().await)["type"], "subscribed");
    assert_eq!(check(ws.frame().await)["type"], "caught_up");
    hub.push("live", 2).await;
    assert_eq!(check(ws.frame().await)["type"], "notification");
    // Refusals.
    let mut codes = std::collections::BTreeSet::new();
    for frame in [
        serde_json::json!({"op": "subscribe", "channel": "secret"}),
        serde_json::json!({"op": "subscribe", "channel": "nope"}),
        serde_json::json!({"op": "subscribe", "channel": "news", "since": -1}),
        serde_json::json!({"op": "unsubscribe", "channel": "secret"}),
    ] {
        ws.send(frame).await;
        let error = check(ws.frame().await);
        codes.insert(error["code"].as_str().unwrap().to_string());
    }
    ws.send(serde_json::json!({"op": "unsubscribe", "channel": "other"}))
        .await;
    assert_eq!(check(ws.frame().await)["type"], "unsubscribed");
    ws.send(serde_json::json!({"op": "subscribe", "channel": "secret", "token": "reader"}))
        .await;
    assert_eq!(check(ws.frame().await)["type"], "subscribed");
    assert_eq!(check(ws.frame().await)["type"], "caught_up");
    ws.send(serde_json::json!({"op": "subscribe", "channel": "other"}))
        .await;
    codes.insert(
        check(ws.frame().await)["code"]
            .as_str()
            .unwrap()
            .to_string(),
    );
    assert_eq!(
        codes.into_iter().collect::<Vec<_>>(),
        [
            "bad_frame",
            "not_subscribed",
            "too_many_subscriptions",
            "unauthorized",
            "unknown_channel"
        ]
    );

    // Client frames: the schema accepts exactly what the hub does not refuse as bad_frame
    // (valid subscribes get too_many_subscriptions here: news and secret are followed).
    for (frame, valid) in [
        (
            serde_json::json!({"op": "subscribe", "channel": "other", "since": 0}),
            true,
        ),
        (
            serde_json::json!({"op": "subscribe", "channel": "other", "since": null, "token": null}),
            true,
        ),
        (
            serde_json::json!({"op": "unsubscribe", "channel": "other"}),
            true,
        ),
        (serde_json::json!({"op": "subscribe"}), false),
        (
            serde_json::json!({"op": "subscribe", "channel": "other", "since": "5"}),
            false,
        ),
        (
            serde_json::json!({"op": "subscribe", "channel": "other", "extra": 1}),
            false,
        ),
        (
            serde_json::json!({"op": "unsubscribe", "channel": "other", "since": 1}),
            false,
        ),
        (
            serde_json::json!({"op": "publish", "channel": "other"}),
            false,
        ),
    ] {
        let name = format!("client-{}", frame["op"].as_str().unwrap());
        let schema_ok = schemas.0.contains_key(&name) && schemas.errors(&name, &frame).is_empty();
        assert_eq!(schema_ok, valid, "schema on {frame}");
        checked.borrow_mut().push(serde_json::json!({
            "schema": name, "valid": valid, "frame": frame.clone()}));
        ws.send(frame.clone()).await;
        let answer = check(ws.frame().await);
        assert_eq!(
            answer["code"] != "bad_frame",
            valid,
            "hub on {frame}: {answer}"
        );
        assert_eq!(answer["type"], "error", "{answer}");
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        [
            "caught_up",
            "error",
            "notification",
            "reset",
            "subscribed",
            "unsubscribed"
        ]
    );
    dump_frames(&checked.into_inner());
}

/// With `CHANGEHUB_WS_FRAMES_OUT=FILE`, writes the checked frames to FILE as NDJSON, one
/// `{"schema": NAME, "valid": BOOL, "frame": FRAME}` per line, for a full JSON Schema validator
/// (proto/README.md shows the check with Python's jsonschema).
fn dump_frames(checked: &[serde_json::Value]) {
    if let Some(path) = std::env::var_os("CHANGEHUB_WS_FRAMES_OUT") {
        let lines: String = checked.iter().map(|c| format!("{c}\n")).collect();
        std::fs::write(&path, lines).unwrap();
    }
}

/// The frames a websocket subscription gets until `caught_up` and seq `last`.
async fn ws_until(url: &str, subscribe: serde_json::Value, last: u64) -> Vec<serde_json::Value> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("{}/ws", url.replace("http://", "ws://")))
            .await
            .unwrap();
    ws.send(Message::Text(subscribe.to_string().into()))
        .await
        .unwrap();
    let mut frames = Vec::new();
    loop {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame in time")
            .expect("the connection stays open")
            .unwrap();
        let Message::Text(text) = msg else { continue };
        let frame: serde_json::Value = serde_json::from_str(&text).unwrap();
        frames.push(frame);
        let caught_up = frames.iter().any(|f| f["type"] == "caught_up");
        let seen = frames
            .iter()
            .filter_map(|f| f["changes"].as_array()?.last()?["seq"].as_u64())
            .max()
            .unwrap_or(0);
        if caught_up && seen >= last {
            return frames;
        }
    }
}

/// Stream identity: the hub's data is wiped and it starts again with 2 changes. Followers that
/// had seq 5 of the old log notice — the websocket (`reset`, reason `ahead`, or `epoch` when
/// they give their epoch), server-sent events (`reset`), `changes?after=` (409 with the head
/// and the epoch) and `changehub tail` — and get the new log from its beginning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_hub_is_noticed_by_every_follower() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut hub = TestHub::start_in(data.clone(), |_| {}).await;
    hub.push("old", 5).await;
    let old = ws_until(
        &hub.url,
        serde_json::json!({"op": "subscribe", "channel": CHANNEL, "since": 0}),
        5,
    )
    .await;
    let caught_up = old.iter().find(|f| f["type"] == "caught_up").unwrap();
    let old_epoch = caught_up["epoch"].as_str().unwrap().to_string();
    assert_eq!(
        old[0]["epoch"],
        old_epoch.as_str(),
        "subscribed carries the epoch"
    );
    let addr = hub.addr;
    hub.stop().await;

    std::fs::remove_dir_all(&data).unwrap();
    let _stop = restart_at(addr, data.clone()).await;
    let url = format!("http://{addr}");
    wait_until("the hub is back", WAIT, || async {
        reqwest::get(format!("{url}/readyz"))
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let client = reqwest::Client::new();
    let push = client
        .post(format!("{url}/channels/{CHANNEL}/changes"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!([
            {"loc": "http://example.com/new/0", "change": "created"},
            {"loc": "http://example.com/new/1", "change": "created"},
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(push.status(), 202);

    // The websocket: ahead of the head, and of another epoch.
    for (subscribe, reason) in [
        (
            serde_json::json!({"op": "subscribe", "channel": CHANNEL, "since": 5}),
            "ahead",
        ),
        (
            serde_json::json!({"op": "subscribe", "channel": CHANNEL, "since": 1, "epoch": old_epoch}),
            "epoch",
        ),
    ] {
        let frames = ws_until(&url, subscribe, 2).await;
        let reset = frames
            .iter()
            .find(|f| f["type"] == "reset")
            .expect("a reset");
        assert_eq!(reset["reason"], reason, "{frames:?}");
        assert_eq!(
            (reset["oldest"].as_u64(), reset["last"].as_u64()),
            (Some(1), Some(2))
        );
        let new_epoch = reset["epoch"].as_str().unwrap();
        assert_ne!(new_epoch, old_epoch);
        let seqs: Vec<u64> = frames
            .iter()
            .filter(|f| f["type"] == "notification")
            .flat_map(|f| {
                f["changes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["seq"].as_u64().unwrap())
            })
            .collect();
        assert_eq!(seqs, [1, 2], "the new log from its beginning");
    }
    // A cursor of this epoch that is not ahead is continued as always.
    let frames = ws_until(
        &url,
        serde_json::json!({"op": "subscribe", "channel": CHANNEL, "since": 1}),
        2,
    )
    .await;
    assert!(frames.iter().all(|f| f["type"] != "reset"), "{frames:?}");

    // Server-sent events with Last-Event-ID 5.
    let mut sse = client
        .get(format!("{url}/channels/{CHANNEL}/events"))
        .header("last-event-id", "5")
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    while !(text.contains("event: caught_up") && text.contains("id: 2")) {
        let chunk = tokio::time::timeout(WAIT, sse.chunk())
            .await
            .expect("SSE in time")
            .unwrap()
            .expect("SSE open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.contains("\"reason\":\"ahead\""), "{text}");
    assert!(text.contains("event: reset\nid: 0\n"), "{text}");
    assert!(text.contains("id: 2"), "{text}");

    // changes?after=5: 409 with the head and the epoch.
    let resp = client
        .get(format!("{url}/channels/{CHANNEL}/changes?after=5"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["last"], 2);
    assert_ne!(body["epoch"], old_epoch.as_str());
    let resp = client
        .get(format!(
            "{url}/channels/{CHANNEL}/changes?after=1&epoch={old_epoch}"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409, "a cursor of the old epoch");

    // tail reports it and prints the new log.
    let (ok, stdout, stderr) = tail_to_end(&[
        "--channel",
        CHANNEL,
        "--since",
        "5",
        "--epoch",
        &old_epoch,
        "--once",
        &url,
    ])
    .await;
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(&format!("reset {CHANNEL} epoch oldest=1")),
        "{stderr}"
    );
    assert_eq!(seqs(&stdout), [1, 2]);
}
