//! `changehub publish`: pushes changes from files (or stdin) to a channel, as a source would,
//! or — with `--scan DIR` — what changed in a folder since the last scan ([`super::scan`]).
//!
//! JSON (one change, an array, or `{"changes": […]}`) and NDJSON inputs are cut into requests
//! of at most `--batch` changes and `--max-request-bytes` bytes, sent as NDJSON; a ResourceSync
//! Change List (XML) is sent whole. Every request carries an `Idempotency-Key` derived from
//! the channel, the chunk's place in the input and its bytes, so a retry — after a timeout, a
//! 503 or 504, a lost connection, a hub restart — never appends twice, and neither does running
//! the same publish again within a day (the hub remembers keys for 24 hours). A scan's keys
//! derive from the state it starts from instead (see [`super::scan`]).
//!
//! Requests go one at a time, in input order, unless `--parallel N` (then the order of the
//! chunks in the log is not the input's; a scan always goes in order). Progress goes to
//! stderr: a bar (changes/s, ETA) on a terminal, one line per request otherwise; the end is
//! one summary line. The outcome is a [`PublishError`], whose [`PublishError::exit_code`] is
//! the process's exit status.

use anyhow::{bail, Context};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use sha2::{Digest, Sha256};
use std::io::{IsTerminal, Read};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::http_client;
use super::scan;
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
#[command(
    after_help = "Exit status: 0 every change was accepted; 1 the hub refused a request \
(a wrong token, an unknown channel, an invalid change: 4xx); 2 bad usage or bad input (a \
malformed or unreadable file, a --scan folder that cannot be read, a bad --base-url, a state \
file that cannot be written); 3 the hub stayed unreachable or busy (timeouts, 408, 429, 5xx) \
for --retry-for."
)]
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
    /// Publish what changed in folder DIR since the last scan (created, updated, deleted),
    /// instead of FILEs; needs --base-url and --state.
    #[arg(
        long,
        value_name = "DIR",
        requires_all = ["base_url", "state"],
        conflicts_with_all = ["files", "format"]
    )]
    pub scan: Option<PathBuf>,
    /// With --scan: the URL the folder is served at; a file's loc is this URL joined with its
    /// relative path, each segment percent-encoded.
    #[arg(long, value_name = "URL", requires = "scan")]
    pub base_url: Option<String>,
    /// With --scan: the file that records the last scan (created when missing: then every
    /// file is published as created); rewritten atomically after each accepted request.
    #[arg(long, value_name = "FILE", requires = "scan")]
    pub state: Option<PathBuf>,
    /// Files to publish, in order (none: stdin).
    pub files: Vec<PathBuf>,
}

/// Why a publish failed, by what the user can do about it.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The hub refused a request (4xx: a wrong token, an invalid change) or answered
    /// something unexpected: exit status 1.
    #[error("{0:#}")]
    Refused(anyhow::Error),
    /// Bad flags or bad input: a file that cannot be read or parsed, a folder that cannot be
    /// scanned, a bad base URL, a state file that cannot be written: exit status 2 (as clap's
    /// usage errors).
    #[error("{0:#}")]
    Input(anyhow::Error),
    /// The hub stayed unreachable or busy until `--retry-for` ran out: exit status 3.
    #[error("{0:#}")]
    Unreachable(anyhow::Error),
}

impl PublishError {
    /// The process's exit status for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            PublishError::Refused(_) => 1,
            PublishError::Input(_) => 2,
            PublishError::Unreachable(_) => 3,
        }
    }
}

/// One request's worth of input.
struct Chunk {
    body: Vec<u8>,
    content_type: &'static str,
    changes: usize,
    key: String,
}

/// What a publish reports: a progress bar on a terminal, plain lines otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    done: AtomicU64,
    started: Instant,
}

impl Progress {
    fn new(total: usize) -> Progress {
        let bar = (std::io::stderr().is_terminal() && total > 0).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{elapsed_precise} [{wide_bar}] {human_pos}/{human_len} changes, {rate}, ETA {eta} {msg}",
            ) {
                bar.set_style(style.progress_chars("=> ").with_key(
                    "rate",
                    |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = write!(w, "{:.0}/s", state.per_sec());
                    },
                ));
            }
            bar
        });
        Progress {
            bar,
            total: total as u64,
            done: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// `changes` more were accepted, with these seqs.
    fn accepted(&self, changes: usize, (first, last): (u64, u64)) {
        let sent = self.done.fetch_add(changes as u64, Ordering::Relaxed) + changes as u64;
        match &self.bar {
            Some(bar) => {
                bar.set_message(format!("seqs ..{last}"));
                bar.inc(changes as u64);
            }
            None => {
                let secs = self.started.elapsed().as_secs_f64().max(0.001);
                eprintln!(
                    "published {sent}/{} changes ({:.0}/s); seqs {first}..{last}",
                    self.total,
                    sent as f64 / secs
                );
            }
        }
    }

    /// A line that is not progress (a retry), above the bar when there is one.
    fn note(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Removes the bar and prints the summary.
    fn finish(&self, seqs: &[(u64, u64)]) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        let first = seqs
            .iter()
            .map(|s| s.0)
            .filter(|&s| s > 0)
            .min()
            .unwrap_or(0);
        let last = seqs.iter().map(|s| s.1).max().unwrap_or(0);
        eprintln!(
            "done: {} changes accepted in {} requests, seqs {first}..{last}, {:.1} s",
            self.total,
            seqs.len(),
            self.started.elapsed().as_secs_f64()
        );
    }
}

pub async fn run(args: PublishArgs) -> Result<(), PublishError> {
    check(&args).map_err(PublishError::Input)?;
    let url = format!(
        "{}/channels/{}/changes",
        args.hub.trim_end_matches('/'),
        args.channel
    );
    let client = http_client(Duration::from_secs(60)).map_err(PublishError::Input)?;
    match &args.scan {
        Some(dir) => publish_scan(&args, &client, &url, dir).await,
        None => publish_files(&args, &client, &url).await,
    }
}

fn check(args: &PublishArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        crate::model::valid_channel_name(&args.channel),
        "{:?} is not a channel name ([a-z0-9][a-z0-9._-]{{0,63}})",
        args.channel
    );
    anyhow::ensure!(args.batch >= 1, "--batch must be at least 1");
    anyhow::ensure!(args.parallel >= 1, "--parallel must be at least 1");
    let hub = url::Url::parse(&args.hub).with_context(|| format!("--hub {:?}", args.hub))?;
    anyhow::ensure!(
        matches!(hub.scheme(), "http" | "https"),
        "--hub {:?} must be an http or https URL",
        args.hub
    );
    Ok(())
}

/// Files or stdin: read and cut everything, then send, `--parallel` at a time.
async fn publish_files(
    args: &PublishArgs,
    client: &reqwest::Client,
    url: &str,
) -> Result<(), PublishError> {
    let chunks = read_inputs(args).map_err(PublishError::Input)?;
    let progress = Progress::new(chunks.iter().map(|c| c.changes).sum());
    let seqs: Vec<(u64, u64)> = stream::iter(chunks)
        .map(|chunk| {
            let progress = &progress;
            async move {
                let answer = send(client, url, args, &chunk, progress).await?;
                progress.accepted(chunk.changes, answer);
                Ok::<_, PublishError>(answer)
            }
        })
        .buffered(args.parallel)
        .try_collect()
        .await?;
    progress.finish(&seqs);
    Ok(())
}

/// A folder: compare it with the state, send what changed in order, and record each request
/// in the state once the hub has accepted it.
async fn publish_scan(
    args: &PublishArgs,
    client: &reqwest::Client,
    url: &str,
    dir: &Path,
) -> Result<(), PublishError> {
    let input = PublishError::Input;
    let (Some(base), Some(state_path)) = (&args.base_url, &args.state) else {
        return Err(input(anyhow::anyhow!(
            "--scan needs --base-url and --state"
        )));
    };
    let base = scan::parse_base(base).map_err(input)?;
    let mut state = scan::load_state(state_path, &args.channel, &base).map_err(input)?;
    scan::check_writable(state_path).map_err(input)?;
    let found = {
        let hashed = Arc::new(AtomicU64::new(0));
        let (folder, base, state, skip, counter) = (
            dir.to_path_buf(),
            base.clone(),
            state.clone(),
            state_path.clone(),
            hashed.clone(),
        );
        let mut task = tokio::task::spawn_blocking(move || {
            scan::scan(&folder, &base, &state, Some(&skip), &counter)
        });
        // On a terminal, a spinner while the folder is read: hashing can take a while.
        let spinner = std::io::stderr().is_terminal().then(|| {
            let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template("{spinner} scanning {prefix}: {msg}") {
                spinner.set_style(style);
            }
            spinner.set_prefix(dir.display().to_string());
            spinner.enable_steady_tick(Duration::from_millis(100));
            spinner
        });
        let found = loop {
            tokio::select! {
                found = &mut task => break found,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    if let Some(spinner) = &spinner {
                        spinner.set_message(format!(
                            "{} files hashed",
                            hashed.load(Ordering::Relaxed)
                        ));
                    }
                }
            }
        };
        if let Some(spinner) = spinner {
            spinner.finish_and_clear();
        }
        found.map_err(|e| input(e.into()))?.map_err(input)?
    };
    eprintln!(
        "scanned {}: {} files, {} changes since the last scan",
        dir.display(),
        found.files,
        found.pending.len()
    );
    for (path, record) in &found.touched {
        state.files.insert(path.clone(), record.clone());
    }
    if found.pending.is_empty() {
        if !found.touched.is_empty() {
            scan::save_state(state_path, &state).map_err(input)?;
        }
        eprintln!("done: nothing to publish");
        return Ok(());
    }
    let lines: Vec<&[u8]> = found.pending.iter().map(|p| p.line.as_slice()).collect();
    let ranges = split(args, &dir.display().to_string(), &lines).map_err(input)?;
    let progress = Progress::new(found.pending.len());
    let mut seqs = Vec::new();
    for range in ranges {
        let body = ndjson(&lines[range.clone()]);
        let chunk = Chunk {
            key: scan::chain_key(&args.channel, &state.chain, &body),
            body,
            content_type: "application/x-ndjson",
            changes: range.len(),
        };
        let answer = send(client, url, args, &chunk, &progress).await?;
        scan::record(&mut state, &found.pending[range], &chunk.key);
        scan::save_state(state_path, &state).map_err(input)?;
        progress.accepted(chunk.changes, answer);
        seqs.push(answer);
    }
    progress.finish(&seqs);
    Ok(())
}

/// Every input (files in order, or stdin), cut into chunks.
fn read_inputs(args: &PublishArgs) -> anyhow::Result<Vec<Chunk>> {
    let mut chunks = Vec::new();
    if args.files.is_empty() {
        let mut input = Vec::new();
        std::io::stdin()
            .read_to_end(&mut input)
            .context("reading stdin")?;
        let format = args.format.unwrap_or(InputFormat::Ndjson);
        cut(args, "-", format, &input, &mut chunks)?;
    } else {
        for file in &args.files {
            let input =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let format = match args.format {
                Some(f) => f,
                None => format_of(file)?,
            };
            cut(
                args,
                &file.display().to_string(),
                format,
                &input,
                &mut chunks,
            )?;
        }
    }
    Ok(chunks)
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
    let refs: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
    for range in split(args, name, &refs)? {
        let body = ndjson(&refs[range.clone()]);
        let key = key(&args.channel, chunks.len(), &body);
        chunks.push(Chunk {
            body,
            content_type: "application/x-ndjson",
            changes: range.len(),
            key,
        });
    }
    Ok(())
}

/// Cuts `lines` into runs of at most `--batch` lines and `--max-request-bytes` bytes (each
/// line with its newline).
fn split(args: &PublishArgs, name: &str, lines: &[&[u8]]) -> anyhow::Result<Vec<Range<usize>>> {
    let mut ranges = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, line) in lines.iter().enumerate() {
        anyhow::ensure!(
            line.len() < args.max_request_bytes,
            "{name}: change {i} alone is larger than --max-request-bytes ({})",
            args.max_request_bytes
        );
        if i - start == args.batch || bytes + line.len() + 1 > args.max_request_bytes {
            ranges.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += line.len() + 1;
    }
    if start < lines.len() {
        ranges.push(start..lines.len());
    }
    Ok(ranges)
}

/// Lines as one NDJSON body.
fn ndjson(lines: &[&[u8]]) -> Vec<u8> {
    let mut body = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for line in lines {
        body.extend_from_slice(line);
        body.push(b'\n');
    }
    body
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
    progress: &Progress,
) -> Result<(u64, u64), PublishError> {
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
                let answer: serde_json::Value = resp.json().await.map_err(|e| {
                    PublishError::Refused(anyhow::anyhow!(
                        "{url}: the hub's answer is not the expected JSON: {e}"
                    ))
                })?;
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
                    return Err(PublishError::Refused(anyhow::anyhow!(
                        "{url} refused a request: {status}: {}{hint}",
                        reason.trim()
                    )));
                }
                format!("{status}: {}", reason.trim())
            }
            Err(e) => format!("{:#}", anyhow::Error::from(e)),
        };
        if Instant::now() >= deadline {
            return Err(PublishError::Unreachable(anyhow::anyhow!(
                "{url}: giving up after retrying for {:?}: {why}",
                args.retry_for
            )));
        }
        let delay = Duration::from_millis(backoff.delay().as_millis() as u64);
        progress.note(&format!(
            "retrying in {}: {why}",
            humantime::format_duration(delay)
        ));
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
            scan: None,
            base_url: None,
            state: None,
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

    /// What a scan's rerun rests on: cutting what is left after the first k requests gives
    /// the same requests as the rest of the first cut.
    #[test]
    fn the_rest_of_an_input_is_cut_as_before() {
        let lines: Vec<Vec<u8>> = (0..200).map(|i| vec![b'x'; 10 + (i * 7) % 50]).collect();
        let refs: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
        for (batch, max) in [(5, 1 << 20), (100, 300), (7, 200)] {
            let all = split(&args(batch, max), "x", &refs).unwrap();
            for k in 0..all.len() {
                let start = all[k].start;
                let rest: Vec<_> = split(&args(batch, max), "x", &refs[start..])
                    .unwrap()
                    .into_iter()
                    .map(|r| r.start + start..r.end + start)
                    .collect();
                assert_eq!(rest, all[k..], "batch {batch}, max {max}, from {k}");
            }
        }
    }
}
