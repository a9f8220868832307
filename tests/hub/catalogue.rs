//! A catalogue of hostile requests across every endpoint, each with the status it must get.
//! After all of them the hub is healthy and nothing was stored: no change, no subscription, no
//! channel.

use crate::common::*;
use reqwest::{Method, StatusCode};

/// One hostile request.
struct Hostile {
    method: Method,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    want: StatusCode,
}

fn req(method: Method, path: impl Into<String>, want: StatusCode) -> Hostile {
    Hostile {
        method,
        path: path.into(),
        headers: Vec::new(),
        body: Vec::new(),
        want,
    }
}

impl Hostile {
    fn header(mut self, name: &'static str, value: impl Into<String>) -> Hostile {
        self.headers.push((name, value.into()));
        self
    }
    fn body(mut self, body: impl Into<Vec<u8>>) -> Hostile {
        self.body = body.into();
        self
    }
    fn json(self, body: &str) -> Hostile {
        self.header("content-type", "application/json").body(body)
    }
}

fn ingest(body: &str) -> Hostile {
    req(
        Method::POST,
        format!("/channels/{CHANNEL}/changes"),
        StatusCode::BAD_REQUEST,
    )
    .header("authorization", format!("Bearer {TOKEN}"))
    .json(body)
}

fn change_with(field: &str, value: &str) -> String {
    format!(r#"{{"loc": "http://example.com/a", "change": "created", "{field}": {value}}}"#)
}

fn hub_form(form: &str) -> Hostile {
    req(Method::POST, "/hub", StatusCode::BAD_REQUEST)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
}

fn catalogue(hub: &TestHub) -> Vec<Hostile> {
    let topic = hub.topic();
    let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let mut all = Vec::new();

    // Ingest: authentication and media types.
    let path = format!("/channels/{CHANNEL}/changes");
    let good = r#"{"loc": "http://example.com/a", "change": "created"}"#;
    all.push(req(Method::POST, &path, StatusCode::UNAUTHORIZED).json(good));
    for auth in ["Bearer wrong", "Bearer ", "bearer x"] {
        let want = if auth == "Bearer " {
            StatusCode::UNAUTHORIZED
        } else {
            StatusCode::FORBIDDEN
        };
        all.push(
            req(Method::POST, &path, want)
                .header("authorization", auth)
                .json(good),
        );
    }
    for auth in ["Basic dTpw", "Token x", "Bearer"] {
        all.push(
            req(Method::POST, &path, StatusCode::UNAUTHORIZED)
                .header("authorization", auth)
                .json(good),
        );
    }
    all.push(
        req(
            Method::POST,
            "/channels/nope/changes",
            StatusCode::NOT_FOUND,
        )
        .header("authorization", format!("Bearer {TOKEN}"))
        .json(good),
    );
    for media in [
        "text/plain",
        "application/octet-stream",
        "image/png",
        "multipart/form-data",
    ] {
        all.push(
            req(Method::POST, &path, StatusCode::UNSUPPORTED_MEDIA_TYPE)
                .header("authorization", format!("Bearer {TOKEN}"))
                .header("content-type", media)
                .body(good),
        );
    }
    for encoding in ["br", "zstd", "x-unknown"] {
        all.push(
            req(Method::POST, &path, StatusCode::UNSUPPORTED_MEDIA_TYPE)
                .header("authorization", format!("Bearer {TOKEN}"))
                .header("content-type", "application/json")
                .header("content-encoding", encoding)
                .body(good),
        );
    }

    // Ingest: malformed JSON and shapes.
    for body in [
        "",
        "{",
        "[",
        "nul",
        "null",
        "true",
        "42",
        "\"a\"",
        "[1]",
        "[[]]",
        "{}",
        "[{}]",
        r#"{"changes": {}}"#,
        r#"{"changes": [], "more": 1}"#,
        r#"{"changes": null}"#,
        "\u{feff}[]x",
        r#"[{"loc": "http://example.com/a", "change": "created"},]"#,
    ] {
        all.push(ingest(body));
    }
    // Ingest: bad fields.
    for loc in [
        "\"\"",
        "\"/relative\"",
        "\"ftp://example.com/a\"",
        "\"http:///a\"",
        "\"http://\"",
        "\"javascript:alert(1)\"",
        "\"http://exa mple.com/\"",
        "\"http://example.com/\\n\"",
        "null",
        "42",
        "[]",
        "{}",
    ] {
        all.push(ingest(&format!(r#"{{"loc": {loc}, "change": "created"}}"#)));
    }
    let long_loc = format!("\"http://example.com/{}\"", "a".repeat(3000));
    all.push(ingest(&format!(
        r#"{{"loc": {long_loc}, "change": "created"}}"#
    )));
    for change in ["\"moved\"", "\"CREATED\"", "\"\"", "null", "1"] {
        all.push(ingest(&format!(
            r#"{{"loc": "http://example.com/a", "change": {change}}}"#
        )));
    }
    for datetime in [
        "\"yesterday\"",
        "\"2024-13-01\"",
        "\"2024-02-30T00:00:00Z\"",
        "\"2024-01-01T25:00:00Z\"",
        "\"9999-12-31T23:59:59-23:59\"",
        "\"10000-01-01\"",
        "\"2999-01-01T00:00:00Z\"",
        "\"\"",
        "0",
        "true",
    ] {
        all.push(ingest(&change_with("datetime", datetime)));
        // A resource's own lastmod may be ahead of the hub's clock; the rest is refused.
        if !datetime.starts_with("\"2999") {
            all.push(ingest(&change_with("lastmod", datetime)));
        }
    }
    for length in ["-1", "1.5", "\"12\"", "18446744073709551616", "true"] {
        all.push(ingest(&change_with("length", length)));
    }
    for hash in ["\"\"", "1", "[]"] {
        all.push(ingest(&change_with("hash", hash)));
    }
    all.push(ingest(&change_with(
        "hash",
        &format!("\"md5:{}\"", "0".repeat(2000)),
    )));
    for links in [
        "{}",
        "[1]",
        "[{}]",
        r#"[{"rel": "a"}]"#,
        r#"[{"href": "http://example.com/"}]"#,
        r#"[{"rel": "", "href": "http://example.com/"}]"#,
        r#"[{"rel": "a", "href": "/rel"}]"#,
        r#"[{"rel": "a", "href": "http://example.com/", "x": 1}]"#,
    ] {
        all.push(ingest(&change_with("links", links)));
    }
    let many_links = format!(
        "[{}]",
        vec![r#"{"rel": "a", "href": "http://example.com/"}"#; 40].join(",")
    );
    all.push(ingest(&change_with("links", &many_links)));
    for field in ["seq", "source", "colour", "Loc"] {
        all.push(ingest(&change_with(field, "\"x\"")));
    }
    all.push(ingest(
        r#"{"loc": "http://example.com/a", "change": "created", "loc": "http://example.com/b"}"#,
    ));
    // One bad change refuses the whole body.
    all.push(ingest(
        r#"[{"loc": "http://example.com/ok", "change": "created"}, {"loc": "bad", "change": "created"}]"#,
    ));
    // Ingest: NDJSON and XML.
    for body in [
        "{\n",
        "{\"loc\": \"http://example.com/a\", \"change\": \"created\"}\n{bad}\n",
        "[]\n",
    ] {
        all.push(
            ingest("")
                .header("content-type", "application/x-ndjson")
                .body(body),
        );
    }
    for body in [
        "",
        "<urlset",
        "<?xml version=\"1.0\"?><!DOCTYPE x [<!ENTITY e \"e\">]><urlset/>",
        "<urlset xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\"><url><loc>&e;</loc></url></urlset>",
        &format!("{}{}", "<a>".repeat(40), "</a>".repeat(40)),
        "<html><body>not a change list</body></html>",
        "<urlset xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\" xmlns:rs=\"http://www.openarchives.org/rs/terms/\"><rs:md capability=\"resourcelist\"/></urlset>",
    ] {
        all.push(ingest("").header("content-type", "application/xml").body(body));
    }
    all.push(
        req(Method::POST, &path, StatusCode::PAYLOAD_TOO_LARGE)
            .header("authorization", format!("Bearer {TOKEN}"))
            .json(&format!("[{}]", " ".repeat(2 << 20))),
    );
    all.push(
        req(Method::POST, &path, StatusCode::BAD_REQUEST)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("idempotency-key", "x".repeat(300))
            .json(good),
    );

    // WebSub.
    for form in [
        "".to_string(),
        "hub.mode=dance".to_string(),
        format!("hub.mode=subscribe&hub.topic={}", enc(&topic)),
        "hub.mode=subscribe&hub.callback=http://127.0.0.1:9/cb".to_string(),
        format!("hub.mode=subscribe&hub.topic={}&hub.callback=ftp://x/cb", enc(&topic)),
        format!("hub.mode=subscribe&hub.topic={}&hub.callback=%2Frelative", enc(&topic)),
        format!("hub.mode=subscribe&hub.topic={}&hub.callback=not+a+url", enc(&topic)),
        format!(
            "hub.mode=subscribe&hub.topic={}&hub.callback=http://127.0.0.1:9/cb&hub.secret={}",
            enc(&topic),
            "s".repeat(200)
        ),
        format!(
            "hub.mode=subscribe&hub.topic={}&hub.callback=http://127.0.0.1:9/cb&hub.lease_seconds=soon",
            enc(&topic)
        ),
        "hub.mode=publish".to_string(),
        format!("hub.mode=unsubscribe&hub.topic={}", enc(&topic)),
        "hub.mode=subscribe&hub.topic=&hub.callback=".to_string(),
    ] {
        all.push(hub_form(&form));
    }
    all.push(
        req(Method::POST, "/hub", StatusCode::PAYLOAD_TOO_LARGE)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("hub.mode=subscribe&x={}", "a".repeat(100_000))),
    );
    for media in ["text/plain", "application/json", "image/png"] {
        all.push(
            req(Method::POST, "/hub", StatusCode::UNSUPPORTED_MEDIA_TYPE)
                .header("content-type", media)
                .body("hub.mode=subscribe"),
        );
    }
    // A fat ping needs its topic, and cannot be for a channel of this hub.
    all.push(
        req(Method::POST, "/hub", StatusCode::BAD_REQUEST)
            .header("content-type", "application/xml")
            .body("<urlset/>"),
    );
    all.push(
        req(Method::POST, "/publish", StatusCode::FORBIDDEN)
            .header("content-type", "application/xml")
            .header("link", format!("<{topic}>; rel=\"self\""))
            .body("<urlset/>"),
    );

    // Catch-up and discovery.
    let ch = format!("/channels/{CHANNEL}");
    for query in [
        "after=-1",
        "after=x",
        "after=1.5",
        "after=18446744073709551616",
        "limit=0",
        "limit=-3",
        "limit=50001",
        "limit=lots",
        "after=",
        "limit=",
    ] {
        all.push(req(
            Method::GET,
            format!("{ch}/changes?{query}"),
            StatusCode::BAD_REQUEST,
        ));
    }
    all.push(req(
        Method::GET,
        format!("{ch}/changes?after=1000000"),
        StatusCode::CONFLICT,
    ));
    all.push(req(
        Method::GET,
        format!("{ch}/changes?after=0&epoch=0000000000000000"),
        StatusCode::CONFLICT,
    ));
    for name in [
        "0-5.xml",
        "5-3.xml",
        "1-60000.xml",
        "1-1.xml",
        "a-b.xml",
        "1-2",
        "1-2.json",
        "-.xml",
        "1--2.xml",
        "99999999999999999999-1.xml",
    ] {
        all.push(req(
            Method::GET,
            format!("{ch}/changelist/{name}"),
            StatusCode::NOT_FOUND,
        ));
    }
    for query in ["page=0", "page=x", "page=-1"] {
        all.push(req(
            Method::GET,
            format!("{ch}/changelist-archive.xml?{query}"),
            StatusCode::BAD_REQUEST,
        ));
    }
    all.push(req(
        Method::GET,
        format!("{ch}/changelist-archive.xml?page=7"),
        StatusCode::NOT_FOUND,
    ));
    for query in [
        "after=x",
        "upto=5",
        "after=5&upto=2",
        "after=1&upto=x",
        "after=100",
    ] {
        all.push(req(
            Method::GET,
            format!("{ch}/resourcelist.xml?{query}"),
            StatusCode::BAD_REQUEST,
        ));
    }
    for doc in [
        "changelist.xml",
        "changes",
        "capabilitylist.xml",
        "resourcelist.xml",
        "changelist-archive.xml",
        "events",
    ] {
        all.push(req(
            Method::GET,
            format!("/channels/nope/{doc}"),
            StatusCode::NOT_FOUND,
        ));
        all.push(req(
            Method::GET,
            format!("/channels/..%2F{CHANNEL}/{doc}"),
            StatusCode::NOT_FOUND,
        ));
    }
    for since in ["x", "-1", "1.0"] {
        all.push(req(
            Method::GET,
            format!("{ch}/events?since={since}"),
            StatusCode::BAD_REQUEST,
        ));
    }
    all.push(
        req(Method::GET, format!("{ch}/events"), StatusCode::BAD_REQUEST)
            .header("last-event-id", "abc"),
    );
    all.push(req(Method::GET, "/ws", StatusCode::BAD_REQUEST));

    // Admin.
    for path in [
        "/api/channels",
        "/api/subscriptions",
        "/api/live",
        "/api/channels/news/resources?loc=http://example.com/a",
    ] {
        all.push(req(Method::GET, path, StatusCode::UNAUTHORIZED));
        all.push(
            req(Method::GET, path, StatusCode::FORBIDDEN).header("authorization", "Bearer nope"),
        );
    }
    all.push(req(Method::PUT, "/api/channels/x", StatusCode::UNAUTHORIZED).json("{}"));
    all.push(req(
        Method::DELETE,
        "/api/channels/x",
        StatusCode::UNAUTHORIZED,
    ));
    all.push(req(
        Method::POST,
        "/api/subscriptions/x/redeliver?from=1",
        StatusCode::UNAUTHORIZED,
    ));
    let admin = |method: Method, path: &str, want: StatusCode| {
        req(method, path, want).header("authorization", format!("Bearer {ADMIN}"))
    };
    for body in [
        "",
        "{}",
        "[]",
        r#"{"publishers": {}}"#,
        r#"{"publishers": {"a": ""}}"#,
        r#"{"publishers": {"a": "t", "b": "t"}}"#,
        r#"{"publishers": {"BAD": "t"}}"#,
        r#"{"publishers": {"a": "t"}, "retain_changes": 0}"#,
        r#"{"publishers": {"a": "t"}, "archive_every": 50001}"#,
        r#"{"publishers": {"a": "t"}, "retain_for": "forever"}"#,
        r#"{"publishers": {"a": "t"}, "read_token": ""}"#,
        r#"{"publishers": {"a": "t"}, "x": 1}"#,
    ] {
        all.push(admin(Method::PUT, "/api/channels/x", StatusCode::BAD_REQUEST).json(body));
    }
    all.push(
        admin(
            Method::PUT,
            "/api/channels/Bad%20Name",
            StatusCode::BAD_REQUEST,
        )
        .json(r#"{"publishers": {"a": "t"}}"#),
    );
    all.push(
        admin(
            Method::PUT,
            &format!("/api/channels/{CHANNEL}"),
            StatusCode::CONFLICT,
        )
        .json(r#"{"publishers": {"a": "t"}}"#),
    );
    all.push(admin(
        Method::DELETE,
        "/api/channels/x",
        StatusCode::NOT_FOUND,
    ));
    all.push(admin(
        Method::DELETE,
        &format!("/api/channels/{CHANNEL}"),
        StatusCode::CONFLICT,
    ));
    all.push(admin(
        Method::DELETE,
        "/api/subscriptions/nope",
        StatusCode::NOT_FOUND,
    ));
    for query in ["from=x", "from=-1", ""] {
        all.push(admin(
            Method::POST,
            &format!("/api/subscriptions/nope/redeliver?{query}"),
            StatusCode::BAD_REQUEST,
        ));
    }
    all.push(admin(
        Method::GET,
        "/api/channels/news/resources?loc=http://example.com/none",
        StatusCode::NOT_FOUND,
    ));
    all.push(admin(
        Method::GET,
        "/api/channels/nope/resources?loc=x",
        StatusCode::NOT_FOUND,
    ));

    // Methods and paths that do not exist.
    for (method, path) in [
        (Method::DELETE, format!("{ch}/changelist.xml")),
        (Method::PUT, format!("{ch}/changes")),
        (Method::GET, "/hub".to_string()),
        (Method::POST, "/healthz".to_string()),
    ] {
        all.push(req(method, path, StatusCode::METHOD_NOT_ALLOWED));
    }
    for path in [
        "/nope",
        "/channels/news",
        "/api",
        "/.well-known/other",
        "/assets/../Cargo.toml",
    ] {
        all.push(req(Method::GET, path, StatusCode::NOT_FOUND));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalogue_of_hostile_requests_is_refused_and_changes_nothing() {
    let hub = TestHub::start(|c| c.max_body = 1 << 20).await;
    let catalogue = catalogue(&hub);
    assert!(catalogue.len() >= 150, "{} requests", catalogue.len());
    let client = reqwest::Client::new();
    let mut wrong = Vec::new();
    for hostile in &catalogue {
        let mut request = client.request(
            hostile.method.clone(),
            format!("{}{}", hub.url, hostile.path),
        );
        for (name, value) in &hostile.headers {
            request = request.header(*name, value);
        }
        let resp = request.body(hostile.body.clone()).send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if status != hostile.want {
            wrong.push(format!(
                "{} {} {:?}: {status} (want {}): {text}",
                hostile.method,
                hostile.path,
                String::from_utf8_lossy(&hostile.body[..hostile.body.len().min(80)]),
                hostile.want
            ));
        }
        if status.is_client_error() && status != StatusCode::METHOD_NOT_ALLOWED && text.is_empty() {
            wrong.push(format!(
                "{} {}: {status} without a reason",
                hostile.method, hostile.path
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {}:\n{}",
        wrong.len(),
        catalogue.len(),
        wrong.join("\n")
    );

    // Healthy, and nothing stored.
    let health = client
        .get(format!("{}/healthz", hub.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let channels = admin_json(&hub.url, "/api/channels").await;
    let channels = channels.as_array().unwrap();
    assert_eq!(channels.len(), 1, "no channel created: {channels:?}");
    assert_eq!(channels[0]["last"], 0, "no change stored");
    assert!(admin_json(&hub.url, "/api/subscriptions")
        .await
        .as_array()
        .unwrap()
        .is_empty());
}
