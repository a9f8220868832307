//! The XMPP PubSub bridge against a real XMPP server: Prosody (the Debian package `prosody`,
//! whose `mod_pubsub` is built in), started by the test on a loopback port with its own
//! configuration, data folder and pid file in a temporary folder, and two accounts: the hub's
//! (an admin, so that it may create nodes) and a subscriber's.
//!
//! One test walks through the issue's list: a subscriber (a second XMPP client) receives
//! every notification as an item, in order, ids being gapless seq ranges; the Capability List
//! and the topic's `Link` header name the node; a hub restart loses nothing; with the XMPP
//! server killed, ingest goes on and the admin API shows the lag; once the server is back the
//! bridge catches up; and a client that joins late retrieves every item, gapless from seq 1.
//!
//! Prosody missing fails the test with how to install it (`scripts/test.sh` does).

use changehub::config::XmppConfig;
use futures_util::StreamExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_xmpp::connect::DnsConfig;
use tokio_xmpp::jid::{BareJid, Jid};
use tokio_xmpp::minidom::Element;
use tokio_xmpp::xmlstream::Timeouts;
use tokio_xmpp::{Client, Event, IqRequest, IqResponse, Stanza};

use crate::common::{admin_json, free_port, wait_until, TestHub, CHANNEL};

const DOMAIN: &str = "localhost";
const SERVICE: &str = "pubsub.localhost";
const NODE: &str = "changehub/news";
const NS_PUBSUB: &str = "http://jabber.org/protocol/pubsub";
const NS_EVENT: &str = "http://jabber.org/protocol/pubsub#event";
const SITEMAP: &str = "http://www.sitemaps.org/schemas/sitemap/0.9";

/// A Prosody server of the test's own.
struct Prosody {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<tokio::process::Child>,
}

impl Prosody {
    /// Configures Prosody in a temporary folder, registers `hub` and `sub`, and starts it.
    async fn start() -> Prosody {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let root = dir.path();
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::create_dir_all(root.join("certs")).unwrap();
        let config = format!(
            r#"-- Written by tests/hub/xmpp.rs: a private server on loopback.
pidfile = "{root}/prosody.pid"
data_path = "{root}/data"
certificates = "{root}/certs"
log = {{ info = "{root}/prosody.log" }}
daemonize = false
run_as_root = true
admins = {{ "hub@{DOMAIN}" }}
modules_enabled = {{ "roster"; "saslauth"; "disco"; "ping"; "posix" }}
modules_disabled = {{ "s2s"; "offline"; "c2s_bosh"; "http"; "tls" }}
interfaces = {{ "127.0.0.1" }}
c2s_ports = {{ {port} }}
c2s_direct_tls_ports = {{}}
s2s_ports = {{}}
component_ports = {{}}
http_ports = {{}}
https_ports = {{}}
c2s_require_encryption = false
allow_unencrypted_plain_auth = true
authentication = "internal_hashed"
storage = "internal"
VirtualHost "{DOMAIN}"
Component "{SERVICE}" "pubsub"
"#,
            root = root.display()
        );
        std::fs::write(root.join("prosody.cfg.lua"), config).unwrap();
        let mut prosody = Prosody {
            dir,
            port,
            child: None,
        };
        for (user, password) in [("hub", "hub-secret"), ("sub", "sub-secret")] {
            prosody.register(user, password).await;
        }
        prosody.run().await;
        prosody
    }

    fn config_file(&self) -> PathBuf {
        self.dir.path().join("prosody.cfg.lua")
    }

    async fn register(&self, user: &str, password: &str) {
        let out = tokio::process::Command::new("prosodyctl")
            .arg("--config")
            .arg(self.config_file())
            .args(["register", user, DOMAIN, password])
            .output()
            .await
            .unwrap_or_else(|e| panic!("{}", missing(&e)));
        assert!(
            out.status.success(),
            "prosodyctl register {user}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the server (again) and waits until it takes connections.
    async fn run(&mut self) {
        let child = tokio::process::Command::new("prosody")
            .arg("--config")
            .arg(self.config_file())
            .arg("-F")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{}", missing(&e)));
        self.child = Some(child);
        let port = self.port;
        wait_until(
            "prosody takes connections",
            Duration::from_secs(15),
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
            },
        )
        .await;
    }

    /// Kills the server (SIGKILL: no clean shutdown) and waits for it to be gone.
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
        let _ = std::fs::remove_file(self.dir.path().join("prosody.pid"));
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The hub's settings for this server.
    fn bridge(&self) -> XmppConfig {
        XmppConfig {
            jid: format!("hub@{DOMAIN}"),
            password: "hub-secret".into(),
            service: SERVICE.into(),
            server: Some(self.address()),
            plaintext: true,
            node_prefix: "changehub/".into(),
        }
    }
}

fn missing(e: &std::io::Error) -> String {
    format!(
        "cannot run prosody ({e}): this test needs the XMPP server Prosody; install the Debian \
         package `prosody` (bash scripts/test.sh installs it)"
    )
}

/// A second XMPP client, logged in as `sub`.
struct Subscriber {
    client: Client,
    jid: Jid,
    address: String,
}

impl Subscriber {
    async fn connect(prosody: &Prosody) -> Subscriber {
        Subscriber::connect_to(prosody.address()).await
    }

    async fn connect_to(address: String) -> Subscriber {
        let jid = BareJid::new(&format!("sub@{DOMAIN}")).unwrap();
        let mut client = Client::new_plaintext(
            jid,
            "sub-secret",
            DnsConfig::addr(&address),
            Timeouts::default(),
        );
        let online = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match client.next().await {
                    Some(Event::Online { bound_jid, .. }) => return bound_jid,
                    Some(_) => {}
                    None => panic!("the subscriber's client stopped"),
                }
            }
        });
        let jid = online.await.expect("the subscriber logs in");
        Subscriber {
            client,
            jid,
            address,
        }
    }

    /// Sends an IQ to the PubSub service and returns the result's payload; `None` when no
    /// answer came within `wait`.
    async fn try_iq(&mut self, request: IqRequest, wait: Duration) -> Option<Option<Element>> {
        let token = self
            .client
            .send_iq(Some(Jid::new(SERVICE).unwrap()), request)
            .await;
        let answer = tokio::time::timeout(wait, async {
            tokio::pin!(token);
            loop {
                tokio::select! {
                    answer = &mut token => return answer,
                    _ = self.client.next() => {}
                }
            }
        });
        match answer.await.ok()?.unwrap() {
            IqResponse::Result(payload) => Some(payload),
            IqResponse::Error(e) => panic!("the service refused: {e:?}"),
        }
    }

    /// [`Subscriber::try_iq`] for the request `make` writes for this session's JID, asked
    /// again on a new session while unanswered, for up to a minute. (The client library now
    /// and then leaves an answer unread on a freshly established stream; the bridge itself
    /// opens a new session after unanswered requests the same way.)
    async fn iq(&mut self, make: impl Fn(&Jid) -> IqRequest) -> Option<Element> {
        let end = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let request = make(&self.jid);
            if let Some(answer) = self.try_iq(request, Duration::from_secs(5)).await {
                return answer;
            }
            assert!(
                tokio::time::Instant::now() < end,
                "the PubSub service does not answer {:?}",
                make(&self.jid)
            );
            *self = Subscriber::connect_to(self.address.clone()).await;
        }
    }

    /// Subscribes this session (its full JID) to the node, then collects the items pushed to
    /// it, in the order they arrive.
    async fn subscribe(mut self) -> Arc<Mutex<Vec<(u64, u64)>>> {
        self.iq(|jid| {
            let request = format!(
                "<pubsub xmlns='{NS_PUBSUB}'><subscribe node='{NODE}' jid='{jid}'/></pubsub>"
            );
            IqRequest::Set(request.parse().unwrap())
        })
        .await;
        let items = Arc::new(Mutex::new(Vec::new()));
        let collected = items.clone();
        tokio::spawn(async move {
            while let Some(event) = self.client.next().await {
                let Event::Stanza(Stanza::Message(message)) = event else {
                    continue;
                };
                for payload in message.payloads.iter().filter(|p| p.is("event", NS_EVENT)) {
                    for items in payload.children().filter(|c| c.is("items", NS_EVENT)) {
                        for item in items.children().filter(|c| c.is("item", NS_EVENT)) {
                            collected.lock().unwrap().push(range_of(item));
                        }
                    }
                }
            }
        });
        items
    }

    /// Every item the node keeps, by seq range.
    async fn items(&mut self) -> Vec<(u64, u64)> {
        let payload = self
            .iq(|_| {
                let request =
                    format!("<pubsub xmlns='{NS_PUBSUB}'><items node='{NODE}'/></pubsub>");
                IqRequest::Get(request.parse().unwrap())
            })
            .await
            .expect("items");
        let items = payload.get_child("items", NS_PUBSUB).expect("<items>");
        let mut ranges: Vec<(u64, u64)> = items
            .children()
            .filter(|c| c.is("item", NS_PUBSUB))
            .map(range_of)
            .collect();
        ranges.sort();
        ranges
    }
}

/// The seq range an item's id names; checks that its payload is the Change List of exactly
/// that range.
fn range_of(item: &Element) -> (u64, u64) {
    let id = item.attr("id").expect("item id");
    let range = changehub::xmpp::stanzas::parse_item_id(id)
        .unwrap_or_else(|| panic!("item id {id:?} is not FIRST-LAST"));
    let urlset = item
        .get_child("urlset", SITEMAP)
        .unwrap_or_else(|| panic!("item {id} carries no Change List"));
    let urls = urlset.children().filter(|c| c.is("url", SITEMAP)).count();
    assert_eq!(urls as u64, range.1 - range.0 + 1, "item {id}");
    range
}

/// Asserts that `ranges` follow each other without gap or overlap, from `first` to `last`.
fn assert_gapless(ranges: &[(u64, u64)], first: u64, last: u64) {
    let mut next = first;
    for &(f, l) in ranges {
        assert_eq!(f, next, "items {ranges:?} should be gapless from {first}");
        assert!(l >= f);
        next = l + 1;
    }
    assert_eq!(next, last + 1, "items {ranges:?} should reach {last}");
}

/// The items as first heard: an item the bridge published again (after a restart, before its
/// cursor was recorded) replaces the same item on the node, so a subscriber may hear it
/// twice; it must be the very same range.
fn first_hearings(heard: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut first: Vec<(u64, u64)> = Vec::new();
    for &r in heard {
        match first.last() {
            Some(&(_, last)) if r.0 <= last => {
                assert!(
                    first.contains(&r),
                    "{r:?} overlaps what came before: {heard:?}"
                )
            }
            _ => first.push(r),
        }
    }
    first
}

async fn xmpp_status(hub: &TestHub) -> serde_json::Value {
    let channels = admin_json(&hub.url, "/api/channels").await;
    channels
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == CHANNEL)
        .expect("the channel")["xmpp"]
        .clone()
}

async fn wait_bridged(hub: &TestHub, seq: u64) {
    wait_until(
        &format!("the bridge has put everything up to {seq} on the node"),
        Duration::from_secs(30),
        || async { xmpp_status(hub).await["bridged"].as_u64() >= Some(seq) },
    )
    .await;
}

/// Waits until the last item the subscriber heard ends at `last`.
async fn wait_heard(heard: &Arc<Mutex<Vec<(u64, u64)>>>, last: u64) {
    wait_until(
        &format!("the subscriber hears the item that ends at {last}"),
        Duration::from_secs(30),
        || {
            let heard = heard.clone();
            async move { heard.lock().unwrap().last().map(|r| r.1) == Some(last) }
        },
    )
    .await;
}

async fn start_hub(data_dir: &Path, prosody: &Prosody) -> TestHub {
    let bridge = prosody.bridge();
    TestHub::start_in(data_dir.to_path_buf(), move |c| {
        c.xmpp = Some(bridge);
        c.delivery_timeout = Duration::from_secs(3);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_notification_reaches_the_xmpp_node_in_order_across_restarts() {
    let mut prosody = Prosody::start().await;
    let data = tempfile::tempdir().unwrap();
    let mut hub = start_hub(data.path(), &prosody).await;

    // Discovery: the Capability List and the topic's Link header name the node.
    let uri = "xmpp:pubsub.localhost?pubsub;action=subscribe;node=changehub%2Fnews";
    let caps = hub
        .text(&format!("/channels/{CHANNEL}/capabilitylist.xml"))
        .await;
    assert!(
        caps.contains(&format!(r#"<rs:ln rel="notification" href="{uri}"/>"#)),
        "{caps}"
    );
    let topic = hub.client.get(hub.topic()).send().await.unwrap();
    let link = topic.headers()["link"].to_str().unwrap().to_string();
    assert!(
        link.contains(&format!(r#"<{uri}>; rel="notification""#)),
        "{link}"
    );

    // The node is created with the first notification; a subscriber then gets every later
    // one, in order.
    hub.push("a", 2).await;
    wait_bridged(&hub, 2).await;
    let live = Subscriber::connect(&prosody).await.subscribe().await;
    let mut last = 2;
    for i in 0..10 {
        last = hub.push(&format!("b{i}"), 3).await.1;
    }
    wait_heard(&live, last).await;
    assert_gapless(&live.lock().unwrap(), 3, last);
    assert_eq!(xmpp_status(&hub).await["lag"], 0);

    // A restart of the hub right after a push loses nothing.
    hub.push("c", 4).await;
    hub.stop().await;
    let mut hub = start_hub(data.path(), &prosody).await;
    let (_, pushed) = hub.push("d", 2).await;
    wait_bridged(&hub, pushed).await;
    wait_heard(&live, pushed).await;
    assert_gapless(&first_hearings(&live.lock().unwrap()), 3, pushed);

    // The XMPP server killed mid-stream: ingest goes on, the bridge lags and says so.
    prosody.kill().await;
    let mut last = pushed;
    for i in 0..5 {
        last = hub.push(&format!("e{i}"), 2).await.1;
    }
    hub.wait_published(last).await;
    wait_until(
        "the admin API shows the bridge behind",
        Duration::from_secs(30),
        || async {
            let status = xmpp_status(&hub).await;
            status["lag"].as_u64() > Some(0) && status["last_error"].is_string()
        },
    )
    .await;
    let metrics = hub.text("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("changehub_xmpp_lag{channel=\"news\"}") && !l.ends_with(" 0")),
        "{metrics}"
    );

    // Back: the bridge catches up, and a client that joins late retrieves every item, the
    // ids gapless from the channel's first seq.
    prosody.run().await;
    for i in 0..3 {
        last = hub.push(&format!("f{i}"), 1).await.1;
    }
    wait_bridged(&hub, last).await;
    let mut late = Subscriber::connect(&prosody).await;
    let items = late.items().await;
    assert_gapless(&items, 1, last);
    hub.stop().await;
    prosody.kill().await;
}
