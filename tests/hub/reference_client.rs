//! The ResourceSync reference client (Python `resync` 2.0.1, `resync-sync`) against the hub:
//! a source whose changes reach the hub only as pushes is mirrored through the hub alone —
//! a baseline from the hub's Resource List, then incremental syncs from its Change List — and
//! the mirror ends equal to the source, byte for byte.
//!
//! The client runs from a venv this test makes (once, under the target folder) with
//! `python3 -m venv` and `pip install resync==2.0.1`; `scripts/test.sh` installs python3-venv
//! when it is missing.

use crate::common::*;
use crate::topics::{Doc, TopicServer};
use reqwest::StatusCode;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `resync-sync` from the test's venv, made on first use (its `python` is next to it).
pub(crate) fn resync_sync() -> PathBuf {
    static VENV: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = VENV.lock().unwrap_or_else(|e| e.into_inner());
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("resync-venv");
    let client = venv.join("bin/resync-sync");
    if client.exists() {
        return client;
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 (scripts/test.sh installs it)");
    assert!(
        made.success(),
        "python3 -m venv failed (scripts/test.sh installs python3-venv)"
    );
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "resync==2.0.1"])
        .status()
        .expect("pip");
    assert!(installed.success(), "pip install resync==2.0.1 failed");
    client
}

/// Runs `resync-sync ARGS` in `cwd` (where it keeps its state); panics with its output on
/// failure.
async fn run_client(cwd: &Path, args: Vec<String>) -> String {
    let cwd = cwd.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(resync_sync())
            .args(&args)
            .current_dir(&cwd)
            .output()
            .expect("resync-sync");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "resync-sync {args:?} failed:\n{text}");
        text
    })
    .await
    .unwrap()
}

/// The source: path → content (what the static server serves).
type Source = BTreeMap<String, String>;

/// A text file as the static server serves it.
fn file(content: &str) -> Doc {
    Doc::new(content.as_bytes().to_vec(), "text/plain")
}

async fn push(hub: &TestHub, changes: Vec<serde_json::Value>) {
    for chunk in changes.chunks(1000) {
        let (status, json) = hub
            .push_json(serde_json::Value::Array(chunk.to_vec()))
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{json}");
    }
}

/// Every file under `dir`, relative path → content, ignoring the client's own files.
fn mirror(dir: &Path) -> Source {
    let mut out = Source::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                out.insert(format!("/{rel}"), std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_client_mirrors_a_source_through_the_hub_alone() {
    let server = TopicServer::start().await;
    let hub = TestHub::start(|c| c.max_body = 8 << 20).await;
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("mirror");
    let mut source = Source::new();
    let change = |path: &str, kind: &str, content: Option<&str>| {
        let mut c = serde_json::json!({"loc": server.url(path), "change": kind});
        if let Some(content) = content {
            c["length"] = content.len().into();
        }
        c
    };

    // 2,000 resources, announced to the hub only by pushes.
    let mut created = Vec::new();
    for i in 0..2000 {
        let path = format!("/files/r{i:04}.txt");
        let content = format!("resource {i}, version 1\n");
        server.put(&path, file(&content));
        created.push(change(&path, "created", Some(&content)));
        source.insert(path, content);
    }
    push(&hub, created).await;

    // Baseline from the hub's Capability List (its Resource List).
    let caps = format!("{}/channels/{CHANNEL}/capabilitylist.xml", hub.url);
    let files = server.url("/files/");
    let target = dir.to_string_lossy().to_string();
    let out = run_client(
        work.path(),
        vec![
            "--baseline".into(),
            "--noauth".into(),
            "--capabilitylist".into(),
            caps,
            files.clone(),
            target.clone(),
        ],
    )
    .await;
    assert!(out.contains("created=2000"), "{out}");
    let strip = |s: &Source| -> Source {
        s.iter()
            .map(|(k, v)| (k.trim_start_matches("/files").to_string(), v.clone()))
            .collect()
    };
    assert_eq!(mirror(&dir), strip(&source), "baseline");

    // Then creates, updates and deletes, pushed as they happen.
    let mut later = Vec::new();
    for i in (0..2000).step_by(7) {
        let path = format!("/files/r{i:04}.txt");
        let content = format!("resource {i}, version 2\n");
        server.put(&path, file(&content));
        later.push(change(&path, "updated", Some(&content)));
        source.insert(path, content);
    }
    // Deletes among the first 1,000 only. resync keeps the newest lastmod of the baseline and
    // reads the changes dated exactly then again; the second batch of creations shares that
    // datetime (one request, one receipt time), and resync drops a created+deleted pair of the
    // same resource as a no-op, so it would never delete one of those. (A client-side rule,
    // resync 2.0.1 `prune_dupes`; the README says so.)
    for i in (3..1000).step_by(11) {
        let path = format!("/files/r{i:04}.txt");
        let mut gone = Doc::new(Vec::new(), "text/plain");
        gone.status = StatusCode::NOT_FOUND;
        server.put(&path, gone);
        later.push(change(&path, "deleted", None));
        source.remove(&path);
    }
    for i in 2000..2150 {
        let path = format!("/files/r{i:04}.txt");
        let content = format!("resource {i}, version 1\n");
        server.put(&path, file(&content));
        later.push(change(&path, "created", Some(&content)));
        source.insert(path, content);
    }
    push(&hub, later).await;

    let topic = format!("{}/channels/{CHANNEL}/changelist.xml", hub.url);
    let out = run_client(
        work.path(),
        vec![
            "--incremental".into(),
            "--delete".into(),
            "--noauth".into(),
            "--changelist-uri".into(),
            topic,
            files,
            target,
        ],
    )
    .await;
    assert_eq!(
        mirror(&dir),
        strip(&source),
        "after the incremental sync:\n{out}"
    );
}
