//! `changehub publish`, the real binary, against a real hub process: a large NDJSON file is
//! split into requests, the hub is SIGKILLed and restarted halfway, and the channel ends with
//! every change exactly once (100,000 changes, `CHANGEHUB_PUBLISH_N` to change it; the
//! ignored test does 1,000,000); a folder published with `--scan` gives exactly its created,
//! updated and deleted files, again after a crash; each kind of failure has its exit status.

use crate::common::*;
use sha2::Digest;
use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;

fn publish(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_changehub"));
    cmd.arg("publish")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in [
        "CHANGEHUB_PUBLISH_HUB",
        "CHANGEHUB_PUBLISH_CHANNEL",
        "CHANGEHUB_PUBLISH_TOKEN",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

async fn last_seq(hub: &str) -> u64 {
    let channels = admin_json(hub, "/api/channels").await;
    channels
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == CHANNEL))
        .and_then(|c| c["last"].as_u64())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_survives_a_hub_killed_halfway_and_counts_each_change_once() {
    let n = std::env::var("CHANGEHUB_PUBLISH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    publish_through_a_hub_kill(n).await;
}

/// Must show 2 of issue 10, kept out of the suite for its time: run it with
/// `cargo test --release --test hub publish -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a million changes: run on demand, in release mode"]
async fn a_million_changes_survive_a_hub_killed_halfway() {
    publish_through_a_hub_kill(1_000_000).await;
}

/// `n` changes from one NDJSON file; the hub is SIGKILLed once a third is in, and restarted.
async fn publish_through_a_hub_kill(n: usize) {
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("changes.ndjson");
    let lines: String = (0..n)
        .map(|i| format!("{{\"loc\":\"http://example.com/p/{i}\",\"change\":\"created\"}}\n"))
        .collect();
    std::fs::write(&file, lines).unwrap();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap().to_string();
    let port = free_port();
    let mut hub = HubProcess::start_on(port, &["--data-dir", &data_arg]).await;
    // Generous deadlines that grow with n: they only fail a run that is stuck.
    let deadline = Duration::from_secs(120 + n as u64 / 1000);

    let mut publisher = publish(&[
        "--hub",
        &hub.url,
        "--channel",
        CHANNEL,
        "--token",
        TOKEN,
        "--batch",
        "500",
        file.to_str().unwrap(),
    ])
    .spawn()
    .unwrap();
    // Read stderr as it comes: a full pipe would stop the publisher.
    let stderr = tokio::spawn(read_all(publisher.stderr.take()));
    wait_until("a third published", deadline, || async {
        last_seq(&hub.url).await >= (n / 3) as u64
    })
    .await;
    hub.kill9();
    let killed_at = started.elapsed();
    let hub = HubProcess::start_on(port, &["--data-dir", &data_arg]).await;
    let status = tokio::time::timeout(deadline, publisher.wait())
        .await
        .expect("publish ends")
        .unwrap();
    let stderr = stderr.await.unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("retrying"),
        "the kill was noticed: {stderr}"
    );
    let summary = stderr.lines().last().unwrap_or_default().to_string();
    assert!(
        summary.contains(&format!("done: {n} changes accepted")),
        "{stderr}"
    );
    assert_eq!(
        last_seq(&hub.url).await,
        n as u64,
        "every change exactly once"
    );
    let log = log_after(&reqwest::Client::new(), &hub.url, 0).await;
    assert_eq!(log.len(), n);
    let locs: std::collections::HashSet<&str> = log.iter().map(|(_, c)| c.loc.as_str()).collect();
    assert_eq!(locs.len(), n, "no change twice, none missing");
    eprintln!(
        "{n} changes: hub killed at {:.1} s, all in at {:.1} s ({summary})",
        killed_at.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

async fn read_all(stream: Option<tokio::process::ChildStderr>) -> String {
    let mut text = String::new();
    if let Some(mut stream) = stream {
        stream.read_to_string(&mut text).await.unwrap();
    }
    text
}

/// `publish --scan` of `dir` to the hub at `hub`: exit status and stderr.
async fn scan(hub: &str, dir: &Path, state: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec![
        "--hub",
        hub,
        "--channel",
        CHANNEL,
        "--token",
        TOKEN,
        "--scan",
        dir.to_str().unwrap(),
        "--base-url",
        "http://files.example.com/pub/",
        "--state",
        state.to_str().unwrap(),
    ];
    args.extend(extra);
    let out = tokio::time::timeout(Duration::from_secs(60), publish(&args).output())
        .await
        .expect("publish ends")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status.code().unwrap_or(-1), stderr)
}

fn hash_of(bytes: &[u8]) -> String {
    format!(
        "md5:{} sha-256:{}",
        hex::encode(md5::Md5::digest(bytes)),
        hex::encode(sha2::Sha256::digest(bytes))
    )
}

/// The changes after `after` as `change loc` → (hash, length), checking that no loc is there
/// twice.
async fn changes_after(hub: &str, after: u64) -> HashMap<String, (Option<String>, Option<u64>)> {
    let mut out = HashMap::new();
    for (_, c) in log_after(&reqwest::Client::new(), hub, after).await {
        let key = format!("{} {}", c.change, c.loc);
        assert!(
            out.insert(key.clone(), (c.hash, c.length)).is_none(),
            "{key} twice"
        );
    }
    out
}

const BASE: &str = "http://files.example.com/pub/";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_is_published_as_created_updated_and_deleted_files() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let hub = HubProcess::start(&["--data-dir", data.to_str().unwrap()]).await;
    let dir = tmp.path().join("site");
    let state = tmp.path().join("scan.json");
    std::fs::create_dir_all(dir.join("sub/deep")).unwrap();
    std::fs::write(dir.join("a.txt"), "first").unwrap();
    std::fs::write(dir.join("sub/b c.html"), "<p>b</p>").unwrap();
    std::fs::write(dir.join("sub/deep/c#1.bin"), [0u8, 1, 2, 255]).unwrap();
    std::fs::write(dir.join(".a.txt.swp"), "editor").unwrap();
    std::os::unix::fs::symlink(dir.join("a.txt"), dir.join("link.txt")).unwrap();

    // First scan, no state: every file created, two per request.
    let (code, stderr) = scan(&hub.url, &dir, &state, &["--batch", "2"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("done: 3 changes accepted in 2 requests"),
        "{stderr}"
    );
    let first = changes_after(&hub.url, 0).await;
    let expected: HashMap<String, (Option<String>, Option<u64>)> = [
        ("a.txt", &b"first"[..]),
        ("sub/b%20c.html", b"<p>b</p>"),
        ("sub/deep/c%231.bin", &[0, 1, 2, 255]),
    ]
    .into_iter()
    .map(|(path, bytes)| {
        (
            format!("created {BASE}{path}"),
            (Some(hash_of(bytes)), Some(bytes.len() as u64)),
        )
    })
    .collect();
    assert_eq!(first, expected);
    let log = log_after(&reqwest::Client::new(), &hub.url, 0).await;
    let html = log.iter().find(|(_, c)| c.loc.ends_with(".html")).unwrap();
    assert_eq!(html.1.media_type.as_deref(), Some("text/html"));
    assert!(html.1.lastmod.is_some());
    let after_first = last_seq(&hub.url).await;
    assert_eq!(after_first, 3);

    // Change a file, delete one, add one, and touch one without changing its bytes.
    std::fs::write(dir.join("a.txt"), "second, longer").unwrap();
    std::fs::remove_file(dir.join("sub/b c.html")).unwrap();
    std::fs::write(dir.join("d.txt"), "new").unwrap();
    let touched = std::fs::File::options()
        .write(true)
        .open(dir.join("sub/deep/c#1.bin"))
        .unwrap();
    touched
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(60))
        .unwrap();
    let (code, stderr) = scan(&hub.url, &dir, &state, &[]).await;
    assert_eq!(code, 0, "{stderr}");
    let second = changes_after(&hub.url, after_first).await;
    let expected: HashMap<String, (Option<String>, Option<u64>)> = [
        (
            format!("updated {BASE}a.txt"),
            (Some(hash_of(b"second, longer")), Some(14)),
        ),
        (
            format!("created {BASE}d.txt"),
            (Some(hash_of(b"new")), Some(3)),
        ),
        (format!("deleted {BASE}sub/b%20c.html"), (None, None)),
    ]
    .into_iter()
    .collect();
    assert_eq!(second, expected);
    let after_second = last_seq(&hub.url).await;
    assert_eq!(after_second, 6);

    // Nothing changed: nothing published.
    let (code, stderr) = scan(&hub.url, &dir, &state, &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("nothing to publish"), "{stderr}");
    assert_eq!(last_seq(&hub.url).await, after_second);

    // A crash after the hub accepted but before the state was written (the old state put
    // back): the rerun sends the same requests with the same keys and nothing is appended
    // twice; then the state is right again.
    std::fs::write(dir.join("e.txt"), "e").unwrap();
    std::fs::write(dir.join("d.txt"), "newer").unwrap();
    let before = std::fs::read(&state).unwrap();
    let (code, stderr) = scan(&hub.url, &dir, &state, &["--batch", "1"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(last_seq(&hub.url).await, after_second + 2);
    let recorded = std::fs::read(&state).unwrap();
    std::fs::write(&state, before).unwrap();
    let (code, stderr) = scan(&hub.url, &dir, &state, &["--batch", "1"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        last_seq(&hub.url).await,
        after_second + 2,
        "a rerun does not duplicate: {stderr}"
    );
    assert_eq!(std::fs::read(&state).unwrap(), recorded);
    let (code, stderr) = scan(&hub.url, &dir, &state, &[]).await;
    assert_eq!(
        (code, stderr.contains("nothing to publish")),
        (0, true),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_killed_midway_and_rerun_publishes_each_file_once() {
    const FILES: usize = 1000;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let hub = HubProcess::start(&["--data-dir", data.to_str().unwrap()]).await;
    let dir = tmp.path().join("site");
    let state = tmp.path().join("scan.json");
    for i in 0..FILES {
        let sub = dir.join(format!("d{}", i % 10));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("f{i}.txt")), format!("file {i}")).unwrap();
    }
    let mut args = vec![
        "--hub",
        &hub.url,
        "--channel",
        CHANNEL,
        "--token",
        TOKEN,
        "--scan",
        dir.to_str().unwrap(),
        "--base-url",
        BASE,
        "--state",
        state.to_str().unwrap(),
    ];
    args.extend(["--batch", "5"]);
    let mut publisher = publish(&args).stderr(Stdio::null()).spawn().unwrap();
    wait_until("some published", Duration::from_secs(60), || async {
        last_seq(&hub.url).await >= 50
    })
    .await;
    publisher.start_kill().unwrap(); // SIGKILL
    let status = publisher.wait().await.unwrap();
    assert!(!status.success(), "killed before the end");
    let at_kill = last_seq(&hub.url).await;
    assert!(at_kill < FILES as u64, "killed midway: {at_kill}");

    let (code, stderr) = scan(&hub.url, &dir, &state, &["--batch", "5"]).await;
    assert_eq!(code, 0, "{stderr}");
    let rerun: usize = stderr
        .split(" changes since the last scan")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        rerun < FILES && rerun as u64 + at_kill >= FILES as u64,
        "the rerun publishes what was not recorded ({rerun}, {at_kill} in at the kill)"
    );
    eprintln!("killed with {at_kill} of {FILES} in; the rerun published {rerun}");
    let log = changes_after(&hub.url, 0).await;
    assert_eq!(log.len(), FILES, "each file once");
    assert!(log.keys().all(|k| k.starts_with("created ")));
    assert_eq!(last_seq(&hub.url).await, FILES as u64, "no duplicate");
    let (code, stderr) = scan(&hub.url, &dir, &state, &[]).await;
    assert_eq!(
        (code, stderr.contains("nothing to publish")),
        (0, true),
        "{stderr}"
    );
}

/// Each kind of failure, with its message and exit status: 1 the hub refused, 2 bad usage or
/// input, 3 the hub unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_publishing_ends_with_a_clear_message_and_its_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let hub = HubProcess::start(&["--data-dir", data.to_str().unwrap()]).await;
    let good = dir.path().join("good.ndjson");
    std::fs::write(
        &good,
        "{\"loc\":\"http://example.com/a\",\"change\":\"created\"}\n",
    )
    .unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{not json").unwrap();
    let invalid = dir.path().join("invalid.ndjson");
    std::fs::write(&invalid, "{\"loc\":\"nope\",\"change\":\"created\"}\n").unwrap();
    let unknown = dir.path().join("changes.txt");
    std::fs::write(&unknown, "x").unwrap();
    let missing = dir.path().join("missing.ndjson");
    let site = dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("a.txt"), "a").unwrap();
    let (good, bad, invalid, unknown, missing, site) = (
        good.to_str().unwrap(),
        bad.to_str().unwrap(),
        invalid.to_str().unwrap(),
        unknown.to_str().unwrap(),
        missing.to_str().unwrap(),
        site.to_str().unwrap(),
    );
    let state = dir.path().join("scan.json");
    let state = state.to_str().unwrap();
    let no_folder = dir.path().join("no/such/folder/scan.json");
    let no_folder = no_folder.to_str().unwrap();
    let unreachable = format!("http://127.0.0.1:{}", free_port());
    let hub_url = hub.url.as_str();
    for (args, expect, code) in [
        (vec!["--hub", hub_url, "--token", "wrong", good], "403", 1),
        (vec!["--hub", hub_url, "--token", TOKEN, invalid], "400", 1),
        (vec!["--hub", hub_url, "--token", TOKEN, bad], "not JSON", 2),
        (
            vec!["--hub", hub_url, "--token", TOKEN, unknown],
            "--format",
            2,
        ),
        (
            vec!["--hub", hub_url, "--token", TOKEN, missing],
            "missing.ndjson",
            2,
        ),
        (vec!["--hub", "nope", "--token", TOKEN, good], "--hub", 2),
        (
            vec![
                "--hub", hub_url, "--token", TOKEN, "--scan", site, "--state", state,
            ],
            "--base-url",
            2,
        ),
        (
            vec![
                "--hub",
                hub_url,
                "--token",
                TOKEN,
                "--scan",
                site,
                "--base-url",
                BASE,
                good,
            ],
            "--state",
            2,
        ),
        (
            vec![
                "--hub",
                hub_url,
                "--token",
                TOKEN,
                "--scan",
                missing,
                "--base-url",
                BASE,
                "--state",
                state,
            ],
            "missing.ndjson",
            2,
        ),
        (
            vec![
                "--hub",
                hub_url,
                "--token",
                TOKEN,
                "--scan",
                good,
                "--base-url",
                BASE,
                "--state",
                state,
            ],
            "not a folder",
            2,
        ),
        (
            vec![
                "--hub",
                hub_url,
                "--token",
                TOKEN,
                "--scan",
                site,
                "--base-url",
                "ftp://example.com/",
                "--state",
                state,
            ],
            "http or https",
            2,
        ),
        (
            vec![
                "--hub",
                hub_url,
                "--token",
                TOKEN,
                "--scan",
                site,
                "--base-url",
                BASE,
                "--state",
                no_folder,
            ],
            "cannot write",
            2,
        ),
        (
            vec![
                "--hub",
                hub_url,
                "--token",
                TOKEN,
                "--scan",
                site,
                "--base-url",
                BASE,
                "--state",
                bad,
            ],
            "not a scan state file",
            2,
        ),
        (
            vec![
                "--hub",
                &unreachable,
                "--token",
                TOKEN,
                "--retry-for",
                "1s",
                good,
            ],
            "giving up",
            3,
        ),
        (
            vec![
                "--hub",
                &unreachable,
                "--token",
                TOKEN,
                "--retry-for",
                "1s",
                "--scan",
                site,
                "--base-url",
                BASE,
                "--state",
                state,
            ],
            "giving up",
            3,
        ),
    ] {
        let mut all = vec!["--channel", CHANNEL];
        all.extend(args);
        let out = tokio::time::timeout(Duration::from_secs(30), publish(&all).output())
            .await
            .expect("publish ends")
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{all:?}: {stderr}");
        assert!(stderr.contains(expect), "{all:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert_eq!(last_seq(&hub.url).await, 0, "nothing was published");
    assert!(!Path::new(state).exists(), "nothing was recorded");
}
