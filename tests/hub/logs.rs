//! The binary's log lines: JSON lines that parse one by one, text lines that input cannot
//! forge (a CR/LF in a logged value is written escaped), and the start-up summary.

use crate::common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A forged log line hidden in a topic URL.
const FORGED: &str = "http://example.com/x\r\n2026-01-01T00:00:00Z  INFO forged: admin logged in";

/// A `changehub serve` process whose stderr goes to a file.
struct LoggedHub {
    child: std::process::Child,
    url: String,
    log_path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl LoggedHub {
    /// Starts `changehub --log-format FORMAT serve` (RUST_LOG=changehub=info) with `args`
    /// beside the listen address and data folder, and waits until it is ready.
    async fn start(format: &str, args: &[&str]) -> LoggedHub {
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("stderr.log");
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_changehub"))
            .args(["--log-format", format, "serve"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--data-dir", dir.path().join("data").to_str().unwrap()])
            .args(args)
            .env("RUST_LOG", "changehub=info")
            .env_remove("NO_COLOR")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("start changehub");
        let client = reqwest::Client::new();
        wait_until("the hub is ready", Duration::from_secs(20), || async {
            client
                .get(format!("{url}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        LoggedHub {
            child,
            url,
            log_path,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Stops it with SIGTERM; asserts a clean exit; returns everything it logged.
    async fn stop(self) -> String {
        let LoggedHub {
            mut child,
            log_path,
            _dir,
            ..
        } = self;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "{status}");
        std::fs::read_to_string(&log_path).unwrap()
    }
}

/// Runs `changehub serve --log-format FORMAT`, asks for a subscription that is denied (and
/// logged with its topic), stops it, and returns what it wrote on stderr.
async fn log_of_a_denied_subscription(format: &str) -> String {
    let hub = LoggedHub::start(
        format,
        &[
            "--channel",
            "news=secret-token",
            "--allow-private-callbacks",
        ],
    )
    .await;
    let (status, text) = hub_request_at(
        &reqwest::Client::new(),
        &hub.url,
        &[
            ("hub.mode", "subscribe"),
            ("hub.topic", FORGED),
            ("hub.callback", "http://127.0.0.1:9/callback"),
        ],
    )
    .await;
    assert_eq!(status, 202, "{text}");
    wait_until("the denial is logged", Duration::from_secs(10), || async {
        hub.log().contains("subscription denied")
    })
    .await;
    hub.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_parse_line_by_line_and_keep_values_whole() {
    let log = log_of_a_denied_subscription("json").await;
    let mut denied = None;
    let mut summary = None;
    for line in log.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        assert!(event["level"].is_string(), "{line}");
        match event["fields"]["message"].as_str() {
            Some("subscription denied") => denied = Some(event.clone()),
            Some("changehub serving") => summary = Some(event.clone()),
            _ => {}
        }
    }
    let denied = denied.expect("the denial");
    assert_eq!(
        denied["fields"]["topic"], FORGED,
        "the value, CR/LF included"
    );
    let summary = summary.expect("the start-up summary");
    for field in [
        "version",
        "public_url",
        "dashboard",
        "store",
        "channels",
        "admin_api",
    ] {
        assert!(summary["fields"][field].is_string(), "{field}: {summary}");
    }
    assert!(summary["fields"]["store"]
        .as_str()
        .is_some_and(|s| s.starts_with("embedded at ")));
    assert_eq!(summary["fields"]["channels"], "news");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_break_in_input_never_starts_a_text_log_line() {
    let log = log_of_a_denied_subscription("text").await;
    assert!(!log.contains('\x1b'), "no colours in a file: {log:?}");
    for line in log.lines() {
        assert!(
            line.starts_with(|c: char| c.is_ascii_digit()),
            "every line starts with its timestamp: {line:?}"
        );
        assert!(!line.contains('\r'), "{line:?}");
    }
    let denied = log
        .lines()
        .find(|l| l.contains("subscription denied"))
        .expect("the denial");
    assert!(
        denied.contains("http://example.com/x\\r\\n2026-01-01T00:00:00Z  INFO forged"),
        "escaped in place: {denied}"
    );
}

/// Start-up errors are one line that says what is wrong: a second hub on a data folder in use
/// names the folder; a wildcard listen address asks for --public-url.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_errors_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = HubProcess::start(&["--data-dir", data.to_str().unwrap()]).await;
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_changehub"))
                .args(args)
                .env("RUST_BACKTRACE", "1")
                .output()
                .unwrap()
        })
    };
    let second = run(vec![
        "serve".into(),
        "--listen".into(),
        format!("127.0.0.1:{}", free_port()),
        "--data-dir".into(),
        data.to_str().unwrap().into(),
        "--channel".into(),
        "news=secret-token".into(),
    ])
    .await
    .unwrap();
    let wildcard = run(vec![
        "serve".into(),
        "--listen".into(),
        "0.0.0.0:8080".into(),
    ])
    .await
    .unwrap();
    drop(first);
    for (output, says) in [
        (&second, data.to_str().unwrap()),
        (&wildcard, "--public-url"),
    ] {
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// A callback that fails a few times, then recovers: one warning when the trouble starts and
/// one line when it ends, not one per retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_trouble_is_logged_once_and_its_recovery_too() {
    let channel = format!("{CHANNEL}={TOKEN}");
    let hub = LoggedHub::start(
        "json",
        &[
            "--channel",
            &channel,
            "--allow-private-callbacks",
            "--admin-token",
            ADMIN,
            "--linger",
            "20ms",
            "--retry-initial",
            "50ms",
            "--retry-max",
            "200ms",
        ],
    )
    .await;
    let (url, client) = (hub.url.clone(), reqwest::Client::new());
    let receiver = Receiver::start(Behaviour {
        fail_first: 4,
        ..Behaviour::default()
    })
    .await;
    subscribe_at(&url, CHANNEL, &receiver.url).await;
    receiver.wait_verified(1).await;
    wait_until("subscribed", Duration::from_secs(10), || async {
        admin_json(&url, "/api/subscriptions")
            .await
            .as_array()
            .is_some_and(|s| s.len() == 1)
    })
    .await;
    let resp = client
        .post(format!("{url}/channels/{CHANNEL}/changes"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"loc": "http://example.com/a", "change": "created"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    receiver.wait_seq(1, Duration::from_secs(20)).await;
    let log = hub.stop().await;
    let messages: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| e["fields"]["message"].as_str().map(str::to_string))
        .collect();
    let count = |start: &str| messages.iter().filter(|m| m.starts_with(start)).count();
    assert_eq!(count("delivery failing"), 1, "{messages:?}");
    assert_eq!(count("delivery recovered"), 1, "{messages:?}");
    assert_eq!(count("delivery failed"), 0, "retries only at debug level");
}
