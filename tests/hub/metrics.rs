//! `GET /metrics`, read with a Prometheus text-format parser from a hub process of its own
//! (the recorder is process-wide): the numbers move with ingest, deliveries, a failing
//! callback and live connections.

use crate::common::*;
use prometheus_parse::{Scrape, Value};
use reqwest::StatusCode;
use std::time::Duration;

async fn scrape(base: &str) -> Scrape {
    let resp = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = resp.text().await.unwrap();
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text format")
}

/// The value of `name` with every label of `labels` (summed over the other labels); for a
/// histogram, its count. 0 when absent.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(buckets) => buckets
                .iter()
                .find(|b| b.less_than.is_infinite())
                .map_or(0.0, |b| b.count),
            Value::Summary(_) => panic!("{name} is a summary"),
        })
        .sum()
}

async fn wait_metric(base: &str, what: &str, cond: impl Fn(&Scrape) -> bool) {
    wait_until(what, Duration::from_secs(15), || async {
        cond(&scrape(base).await)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_ingest_deliveries_failures_and_connections() {
    let dir = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(&["--data-dir", dir.path().to_str().unwrap()]).await;
    let base = hub.url.as_str();

    let first = scrape(base).await;
    let version = first
        .samples
        .iter()
        .find(|s| s.metric == "changehub_build_info")
        .expect("build info");
    assert_eq!(
        version.labels.get("version"),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(value(&first, "changehub_ingested_changes_total", &[]), 0.0);
    assert_eq!(value(&first, "changehub_channels_owned", &[]), 1.0);

    let good = Receiver::start(Behaviour::default()).await;
    let bad = Receiver::start(Behaviour {
        post_status: StatusCode::INTERNAL_SERVER_ERROR,
        ..Behaviour::default()
    })
    .await;
    subscribe_at(base, CHANNEL, &good.url).await;
    subscribe_at(base, CHANNEL, &bad.url).await;
    good.wait_verified(1).await;
    bad.wait_verified(1).await;
    wait_subscriptions(base, 2).await;

    let client = reqwest::Client::new();
    let push = |body: serde_json::Value| {
        client
            .post(format!("{base}/channels/{CHANNEL}/changes"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
    };
    let changes: Vec<_> = (0..10)
        .map(|i| serde_json::json!({"loc": format!("http://example.com/m/{i}"), "change": "created"}))
        .collect();
    assert_eq!(
        push(serde_json::Value::Array(changes))
            .await
            .unwrap()
            .status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(
        push(serde_json::json!({"loc": "nope", "change": "created"}))
            .await
            .unwrap()
            .status(),
        StatusCode::BAD_REQUEST
    );
    good.wait_seq(10, Duration::from_secs(15)).await;
    wait_metric(base, "a failed delivery", |s| {
        value(s, "changehub_deliveries_total", &[("outcome", "failed")]) >= 1.0
    })
    .await;

    // Two websockets and one event stream.
    let ws_url = format!("{}/ws", base.replace("http://", "ws://"));
    let (ws1, _) = tokio_tungstenite::connect_async(&ws_url).await.unwrap();
    let (ws2, _) = tokio_tungstenite::connect_async(&ws_url).await.unwrap();
    let mut sse = client
        .get(format!("{base}/channels/{CHANNEL}/events?since=0"))
        .send()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), sse.chunk())
        .await
        .expect("the stream sends the replay")
        .unwrap();

    let s = scrape(base).await;
    let news = [("channel", CHANNEL)];
    assert_eq!(
        value(
            &s,
            "changehub_ingest_requests_total",
            &[("channel", CHANNEL), ("outcome", "accepted")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "changehub_ingest_requests_total",
            &[("channel", CHANNEL), ("outcome", "rejected")]
        ),
        1.0
    );
    // The outcomes not seen yet are there too, at 0 (docs/operations.md).
    for outcome in ["replayed", "failed"] {
        let series = s.samples.iter().find(|x| {
            x.metric == "changehub_ingest_requests_total"
                && x.labels.get("channel") == Some(CHANNEL)
                && x.labels.get("outcome") == Some(outcome)
        });
        assert!(
            matches!(series.map(|x| &x.value), Some(Value::Counter(v)) if *v == 0.0),
            "{outcome}: {series:?}"
        );
    }
    assert_eq!(value(&s, "changehub_ingested_changes_total", &news), 10.0);
    assert_eq!(value(&s, "changehub_store_append_seconds", &[]), 1.0);
    assert!(value(&s, "changehub_notifications_total", &news) >= 1.0);
    assert!(
        value(
            &s,
            "changehub_deliveries_total",
            &[("outcome", "delivered")]
        ) >= 1.0
    );
    assert!(value(&s, "changehub_delivery_latency_seconds", &[]) >= 1.0);
    assert_eq!(value(&s, "changehub_delivery_retry_queue", &[]), 1.0);
    assert_eq!(
        value(&s, "changehub_subscriptions", &[("state", "retrying")]),
        1.0
    );
    assert_eq!(
        value(&s, "changehub_subscriptions", &[("state", "delivering")]),
        1.0
    );
    assert_eq!(value(&s, "changehub_subscriber_lag_max", &news), 10.0);
    assert_eq!(value(&s, "changehub_websocket_connections", &[]), 2.0);
    assert_eq!(value(&s, "changehub_sse_connections", &[]), 1.0);
    assert_eq!(value(&s, "changehub_store_errors_total", &[]), 0.0);

    drop((ws1, ws2, sse));
    wait_metric(base, "connections closed", |s| {
        value(s, "changehub_websocket_connections", &[]) == 0.0
            && value(s, "changehub_sse_connections", &[]) == 0.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_ask_for_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--metrics-token",
        "scraper",
    ])
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/metrics", hub.url);
    let none = client.get(&url).send().await.unwrap();
    assert_eq!(none.status(), StatusCode::UNAUTHORIZED);
    let wrong = client.get(&url).bearer_auth("guess").send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::FORBIDDEN);
    let right = client
        .get(&url)
        .bearer_auth("scraper")
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), StatusCode::OK);
    assert!(right.text().await.unwrap().contains("changehub_build_info"));
}
