//! Crash safety: the hub process is killed with SIGKILL while sources push; after a restart
//! every acknowledged change is in the log, seqs are gapless, and the subscriber gets the rest.

use crate::common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_no_acknowledged_change() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let mut hub = HubProcess::start(&["--data-dir", data_dir]).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    let client = reqwest::Client::new();
    subscribe_at(&hub.url, CHANNEL, &receiver.url).await;
    receiver.wait_verified(1).await;
    wait_subscriptions(&hub.url, 1).await;

    // Two sources push small requests until the hub dies under them.
    let acked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let dead = Arc::new(AtomicBool::new(false));
    let mut sources = Vec::new();
    for source in 0..2 {
        let acked = acked.clone();
        let dead = dead.clone();
        let url = hub.url.clone();
        sources.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            for i in 0..10_000 {
                if dead.load(Ordering::SeqCst) {
                    return;
                }
                let changes: Vec<_> = (0..10)
                    .map(|j| serde_json::json!({"loc": format!("http://example.com/{source}/{i}/{j}"), "change": "updated"}))
                    .collect();
                let Ok(resp) = client
                    .post(format!("{url}/channels/{CHANNEL}/changes"))
                    .bearer_auth(TOKEN)
                    .json(&changes)
                    .send()
                    .await
                else {
                    return;
                };
                if resp.status() != 202 {
                    return;
                }
                let Ok(json) = resp.json::<serde_json::Value>().await else { return };
                acked
                    .lock()
                    .unwrap()
                    .push((json["first"].as_u64().unwrap(), json["last"].as_u64().unwrap()));
            }
        }));
    }
    wait_until(
        "some changes acknowledged",
        Duration::from_secs(30),
        || async { acked.lock().unwrap().len() >= 150 },
    )
    .await;
    hub.kill9();
    dead.store(true, Ordering::SeqCst);
    for s in sources {
        s.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let max_acked = acked.iter().map(|a| a.1).max().unwrap();

    let hub = HubProcess::start(&["--data-dir", data_dir]).await;
    let seqs = catch_up(&client, &hub.url, 0).await;
    assert!(!seqs.is_empty());
    assert_eq!(
        seqs,
        (1..=*seqs.last().unwrap()).collect::<Vec<_>>(),
        "gapless"
    );
    for (first, last) in &acked {
        assert!(
            *last <= *seqs.last().unwrap(),
            "acknowledged {first}-{last} survived"
        );
    }
    assert!(*seqs.last().unwrap() >= max_acked);

    // The subscription survived, and the subscriber gets everything, the rest included.
    let (status, _) = {
        let resp = client
            .post(format!("{}/channels/{CHANNEL}/changes", hub.url))
            .bearer_auth(TOKEN)
            .json(&serde_json::json!({"loc": "http://example.com/after", "change": "created"}))
            .send()
            .await
            .unwrap();
        (resp.status(), ())
    };
    assert_eq!(status, 202);
    let head = *seqs.last().unwrap() + 1;
    receiver.wait_seq(head, Duration::from_secs(60)).await;
    let mut got = receiver.delivered_seqs();
    got.sort();
    got.dedup();
    assert_eq!(
        got,
        (1..=head).collect::<Vec<_>>(),
        "every change delivered at least once"
    );
}
