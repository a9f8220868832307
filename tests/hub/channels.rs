//! Channels created, changed and removed through the admin API on one instance (embedded
//! store): what is accepted, what is refused, and that a runtime channel is a channel like
//! any other — ingest, documents, WebSub, live — across a restart.

use crate::common::*;
use reqwest::StatusCode;
use serde_json::json;

async fn put(hub: &TestHub, name: &str, body: &str) -> (StatusCode, serde_json::Value) {
    let resp = hub
        .client
        .put(format!("{}/api/channels/{name}", hub.url))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(serde_json::Value::Null))
}

async fn push(hub: &TestHub, name: &str, token: &str) -> StatusCode {
    hub.client
        .post(format!("{}/channels/{name}/changes", hub.url))
        .bearer_auth(token)
        .json(&json!({"loc": "http://example.com/a", "change": "created"}))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_come_and_go_through_the_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let mut hub = TestHub::start_in(dir.path().to_path_buf(), |_| {}).await;

    // Refused, and nothing changes.
    for (name, body, status) in [
        ("x", r#"{"publishers": {}}"#, StatusCode::BAD_REQUEST),
        (
            "x",
            r#"{"publishers": {"a": "t", "b": "t"}}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            "x",
            r#"{"publishers": {"A": "t"}}"#,
            StatusCode::BAD_REQUEST,
        ),
        ("x", r#"{"publishers": {"a": ""}}"#, StatusCode::BAD_REQUEST),
        (
            "x",
            r#"{"publishers": {"a": "t"}, "colour": "red"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            "x",
            r#"{"publishers": {"a": "t"}, "archive_every": 0}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            "x",
            r#"{"publishers": {"a": "t"}, "retain_for": "soon"}"#,
            StatusCode::BAD_REQUEST,
        ),
        ("x", "not json", StatusCode::BAD_REQUEST),
        (
            "Bad",
            r#"{"publishers": {"a": "t"}}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            CHANNEL,
            r#"{"publishers": {"a": "t"}}"#,
            StatusCode::CONFLICT,
        ),
    ] {
        let (got, answer) = put(&hub, name, body).await;
        assert_eq!(got, status, "{name} {body}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
    }
    let anonymous = hub
        .client
        .put(format!("{}/api/channels/x", hub.url))
        .json(&json!({"publishers": {"a": "t"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(push(&hub, "x", "t").await, StatusCode::NOT_FOUND);

    // Created: served at once, like a declared channel.
    let (status, answer) = put(
        &hub,
        "x",
        r#"{"publishers": {"alice": "alice-token"}, "read_token": null, "retain_changes": 500, "retain_for": "30days", "archive_every": 100}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert_eq!(answer["retention"]["archive_every"], 100);
    assert_eq!(answer["retention"]["retain_for"], 30 * 86_400);
    assert!(!answer.to_string().contains("alice-token"));
    assert_eq!(push(&hub, "x", "alice-token").await, StatusCode::ACCEPTED);
    assert_eq!(push(&hub, "x", TOKEN).await, StatusCode::FORBIDDEN);
    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe_at(&hub.url, "x", &receiver.url).await;
    receiver.wait_verified(1).await;
    wait_subscriptions(&hub.url, 1).await;
    assert_eq!(push(&hub, "x", "alice-token").await, StatusCode::ACCEPTED);
    receiver
        .wait_seq(2, std::time::Duration::from_secs(15))
        .await;
    let description = hub.text("/.well-known/resourcesync").await;
    assert!(
        description.contains("/channels/x/capabilitylist.xml"),
        "{description}"
    );
    let listed = admin_json(&hub.url, "/api/channels").await;
    let x = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "x")
        .expect("x is listed");
    assert_eq!(
        (x["declared"].as_str(), x["last"].as_u64()),
        (Some("api"), Some(2))
    );
    let news = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == CHANNEL)
        .unwrap();
    assert_eq!(news["declared"], "start-up");

    // Private now: reads need the token.
    let (status, _) = put(
        &hub,
        "x",
        r#"{"publishers": {"alice": "alice-token"}, "read_token": "reader"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let topic = format!("{}/channels/x/changelist.xml", hub.url);
    assert_eq!(
        hub.client.get(&topic).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );

    // A restart keeps it, with its log.
    hub.stop().await;
    let hub = TestHub::start_in(dir.path().to_path_buf(), |_| {}).await;
    let resp = hub
        .client
        .get(format!(
            "{}/channels/x/changes?after=0&token=reader",
            hub.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.text().await.unwrap().contains("ch:last=\"2\""));
    assert_eq!(push(&hub, "x", "alice-token").await, StatusCode::ACCEPTED);

    // Removed: gone for every request; again is a 404; a declared channel cannot be.
    let delete = |name: &'static str| {
        hub.client
            .delete(format!("{}/api/channels/{name}", hub.url))
            .bearer_auth(ADMIN)
            .send()
    };
    assert_eq!(delete("x").await.unwrap().status(), StatusCode::NO_CONTENT);
    assert_eq!(push(&hub, "x", "alice-token").await, StatusCode::NOT_FOUND);
    let topic = format!("{}/channels/x/changelist.xml?token=reader", hub.url);
    assert_eq!(
        hub.client.get(&topic).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(delete("x").await.unwrap().status(), StatusCode::NOT_FOUND);
    assert_eq!(
        delete(CHANNEL).await.unwrap().status(),
        StatusCode::CONFLICT
    );
    assert_eq!(push(&hub, CHANNEL, TOKEN).await, StatusCode::ACCEPTED);
}
