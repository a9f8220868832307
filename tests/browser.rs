//! The dashboard in a real browser: headless Chromium driven over WebDriver (chromedriver)
//! loads the page from the hub, changes are pushed, and the tests see the page follow: new
//! rows, the filter, the rate chart from the hub's counters, subscriptions sorted worst first
//! (a failing callback turns red), a wrong admin token's message, the view of one channel,
//! the change table pausing while scrolled, the chart's history on a reload, the contrast of
//! its coloured text, and a layout that fits 375 px. Screenshots at 1280 and 375 px wide are
//! saved to the tests' temporary folder, `target/tmp/` (`dashboard.png`, `dashboard-1280.png`,
//! `dashboard-375.png`).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them). Without them the
//! tests fail under CI (`CI` set) and are skipped with a message elsewhere.

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

impl<'a> Session<'a> {
    /// Waits until the dashboard says it is connected and following live.
    async fn wait_live(&self) {
        self.wait_script(
            "the page to be live",
            "return document.querySelector('#state').textContent",
            |v| v == "live",
        )
        .await;
    }

    /// A new headless Chromium window (1280×900) at `url`.
    async fn open(driver: &'a Driver, profile: &std::path::Path, url: &str) -> Session<'a> {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }
        }}});
        let created = driver
            .call(reqwest::Method::POST, "/session", Some(caps))
            .await;
        let session = Session {
            driver,
            id: created["sessionId"].as_str().unwrap().to_string(),
        };
        session.post("url", json!({ "url": url })).await;
        session
    }

    async fn post(&self, what: &str, body: Value) -> Value {
        self.driver
            .call(
                reqwest::Method::POST,
                &format!("/session/{}/{what}", self.id),
                Some(body),
            )
            .await
    }

    async fn close(self) {
        self.driver
            .call(
                reqwest::Method::DELETE,
                &format!("/session/{}", self.id),
                None,
            )
            .await;
    }

    /// Makes the page's viewport `width`×`height` CSS pixels, as a phone's when `mobile`
    /// (through the DevTools protocol: a window cannot be made that narrow).
    async fn viewport(&self, width: u32, height: u32, mobile: bool) {
        self.post(
            "goog/cdp/execute",
            json!({"cmd": "Emulation.setDeviceMetricsOverride", "params": {
                "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile,
            }}),
        )
        .await;
    }

    /// Saves a screenshot of the window as `target/tmp/{name}`.
    async fn screenshot(&self, name: &str) {
        let png = self
            .driver
            .call(
                reqwest::Method::GET,
                &format!("/session/{}/screenshot", self.id),
                None,
            )
            .await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        assert!(bytes.starts_with(b"\x89PNG"));
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&path, bytes).unwrap();
        eprintln!("screenshot: {}", path.display());
    }

    /// Sends the Enter key to the element `css` selects (as a keyboard user activates it).
    async fn press_enter(&self, css: &str) {
        let found = self
            .post("element", json!({"using": "css selector", "value": css}))
            .await;
        let id = found["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap();
        self.post(&format!("element/{id}/value"), json!({"text": "\u{E007}"}))
            .await;
    }

    async fn script(&self, script: &str) -> Value {
        self.post("execute/sync", json!({"script": script, "args": []}))
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
    let session = Session::open(&driver, profile.path(), &format!("{}/", hub.url)).await;

    // The page connects, replays the recent changes and goes live.
    session.wait_live().await;
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

    session.screenshot("dashboard.png").await;
    session.close().await;
}

/// Pushes `n` created changes to `channel`; asserts 202.
async fn push_to(hub: &TestHub, channel: &str, token: &str, prefix: &str, n: usize) {
    let changes: Vec<_> = (0..n)
        .map(|i| json!({"loc": format!("http://example.com/{prefix}/{i}"), "change": "created"}))
        .collect();
    let resp = hub
        .client
        .post(format!("{}/channels/{channel}/changes", hub.url))
        .bearer_auth(token)
        .json(&changes)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
}

/// The coloured text of the page whose contrast with its background is below 4.5:1, as
/// `[selector, text, ratio]`.
const CONTRAST: &str = r#"
const lum = (c) => {
  const [r, g, b] = c.match(/[\d.]+/g).slice(0, 3).map(Number).map((v) => {
    v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
};
const background = (el) => {
  for (; el; el = el.parentElement) {
    const c = getComputedStyle(el).backgroundColor;
    if (c !== 'rgba(0, 0, 0, 0)' && c !== 'transparent') return c;
  }
  return 'rgb(255, 255, 255)';
};
const low = [];
const sel = '.badge, .muted, .state, td, th, a, button, .series b, .types span, #subs-message, label';
for (const el of document.querySelectorAll(sel)) {
  if (!el.textContent.trim() || !el.offsetParent) continue;
  const [a, b] = [lum(getComputedStyle(el).color), lum(background(el))];
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  if (ratio < 4.5) low.push([el.className || el.tagName, el.textContent.trim().slice(0, 30), ratio.toFixed(2)]);
}
return low;
"#;

/// Submits the admin token form with `token`.
async fn give_token(session: &Session<'_>, token: &str) {
    session
        .script(&format!(
            "document.querySelector('#admin-token').value = {}; document.querySelector('#token-form').requestSubmit(); return true",
            json!(token)
        ))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_for_an_operator() {
    if !browser_available() {
        return;
    }
    let hub = TestHub::start(|c| {
        c.linger = Duration::from_millis(10);
        *c = c.clone().with_channel("other", "other-token");
    })
    .await;
    hub.push("before", 3).await;
    push_to(&hub, "other", "other-token", "elsewhere", 2).await;
    // Two callbacks; the one whose URL sorts last will fail.
    let one = Receiver::start(Behaviour::default()).await;
    let two = Receiver::start(Behaviour::default()).await;
    let (ok, bad) = if one.url < two.url {
        (one, two)
    } else {
        (two, one)
    };
    for r in [&ok, &bad] {
        hub.subscribe(&r.url, &[]).await;
        hub.wait_subscribed(&r.url).await;
    }

    let driver = Driver::start().await;
    let profile = tempfile::tempdir().unwrap();
    let session = Session::open(&driver, profile.path(), &format!("{}/", hub.url)).await;
    session.wait_live().await;

    // A wrong admin token says so, and shows no subscriptions.
    give_token(&session, "not-the-token").await;
    session
        .wait_script(
            "the wrong token's message",
            "return document.querySelector('#subs-message').textContent",
            |v| v.as_str().is_some_and(|t| t.contains("Wrong admin token")),
        )
        .await;
    let rows = session
        .script("return document.querySelectorAll('#subscriptions tbody tr').length")
        .await;
    assert_eq!(rows, 0);

    // The right one lists both subscriptions, healthy, in callback order.
    give_token(&session, ADMIN).await;
    let subs = "return [...document.querySelectorAll('#subscriptions tbody tr')].map(r => [r.dataset.callback, r.dataset.health, getComputedStyle(r.querySelector('.badge')).backgroundColor])";
    let healthy = session
        .wait_script("two healthy subscriptions", subs, |v| {
            v.as_array()
                .is_some_and(|a| a.len() == 2 && a.iter().all(|r| r[1] == "healthy"))
        })
        .await;
    assert_eq!(healthy[1][0], bad.url.as_str(), "{healthy}");

    // The rate chart shows the hub's own counts: the changes published in the last 10
    // minutes, whatever the table replayed.
    let chart = r#"return [...document.querySelectorAll('#charts figure')].map(c => [c.dataset.channel, c.querySelector('[data-now="last"]').textContent, c.querySelector('polyline.last').getAttribute('points'), c.querySelector('[data-now="delivered"]').textContent, c.querySelector('[data-type="created"]').textContent, c.querySelector('[data-total]').textContent])"#;
    let idle = session
        .wait_script("the chart's first rates", chart, |v| {
            v.as_array().is_some_and(|a| a.len() == 2)
        })
        .await;
    let total = |v: &Value| v[5].as_str().unwrap_or_default().to_string();
    assert_eq!(idle[0][0], "news", "{idle}");
    assert!(total(&idle[0]).starts_with("3 changes,"), "{idle}");
    // By type too: the hub's window (3 updated on news), which the page did not see arrive.
    assert_eq!(idle[0][4], "created 0", "{idle}");
    let updated = session
        .script("return document.querySelector('#charts figure[data-channel=\"news\"] [data-type=\"updated\"]').textContent")
        .await;
    assert_eq!(updated, "updated 3");
    assert!(total(&idle[1]).starts_with("2 changes,"), "{idle}");
    let replayed = session
        .script("return document.querySelectorAll('#changes tbody tr[data-seq]').length")
        .await;
    assert_eq!(replayed, 5, "3 + 2 replayed rows");

    // Changes pushed now make the chart rise; the healthy callback's deliveries too.
    bad.set_behaviour(|b| b.post_status = reqwest::StatusCode::INTERNAL_SERVER_ERROR);
    for i in 0..4 {
        push_to(&hub, "news", TOKEN, &format!("live{i}"), 10).await;
    }
    ok.wait_seq(43, Duration::from_secs(10)).await;
    let busy = session
        .wait_script("the chart to rise", chart, |v| {
            let news = &v[0];
            let rate = |s: &Value| s.as_str().and_then(|s| s.parse::<f64>().ok());
            total(news).starts_with("43 changes,")
                && rate(&news[1]) > rate(&idle[0][1])
                && rate(&news[3]) > Some(0.0)
                && news[2] != idle[0][2]
        })
        .await;
    assert_eq!(
        busy[0][4], "created 40",
        "the window's changes by type: {busy}"
    );
    assert!(total(&busy[1]).starts_with("2 changes,"), "{busy}");

    // The failing callback turns red and sorts first.
    let failing = session
        .wait_script("the failing subscription first", subs, |v| {
            v[0][1] == "failing" && v[1][1] == "healthy"
        })
        .await;
    assert_eq!(failing[0][0], bad.url.as_str(), "{failing}");
    assert_eq!(failing[0][2], "rgb(194, 28, 44)", "red: {failing}");
    let message = session
        .script("return document.querySelector('#subs-message').textContent")
        .await;
    assert!(
        message.as_str().is_some_and(|m| m.contains("1 failing")),
        "{message}"
    );
    session.viewport(1280, 1800, false).await;
    session.screenshot("dashboard-1280.png").await;

    // Text contrast (WCAG AA, 4.5:1) of every piece of text the page colours.
    let low = session.script(CONTRAST).await;
    assert_eq!(low, json!([]), "text below 4.5:1 contrast");

    // The view of one channel, opened from the keyboard: its facts and documents, the table
    // and charts filtered to it.
    session
        .press_enter("#channels button[data-open=\"news\"]")
        .await;
    let facts = "const d = document.querySelector('#detail'); return d.hidden ? null : Object.fromEntries([...d.querySelectorAll('[data-fact]')].map(e => [e.dataset.fact, e.textContent]).concat([...d.querySelectorAll('[data-link]')].map(a => [a.dataset.link, a.href])))";
    let shown = session
        .wait_script("the channel view", facts, |v| v["head"] == "43")
        .await;
    assert_eq!(shown["topic"], hub.topic().as_str(), "{shown}");
    assert_eq!(shown["subscribers"], "2", "{shown}");
    assert_eq!(shown["oldest"], "1", "{shown}");
    assert!(
        shown["epoch"]
            .as_str()
            .is_some_and(|e| e.len() == 16 && e.chars().all(|c| c.is_ascii_hexdigit())),
        "{shown}"
    );
    assert!(
        shown["retention"]
            .as_str()
            .is_some_and(|r| r.contains("changes")),
        "{shown}"
    );
    for (link, path) in [
        ("topic", "/channels/news/changelist.xml"),
        ("archive", "/channels/news/changelist-archive.xml"),
        ("resource_list", "/channels/news/resourcelist.xml"),
    ] {
        assert_eq!(shown[link], format!("{}{path}", hub.url), "{shown}");
    }
    let channels_shown = "return [...new Set([...document.querySelectorAll('#changes tbody tr[data-seq]')].map(r => r.children[1].textContent))].concat([...document.querySelectorAll('#charts figure')].map(f => 'chart:' + f.dataset.channel))";
    session
        .wait_script("only news in the channel view", channels_shown, |v| {
            *v == json!(["news", "chart:news"])
        })
        .await;

    // The change table pauses while scrolled, and resumes on request.
    session
        .script("document.querySelector('#changes-scroll').scrollTop = 200; return true")
        .await;
    session
        .wait_script(
            "the pause",
            "return document.querySelector('#paused').hidden",
            |v| v == false,
        )
        .await;
    let top = "return document.querySelector('#changes tbody tr[data-seq]').dataset.seq";
    let before = session.script(top).await;
    push_to(&hub, "news", TOKEN, "while-paused", 5).await;
    session
        .wait_script(
            "the count of new changes",
            "return document.querySelector('#pending-count').textContent",
            |v| v == "5",
        )
        .await;
    assert_eq!(session.script(top).await, before, "paused: no new rows");
    session
        .script("document.querySelector('#resume').click(); return true")
        .await;
    session
        .wait_script("the newest row after resuming", top, |v| v == "48")
        .await;

    session.viewport(375, 2400, true).await;
    let width = session
        .script("return document.documentElement.clientWidth")
        .await;
    assert_eq!(width, 375);
    let overflow = session
        .script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
        )
        .await;
    assert_eq!(overflow, 0, "nothing wider than the phone's screen");
    session.screenshot("dashboard-375.png").await;

    // A page opened now shows the last 10 minutes at once: the peak is there.
    session.post("refresh", json!({})).await;
    session
        .wait_script(
            "the chart after a reload",
            "const c = document.querySelector('#charts figure[data-channel=\"news\"]'); return c && Number(c.querySelector('[data-peak=\"last\"]').textContent)",
            |v| v.as_f64().is_some_and(|p| p > 0.0),
        )
        .await;
    session.close().await;
}
