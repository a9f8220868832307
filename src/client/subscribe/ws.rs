//! `--via ws`: the changes come over the hub's websocket instead of callbacks, for a
//! destination the hub cannot call (behind NAT or a firewall).
//!
//! Each connection subscribes with `since` = the follower's saved cursor and its epoch, so
//! the hub replays what was missed and goes on live. Notifications and resets go to the
//! follower as [`Event`]s; a lost connection is retried with backoff, from the cursor saved
//! by then. Errors that retrying cannot fix (`unknown_channel`, `unauthorized`) end it.

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message;

use super::Event;
use crate::client::conn::connect_ws;
use crate::model::Change;
use crate::retry::Reconnect;

/// A connection that delivers nothing at all (not even a ping) for this long is dead.
const SILENCE_LIMIT: Duration = Duration::from_secs(75);

/// The server frames this follower needs (others are ignored).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Frame {
    Notification {
        channel: String,
        changes: Vec<Change>,
    },
    Reset {
        channel: String,
        oldest: u64,
        #[serde(default)]
        epoch: Option<String>,
        #[serde(default)]
        reason: Option<String>,
    },
    Error {
        code: String,
        #[serde(default)]
        message: String,
    },
    #[serde(other)]
    Other,
}

/// Follows `channel` at `endpoint` until the follower goes away or an error cannot be fixed
/// by retrying (then it sends [`Event::Fatal`]).
pub async fn follow(
    endpoint: url::Url,
    channel: String,
    token: Option<String>,
    cursor: watch::Receiver<(u64, Option<String>)>,
    events: mpsc::Sender<Event>,
) {
    let mut backoff = Reconnect::new(Duration::from_millis(500), Duration::from_secs(10));
    loop {
        let (since, epoch) = cursor.borrow().clone();
        let why =
            match connection(&endpoint, &channel, token.as_deref(), since, epoch, &events).await {
                Ok(why) => why,
                Err(fatal) => {
                    let _ = events.send(Event::Fatal(fatal)).await;
                    return;
                }
            };
        if events.is_closed() {
            return;
        }
        let delay = backoff.delay();
        eprintln!(
            "websocket: {why}; reconnecting in {}",
            humantime::format_duration(delay)
        );
        tokio::time::sleep(delay).await;
    }
}

/// One connection; `Ok(why)` when it was lost, `Err` when following cannot go on.
async fn connection(
    endpoint: &url::Url,
    channel: &str,
    token: Option<&str>,
    since: u64,
    epoch: Option<String>,
    events: &mpsc::Sender<Event>,
) -> Result<String, String> {
    let mut ws = match connect_ws(endpoint).await {
        Ok(ws) => ws,
        Err(e) if e.is_final() => return Err(format!("{e} (is {endpoint} a changehub hub?)")),
        Err(e) => return Ok(e.to_string()),
    };
    let mut subscribe = serde_json::json!({"op": "subscribe", "channel": channel, "since": since});
    if let Some(epoch) = epoch {
        subscribe["epoch"] = epoch.into();
    }
    if let Some(token) = token {
        subscribe["token"] = token.into();
    }
    if let Err(e) = ws.send(Message::text(subscribe.to_string())).await {
        return Ok(format!("cannot subscribe: {e}"));
    }
    eprintln!("websocket: following {channel} after seq {since}");
    loop {
        let message = match tokio::time::timeout(SILENCE_LIMIT, ws.next()).await {
            Err(_) => return Ok(format!("nothing heard for {}s", SILENCE_LIMIT.as_secs())),
            Ok(None) => return Ok("the connection ended".into()),
            Ok(Some(Err(e))) => return Ok(format!("connection lost: {e}")),
            Ok(Some(Ok(message))) => message,
        };
        let text = match message {
            Message::Text(text) => text,
            Message::Close(frame) => {
                return Ok(match frame {
                    Some(f) => format!("closed by the hub: {} {}", u16::from(f.code), f.reason),
                    None => "closed by the hub".into(),
                })
            }
            _ => continue,
        };
        let event = match serde_json::from_str::<Frame>(text.as_str()) {
            Ok(Frame::Notification {
                channel: c,
                changes,
            }) if c == channel => Event::Changes {
                epoch: None,
                changes,
            },
            Ok(Frame::Reset {
                channel: c,
                oldest,
                epoch,
                reason,
            }) if c == channel => Event::Reset {
                oldest,
                epoch,
                reason: reason.unwrap_or_else(|| "retention".into()),
            },
            Ok(Frame::Error { code, message }) => match code.as_str() {
                "unknown_channel" | "unauthorized" | "bad_frame" => {
                    return Err(format!("the hub refused: {code}: {message}"))
                }
                _ => return Ok(format!("{code}: {message}")),
            },
            Ok(_) => continue,
            Err(e) => {
                eprintln!("websocket: ignoring a frame this client does not understand ({e})");
                continue;
            }
        };
        if events.send(event).await.is_err() {
            return Ok("the follower stopped".into());
        }
    }
}
