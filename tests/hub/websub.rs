//! The WebSub behaviours of the hub, one test each.

use crate::common::*;
use changehub::model::signature as signing;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_carries_the_parameters_and_keeps_the_query_string() {
    let hub = TestHub::start(|_| {}).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    let callback = format!("{}?user=42&hub.mode=mine", receiver.url);
    hub.subscribe(
        &callback,
        &[
            ("hub.lease_seconds", "3600"),
            ("foo", "bar"),
            ("hub.foo", "hub.bar"),
        ],
    )
    .await;
    receiver.wait_verified(1).await;
    let v = &receiver.verifications()[0];
    assert_eq!(v["user"], "42", "callback query kept");
    assert_eq!(v["hub.topic"], hub.topic());
    assert_eq!(v["hub.lease_seconds"], "3600");
    assert!(v["hub.challenge"].len() >= 16);
    hub.wait_subscribed(&callback).await;
    // The subscriber's own hub.mode=mine came first and was not overwritten: the query parser
    // of the receiver keeps the last value, so check the raw order through the admin view.
    let subs = hub.subscriptions().await;
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0]["lease_seconds"], 3600);
    assert!(subs[0].get("secret").is_none(), "secrets are never shown");

    // Deliveries go to the callback with its query string.
    hub.push("a", 1).await;
    receiver.wait_seq(1, WAIT).await;

    // Challenges are single-use: a second subscription gets a different one.
    hub.subscribe(&callback, &[]).await;
    receiver.wait_verified(2).await;
    let vs = receiver.verifications();
    assert_ne!(vs[0]["hub.challenge"], vs[1]["hub.challenge"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_verification_subscribes_nothing() {
    let hub = TestHub::start(|_| {}).await;
    let wrong_body = Receiver::start(Behaviour {
        challenge_answer: Some("not-the-challenge".into()),
        ..Behaviour::default()
    })
    .await;
    let refuses = Receiver::start(Behaviour {
        verify_status: reqwest::StatusCode::NOT_FOUND,
        ..Behaviour::default()
    })
    .await;
    let control = Receiver::start(Behaviour::default()).await;
    hub.subscribe(&wrong_body.url, &[]).await;
    hub.subscribe(&refuses.url, &[]).await;
    wrong_body.wait_verified(1).await;
    refuses.wait_verified(1).await;
    hub.subscribe(&control.url, &[]).await;
    hub.wait_subscribed(&control.url).await;

    hub.push("a", 3).await;
    control.wait_seq(3, WAIT).await;
    let subs = hub.subscriptions().await;
    assert_eq!(subs.len(), 1, "{subs:?}");
    assert!(wrong_body.posts().is_empty());
    assert!(refuses.posts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topic_is_denied() {
    let hub = TestHub::start(|_| {}).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    let topic = format!("{}/channels/nope/changelist.xml", hub.url);
    let (status, _) = hub
        .hub_request(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", &topic),
            ("hub.callback", &receiver.url),
        ])
        .await;
    assert_eq!(status, 202, "the answer does not depend on validation");
    receiver.wait_verified(1).await;
    let v = &receiver.verifications()[0];
    assert_eq!(v["hub.mode"], "denied");
    assert_eq!(v["hub.topic"], topic);
    assert!(v.contains_key("hub.reason"));
    assert!(hub.subscriptions().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_stops_deliveries() {
    let hub = TestHub::start(|c| c.lease_min = Duration::from_secs(1)).await;
    let short = Receiver::start(Behaviour::default()).await;
    let control = Receiver::start(Behaviour::default()).await;
    hub.subscribe(&short.url, &[("hub.lease_seconds", "3")])
        .await;
    hub.subscribe(&control.url, &[]).await;
    short.wait_verified(1).await;
    assert_eq!(short.verifications()[0]["hub.lease_seconds"], "3");
    // Active first (the verification GET comes before activation) ...
    hub.wait_subscribed(&short.url).await;
    hub.wait_subscribed(&control.url).await;
    // ... then the expired subscription is removed by the hub itself.
    wait_until("lease expired", WAIT, || async {
        hub.subscriptions()
            .await
            .iter()
            .all(|s| s["callback"] != short.url.as_str())
    })
    .await;
    hub.push("a", 2).await;
    control.wait_seq(2, WAIT).await;
    assert!(short.posts().is_empty(), "nothing delivered after expiry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_clamped_and_reported() {
    let hub = TestHub::start(|c| {
        c.lease_min = Duration::from_secs(60);
        c.lease_max = Duration::from_secs(3600);
    })
    .await;
    let receiver = Receiver::start(Behaviour::default()).await;
    hub.subscribe(&receiver.url, &[("hub.lease_seconds", "999999")])
        .await;
    receiver.wait_verified(1).await;
    assert_eq!(receiver.verifications()[0]["hub.lease_seconds"], "3600");
    hub.subscribe(&receiver.url, &[("hub.lease_seconds", "5")])
        .await;
    receiver.wait_verified(2).await;
    assert_eq!(receiver.verifications()[1]["hub.lease_seconds"], "60");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_ends_the_subscription() {
    let hub = TestHub::start(|_| {}).await;
    let gone = Receiver::start(Behaviour {
        post_status: reqwest::StatusCode::GONE,
        ..Behaviour::default()
    })
    .await;
    let control = Receiver::start(Behaviour::default()).await;
    hub.subscribe(&gone.url, &[]).await;
    hub.subscribe(&control.url, &[]).await;
    hub.wait_subscribed(&gone.url).await;
    hub.wait_subscribed(&control.url).await;
    hub.push("a", 1).await;
    gone.wait_for("a delivery", WAIT, |r| !r.posts().is_empty())
        .await;
    wait_until("subscription removed", WAIT, || async {
        hub.subscriptions()
            .await
            .iter()
            .all(|s| s["callback"] != gone.url.as_str())
    })
    .await;
    hub.push("b", 1).await;
    control.wait_seq(2, WAIT).await;
    assert_eq!(gone.posts().len(), 1, "no delivery after 410");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signatures_only_with_a_secret_in_each_algorithm() {
    let hub = TestHub::start(|_| {}).await;
    let plain = Receiver::start(Behaviour::default()).await;
    hub.subscribe(&plain.url, &[]).await;
    let mut signed = Vec::new();
    for alg in ["sha1", "sha256", "sha384", "sha512"] {
        let r = Receiver::start(Behaviour::default()).await;
        let secret = format!("secret-for-{alg}");
        hub.subscribe(
            &r.url,
            &[("hub.secret", &secret), ("hub.signature_algorithm", alg)],
        )
        .await;
        signed.push((alg, secret, r));
    }
    hub.wait_subscribed(&plain.url).await;
    for (_, _, r) in &signed {
        hub.wait_subscribed(&r.url).await;
    }
    hub.push("a", 3).await;
    plain.wait_seq(3, WAIT).await;
    assert!(plain.posts()[0].header("x-hub-signature").is_none());
    for (alg, secret, r) in &signed {
        r.wait_seq(3, WAIT).await;
        let p = &r.posts()[0];
        let sig = p.header("x-hub-signature").unwrap();
        assert!(sig.starts_with(&format!("{alg}=")), "{sig}");
        let hex = sig.split_once('=').unwrap().1;
        assert!(
            hex.chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
            "lowercase hex"
        );
        assert!(signing::verify(sig, secret.as_bytes(), &p.body));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resubscribe_replaces_secret_only_once_verified() {
    let hub = TestHub::start(|_| {}).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    hub.subscribe(&receiver.url, &[("hub.secret", "first-secret")])
        .await;
    hub.wait_subscribed(&receiver.url).await;
    hub.push("a", 1).await;
    receiver.wait_seq(1, WAIT).await;
    let sig = |n: usize| {
        receiver.delivered()[n]
            .header("x-hub-signature")
            .unwrap()
            .to_string()
    };
    assert!(signing::verify(
        &sig(0),
        b"first-secret",
        &receiver.delivered()[0].body
    ));

    // A re-subscription whose verification fails changes nothing.
    receiver.set_behaviour(|b| b.challenge_answer = Some("nope".into()));
    hub.subscribe(&receiver.url, &[("hub.secret", "second-secret")])
        .await;
    receiver.wait_verified(2).await;
    receiver.set_behaviour(|b| b.challenge_answer = None);
    hub.push("b", 1).await;
    receiver.wait_seq(2, WAIT).await;
    assert!(signing::verify(
        &sig(1),
        b"first-secret",
        &receiver.delivered()[1].body
    ));

    // A verified one replaces the secret; still exactly one subscription.
    hub.subscribe(&receiver.url, &[("hub.secret", "second-secret")])
        .await;
    receiver.wait_verified(3).await;
    wait_until("new secret in use", WAIT, || async {
        hub.subscriptions().await[0]["has_secret"] == true && {
            // Push until a delivery is signed with the new secret.
            let (_, last) = hub.push("c", 1).await;
            receiver.wait_seq(last, WAIT).await;
            let d = receiver.delivered();
            let p = d.last().unwrap();
            signing::verify(
                p.header("x-hub-signature").unwrap(),
                b"second-secret",
                &p.body,
            )
        }
    })
    .await;
    assert_eq!(hub.subscriptions().await.len(), 1);

    // Re-subscribing without a secret removes signing.
    hub.subscribe(&receiver.url, &[]).await;
    receiver.wait_verified(4).await;
    wait_until("secret dropped", WAIT, || async {
        hub.subscriptions().await[0]["has_secret"] == false
    })
    .await;
    let (_, last) = hub.push("d", 1).await;
    receiver.wait_seq(last, WAIT).await;
    assert!(receiver
        .delivered()
        .last()
        .unwrap()
        .header("x-hub-signature")
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsubscribe_is_verified_then_stops_deliveries() {
    let hub = TestHub::start(|_| {}).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    let control = Receiver::start(Behaviour::default()).await;
    hub.subscribe(&receiver.url, &[]).await;
    hub.subscribe(&control.url, &[]).await;
    hub.wait_subscribed(&receiver.url).await;
    hub.wait_subscribed(&control.url).await;
    let topic = hub.topic();
    let (status, _) = hub
        .hub_request(&[
            ("hub.mode", "unsubscribe"),
            ("hub.topic", &topic),
            ("hub.callback", &receiver.url),
        ])
        .await;
    assert_eq!(status, 202);
    receiver.wait_verified(2).await;
    assert_eq!(receiver.verifications()[1]["hub.mode"], "unsubscribe");
    wait_until("unsubscribed", WAIT, || async {
        hub.subscriptions().await.len() == 1
    })
    .await;
    hub.push("a", 1).await;
    control.wait_seq(1, WAIT).await;
    assert!(receiver.posts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_failures_and_are_retried() {
    let hub = TestHub::start(|_| {}).await;
    let receiver = Receiver::start(Behaviour {
        fail_first: 2,
        fail_status: reqwest::StatusCode::TEMPORARY_REDIRECT,
        ..Behaviour::default()
    })
    .await;
    hub.subscribe(&receiver.url, &[]).await;
    hub.wait_subscribed(&receiver.url).await;
    hub.push("a", 1).await;
    receiver.wait_seq(1, WAIT).await;
    let posts = receiver.posts();
    assert_eq!(
        posts.len(),
        3,
        "two redirects answered, retried, then delivered"
    );
    let ids: Vec<_> = posts
        .iter()
        .map(|p| p.header("x-changehub-delivery").unwrap().to_string())
        .collect();
    assert!(
        ids.iter().all(|id| id == &ids[0]),
        "same delivery id across retries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_up_notification_leaves_the_subscription() {
    let hub = TestHub::start(|c| c.retry_for = Duration::from_millis(300)).await;
    let receiver = Receiver::start(Behaviour {
        fail_first: usize::MAX,
        ..Behaviour::default()
    })
    .await;
    hub.subscribe(&receiver.url, &[]).await;
    hub.wait_subscribed(&receiver.url).await;
    hub.push("a", 1).await;
    wait_until("notification given up", WAIT, || async {
        let subs = hub.subscriptions().await;
        subs[0]["cursor"] == 1
            && subs[0]["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("gave up"))
    })
    .await;
    // The subscriber is back: the next notification is delivered; the missed one is in the log.
    receiver.set_behaviour(|b| b.fail_first = 0);
    hub.push("b", 1).await;
    receiver.wait_seq(2, WAIT).await;
    assert_eq!(hub.subscriptions().await.len(), 1);
}

/// Subscriptions are capped per topic and per callback host: one past a cap is denied (and
/// nothing is stored); renewing an existing subscription is never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_capped_per_topic_and_per_callback_host() {
    let hub = TestHub::start(|c| {
        c.max_subscriptions_per_topic = 2;
        c.max_subscriptions_per_host = 3;
        *c = c.clone().with_channel("other", "other-token");
    })
    .await;
    let receiver = Receiver::start(Behaviour::default()).await;
    let callback = |n: u32| format!("{}?n={n}", receiver.url);
    let modes = |receiver: &Receiver| -> Vec<String> {
        receiver
            .verifications()
            .iter()
            .map(|v| v["hub.mode"].clone())
            .collect()
    };
    subscribe_at(&hub.url, CHANNEL, &callback(1)).await;
    subscribe_at(&hub.url, CHANNEL, &callback(2)).await;
    receiver.wait_verified(2).await;
    wait_subscriptions(&hub.url, 2).await;
    // A third on the same topic: denied.
    subscribe_at(&hub.url, CHANNEL, &callback(3)).await;
    receiver.wait_verified(3).await;
    assert_eq!(modes(&receiver)[2], "denied");
    // Renewing the first: fine.
    subscribe_at(&hub.url, CHANNEL, &callback(1)).await;
    receiver.wait_verified(4).await;
    assert_eq!(modes(&receiver)[3], "subscribe");
    // Another topic, same host: the third subscription of the host is fine, the fourth not.
    subscribe_at(&hub.url, "other", &callback(4)).await;
    receiver.wait_verified(5).await;
    wait_subscriptions(&hub.url, 3).await;
    subscribe_at(&hub.url, "other", &callback(5)).await;
    receiver.wait_verified(6).await;
    assert_eq!(modes(&receiver)[5], "denied");
    let reason = &receiver.verifications()[5]["hub.reason"];
    assert!(reason.contains("127.0.0.1"), "{reason}");
    assert_eq!(
        admin_json(&hub.url, "/api/subscriptions")
            .await
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

/// Requests that arrive together cannot pass a cap between them (the hub counts what it let
/// through before the store has it), and a removal makes room again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_subscriptions_cannot_pass_a_cap() {
    let hub = TestHub::start(|c| c.max_subscriptions_per_topic = 5).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    let callback = |n: u32| format!("{}?n={n}", receiver.url);
    let burst: Vec<_> = (0..12)
        .map(|n| {
            let (url, cb) = (hub.url.clone(), callback(n));
            tokio::spawn(async move { subscribe_at(&url, CHANNEL, &cb).await })
        })
        .collect();
    for request in burst {
        request.await.unwrap();
    }
    receiver.wait_verified(12).await;
    let modes: Vec<String> = receiver
        .verifications()
        .iter()
        .map(|v| v["hub.mode"].clone())
        .collect();
    assert_eq!(
        modes.iter().filter(|m| *m == "subscribe").count(),
        5,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|m| *m == "denied").count(),
        7,
        "{modes:?}"
    );
    wait_subscriptions(&hub.url, 5).await;

    // One leaves: another may come in.
    let gone = admin_json(&hub.url, "/api/subscriptions").await[0]["callback"]
        .as_str()
        .unwrap()
        .to_string();
    let topic = hub.topic();
    let params = [
        ("hub.mode", "unsubscribe"),
        ("hub.topic", topic.as_str()),
        ("hub.callback", gone.as_str()),
    ];
    let (status, text) = hub.hub_request(&params).await;
    assert_eq!(status, 202, "{text}");
    wait_subscriptions(&hub.url, 4).await;
    subscribe_at(&hub.url, CHANNEL, &callback(99)).await;
    receiver.wait_verified(14).await;
    assert_eq!(receiver.verifications()[13]["hub.mode"], "subscribe");
    wait_subscriptions(&hub.url, 5).await;
}
