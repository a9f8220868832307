//! `changehub publish`: pushes changes from files (or stdin) to a channel, as a source would.
//!
//! JSON (one change, an array, or `{"changes": […]}`) and NDJSON inputs are cut into requests
//! of at most `--batch` changes and `--max-request-bytes` bytes, sent as NDJSON; a ResourceSync
//! Change List (XML) is sent whole. Every request carries an `Idempotency-Key` derived from
//! the channel, the chunk's place in the input and its bytes, so a retry — after a timeout, a
//! 503 or 504, a lost connection, a hub restart — never appends twice, and neither does running
//! the same publish again within a day (the hub remembers keys for 24 hours).
//!
//! Requests go one at a time, in input order, unless `--parallel N` (then the order of the
//! chunks in the log is not the input's). Progress goes to stderr; the end is one summary
//! line. Exit status: 0 when everything was accepted; 1 otherwise, with the hub's reason.

use anyhow::{bail, Context};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::http_client;
use crate::retry::Reconnect;

/// Input formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InputFormat {
    Json,
    Ndjson,
    Xml,
}

/// Flags of `changehub publish`.
#[derive(Debug, Clone, clap::Args)]
pub struct PublishArgs {
    /// The hub's base URL.
    #[arg(
        long,
        env = "CHANGEHUB_PUBLISH_HUB",
        default_value = "http://127.0.0.1:8080"
    )]
    pub hub: String,
    /// The channel to publish to.
    #[arg(long, env = "CHANGEHUB_PUBLISH_CHANNEL")]
    pub channel: String,
    /// A publisher token of the channel.
    #[arg(long, env = "CHANGEHUB_PUBLISH_TOKEN", hide_env_values = true)]
    pub token: String,
    /// The input format (default: from each file's extension — .json, .ndjson/.jsonl, .xml —
    /// and NDJSON for stdin).
    #[arg(long, value_enum)]
    pub format: Option<InputFormat>,
    /// Most changes in one request (default 5000).
    #[arg(long, default_value_t = 5000)]
    pub batch: usize,
    /// Most bytes in one request; keep it under the hub's --max-body (default 4194304).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_request_bytes: usize,
    /// Requests in flight at once (default 1, which keeps the input's order in the log).
    #[arg(long, default_value_t = 1)]
    pub parallel: usize,
    /// How long one request is retried (timeouts, 429, 5xx, the hub unreachable) before
    /// giving up (default 10m).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub retry_for: Duration,
    /// Files to publish, in order (none: stdin).
    pub files: Vec<PathBuf>,
}

/// One request's worth of input.
struct Chunk {
    body: Vec<u8>,
    content_type: &'static str,
    changes: usize,
    key: String,
}

pub async fn run(args: PublishArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        crate::model::valid_channel_name(&args.channel),
        "{:?} is not a channel name ([a-z0-9][a-z0-9._-]{{0,63}})",
        args.channel
    );
    anyhow::ensure!(args.batch >= 1, "--batch must be at least 1");
    anyhow::ensure!(args.parallel >= 1, "--parallel must be at least 1");
    let url = format!(
        "{}/channels/{}/changes",
        args.hub.trim_end_matches('/'),
        args.channel
    );
    let mut chunks = Vec::new();
    if args.files.is_empty() {
        let mut input = Vec::new();
        std::io::stdin()
            .read_to_end(&mut input)
            .context("reading stdin")?;
        let format = args.format.unwrap_or(InputFormat::Ndjson);
        cut(&args, "-", format, &input, &mut chunks)?;
    } else {
        for file in &args.files {
            let input =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let format = match args.format {
                Some(f) => f,
                None => format_of(file)?,
            };
            cut(
                &args,
                &file.display().to_string(),
                format,
                &input,
                &mut chunks,
            )?;
        }
    }
    let total: usize = chunks.iter().map(|c| c.changes).sum();
    let client = http_client(Duration::from_secs(60))?;
    let started = Instant::now();
    let done = Arc::new(AtomicU64::new(0));
    let seqs: Vec<(u64, u64)> = stream::iter(chunks)
        .map(|chunk| {
            let (client, url, args, done) = (&client, &url, &args, done.clone());
            async move {
                let answer = send(client, url, args, &chunk).await?;
                let sent =
                    done.fetch_add(chunk.changes as u64, Ordering::Relaxed) + chunk.changes as u64;
                let secs = started.elapsed().as_secs_f64().max(0.001);
                eprintln!(
                    "published {sent}/{total} changes ({:.0}/s); seqs {}..{}",
                    sent as f64 / secs,
                    answer.0,
                    answer.1
                );
                Ok::<_, anyhow::Error>(answer)
            }
        })
        .buffered(args.parallel)
        .try_collect()
        .await?;
    let first = seqs
        .iter()
        .map(|s| s.0)
        .filter(|&s| s > 0)
        .min()
        .unwrap_or(0);
    let last = seqs.iter().map(|s| s.1).max().unwrap_or(0);
    eprintln!(
        "done: {total} changes accepted in {} requests, seqs {first}..{last}, {:.1} s",
        seqs.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn format_of(file: &std::path::Path) -> anyhow::Result<InputFormat> {
    match file.extension().and_then(|e| e.to_str()) {
        Some("json") => Ok(InputFormat::Json),
        Some("ndjson" | "jsonl") => Ok(InputFormat::Ndjson),
        Some("xml") => Ok(InputFormat::Xml),
        _ => bail!(
            "{}: cannot tell its format from the extension; give --format json, ndjson or xml",
            file.display()
        ),
    }
}

/// Cuts one input into chunks.
fn cut(
    args: &PublishArgs,
    name: &str,
    format: InputFormat,
    input: &[u8],
    chunks: &mut Vec<Chunk>,
) -> anyhow::Result<()> {
    let lines: Vec<Vec<u8>> = match format {
        InputFormat::Xml => {
            anyhow::ensure!(
                input.len() <= args.max_request_bytes,
                "{name}: a Change List of {} bytes is sent whole and is larger than \
                 --max-request-bytes ({}); send it as NDJSON to have it split",
                input.len(),
                args.max_request_bytes
            );
            let key = key(&args.channel, chunks.len(), input);
            chunks.push(Chunk {
                body: input.to_vec(),
                content_type: "application/xml",
                changes: input.windows(5).filter(|w| w == b"<url>").count(),
                key,
            });
            return Ok(());
        }
        InputFormat::Ndjson => {
            let text = std::str::from_utf8(input)
                .with_context(|| format!("{name}: NDJSON must be UTF-8"))?;
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(|l| l.as_bytes().to_vec())
                .collect()
        }
        InputFormat::Json => {
            let value: serde_json::Value =
                serde_json::from_slice(input).with_context(|| format!("{name}: not JSON"))?;
            let items = match value {
                serde_json::Value::Array(items) => items,
                serde_json::Value::Object(mut map) if map.contains_key("changes") => {
                    match map.remove("changes") {
                        Some(serde_json::Value::Array(items)) => items,
                        _ => bail!("{name}: \"changes\" must be an array"),
                    }
                }
                one @ serde_json::Value::Object(_) => vec![one],
                _ => {
                    bail!("{name}: expected a change, an array of changes or {{\"changes\": […]}}")
                }
            };
            items
                .iter()
                .map(|c| serde_json::to_vec(c).map_err(anyhow::Error::from))
                .collect::<anyhow::Result<_>>()?
        }
    };
    let mut body = Vec::new();
    let mut count = 0;
    for (i, line) in lines.iter().enumerate() {
        anyhow::ensure!(
            line.len() < args.max_request_bytes,
            "{name}: change {i} alone is larger than --max-request-bytes ({})",
            args.max_request_bytes
        );
        if count == args.batch || body.len() + line.len() + 1 > args.max_request_bytes {
            push_chunk(args, chunks, std::mem::take(&mut body), count);
            count = 0;
        }
        body.extend_from_slice(line);
        body.push(b'\n');
        count += 1;
    }
    if count > 0 {
        push_chunk(args, chunks, body, count);
    }
    Ok(())
}

fn push_chunk(args: &PublishArgs, chunks: &mut Vec<Chunk>, body: Vec<u8>, changes: usize) {
    let key = key(&args.channel, chunks.len(), &body);
    chunks.push(Chunk {
        body,
        content_type: "application/x-ndjson",
        changes,
        key,
    });
}

/// The idempotency key of chunk `index` with `body`: the same input gives the same keys.
fn key(channel: &str, index: usize, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(channel.as_bytes());
    h.update([0]);
    h.update(index.to_string().as_bytes());
    h.update([0]);
    h.update(body);
    format!("publish-{}", &hex::encode(h.finalize())[..40])
}

/// Sends one chunk until it is accepted, refused, or retrying runs out of time; returns the
/// seqs the hub gave.
async fn send(
    client: &reqwest::Client,
    url: &str,
    args: &PublishArgs,
    chunk: &Chunk,
) -> anyhow::Result<(u64, u64)> {
    let deadline = Instant::now() + args.retry_for;
    let mut backoff = Reconnect::new(Duration::from_millis(200), Duration::from_secs(10));
    loop {
        let why = match client
            .post(url)
            .bearer_auth(&args.token)
            .header("content-type", chunk.content_type)
            .header("idempotency-key", &chunk.key)
            .body(chunk.body.clone())
            .send()
            .await
        {
            Ok(resp) if resp.status().is_success() => {
                let answer: serde_json::Value = resp
                    .json()
                    .await
                    .context("the hub's answer is not the expected JSON")?;
                return Ok((
                    answer["first"].as_u64().unwrap_or(0),
                    answer["last"].as_u64().unwrap_or(0),
                ));
            }
            Ok(resp) => {
                let status = resp.status();
                let reason = resp.text().await.unwrap_or_default();
                let retryable = status.is_server_error()
                    || status == reqwest::StatusCode::TOO_MANY_REQUESTS
                    || status == reqwest::StatusCode::REQUEST_TIMEOUT;
                if !retryable {
                    let hint = if status == reqwest::StatusCode::PAYLOAD_TOO_LARGE {
                        " (lower --max-request-bytes under the hub's --max-body)"
                    } else {
                        ""
                    };
                    bail!("{url} refused a request: {status}: {}{hint}", reason.trim());
                }
                format!("{status}: {}", reason.trim())
            }
            Err(e) => format!("{e}"),
        };
        if Instant::now() >= deadline {
            bail!(
                "{url}: giving up after retrying for {:?}: {why}",
                args.retry_for
            );
        }
        let delay = backoff.delay();
        eprintln!("retrying in {delay:?}: {why}");
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(batch: usize, max: usize) -> PublishArgs {
        PublishArgs {
            hub: "http://127.0.0.1:8080".into(),
            channel: "news".into(),
            token: "t".into(),
            format: None,
            batch,
            max_request_bytes: max,
            parallel: 1,
            retry_for: Duration::from_secs(1),
            files: vec![],
        }
    }

    #[test]
    fn inputs_are_cut_by_count_and_bytes_with_stable_keys() {
        let lines: String = (0..10)
            .map(|i| format!("{{\"loc\":\"http://e.com/{i}\",\"change\":\"created\"}}\n"))
            .collect();
        let mut chunks = Vec::new();
        cut(
            &args(4, 1 << 20),
            "x",
            InputFormat::Ndjson,
            lines.as_bytes(),
            &mut chunks,
        )
        .unwrap();
        assert_eq!(
            chunks.iter().map(|c| c.changes).collect::<Vec<_>>(),
            [4, 4, 2]
        );
        let mut again = Vec::new();
        cut(
            &args(4, 1 << 20),
            "x",
            InputFormat::Ndjson,
            lines.as_bytes(),
            &mut again,
        )
        .unwrap();
        assert_eq!(
            chunks.iter().map(|c| &c.key).collect::<Vec<_>>(),
            again.iter().map(|c| &c.key).collect::<Vec<_>>()
        );
        let mut small = Vec::new();
        cut(
            &args(100, 100),
            "x",
            InputFormat::Ndjson,
            lines.as_bytes(),
            &mut small,
        )
        .unwrap();
        assert!(small.iter().all(|c| c.body.len() <= 100));
        assert_eq!(small.iter().map(|c| c.changes).sum::<usize>(), 10);
        let json = format!("[{}]", lines.trim().replace('\n', ","));
        let mut from_json = Vec::new();
        cut(
            &args(4, 1 << 20),
            "x",
            InputFormat::Json,
            json.as_bytes(),
            &mut from_json,
        )
        .unwrap();
        assert_eq!(from_json.iter().map(|c| c.changes).sum::<usize>(), 10);
        assert!(cut(
            &args(4, 10),
            "x",
            InputFormat::Ndjson,
            lines.as_bytes(),
            &mut Vec::new()
        )
        .is_err());
        assert!(cut(
            &args(4, 100),
            "x",
            InputFormat::Json,
            b"nope",
            &mut Vec::new()
        )
        .is_err());
    }
}
