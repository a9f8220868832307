//! Change Dumps: a local file server is the source; changes pushed to the hub make it fetch
//! the resources and publish ZIP packages. Each package is downloaded over HTTP, unzipped and
//! compared with the source byte for byte; its `manifest.xml` and the Change Dump are parsed
//! with the hub's own parser and with the Python reference library (`resync` 2.0.1); a WebSub
//! subscriber of the Change Dump hears of every dump; a hash mismatch leaves the resource out;
//! a restart (also one that lost the cursor) neither repeats nor loses a dump; retention
//! removes old dumps and their files; more dumps than one document holds make an index.

use crate::common::*;
use crate::subscribe::FileServer;
use changehub::model::{ChangeType, DumpSettings};
use changehub::resourcesync::{parse_document, Document, DumpEntry, Limits, ManifestEntry};
use reqwest::StatusCode;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn settings(every: u64, interval: Option<Duration>, keep: u64) -> DumpSettings {
    DumpSettings {
        every,
        interval,
        keep,
        per_document: 2,
        ..DumpSettings::default()
    }
}

/// The source's files: text, binary, a nested path.
fn source_files() -> BTreeMap<&'static str, Vec<u8>> {
    let mut files = BTreeMap::new();
    files.insert("a.txt", b"alpha\n".to_vec());
    files.insert("b.bin", (0..5000u32).map(|i| (i * 7 % 256) as u8).collect());
    files.insert("c/d.json", br#"{"d": [1, 2, 3]}"#.to_vec());
    files.insert("e.html", b"<html><body>\xc3\xa9</body></html>".to_vec());
    files.insert("gone.txt", b"soon gone".to_vec());
    files
}

fn write(dir: &Path, rel: &str, bytes: &[u8]) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

async fn push(hub: &TestHub, changes: Vec<serde_json::Value>) {
    let (status, json) = hub.push_json(serde_json::Value::Array(changes)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{json}");
}

fn change(base: &str, rel: &str, kind: &str) -> serde_json::Value {
    serde_json::json!({"loc": format!("{base}{rel}"), "change": kind})
}

/// The Change Dump document of `channel` on the hub at `base`.
fn dumps_url(base: &str, channel: &str) -> String {
    format!("{base}/channels/{channel}/changedump.xml")
}

/// GETs `url` (with `token` as bearer when given) and parses it as a ResourceSync document.
async fn document(client: &reqwest::Client, url: &str, token: Option<&str>) -> Document {
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let body = request.send().await.unwrap().bytes().await.unwrap();
    parse_document(&body, &Limits::default()).unwrap()
}

/// The dumps the Change Dump document at `url` lists (following the index when it is one).
async fn listed(client: &reqwest::Client, url: &str, token: Option<&str>) -> Vec<DumpEntry> {
    match document(client, url, token).await {
        Document::ChangeDump { entries, .. } => entries,
        Document::ChangeDumpIndex { entries, .. } => {
            let mut all = Vec::new();
            for page in entries {
                match document(client, &page.loc, token).await {
                    Document::ChangeDump { header, entries } => {
                        assert!(header.links.iter().any(|l| l.rel == "index"));
                        all.extend(entries)
                    }
                    other => panic!("an index page is {other:?}"),
                }
            }
            all
        }
        other => panic!("changedump.xml is {other:?}"),
    }
}

async fn wait_dumps(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    n: usize,
) -> Vec<DumpEntry> {
    wait_until(&format!("{n} Change Dumps listed"), WAIT, || async {
        listed(client, url, token).await.len() >= n
    })
    .await;
    listed(client, url, token).await
}

/// A downloaded and unzipped dump: its files by path (with the leading `/`), and its
/// manifest parsed by the hub.
struct Unzipped {
    files: BTreeMap<String, Vec<u8>>,
    manifest_xml: Vec<u8>,
    manifest: Vec<ManifestEntry>,
}

async fn download(client: &reqwest::Client, entry: &DumpEntry) -> Unzipped {
    let resp = client.get(&entry.loc).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/zip");
    let zip_bytes = resp.bytes().await.unwrap().to_vec();
    assert_eq!(Some(zip_bytes.len() as u64), entry.length);
    assert_eq!(
        entry.hash.as_deref(),
        Some(changehub::model::hash::of(&zip_bytes).as_str())
    );
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip_bytes)).unwrap();
    let mut files = BTreeMap::new();
    for i in 0..archive.len() {
        let mut f = archive.by_index(i).unwrap();
        let name = f.name().unwrap().to_string();
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes).unwrap();
        files.insert(format!("/{name}"), bytes);
    }
    let manifest_xml = files
        .remove("/manifest.xml")
        .expect("manifest.xml at the root");
    // The copy at rs:ln rel="contents" is the same manifest.
    let copy = client
        .get(entry.contents.as_deref().unwrap())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(copy.as_ref(), &manifest_xml[..]);
    let manifest = match parse_document(&manifest_xml, &Limits::default()).unwrap() {
        Document::ChangeDumpManifest { header, entries } => {
            assert_eq!(header.from, entry.from);
            assert_eq!(header.until, entry.until);
            assert_eq!(header.seq_range, entry.seq_range);
            entries
        }
        other => panic!("manifest.xml is {other:?}"),
    };
    Unzipped {
        files,
        manifest_xml,
        manifest,
    }
}

/// Every bitstream equals the source's file of its `loc`, and every file is in the manifest.
fn assert_equals_source(dump: &Unzipped, base: &str, src: &Path) {
    let mut paths = BTreeSet::new();
    for e in &dump.manifest {
        let rel = e.loc.strip_prefix(base).unwrap();
        match e.change {
            ChangeType::Deleted => assert_eq!(e.path, None, "{rel}"),
            _ => {
                let path = e.path.clone().unwrap();
                let expected = std::fs::read(src.join(rel)).unwrap();
                assert_eq!(dump.files[&path], expected, "{rel} differs from the source");
                assert_eq!(e.length, Some(expected.len() as u64));
                assert_eq!(
                    e.hash.as_deref(),
                    Some(changehub::model::hash::of(&expected).as_str())
                );
                paths.insert(path);
            }
        }
    }
    assert_eq!(
        paths,
        dump.files.keys().cloned().collect(),
        "files not in the manifest"
    );
}

/// What the Python reference library reads in a manifest and a Change Dump.
fn python_reads(manifest: &[u8], change_dump: &[u8]) -> String {
    let python = crate::reference_client::resync_sync().with_file_name("python");
    let dir = tempfile::tempdir().unwrap();
    let (m, d) = (
        dir.path().join("manifest.xml"),
        dir.path().join("changedump.xml"),
    );
    std::fs::write(&m, manifest).unwrap();
    std::fs::write(&d, change_dump).unwrap();
    let script = r#"
import sys
from resync.change_dump_manifest import ChangeDumpManifest
from resync.change_dump import ChangeDump
m = ChangeDumpManifest()
m.parse(fh=open(sys.argv[1], 'rb'))
assert m.capability_name == 'changedump-manifest'
for r in m.resources:
    print("M", r.uri, r.change, r.path or "-", r.length, r.md5)
d = ChangeDump()
d.parse(fh=open(sys.argv[2], 'rb'))
for r in d.resources:
    print("D", r.uri, r.length, r.mime_type)
"#;
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(&m)
        .arg(&d)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "resync could not read them: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The seq ranges of the dumps each delivered notification names (parsed as Change Dump
/// documents).
fn notified(receiver: &Receiver) -> Vec<(u64, u64)> {
    receiver
        .delivered()
        .iter()
        .flat_map(|r| {
            match parse_document(&r.body, &Limits::default()).expect("a Change Dump document") {
                Document::ChangeDump { entries, .. } => entries
                    .into_iter()
                    .map(|e| e.seq_range.unwrap())
                    .collect::<Vec<_>>(),
                other => panic!("a notification is {other:?}"),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dumps_by_count_equal_the_source_and_survive_restarts_and_retention() {
    dumps_by_count(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dumps_by_count_on_redis() {
    let redis = crate::redis_server::RedisServer::start(true);
    dumps_by_count(Some(redis.url())).await;
}

/// The Must-show scenario, on the embedded store (`redis` `None`) or on Redis.
async fn dumps_by_count(redis: Option<String>) {
    let src = tempfile::tempdir().unwrap();
    for (rel, bytes) in source_files() {
        write(src.path(), rel, &bytes);
    }
    let (_files, base, _stop_files) = FileServer::start(src.path()).await;
    let data = tempfile::tempdir().unwrap();
    let dump_dir = data.path().join("dumps");
    let dumps_on = |c: &mut changehub::config::Config| {
        c.channels.get_mut(CHANNEL).unwrap().dumps = Some(settings(6, None, 2));
        if let Some(url) = &redis {
            c.store = changehub::config::StoreConfig::Redis { url: url.clone() };
            c.dump_dir = Some(dump_dir.clone());
        }
    };
    let mut hub = TestHub::start_in(data.path().to_path_buf(), dumps_on).await;

    // Discovery: the Capability List offers the Change Dump.
    let caps = hub
        .text(&format!("/channels/{CHANNEL}/capabilitylist.xml"))
        .await;
    let dump_url = dumps_url(&hub.url, CHANNEL);
    assert!(caps.contains(&format!("<loc>{dump_url}</loc>")), "{caps}");
    assert!(caps.contains("capability=\"changedump\""));
    let public: serde_json::Value = hub
        .client
        .get(format!("{}/channels", hub.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(public[0]["change_dump"], dump_url.as_str());

    // A WebSub subscriber of the Change Dump, with a secret.
    let receiver = Receiver::start(Behaviour::default()).await;
    let (status, text) = hub
        .hub_request(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", &dump_url),
            ("hub.callback", &receiver.url),
            ("hub.secret", "dump-secret"),
        ])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    receiver.wait_verified(1).await;
    hub.wait_subscribed(&receiver.url).await;

    // Six changes: with hash and length, with hash only, with neither, with length only,
    // and a resource created then deleted.
    let sources = source_files();
    let a = &sources["a.txt"];
    let b = &sources["b.bin"];
    let e = &sources["e.html"];
    push(
        &hub,
        vec![
            serde_json::json!({"loc": format!("{base}a.txt"), "change": "created",
                "hash": changehub::model::hash::of(a), "length": a.len()}),
            serde_json::json!({"loc": format!("{base}b.bin"), "change": "created",
                "hash": changehub::model::hash::of(b), "type": "application/octet-stream"}),
            change(&base, "c/d.json", "created"),
            serde_json::json!({"loc": format!("{base}e.html"), "change": "created", "length": e.len()}),
            change(&base, "gone.txt", "created"),
        ],
    )
    .await;
    // Not yet: five changes are fewer than a dump holds.
    assert!(listed(&hub.client, &dumps_url(&hub.url, CHANNEL), None)
        .await
        .is_empty());
    std::fs::remove_file(src.path().join("gone.txt")).unwrap();
    push(&hub, vec![change(&base, "gone.txt", "deleted")]).await;

    let dumps = wait_dumps(&hub.client, &dumps_url(&hub.url, CHANNEL), None, 1).await;
    assert_eq!(dumps.len(), 1);
    let first = &dumps[0];
    assert_eq!(first.seq_range, Some((1, 6)));
    assert_eq!(first.skipped, None);
    assert_eq!(first.media_type.as_deref(), Some("application/zip"));
    let unzipped = download(&hub.client, first).await;
    assert_equals_source(&unzipped, &base, src.path());
    let kinds: Vec<(String, ChangeType)> = unzipped
        .manifest
        .iter()
        .map(|e| (e.loc.strip_prefix(&base).unwrap().to_string(), e.change))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("a.txt".to_string(), ChangeType::Created),
            ("b.bin".to_string(), ChangeType::Created),
            ("c/d.json".to_string(), ChangeType::Created),
            ("e.html".to_string(), ChangeType::Created),
            ("gone.txt".to_string(), ChangeType::Deleted),
        ]
    );
    assert_eq!(
        unzipped.manifest[1].media_type.as_deref(),
        Some("application/octet-stream")
    );

    // The Python reference library reads the manifest and the Change Dump.
    let dump_xml = hub.client.get(&dump_url).send().await.unwrap();
    assert!(dump_xml.headers()["link"]
        .to_str()
        .unwrap()
        .contains(&format!("<{dump_url}>; rel=\"self\"")));
    let dump_xml = dump_xml.bytes().await.unwrap();
    let read = python_reads(&unzipped.manifest_xml, &dump_xml);
    for (rel, path) in [("a.txt", "/changes/1-a.txt"), ("b.bin", "/changes/2-b.bin")] {
        assert!(
            read.contains(&format!("M {base}{rel} created {path}")),
            "{read}"
        );
    }
    assert!(
        read.contains(&format!("M {base}gone.txt deleted -")),
        "{read}"
    );
    assert!(
        read.contains(&format!(
            "D {} {} application/zip",
            first.loc,
            first.length.unwrap()
        )),
        "{read}"
    );

    // The subscriber hears of it, signed.
    receiver
        .wait_for("the first dump announced", WAIT, |r| {
            notified(r).contains(&(1, 6))
        })
        .await;
    let post = &receiver.delivered()[0];
    assert_eq!(post.header("content-type"), Some("application/xml"));
    assert_eq!(post.header("x-changehub-channel"), Some("_dump-news"));
    assert_eq!(post.header("x-changehub-first"), Some("1"));
    assert!(changehub::model::signature::verify(
        post.header("x-hub-signature").unwrap(),
        b"dump-secret",
        &post.body
    ));
    assert!(post
        .header("link")
        .unwrap()
        .contains(&format!("<{dump_url}>; rel=\"self\"")));

    // A change whose hash the served bytes do not match is left out (and counted); the
    // other resources of the period are in.
    write(src.path(), "b.bin", b"b, second version");
    let b2 = std::fs::read(src.path().join("b.bin")).unwrap();
    let mut changes = vec![
        serde_json::json!({"loc": format!("{base}a.txt"), "change": "updated",
            "hash": changehub::model::hash::of(b"not what is served")}),
        serde_json::json!({"loc": format!("{base}b.bin"), "change": "updated",
            "hash": changehub::model::hash::of(&b2), "length": b2.len()}),
    ];
    for i in 0..4 {
        let rel = format!("more/{i}.dat");
        write(src.path(), &rel, &vec![i as u8; 100 * (i + 1)]);
        changes.push(change(&base, &rel, "created"));
    }
    push(&hub, changes).await;
    let dumps = wait_dumps(&hub.client, &dumps_url(&hub.url, CHANNEL), None, 2).await;
    let second = &dumps[1];
    assert_eq!(second.seq_range, Some((7, 12)));
    assert_eq!(second.skipped, Some(1));
    let unzipped = download(&hub.client, second).await;
    assert_equals_source(&unzipped, &base, src.path());
    assert!(unzipped.manifest.iter().all(|e| !e.loc.ends_with("a.txt")));
    assert_eq!(unzipped.manifest.len(), 5);
    receiver
        .wait_for("the second dump announced", WAIT, |r| {
            notified(r).contains(&(7, 12))
        })
        .await;

    // A restart, and one that lost the cursor (as a crash between listing a dump and
    // recording it would): no dump is repeated, none lost.
    hub.stop().await;
    {
        use changehub::store::Store;
        let store: Box<dyn Store> = match &redis {
            None => Box::new(changehub::store::EmbeddedStore::open(data.path()).unwrap()),
            Some(url) => Box::new(changehub::store::RedisStore::open(url).unwrap()),
        };
        assert_eq!(
            store.bridge_cursor(CHANNEL, "changedump").await.unwrap(),
            Some(12)
        );
        store
            .put_bridge_cursor(CHANNEL, "changedump", 3)
            .await
            .unwrap();
    }
    let hub = TestHub::start_in(data.path().to_path_buf(), dumps_on).await;
    let mut changes = Vec::new();
    for i in 0..6 {
        let rel = format!("later/{i}.txt");
        write(src.path(), &rel, format!("later {i}").as_bytes());
        changes.push(change(&base, &rel, "created"));
    }
    push(&hub, changes).await;
    wait_until("the third dump listed", WAIT, || async {
        listed(&hub.client, &dumps_url(&hub.url, CHANNEL), None)
            .await
            .iter()
            .any(|d| d.seq_range == Some((13, 18)))
    })
    .await;
    let dumps = listed(&hub.client, &dumps_url(&hub.url, CHANNEL), None).await;
    // Retention keeps two: the first dump is gone, its files too.
    let ranges: Vec<_> = dumps.iter().map(|d| d.seq_range.unwrap()).collect();
    assert_eq!(ranges, vec![(7, 12), (13, 18)]);
    let folder = dump_dir.join(CHANNEL);
    wait_until("the first dump's files removed", WAIT, || async {
        !folder.join("1-6.zip").exists() && !folder.join("1-6.manifest.xml").exists()
    })
    .await;
    // (The restarted hub listens on another port.)
    let gone = format!("{}/channels/{CHANNEL}/changedump/1-6.zip", hub.url);
    assert_eq!(
        hub.client.get(&gone).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert!(folder.join("13-18.zip").exists());
    let third = download(&hub.client, &dumps[1]).await;
    assert_equals_source(&third, &base, src.path());

    // Two dumps per document: the second and third are on two pages, so changedump.xml is
    // a Change Dump Index (`listed` followed it).
    let dump_url = dumps_url(&hub.url, CHANNEL);
    let index = hub
        .client
        .get(&dump_url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(matches!(
        parse_document(&index, &Limits::default()).unwrap(),
        Document::ChangeDumpIndex { .. }
    ));

    // Every dump announced, none announced as two (redelivery repeats a whole notification).
    receiver
        .wait_for("the third dump announced", WAIT, |r| {
            notified(r).contains(&(13, 18))
        })
        .await;
    let distinct: BTreeSet<(u64, u64)> = notified(&receiver).into_iter().collect();
    assert_eq!(
        distinct.into_iter().collect::<Vec<_>>(),
        vec![(1, 6), (7, 12), (13, 18)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_by_interval_of_a_private_channel() {
    let src = tempfile::tempdir().unwrap();
    write(src.path(), "x.txt", b"x");
    write(src.path(), "y.bin", &[0, 159, 146, 150, 255]);
    let (_files, base, _stop_files) = FileServer::start(src.path()).await;
    let hub = TestHub::start(|c| {
        let ch = c.channels.get_mut(CHANNEL).unwrap();
        ch.dumps = Some(settings(1000, Some(Duration::from_secs(1)), 5));
        ch.read_token = Some("reader".into());
    })
    .await;
    push(
        &hub,
        vec![
            change(&base, "x.txt", "created"),
            change(&base, "y.bin", "created"),
        ],
    )
    .await;
    let url = dumps_url(&hub.url, CHANNEL);
    assert_eq!(
        hub.client.get(&url).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let dump = wait_dumps(&hub.client, &url, Some("reader"), 1)
        .await
        .remove(0);
    assert_eq!(dump.seq_range, Some((1, 2)));
    // The package needs the token too.
    assert_eq!(
        hub.client.get(&dump.loc).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let zip_bytes = hub
        .client
        .get(&dump.loc)
        .bearer_auth("reader")
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip_bytes.to_vec())).unwrap();
    let mut y = Vec::new();
    archive
        .by_name("changes/2-y.bin")
        .unwrap()
        .read_to_end(&mut y)
        .unwrap();
    assert_eq!(y, [0, 159, 146, 150, 255]);
    // Subscribing to a private channel's Change Dump is denied.
    let receiver = Receiver::start(Behaviour::default()).await;
    let (status, _) = hub
        .hub_request(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", &url),
            ("hub.callback", &receiver.url),
        ])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    receiver.wait_verified(1).await;
    assert_eq!(receiver.verifications()[0]["hub.mode"], "denied");
    // A channel without dumps has none.
    let resp = hub
        .client
        .get(dumps_url(&hub.url, "nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_of_the_admin_api_can_have_dumps() {
    let src = tempfile::tempdir().unwrap();
    write(src.path(), "p.txt", b"photo");
    let (_files, base, _stop_files) = FileServer::start(src.path()).await;
    let hub = TestHub::start(|_| {}).await;
    let put = |body: serde_json::Value| {
        hub.client
            .put(format!("{}/api/channels/photos", hub.url))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
    };
    // Bad settings change nothing.
    for bad in [
        serde_json::json!({"every": 0}),
        serde_json::json!({"interval": "soon"}),
        serde_json::json!({"bogus": 1}),
    ] {
        let resp = put(serde_json::json!({"publishers": {"p": "pt"}, "dumps": bad}))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    let resp = hub
        .client
        .get(dumps_url(&hub.url, "photos"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    // A change before dumps are turned on is not dumped.
    let resp = put(serde_json::json!({"publishers": {"p": "pt"}}))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = hub
        .client
        .post(format!("{}/channels/photos/changes", hub.url))
        .bearer_auth("pt")
        .json(&serde_json::json!({"loc": format!("{base}p.txt"), "change": "created"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let resp = put(serde_json::json!({"publishers": {"p": "pt"},
        "dumps": {"every": 2, "interval": "0s"}}))
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let caps = hub.text("/channels/photos/capabilitylist.xml").await;
    assert!(caps.contains("capability=\"changedump\""), "{caps}");
    // Empty so far, yet dated: when the channel began.
    let empty = hub.text("/channels/photos/changedump.xml").await;
    match parse_document(empty.as_bytes(), &Limits::default()).unwrap() {
        Document::ChangeDump { header, entries } => {
            assert!(entries.is_empty());
            assert!(header.from.is_some());
        }
        other => panic!("{other:?}"),
    }
    let resp = hub
        .client
        .post(format!("{}/channels/photos/changes", hub.url))
        .bearer_auth("pt")
        .json(&serde_json::json!([
            {"loc": format!("{base}p.txt"), "change": "updated"},
            {"loc": format!("{base}missing.txt"), "change": "created"},
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let url = dumps_url(&hub.url, "photos");
    let entries = wait_dumps(&hub.client, &url, None, 1).await;
    // The resource the source does not have (404) is left out and counted.
    assert_eq!(entries[0].seq_range, Some((2, 3)));
    assert_eq!(entries[0].skipped, Some(1));
    let unzipped = download(&hub.client, &entries[0]).await;
    assert_equals_source(&unzipped, &base, src.path());
    assert_eq!(unzipped.manifest.len(), 1);
    // The admin API shows the settings and how far the dumps got.
    let channels = admin_json(&hub.url, "/api/channels").await;
    let photos = channels
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "photos")
        .unwrap();
    assert_eq!(photos["dumps"]["every"], 2);
    assert_eq!(photos["dumps"]["listed"], 1);
    assert_eq!(photos["dumps"]["dumped_upto"], 3);
}

/// Two `changehub serve --redis` processes with `--dump` flags and one dump folder: the owner
/// of the channel makes the dumps, both list and serve them, and a subscriber that subscribed
/// through either hears of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_dumps_of_a_channel() {
    let redis = crate::redis_server::RedisServer::start(true);
    let redis_url = redis.url();
    let src = tempfile::tempdir().unwrap();
    for (rel, bytes) in source_files() {
        write(src.path(), rel, &bytes);
    }
    let (_files, base, _stop_files) = FileServer::start(src.path()).await;
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap().to_string();
    let flags = [
        "--redis",
        redis_url.as_str(),
        "--dump",
        CHANNEL,
        "--dump-every",
        "3",
        "--dump-interval",
        "0s",
        "--dump-dir",
        dir_arg.as_str(),
    ];
    let a = HubProcess::start(&flags).await;
    let b = HubProcess::start(&flags).await;
    let client = reqwest::Client::new();
    let receiver = Receiver::start(Behaviour::default()).await;
    let topic = dumps_url(&b.url, CHANNEL);
    let (status, text) = hub_request_at(
        &client,
        &b.url,
        &[
            ("hub.mode", "subscribe"),
            ("hub.topic", &topic),
            ("hub.callback", &receiver.url),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    receiver.wait_verified(1).await;
    wait_subscriptions(&a.url, 1).await;
    let resp = client
        .post(format!("{}/channels/{CHANNEL}/changes", a.url))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!([
            change(&base, "a.txt", "created"),
            change(&base, "b.bin", "created"),
            change(&base, "c/d.json", "created"),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    for hub in [&a.url, &b.url] {
        let dumps = wait_dumps(&client, &dumps_url(hub, CHANNEL), None, 1).await;
        assert_eq!(dumps[0].seq_range, Some((1, 3)));
        let unzipped = download(&client, &dumps[0]).await;
        assert_equals_source(&unzipped, &base, src.path());
        assert_eq!(unzipped.files.len(), 3);
    }
    receiver
        .wait_for("the dump announced", WAIT, |r| {
            notified(r).contains(&(1, 3))
        })
        .await;
}
