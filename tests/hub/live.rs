//! Websockets and server-sent events: replay then live without gap or duplicate, resume,
//! reset, slow consumers, limits, private channels.

use crate::common::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_then_live_handover_under_concurrent_ingest() {
    // Two changes per request and max_batch 2: every request is its own notification.
    let hub = TestHub::start(|c| {
        c.max_batch = 2;
        c.linger = Duration::from_millis(1);
    })
    .await;
    const NOTIFICATIONS: u64 = 1000;
    let total = NOTIFICATIONS * 2;
    let pusher = {
        let url = hub.url.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            for i in 0..NOTIFICATIONS {
                let body = serde_json::json!([
                    {"loc": format!("http://example.com/{i}/a"), "change": "created"},
                    {"loc": format!("http://example.com/{i}/b"), "change": "updated"},
                ]);
                let resp = client
                    .post(format!("{url}/channels/{CHANNEL}/changes"))
                    .bearer_auth(TOKEN)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 202);
            }
        })
    };
    // Clients join while the source pushes: from the start, from a cursor, and live only.
    let mut clients = Vec::new();
    for (i, since) in [Some(0), None, Some(0), Some(5), Some(0)]
        .into_iter()
        .enumerate()
    {
        wait_until("more changes", WAIT, || async {
            hub.catch_up(0).await.len() as u64 >= (i as u64) * total / 8
        })
        .await;
        let mut ws = WsClient::connect(&hub, "").await;
        ws.subscribe(CHANNEL, since).await;
        let subscribed = ws.frame().await;
        assert_eq!(subscribed["type"], "subscribed");
        let start = since.unwrap_or_else(|| subscribed["cursor"].as_u64().unwrap());
        clients.push(tokio::spawn(async move {
            let (seqs, mut kinds) = ws.collect_until(total).await;
            if !kinds.iter().any(|k| k == "caught_up") {
                // The replay ended exactly at the last change: caught_up follows it.
                kinds.push(ws.frame().await["type"].as_str().unwrap().to_string());
            }
            (start, seqs, kinds)
        }));
    }
    pusher.await.unwrap();
    for c in clients {
        let (start, seqs, kinds) = c.await.unwrap();
        assert_eq!(
            seqs,
            (start + 1..=total).collect::<Vec<_>>(),
            "no gap, no duplicate from {start}"
        );
        assert_eq!(
            kinds.iter().filter(|k| *k == "caught_up").count(),
            1,
            "{kinds:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_with_cursor_continues_exactly() {
    let hub = TestHub::start(|_| {}).await;
    hub.push("a", 30).await;
    hub.wait_published(30).await;
    let mut ws = WsClient::connect(&hub, "").await;
    ws.subscribe(CHANNEL, Some(0)).await;
    assert_eq!(ws.frame().await["type"], "subscribed");
    let (seqs, kinds) = ws.collect_until(30).await;
    assert_eq!(seqs, (1..=30).collect::<Vec<_>>());
    assert_eq!(ws.frame().await["type"], "caught_up");
    assert!(kinds.iter().all(|k| k == "notification"));
    drop(ws);

    hub.push("b", 20).await;
    hub.wait_published(50).await;
    let mut ws = WsClient::connect(&hub, "").await;
    ws.subscribe(CHANNEL, Some(30)).await;
    ws.frame().await;
    let (seqs, _) = ws.collect_until(50).await;
    assert_eq!(seqs, (31..=50).collect::<Vec<_>>());
    assert_eq!(ws.frame().await["type"], "caught_up");
    // Then live.
    hub.push("c", 5).await;
    let (seqs, _) = ws.collect_until(55).await;
    assert_eq!(seqs, (51..=55).collect::<Vec<_>>());

    // Unsubscribe stops the flow.
    ws.send(serde_json::json!({"op": "unsubscribe", "channel": CHANNEL}))
        .await;
    assert_eq!(ws.frame().await["type"], "unsubscribed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_older_than_retention_gets_reset() {
    let hub = TestHub::start(|c| {
        let retention = &mut c.channels.get_mut(CHANNEL).unwrap().retention;
        retention.max_changes = 10;
        retention.list_size = 1;
        c.trim_interval = Duration::from_millis(20);
    })
    .await;
    hub.push("a", 30).await;
    hub.wait_trimmed_past(0).await;
    hub.wait_published(30).await;
    let mut ws = WsClient::connect(&hub, "").await;
    ws.subscribe(CHANNEL, Some(2)).await;
    assert_eq!(ws.frame().await["type"], "subscribed");
    let reset = ws.frame().await;
    assert_eq!(reset["type"], "reset");
    assert_eq!(reset["oldest"], 21);
    let (seqs, _) = ws.collect_until(30).await;
    assert_eq!(seqs, (21..=30).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_is_closed_with_a_reason() {
    let hub = TestHub::start(|c| {
        c.live.queue = 4;
        c.max_batch = 1000;
        c.linger = Duration::from_millis(1);
    })
    .await;
    let mut slow = WsClient::connect(&hub, "").await;
    slow.subscribe(CHANNEL, None).await;
    assert_eq!(slow.frame().await["type"], "subscribed");
    // The client stops reading; the source keeps pushing until the hub gives up on it.
    let stats = || async {
        let v: serde_json::Value = hub
            .client
            .get(format!("{}/api/live", hub.url))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["slow_closes"].as_u64().unwrap()
    };
    let mut pushed = 0;
    while stats().await == 0 {
        assert!(pushed < 400, "the hub never closed the slow client");
        hub.push("big", 1000).await;
        pushed += 1;
    }
    // Now the client reads: what was written to its socket, then the close, whose reason says
    // where to resume: exactly after the last change it received.
    let mut received = 0;
    loop {
        match slow.read(WAIT).await {
            WsRead::Frame(f) if f["type"] == "notification" => {
                received = f["last"].as_u64().unwrap();
            }
            WsRead::Frame(f) => assert_eq!(f["type"], "caught_up"),
            WsRead::Closed(Some((code, reason))) => {
                assert_eq!(code, 4008);
                assert!(reason.contains("slow consumer"), "{reason}");
                assert!(
                    reason.ends_with(&format!("resume {CHANNEL} since={received}")),
                    "{reason} vs {received}"
                );
                break;
            }
            WsRead::Closed(None) => panic!("closed without a reason"),
        }
    }
    // A fast client on the same hub is unaffected.
    let mut ws = WsClient::connect(&hub, "").await;
    ws.subscribe(CHANNEL, None).await;
    ws.frame().await;
    let (first, last) = hub.push("after", 3).await;
    let (seqs, _) = ws.collect_until(last).await;
    assert_eq!(seqs, (first..=last).collect::<Vec<_>>());
}

fn add_channel(c: &mut changehub::config::Config, name: &str, token: &str, reader: Option<&str>) {
    c.channels.insert(
        name.into(),
        changehub::config::ChannelConfig {
            read_token: reader.map(String::from),
            retention: changehub::model::Retention {
                max_changes: 1000,
                max_age: None,
                list_size: 1,
            },
            ..changehub::config::ChannelConfig::new(
                name,
                token,
                changehub::model::Retention::DEFAULT,
            )
        },
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_errors_are_clear() {
    let hub = TestHub::start(|c| {
        c.live.max_connections_per_ip = 2;
        c.live.max_subscriptions = 1;
        add_channel(c, "other", "t2", None);
        add_channel(c, "secret", "t3", Some("reader"));
    })
    .await;
    let mut ws1 = WsClient::connect(&hub, "").await;
    let mut ws2 = WsClient::connect(&hub, "").await;
    match tokio_tungstenite::connect_async(format!("ws://{}/ws", hub.addr)).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 429);
            let body = String::from_utf8(resp.body().clone().unwrap_or_default()).unwrap();
            assert!(body.contains("too many websocket connections"), "{body}");
        }
        other => panic!("third connection from one address: {other:?}"),
    }

    ws1.subscribe(CHANNEL, None).await;
    assert_eq!(ws1.frame().await["type"], "subscribed");
    assert_eq!(
        ws1.frame().await["type"],
        "caught_up",
        "live only: caught up at once"
    );
    ws1.subscribe("other", None).await;
    let e = ws1.frame().await;
    assert_eq!(
        (e["type"].as_str(), e["code"].as_str()),
        (Some("error"), Some("too_many_subscriptions"))
    );
    ws1.subscribe("nope", None).await;
    assert_eq!(ws1.frame().await["code"], "unknown_channel");
    ws1.send(serde_json::json!({"op": "dance"})).await;
    assert_eq!(ws1.frame().await["code"], "bad_frame");

    ws2.subscribe("secret", None).await;
    assert_eq!(ws2.frame().await["code"], "unauthorized");
    ws2.send(serde_json::json!({"op": "subscribe", "channel": "secret", "token": "reader"}))
        .await;
    assert_eq!(ws2.frame().await["type"], "subscribed");

    // An oversized frame closes the connection with 1009.
    ws1.send(serde_json::json!({"op": "subscribe", "channel": "x".repeat(70 * 1024)}))
        .await;
    match ws1.read(WAIT).await {
        WsRead::Closed(Some((code, reason))) => {
            assert_eq!(code, 1009);
            assert!(reason.contains("larger than"), "{reason}");
        }
        other => panic!("expected a close, got {other:?}"),
    }
    // Its place is free again.
    wait_until("connection slot freed", WAIT, || async {
        tokio_tungstenite::connect_async(format!("ws://{}/ws", hub.addr))
            .await
            .is_ok()
    })
    .await;

    // The private channel's documents need the token too; WebSub cannot subscribe to it.
    let changes = format!("{}/channels/secret/changes?after=0", hub.url);
    assert_eq!(hub.client.get(&changes).send().await.unwrap().status(), 401);
    assert_eq!(
        hub.client
            .get(format!("{changes}&token=reader"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        hub.client
            .get(&changes)
            .bearer_auth("reader")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Nor is it listed where anyone looks: the dashboard's list, the Source Description.
    for listing in ["/channels", "/.well-known/resourcesync"] {
        let text = hub.text(listing).await;
        assert!(text.contains(CHANNEL), "{listing}: {text}");
        assert!(
            !text.contains("secret"),
            "{listing} lists the private channel: {text}"
        );
    }
    let receiver = Receiver::start(Behaviour::default()).await;
    let topic = format!("{}/channels/secret/changelist.xml", hub.url);
    hub.hub_request(&[
        ("hub.mode", "subscribe"),
        ("hub.topic", &topic),
        ("hub.callback", &receiver.url),
    ])
    .await;
    receiver.wait_verified(1).await;
    assert_eq!(receiver.verifications()[0]["hub.mode"], "denied");
}

/// Reads server-sent events until one with id >= `last`; returns (seqs, last id, event names).
async fn read_sse(resp: &mut reqwest::Response, last: u64) -> (Vec<u64>, u64, Vec<String>) {
    let mut buf = String::new();
    let mut seqs = Vec::new();
    let mut names = Vec::new();
    let mut last_id = 0;
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut name = "message".to_string();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                } else if let Some(v) = line.strip_prefix("id:") {
                    last_id = v.trim().parse().unwrap();
                }
            }
            if data.is_empty() {
                continue; // keep-alive comment
            }
            let frame: serde_json::Value = serde_json::from_str(&data).unwrap();
            if name == "notification" {
                seqs.extend(
                    frame["changes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|c| c["seq"].as_u64().unwrap()),
                );
            }
            names.push(name);
            if last_id >= last {
                return (seqs, last_id, names);
            }
        }
        let chunk = tokio::time::timeout(WAIT, resp.chunk())
            .await
            .expect("SSE timed out")
            .unwrap()
            .expect("SSE ended");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sent_events_resume_with_last_event_id() {
    let hub = TestHub::start(|_| {}).await;
    hub.push("a", 40).await;
    hub.wait_published(40).await;
    let url = format!("{}/channels/{CHANNEL}/events", hub.url);
    let mut resp = hub
        .client
        .get(format!("{url}?since=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let (seqs, last_id, names) = read_sse(&mut resp, 40).await;
    assert_eq!(seqs, (1..=40).collect::<Vec<_>>());
    assert_eq!(last_id, 40);
    assert!(names.iter().all(|n| n == "notification"));
    drop(resp);

    hub.push("b", 25).await;
    hub.wait_published(65).await;
    let mut resp = hub
        .client
        .get(&url)
        .header("last-event-id", last_id.to_string())
        .send()
        .await
        .unwrap();
    let (seqs, last_id, names) = read_sse(&mut resp, 65).await;
    assert_eq!(
        seqs,
        (41..=65).collect::<Vec<_>>(),
        "resumed exactly after Last-Event-ID"
    );
    assert_eq!(last_id, 65);
    assert!(!names.contains(&"reset".to_string()));

    // Live after the replay.
    hub.push("c", 2).await;
    let (seqs, _, names) = read_sse(&mut resp, 67).await;
    assert_eq!(seqs, vec![66, 67]);
    assert!(names.contains(&"caught_up".to_string()));

    let bad = hub
        .client
        .get(&url)
        .header("last-event-id", "abc")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

/// A websocket client that subscribes to everything and reads nothing holds no more than the
/// byte budget of queued frames: its replay waits, then it is closed as a slow consumer
/// (counted in `/api/live`), instead of holding the channel's whole log in memory. A client
/// that reads gets everything through the same small budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_that_reads_nothing_is_bounded_then_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hub = TestHub::start(|c| {
        c.live.queue_bytes = 64 * 1024;
        c.live.stall = Duration::from_millis(500);
    })
    .await;
    // About 13 MB of frames: more than the socket buffers of loopback hold.
    for round in 0..20 {
        hub.push(&format!("r{round}"), 5_000).await;
    }
    hub.wait_published(100_000).await;

    // A raw client with a small receive buffer: the handshake, one subscribe, then nothing.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(hub.addr).await.unwrap();
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: hub\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"));
    let payload = br#"{"op":"subscribe","channel":"news","since":0}"#;
    let mut frame = vec![0x81, 0x80 | payload.len() as u8, 1, 2, 3, 4];
    frame.extend(
        payload
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ [1, 2, 3, 4][i % 4]),
    );
    stream.write_all(&frame).await.unwrap();

    wait_until("the client counted as slow", WAIT, || async {
        admin_json(&hub.url, "/api/live").await["slow_closes"] == 1
    })
    .await;
    // The hub lets go of it: whatever it wrote, the connection ends.
    let ended = tokio::time::timeout(WAIT, async {
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0usize;
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
        }
    })
    .await
    .expect("the hub closes a client that reads nothing");
    // What it got before the close is bounded by the budget and the socket buffers, far from
    // the 100,000 changes it asked for.
    assert!(ended < 8 << 20, "{ended} bytes");

    // A client that reads gets every change through the same budget.
    let mut ws = WsClient::connect(&hub, "").await;
    ws.subscribe(CHANNEL, Some(0)).await;
    let (seqs, _) = ws.collect_until(100_000).await;
    assert_eq!(seqs, (1..=100_000).collect::<Vec<u64>>());
}

/// What one connection received, per channel: seqs in order, and frame types.
#[derive(Default)]
struct PerChannel(std::collections::HashMap<String, (Vec<u64>, Vec<String>)>);

impl PerChannel {
    /// Reads frames until every `(channel, last)` of `until` has arrived.
    async fn read_until(&mut self, ws: &mut WsClient, until: &[(&str, u64)]) {
        let done = |me: &PerChannel| {
            until.iter().all(|(c, last)| {
                me.0.get(*c)
                    .and_then(|(seqs, _)| seqs.last())
                    .is_some_and(|s| s >= last)
            })
        };
        while !done(self) {
            self.add(&ws.frame().await);
        }
    }

    fn add(&mut self, f: &serde_json::Value) {
        let channel = f["channel"].as_str().unwrap().to_string();
        let (seqs, kinds) = self.0.entry(channel).or_default();
        if f["type"] == "notification" {
            seqs.extend(
                f["changes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["seq"].as_u64().unwrap()),
            );
        }
        kinds.push(f["type"].as_str().unwrap().to_string());
    }

    fn seqs(&self, channel: &str) -> Vec<u64> {
        self.0
            .get(channel)
            .map(|(s, _)| s.clone())
            .unwrap_or_default()
    }

    fn count(&self, channel: &str, kind: &str) -> usize {
        self.0
            .get(channel)
            .map_or(0, |(_, kinds)| kinds.iter().filter(|k| *k == kind).count())
    }
}

/// Two subscriptions on one connection, both followed by the connection's own task: two
/// replays share a small byte budget (each frame waiting for room in turn), each channel gets
/// every change once and in order, then `caught_up`, then its live changes; unsubscribing one
/// stops it and leaves the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_subscriptions_on_one_connection_share_its_budget_in_order() {
    let hub = TestHub::start(|c| {
        c.live.queue_bytes = 64 * 1024;
        c.linger = Duration::from_millis(1);
        add_channel(c, "other", "t2", None);
    })
    .await;
    for round in 0..4 {
        hub.push(&format!("r{round}"), 5_000).await;
    }
    hub.push_to("other", "t2", "o", 900).await;
    hub.wait_published(20_000).await;
    hub.wait_published_in("other", 900).await;

    let mut ws = WsClient::connect(&hub, "").await;
    ws.subscribe(CHANNEL, Some(0)).await;
    ws.subscribe("other", Some(100)).await;
    let mut got = PerChannel::default();
    got.read_until(&mut ws, &[(CHANNEL, 20_000), ("other", 900)])
        .await;
    for (channel, start) in [(CHANNEL, 0), ("other", 100)] {
        while got.count(channel, "caught_up") == 0 {
            got.add(&ws.frame().await);
        }
        let last = if channel == CHANNEL { 20_000 } else { 900 };
        assert_eq!(got.seqs(channel), (start + 1..=last).collect::<Vec<_>>());
        assert_eq!(got.count(channel, "subscribed"), 1);
    }

    // Live, both.
    let (_, news_last) = hub.push("live", 30).await;
    let (_, other_last) = hub.push_to("other", "t2", "live", 20).await;
    got.read_until(&mut ws, &[(CHANNEL, news_last), ("other", other_last)])
        .await;
    assert_eq!(got.seqs(CHANNEL), (1..=news_last).collect::<Vec<_>>());
    assert_eq!(got.seqs("other"), (101..=other_last).collect::<Vec<_>>());

    // One unsubscribed: the other goes on alone.
    ws.send(serde_json::json!({"op": "unsubscribe", "channel": CHANNEL}))
        .await;
    loop {
        let f = ws.frame().await;
        if f["type"] == "unsubscribed" {
            assert_eq!(f["channel"], CHANNEL);
            break;
        }
        got.add(&f);
    }
    hub.push("after", 5).await;
    let (_, other_last) = hub.push_to("other", "t2", "after", 5).await;
    got.read_until(&mut ws, &[("other", other_last)]).await;
    assert_eq!(got.seqs(CHANNEL), (1..=news_last).collect::<Vec<_>>());
    assert_eq!(got.seqs("other"), (101..=other_last).collect::<Vec<_>>());
}

/// A client with two subscriptions that stops reading is closed as slow, and the reason names
/// the channel whose frame overflowed and exactly the last seq of that channel it received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_with_two_subscriptions_resumes_the_one_that_overflowed() {
    let hub = TestHub::start(|c| {
        c.live.queue = 4;
        c.max_batch = 1000;
        c.linger = Duration::from_millis(1);
        add_channel(c, "other", "t2", None);
    })
    .await;
    let mut slow = WsClient::connect(&hub, "").await;
    let mut got = PerChannel::default();
    slow.subscribe(CHANNEL, None).await;
    slow.subscribe("other", None).await;
    while got.count(CHANNEL, "subscribed") + got.count("other", "subscribed") < 2 {
        let f = slow.frame().await;
        if f["type"] == "subscribed" {
            // Where each starts: its cursor, until a notification is received.
            let (seqs, _) = got
                .0
                .entry(f["channel"].as_str().unwrap().into())
                .or_default();
            seqs.push(f["cursor"].as_u64().unwrap());
        }
        got.add(&f);
    }
    let mut pushed = 0;
    while admin_json(&hub.url, "/api/live").await["slow_closes"] == 0 {
        assert!(pushed < 400, "the hub never closed the slow client");
        hub.push("big", 1000).await;
        hub.push_to("other", "t2", "big", 1000).await;
        pushed += 1;
    }
    loop {
        match slow.read(WAIT).await {
            WsRead::Frame(f) => got.add(&f),
            WsRead::Closed(Some((code, reason))) => {
                assert_eq!(code, 4008);
                let (_, resume) = reason.split_once("resume ").expect(&reason);
                let (channel, since) = resume.split_once(" since=").expect(&reason);
                let received = *got.seqs(channel).last().unwrap();
                assert_eq!(since.parse::<u64>().unwrap(), received, "{reason}");
                break;
            }
            WsRead::Closed(None) => panic!("closed without a reason"),
        }
    }
    for channel in [CHANNEL, "other"] {
        let seqs = got.seqs(channel);
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "{channel}: a gap"
        );
    }
}
