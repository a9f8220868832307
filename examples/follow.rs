//! A websocket follower: follows one channel of a changehub hub over `GET /ws`
//! (`proto/websocket.md`) and prints every change once, in seq order, keeping its cursor — the
//! last seq printed — in a file, so that a restart resumes exactly where it stopped.
//!
//! What it does:
//! 1. Reads the cursor from `CURSOR_FILE` (a decimal seq, then the epoch of the log it belongs
//!    to). Without the file it starts live (or from everything retained with `--from-start`)
//!    and writes the file as soon as the hub says where the subscription starts.
//! 2. Connects to `{hub}/ws` and sends `{"op":"subscribe","channel":…,"since":cursor,
//!    "epoch":…}`: the hub replays every retained change after the cursor, sends `caught_up`,
//!    then live changes. When the hub's log is not the one the cursor came from (its data was
//!    lost, or it is another hub), the hub answers `reset` and replays its log from the start;
//!    so does a cursor older than retention.
//! 3. For each `notification`: prints each change not printed yet as
//!    `seq<TAB>change<TAB>datetime<TAB>loc` on stdout, then saves the cursor (written to a
//!    temporary file, synced, renamed over the old one). Events go to stderr.
//! 4. When the connection ends — the hub restarts (close 1001), finds this client too slow
//!    (close 4008), the network fails, or nothing is heard for 90 s although the hub pings every
//!    30 s — it reconnects after 0.5 s, 1 s, 2 s … up to 10 s (back to 0.5 s once subscribed)
//!    and resumes from its cursor.
//! 5. Ctrl-C stops it between two notifications: the next run prints exactly what came after.
//!    (Killed between printing a notification and saving the cursor, the next run prints that
//!    notification again: at least once, never a gap.)
//!
//! Run it against a hub started as in the README:
//!
//! ```text
//! cargo run --release -- serve --channel news=secret-token --allow-private-callbacks
//! cargo run --example follow -- http://127.0.0.1:8080 news news.cursor --from-start
//! cargo run --example source -- http://127.0.0.1:8080 news secret-token 2500     # elsewhere
//! # Ctrl-C the follower, push more, start it again: it prints only what it had not.
//! ```
//!
//! `changehub tail` is the same client, built into the binary.

use anyhow::{bail, Context};
use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

const FIRST_DELAY: Duration = Duration::from_millis(500);
const MAX_DELAY: Duration = Duration::from_secs(10);
/// The hub pings every 30 s (`--ws-ping`); this much silence means the connection is dead.
const SILENCE_LIMIT: Duration = Duration::from_secs(90);

#[derive(Parser)]
#[command(about = "Follow a changehub channel over the websocket, resuming from a cursor file")]
struct Args {
    /// Base URL of the hub, e.g. http://127.0.0.1:8080
    hub: String,
    /// Channel name
    channel: String,
    /// File that keeps the cursor (the last seq printed)
    cursor_file: PathBuf,
    /// Read token of a private channel
    #[arg(long)]
    token: Option<String>,
    /// Without a cursor file: start from every retained change instead of live
    #[arg(long)]
    from_start: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let url = websocket_url(&args.hub)?;
    let (mut cursor, mut epoch) = match load_cursor(&args.cursor_file)? {
        Some((seq, epoch)) => (Some(seq), epoch),
        None if args.from_start => (Some(0), None),
        None => (None, None),
    };
    let mut delay = FIRST_DELAY;
    let following = async {
        loop {
            let why = follow(&url, &args, &mut cursor, &mut epoch, &mut delay).await?;
            eprintln!("{why}; reconnecting in {delay:?}");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(MAX_DELAY);
        }
    };
    let result: anyhow::Result<()> = tokio::select! {
        result = following => result,
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    match cursor {
        Some(seq) => eprintln!(
            "stopped at seq {seq} (saved in {})",
            args.cursor_file.display()
        ),
        None => eprintln!("stopped before subscribing"),
    }
    result
}

/// `http://host:port/prefix` → `ws://host:port/prefix/ws`.
fn websocket_url(hub: &str) -> anyhow::Result<String> {
    let hub = hub.trim_end_matches('/');
    if let Some(rest) = hub.strip_prefix("http://") {
        Ok(format!("ws://{rest}/ws"))
    } else if hub.starts_with("https://") {
        bail!("this build has no TLS for websockets: use an http:// URL")
    } else {
        bail!("{hub}: give the hub's http:// base URL")
    }
}

/// One connection: subscribe from the cursor, print until it ends. `Ok(reason)`: reconnect;
/// `Err`: give up.
async fn follow(
    url: &str,
    args: &Args,
    cursor: &mut Option<u64>,
    epoch: &mut Option<String>,
    delay: &mut Duration,
) -> anyhow::Result<String> {
    let mut ws = match tokio_tungstenite::connect_async(url).await {
        Ok((ws, _)) => ws,
        Err(e) => return Ok(format!("cannot connect to {url}: {e}")),
    };
    let mut subscribe = json!({"op": "subscribe", "channel": args.channel});
    if let Some(seq) = *cursor {
        subscribe["since"] = seq.into();
        // The hub resets a cursor of another epoch (its log started again).
        if let Some(epoch) = epoch.as_deref() {
            subscribe["epoch"] = epoch.into();
        }
    }
    if let Some(token) = &args.token {
        subscribe["token"] = token.as_str().into();
    }
    if let Err(e) = ws.send(Message::text(subscribe.to_string())).await {
        return Ok(format!("cannot subscribe: {e}"));
    }
    loop {
        let text = match tokio::time::timeout(SILENCE_LIMIT, ws.next()).await {
            Err(_) => return Ok(format!("nothing heard for {SILENCE_LIMIT:?}")),
            Ok(None) => return Ok("the connection ended".into()),
            Ok(Some(Err(e))) => return Ok(format!("connection lost: {e}")),
            Ok(Some(Ok(Message::Text(text)))) => text,
            Ok(Some(Ok(Message::Close(Some(close))))) => {
                return Ok(format!(
                    "closed by the hub: {} {}",
                    u16::from(close.code),
                    close.reason
                ))
            }
            Ok(Some(Ok(Message::Close(None)))) => return Ok("closed by the hub".into()),
            Ok(Some(Ok(_))) => continue, // pings are answered by the library
        };
        let frame: Value = serde_json::from_str(text.as_str()).context("a frame from the hub")?;
        if let Some(e) = frame["epoch"].as_str() {
            *epoch = Some(e.to_string());
        }
        match frame["type"].as_str().unwrap_or_default() {
            "subscribed" => {
                *delay = FIRST_DELAY;
                if cursor.is_none() {
                    *cursor = frame["cursor"].as_u64();
                    save_cursor(&args.cursor_file, *cursor, epoch.as_deref())?;
                }
                eprintln!(
                    "subscribed to {} after seq {}",
                    args.channel, frame["cursor"]
                );
            }
            "notification" => {
                let mut lines = String::new();
                for change in frame["changes"].as_array().into_iter().flatten() {
                    let seq = change["seq"].as_u64().context("a change without seq")?;
                    if cursor.is_some_and(|last| seq <= last) {
                        continue; // printed before
                    }
                    let field = |name: &str| change[name].as_str().unwrap_or("").to_string();
                    lines.push_str(&format!(
                        "{seq}\t{}\t{}\t{}\n",
                        field("change"),
                        field("datetime"),
                        field("loc")
                    ));
                    *cursor = Some(seq);
                }
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(lines.as_bytes())?;
                stdout.flush()?;
                save_cursor(&args.cursor_file, *cursor, epoch.as_deref())?;
            }
            "caught_up" => eprintln!("caught up at seq {}; now live", frame["seq"]),
            "reset" => {
                // `retention`: changes were missed; `ahead` / `epoch`: the hub's log started
                // again. Either way the replay goes on from `oldest`.
                eprintln!("reset ({}): {}", frame["reason"], frame["message"]);
                *cursor = frame["oldest"]
                    .as_u64()
                    .map(|oldest| oldest.saturating_sub(1));
                save_cursor(&args.cursor_file, *cursor, epoch.as_deref())?;
            }
            "error" if frame["code"] == "unavailable" => {
                return Ok(format!("the hub says: {}", frame["message"]))
            }
            "error" => bail!("the hub refused: {} ({})", frame["message"], frame["code"]),
            _ => {} // unsubscribed, or a frame type this example does not know
        }
    }
}

/// The cursor file: `SEQ` or `SEQ EPOCH` on one line.
fn load_cursor(path: &Path) -> anyhow::Result<Option<(u64, Option<String>)>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let mut words = text.split_whitespace();
            let seq = words
                .next()
                .unwrap_or_default()
                .parse()
                .with_context(|| format!("{}: not a seq", path.display()))?;
            Ok(Some((seq, words.next().map(str::to_string))))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Replaces the cursor file whole: a crash leaves the old cursor or the new one.
fn save_cursor(path: &Path, cursor: Option<u64>, epoch: Option<&str>) -> anyhow::Result<()> {
    let Some(seq) = cursor else { return Ok(()) };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file =
        std::fs::File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    match epoch {
        Some(epoch) => writeln!(file, "{seq} {epoch}")?,
        None => writeln!(file, "{seq}")?,
    }
    file.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
}
