//! Catch-up: what a subscriber missed while it was down, it gets from `changes?after=`;
//! the topic Change List, its headers, and retention.

use crate::common::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_that_was_down_catches_up_exactly() {
    let hub = TestHub::start(|c| c.max_batch = 100).await;
    let mut receiver = Receiver::start(Behaviour::default()).await;
    hub.subscribe(&receiver.url, &[]).await;
    hub.wait_subscribed(&receiver.url).await;

    let (_, seen) = hub.push("before", 250).await;
    receiver.wait_seq(seen, Duration::from_secs(20)).await;
    let last_seen = *receiver.delivered_seqs().last().unwrap();
    assert_eq!(last_seen, seen);

    // The subscriber goes down; changes keep coming.
    receiver.stop();
    let (first_missed, _) = hub.push("during", 1234).await;
    let (_, last_missed) = hub.push("during2", 3000).await;
    assert_eq!(first_missed, seen + 1);

    // Back up, it pulls what it missed, page by page.
    let missed = hub.catch_up(last_seen).await;
    assert_eq!(missed, (last_seen + 1..=last_missed).collect::<Vec<_>>());

    // Nothing after the head.
    assert!(hub.catch_up(last_missed).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changelist_has_hub_links_etag_and_gzip() {
    let hub = TestHub::start(|_| {}).await;
    hub.push("a", 5).await;
    let url = hub.topic();
    let resp = hub.client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let link = resp.headers()["link"].to_str().unwrap().to_string();
    assert!(link.contains(&format!("<{}/hub>; rel=\"hub\"", hub.url)));
    assert!(link.contains(&format!("<{url}>; rel=\"self\"")));
    let etag = resp.headers()["etag"].to_str().unwrap().to_string();
    let body = resp.bytes().await.unwrap();
    let (header, entries) =
        changehub::resourcesync::parse_change_list(&body, &big_limits()).unwrap();
    assert_eq!(entries.len(), 5);
    assert!(header.from.is_some());
    assert!(header.links.iter().any(|l| l.rel == "up"));

    let not_modified = hub
        .client
        .get(&url)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(not_modified.status(), 304);
    hub.push("b", 1).await;
    let modified = hub
        .client
        .get(&url)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(modified.status(), 200);

    // gzip when asked (reqwest here has no decompression, so the raw encoding shows).
    let raw = hub
        .client
        .get(&url)
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(
        raw.headers()
            .get("content-encoding")
            .map(|v| v.to_str().unwrap()),
        Some("gzip")
    );

    // A small document goes as it is even when gzip is asked for (gzip saves little there and
    // its set-up costs more than the rest of the request).
    let small = hub
        .client
        .get(format!("{}/channels/{CHANNEL}/capabilitylist.xml", hub.url))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert!(small.headers().get("content-encoding").is_none());
    assert!(small.bytes().await.unwrap().len() < 1024);

    // Discovery documents.
    let cap = hub
        .client
        .get(format!("{}/channels/{CHANNEL}/capabilitylist.xml", hub.url))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    match changehub::resourcesync::parse_document(&cap, &big_limits()).unwrap() {
        changehub::resourcesync::Document::CapabilityList { caps, links } => {
            assert_eq!(caps[0].loc, url);
            assert!(links.iter().any(|l| l.rel == "hub"));
        }
        other => panic!("not a capability list: {other:?}"),
    }
    let sd = hub
        .client
        .get(format!("{}/.well-known/resourcesync", hub.url))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    match changehub::resourcesync::parse_document(&sd, &big_limits()).unwrap() {
        changehub::resourcesync::Document::SourceDescription {
            capability_lists, ..
        } => {
            assert_eq!(
                capability_lists,
                vec![format!("{}/channels/{CHANNEL}/capabilitylist.xml", hub.url)]
            );
        }
        other => panic!("not a source description: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_older_than_retention_is_gone() {
    let hub = TestHub::start(|c| {
        let retention = &mut c.channels.get_mut(CHANNEL).unwrap().retention;
        retention.max_changes = 10;
        retention.list_size = 1;
        c.trim_interval = Duration::from_millis(20);
    })
    .await;
    hub.push("a", 25).await;
    let url = format!("{}/channels/{CHANNEL}/changes?after=3", hub.url);
    hub.wait_trimmed_past(3).await;
    let resp = hub.client.get(&url).send().await.unwrap();
    assert_eq!(resp.headers()["x-changehub-oldest"], "16");
    let json: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(json["oldest"], 16);
    assert_eq!(hub.catch_up(15).await, (16..=25).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datetimes_never_go_backwards() {
    // A datetime years ahead is refused by default (--max-future); this test needs one.
    let hub = TestHub::start(|c| c.max_future = Duration::from_secs(20 * 365 * 86_400)).await;
    let (status, _) = hub
        .push_json(serde_json::json!([
            {"loc": "http://example.com/a", "change": "created", "datetime": "2030-01-01T00:00:00Z"},
            {"loc": "http://example.com/b", "change": "updated", "datetime": "2020-01-01T00:00:00Z"},
        ]))
        .await;
    assert_eq!(status, 202);
    let body = hub
        .client
        .get(format!("{}/channels/{CHANNEL}/changes?after=0", hub.url))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let (_, entries) = changehub::resourcesync::parse_change_list(&body, &big_limits()).unwrap();
    assert_eq!(entries[0].change.datetime, entries[1].change.datetime);
    // The source's own time is kept as lastmod.
    assert_eq!(
        entries[1].change.lastmod,
        Some(changehub::model::parse_w3c_datetime("2020-01-01T00:00:00Z").unwrap())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_makes_a_retry_count_once() {
    let hub = TestHub::start(|_| {}).await;
    let send = |body: &'static str| {
        hub.client
            .post(format!("{}/channels/{CHANNEL}/changes", hub.url))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("idempotency-key", "req-1")
            .body(body)
            .send()
    };
    let body = r#"[{"loc":"http://example.com/a","change":"created"},{"loc":"http://example.com/b","change":"created"}]"#;
    let first: serde_json::Value = send(body).await.unwrap().json().await.unwrap();
    let again = send(body).await.unwrap();
    assert_eq!(again.status(), 202);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(first, again);
    assert_eq!(hub.catch_up(0).await, vec![1, 2]);
    let conflict = send(r#"{"loc":"http://example.com/c","change":"created"}"#)
        .await
        .unwrap();
    assert_eq!(conflict.status(), 422);
    assert_eq!(hub.catch_up(0).await, vec![1, 2]);
}

/// A fresh channel's topic is an empty Change List that still has its mandatory `from`: the
/// time the channel began, the same on every read and after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_change_list_has_its_from() {
    let dir = tempfile::tempdir().unwrap();
    let before = time::OffsetDateTime::now_utc();
    let get = |hub: &TestHub| {
        let (client, url) = (hub.client.clone(), hub.topic());
        async move { client.get(url).send().await.unwrap().bytes().await.unwrap() }
    };
    let mut hub = TestHub::start_in(dir.path().to_path_buf(), |_| {}).await;
    let body = get(&hub).await;
    let (header, entries) =
        changehub::resourcesync::parse_change_list(&body, &big_limits()).unwrap();
    assert!(entries.is_empty());
    let from = header.from.expect("from on an empty Change List");
    assert!(
        from >= before && from <= time::OffsetDateTime::now_utc(),
        "{from}"
    );
    hub.stop().await;
    let again = TestHub::start_in(dir.path().to_path_buf(), |_| {}).await;
    let body = get(&again).await;
    let (header, _) = changehub::resourcesync::parse_change_list(&body, &big_limits()).unwrap();
    assert_eq!(header.from, Some(from), "the same after a restart");
}

/// `changes?after=` pages are put together from entries rendered in blocks of 1,000 seqs:
/// whatever blocks a page spans, and whether they were rendered for an earlier page or not,
/// it holds exactly the seqs asked for, its `from`/`until` are those of its first and last
/// entry, it links the next page while more remain, and each entry is the same bytes in
/// every page that holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_the_same_whichever_blocks_they_span() {
    let hub = TestHub::start(|_| {}).await;
    pages_whichever_blocks_they_span(&hub).await;
}

/// The same with a memory tier that keeps nothing: every block a page needs is read from its
/// file (written as the feed published the notification that completed it, or when the
/// block was first rendered), and the pages are byte for byte the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_from_block_files_are_the_pages_rendered_whole() {
    let hub = TestHub::start(|c| c.pages.memory = 0).await;
    pages_whichever_blocks_they_span(&hub).await;
    assert_eq!(written_blocks(&hub), [0, 1], "block 2 is not complete");
}

/// The numbers of the blocks of the test channel written in its segment files (whatever its
/// epoch), read from the files as `catchup/pages.rs` lays them out: blocks one after the
/// other from the start of a file, each its header ("CHPAGES2", first seq, count, checksum,
/// then count × (end, datetime)) and its entries' bytes; a block forgotten ("CHPAGES-") is
/// skipped. A block reserved but not yet written (zeros) ends the scan of its file.
fn written_blocks(hub: &TestHub) -> Vec<u64> {
    let channel = hub.data_dir.join("pages").join(CHANNEL);
    let Ok(epochs) = std::fs::read_dir(&channel) else {
        return Vec::new();
    };
    let mut blocks = Vec::new();
    for epoch in epochs.map(|e| e.unwrap().path()).filter(|p| p.is_dir()) {
        for file in std::fs::read_dir(&epoch).unwrap() {
            let Ok(bytes) = std::fs::read(file.unwrap().path()) else {
                continue;
            };
            let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            let mut at = 0;
            while at + 32 <= bytes.len() && matches!(&bytes[at..at + 8], b"CHPAGES2" | b"CHPAGES-")
            {
                let live = &bytes[at..at + 8] == b"CHPAGES2";
                let (first, count) = (u64_at(at + 8), u64_at(at + 16) as usize);
                let records = at + 32 + 24 * count;
                if count == 0 || records > bytes.len() {
                    break;
                }
                let end = u64_at(records - 24) as usize;
                if records + end > bytes.len() {
                    break;
                }
                if live {
                    blocks.push((first - 1) / 1000);
                }
                at = records + end;
            }
        }
    }
    blocks.sort();
    blocks
}

/// Waits (bounded) until block `block` is written in its segment file.
async fn wait_block_file(hub: &TestHub, block: u64) {
    wait_until(
        "the block file is written",
        Duration::from_secs(10),
        || async { written_blocks(hub).contains(&block) },
    )
    .await;
}

async fn pages_whichever_blocks_they_span(hub: &TestHub) {
    hub.push("a", 1000).await;
    hub.push("b", 1000).await;
    let (_, head) = hub.push("c", 500).await;
    assert_eq!(head, 2500);
    let page = |after: u64, limit: u64| {
        let url = format!(
            "{}/channels/{CHANNEL}/changes?after={after}&limit={limit}",
            hub.url
        );
        let client = hub.client.clone();
        async move {
            let resp = client.get(&url).send().await.unwrap();
            assert_eq!(resp.status(), 200, "{url}");
            let next = resp
                .headers()
                .get_all("link")
                .iter()
                .any(|l| l.to_str().unwrap().contains("rel=\"next\""));
            (resp.bytes().await.unwrap(), next)
        }
    };
    // The whole log in one page, rendered from the store the first time.
    let (all, next) = page(0, 2500).await;
    assert!(!next);
    let all_text = String::from_utf8(all.to_vec()).unwrap();
    let entries_of = |text: &str| -> Vec<String> {
        text.split("  <url>\n")
            .skip(1)
            .map(|e| e.trim_end_matches("</urlset>\n").to_string())
            .collect()
    };
    let every = entries_of(&all_text);
    assert_eq!(every.len(), 2500);
    wait_block_file(hub, 0).await;
    wait_block_file(hub, 1).await;
    for (after, limit) in [
        (0, 1000),
        (999, 2),
        (1000, 1000),
        (1500, 1000),
        (2400, 1000),
        (1234, 1),
        (2499, 5),
        (2500, 10),
        (10, 2490),
    ] {
        let (first, next) = page(after, limit).await;
        let (again, _) = page(after, limit).await;
        assert_eq!(
            first, again,
            "after={after} limit={limit}: same bytes again"
        );
        let last = (after + limit).min(head);
        assert_eq!(next, last < head, "after={after} limit={limit}: next link");
        let (header, parsed) =
            changehub::resourcesync::parse_change_list(&first, &big_limits()).unwrap();
        let seqs: Vec<u64> = parsed.iter().map(|e| e.seq.unwrap()).collect();
        assert_eq!(seqs, (after + 1..=last).collect::<Vec<_>>());
        if let (Some(f), Some(l)) = (parsed.first(), parsed.last()) {
            assert_eq!(header.from, f.change.datetime);
            assert_eq!(header.until, l.change.datetime);
            assert_eq!(header.seq_range, Some((after + 1, last)));
        } else {
            assert_eq!(header.seq_range, None);
        }
        let text = String::from_utf8(first.to_vec()).unwrap();
        assert_eq!(
            entries_of(&text),
            every[after as usize..last as usize],
            "after={after} limit={limit}: the entries of the whole log"
        );
    }
}

/// Retention is checked before any block is used: a range trimmed away is answered 410 with
/// the oldest retained seq, even though the file of its block is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trimmed_range_is_gone_even_with_its_block_file() {
    let hub = TestHub::start(|c| {
        c.pages.memory = 0;
        let retention = &mut c.channels.get_mut(CHANNEL).unwrap().retention;
        retention.max_changes = 1000;
        retention.list_size = 1000;
        c.trim_interval = Duration::from_millis(20);
    })
    .await;
    hub.push("a", 1000).await;
    let first = format!("{}/channels/{CHANNEL}/changes?after=0", hub.url);
    let resp = hub.client.get(&first).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    wait_block_file(&hub, 0).await;
    hub.push("b", 1000).await;
    hub.wait_trimmed_past(0).await;
    assert!(
        written_blocks(&hub).contains(&0),
        "block 0 is still in its file"
    );
    for after in [0, 500, 999] {
        let url = format!("{}/channels/{CHANNEL}/changes?after={after}", hub.url);
        let resp = hub.client.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 410, "after={after}");
        assert_eq!(resp.headers()["x-changehub-oldest"], "1001");
    }
    assert_eq!(hub.catch_up(1000).await, (1001..=2000).collect::<Vec<_>>());
}

/// The topic and the closed lists are made of the same rendered blocks as the pages, which
/// their files keep across a restart: after it the blocks are there before anything is
/// read, and every document is byte for byte what the hub served before the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_lists_and_the_topic_are_made_of_the_page_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let tweak = |c: &mut changehub::config::Config| {
        c.channels.get_mut(CHANNEL).unwrap().retention.list_size = 1000;
    };
    let mut hub = TestHub::start_in(dir.path().to_path_buf(), tweak).await;
    hub.push("a", 1000).await;
    hub.push("b", 1000).await;
    let (_, head) = hub.push("c", 500).await;
    hub.wait_published(head).await;
    let documents = [
        "changelist/1-1000.xml".to_string(),
        "changelist/1001-2000.xml".to_string(),
        "changelist.xml".to_string(),
        "changelist/1001-1500.xml".to_string(),
    ];
    let read = |hub: &TestHub, path: &str| {
        let url = format!("{}/channels/{CHANNEL}/{path}", hub.url);
        let client = hub.client.clone();
        async move {
            let resp = client.get(&url).send().await.unwrap();
            assert_eq!(resp.status(), 200, "{url}");
            resp.text().await.unwrap()
        }
    };
    let mut before = Vec::new();
    for path in &documents {
        before.push(read(&hub, path).await);
    }
    wait_block_file(&hub, 0).await;
    wait_block_file(&hub, 1).await;
    hub.stop().await;
    let old_url = hub.url.clone();

    let hub = TestHub::start_in(dir.path().to_path_buf(), tweak).await;
    let ready = hub.client.get(format!("{}/readyz", hub.url)).send().await;
    assert_eq!(ready.unwrap().status(), 200);
    assert_eq!(written_blocks(&hub), [0, 1], "kept across the restart");
    for (path, before) in documents.iter().zip(&before) {
        // The hub's links name its address, which the restart changed.
        let before = &before.replace(&old_url, &hub.url);
        let after = read(&hub, path).await;
        let differs = before.lines().zip(after.lines()).find(|(b, a)| b != a);
        assert_eq!(differs, None, "{path}: the first line that differs");
        assert_eq!(&after, before, "{path}");
    }
    // Nothing more was written (the topic, 2001-2500, is no complete block).
    assert_eq!(written_blocks(&hub), [0, 1]);
    let entries = |doc: &str| doc.matches("<url>").count();
    assert_eq!(entries(&before[0]), 1000);
    assert_eq!(
        entries(&before[2]),
        500,
        "the topic: the open list, 2001-2500"
    );
    assert!(before[2].contains("http://example.com/c/499</loc>"));
    assert_eq!(entries(&before[3]), 500);
}

/// A closed Change List of any range is put together block by block (a part of its first
/// block, whole blocks, a part of its last): its entries are its changes in order, byte for
/// byte the entries of a `changes?after=` page of the same range, and its `from` and `until`
/// are the datetimes of its first and its last change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_lists_of_any_range_are_their_blocks_in_order() {
    let hub = TestHub::start(|_| {}).await;
    let (_, head) = hub.push("a", 3500).await;
    hub.wait_published(head).await;
    let get = |path: String| {
        let url = format!("{}/channels/{CHANNEL}/{path}", hub.url);
        let client = hub.client.clone();
        async move {
            let resp = client.get(&url).send().await.unwrap();
            assert_eq!(resp.status(), 200, "{url}");
            resp.bytes().await.unwrap()
        }
    };
    // The entries of a Change List: from its first `<url>` to its root's end.
    let entries_of = |doc: &[u8]| {
        let doc = std::str::from_utf8(doc).unwrap().to_string();
        let start = doc.find("<url>").expect("an entry");
        let end = doc.rfind("</urlset>").unwrap();
        doc[start..end].to_string()
    };
    for (first, last) in [
        (1, 3000),
        (500, 2300),
        (1001, 3500),
        (999, 1001),
        (1500, 1700),
        (1000, 1000),
        (2, 3499),
    ] {
        let closed = get(format!("changelist/{first}-{last}.xml")).await;
        let (header, entries) =
            changehub::resourcesync::parse_change_list(&closed, &big_limits()).unwrap();
        let seqs: Vec<u64> = entries.iter().map(|e| e.seq.unwrap()).collect();
        assert_eq!(seqs, (first..=last).collect::<Vec<_>>(), "{first}-{last}");
        assert_eq!(header.from, entries[0].change.datetime, "{first}-{last}");
        assert_eq!(
            header.until,
            entries.last().unwrap().change.datetime,
            "{first}-{last}"
        );
        assert_eq!(header.seq_range, Some((first, last)));
        let page = get(format!(
            "changes?after={}&limit={}",
            first - 1,
            last - first + 1
        ))
        .await;
        assert!(
            entries_of(&closed) == entries_of(&page),
            "{first}-{last}: the entries differ from the page's"
        );
    }
}

/// A block file the store no longer matches is not served after a restart: the data
/// directory's store is put back to a copy taken after the first 1,000 changes (the same log,
/// its epoch unchanged), while the block files still hold seqs 1001-2000 as they were. The
/// block of those seqs is dropped at start-up, and the changes published again under them are
/// what the page shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_of_seqs_the_store_no_longer_has_is_dropped_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("changehub.redb");
    let copy = dir.path().join("copy.redb");
    let mut hub = TestHub::start_in(dir.path().to_path_buf(), |_| {}).await;
    let (_, head) = hub.push("a", 1000).await;
    hub.wait_published(head).await;
    wait_block_file(&hub, 0).await;
    hub.stop().await;
    std::fs::copy(&store, &copy).unwrap();

    let mut hub = TestHub::start_in(dir.path().to_path_buf(), |_| {}).await;
    let (_, head) = hub.push("b", 1000).await;
    hub.wait_published(head).await;
    wait_block_file(&hub, 1).await;
    hub.stop().await;
    std::fs::rename(&copy, &store).unwrap();

    let hub = TestHub::start_in(dir.path().to_path_buf(), |_| {}).await;
    // Served once the hub has started, block files checked.
    let ready = hub.client.get(format!("{}/readyz", hub.url)).send().await;
    assert_eq!(ready.unwrap().status(), 200);
    assert_eq!(written_blocks(&hub), [0], "block 1 dropped, block 0 kept");
    let (first, head) = hub.push("c", 1000).await;
    assert_eq!((first, head), (1001, 2000));
    hub.wait_published(head).await;
    let page = hub
        .text(&format!("/channels/{CHANNEL}/changes?after=1000"))
        .await;
    assert_eq!(
        page.matches("http://example.com/c/").count(),
        1000,
        "{page}"
    );
    assert!(!page.contains("http://example.com/b/"));
    let page = hub
        .text(&format!("/channels/{CHANNEL}/changes?after=0"))
        .await;
    assert_eq!(page.matches("http://example.com/a/").count(), 1000);
}

/// A run without block files (`--page-files-size 0`) removes those an earlier run left: it
/// does not check them against the store, so a later run could not trust them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_without_block_files_removes_those_left_before() {
    let dir = tempfile::tempdir().unwrap();
    let mut hub = TestHub::start_in(dir.path().to_path_buf(), |_| {}).await;
    let (_, head) = hub.push("a", 1000).await;
    hub.wait_published(head).await;
    wait_block_file(&hub, 0).await;
    hub.stop().await;
    let mut hub = TestHub::start_in(dir.path().to_path_buf(), |c| c.pages.files = 0).await;
    let ready = hub.client.get(format!("{}/readyz", hub.url)).send().await;
    assert_eq!(ready.unwrap().status(), 200);
    assert!(!dir.path().join("pages").exists());
    let page = hub
        .text(&format!("/channels/{CHANNEL}/changes?after=0"))
        .await;
    assert_eq!(page.matches("http://example.com/a/").count(), 1000);
    hub.stop().await;
}
