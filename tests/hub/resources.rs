//! The Resource List: every resource whose latest change is not `deleted`, from the hub's
//! resource index, with the seq it reflects; a Resource List Index of pages for big channels;
//! a baseline through the hub alone, then `changes?after=` that seq.

use crate::common::*;
use reqwest::StatusCode;
use std::collections::BTreeMap;

/// One `<url>` of a Resource List as the hub writes it: loc → (ch:seq, hash, length, type).
type Listed = BTreeMap<String, (u64, Option<String>, Option<u64>, Option<String>)>;

fn attr(entry: &str, name: &str) -> Option<String> {
    let start = entry.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = entry[start..].find('"')? + start;
    Some(entry[start..end].to_string())
}

fn listed(body: &str) -> Listed {
    body.split("<url>")
        .skip(1)
        .map(|entry| {
            let loc = entry
                .split_once("<loc>")
                .and_then(|(_, rest)| rest.split_once("</loc>"))
                .map(|(loc, _)| loc.to_string())
                .expect("a <loc>");
            let seq = attr(entry, "ch:seq")
                .and_then(|s| s.parse().ok())
                .expect("ch:seq");
            let length = attr(entry, "length").and_then(|s| s.parse().ok());
            (loc, (seq, attr(entry, "hash"), length, attr(entry, "type")))
        })
        .collect()
}

/// The document and its `X-Changehub-Seq`.
async fn get(hub: &TestHub, path_and_query: &str) -> (StatusCode, String, Option<u64>) {
    let resp = hub
        .client
        .get(format!("{}{path_and_query}", hub.url))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let seq = resp
        .headers()
        .get("x-changehub-seq")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (status, resp.text().await.unwrap(), seq)
}

fn change(loc: &str, kind: &str, hash: &str) -> serde_json::Value {
    serde_json::json!({
        "loc": format!("http://example.com/{loc}"),
        "change": kind,
        "hash": hash,
        "length": hash.len(),
        "type": "text/plain",
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_list_shows_the_latest_state_and_the_seq_to_go_on_from() {
    let hub = TestHub::start(|_| {}).await;
    let path = format!("/channels/{CHANNEL}/resourcelist.xml");
    let (status, body, seq) = get(&hub, &path).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(seq, Some(0));
    assert!(body.contains("capability=\"resourcelist\""), "{body}");
    assert!(listed(&body).is_empty());

    let first = serde_json::json!([
        change("a", "created", "md5:a1"),
        change("b", "created", "md5:b1"),
        change("c", "created", "md5:c1"),
        change("b", "updated", "md5:b2"),
        change("a", "deleted", "md5:a1"),
    ]);
    assert_eq!(hub.push_json(first).await.0, StatusCode::ACCEPTED);
    let (status, body, seq) = get(&hub, &path).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(seq, Some(5));
    assert!(
        body.contains("ch:seq=\"5\" ch:epoch=\""),
        "the snapshot's seq in the document: {body}"
    );
    assert!(
        body.contains(" at=\"") && body.contains(" completed=\""),
        "{body}"
    );
    let got = listed(&body);
    let want: Listed = [
        ("http://example.com/b", 4, "md5:b2"),
        ("http://example.com/c", 3, "md5:c1"),
    ]
    .into_iter()
    .map(|(loc, seq, hash)| {
        let fields = (
            seq,
            Some(hash.to_string()),
            Some(6),
            Some("text/plain".to_string()),
        );
        (loc.to_string(), fields)
    })
    .collect();
    assert_eq!(got, want, "deleted a is not listed");

    // Going on from the snapshot's seq gives exactly the changes made since.
    hub.push("later", 3).await;
    let after = hub
        .client
        .get(format!("{}/channels/{CHANNEL}/changes?after=5", hub.url))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(
        crate::topics::locs(&after),
        (0..3)
            .map(|i| format!("http://example.com/later/{i}"))
            .collect::<Vec<_>>()
    );

    // The Capability List offers it.
    let (_, caps, _) = get(&hub, &format!("/channels/{CHANNEL}/capabilitylist.xml")).await;
    assert!(
        caps.contains(&format!(
            "<loc>{}/channels/{CHANNEL}/resourcelist.xml</loc>\n    <rs:md capability=\"resourcelist\"/>",
            hub.url
        )),
        "{caps}"
    );
}

/// More than 50,000 resources: `resourcelist.xml` is a Resource List Index whose pages, read in
/// order, list every resource exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_channel_gets_an_index_of_pages() {
    let hub = TestHub::start(|c| c.max_body = 8 << 20).await;
    let total = 50_000 + 1_234;
    for start in (0..total).step_by(10_000) {
        let batch: Vec<_> = (start..(start + 10_000).min(total))
            .map(|i| serde_json::json!({"loc": format!("http://example.com/r/{i}"), "change": "created"}))
            .collect();
        let (status, json) = hub.push_json(serde_json::Value::Array(batch)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{json}");
    }
    let path = format!("/channels/{CHANNEL}/resourcelist.xml");
    let (status, index, seq) = get(&hub, &path).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(seq, Some(total as u64));
    assert!(
        index.starts_with("<?xml") && index.contains("<sitemapindex"),
        "{index}"
    );
    let pages: Vec<String> = index
        .split("<loc>")
        .skip(1)
        .filter_map(|p| {
            p.split_once("</loc>")
                .map(|(loc, _)| loc.replace("&amp;", "&"))
        })
        .collect();
    assert_eq!(pages.len(), 2, "{index}");
    let mut seen = BTreeMap::new();
    for page in &pages {
        let rel = page.strip_prefix(&hub.url).expect("a page of this hub");
        let (status, body, _) = get(&hub, rel).await;
        assert_eq!(status, StatusCode::OK, "{page}: {body}");
        assert!(body.contains("<rs:ln rel=\"index\""), "{body}");
        for (loc, (seq, ..)) in listed(&body) {
            assert!(seen.insert(loc, seq).is_none(), "listed once");
        }
    }
    assert_eq!(seen.len(), total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pages_get_a_clear_400() {
    let hub = TestHub::start(|_| {}).await;
    hub.push("r", 5).await;
    let base = format!("/channels/{CHANNEL}/resourcelist.xml");
    for (query, why) in [
        ("?after=x", "after must be a seq"),
        ("?upto=3", "upto needs after"),
        ("?after=3&upto=3", "must be greater"),
        ("?after=4&upto=2", "must be greater"),
        ("?after=99", "beyond the channel's newest seq"),
        ("?after=-1", "after must be a seq"),
    ] {
        let (status, body, _) = get(&hub, &format!("{base}{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert!(body.contains(why), "{query}: {body}");
    }
    let (status, _, _) = get(&hub, "/channels/nope/resourcelist.xml").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body, _) = get(&hub, &format!("{base}?after=2")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed(&body).len(), 3, "a page after seq 2");
}

/// Named publishers: each pushes with its own token, and the resource index remembers which
/// one sent each resource's latest change (admin API). Names are listed; tokens never are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_remembers_which_publisher_sent_each_resource() {
    let hub = TestHub::start(|c| {
        let news = c.channels.get_mut(CHANNEL).unwrap();
        news.set_publisher("alice", "alice-token");
        news.set_publisher("bob", "bob-token");
    })
    .await;
    let push = |token: &'static str, loc: &'static str, key: Option<&'static str>| {
        let mut request = hub
            .client
            .post(format!("{}/channels/{CHANNEL}/changes", hub.url))
            .bearer_auth(token)
            .json(&serde_json::json!({"loc": loc, "change": "updated"}));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        async move { request.send().await.unwrap().status() }
    };
    assert_eq!(
        push("alice-token", "http://example.com/a", Some("k")).await,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        push("alice-token", "http://example.com/b", None).await,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        push("bob-token", "http://example.com/a", None).await,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        push(TOKEN, "http://example.com/c", None).await,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        push("eve-token", "http://example.com/a", None).await,
        StatusCode::FORBIDDEN
    );
    // The same idempotency key and body from another publisher is another request.
    assert_eq!(
        push("bob-token", "http://example.com/a", Some("k")).await,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    let who = |loc: &'static str| {
        let request = hub
            .client
            .get(format!(
                "{}/api/channels/{CHANNEL}/resources?loc={}",
                hub.url,
                url_escape(loc)
            ))
            .bearer_auth(ADMIN);
        async move {
            let resp = request.send().await.unwrap();
            let status = resp.status();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, a) = who("http://example.com/a").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (a["seq"].as_u64(), a["source"].as_str()),
        (Some(3), Some("bob"))
    );
    let (_, b) = who("http://example.com/b").await;
    assert_eq!(b["source"], "alice");
    let (_, c) = who("http://example.com/c").await;
    assert_eq!(c["source"], "default");
    let (status, _) = who("http://example.com/none").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let anonymous = hub
        .client
        .get(format!(
            "{}/api/channels/{CHANNEL}/resources?loc=http%3A%2F%2Fexample.com%2Fa",
            hub.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);

    let channels = hub
        .client
        .get(format!("{}/api/channels", hub.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        channels.contains(r#""publishers":["default","alice","bob"]"#),
        "{channels}"
    );
    assert!(!channels.contains("alice-token") && !channels.contains(TOKEN));
}

/// `s` as a query value.
fn url_escape(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}
