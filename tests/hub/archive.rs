//! The Change List Archive: the open list closes every N changes, closed lists are immutable,
//! and walking Capability List → archive (→ archive pages) → closed lists → topic yields every
//! retained change exactly once, in order — on both stores and across a restart.

use crate::common::*;
use crate::redis_server::RedisServer;
use changehub::config::StoreConfig;
use reqwest::StatusCode;
use std::time::Duration;

/// The texts of every `<loc>` of `doc`, unescaped.
fn locs(doc: &str) -> Vec<String> {
    doc.split("<loc>")
        .skip(1)
        .filter_map(|piece| piece.split_once("</loc>"))
        .map(|(loc, _)| loc.replace("&amp;", "&"))
        .collect()
}

/// The value of the first `name="…"` attribute of `doc`.
fn attr<'a>(doc: &'a str, name: &str) -> Option<&'a str> {
    let start = doc.find(&format!(" {name}=\""))? + name.len() + 3;
    doc[start..].split('"').next()
}

/// Every `ch:seq` of `doc`, in document order.
fn seqs(doc: &str) -> Vec<u64> {
    doc.split(" ch:seq=\"")
        .skip(1)
        .map(|piece| piece.split('"').next().unwrap().parse().unwrap())
        .collect()
}

async fn get(client: &reqwest::Client, url: &str) -> String {
    let resp = client.get(url).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "GET {url}");
    resp.text().await.unwrap()
}

/// The loc of the capability `name` in a Capability List.
fn capability(caps: &str, name: &str) -> String {
    caps.split("<url>")
        .skip(1)
        .find(|entry| attr(entry, "capability") == Some(name))
        .and_then(|entry| locs(entry).into_iter().next())
        .unwrap_or_else(|| panic!("no {name} in {caps}"))
}

/// What a ResourceSync destination reads, starting from the Capability List of `channel`:
/// the closed lists the archive (or each page of its index) points to, then the topic. Returns
/// every seq read, the number of closed lists and the topic's seqs.
async fn walk(hub_url: &str, channel: &str) -> (Vec<u64>, usize, Vec<u64>) {
    let client = reqwest::Client::new();
    let caps = get(
        &client,
        &format!("{hub_url}/channels/{channel}/capabilitylist.xml"),
    )
    .await;
    let archive_url = capability(&caps, "changelist-archive");
    let topic_url = capability(&caps, "changelist");
    let archive = get(&client, &archive_url).await;
    assert_eq!(attr(&archive, "capability"), Some("changelist-archive"));
    let pages = if archive.contains("<sitemapindex") {
        let mut pages = Vec::new();
        for page in locs(&archive) {
            let doc = get(&client, &page).await;
            assert!(doc.contains("<urlset"), "an archive page is a <urlset>");
            assert!(doc.contains(&format!("rel=\"index\" href=\"{archive_url}\"")));
            pages.push(doc);
        }
        pages
    } else {
        vec![archive]
    };
    let mut all = Vec::new();
    let mut closed = 0;
    for page in &pages {
        for list in locs(page) {
            let doc = get(&client, &list).await;
            assert_eq!(attr(&doc, "capability"), Some("changelist"));
            assert!(attr(&doc, "until").is_some(), "a closed list has until");
            assert!(doc.contains(&format!("rel=\"archives\" href=\"{archive_url}\"")));
            all.extend(seqs(&doc));
            closed += 1;
        }
    }
    let topic = get(&client, &topic_url).await;
    assert!(attr(&topic, "from").is_some(), "the topic has from");
    assert!(attr(&topic, "until").is_none(), "the topic is open");
    assert!(topic.contains(&format!("rel=\"archives\" href=\"{archive_url}\"")));
    let open = seqs(&topic);
    all.extend(&open);
    (all, closed, open)
}

async fn push_many(hub: &TestHub, n: usize) {
    for round in 0..n / 5_000 {
        hub.push(&format!("r{round}"), 5_000).await;
    }
    if !n.is_multiple_of(5_000) {
        hub.push("rest", n % 5_000).await;
    }
}

/// 25,000 changes with the default close every 10,000: 2 closed lists and 5,000 in the
/// topic; the walk yields 1..=25,000 once, in order; the same after a restart.
async fn twenty_five_thousand(tweak: impl Fn(&mut changehub::config::Config) + Clone) {
    let dir = tempfile::tempdir().unwrap();
    let mut hub = TestHub::start_in(dir.path().to_path_buf(), tweak.clone()).await;
    push_many(&hub, 25_000).await;
    let want: Vec<u64> = (1..=25_000).collect();
    let (all, closed, open) = walk(&hub.url, CHANNEL).await;
    assert_eq!(closed, 2);
    assert_eq!(open.len(), 5_000);
    assert!(all == want, "every seq once, in order");
    hub.stop().await;

    let hub = TestHub::start_in(dir.path().to_path_buf(), tweak).await;
    let (all, closed, open) = walk(&hub.url, CHANNEL).await;
    assert_eq!((closed, open.len()), (2, 5_000));
    assert!(all == want, "every seq once, in order, after a restart");
    // Closing goes on where it stopped: 5,000 more close the third list.
    push_many(&hub, 5_000).await;
    let (all, closed, open) = walk(&hub.url, CHANNEL).await;
    assert_eq!((closed, open.len()), (3, 0));
    assert!(all == (1..=30_000).collect::<Vec<u64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_walk_yields_every_change_once_embedded() {
    twenty_five_thousand(|_| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_walk_yields_every_change_once_on_redis() {
    let redis = RedisServer::start(true);
    let url = redis.url();
    twenty_five_thousand(move |c| {
        c.store = StoreConfig::Redis { url: url.clone() };
    })
    .await;
}

/// More closed lists than one archive document holds: an archive index of pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_archive_becomes_an_index_of_pages() {
    let hub = TestHub::start(|c| {
        c.channels.get_mut(CHANNEL).unwrap().retention.list_size = 1;
    })
    .await;
    let n = 2 * changehub::catchup::ARCHIVE_PAGE as usize + 500;
    hub.push("r", n).await;
    let client = reqwest::Client::new();
    let archive = get(
        &client,
        &format!("{}/channels/{CHANNEL}/changelist-archive.xml", hub.url),
    )
    .await;
    assert!(archive.contains("<sitemapindex"), "{archive}");
    assert_eq!(locs(&archive).len(), 3);
    let (all, closed, open) = walk(&hub.url, CHANNEL).await;
    assert_eq!((closed, open.len()), (n, 0));
    assert!(all == (1..=n as u64).collect::<Vec<u64>>());
}

/// Retention drops whole closed lists, oldest first; the walk starts at the oldest retained
/// list and `changes?after=` still crosses list boundaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_whole_closed_lists() {
    let hub = TestHub::start(|c| {
        let retention = &mut c.channels.get_mut(CHANNEL).unwrap().retention;
        retention.list_size = 10;
        retention.max_changes = 25;
        c.trim_interval = Duration::from_millis(20);
    })
    .await;
    hub.push("r", 57).await;
    let client = reqwest::Client::new();
    let oldest = || async {
        let resp = client
            .get(format!("{}/channels/{CHANNEL}/changes?after=0", hub.url))
            .send()
            .await
            .unwrap();
        resp.status() == StatusCode::GONE
    };
    wait_until("retention", Duration::from_secs(10), oldest).await;
    // Keeping 25 would start at 33, inside the list 31-40, which stays whole.
    let (all, closed, open) = walk(&hub.url, CHANNEL).await;
    assert_eq!((closed, open.len()), (2, 7));
    assert!(all == (31..=57).collect::<Vec<u64>>(), "{all:?}");
    let gone = client
        .get(format!(
            "{}/channels/{CHANNEL}/changelist/21-30.xml",
            hub.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), StatusCode::GONE);
    let across = get(
        &client,
        &format!("{}/channels/{CHANNEL}/changes?after=35&limit=10", hub.url),
    )
    .await;
    assert_eq!(seqs(&across), (36..=45).collect::<Vec<u64>>());
}

/// A closed list is immutable: `Cache-Control: immutable`, an ETag, 304 when it matches;
/// names that are no closed list get a clear 4xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_lists_are_immutable_and_bad_names_are_refused() {
    let hub = TestHub::start(|c| {
        c.channels.get_mut(CHANNEL).unwrap().retention.list_size = 10;
    })
    .await;
    hub.push("r", 25).await;
    let client = reqwest::Client::new();
    let url = format!("{}/channels/{CHANNEL}/changelist/11-20.xml", hub.url);
    let resp = client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let cache = resp.headers()["cache-control"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(cache.contains("immutable"), "{cache}");
    let etag = resp.headers()["etag"].clone();
    let body = resp.text().await.unwrap();
    assert_eq!(seqs(&body), (11..=20).collect::<Vec<u64>>());
    // More changes do not change it.
    hub.push("more", 30).await;
    assert_eq!(get(&client, &url).await, body);
    let again = client
        .get(&url)
        .header("if-none-match", etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);

    for (path, status) in [
        ("changelist/0-5.xml", StatusCode::NOT_FOUND),
        ("changelist/9-3.xml", StatusCode::NOT_FOUND),
        ("changelist/1-60000.xml", StatusCode::NOT_FOUND),
        ("changelist/51-60.xml", StatusCode::NOT_FOUND), // not closed: the newest seq is 55
        ("changelist/first-last.xml", StatusCode::NOT_FOUND),
        ("changelist/1-10", StatusCode::NOT_FOUND),
        (
            "changelist/1-99999999999999999999999.xml",
            StatusCode::NOT_FOUND,
        ),
        ("changelist-archive.xml?page=0", StatusCode::BAD_REQUEST),
        ("changelist-archive.xml?page=x", StatusCode::BAD_REQUEST),
        ("changelist-archive.xml?page=2", StatusCode::NOT_FOUND),
    ] {
        let resp = client
            .get(format!("{}/channels/{CHANNEL}/{path}", hub.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{path}");
        assert!(!resp.text().await.unwrap().is_empty(), "{path}: a reason");
    }
    let unknown = client
        .get(format!("{}/channels/nope/changelist/1-2.xml", hub.url))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
}

/// A fresh channel: an empty archive, and a topic whose `from` is the channel's creation.
/// Once the last change closes a list, the topic is empty again and starts at that list's
/// `until`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_topic_starts_where_the_last_closed_list_ends() {
    let hub = TestHub::start(|c| {
        c.channels.get_mut(CHANNEL).unwrap().retention.list_size = 3;
    })
    .await;
    let client = reqwest::Client::new();
    let archive_url = format!("{}/channels/{CHANNEL}/changelist-archive.xml", hub.url);
    assert!(locs(&get(&client, &archive_url).await).is_empty());
    hub.push_json(serde_json::json!([
        {"loc": "http://example.com/a", "change": "created", "datetime": "2024-01-01T00:00:00Z"},
        {"loc": "http://example.com/b", "change": "created", "datetime": "2024-01-02T00:00:00Z"},
        {"loc": "http://example.com/c", "change": "created", "datetime": "2024-01-03T00:00:00Z"},
    ]))
    .await;
    let topic = get(&client, &hub.topic()).await;
    assert!(seqs(&topic).is_empty());
    assert_eq!(attr(&topic, "from"), Some("2024-01-03T00:00:00Z"));
    let archive = get(&client, &archive_url).await;
    assert_eq!(
        locs(&archive),
        vec![format!("{}/channels/{CHANNEL}/changelist/1-3.xml", hub.url)]
    );
    assert_eq!(attr(&archive, "until"), Some("2024-01-03T00:00:00Z"));
}
