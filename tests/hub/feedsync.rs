//! FeedSync through the real server: two named publishers edit the same resources, plain
//! changes and posted collections; the hub keeps every item's sync metadata, serves the
//! collection, detects their concurrent edits as a conflict, marks it in the Change Lists and
//! the admin API, and clears it once a source posts an update that subsumes both versions.
//! Bad collections get a 4xx and change nothing. On the embedded store and on Redis.

use crate::common::*;
use crate::redis_server::RedisServer;
use changehub::config::{Config, StoreConfig};
use changehub::feedsync::{parse_json, parse_pox, write_json, write_pox, Collection, Entry};
use changehub::model::feedsync::Item;
use reqwest::StatusCode;
use serde_json::json;

const ALICE: &str = "token-alice";
const BOB: &str = "token-bob";
const LOC_A: &str = "http://example.com/a";

fn two_publishers(c: &mut Config) {
    let channel = c.channels.get_mut(CHANNEL).unwrap();
    channel.set_publisher("alice", ALICE);
    channel.set_publisher("bob", BOB);
}

async fn push(hub: &TestHub, token: &str, body: serde_json::Value) -> serde_json::Value {
    let resp = hub
        .client
        .post(format!("{}/channels/{CHANNEL}/changes", hub.url))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    resp.json().await.unwrap()
}

/// Posts a collection body; the status and the JSON answer.
async fn post(
    hub: &TestHub,
    token: &str,
    content_type: &str,
    body: String,
) -> (StatusCode, serde_json::Value) {
    let resp = hub
        .client
        .post(format!("{}/channels/{CHANNEL}/feedsync", hub.url))
        .bearer_auth(token)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or_default())
}

/// The channel's items, read from `feedsync.xml` and `feedsync.json` (which must agree).
async fn items(hub: &TestHub) -> Vec<Item> {
    let xml = hub.text(&format!("/channels/{CHANNEL}/feedsync.xml")).await;
    let json = hub
        .text(&format!("/channels/{CHANNEL}/feedsync.json"))
        .await;
    let from_xml = parse_pox(xml.as_bytes(), 1000).unwrap();
    assert_eq!(from_xml, parse_json(json.as_bytes(), 1000).unwrap());
    from_xml
}

fn item<'a>(items: &'a [Item], loc: &str) -> &'a Item {
    items.iter().find(|i| i.data.loc == loc).unwrap()
}

fn collection(item: Item) -> Collection {
    Collection {
        since: 0,
        until: 0,
        items: vec![Entry { seq: 0, item }],
    }
}

/// A source's own edit of `item`, made at `when` (seconds) by endpoint `by`.
fn edited(item: &Item, by: &str, when: i64, hash: &str) -> Item {
    let mut next = item.clone();
    next.sync.update(Some(by), Some(when), false);
    next.data.hash = Some(hash.into());
    next
}

async fn changes_after(hub: &TestHub, after: u64) -> String {
    hub.text(&format!("/channels/{CHANNEL}/changes?after={after}"))
        .await
}

async fn two_sources_edit_the_same_resources(hub: TestHub) {
    // Plain changes: alice creates a and b, bob updates a.
    push(
        &hub,
        ALICE,
        json!([
            {"loc": LOC_A, "change": "created", "hash": "md5:a0"},
            {"loc": "http://example.com/b", "change": "created"},
        ]),
    )
    .await;
    push(
        &hub,
        BOB,
        json!({"loc": LOC_A, "change": "updated", "hash": "md5:a1"}),
    )
    .await;
    let seen = items(&hub).await;
    let a = item(&seen, LOC_A).clone();
    assert_eq!(a.sync.id, "http:%2F%2Fexample.com%2Fa");
    assert_eq!(a.sync.updates, 2);
    let bys: Vec<_> = a
        .sync
        .history
        .iter()
        .map(|h| (h.sequence, h.by.clone()))
        .collect();
    assert_eq!(bys, [(2, Some("bob".into())), (1, Some("alice".into()))]);
    assert_eq!(item(&seen, "http://example.com/b").sync.updates, 1);
    let head = hub.catch_up(0).await.len() as u64;
    assert_eq!(head, 3);

    // Both edit a from the same state, each in its own copy, then post their collections.
    let t = time::OffsetDateTime::now_utc().unix_timestamp();
    let by_alice = edited(&a, "alice", t, "md5:a2");
    let by_bob = edited(&a, "bob", t + 10, "md5:b2");
    let body = write_json(&collection(by_alice.clone())).to_string();
    let (status, answer) = post(&hub, ALICE, "application/json", body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(
        (answer["accepted"].as_u64(), answer["last"].as_u64()),
        (Some(1), Some(4))
    );
    let body = write_pox(&collection(by_bob.clone()));
    let (status, answer) = post(&hub, BOB, "application/xml", body.clone()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["conflicts"], json!([LOC_A]), "{answer}");
    assert_eq!(answer["last"].as_u64(), Some(5));

    // Bob's edit wins (the later one), alice's is its conflict, everywhere.
    let merged = item(&items(&hub).await, LOC_A).clone();
    assert_eq!(merged.data.hash.as_deref(), Some("md5:b2"));
    assert_eq!(merged.sync.conflicts.len(), 1);
    assert_eq!(
        merged.sync.conflicts[0].data.hash.as_deref(),
        Some("md5:a2")
    );
    let list = changes_after(&hub, 4).await;
    assert!(list.contains("ch:conflicts=\"1\""), "{list}");
    let open = admin_json(&hub.url, &format!("/api/channels/{CHANNEL}/conflicts")).await;
    assert_eq!(open["conflicts"][0]["loc"], LOC_A, "{open}");
    assert_eq!(
        open["conflicts"][0]["sync"]["conflicts"][0]["hash"],
        "md5:a2"
    );

    // The same collection again changes nothing.
    let (status, answer) = post(&hub, BOB, "application/xml", body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(answer["accepted"], 0, "{answer}");

    // A partial collection holds only what changed after a seq.
    let partial = hub
        .text(&format!("/channels/{CHANNEL}/feedsync.xml?since=4"))
        .await;
    assert!(partial.contains("since=\"00000000000000000004\" until=\"00000000000000000005\""));
    assert_eq!(
        parse_pox(partial.as_bytes(), 10).unwrap(),
        vec![merged.clone()]
    );

    // Alice resolves: she keeps her data, and merges both versions into the history (§3.4).
    let mut resolved = edited(&merged, "alice", t + 20, "md5:a3");
    for conflict in std::mem::take(&mut resolved.sync.conflicts) {
        resolved.sync.resolve(&conflict.sync);
    }
    let body = write_json(&collection(resolved.clone())).to_string();
    let (status, answer) = post(&hub, ALICE, "application/json", body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["conflicts"], json!([]));
    let now = item(&items(&hub).await, LOC_A).clone();
    assert_eq!(now, resolved);
    let open = admin_json(&hub.url, &format!("/api/channels/{CHANNEL}/conflicts")).await;
    assert_eq!(open["conflicts"], json!([]));
    let list = changes_after(&hub, 5).await;
    assert!(
        list.contains("md5:a3") && !list.contains("ch:conflicts"),
        "{list}"
    );

    // Bad collections: a clear 4xx, and nothing appended.
    let head = hub.catch_up(0).await.len();
    let wrong_id = {
        let mut other = resolved.clone();
        other.sync.id = "someone-elses-id".into();
        write_json(&collection(other)).to_string()
    };
    for (token, content_type, body, want) in [
        (
            ALICE,
            "application/xml",
            "<collection><item>".to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            ALICE,
            "application/json",
            "{\"items\": 3}".to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            ALICE,
            "application/xml",
            write_pox(&collection(resolved.clone())).replace("updates=\"", "updates=\"x"),
            StatusCode::BAD_REQUEST,
        ),
        (
            ALICE,
            "application/json",
            wrong_id,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            ALICE,
            "text/plain",
            "x".to_string(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "wrong",
            "application/json",
            "[]".to_string(),
            StatusCode::FORBIDDEN,
        ),
    ] {
        let (status, answer) = post(&hub, token, content_type, body).await;
        assert_eq!(status, want, "{answer}");
        assert!(
            answer["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{answer}"
        );
    }
    assert_eq!(
        hub.catch_up(0).await.len(),
        head,
        "bad input changed nothing"
    );
    let mut hub = hub;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_edit_the_same_resources_embedded() {
    two_sources_edit_the_same_resources(TestHub::start(two_publishers).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_edit_the_same_resources_on_redis() {
    let redis = RedisServer::start(true);
    let url = redis.url();
    let hub = TestHub::start(move |c| {
        two_publishers(c);
        c.store = StoreConfig::Redis { url };
    })
    .await;
    two_sources_edit_the_same_resources(hub).await;
}
