//! Bad input gets a clear 4xx with a reason, and changes nothing.

use crate::common::*;
use reqwest::StatusCode;
use std::time::Duration;

struct Case {
    name: &'static str,
    channel: &'static str,
    token: Option<&'static str>,
    content_type: &'static str,
    body: Vec<u8>,
    status: u16,
    /// Text the reason must contain.
    reason: &'static str,
    index: Option<u64>,
}

fn case(name: &'static str, body: impl Into<Vec<u8>>, status: u16, reason: &'static str) -> Case {
    Case {
        name,
        channel: CHANNEL,
        token: Some(TOKEN),
        content_type: "application/json",
        body: body.into(),
        status,
        reason,
        index: None,
    }
}

fn at(mut c: Case, index: u64) -> Case {
    c.index = Some(index);
    c
}

const GOOD: &str = r#"{"loc":"http://example.com/ok","change":"created"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ingest_requests_are_refused_and_store_nothing() {
    let hub = TestHub::start(|c| c.max_body = 64 * 1024).await;
    let long_loc = format!("http://example.com/{}", "x".repeat(2100));
    let cases = vec![
        case("malformed JSON", "{\"loc\": ", 400, "malformed JSON"),
        case("not a change", "42", 400, "expected a change"),
        case("empty array", "[]", 400, "no changes"),
        at(
            case(
                "wrong type",
                r#"[{"loc":5,"change":"created"}]"#,
                400,
                "invalid type",
            ),
            0,
        ),
        at(
            case(
                "missing change",
                r#"{"loc":"http://example.com/a"}"#,
                400,
                "missing field",
            ),
            0,
        ),
        at(
            case(
                "relative loc",
                format!(r#"[{GOOD},{{"loc":"/a","change":"created"}}]"#),
                400,
                "absolute",
            ),
            1,
        ),
        at(
            case(
                "ftp loc",
                r#"{"loc":"ftp://example.com/a","change":"created"}"#,
                400,
                "http",
            ),
            0,
        ),
        at(
            case(
                "over-long loc",
                format!(r#"[{GOOD},{GOOD},{{"loc":"{long_loc}","change":"created"}}]"#),
                400,
                "longer than",
            ),
            2,
        ),
        at(
            case(
                "unknown change type",
                format!(r#"[{GOOD},{{"loc":"http://example.com/a","change":"moved"}}]"#),
                400,
                "moved",
            ),
            1,
        ),
        at(
            case(
                "datetime far in the future",
                format!(r#"[{GOOD},{{"loc":"http://example.com/b","change":"created","datetime":"2999-01-01T00:00:00Z"}}]"#),
                400,
                "in the future (--max-future)",
            ),
            1,
        ),
        at(
            case(
                "datetime past year 9999 in UTC",
                r#"{"loc":"http://example.com/a","change":"created","datetime":"9999-12-31T23:59:59-23:59"}"#,
                400,
                "out of range",
            ),
            0,
        ),
        at(
            case(
                "lastmod past year 9999 in UTC",
                r#"{"loc":"http://example.com/a","change":"created","lastmod":"9999-12-31T23:00-01:00"}"#,
                400,
                "out of range",
            ),
            0,
        ),
        at(
            case(
                "bad datetime",
                r#"{"loc":"http://example.com/a","change":"created","datetime":"yesterday"}"#,
                400,
                "datetime",
            ),
            0,
        ),
        at(
            case(
                "bad hash",
                r#"{"loc":"http://example.com/a","change":"created","hash":"md5"}"#,
                400,
                "hash",
            ),
            0,
        ),
        at(
            case(
                "negative length",
                r#"{"loc":"http://example.com/a","change":"created","length":-1}"#,
                400,
                "invalid value",
            ),
            0,
        ),
        at(
            case(
                "unknown field",
                r#"{"loc":"http://example.com/a","change":"created","colour":"red"}"#,
                400,
                "unknown field",
            ),
            0,
        ),
        Case {
            content_type: "application/xml",
            ..case("malformed XML", "<urlset><url>", 400, "Change List")
        },
        Case {
            content_type: "application/xml",
            ..case(
                "XML wrong root",
                "<?xml version=\"1.0\"?><html/>",
                400,
                "Change List",
            )
        },
        at(
            Case {
                content_type: "application/xml",
                ..case(
                    "XML unknown change",
                    r#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="changelist" from="2024-01-01T00:00:00Z"/><url><loc>http://example.com/a</loc><rs:md change="moved" datetime="2024-01-01T00:00:00Z"/></url></urlset>"#,
                    400,
                    "moved",
                )
            },
            0,
        ),
        at(
            Case {
                content_type: "application/xml",
                ..case(
                    "XML datetime past year 9999 in UTC",
                    r#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="changelist" from="2024-01-01T00:00:00Z"/><url><loc>http://example.com/a</loc><rs:md change="created" datetime="9999-12-31T23:59:59-23:59"/></url></urlset>"#,
                    400,
                    "out of range",
                )
            },
            0,
        ),
        Case {
            content_type: "application/x-ndjson",
            ..at(
                case(
                    "NDJSON datetime past year 9999 in UTC",
                    format!("{GOOD}\n{{\"loc\":\"http://example.com/b\",\"change\":\"created\",\"datetime\":\"9999-12-31T23:59:59-23:59\"}}\n"),
                    400,
                    "out of range",
                ),
                1,
            )
        },
        Case {
            content_type: "application/x-ndjson",
            ..at(
                case(
                    "NDJSON bad line",
                    format!("{GOOD}\n{{\"loc\":\n"),
                    400,
                    "malformed JSON",
                ),
                1,
            )
        },
        Case {
            content_type: "text/plain",
            ..case("unsupported type", GOOD, 415, "Content-Type")
        },
        case(
            "oversized body",
            format!("[{}]", vec![GOOD; 2000].join(",")),
            413,
            "larger than --max-body",
        ),
        Case {
            token: None,
            ..case("missing token", GOOD, 401, "Bearer")
        },
        Case {
            token: Some("wrong"),
            ..case("wrong token", GOOD, 403, "wrong token")
        },
        Case {
            channel: "nope",
            ..case("unknown channel", GOOD, 404, "no channel")
        },
    ];
    // Each case both ways a push can take: straight to its handler (a plain body), and
    // through the router and its layers (any `Content-Encoding`, here `identity`).
    for (c, routed) in cases.iter().flat_map(|c| [(c, false), (c, true)]) {
        let name = format!("{}{}", c.name, if routed { " (routed)" } else { "" });
        let mut req = hub
            .client
            .post(format!("{}/channels/{}/changes", hub.url, c.channel))
            .header("content-type", c.content_type)
            .body(c.body.clone());
        if routed {
            req = req.header("content-encoding", "identity");
        }
        if let Some(t) = c.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), c.status, "{name}");
        let json: serde_json::Value = resp.json().await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let reason = json["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no reason"));
        assert!(
            reason.contains(c.reason),
            "{name}: reason {reason:?} lacks {:?}",
            c.reason
        );
        assert_eq!(json["index"].as_u64(), c.index, "{name}: index in {json}");
    }
    assert!(hub.catch_up(0).await.is_empty(), "nothing was stored");

    // The same hub still takes good input.
    let (status, json) = hub.push_json(serde_json::from_str(GOOD).unwrap()).await;
    assert_eq!(status, 202, "{json}");
    assert_eq!(
        json,
        serde_json::json!({"accepted": 1, "first": 1, "last": 1})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_hub_requests_are_refused_and_subscribe_nothing() {
    let hub = TestHub::start(|c| c.allow_private_callbacks = false).await;
    let topic = hub.topic();
    let t = topic.as_str();
    let cb = "http://example.com/callback";
    let secret_200 = "s".repeat(200);
    type HubCase<'a> = (&'a str, Vec<(&'a str, &'a str)>, u16, &'a str);
    let cases: Vec<HubCase> = vec![
        (
            "missing hub.mode",
            vec![("hub.topic", t), ("hub.callback", cb)],
            400,
            "hub.mode",
        ),
        (
            "unknown hub.mode",
            vec![
                ("hub.mode", "watch"),
                ("hub.topic", t),
                ("hub.callback", cb),
            ],
            400,
            "hub.mode",
        ),
        (
            "missing hub.topic",
            vec![("hub.mode", "subscribe"), ("hub.callback", cb)],
            400,
            "hub.topic",
        ),
        (
            "missing hub.callback",
            vec![("hub.mode", "subscribe"), ("hub.topic", t)],
            400,
            "hub.callback",
        ),
        (
            "relative callback",
            vec![
                ("hub.mode", "subscribe"),
                ("hub.topic", t),
                ("hub.callback", "/cb"),
            ],
            400,
            "hub.callback",
        ),
        (
            "bad lease",
            vec![
                ("hub.mode", "subscribe"),
                ("hub.topic", t),
                ("hub.callback", cb),
                ("hub.lease_seconds", "soon"),
            ],
            400,
            "lease",
        ),
        (
            "zero lease",
            vec![
                ("hub.mode", "subscribe"),
                ("hub.topic", t),
                ("hub.callback", cb),
                ("hub.lease_seconds", "0"),
            ],
            400,
            "lease",
        ),
        (
            "oversized secret",
            vec![
                ("hub.mode", "subscribe"),
                ("hub.topic", t),
                ("hub.callback", cb),
                ("hub.secret", &secret_200),
            ],
            400,
            "secret",
        ),
        (
            "bad algorithm",
            vec![
                ("hub.mode", "subscribe"),
                ("hub.topic", t),
                ("hub.callback", cb),
                ("hub.signature_algorithm", "md5"),
            ],
            400,
            "algorithm",
        ),
        (
            "private callback",
            vec![
                ("hub.mode", "subscribe"),
                ("hub.topic", t),
                ("hub.callback", "http://127.0.0.1:9/cb"),
            ],
            403,
            "private",
        ),
        (
            "link-local callback",
            vec![
                ("hub.mode", "subscribe"),
                ("hub.topic", t),
                ("hub.callback", "http://169.254.169.254/latest"),
            ],
            403,
            "private",
        ),
    ];
    for (name, params, status, reason) in &cases {
        let (got, text) = hub.hub_request(params).await;
        assert_eq!(got.as_u16(), *status, "{name}: {text}");
        assert!(
            text.contains(reason),
            "{name}: reason {text:?} lacks {reason:?}"
        );
    }
    let resp = hub
        .client
        .post(format!("{}/hub", hub.url))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(hub.subscriptions().await.is_empty());

    // Catch-up parameters.
    for q in [
        "after=-1",
        "after=x",
        "limit=0",
        "limit=50001",
        "limit=many",
    ] {
        let resp = hub
            .client
            .get(format!("{}/channels/{CHANNEL}/changes?{q}", hub.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{q}");
    }
    // A cursor beyond the head is not a seq of this log: 409 with the head and the epoch.
    let resp = hub
        .client
        .get(format!(
            "{}/channels/{CHANNEL}/changes?after=1000000",
            hub.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(body["epoch"].is_string() && body["last"].is_u64(), "{body}");
    let resp = hub
        .client
        .get(format!("{}/channels/nope/changelist.xml", hub.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // Admin API needs its token.
    let resp = hub
        .client
        .get(format!("{}/api/subscriptions", hub.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = hub
        .client
        .get(format!("{}/api/subscriptions", hub.url))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
}

/// `--max-future`: a datetime within the margin is taken, beyond it refused; the margin is
/// configurable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_future_margin_is_configurable() {
    let in_days = |days: i64| {
        changehub::model::format_datetime(
            time::OffsetDateTime::now_utc() + time::Duration::days(days),
        )
    };
    let change = |dt: String| serde_json::json!({"loc": "http://example.com/f", "change": "updated", "datetime": dt});
    let hub = TestHub::start(|_| {}).await;
    let (status, _) = hub.push_json(change(in_days(0))).await;
    assert_eq!(status, 202, "now is fine");
    let (status, json) = hub.push_json(change(in_days(2))).await;
    assert_eq!(status, 400, "two days ahead, default margin 1 day: {json}");
    let wide = TestHub::start(|c| c.max_future = std::time::Duration::from_secs(7 * 86_400)).await;
    let (status, json) = wide.push_json(change(in_days(2))).await;
    assert_eq!(status, 202, "{json}");
    let (status, _) = wide.push_json(change(in_days(8))).await;
    assert_eq!(status, 400);
}

/// Bodies: a WebSub form is refused past 64 KiB (a fat ping may still be as large as
/// `--max-body`), and the admin API refuses a caller without its token before reading a byte
/// of the body — even a body that never ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_bounded_per_route_and_read_only_after_authentication() {
    let hub = TestHub::start(|_| {}).await;
    let big_form = format!(
        "hub.mode=subscribe&hub.topic={}&hub.callback=http://127.0.0.1:9/&pad={}",
        hub.topic(),
        "x".repeat(100 * 1024)
    );
    let resp = hub
        .client
        .post(format!("{}/hub", hub.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(big_form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(hub.subscriptions().await.is_empty());

    // A body announced as 1 MB of which 9 bytes come, then nothing, ever: the answer must
    // not wait for the rest.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(hub.addr).await.unwrap();
    let head = format!(
        "POST /api/subscriptions/any/redeliver HTTP/1.1\r\nhost: {}\r\n\
         content-type: application/json\r\ncontent-length: 1000000\r\n\r\n{{\"from\": ",
        hub.addr
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut answer))
        .await
        .expect("answered without reading the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}

/// Bodies with a `Content-Encoding`: gzip is decoded (and the body limit applies to what comes
/// out, so a small bomb is refused), any other encoding is refused with 415; nothing refused
/// is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_bodies_are_decoded_or_refused() {
    use flate2::write::GzEncoder;
    use std::io::Write;
    let hub = TestHub::start(|c| c.max_body = 1 << 20).await;
    let gzip = |bytes: &[u8]| {
        let mut encoder = GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    };
    let post = |encoding: &'static str, body: Vec<u8>| {
        hub.client
            .post(format!("{}/channels/{CHANNEL}/changes", hub.url))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("content-encoding", encoding)
            .body(body)
            .send()
    };
    let change = br#"{"loc": "http://example.com/zipped", "change": "created"}"#;
    let resp = post("gzip", gzip(change)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    for encoding in ["br", "deflate-ish", "compress"] {
        let resp = post(encoding, change.to_vec()).await.unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{encoding}"
        );
    }
    // 64 MiB of spaces around a change, 64 KiB on the wire.
    let mut bomb = vec![b' '; 64 << 20];
    bomb[..change.len()].copy_from_slice(change);
    let resp = post("gzip", gzip(&bomb)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body = hub
        .text(&format!("/channels/{CHANNEL}/changes?after=0"))
        .await;
    assert_eq!(
        body.matches("<url>").count(),
        1,
        "only the good one is stored"
    );
}

/// Pushes that the hub's direct way leaves to the router (a channel name with a `%` in its
/// path, a body with a `Content-Encoding`) land as any other: the name is decoded, the seqs
/// follow on from the direct ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_through_the_router_land_as_direct_ones_do() {
    let hub = TestHub::start(|_| {}).await;
    let encoded: String = CHANNEL.bytes().map(|b| format!("%{b:02X}")).collect();
    let change = |n: u32| format!(r#"{{"loc": "http://example.com/{n}", "change": "created"}}"#);
    let mut answers = Vec::new();
    for (n, (channel, encoding)) in [
        (CHANNEL, None),
        (encoded.as_str(), None),
        (CHANNEL, Some("identity")),
        (encoded.as_str(), Some("identity")),
    ]
    .into_iter()
    .enumerate()
    {
        let mut req = hub
            .client
            .post(format!("{}/channels/{channel}/changes", hub.url))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(change(n as u32));
        if let Some(encoding) = encoding {
            req = req.header("content-encoding", encoding);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::ACCEPTED,
            "{channel} {encoding:?}"
        );
        answers.push(resp.json::<serde_json::Value>().await.unwrap());
    }
    let firsts: Vec<_> = answers.iter().map(|a| a["first"].as_u64()).collect();
    assert_eq!(firsts, [Some(1), Some(2), Some(3), Some(4)]);
    let body = hub
        .text(&format!("/channels/{CHANNEL}/changes?after=0"))
        .await;
    for n in 0..4 {
        assert!(
            body.contains(&format!("http://example.com/{n}<")),
            "{n} in {body}"
        );
    }
}

/// A body that trickles in is cut off with 408 after `--body-timeout`, and nothing of it is
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_in_gets_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hub = TestHub::start(|c| c.http.body_timeout = Duration::from_millis(500)).await;
    let mut stream = tokio::net::TcpStream::connect(hub.addr).await.unwrap();
    let body = br#"[{"loc": "http://example.com/slow", "change": "created"}]"#;
    stream
        .write_all(
            format!(
                "POST /channels/{CHANNEL}/changes HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer {TOKEN}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let writer = tokio::spawn(async move {
        for byte in body {
            if stream.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stream
    });
    let mut stream = writer.await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let (status, json) = hub.push_json(serde_json::json!([])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    let stored = hub
        .text(&format!("/channels/{CHANNEL}/changes?after=0"))
        .await;
    assert!(!stored.contains("slow"), "{stored}");
}
