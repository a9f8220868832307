//! `changehub tail`: follows one channel over the hub's websocket (`GET /ws`,
//! `proto/websocket.md`) and prints every change as it arrives.
//!
//! - stdout: one line per change, `seq<TAB>change<TAB>datetime<TAB>loc`, flushed after each
//!   notification. Nothing else goes to stdout.
//! - stderr: the protocol's events (`subscribed`, `caught_up`, `reset`, `error`) and
//!   disconnections, one line each.
//!
//! The cursor is the last seq printed. A lost connection — the hub going away (1001), a slow
//! consumer close (4008), a network error, silence — is retried with exponential backoff
//! (0.5 s doubling to 10 s, back to 0.5 s after each successful subscribe), resubscribing with
//! `since` = the cursor: nothing is missed and nothing is printed twice. `error` frames that
//! retrying cannot fix (`unknown_channel`, `unauthorized`, `bad_frame`) end the program with a
//! non-zero status; Ctrl-C (or SIGTERM) ends it with 0.
//!
//! The server knows nothing of this module.

use anyhow::{bail, Context};

use super::conn::{connect_ws, ws_endpoint};
use crate::retry::Reconnect;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use std::future::Future;
use std::io::Write;
use std::time::Duration;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

/// First delay before reconnecting.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
/// Longest delay before reconnecting.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Interval of our own pings (the hub pings too, every `--ws-ping`, default 30 s).
const PING_EVERY: Duration = Duration::from_secs(20);
/// A connection that delivers nothing at all (not even a pong) for this long is dead.
const SILENCE_LIMIT: Duration = Duration::from_secs(60);

/// Flags of `changehub tail`.
#[derive(Debug, Clone, clap::Args)]
pub struct TailArgs {
    /// Channel to follow.
    #[arg(long, env = "CHANGEHUB_TAIL_CHANNEL")]
    pub channel: String,
    /// The last seq you already have: every change after it is printed (0: everything the hub
    /// retains). Without it, only changes published from now on.
    #[arg(long, env = "CHANGEHUB_TAIL_SINCE")]
    pub since: Option<u64>,
    /// The epoch `--since` belongs to (printed with `subscribed`, `caught_up` and `reset`):
    /// when the channel's log has another one, the hub says so (`reset … epoch`) and replays
    /// from its oldest retained change.
    #[arg(long, env = "CHANGEHUB_TAIL_EPOCH")]
    pub epoch: Option<String>,
    /// Read token of a private channel.
    #[arg(long, env = "CHANGEHUB_TAIL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Exit once the replay is done (at the first `caught_up`) instead of following live.
    #[arg(long, env = "CHANGEHUB_TAIL_ONCE")]
    pub once: bool,
    /// Base URL of the hub (http://; the websocket is at URL/ws). Unreachable hubs are retried
    /// without end.
    #[arg(env = "CHANGEHUB_TAIL_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
}

/// Follows the channel until an unrecoverable error, `--once` is done, or `stop` completes.
pub async fn run(args: TailArgs, stop: impl Future<Output = ()>) -> anyhow::Result<()> {
    let endpoint = ws_endpoint(&args.url)?;
    anyhow::ensure!(
        crate::model::valid_channel_name(&args.channel),
        "{:?} is not a channel name ([a-z0-9][a-z0-9._-]{{0,63}})",
        args.channel
    );
    let mut follow = Follow::new(&args.channel, args.since, args.once);
    follow.epoch = args.epoch.clone();
    let result = tokio::select! {
        result = follow_loop(&endpoint, args.token.as_deref(), &mut follow) => result,
        () = stop => Ok(()),
    };
    match result {
        // `changehub tail … | head`: the reader is gone, which is a normal way to stop.
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// How one connection ended, when it was not a fatal error.
#[derive(Debug, PartialEq)]
enum Ended {
    /// `--once` and the replay is done.
    Done,
    /// Lost; reconnect. The reason is for people.
    Lost(String),
}

async fn follow_loop(
    endpoint: &url::Url,
    token: Option<&str>,
    follow: &mut Follow,
) -> anyhow::Result<()> {
    let mut backoff = Reconnect::new(BACKOFF_FIRST, BACKOFF_MAX);
    let mut out = std::io::stdout();
    loop {
        match session(endpoint, token, follow, &mut backoff, &mut out).await? {
            Ended::Done => return Ok(()),
            Ended::Lost(why) => {
                let delay = backoff.delay();
                eprintln!(
                    "disconnected: {why}; reconnecting in {}, {}",
                    humantime::format_duration(delay),
                    follow.resume_point()
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// One connection: connect, subscribe from the cursor, print until it ends.
async fn session(
    endpoint: &url::Url,
    token: Option<&str>,
    follow: &mut Follow,
    backoff: &mut Reconnect,
    out: &mut impl Write,
) -> anyhow::Result<Ended> {
    let mut ws = match connect_ws(endpoint).await {
        Ok(ws) => ws,
        Err(e) if e.is_final() => bail!("{e} (is {endpoint} a changehub hub?)"),
        Err(e) => return Ok(Ended::Lost(e.to_string())),
    };
    if let Err(e) = ws.send(Message::text(follow.subscribe_frame(token))).await {
        return Ok(Ended::Lost(format!("cannot subscribe: {e}")));
    }
    let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
    let mut heard = Instant::now();
    loop {
        tokio::select! {
            message = ws.next() => {
                heard = Instant::now();
                match message {
                    None => return Ok(Ended::Lost("the connection ended".into())),
                    Some(Err(e)) => return Ok(Ended::Lost(format!("connection lost: {e}"))),
                    Some(Ok(Message::Text(text))) => match follow.on_frame(text.as_str(), out)? {
                        Step::Continue => {}
                        Step::Subscribed => backoff.reset(),
                        Step::Done => {
                            // Polite, but the replay is printed either way.
                            let close = ws.close(None);
                            let _ = tokio::time::timeout(Duration::from_secs(1), close).await;
                            return Ok(Ended::Done);
                        }
                        Step::Resubscribe(why) => return Ok(Ended::Lost(why)),
                    },
                    Some(Ok(Message::Close(frame))) => return Ok(Ended::Lost(describe_close(frame))),
                    // Pings are answered by the library; binary frames are not part of the protocol.
                    Some(Ok(_)) => {}
                }
            }
            _ = ping.tick() => {
                if let Err(e) = ws.send(Message::Ping(Default::default())).await {
                    return Ok(Ended::Lost(format!("connection lost: {e}")));
                }
            }
            () = tokio::time::sleep_until(heard + SILENCE_LIMIT) => {
                return Ok(Ended::Lost(format!(
                    "nothing heard from the hub for {}s",
                    SILENCE_LIMIT.as_secs()
                )));
            }
        }
    }
}

fn describe_close(frame: Option<CloseFrame>) -> String {
    match frame {
        None => "the hub closed the connection".into(),
        Some(f) => {
            let code = u16::from(f.code);
            let what = match code {
                1001 => " (going away)",
                4008 => " (slow consumer)",
                1009 => " (frame too large)",
                1002 => " (protocol error)",
                _ => "",
            };
            format!("the hub closed the connection: {code}{what} {}", f.reason)
        }
    }
}

/// A server frame, as far as `tail` needs it (other fields are ignored).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ServerFrame {
    Subscribed {
        channel: String,
        since: Option<u64>,
        cursor: u64,
        #[serde(default)]
        epoch: Option<String>,
    },
    Notification {
        channel: String,
        changes: Vec<ChangeLine>,
    },
    CaughtUp {
        channel: String,
        seq: u64,
        #[serde(default)]
        epoch: Option<String>,
    },
    Reset {
        channel: String,
        oldest: u64,
        #[serde(default)]
        reason: Option<String>,
        #[serde(default)]
        epoch: Option<String>,
        #[serde(default)]
        message: String,
    },
    Unsubscribed {
        channel: String,
    },
    Error {
        code: String,
        #[serde(default)]
        channel: Option<String>,
        #[serde(default)]
        message: String,
    },
    /// A frame type this version does not know: ignored.
    #[serde(other)]
    Other,
}

/// The fields of a change that `tail` prints, as the hub wrote them.
#[derive(Debug, Deserialize)]
struct ChangeLine {
    seq: u64,
    change: String,
    datetime: String,
    loc: String,
}

/// What to do after a frame.
#[derive(Debug, PartialEq)]
enum Step {
    Continue,
    /// The subscription is in place (backoff starts again from its first delay).
    Subscribed,
    /// `--once` and the replay is done.
    Done,
    /// The subscription ended without an error that forbids trying again.
    Resubscribe(String),
}

/// The state of following one channel, across connections.
#[derive(Debug)]
struct Follow {
    channel: String,
    /// The last seq printed (or the cursor the hub started a live-only subscription at, or the
    /// `--since` given); `None` only before the first live-only subscription.
    cursor: Option<u64>,
    /// The epoch of the log the cursor belongs to, once known; sent back when resubscribing.
    epoch: Option<String>,
    once: bool,
}

impl Follow {
    fn new(channel: &str, since: Option<u64>, once: bool) -> Follow {
        Follow {
            channel: channel.to_string(),
            cursor: since,
            epoch: None,
            once,
        }
    }

    fn subscribe_frame(&self, token: Option<&str>) -> String {
        let mut frame = serde_json::json!({"op": "subscribe", "channel": self.channel});
        if let Some(since) = self.cursor {
            frame["since"] = since.into();
            if let Some(epoch) = &self.epoch {
                frame["epoch"] = epoch.as_str().into();
            }
        }
        if let Some(token) = token {
            frame["token"] = token.into();
        }
        frame.to_string()
    }

    fn resume_point(&self) -> String {
        match self.cursor {
            Some(seq) => format!("since={seq}"),
            None => "live only".into(),
        }
    }

    /// Handles one text frame: changes go to `out`, events to stderr. Errors are fatal.
    fn on_frame(&mut self, text: &str, out: &mut impl Write) -> anyhow::Result<Step> {
        let frame: ServerFrame = match serde_json::from_str(text) {
            Ok(frame) => frame,
            Err(e) => {
                eprintln!("warning: ignoring a frame this client does not understand ({e})");
                return Ok(Step::Continue);
            }
        };
        match frame {
            ServerFrame::Subscribed {
                channel,
                since,
                cursor,
                epoch,
            } if channel == self.channel => {
                let of = epoch
                    .as_deref()
                    .map(|e| format!(" epoch={e}"))
                    .unwrap_or_default();
                match since {
                    Some(since) => eprintln!("subscribed {channel} since={since}{of}"),
                    None => eprintln!("subscribed {channel} live from seq {cursor}{of}"),
                }
                if self.epoch.is_none() {
                    self.epoch = epoch;
                }
                if self.cursor.is_none() {
                    self.cursor = Some(cursor);
                }
                Ok(Step::Subscribed)
            }
            ServerFrame::Notification { channel, changes } if channel == self.channel => {
                self.print(&changes, out)?;
                Ok(Step::Continue)
            }
            ServerFrame::CaughtUp {
                channel,
                seq,
                epoch,
            } if channel == self.channel => {
                let of = epoch
                    .as_deref()
                    .map(|e| format!(" epoch={e}"))
                    .unwrap_or_default();
                eprintln!("caught_up {channel} seq={seq}{of}");
                if epoch.is_some() {
                    self.epoch = epoch;
                }
                Ok(if self.once {
                    Step::Done
                } else {
                    Step::Continue
                })
            }
            ServerFrame::Reset {
                channel,
                oldest,
                reason,
                epoch,
                message,
            } if channel == self.channel => {
                let reason = reason.as_deref().unwrap_or("retention");
                let of = epoch
                    .as_deref()
                    .map(|e| format!(" epoch={e}"))
                    .unwrap_or_default();
                eprintln!("reset {channel} {reason} oldest={oldest}{of}: {message}");
                // The replay goes on from `oldest`: the next change printed is `oldest`.
                self.cursor = Some(oldest.saturating_sub(1));
                if epoch.is_some() {
                    self.epoch = epoch;
                }
                Ok(Step::Continue)
            }
            ServerFrame::Unsubscribed { channel } if channel == self.channel => Ok(
                Step::Resubscribe(format!("the hub ended the subscription to {channel}")),
            ),
            ServerFrame::Error {
                code,
                channel,
                message,
            } => {
                let on = channel.as_deref().unwrap_or("-");
                match code.as_str() {
                    // Retrying cannot fix these.
                    "unknown_channel" | "unauthorized" | "bad_frame" => {
                        bail!("error {code} {on}: {message}")
                    }
                    _ => {
                        eprintln!("error {code} {on}: {message}");
                        Ok(Step::Resubscribe(format!("{code}: {message}")))
                    }
                }
            }
            // Frames of other channels, and frame types this version does not know.
            _ => Ok(Step::Continue),
        }
    }

    /// Prints the changes after the cursor, one line each, and flushes.
    fn print(&mut self, changes: &[ChangeLine], out: &mut impl Write) -> anyhow::Result<()> {
        let mut lines = String::new();
        for c in changes {
            if let Some(cursor) = self.cursor {
                if c.seq <= cursor {
                    continue; // already printed
                }
                if c.seq > cursor + 1 {
                    eprintln!(
                        "warning: {}: seqs {}..{} never arrived",
                        self.channel,
                        cursor + 1,
                        c.seq - 1
                    );
                }
            }
            lines.push_str(&format!(
                "{}\t{}\t{}\t{}\n",
                c.seq, c.change, c.datetime, c.loc
            ));
            self.cursor = Some(c.seq);
        }
        if !lines.is_empty() {
            out.write_all(lines.as_bytes())
                .and_then(|()| out.flush())
                .context("writing to stdout")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notification(seqs: std::ops::RangeInclusive<u64>) -> String {
        let changes: Vec<_> = seqs
            .clone()
            .map(|s| {
                serde_json::json!({"seq": s, "loc": format!("http://example.com/{s}"),
                    "change": "updated", "datetime": "2024-05-01T10:00:00Z", "hash": "md5:00"})
            })
            .collect();
        serde_json::json!({"type": "notification", "channel": "news", "first": seqs.start(),
            "last": seqs.end(), "from": "2024-05-01T10:00:00Z", "until": "2024-05-01T10:00:00Z",
            "changes": changes})
        .to_string()
    }

    fn printed(out: &[u8]) -> Vec<u64> {
        std::str::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| {
                let fields: Vec<&str> = l.split('\t').collect();
                assert_eq!(fields.len(), 4, "{l}");
                fields[0].parse().unwrap()
            })
            .collect()
    }

    #[test]
    fn prints_each_change_once_and_keeps_the_cursor() {
        let mut f = Follow::new("news", Some(0), false);
        let mut out = Vec::new();
        let subscribed = r#"{"type":"subscribed","channel":"news","since":0,"cursor":0}"#;
        assert_eq!(f.on_frame(subscribed, &mut out).unwrap(), Step::Subscribed);
        f.on_frame(&notification(1..=3), &mut out).unwrap();
        // A repeat (after a reconnect, say) prints only what is new.
        f.on_frame(&notification(2..=5), &mut out).unwrap();
        assert_eq!(printed(&out), [1, 2, 3, 4, 5]);
        assert_eq!(
            std::str::from_utf8(&out).unwrap().lines().next().unwrap(),
            "1\tupdated\t2024-05-01T10:00:00Z\thttp://example.com/1"
        );
        assert_eq!(f.cursor, Some(5));
        assert_eq!(
            f.subscribe_frame(Some("t")),
            r#"{"channel":"news","op":"subscribe","since":5,"token":"t"}"#
        );
        // Frames of other channels and unknown frame types are ignored.
        let other = notification(6..=6).replace("\"news\"", "\"other\"");
        f.on_frame(&other, &mut out).unwrap();
        f.on_frame(r#"{"type":"hello"}"#, &mut out).unwrap();
        assert_eq!(printed(&out), [1, 2, 3, 4, 5]);
        let caught_up = r#"{"type":"caught_up","channel":"news","seq":5}"#;
        assert_eq!(f.on_frame(caught_up, &mut out).unwrap(), Step::Continue);
    }

    #[test]
    fn live_only_takes_the_hubs_cursor_and_reset_moves_it() {
        let mut f = Follow::new("news", None, true);
        assert_eq!(
            f.subscribe_frame(None),
            r#"{"channel":"news","op":"subscribe"}"#
        );
        let mut out = Vec::new();
        f.on_frame(
            r#"{"type":"subscribed","channel":"news","since":null,"cursor":42}"#,
            &mut out,
        )
        .unwrap();
        assert_eq!(f.resume_point(), "since=42");
        f.on_frame(
            r#"{"type":"reset","channel":"news","oldest":100,"message":"m"}"#,
            &mut out,
        )
        .unwrap();
        assert_eq!(f.cursor, Some(99));
        let caught_up = r#"{"type":"caught_up","channel":"news","seq":99}"#;
        assert_eq!(f.on_frame(caught_up, &mut out).unwrap(), Step::Done);
    }

    #[test]
    fn the_epoch_is_kept_and_sent_back_with_the_cursor() {
        let mut f = Follow::new("news", Some(3), false);
        let mut out = Vec::new();
        f.on_frame(
            r#"{"type":"caught_up","channel":"news","seq":3,"epoch":"00000000000000aa"}"#,
            &mut out,
        )
        .unwrap();
        assert_eq!(
            f.subscribe_frame(None),
            r#"{"channel":"news","epoch":"00000000000000aa","op":"subscribe","since":3}"#
        );
        // The hub's log started again: the new epoch, and the cursor back to its start.
        f.on_frame(
            r#"{"type":"reset","channel":"news","reason":"ahead","oldest":1,"last":2,"epoch":"00000000000000bb","message":"m"}"#,
            &mut out,
        )
        .unwrap();
        assert_eq!(f.cursor, Some(0));
        assert_eq!(f.epoch.as_deref(), Some("00000000000000bb"));
        f.on_frame(&notification(1..=2), &mut out).unwrap();
        assert_eq!(printed(&out), [1, 2]);
    }

    #[test]
    fn errors_are_fatal_or_retried() {
        let mut f = Follow::new("news", None, false);
        let mut out = Vec::new();
        for code in ["unknown_channel", "unauthorized", "bad_frame"] {
            let frame = serde_json::json!({"type": "error", "code": code, "channel": "news",
                "message": "no"});
            assert!(f.on_frame(&frame.to_string(), &mut out).is_err(), "{code}");
        }
        let unavailable = r#"{"type":"error","code":"unavailable","channel":"news","message":"x"}"#;
        assert!(matches!(
            f.on_frame(unavailable, &mut out).unwrap(),
            Step::Resubscribe(_)
        ));
        assert!(is_broken_pipe(
            &anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
                .context("writing")
        ));
    }
}
