//! A source pushes 10,000 changes; two callback subscribers — one checking every signature,
//! one failing its first deliveries with 503 + Retry-After — each end with every change, in
//! seq order, with duplicates only where a delivery was retried.

use crate::common::*;
use changehub::model::signature as signing;
use std::collections::HashMap;
use std::time::Duration;

const TOTAL: u64 = 10_000;
const SECRET: &str = "a-secret-of-twenty-c";

/// Checks the deliveries of one receiver: the successful ones carry 1..=TOTAL exactly once
/// and in order; any seq seen more than once was in a retried delivery.
fn check_deliveries(receiver: &Receiver) {
    let delivered = receiver.delivered_seqs();
    assert_eq!(
        delivered,
        (1..=TOTAL).collect::<Vec<_>>(),
        "successful deliveries in seq order"
    );

    let posts = receiver.posts();
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for p in &posts {
        *per_id
            .entry(p.header("x-changehub-delivery").unwrap().to_string())
            .or_default() += 1;
    }
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for p in &posts {
        let seqs = p.seqs();
        let first: u64 = p.header("x-changehub-first").unwrap().parse().unwrap();
        let last: u64 = p.header("x-changehub-last").unwrap().parse().unwrap();
        assert_eq!(
            (first, last),
            (seqs[0], *seqs.last().unwrap()),
            "seq headers match body"
        );
        assert_eq!(
            seqs,
            (first..=last).collect::<Vec<_>>(),
            "notifications are consecutive"
        );
        for s in seqs {
            *seen.entry(s).or_default() += 1;
        }
    }
    for p in &posts {
        let id = p.header("x-changehub-delivery").unwrap();
        for s in p.seqs() {
            if seen[&s] > 1 {
                assert!(per_id[id] > 1, "seq {s} duplicated outside a retry");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_changes_reach_both_subscribers_in_order() {
    let hub = TestHub::start(|c| c.linger = Duration::from_millis(10)).await;

    let signed = Receiver::start(Behaviour::default()).await;
    let flaky = Receiver::start(Behaviour {
        fail_first: 3,
        retry_after: Some("1"),
        ..Behaviour::default()
    })
    .await;
    hub.subscribe(&signed.url, &[("hub.secret", SECRET)]).await;
    hub.subscribe(&flaky.url, &[]).await;
    hub.wait_subscribed(&signed.url).await;
    hub.wait_subscribed(&flaky.url).await;

    // Requests of varied size, from three concurrent sources.
    let sizes = [1usize, 7, 50, 333, 1, 999, 2, 120, 1500, 13];
    let mut plan = Vec::new();
    let mut remaining = TOTAL as usize;
    let mut i = 0;
    while remaining > 0 {
        let n = sizes[i % sizes.len()].min(remaining);
        plan.push(n);
        remaining -= n;
        i += 1;
    }
    let plan = std::sync::Arc::new(std::sync::Mutex::new(plan));
    let mut sources = Vec::new();
    for source in 0..3 {
        let plan = plan.clone();
        let hub_url = hub.url.clone();
        sources.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut acked = Vec::new();
            loop {
                let Some(n) = plan.lock().unwrap().pop() else { break };
                let changes: Vec<_> = (0..n)
                    .map(|i| serde_json::json!({"loc": format!("http://example.com/s{source}/{i}"), "change": "created"}))
                    .collect();
                let resp = client
                    .post(format!("{hub_url}/channels/{CHANNEL}/changes"))
                    .bearer_auth(TOKEN)
                    .json(&changes)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 202);
                let json: serde_json::Value = resp.json().await.unwrap();
                assert_eq!(json["accepted"].as_u64().unwrap(), n as u64);
                acked.push((json["first"].as_u64().unwrap(), json["last"].as_u64().unwrap()));
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for s in sources {
        acked.extend(s.await.unwrap());
    }
    acked.sort();
    let mut next = 1;
    for (first, last) in &acked {
        assert_eq!(*first, next, "seqs are gapless across requests");
        next = last + 1;
    }
    assert_eq!(next, TOTAL + 1);

    signed.wait_seq(TOTAL, Duration::from_secs(60)).await;
    flaky.wait_seq(TOTAL, Duration::from_secs(60)).await;

    check_deliveries(&signed);
    check_deliveries(&flaky);
    for p in signed.posts() {
        let sig = p.header("x-hub-signature").expect("signed delivery");
        assert!(sig.starts_with("sha256="), "{sig}");
        assert!(
            signing::verify(sig, SECRET.as_bytes(), &p.body),
            "signature checks"
        );
    }
    for p in flaky.posts() {
        assert!(
            p.header("x-hub-signature").is_none(),
            "no signature without a secret"
        );
    }
    // The flaky receiver failed three times, and each failure was retried.
    let flaky_posts = flaky.posts();
    assert_eq!(
        flaky_posts
            .iter()
            .filter(|p| !p.status.is_success())
            .count(),
        3
    );
    let first_id = flaky_posts[0].header("x-changehub-delivery").unwrap();
    assert_eq!(
        flaky_posts[..4]
            .iter()
            .filter(|p| p.header("x-changehub-delivery") == Some(first_id))
            .count(),
        4,
        "the failing notification was retried with the same delivery id"
    );
    // Every delivery names the hub and the topic.
    let link = signed.posts()[0].header("link").unwrap().to_string();
    assert!(
        link.contains(&format!("<{}/hub>; rel=\"hub\"", hub.url)),
        "{link}"
    );
    assert!(
        link.contains(&format!("<{}>; rel=\"self\"", hub.topic())),
        "{link}"
    );
    assert_eq!(
        signed.posts()[0].header("content-type"),
        Some("application/xml")
    );
}
