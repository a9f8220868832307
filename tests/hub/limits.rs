//! Connection limits: a client that trickles its headers or sits idle is cut off, and caps on
//! connections (in all, and per client address) are answered at once — while `/healthz`
//! keeps answering everyone else. Attackers connect from other loopback addresses
//! (127.0.0.2 …) than the health checks (127.0.0.1).

use crate::common::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn connect_from(source: &str, hub: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(hub).await.unwrap()
}

/// Reads until the hub closes the connection (or `deadline`); returns what was read, or
/// `None` when the connection was still open at the deadline.
async fn read_to_close(stream: &mut TcpStream, deadline: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(deadline, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok()
    .map(|()| got)
}

async fn healthy(hub: &TestHub) -> bool {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    client
        .get(format!("{}/healthz", hub.url))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_idle_connections_are_cut_off() {
    let hub = TestHub::start(|c| c.http.header_read_timeout = Duration::from_secs(1)).await;

    // 20 slowloris clients: a request line, then one header byte every 200 ms.
    let mut trickles = Vec::new();
    for _ in 0..20 {
        let mut stream = connect_from("127.0.0.2", hub.addr).await;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: hub\r\n")
            .await
            .unwrap();
        trickles.push(tokio::spawn(async move {
            let started = Instant::now();
            for byte in b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter() {
                if stream.write_all(&[*byte]).await.is_err() {
                    return started.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Duration::MAX // never cut off
        }));
    }
    assert!(healthy(&hub).await, "/healthz answers during the attack");
    for trickle in trickles {
        let lasted = trickle.await.unwrap();
        assert!(
            lasted < Duration::from_secs(5),
            "a slowloris client lasted {lasted:?}"
        );
    }

    // An idle keep-alive connection after one request.
    let mut stream = connect_from("127.0.0.2", hub.addr).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: hub\r\n\r\n")
        .await
        .unwrap();
    let got = read_to_close(&mut stream, Duration::from_secs(5))
        .await
        .expect("an idle connection is closed");
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(healthy(&hub).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_caps_answer_at_once_and_health_checks_go_on() {
    let hub = TestHub::start(|c| {
        c.http.max_connections_per_ip = 10;
        c.http.max_connections = 30;
    })
    .await;

    // One address: 10 are held, the rest get 429 at once.
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(connect_from("127.0.0.3", hub.addr).await);
    }
    wait_until("the hub counts them", Duration::from_secs(5), || async {
        let mut extra = connect_from("127.0.0.3", hub.addr).await;
        let got = read_to_close(&mut extra, Duration::from_secs(2)).await;
        got.is_some_and(|g| g.starts_with(b"HTTP/1.1 429"))
    })
    .await;
    assert!(healthy(&hub).await, "another address is served");

    // Many addresses: past 30 in all, 503 at once.
    for i in 4..=6 {
        for _ in 0..7 {
            held.push(connect_from(&format!("127.0.0.{i}"), hub.addr).await);
        }
    }
    let mut past = connect_from("127.0.0.7", hub.addr).await;
    let started = Instant::now();
    let got = read_to_close(&mut past, Duration::from_secs(3))
        .await
        .expect("a connection past the cap is answered and closed");
    assert!(
        got.starts_with(b"HTTP/1.1 503"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    // When they go, everyone is served again.
    drop(held);
    wait_until("health checks answer again", Duration::from_secs(5), || {
        healthy(&hub)
    })
    .await;
}
