//! How instances hear each other: the pub/sub channel [`EVENTS`] carries head moves and
//! [`ClusterEvent`]s as short text messages (`head c last`, `published c first last`,
//! `subscription c id`, `released c`, `pinged c`, `channel c`). A listener task follows it on a connection of its own
//! and, because pub/sub is at most once, re-reads every known channel's `last` and
//! `published` after each (re)connection and every [`REFRESH`].

use futures_util::StreamExt;
use redis::AsyncCommands;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::conn::Conn;
use super::{key, timed, RedisStore, EVENTS, REFRESH};
use crate::retry::Reconnect;
use crate::store::{ClusterEvent, StoreError};

/// The newest seq of each channel this process follows, as a watch per channel.
pub(super) type Heads = Arc<Mutex<HashMap<String, watch::Sender<u64>>>>;

/// The head of `channel` as this process knows it (0 when it follows no such channel): at or
/// below the channel's `last` in Redis.
pub(super) fn known_head(heads: &Heads, channel: &str) -> u64 {
    let heads = heads.lock().unwrap_or_else(|e| e.into_inner());
    heads.get(channel).map_or(0, |tx| *tx.borrow())
}

/// Raises a head watch to `last` (heads never go back).
pub(super) fn raise(heads: &Heads, channel: &str, last: u64) {
    let mut heads = heads.lock().unwrap_or_else(|e| e.into_inner());
    match heads.get(channel) {
        Some(tx) => {
            tx.send_if_modified(|v| {
                if last > *v {
                    *v = last;
                    true
                } else {
                    false
                }
            });
        }
        None => {
            heads.insert(channel.to_string(), watch::channel(last).0);
        }
    }
}

/// Follows [`EVENTS`] on a dedicated pub/sub connection, reconnecting with backoff (to the
/// next of `servers` each time: one server, or a cluster's seed nodes); after every
/// (re)connection and every [`REFRESH`] re-reads what a lost message could hide.
pub(super) async fn listen(
    servers: Vec<redis::Client>,
    conn: Conn,
    heads: Heads,
    events: broadcast::Sender<ClusterEvent>,
    stop: CancellationToken,
) {
    let mut backoff = Reconnect::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut next = 0;
    loop {
        let client = &servers[next % servers.len()];
        next += 1;
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            c = tokio::time::timeout(Duration::from_secs(3), client.get_async_pubsub()) => c,
        };
        let mut pubsub = match connected {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "redis pub/sub: cannot connect; retrying");
                if backoff.sleep_or_stop(&stop).await {
                    return;
                }
                continue;
            }
            Err(_) => {
                if backoff.sleep_or_stop(&stop).await {
                    return;
                }
                continue;
            }
        };
        if let Err(e) = pubsub.subscribe(EVENTS).await {
            tracing::debug!(error = %e, "redis pub/sub: cannot subscribe; retrying");
            if backoff.sleep_or_stop(&stop).await {
                return;
            }
            continue;
        }
        backoff.reset();
        refresh(&conn, &heads, &events).await;
        let mut messages = pubsub.into_on_message();
        let mut tick = tokio::time::interval(REFRESH);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                msg = messages.next() => match msg {
                    Some(msg) => {
                        let payload: Vec<u8> = msg.get_payload_bytes().to_vec();
                        handle_message(&payload, &heads, &events);
                    }
                    None => {
                        tracing::warn!("redis pub/sub connection lost; reconnecting");
                        break;
                    }
                },
                _ = tick.tick() => refresh(&conn, &heads, &events).await,
            }
        }
        if backoff.sleep_or_stop(&stop).await {
            return;
        }
    }
}

fn handle_message(payload: &[u8], heads: &Heads, events: &broadcast::Sender<ClusterEvent>) {
    let Ok(text) = std::str::from_utf8(payload) else {
        return;
    };
    let parts: Vec<&str> = text.split(' ').collect();
    let num = |s: &str| s.parse::<u64>().ok();
    match parts.as_slice() {
        ["head", channel, last] => {
            if let Some(last) = num(last) {
                raise(heads, channel, last);
            }
        }
        ["published", channel, first, last] => {
            if let (Some(first), Some(last)) = (num(first), num(last)) {
                let _ = events.send(ClusterEvent::Published {
                    channel: channel.to_string(),
                    first,
                    last,
                });
            }
        }
        ["subscription", channel, id] => {
            let _ = events.send(ClusterEvent::Subscription {
                channel: channel.to_string(),
                id: id.to_string(),
            });
        }
        ["released", channel] => {
            let _ = events.send(ClusterEvent::Released {
                channel: channel.to_string(),
            });
        }
        ["pinged", channel] => {
            let _ = events.send(ClusterEvent::Pinged {
                channel: channel.to_string(),
            });
        }
        ["channel", channel] => {
            let _ = events.send(ClusterEvent::Channel {
                channel: channel.to_string(),
            });
        }
        _ => tracing::debug!(message = text, "unknown event"),
    }
}

/// Re-reads `last` and `published` of every channel this process follows.
async fn refresh(conn: &Conn, heads: &Heads, events: &broadcast::Sender<ClusterEvent>) {
    let channels: Vec<String> = {
        let heads = heads.lock().unwrap_or_else(|e| e.into_inner());
        heads.keys().cloned().collect()
    };
    let mut conn = conn.clone();
    for channel in channels {
        let got: Result<(Option<u64>, Option<u64>), StoreError> = timed(
            redis::cmd("HMGET")
                .arg(key(&channel, "meta"))
                .arg("last")
                .arg("published")
                .query_async(&mut conn),
        )
        .await;
        match got {
            Ok((last, published)) => {
                raise(heads, &channel, last.unwrap_or(0));
                if let Some(p) = published {
                    let _ = events.send(ClusterEvent::Published {
                        channel,
                        first: 0,
                        last: p,
                    });
                }
            }
            Err(_) => return, // Redis is down: the next tick or reconnection tries again
        }
    }
}

/// Tells every instance about `event`; `published` is also recorded in the channel's meta,
/// so that an instance that missed the message learns it on its next refresh.
pub(super) async fn announce(store: &RedisStore, event: &ClusterEvent) -> Result<(), StoreError> {
    let mut conn = store.conn();
    match event {
        ClusterEvent::Published {
            channel,
            first,
            last,
        } => {
            timed(
                store
                    .scripts
                    .published
                    .key(key(channel, "meta"))
                    .arg(first)
                    .arg(last)
                    .arg(EVENTS)
                    .arg(channel)
                    .invoke_async::<()>(&mut conn),
            )
            .await
        }
        ClusterEvent::Subscription { channel, id } => {
            timed(conn.publish::<_, _, ()>(EVENTS, format!("subscription {channel} {id}"))).await
        }
        ClusterEvent::Released { channel } => {
            timed(conn.publish::<_, _, ()>(EVENTS, format!("released {channel}"))).await
        }
        ClusterEvent::Pinged { channel } => {
            timed(conn.publish::<_, _, ()>(EVENTS, format!("pinged {channel}"))).await
        }
        ClusterEvent::Channel { channel } => {
            timed(conn.publish::<_, _, ()>(EVENTS, format!("channel {channel}"))).await
        }
    }
}
