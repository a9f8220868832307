//! Graceful shutdown flushes pending batches and delivers them; a restart resumes.

use crate::common::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_flushes_and_delivers_pending_batches() {
    // A linger so long that only the shutdown flush can publish the batch.
    let mut hub = TestHub::start(|c| c.linger = Duration::from_secs(3600)).await;
    let receiver = Receiver::start(Behaviour::default()).await;
    hub.subscribe(&receiver.url, &[]).await;
    hub.wait_subscribed(&receiver.url).await;
    hub.push("a", 3).await;
    let published = |hub: &TestHub| {
        let url = format!("{}/api/channels", hub.url);
        let client = hub.client.clone();
        async move {
            let v: serde_json::Value = client
                .get(url)
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (
                v[0]["last"].as_u64().unwrap(),
                v[0]["published"].as_u64().unwrap(),
            )
        }
    };
    assert_eq!(published(&hub).await, (3, 0), "durable, not yet published");

    hub.stop().await;
    assert_eq!(
        receiver.delivered_seqs(),
        vec![1, 2, 3],
        "flushed and delivered on shutdown"
    );

    // Restarted on the same data, the hub has the changes and the subscription.
    let again = TestHub::start_in(hub.data_dir.clone(), |_| {}).await;
    assert_eq!(again.catch_up(0).await, vec![1, 2, 3]);
    assert_eq!(again.subscriptions().await.len(), 1);
    again.push("b", 1).await;
    receiver.wait_seq(4, Duration::from_secs(15)).await;
    assert_eq!(
        receiver.delivered_seqs(),
        vec![1, 2, 3, 4],
        "no redelivery after a clean stop"
    );
}
