//! The JSON frames of the websocket protocol (also the `data` of server-sent events).
//! `proto/websocket.md` documents them and `proto/ws/*.schema.json` pins their shape.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::follow::{Event, ResetReason};
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
        /// The epoch `since` belongs to (from an earlier `subscribed`, `caught_up` or
        /// `reset`): a cursor of another epoch is reset.
        #[serde(default)]
        epoch: Option<String>,
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

/// The frame for a follower event; `epoch` is the log's (see `Follower::epoch`).
pub fn event(channel: &str, ev: &Event, epoch: Option<&str>) -> String {
    match ev {
        Event::Live(..) | Event::Replay(_) => notification(channel, ev.changes()),
        Event::CaughtUp(seq) => {
            json!({"type": "caught_up", "channel": channel, "seq": seq, "epoch": epoch}).to_string()
        }
        Event::Reset {
            oldest,
            last,
            reason,
        } => {
            let why = match reason {
                ResetReason::Retention => "the cursor is older than retention".to_string(),
                ResetReason::Ahead => format!(
                    "the cursor is beyond the newest seq ({last}) of this log: the log was \
                     started again, or the cursor is of another channel or hub"
                ),
                ResetReason::Epoch => {
                    "the cursor is of another epoch: the log was started again".to_string()
                }
            };
            json!({
                "type": "reset",
                "channel": channel,
                "reason": reason.as_str(),
                "oldest": oldest,
                "last": last,
                "epoch": epoch,
                "message": format!("{why}; replay continues from seq {oldest}"),
            })
            .to_string()
        }
    }
}

/// `subscribed`: `epoch` is the log's, when known.
pub fn subscribed(channel: &str, since: Option<u64>, cursor: u64, epoch: Option<&str>) -> String {
    let mut frame =
        json!({"type": "subscribed", "channel": channel, "since": since, "cursor": cursor});
    if let Some(epoch) = epoch {
        frame["epoch"] = epoch.into();
    }
    frame.to_string()
}

pub fn unsubscribed(channel: &str) -> String {
    json!({"type": "unsubscribed", "channel": channel}).to_string()
}

/// An `error` frame: `code` is stable, `message` is for people.
pub fn error(code: &str, channel: Option<&str>, message: &str) -> String {
    json!({"type": "error", "code": code, "channel": channel, "message": message}).to_string()
}
