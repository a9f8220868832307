//! A source: pushes `COUNT` changes to a channel in one request with an `Idempotency-Key`, and
//! prints the seqs the hub gave them from its 202 answer (`{"accepted":N,"first":F,"last":L}`).
//!
//! The body is made from the key alone, so a request sent again with the same key (after a
//! timeout, a 503 or a lost connection) is stored once: the hub answers the retry with the
//! seqs of the first time and `Idempotent-Replayed: true`. The example retries that way.
//!
//! Against a hub started as in the README:
//!
//! ```text
//! cargo run --release -- serve --channel news=secret-token --allow-private-callbacks
//! cargo run --example source -- http://127.0.0.1:8080 news secret-token 5
//! cargo run --example source -- http://127.0.0.1:8080 news secret-token 5 --key run-1   # twice
//! ```
//!
//! For files, folders and bodies of any size, use `changehub publish`.

use anyhow::{bail, Context};
use clap::Parser;
use serde_json::{json, Value};
use std::time::Duration;

#[derive(Parser)]
struct Args {
    /// Base URL of the hub, e.g. http://127.0.0.1:8080
    hub: String,
    channel: String,
    /// Publisher token of the channel
    token: String,
    /// How many changes to push
    #[arg(default_value_t = 3)]
    count: usize,
    /// Idempotency-Key of the request (default: a random one)
    #[arg(long)]
    key: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let key = args
        .key
        .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()));
    let url = format!(
        "{}/channels/{}/changes",
        args.hub.trim_end_matches('/'),
        args.channel
    );
    let changes: Vec<Value> = (0..args.count)
        .map(|i| json!({"loc": format!("http://example.com/{key}/{i}"), "change": "created"}))
        .collect();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    for attempt in 1..=5 {
        let sent = client
            .post(&url)
            .bearer_auth(&args.token)
            .header("Idempotency-Key", &key)
            .json(&changes)
            .send()
            .await;
        match sent {
            Ok(resp) if resp.status() == reqwest::StatusCode::ACCEPTED => {
                let replayed = resp
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v == "true");
                let answer: Value = resp.json().await.context("the 202 answer")?;
                println!(
                    "accepted {} changes: seq {}..={}{}",
                    answer["accepted"],
                    answer["first"],
                    answer["last"],
                    if replayed { " (replayed)" } else { "" }
                );
                return Ok(());
            }
            // Busy or down for a moment: the same key and body again.
            Ok(resp) if resp.status().is_server_error() || resp.status() == 429 => {
                eprintln!("attempt {attempt}: {}; retrying", resp.status())
            }
            Ok(resp) => bail!("refused: {} {}", resp.status(), resp.text().await?),
            Err(e) => eprintln!("attempt {attempt}: {e}; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(attempt)).await;
    }
    bail!("no answer from {url}")
}
