//! The websub.rocks hub tests 100–106, played against the real hub with external topics the
//! way the public suite does it (a topic server, a callback server and this driver, all on
//! loopback), with the suite's pass/fail rules — plus the checks the suite forgets.
//!
//! The suite's rules for a notification (aaronpk/websub.rocks, app/Hub.php): a non-empty body
//! equal (after trimming) to the topic's content, a `Content-Type` string-equal to the topic's,
//! a `Link` with `rel=hub` equal to the hub URL and one with `rel=self`, no `X-Hub-Signature`
//! at all without a secret and a valid lowercase-hex HMAC with one.

use crate::common::*;
use crate::redis_server::RedisServer;
use crate::topics::{Doc, TopicServer};
use changehub::config::StoreConfig;
use changehub::model::signature as signing;
use changehub::net::parse_links;
use reqwest::StatusCode;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(15);

struct Rocks {
    topics: TopicServer,
    hub: TestHub,
    /// The hub's Redis, when it runs on the Redis store.
    _redis: Option<RedisServer>,
}

/// A topic server and a hub that serves its topics as external topics.
async fn rocks(tweak: impl FnOnce(&mut changehub::config::Config)) -> Rocks {
    rocks_on(false, tweak).await
}

/// The same, on the Redis store (a private redis-server) when `redis` is true.
async fn rocks_on(redis: bool, tweak: impl FnOnce(&mut changehub::config::Config)) -> Rocks {
    let topics = TopicServer::start().await;
    let prefix = topics.prefix();
    let server = redis.then(|| RedisServer::start(false));
    let store = server.as_ref().map(|s| StoreConfig::Redis { url: s.url() });
    let hub = TestHub::start(move |c| {
        c.allow_external_topics = vec![prefix];
        if let Some(store) = store {
            c.store = store;
        }
        tweak(c);
    })
    .await;
    Rocks {
        topics,
        hub,
        _redis: server,
    }
}

/// The websub.rocks hub tests, each run on both stores.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::rocks_on(false, |_| {}).await).await
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::rocks_on(true, |_| {}).await).await
                }
            )*
        }
    };
}

on_both_stores!(
    hub_100_typical_subscription,
    hub_101_secret_in_each_algorithm,
    hub_102_additional_parameters_are_ignored,
    hub_103_resubscribe_gives_one_notification_per_publish,
    hub_104_unsubscribe_is_verified_then_nothing_arrives,
    hub_105_text_plain_topic,
    hub_106_json_topic,
);

impl Rocks {
    /// Subscribes; the answer must be exactly 202.
    async fn subscribe(&self, topic: &str, callback: &str, extra: &[(&str, &str)]) {
        let mut params = vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", callback),
        ];
        params.extend_from_slice(extra);
        let (status, text) = self.hub.hub_request(&params).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    }

    /// websub.rocks publishes with `hub.mode=publish&hub.topic=…`.
    async fn publish(&self, topic: &str) {
        let (status, text) = self
            .hub
            .hub_request(&[("hub.mode", "publish"), ("hub.topic", topic)])
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    }

    async fn channel(&self, topic: &str) -> serde_json::Value {
        let channels: Vec<serde_json::Value> = self
            .hub
            .client
            .get(format!("{}/api/channels", self.hub.url))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        channels
            .into_iter()
            .find(|c| c["topic"] == topic)
            .unwrap_or(serde_json::Value::Null)
    }
}

/// websub.rocks' verdict on one notification.
fn check_notification(n: &Received, doc: &Doc, hub_url: &str, topic: &str, secret: Option<&str>) {
    assert!(!n.body.is_empty(), "empty notification body");
    assert_eq!(
        String::from_utf8_lossy(&n.body).trim(),
        String::from_utf8_lossy(&doc.body).trim(),
        "body differs from the topic's content"
    );
    assert_eq!(
        n.header("content-type"),
        doc.content_type.as_deref(),
        "Content-Type differs from the topic's"
    );
    let links: Vec<_> = n
        .headers
        .get_all("link")
        .iter()
        .flat_map(|v| parse_links(v.to_str().unwrap()))
        .collect();
    let hub_links: Vec<_> = links.iter().filter(|l| l.has_rel("hub")).collect();
    assert_eq!(hub_links.len(), 1, "one rel=hub: {links:?}");
    assert_eq!(hub_links[0].target, hub_url);
    let self_links: Vec<_> = links.iter().filter(|l| l.has_rel("self")).collect();
    assert_eq!(self_links.len(), 1, "one rel=self: {links:?}");
    assert_eq!(self_links[0].target, topic, "rel=self is the topic URL");
    match secret {
        None => assert!(
            n.header("x-hub-signature").is_none(),
            "a signature without a secret"
        ),
        Some(secret) => {
            let sig = n
                .header("x-hub-signature")
                .expect("signature with a secret");
            let (alg, hex) = sig.split_once('=').unwrap();
            assert!(
                ["sha1", "sha256", "sha384", "sha512"].contains(&alg),
                "{sig}"
            );
            assert!(
                hex.chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
                "lowercase hex: {sig}"
            );
            assert!(signing::verify(sig, secret.as_bytes(), &n.body), "{sig}");
        }
    }
}

fn html(post: &str) -> Doc {
    Doc::new(
        format!("<!doctype html>\n<html><body><article class=\"h-entry\"><p class=\"e-content\">{post}</p></article></body></html>\n"),
        "text/html; charset=utf-8",
    )
}

/// Subscribe (verification carries mode, topic, challenge, lease), publish, check the one
/// notification. Returns the receiver.
async fn typical(r: &Rocks, path: &str, doc: Doc, extra: &[(&str, &str)]) -> Receiver {
    let topic = r.topics.url(path);
    let receiver = Receiver::start(Behaviour::default()).await;
    r.subscribe(&topic, &receiver.url, extra).await;
    receiver.wait_verified(1).await;
    let v = &receiver.verifications()[0];
    assert_eq!(v["hub.mode"], "subscribe");
    assert_eq!(v["hub.topic"], topic);
    assert!(!v["hub.challenge"].is_empty());
    assert!(v["hub.lease_seconds"].parse::<u64>().unwrap() > 0);
    r.hub.wait_subscribed(&receiver.url).await;
    r.topics.put(path, doc.clone());
    r.publish(&topic).await;
    receiver
        .wait_for("the notification", WAIT, |x| !x.posts().is_empty())
        .await;
    check_notification(
        &receiver.posts()[0],
        &doc,
        &format!("{}/hub", r.hub.url),
        &topic,
        None,
    );
    receiver
}

async fn hub_100_typical_subscription(rocks: Rocks) {
    let r = &rocks;
    typical(r, "/100/topic", html("hello from test 100"), &[]).await;
}

async fn hub_101_secret_in_each_algorithm(rocks: Rocks) {
    let r = &rocks;
    let topic = r.topics.url("/101/topic");
    // The suite's 20-character secret, over plain http, with the hub's default algorithm.
    let secret = "abcdefghij0123456789";
    let mut receivers = vec![(
        secret.to_string(),
        None,
        Receiver::start(Behaviour::default()).await,
    )];
    for alg in ["sha1", "sha256", "sha384", "sha512"] {
        receivers.push((
            format!("{alg}-secret-0123456"),
            Some(alg),
            Receiver::start(Behaviour::default()).await,
        ));
    }
    for (secret, alg, receiver) in &receivers {
        let mut extra = vec![("hub.secret", secret.as_str())];
        if let Some(alg) = alg {
            extra.push(("hub.signature_algorithm", alg));
        }
        r.subscribe(&topic, &receiver.url, &extra).await;
    }
    for (_, _, receiver) in &receivers {
        r.hub.wait_subscribed(&receiver.url).await;
    }
    let doc = html("signed post");
    r.topics.put("/101/topic", doc.clone());
    r.publish(&topic).await;
    for (secret, alg, receiver) in &receivers {
        receiver
            .wait_for("the notification", WAIT, |x| !x.posts().is_empty())
            .await;
        let n = &receiver.posts()[0];
        check_notification(n, &doc, &format!("{}/hub", r.hub.url), &topic, Some(secret));
        if let Some(alg) = alg {
            assert!(
                n.header("x-hub-signature")
                    .unwrap()
                    .starts_with(&format!("{alg}=")),
                "{alg}"
            );
        }
    }
}

async fn hub_102_additional_parameters_are_ignored(rocks: Rocks) {
    let r = &rocks;
    typical(
        r,
        "/102/topic",
        html("extra parameters"),
        &[("foo", "bar"), ("hub.foo", "hub.bar")],
    )
    .await;
}

async fn hub_103_resubscribe_gives_one_notification_per_publish(rocks: Rocks) {
    let r = &rocks;
    let topic = r.topics.url("/103/topic");
    let receiver = Receiver::start(Behaviour::default()).await;
    r.subscribe(&topic, &receiver.url, &[]).await;
    receiver.wait_verified(1).await;
    r.hub.wait_subscribed(&receiver.url).await;
    // Re-subscribe before the lease ends.
    r.subscribe(&topic, &receiver.url, &[]).await;
    receiver.wait_verified(2).await;
    wait_until("re-subscription applied", WAIT, || async {
        r.hub.subscriptions().await.len() == 1
    })
    .await;
    for (i, post) in ["first", "second"].iter().enumerate() {
        let doc = html(post);
        r.topics.put("/103/topic", doc.clone());
        r.publish(&topic).await;
        receiver
            .wait_for("the notification", WAIT, |x| x.posts().len() > i)
            .await;
        check_notification(
            &receiver.posts()[i],
            &doc,
            &format!("{}/hub", r.hub.url),
            &topic,
            None,
        );
    }
    // Exactly one notification per publish: the second arrived and nothing else did.
    assert_eq!(receiver.posts().len(), 2);
    assert_eq!(r.hub.subscriptions().await.len(), 1);
}

async fn hub_104_unsubscribe_is_verified_then_nothing_arrives(rocks: Rocks) {
    let r = &rocks;
    let topic = r.topics.url("/104/topic");
    let receiver = Receiver::start(Behaviour::default()).await;
    let control = Receiver::start(Behaviour::default()).await;
    r.subscribe(&topic, &receiver.url, &[]).await;
    r.subscribe(&topic, &control.url, &[]).await;
    r.hub.wait_subscribed(&receiver.url).await;
    r.hub.wait_subscribed(&control.url).await;
    let (status, _) = r
        .hub
        .hub_request(&[
            ("hub.mode", "unsubscribe"),
            ("hub.topic", &topic),
            ("hub.callback", &receiver.url),
        ])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    receiver.wait_verified(2).await;
    let v = &receiver.verifications()[1];
    assert_eq!(v["hub.mode"], "unsubscribe");
    assert_eq!(v["hub.topic"], topic);
    wait_until("unsubscribed", WAIT, || async {
        r.hub.subscriptions().await.len() == 1
    })
    .await;
    r.topics.put("/104/topic", html("after unsubscribe"));
    r.publish(&topic).await;
    // The content published after the unsubscription reaches the control subscriber only.
    // (Content the hub fetched while both were subscribed may reach both.)
    let after = |posts: Vec<Received>| {
        posts
            .iter()
            .any(|p| String::from_utf8_lossy(&p.body).contains("after unsubscribe"))
    };
    control
        .wait_for("control notification", WAIT, |x| after(x.posts()))
        .await;
    assert!(!after(receiver.posts()), "nothing after unsubscribe");
}

async fn hub_105_text_plain_topic(rocks: Rocks) {
    let r = &rocks;
    typical(
        r,
        "/105/topic.txt",
        Doc::new("Plain text post 105\n", "text/plain"),
        &[],
    )
    .await;
}

async fn hub_106_json_topic(rocks: Rocks) {
    let r = &rocks;
    typical(
        r,
        "/106/topic.json",
        Doc::new(
            r#"{"type":"entry","content":"JSON post 106","published":"2024-05-01T10:00:00Z"}"#,
            "application/json",
        ),
        &[],
    )
    .await;
}

/// Publishers that send `hub.url` (most of them); the topic's own links are passed on, its
/// rel=hub / rel=self are the hub's; the callback's query string is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_url_publishers_and_the_topics_links() {
    let r = rocks(|_| {}).await;
    let topic = r.topics.url("/feed.atom");
    let receiver = Receiver::start(Behaviour::default()).await;
    let callback = format!("{}?user=7", receiver.url);
    r.subscribe(&topic, &callback, &[("hub.lease_seconds", "999999999")])
        .await;
    receiver.wait_verified(1).await;
    assert_eq!(receiver.verifications()[0]["user"], "7");
    // The lease is clamped to --lease-max (30 days) and reported.
    assert_eq!(receiver.verifications()[0]["hub.lease_seconds"], "2592000");
    r.hub.wait_subscribed(&callback).await;
    let mut doc = Doc::new(
        "<?xml version=\"1.0\"?><feed xmlns=\"http://www.w3.org/2005/Atom\"><title>t</title></feed>",
        "application/atom+xml",
    );
    doc.links = vec![
        "<http://elsewhere.example/hub>; rel=\"hub\"".into(),
        format!("<{topic}>; rel=\"self\""),
        "<http://example.org/about>; rel=\"alternate\"; type=\"text/html\"".into(),
    ];
    r.topics.put("/feed.atom", doc.clone());
    let (status, text) = r
        .hub
        .hub_request(&[("hub.mode", "publish"), ("hub.url", &topic)])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    receiver
        .wait_for("the notification", WAIT, |x| !x.posts().is_empty())
        .await;
    let n = &receiver.posts()[0];
    check_notification(n, &doc, &format!("{}/hub", r.hub.url), &topic, None);
    let alternate = n
        .headers
        .get_all("link")
        .iter()
        .flat_map(|v| parse_links(v.to_str().unwrap()))
        .find(|l| l.has_rel("alternate"))
        .expect("the topic's other links are passed on");
    assert_eq!(alternate.target, "http://example.org/about");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_outside_the_allowed_prefixes_are_denied() {
    let r = rocks(|_| {}).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    let outside = "http://127.0.0.1:9/not-allowed.html";
    r.subscribe(outside, &receiver.url, &[]).await;
    receiver.wait_verified(1).await;
    let v = &receiver.verifications()[0];
    assert_eq!(v["hub.mode"], "denied");
    assert_eq!(v["hub.topic"], outside);
    assert!(v["hub.reason"].contains("allowed"), "{v:?}");
    assert!(r.hub.subscriptions().await.is_empty());

    // A ping for it is refused with a reason; one for a hosted channel needs nothing.
    let (status, text) = r
        .hub
        .hub_request(&[("hub.mode", "publish"), ("hub.url", outside)])
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(text.contains("allow-external-topics"), "{text}");
    let hosted = r.hub.topic();
    let (status, _) = r
        .hub
        .hub_request(&[("hub.mode", "publish"), ("hub.url", &hosted)])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _) = r.hub.hub_request(&[("hub.mode", "publish")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Without --allow-external-topics nothing external is served.
    let closed = TestHub::start(|_| {}).await;
    let (status, _) = closed
        .hub_request(&[("hub.mode", "publish"), ("hub.url", &r.topics.url("/x"))])
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_verification_body_subscribes_nothing() {
    let r = rocks(|_| {}).await;
    let topic = r.topics.url("/verify");
    let wrong = Receiver::start(Behaviour {
        challenge_answer: Some("not-the-challenge".into()),
        ..Behaviour::default()
    })
    .await;
    let control = Receiver::start(Behaviour::default()).await;
    r.subscribe(&topic, &wrong.url, &[]).await;
    wrong.wait_verified(1).await;
    r.subscribe(&topic, &control.url, &[]).await;
    r.hub.wait_subscribed(&control.url).await;
    r.topics.put("/verify", html("verify"));
    r.publish(&topic).await;
    control
        .wait_for("control notification", WAIT, |x| !x.posts().is_empty())
        .await;
    assert!(wrong.posts().is_empty());
    assert_eq!(r.hub.subscriptions().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_and_410_end_external_subscriptions() {
    let r = rocks(|c| c.lease_min = Duration::from_secs(1)).await;
    let topic = r.topics.url("/lease");
    let short = Receiver::start(Behaviour::default()).await;
    let gone = Receiver::start(Behaviour {
        post_status: StatusCode::GONE,
        ..Behaviour::default()
    })
    .await;
    let control = Receiver::start(Behaviour::default()).await;
    r.subscribe(&topic, &short.url, &[("hub.lease_seconds", "1")])
        .await;
    r.subscribe(&topic, &gone.url, &[]).await;
    r.subscribe(&topic, &control.url, &[]).await;
    short.wait_verified(1).await;
    assert_eq!(short.verifications()[0]["hub.lease_seconds"], "1");
    r.hub.wait_subscribed(&gone.url).await;
    r.hub.wait_subscribed(&control.url).await;
    wait_until("lease expired", WAIT, || async {
        r.hub
            .subscriptions()
            .await
            .iter()
            .all(|s| s["callback"] != short.url.as_str())
    })
    .await;
    r.topics.put("/lease", html("one"));
    r.publish(&topic).await;
    control
        .wait_for("first notification", WAIT, |x| !x.posts().is_empty())
        .await;
    gone.wait_for("410 answered", WAIT, |x| !x.posts().is_empty())
        .await;
    wait_until("410 removed the subscription", WAIT, || async {
        r.hub.subscriptions().await.len() == 1
    })
    .await;
    r.topics.put("/lease", html("two"));
    r.publish(&topic).await;
    control
        .wait_for("second notification", WAIT, |x| x.posts().len() == 2)
        .await;
    assert!(short.posts().is_empty(), "nothing after expiry");
    assert_eq!(gone.posts().len(), 1, "nothing after 410");
}

/// A failing subscriber is retried; retries carry the latest content; redirects are failures
/// (and the hub follows none, on delivery or on fetch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_carry_the_latest_content_and_redirects_are_not_followed() {
    let r = rocks(|_| {}).await;
    let topic = r.topics.url("/retry");
    let receiver = Receiver::start(Behaviour {
        fail_first: usize::MAX,
        fail_status: StatusCode::TEMPORARY_REDIRECT,
        ..Behaviour::default()
    })
    .await;
    r.subscribe(&topic, &receiver.url, &[("hub.secret", "retry-secret")])
        .await;
    r.hub.wait_subscribed(&receiver.url).await;
    r.topics.put("/retry", html("version one"));
    r.publish(&topic).await;
    receiver
        .wait_for("two failed attempts", WAIT, |x| x.posts().len() >= 2)
        .await;
    wait_until("the retry is shown", WAIT, || async {
        let subs = r.hub.subscriptions().await;
        subs[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("307"))
            && subs[0]["pending_content"]["attempts"].as_u64() >= Some(2)
    })
    .await;
    // New content while the subscriber fails: the next retry carries it.
    let v2 = html("version two");
    r.topics.put("/retry", v2.clone());
    r.publish(&topic).await;
    wait_until("second version fetched", WAIT, || async {
        r.channel(&topic).await["content_version"] == 2
    })
    .await;
    receiver.set_behaviour(|b| b.fail_first = 0);
    receiver
        .wait_for("a delivery", WAIT, |x| !x.delivered().is_empty())
        .await;
    let delivered = receiver.delivered();
    check_notification(
        &delivered[0],
        &v2,
        &format!("{}/hub", r.hub.url),
        &topic,
        Some("retry-secret"),
    );
    assert!(receiver
        .posts()
        .iter()
        .all(|p| p.header("x-changehub-delivery").is_some()));

    // A topic that redirects is not followed: the fetch fails and nothing is delivered.
    let moved = r.topics.url("/moved");
    let watcher = Receiver::start(Behaviour::default()).await;
    r.subscribe(&moved, &watcher.url, &[]).await;
    r.hub.wait_subscribed(&watcher.url).await;
    let mut redirect = html("moved");
    redirect.status = StatusCode::FOUND;
    r.topics.put("/moved", redirect);
    r.topics.put("/elsewhere", html("the target"));
    r.publish(&moved).await;
    wait_until("fetch failed", WAIT, || async {
        r.channel(&moved).await["last_fetch_error"]
            .as_str()
            .is_some_and(|e| e.contains("302"))
    })
    .await;
    assert_eq!(r.topics.gets("/elsewhere"), 0, "redirect not followed");
    assert!(watcher.posts().is_empty());
}

/// Pings never wait for the fetch; pings during a fetch cause at most one more; identical
/// content is not distributed twice; oversized topics are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_are_deduplicated_and_bounded() {
    let r = rocks(|_| {}).await;
    let topic = r.topics.url("/slow");
    let receiver = Receiver::start(Behaviour::default()).await;
    r.subscribe(&topic, &receiver.url, &[]).await;
    r.hub.wait_subscribed(&receiver.url).await;
    let mut slow = Doc::new("slow content", "text/plain");
    slow.delay = Some(Duration::from_secs(2));
    r.topics.put("/slow", slow);
    for _ in 0..5 {
        r.publish(&topic).await;
    }
    assert!(
        receiver.posts().is_empty(),
        "the pings were answered before the topic was"
    );
    receiver
        .wait_for("the notification", WAIT, |x| !x.posts().is_empty())
        .await;
    wait_until("fetches settled", WAIT, || async {
        r.channel(&topic).await["fetches"] == 2
    })
    .await;
    assert_eq!(
        r.topics.gets("/slow"),
        2,
        "one fetch, then one for the pings during it"
    );
    assert_eq!(
        receiver.posts().len(),
        1,
        "unchanged content is not sent again"
    );

    let big = r.topics.url("/big");
    let watcher = Receiver::start(Behaviour::default()).await;
    r.subscribe(&big, &watcher.url, &[]).await;
    r.hub.wait_subscribed(&watcher.url).await;
    r.topics
        .put("/big", Doc::new(vec![b'x'; (8 << 20) + 1], "text/plain"));
    r.publish(&big).await;
    wait_until("oversized fetch refused", WAIT, || async {
        r.channel(&big).await["last_fetch_error"]
            .as_str()
            .is_some_and(|e| e.contains("larger"))
    })
    .await;
    assert!(watcher.posts().is_empty());
}

/// Topic fetches go through the same private-address guard as callbacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_topics_are_refused_without_allow_private_callbacks() {
    let hub = TestHub::start(|c| {
        c.allow_external_topics = vec!["*".into()];
        c.allow_private_callbacks = false;
    })
    .await;
    for topic in [
        "http://127.0.0.1:9/feed",
        "http://[::1]:9/feed",
        "http://10.0.0.1/x",
    ] {
        let (status, text) = hub
            .hub_request(&[("hub.mode", "publish"), ("hub.url", topic)])
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{topic}");
        assert!(text.contains("private"), "{text}");
        let resp = hub
            .client
            .post(format!("{}/publish", hub.url))
            .header("content-type", "application/xml")
            .header("link", format!("<{topic}>;rel=self"))
            .body(crate::topics::change_list(&crate::topics::entries(
                "p", 0, 1,
            )))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{topic}");
    }
    // A public topic nobody subscribes to: accepted, nothing to do.
    let (status, _) = hub
        .hub_request(&[
            ("hub.mode", "publish"),
            ("hub.url", "https://example.org/feed"),
        ])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let resp = hub
        .client
        .post(format!("{}/hub", hub.url))
        .header("content-type", "text/xml")
        .header("link", "<https://example.org/cl.xml>; rel=\"self\"")
        .body(crate::topics::change_list(&crate::topics::entries(
            "p", 0, 2,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let answer: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(answer["received"], 2);
    assert_eq!(answer["new"], 0, "no subscriber: nothing recorded");
}

/// Two hub instances on one Redis: a publish ping reaches the instance that owns the topic
/// (and delivers it), whichever instance the publisher pings. Each ping gives one
/// notification with that publish's content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_at_either_instance_reaches_the_owner() {
    let topics = TopicServer::start().await;
    let redis = RedisServer::start(false);
    let start = || {
        let (prefix, url) = (topics.prefix(), redis.url());
        TestHub::start(move |c| {
            c.allow_external_topics = vec![prefix];
            c.store = StoreConfig::Redis { url };
        })
    };
    let (a, b) = (start().await, start().await);
    let path = "/two-instances/topic";
    let topic = topics.url(path);
    topics.put(path, html("before the subscription"));
    let receiver = Receiver::start(Behaviour::default()).await;
    let (status, text) = a
        .hub_request(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", &topic),
            ("hub.callback", &receiver.url),
        ])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    receiver.wait_verified(1).await;
    a.wait_subscribed(&receiver.url).await;
    // Both instances know the topic, and one of them owns its channel.
    let channel = changehub::external::channel_name(&topic);
    wait_until("the other instance knows the topic", WAIT, || async {
        admin_json(&b.url, "/api/channels")
            .await
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["topic"] == topic))
    })
    .await;
    let client = ::redis::Client::open(redis.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    wait_until("the topic has an owner", WAIT, || {
        let mut conn = conn.clone();
        let key = format!("changehub:{{{channel}}}:owner");
        async move {
            let owner: Option<String> = ::redis::cmd("GET")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            owner.is_some()
        }
    })
    .await;

    let pings = [(&a, "first"), (&b, "second"), (&a, "third"), (&b, "fourth")];
    for (i, (hub, post)) in pings.into_iter().enumerate() {
        let doc = html(post);
        topics.put(path, doc.clone());
        let (status, text) = hub
            .hub_request(&[("hub.mode", "publish"), ("hub.topic", &topic)])
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{text}");
        receiver
            .wait_for(&format!("notification {post}"), WAIT, |x| {
                x.posts().len() > i
            })
            .await;
        let n = &receiver.posts()[i];
        assert_eq!(
            String::from_utf8_lossy(&n.body).trim(),
            String::from_utf8_lossy(&doc.body).trim(),
            "ping {i} gave the content published with it"
        );
    }
    assert_eq!(
        receiver.posts().len(),
        pings.len(),
        "one notification per ping"
    );
}
