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

/// Every websocket gets its close frame 1001 before the hub process exits: 50 SIGTERMs of the
/// real binary, each with a websocket client subscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_websocket_gets_1001_before_the_process_exits() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let runs = 50;
    let started = std::time::Instant::now();
    for run in 0..runs {
        let dir = tempfile::tempdir().unwrap();
        let mut hub = HubProcess::start(&["--data-dir", dir.path().to_str().unwrap()]).await;
        let ws_url = hub.url.replacen("http://", "ws://", 1) + "/ws";
        let (mut ws, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();
        let subscribe = format!(r#"{{"op":"subscribe","channel":"{CHANNEL}","since":0}}"#);
        ws.send(Message::text(subscribe)).await.unwrap();
        // Subscribed and caught up: the connection is in its steady state.
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .expect("frames")
                .expect("open")
                .unwrap();
            if frame.to_text().is_ok_and(|t| t.contains("caught_up")) {
                break;
            }
        }
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(hub.pid() as i32, libc::SIGTERM) }, 0);
        let code = loop {
            match tokio::time::timeout(Duration::from_secs(15), ws.next()).await {
                Ok(Some(Ok(Message::Close(Some(frame))))) => break Some(u16::from(frame.code)),
                Ok(Some(Ok(Message::Close(None)))) | Ok(None) | Ok(Some(Err(_))) => break None,
                Ok(Some(Ok(_))) => {}
                Err(_) => panic!("run {run}: no close within 15 s"),
            }
        };
        assert_eq!(code, Some(1001), "run {run}: the close frame");
        // Reading on sends the client's close reply, as any websocket client does.
        while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_secs(5), ws.next()).await {}
        let status = tokio::task::spawn_blocking(move || {
            let status = hub.child.wait().unwrap();
            (hub, status)
        })
        .await
        .unwrap()
        .1;
        assert!(status.success(), "run {run}: {status}");
    }
    eprintln!(
        "{runs} shutdowns in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
