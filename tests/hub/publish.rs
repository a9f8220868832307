//! `changehub publish`, the real binary, against a real hub process: a large NDJSON file is
//! split into requests, the hub is SIGKILLed and restarted halfway, and the channel ends with
//! every change exactly once; bad input ends with a clear message and a non-zero exit.

use crate::common::*;
use std::process::Stdio;
use std::time::Duration;

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
    const N: usize = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("changes.ndjson");
    let lines: String = (0..N)
        .map(|i| format!("{{\"loc\":\"http://example.com/p/{i}\",\"change\":\"created\"}}\n"))
        .collect();
    std::fs::write(&file, lines).unwrap();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap().to_string();
    let port = free_port();
    let mut hub = HubProcess::start_on(port, &["--data-dir", &data_arg]).await;

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
    wait_until("a third published", Duration::from_secs(60), || async {
        last_seq(&hub.url).await >= (N / 3) as u64
    })
    .await;
    hub.kill9();
    let hub = HubProcess::start_on(port, &["--data-dir", &data_arg]).await;
    let status = tokio::time::timeout(Duration::from_secs(120), publisher.wait())
        .await
        .expect("publish ends")
        .unwrap();
    let mut stderr = String::new();
    use tokio::io::AsyncReadExt;
    publisher
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("retrying"),
        "the kill was noticed: {stderr}"
    );
    assert!(
        stderr.contains(&format!("done: {N} changes accepted")),
        "{stderr}"
    );
    assert_eq!(
        last_seq(&hub.url).await,
        N as u64,
        "every change exactly once"
    );
    let seqs = catch_up(&reqwest::Client::new(), &hub.url, 0).await;
    assert_eq!(seqs.len(), N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_publishing_ends_with_a_clear_message() {
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
    let unreachable = format!("http://127.0.0.1:{}", free_port());
    for (args, expect) in [
        (
            vec![
                "--hub",
                &hub.url,
                "--token",
                "wrong",
                good.to_str().unwrap(),
            ],
            "403",
        ),
        (
            vec!["--hub", &hub.url, "--token", TOKEN, bad.to_str().unwrap()],
            "not JSON",
        ),
        (
            vec![
                "--hub",
                &hub.url,
                "--token",
                TOKEN,
                invalid.to_str().unwrap(),
            ],
            "400",
        ),
        (
            vec![
                "--hub",
                &hub.url,
                "--token",
                TOKEN,
                unknown.to_str().unwrap(),
            ],
            "--format",
        ),
        (
            vec![
                "--hub",
                &unreachable,
                "--token",
                TOKEN,
                "--retry-for",
                "1s",
                good.to_str().unwrap(),
            ],
            "giving up",
        ),
    ] {
        let mut all = vec!["--channel", CHANNEL];
        all.extend(args);
        let out = tokio::time::timeout(Duration::from_secs(30), publish(&all).output())
            .await
            .expect("publish ends")
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{all:?}: {stderr}");
        assert!(stderr.contains(expect), "{all:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert_eq!(last_seq(&hub.url).await, 0, "nothing was published");
}
