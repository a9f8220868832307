//! The dashboard in a real browser: headless Chromium driven over WebDriver (chromedriver)
//! loads the page from the hub, changes are pushed, and the test sees them appear in the page.
//! A screenshot is saved to `target/tmp/dashboard.png`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them). Without them the
//! test fails under CI (`CI` set) and is skipped with a message elsewhere.

#[path = "common/mod.rs"]
mod common;

use base64::Engine as _;
use common::*;
use serde_json::{json, Value};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

struct Driver {
    child: Child,
    url: String,
    client: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    async fn start() -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
        };
        wait_until("chromedriver ready", Duration::from_secs(20), || async {
            match driver
                .client
                .get(format!("{}/status", driver.url))
                .send()
                .await
            {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .is_ok_and(|v| v["value"]["ready"] == true),
                Err(_) => false,
            }
        })
        .await;
        driver
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.client.request(method, format!("{}{path}", self.url));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let value: Value = resp.json().await.unwrap();
        assert!(status.is_success(), "WebDriver {path}: {status} {value}");
        value["value"].clone()
    }
}

struct Session<'a> {
    driver: &'a Driver,
    id: String,
}

impl Session<'_> {
    async fn script(&self, script: &str) -> Value {
        self.driver
            .call(
                reqwest::Method::POST,
                &format!("/session/{}/execute/sync", self.id),
                Some(json!({"script": script, "args": []})),
            )
            .await
    }

    async fn wait_script(&self, what: &str, script: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::time::Instant::now() < deadline {
            last = self.script(script).await;
            if ok(&last) {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out waiting for {what}; last value: {last}");
    }
}

fn browser_available() -> bool {
    let present =
        std::path::Path::new(CHROMEDRIVER).exists() && std::path::Path::new(CHROMIUM).exists();
    if !present {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install chromium and chromium-driver (see .ci/run)"
        );
        eprintln!("skipping the browser test: {CHROMIUM} or {CHROMEDRIVER} is not installed");
    }
    present
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_changes_live() {
    if !browser_available() {
        return;
    }
    let hub = TestHub::start(|c| c.linger = Duration::from_millis(10)).await;
    hub.push("before", 3).await;

    let driver = Driver::start().await;
    let profile = tempfile::tempdir().unwrap();
    let caps = json!({"capabilities": {"alwaysMatch": {
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                format!("--user-data-dir={}", profile.path().display()),
            ]
        }
    }}});
    let created = driver
        .call(reqwest::Method::POST, "/session", Some(caps))
        .await;
    let session = Session {
        driver: &driver,
        id: created["sessionId"].as_str().unwrap().to_string(),
    };
    driver
        .call(
            reqwest::Method::POST,
            &format!("/session/{}/url", session.id),
            Some(json!({"url": format!("{}/", hub.url)})),
        )
        .await;

    // The page connects, replays the recent changes and goes live.
    session
        .wait_script(
            "the page to be live",
            "return document.querySelector('#state').textContent",
            |v| v == "live",
        )
        .await;
    let rows = "return [...document.querySelectorAll('#changes tbody tr[data-seq]')].map(r => r.children[3].textContent)";
    session
        .wait_script("the replayed changes", rows, |v| {
            v.as_array().is_some_and(|a| a.len() == 3)
        })
        .await;

    // Changes pushed now appear in the page.
    let (status, _) = hub
        .push_json(json!([
            {"loc": "http://example.com/live/apple", "change": "created"},
            {"loc": "http://example.com/live/banana", "change": "updated"},
            {"loc": "http://example.com/live/cherry", "change": "deleted"},
        ]))
        .await;
    assert_eq!(status, 202);
    let shown = session
        .wait_script("the pushed changes", rows, |v| {
            v.as_array().is_some_and(|a| {
                ["apple", "banana", "cherry"]
                    .iter()
                    .all(|w| a.iter().any(|l| l.as_str().unwrap().ends_with(w)))
            })
        })
        .await;
    assert_eq!(
        shown[0], "http://example.com/live/cherry",
        "newest first: {shown}"
    );
    let head = session
        .script("return document.querySelector('#channels tr[data-channel=\"news\"] .head').textContent")
        .await;
    assert_eq!(head, "6");

    // Filtering narrows the table.
    session
        .script("const f = document.querySelector('#filter'); f.value = 'banana'; f.dispatchEvent(new Event('input')); return true")
        .await;
    let filtered = session
        .wait_script("the filter", rows, |v| {
            v.as_array().is_some_and(|a| a.len() == 1)
        })
        .await;
    assert_eq!(filtered[0], "http://example.com/live/banana");

    let png = driver
        .call(
            reqwest::Method::GET,
            &format!("/session/{}/screenshot", session.id),
            None,
        )
        .await;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(png.as_str().unwrap())
        .unwrap();
    assert!(bytes.starts_with(b"\x89PNG"));
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    std::fs::write(&path, bytes).unwrap();
    eprintln!("screenshot: {}", path.display());

    driver
        .call(
            reqwest::Method::DELETE,
            &format!("/session/{}", session.id),
            None,
        )
        .await;
}
