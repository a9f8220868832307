//! A follower: reads a channel's server-sent events (`GET /channels/{name}/events?since=SEQ`)
//! and prints every change once, in seq order, as `seq<TAB>change<TAB>loc`. Its cursor — the
//! last seq printed, and the epoch of the log it belongs to — is kept in a file, rewritten after
//! each notification, so a restart resumes right after it: nothing missed, nothing twice (but
//! killed between printing and saving, it prints that notification again). When
//! the stream ends (the hub restarts, the network fails) it reconnects from the cursor. With
//! `--count N` it stops after N changes.
//!
//! Against a hub started as in the README:
//!
//! ```text
//! cargo run --release -- serve --channel news=secret-token --allow-private-callbacks
//! cargo run --example follow -- http://127.0.0.1:8080 news news.cursor
//! cargo run --example source -- http://127.0.0.1:8080 news secret-token 5   # elsewhere
//! ```
//!
//! Stop it, push more, start it again: it prints only what it had not. The websocket (`GET /ws`)
//! carries the same frames; `changehub tail` is a client of it.

use clap::Parser;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
struct Args {
    /// Base URL of the hub, e.g. http://127.0.0.1:8080
    hub: String,
    channel: String,
    /// The cursor file (`SEQ EPOCH`); without it, everything retained is printed
    cursor_file: PathBuf,
    /// Stop after printing this many changes
    #[arg(long)]
    count: Option<usize>,
}

struct Cursor {
    seq: u64,
    epoch: String,
    left: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let saved = std::fs::read_to_string(&args.cursor_file).unwrap_or_default();
    let mut words = saved.split_whitespace();
    let mut cursor = Cursor {
        seq: words.next().map_or(Ok(0), str::parse)?,
        epoch: words.next().unwrap_or_default().to_string(),
        left: args.count.unwrap_or(usize::MAX),
    };
    while cursor.left > 0 {
        if let Err(e) = follow(&args, &mut cursor).await {
            let status = e.downcast_ref::<reqwest::Error>().and_then(|e| e.status());
            if status.is_some_and(|s| s.is_client_error()) {
                return Err(e); // no such channel, or a private one
            }
            eprintln!("{e:#}; reconnecting in 1 s");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    Ok(())
}

/// One connection, from the cursor, until the stream ends or `--count` is reached.
async fn follow(args: &Args, cursor: &mut Cursor) -> anyhow::Result<()> {
    let (hub, channel) = (args.hub.trim_end_matches('/'), &args.channel);
    let mut url = format!("{hub}/channels/{channel}/events?since={}", cursor.seq);
    if !cursor.epoch.is_empty() {
        url = format!("{url}&epoch={}", cursor.epoch); // a cursor of another log gets a reset
    }
    let mut stream = reqwest::get(url).await?.error_for_status()?;
    let (mut buf, mut data) = (Vec::new(), String::new());
    while let Some(chunk) = stream.chunk().await? {
        buf.extend_from_slice(&chunk);
        // Events are lines `field: value`, ended by an empty line; `data` is a JSON frame.
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line = String::from_utf8(buf.drain(..=end).collect())?;
            match line.trim_end().split_once(':') {
                Some(("data", value)) => data.push_str(value.trim_start()),
                Some(_) => {}
                None if line.trim_end().is_empty() && !data.is_empty() => {
                    on_frame(serde_json::from_str(&std::mem::take(&mut data))?, cursor);
                    save(cursor, &args.cursor_file)?;
                    if cursor.left == 0 {
                        return Ok(());
                    }
                }
                None => {}
            }
        }
    }
    anyhow::bail!("the stream ended")
}

fn on_frame(frame: Value, cursor: &mut Cursor) {
    if let Some(epoch) = frame["epoch"].as_str() {
        cursor.epoch = epoch.to_string();
    }
    match frame["type"].as_str() {
        Some("notification") => {
            for change in frame["changes"].as_array().into_iter().flatten() {
                let seq = change["seq"].as_u64().unwrap_or_default();
                if seq > cursor.seq && cursor.left > 0 {
                    let field = |name| change[name].as_str().unwrap_or_default();
                    println!("{seq}\t{}\t{}", field("change"), field("loc"));
                    (cursor.seq, cursor.left) = (seq, cursor.left - 1);
                }
            }
        }
        // The cursor is older than retention, or of a log that started again: go on from `oldest`.
        Some("reset") => {
            eprintln!("reset: {}", frame["message"]);
            cursor.seq = frame["oldest"].as_u64().unwrap_or(1) - 1;
        }
        _ => eprintln!("{frame}"),
    }
}

/// Replaces the file whole (a temporary file renamed over it): a crash leaves old or new.
fn save(cursor: &Cursor, path: &PathBuf) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{} {}\n", cursor.seq, cursor.epoch))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(tmp, path)
}
