//! The examples in `examples/`, the real binaries, each run to its end against a real hub on
//! loopback, as the README's walk-through runs them.

#[path = "common/mod.rs"]
mod common;

use common::*;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

const WAIT: Duration = Duration::from_secs(30);

/// The example binary `name`: `cargo test` builds the examples into `target/<profile>/examples/`,
/// beside the folder of the `changehub` binary.
fn example(name: &str) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_changehub"));
    let path = bin.parent().unwrap().join("examples").join(name);
    assert!(
        path.is_file(),
        "example binary {} is missing: `cargo test` builds it (or `cargo build --examples`)",
        path.display()
    );
    path
}

/// A running example: its stdout and stderr lines as they come; killed when dropped.
struct Running {
    child: tokio::process::Child,
    stdout: Lines,
    stderr: Lines,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    fn start(name: &str, args: &[&str]) -> Running {
        let mut child = tokio::process::Command::new(example(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start example {name}: {e}"));
        let (stdout, out) = collect(child.stdout.take().unwrap());
        let (stderr, err) = collect(child.stderr.take().unwrap());
        Running {
            child,
            stdout,
            stderr,
            readers: vec![out, err],
        }
    }

    fn stdout(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Waits for the example to exit by itself; its status, once its output is read.
    async fn exit(&mut self) -> ExitStatus {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the example did not exit in time; stderr:\n{}",
                    self.stderr()
                )
            })
            .unwrap();
        // The pipes close with the process; the readers finish soon after.
        for reader in self.readers.drain(..) {
            tokio::time::timeout(WAIT, reader).await.unwrap().unwrap();
        }
        status
    }
}

/// Reads lines from `pipe` into a shared list until it closes.
type Lines = Arc<Mutex<Vec<String>>>;

fn collect(pipe: impl AsyncRead + Unpin + Send + 'static) -> (Lines, tokio::task::JoinHandle<()>) {
    let lines = Lines::default();
    let sink = lines.clone();
    let reader = tokio::spawn(async move {
        let mut pipe = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = pipe.next_line().await {
            sink.lock().unwrap().push(line);
        }
    });
    (lines, reader)
}

/// Runs an example to its end: (status, stdout lines, stderr).
async fn run(name: &str, args: &[&str]) -> (ExitStatus, Vec<String>, String) {
    let mut running = Running::start(name, args);
    let status = running.exit().await;
    (status, running.stdout(), running.stderr())
}

/// The `seq<TAB>change<TAB>loc` lines for `updated` changes of `TestHub::push(prefix, n)`.
fn pushed(prefix: &str, first: u64, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                "{}\tupdated\thttp://example.com/{prefix}/{i}",
                first + i as u64
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_pushes_once_per_idempotency_key() {
    let hub = TestHub::start(|_| {}).await;
    let args = [hub.url.as_str(), CHANNEL, TOKEN, "4", "--key", "run-1"];

    let (status, stdout, stderr) = run("source", &args).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout, ["accepted 4 changes: seq 1..=4"], "{stderr}");
    assert_eq!(hub.catch_up(0).await, [1, 2, 3, 4]);
    let log = hub
        .text(&format!("/channels/{CHANNEL}/changes?after=0"))
        .await;
    for i in 0..4 {
        assert!(
            log.contains(&format!("<loc>http://example.com/run-1/{i}</loc>")),
            "{log}"
        );
    }

    // The same key again, as after a lost answer: the same seqs, nothing stored twice.
    let (status, stdout, stderr) = run("source", &args).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(
        stdout,
        ["accepted 4 changes: seq 1..=4 (replayed)"],
        "{stderr}"
    );
    let (status, stdout, _) = run("source", &[&hub.url, CHANNEL, TOKEN, "2"]).await;
    assert!(status.success());
    assert_eq!(stdout, ["accepted 2 changes: seq 5..=6"]);
    assert_eq!(hub.catch_up(0).await, [1, 2, 3, 4, 5, 6]);

    // A wrong token: refused, with the hub's reason, and a non-zero exit.
    let (status, stdout, stderr) = run("source", &[&hub.url, CHANNEL, "wrong", "1"]).await;
    assert!(!status.success() && stdout.is_empty());
    assert!(
        stderr.contains("403") && stderr.contains("wrong token"),
        "{stderr}"
    );
    assert_eq!(hub.catch_up(0).await.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_prints_signed_deliveries_only() {
    let hub = TestHub::start(|_| {}).await;
    hub.push("before", 3).await;
    hub.wait_published(3).await;

    let port = free_port();
    let callback = format!("http://127.0.0.1:{port}/callback");
    let mut destination = Running::start(
        "destination",
        &[&hub.url, CHANNEL, &port.to_string(), "--count", "5"],
    );
    hub.wait_subscribed(&callback).await;

    // Forged deliveries: a real Change List with other locs, unsigned or signed with another
    // secret. Acknowledged (WebSub asks for 2xx), never printed.
    let topic = hub
        .text(&format!("/channels/{CHANNEL}/changelist.xml"))
        .await;
    let forged = topic.replace("http://example.com/before/", "http://forged.example/");
    assert!(forged.contains("http://forged.example/0"), "{topic}");
    let wrong = changehub::model::signature::signature(
        changehub::model::Algorithm::Sha256,
        b"not the secret",
        forged.as_bytes(),
    );
    for signature in [None, Some(wrong.as_str()), Some("sha256=00")] {
        let mut post = hub.client.post(&callback).body(forged.clone());
        if let Some(signature) = signature {
            post = post.header("X-Hub-Signature", signature);
        }
        let status = post.send().await.unwrap().status();
        assert!(status.is_success(), "forged delivery answered {status}");
    }

    let (first, _) = hub.push("after", 5).await;
    assert_eq!(first, 4);
    let status = destination.exit().await;
    let stderr = destination.stderr();
    assert!(status.success(), "{stderr}");
    assert_eq!(destination.stdout(), pushed("after", 4, 5), "{stderr}");
    assert_eq!(
        stderr.matches("without a valid X-Hub-Signature").count(),
        3,
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_resumes_after_its_cursor() {
    // Small notifications, so that `--count` stops in the middle of the stream.
    let hub = TestHub::start(|c| c.max_batch = 3).await;
    hub.push("a", 10).await;
    hub.wait_published(10).await;
    let dir = tempfile::tempdir().unwrap();
    let cursor = dir.path().join("news.cursor");
    let cursor_arg = cursor.to_str().unwrap();
    let args = |count| [hub.url.as_str(), CHANNEL, cursor_arg, "--count", count];
    let saved = || std::fs::read_to_string(&cursor).unwrap();

    // No cursor file: from the start of the log.
    let (status, first_run, stderr) = run("follow", &args("4")).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(first_run, pushed("a", 1, 4), "{stderr}");
    assert!(saved().starts_with("4 "), "{}", saved());

    // A restart: the replay from the cursor, then live changes pushed while it runs.
    let mut second = Running::start("follow", &args("8"));
    wait_until("the replay printed", WAIT, || async {
        second.stdout().len() >= 6
    })
    .await;
    hub.push("b", 6).await;
    let status = second.exit().await;
    assert!(status.success(), "{}", second.stderr());
    let mut expected = pushed("a", 1, 10)[4..].to_vec();
    expected.extend(pushed("b", 11, 2));
    assert_eq!(second.stdout(), expected, "{}", second.stderr());
    assert!(saved().starts_with("12 "), "{}", saved());

    // And again: the rest, nothing missed, nothing twice.
    let (status, third_run, stderr) = run("follow", &args("4")).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(third_run, pushed("b", 11, 6)[2..], "{stderr}");
    let all: Vec<String> = [first_run, second.stdout(), third_run].concat();
    let mut everything = pushed("a", 1, 10);
    everything.extend(pushed("b", 11, 6));
    assert_eq!(all, everything);

    // A channel the hub does not have: a clear refusal, not a retry loop.
    let (status, _, stderr) = run("follow", &[&hub.url, "nope", cursor_arg]).await;
    assert!(!status.success());
    assert!(stderr.contains("404"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_reconnects_through_a_hub_restart() {
    let data = tempfile::tempdir().unwrap();
    let data_arg = ["--data-dir", data.path().to_str().unwrap()];
    let port = free_port();
    let mut hub = HubProcess::start_on(port, &data_arg).await;
    let url = hub.url.clone();
    let push = |key: &'static str| {
        let url = url.clone();
        async move {
            let (status, _, stderr) =
                run("source", &[&url, CHANNEL, TOKEN, "5", "--key", key]).await;
            assert!(status.success(), "{stderr}");
        }
    };
    let created = |key: &str, first: u64| -> Vec<String> {
        (0..5)
            .map(|i| format!("{}\tcreated\thttp://example.com/{key}/{i}", first + i))
            .collect()
    };
    push("a").await;
    let cursor = tempfile::tempdir().unwrap();
    let cursor_arg = cursor.path().join("news.cursor");
    let args = [&url, CHANNEL, cursor_arg.to_str().unwrap(), "--count", "10"];
    let mut follow = Running::start("follow", &args);
    wait_until("the first five printed", WAIT, || async {
        follow.stdout().len() == 5
    })
    .await;

    // The hub dies and comes back on the same address; the follower reconnects from its cursor.
    hub.kill9();
    hub = HubProcess::start_on(port, &data_arg).await;
    push("b").await;
    let status = follow.exit().await;
    let stderr = follow.stderr();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("reconnecting"), "{stderr}");
    assert_eq!(
        follow.stdout(),
        [created("a", 1), created("b", 6)].concat(),
        "{stderr}"
    );
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_ends_when_the_hub_denies_it() {
    // A private channel refuses WebSub subscriptions with `hub.mode=denied`.
    let hub = TestHub::start(|c| {
        if let Some(channel) = c.channels.get_mut(CHANNEL) {
            channel.read_token = Some("reader".into());
        }
    })
    .await;
    let (status, stdout, stderr) = run("destination", &[&hub.url, CHANNEL]).await;
    assert!(!status.success() && stdout.is_empty(), "{stderr}");
    assert!(stderr.contains("hub: denied"), "{stderr}");
}
