//! The JSON frames of the websocket protocol (also the `data` of server-sent events).
//! `proto/websocket.md` documents them and `proto/ws/*.schema.json` pins their shape.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::follow::Event;
use crate::model::Notification;
use crate::model::{format_datetime, Change};

/// A frame from the client.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientFrame {
    /// `since`: the last seq the client already has (0: everything retained; absent: live only).
    Subscribe {
        channel: String,
        #[serde(default)]
        since: Option<u64>,
        /// Read token of a private channel (or give `?token=` when connecting).
        #[serde(default)]
        token: Option<String>,
    },
    Unsubscribe {
        channel: String,
    },
}

#[derive(Serialize)]
struct NotificationFrame<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    channel: &'a str,
    first: u64,
    last: u64,
    from: String,
    until: String,
    changes: &'a [Change],
}

/// A `notification` frame for consecutive changes of `channel` (never empty).
pub fn notification(channel: &str, changes: &[Change]) -> String {
    let (Some(first), Some(last)) = (changes.first(), changes.last()) else {
        return String::new();
    };
    serde_json::to_string(&NotificationFrame {
        kind: "notification",
        channel,
        first: first.seq,
        last: last.seq,
        from: format_datetime(first.datetime),
        until: format_datetime(last.datetime),
        changes,
    })
    .unwrap_or_default()
}

/// The `notification` frame of a whole notification.
pub fn whole_notification(n: &Notification) -> String {
    notification(&n.channel, &n.changes)
}

/// The frame for a follower event.
pub fn event(channel: &str, ev: &Event) -> String {
    match ev {
        Event::Live(..) | Event::Replay(_) => notification(channel, ev.changes()),
        Event::CaughtUp(seq) => {
            json!({"type": "caught_up", "channel": channel, "seq": seq}).to_string()
        }
        Event::Reset { oldest } => json!({
            "type": "reset",
            "channel": channel,
            "oldest": oldest,
            "message": format!("the cursor is older than retention; replay continues from seq {oldest}"),
        })
        .to_string(),
    }
}

pub fn subscribed(channel: &str, since: Option<u64>, cursor: u64) -> String {
    json!({"type": "subscribed", "channel": channel, "since": since, "cursor": cursor}).to_string()
}

pub fn unsubscribed(channel: &str) -> String {
    json!({"type": "unsubscribed", "channel": channel}).to_string()
}

/// An `error` frame: `code` is stable, `message` is for people.
pub fn error(code: &str, channel: Option<&str>, message: &str) -> String {
    json!({"type": "error", "code": code, "channel": channel, "message": message}).to_string()
}
