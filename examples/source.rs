//! A source: pushes `COUNT` changes to a channel of a changehub hub, in batches, and prints the
//! seq ranges the hub acknowledged.
//!
//! Every request carries its own `Idempotency-Key`. A request that fails with 503 (the store is
//! busy), 429, a connection error or a timeout is sent again with the *same* key and body, so a
//! batch that was in fact stored before the answer got lost is not stored twice: the hub
//! answers the retry with the seqs it gave the first time (and `Idempotent-Replayed: true`).
//!
//! Run it against a hub started as in the README:
//!
//! ```text
//! cargo run --release -- serve --channel news=secret-token --allow-private-callbacks
//! cargo run --example source -- http://127.0.0.1:8080 news secret-token 2500
//! cargo run --example source -- http://127.0.0.1:8080 news secret-token 2500 --batch 100
//! ```
//!
//! Each change is `http://example.com/items/{run}/{i}` with a `created`/`updated`/`deleted`
//! change, the current time, and the `hash`, `length` and `type` of a small made-up text.

use anyhow::{bail, Context};
use clap::Parser;
use rand::RngCore;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::time::Duration;

#[derive(Parser)]
#[command(about = "Push changes to a changehub channel")]
struct Args {
    /// Base URL of the hub, e.g. http://127.0.0.1:8080
    hub: String,
    /// Channel name
    channel: String,
    /// Publisher token of the channel (`--channel NAME=TOKEN` of the hub)
    token: String,
    /// How many changes to push
    count: usize,
    /// Changes per request
    #[arg(long, default_value_t = 500)]
    batch: usize,
    /// Give up on a request after this many attempts
    #[arg(long, default_value_t = 8)]
    attempts: u32,
}

/// What the hub answered to one accepted request.
struct Ack {
    accepted: u64,
    first: u64,
    last: u64,
    replayed: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.batch > 0, "--batch must be at least 1");
    let url = format!(
        "{}/channels/{}/changes",
        args.hub.trim_end_matches('/'),
        args.channel
    );
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    // One run id, so that locs of different runs differ and keys never collide across runs.
    let run = random_hex(4);

    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut total = 0;
    let mut sent = 0;
    let mut request_no = 0;
    while sent < args.count {
        let n = args.batch.min(args.count - sent);
        let changes: Vec<Value> = (sent..sent + n).map(|i| change(&run, i)).collect();
        let body = serde_json::to_vec(&changes)?;
        let key = format!("{run}-{request_no}-{}", random_hex(8));
        let ack = push(&client, &url, &args.token, &key, body, args.attempts)
            .await
            .with_context(|| format!("request {request_no} (changes {sent}..{})", sent + n))?;
        println!(
            "request {request_no}: {} changes acknowledged as seq {}..={}{}",
            ack.accepted,
            ack.first,
            ack.last,
            if ack.replayed {
                " (replayed: stored by an earlier attempt)"
            } else {
                ""
            }
        );
        total += ack.accepted;
        match ranges.last_mut() {
            Some((_, last)) if *last + 1 == ack.first => *last = ack.last,
            _ => ranges.push((ack.first, ack.last)),
        }
        sent += n;
        request_no += 1;
    }
    let ranges: Vec<String> = ranges.iter().map(|(f, l)| format!("{f}..={l}")).collect();
    println!(
        "done: {total} changes acknowledged in {request_no} requests; seq ranges: {}",
        ranges.join(", ")
    );
    Ok(())
}

/// Sends one request, retrying on 429/503 and connection errors with the same key and body.
async fn push(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    key: &str,
    body: Vec<u8>,
    attempts: u32,
) -> anyhow::Result<Ack> {
    let mut delay = Duration::from_millis(200);
    for attempt in 1..=attempts {
        let result = client
            .post(url)
            .bearer_auth(token)
            .header("Content-Type", "application/json")
            .header("Idempotency-Key", key)
            .body(body.clone())
            .send()
            .await;
        let wait = match result {
            Ok(resp) if resp.status() == reqwest::StatusCode::ACCEPTED => {
                let replayed = resp
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v == "true");
                let v: Value = resp.json().await.context("reading the 202 answer")?;
                let field = |name: &str| {
                    v[name]
                        .as_u64()
                        .with_context(|| format!("answer without {name:?}: {v}"))
                };
                return Ok(Ack {
                    accepted: field("accepted")?,
                    first: field("first")?,
                    last: field("last")?,
                    replayed,
                });
            }
            Ok(resp)
                if resp.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE
                    || resp.status() == reqwest::StatusCode::TOO_MANY_REQUESTS =>
            {
                let retry_after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                eprintln!(
                    "attempt {attempt}: hub answered {}; retrying with the same Idempotency-Key",
                    resp.status()
                );
                retry_after.unwrap_or(delay)
            }
            Ok(resp) => {
                let status = resp.status();
                let text = resp.text().await.unwrap_or_default();
                bail!("hub answered {status}: {}", text.trim());
            }
            Err(e) => {
                eprintln!(
                    "attempt {attempt}: {}; retrying with the same Idempotency-Key",
                    chain(&e)
                );
                delay
            }
        };
        if attempt < attempts {
            tokio::time::sleep(wait).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }
    bail!("no answer after {attempts} attempts")
}

/// The `i`-th change of this run.
fn change(run: &str, i: usize) -> Value {
    let kind = match i % 10 {
        0..=5 => "created",
        6..=8 => "updated",
        _ => "deleted",
    };
    let content = format!("item {i} of run {run}\n");
    let digest = hex::encode(Sha256::digest(content.as_bytes()));
    let now = changehub::model::format_datetime(time::OffsetDateTime::now_utc());
    let mut c = json!({
        "loc": format!("http://example.com/items/{run}/{i}"),
        "change": kind,
        "datetime": now,
    });
    if kind != "deleted" {
        c["hash"] = json!(format!("sha-256:{digest}"));
        c["length"] = json!(content.len());
        c["type"] = json!("text/plain");
    }
    c
}

/// An error with its causes (reqwest's own message leaves out why the connection failed).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}
