//! The example documents of `proto/examples/` are what a real hub serves and sends.
//!
//! Each test starts a hub with the channels the examples name, pushes the changes the examples
//! show through the ingest endpoint, and compares what the hub answers (or POSTs to a real
//! callback) with the example file, byte for byte once three things are normalised in both:
//! the hub's address (`http://127.0.0.1:PORT` becomes the examples' `http://hub.example.com`),
//! every W3C datetime value of an attribute or element (which becomes one fixed token), and
//! the random epoch of the log (`ch:epoch`).
//!
//! | example | the hub's document |
//! |---|---|
//! | `changelist.xml` | `GET /channels/dataset1/changelist.xml`, the topic |
//! | `capabilitylist.xml` | `GET /channels/dataset1/capabilitylist.xml` |
//! | `source-description.xml` | `GET /.well-known/resourcesync` (channels `dataset1`, `photos`) |
//! | `notification.xml` | the body of the notification POSTed to a WebSub subscriber |
//! | `changelist-archive.xml` | `GET /channels/dataset1/changelist-archive.xml`, lists closed every 2 changes |
//! | `changelist-closed.xml` | `GET /channels/dataset1/changelist/1-2.xml`, the first closed list |
//!
//! `changelist-index.xml` is not here: the hub serves no Change List Index (its archive is a
//! `changelist-archive`), so that file is only a golden file of the writer and the parser
//! (`src/resourcesync/tests.rs`).

use crate::common::*;
use reqwest::StatusCode;
use serde_json::json;
use std::time::Duration;

/// The hub's public URL in the examples.
const EXAMPLE_HUB: &str = "http://hub.example.com";
/// What every datetime value becomes.
const DATETIME: &str = "{datetime}";
/// What the (random) epoch of the top-level `rs:md` becomes.
const EPOCH: &str = "{epoch}";

const DATASET1: &str = "dataset1";
const DATASET1_TOKEN: &str = "dataset1-token";
const PHOTOS: &str = "photos";
const PHOTOS_TOKEN: &str = "photos-token";

/// A hub whose channels are exactly `dataset1` and `photos` (the harness's own channel is
/// removed, so that the Source Description lists what the example does).
async fn hub() -> TestHub {
    TestHub::start(|c| {
        c.channels.remove(CHANNEL);
        *c = c
            .clone()
            .with_channel(DATASET1, DATASET1_TOKEN)
            .with_channel(PHOTOS, PHOTOS_TOKEN);
    })
    .await
}

fn example(name: &str) -> String {
    let path = format!("{}/proto/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A W3C datetime with at least a month (`YYYY-MM…`): a bare year would also match numbers
/// such as `length="2048"`, and the hub never writes one.
fn is_datetime(value: &str) -> bool {
    let b = value.as_bytes();
    b.len() >= 7
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && changehub::model::parse_w3c_datetime(value).is_ok()
}

/// The hub's address replaced by the examples' one, then every attribute value and every
/// element text that is a datetime replaced by [`DATETIME`]. Nothing else changes.
fn normalise(doc: &str, hub_url: &str) -> String {
    let doc = doc.replace(hub_url, EXAMPLE_HUB);
    // The epoch of a log is random.
    let doc = match doc.split_once(" ch:epoch=\"") {
        Some((head, tail)) => match tail.split_once('"') {
            Some((_, rest)) => format!("{head} ch:epoch=\"{EPOCH}\"{rest}"),
            None => doc,
        },
        None => doc,
    };
    // Attribute values: the odd pieces between double quotes (the writer and the examples
    // quote with `"`, and a `"` inside a value is always escaped).
    let attrs: Vec<&str> = doc
        .split('"')
        .enumerate()
        .map(|(i, piece)| {
            if i % 2 == 1 && is_datetime(piece) {
                DATETIME
            } else {
                piece
            }
        })
        .collect();
    let doc = attrs.join("\"");
    // Element text: what follows a `>` up to the next `<`.
    let texts: Vec<String> = doc
        .split('>')
        .map(|piece| match piece.split_once('<') {
            Some((text, tail)) if is_datetime(text) => format!("{DATETIME}<{tail}"),
            _ => piece.to_string(),
        })
        .collect();
    texts.join(">")
}

/// `served` (from the hub at `hub_url`) is the example `file`, up to normalisation.
fn assert_golden(served: &[u8], file: &str, hub_url: &str) {
    let served = std::str::from_utf8(served).expect("the hub writes UTF-8");
    let want = normalise(&example(file), hub_url);
    let got = normalise(served, hub_url);
    assert!(
        got == want,
        "the hub's document differs from proto/examples/{file}\n\
         --- served (normalised) ---\n{got}\n--- example (normalised) ---\n{want}\n\
         --- served (as is) ---\n{served}"
    );
}

/// Pushes `changes` (a JSON array) to `channel` with its publisher token; asserts 202 and the
/// seq range the hub gave them.
async fn push(
    hub: &TestHub,
    channel: &str,
    token: &str,
    changes: serde_json::Value,
    seqs: (u64, u64),
) {
    let resp = hub
        .client
        .post(format!("{}/channels/{channel}/changes", hub.url))
        .bearer_auth(token)
        .json(&changes)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let answer: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        (answer["first"].as_u64(), answer["last"].as_u64()),
        (Some(seqs.0), Some(seqs.1)),
        "{answer}"
    );
}

async fn get(hub: &TestHub, path: &str) -> Vec<u8> {
    let resp = hub
        .client
        .get(format!("{}{path}", hub.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "GET {path}");
    assert_eq!(
        resp.headers()["content-type"],
        "application/xml",
        "GET {path}"
    );
    resp.bytes().await.unwrap().to_vec()
}

/// The changes of `changelist.xml`.
fn changelist_changes() -> serde_json::Value {
    json!([
        {
            "loc": "http://example.com/res1.html",
            "change": "created",
            "datetime": "2013-01-03T11:00:00Z",
            "hash": "md5:1584abdf8ebdc9802ac0c6a7402c03b6",
            "length": 8876,
            "type": "text/html"
        },
        {
            "loc": "http://example.com/res2.pdf",
            "change": "updated",
            "datetime": "2013-01-03T13:00:00Z",
            "lastmod": "2013-01-03T12:58:30Z",
            "hash": "md5:1e0d5cb8ef6ba40c99b14c0237be735e sha-256:854f61290e2e197a11bc91063afce22e43f8ccc655237050ace766adc68dc784",
            "length": 14599,
            "type": "application/pdf",
            "links": [{
                "rel": "duplicate",
                "href": "http://mirror.example.com/res2.pdf",
                "modified": "2013-01-03T12:58:30Z",
                "pri": "1"
            }]
        },
        {
            "loc": "http://example.com/search?q=res3&format=tiff",
            "change": "deleted",
            "datetime": "2013-01-03T18:00:00Z"
        },
        {
            "loc": "http://example.com/res2.pdf",
            "change": "updated",
            "datetime": "2013-01-03T21:00:00.5Z",
            "length": 14612,
            "type": "application/pdf",
            "links": [{
                "rel": "http://www.openarchives.org/rs/terms/patch",
                "href": "http://example.com/res2-diff.json",
                "type": "application/json-patch+json"
            }]
        }
    ])
}

/// The changes of `notification.xml` (seqs 41 to 43).
fn notification_changes() -> serde_json::Value {
    json!([
        {
            "loc": "http://example.com/articles/42",
            "change": "created",
            "datetime": "2024-05-01T10:15:00Z",
            "type": "text/html"
        },
        {
            "loc": "http://example.com/articles/17",
            "change": "updated",
            "datetime": "2024-05-01T10:15:01Z",
            "lastmod": "2024-04-30T23:59:59Z",
            "hash": "sha-256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "length": 2048,
            "type": "text/html"
        },
        {
            "loc": "http://example.com/articles/3",
            "change": "deleted",
            "datetime": "2024-05-01T10:15:02.25Z"
        }
    ])
}

#[test]
fn normalise_touches_only_the_address_and_datetimes() {
    let doc = "<a from=\"2013-01-03T11:00:00Z\" until=\"2024-05-01T12:15:00.25+02:00\" \
               length=\"2048\" ch:seq=\"2024\" href=\"http://127.0.0.1:9/x\">\n\
               <lastmod>2013-01-04</lastmod><loc>http://e.org/2013-01-04</loc>\n\
               <b v=\"2013-1-4\">2024</b></a>";
    assert_eq!(
        normalise(doc, "http://127.0.0.1:9"),
        "<a from=\"{datetime}\" until=\"{datetime}\" \
         length=\"2048\" ch:seq=\"2024\" href=\"http://hub.example.com/x\">\n\
         <lastmod>{datetime}</lastmod><loc>http://e.org/2013-01-04</loc>\n\
         <b v=\"2013-1-4\">2024</b></a>"
    );
}

/// The topic Change List, the Resource List, the Capability List and the Source Description.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_documents_served_by_the_hub() {
    let hub = hub().await;
    push(&hub, DATASET1, DATASET1_TOKEN, changelist_changes(), (1, 4)).await;

    let topic = get(&hub, "/channels/dataset1/changelist.xml").await;
    assert_golden(&topic, "changelist.xml", &hub.url);

    // The Resource List of the same changes: res3 is deleted, res2 is at its latest change.
    let resources = get(&hub, "/channels/dataset1/resourcelist.xml").await;
    assert_golden(&resources, "resourcelist.xml", &hub.url);

    let caps = get(&hub, "/channels/dataset1/capabilitylist.xml").await;
    assert_golden(&caps, "capabilitylist.xml", &hub.url);

    let description = get(&hub, "/.well-known/resourcesync").await;
    assert_golden(&description, "source-description.xml", &hub.url);

    // The Source Description's rel="describedby" is a page the hub serves.
    let home = hub
        .client
        .get(format!("{}/", hub.url))
        .send()
        .await
        .unwrap();
    assert_eq!(home.status(), StatusCode::OK);
    assert!(home.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
}

/// The notification a WebSub subscriber receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_notification_sent_by_the_hub() {
    let hub = hub().await;
    // Seqs 1 to 40 come before the example's changes (dated earlier, since datetimes never
    // go backwards in a channel) and are published before anyone subscribes.
    let earlier: Vec<_> = (1..=40)
        .map(|i| {
            json!({
                "loc": format!("http://example.com/articles/old/{i}"),
                "change": "updated",
                "datetime": "2024-05-01T10:00:00Z"
            })
        })
        .collect();
    push(&hub, DATASET1, DATASET1_TOKEN, json!(earlier), (1, 40)).await;
    hub.wait_published_in(DATASET1, 40).await;

    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe_at(&hub.url, DATASET1, &receiver.url).await;
    receiver.wait_verified(1).await;
    wait_subscriptions(&hub.url, 1).await;

    push(
        &hub,
        DATASET1,
        DATASET1_TOKEN,
        notification_changes(),
        (41, 43),
    )
    .await;
    receiver.wait_seq(43, Duration::from_secs(15)).await;

    let delivered = receiver.delivered();
    assert_eq!(delivered.len(), 1, "one notification for one request");
    assert_eq!(delivered[0].seqs(), vec![41, 42, 43]);
    assert_golden(&delivered[0].body, "notification.xml", &hub.url);
}

/// The Change List Archive and a closed Change List, with the open list closed every 2 changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_archive_served_by_the_hub() {
    let hub = TestHub::start(|c| {
        c.channels.remove(CHANNEL);
        *c = c.clone().with_channel(DATASET1, DATASET1_TOKEN);
        c.channels.get_mut(DATASET1).unwrap().retention.list_size = 2;
    })
    .await;
    push(&hub, DATASET1, DATASET1_TOKEN, changelist_changes(), (1, 4)).await;

    let archive = get(&hub, "/channels/dataset1/changelist-archive.xml").await;
    assert_golden(&archive, "changelist-archive.xml", &hub.url);
    let closed = get(&hub, "/channels/dataset1/changelist/1-2.xml").await;
    assert_golden(&closed, "changelist-closed.xml", &hub.url);
}
