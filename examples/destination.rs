//! A destination: a WebSub subscriber to one channel of a changehub hub, that verifies every
//! notification's signature, notices gaps and catches up from the hub's log.
//!
//! What it does:
//! 1. Discovers the hub URL and the topic from the channel's Capability List
//!    (`{hub}/channels/{channel}/capabilitylist.xml`: `rs:ln rel="hub"` and the `changelist`).
//! 2. Starts a callback server on `127.0.0.1:{port}` (`0`: any free port).
//! 3. Subscribes with a random `hub.secret` and answers the hub's verification GET by echoing
//!    `hub.challenge` (a `hub.mode=denied` is reported and ends the program).
//! 4. For each delivery: checks `X-Hub-Signature` with [`changehub::model::signature::verify`]
//!    (a delivery with a missing or wrong signature is acknowledged but ignored, as WebSub asks;
//!    the next notification then shows a gap and the changes are fetched from the log), parses
//!    the Change List with [`changehub::resourcesync::parse_change_list`], and when its first seq
//!    (`X-Changehub-First`) is not the last seq seen + 1, follows
//!    `GET {hub}/channels/{channel}/changes?after=LAST` and its `rs:ln rel="next"` pages.
//! 5. Prints every change once, in seq order, as `seq<TAB>change<TAB>loc` on stdout (progress
//!    and warnings go to stderr), renews the subscription before its lease ends, and on Ctrl-C
//!    unsubscribes (answering that verification too) before it exits.
//!
//! Run it against a hub started as in the README (the hub must allow loopback callbacks):
//!
//! ```text
//! cargo run --release -- serve --channel news=secret-token --allow-private-callbacks
//! cargo run --example destination -- http://127.0.0.1:8080 news            # live changes only
//! cargo run --example destination -- http://127.0.0.1:8080 news 9000 --since 0   # replay first
//! cargo run --example destination -- http://127.0.0.1:8080 news --drop-every 2   # see catch-up
//! cargo run --example source -- http://127.0.0.1:8080 news secret-token 2500     # elsewhere
//! ```

use anyhow::{bail, Context};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use changehub::model::signature as signing;
use changehub::resourcesync::{self, Document, Limits, ParsedEntry};
use clap::Parser;
use rand::RngCore;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

#[derive(Parser)]
#[command(about = "Subscribe to a changehub channel and print its changes")]
struct Args {
    /// Base URL of the hub, e.g. http://127.0.0.1:8080
    hub: String,
    /// Channel name
    channel: String,
    /// Port of the callback server on 127.0.0.1 (0: any free port)
    #[arg(default_value_t = 0)]
    port: u16,
    /// Start by catching up on every change after this seq (0: everything retained).
    /// Without it, only changes published after the subscription are printed.
    #[arg(long)]
    since: Option<u64>,
    /// Lease to ask for, in seconds (the hub clamps it; default: the hub's default)
    #[arg(long)]
    lease_seconds: Option<u64>,
    /// Demo of gap detection: acknowledge but drop every Nth delivery, as if it were lost;
    /// the next notification then shows a gap and the changes are fetched from the log.
    #[arg(long, default_value_t = 0)]
    drop_every: u64,
}

/// What the callback server tells the main task about verification requests.
#[derive(Debug)]
enum Verification {
    Confirmed { mode: String, lease_seconds: u64 },
    Denied { reason: String },
}

/// A delivered notification whose signature checked out.
struct Notification {
    first: u64,
    last: u64,
    entries: Vec<ParsedEntry>,
}

/// State of the callback server.
struct Callback {
    topic: String,
    channel: String,
    secret: String,
    /// The mode we expect the hub to verify ("subscribe" / "unsubscribe"), if any.
    intent: Mutex<Option<&'static str>>,
    verifications: mpsc::UnboundedSender<Verification>,
    notifications: mpsc::UnboundedSender<Notification>,
    drop_every: u64,
    deliveries: AtomicU64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let base = args.hub.trim_end_matches('/').to_string();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;

    let (hub_url, topic) = discover(&client, &base, &args.channel).await?;
    eprintln!("hub {hub_url}, topic {topic}");

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .context("cannot bind the callback server")?;
    let callback_url = format!("http://{}/callback", listener.local_addr()?);
    let (verify_tx, mut verify_rx) = mpsc::unbounded_channel();
    let (notify_tx, notify_rx) = mpsc::unbounded_channel();
    let state = Arc::new(Callback {
        topic: topic.clone(),
        channel: args.channel.clone(),
        secret: random_hex(24),
        intent: Mutex::new(None),
        verifications: verify_tx,
        notifications: notify_tx,
        drop_every: args.drop_every,
        deliveries: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/callback", get(verification).post(delivery))
        .layer(DefaultBodyLimit::max(64 << 20))
        .with_state(state.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await
    });
    eprintln!("callback server at {callback_url}");

    // The changes endpoint lives beside the topic: {public_url}/channels/{name}/changes.
    let changes_url = topic
        .strip_suffix("/changelist.xml")
        .map(|t| format!("{t}/changes"))
        .unwrap_or_else(|| format!("{base}/channels/{}/changes", args.channel));
    let last_seen = Arc::new(AtomicU64::new(0));
    let printed = Arc::new(AtomicU64::new(0));
    let processor = tokio::spawn(process(
        notify_rx,
        client.clone(),
        changes_url,
        args.since,
        last_seen.clone(),
        printed.clone(),
    ));

    let subscribe = |lease: Option<u64>| {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("hub.mode", "subscribe")
            .append_pair("hub.topic", &topic)
            .append_pair("hub.callback", &callback_url)
            .append_pair("hub.secret", &state.secret);
        if let Some(lease) = lease {
            form.append_pair("hub.lease_seconds", &lease.to_string());
        }
        form.finish()
    };
    let mut lease = request(
        &client,
        &hub_url,
        subscribe(args.lease_seconds),
        "subscribe",
        &state,
        &mut verify_rx,
    )
    .await?;
    eprintln!("subscribed for {lease} s; waiting for notifications (Ctrl-C to stop)");

    loop {
        // Renew when 80% of the lease has passed.
        let renew_in = Duration::from_secs(lease.saturating_mul(4) / 5).max(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(renew_in) => {
                match request(&client, &hub_url, subscribe(Some(lease)), "subscribe", &state, &mut verify_rx).await {
                    Ok(granted) => {
                        lease = granted;
                        eprintln!("subscription renewed for {lease} s");
                    }
                    Err(e) => eprintln!("renewal failed: {e:#}; trying again later"),
                }
            }
        }
    }

    eprintln!("unsubscribing");
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("hub.mode", "unsubscribe")
        .append_pair("hub.topic", &topic)
        .append_pair("hub.callback", &callback_url);
    match request(
        &client,
        &hub_url,
        form.finish(),
        "unsubscribe",
        &state,
        &mut verify_rx,
    )
    .await
    {
        Ok(_) => eprintln!("unsubscribed"),
        Err(e) => eprintln!("unsubscription failed: {e:#}"),
    }
    let _ = stop_tx.send(());
    server.await??;
    processor.abort();
    eprintln!(
        "{} changes printed; last seq seen {}",
        printed.load(Ordering::Relaxed),
        last_seen.load(Ordering::Relaxed)
    );
    Ok(())
}

/// The hub URL (`rs:ln rel="hub"`) and topic (the `changelist`) from the Capability List.
async fn discover(
    client: &reqwest::Client,
    base: &str,
    channel: &str,
) -> anyhow::Result<(String, String)> {
    let url = format!("{base}/channels/{channel}/capabilitylist.xml");
    let resp = client
        .get(&url)
        .send()
        .await
        .context("GET capability list")?;
    if !resp.status().is_success() {
        bail!("GET {url}: {}", resp.status());
    }
    let body = resp.bytes().await?;
    let Document::CapabilityList { links, caps } =
        resourcesync::parse_document(&body, &Limits::default())?
    else {
        bail!("{url} is not a Capability List");
    };
    let hub = links
        .iter()
        .find(|l| l.rel == "hub")
        .map(|l| l.href.clone())
        .unwrap_or_else(|| format!("{base}/hub"));
    let topic = caps
        .iter()
        .find(|c| c.capability == "changelist")
        .map(|c| c.loc.clone())
        .with_context(|| format!("{url} offers no changelist"))?;
    Ok((hub, topic))
}

/// Sends a subscribe/unsubscribe request and waits for the hub to verify it; returns the lease.
async fn request(
    client: &reqwest::Client,
    hub_url: &str,
    form: String,
    mode: &'static str,
    state: &Callback,
    verifications: &mut mpsc::UnboundedReceiver<Verification>,
) -> anyhow::Result<u64> {
    // Set before posting: the hub may verify before its 202 reaches us.
    *state.intent.lock().unwrap() = Some(mode);
    let resp = client
        .post(hub_url)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .context("POST to the hub")?;
    if resp.status() != reqwest::StatusCode::ACCEPTED {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        bail!("hub answered {status}: {}", text.trim());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, verifications.recv()).await {
            Err(_) => bail!("the hub did not verify the {mode} request within 30 s"),
            Ok(None) => bail!("callback server stopped"),
            Ok(Some(Verification::Denied { reason })) => bail!("the hub denied it: {reason}"),
            Ok(Some(Verification::Confirmed {
                mode: m,
                lease_seconds,
            })) if m == mode => {
                *state.intent.lock().unwrap() = None;
                return Ok(lease_seconds);
            }
            Ok(Some(_)) => continue,
        }
    }
}

/// `GET /callback`: the hub's verification of intent, or its notice that it denied us.
async fn verification(
    State(state): State<Arc<Callback>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let param = |name: &str| q.get(name).map(String::as_str).unwrap_or("");
    if param("hub.topic") != state.topic {
        return (StatusCode::NOT_FOUND, "not my topic").into_response();
    }
    match param("hub.mode") {
        "denied" => {
            let _ = state.verifications.send(Verification::Denied {
                reason: param("hub.reason").to_string(),
            });
            StatusCode::OK.into_response()
        }
        mode @ ("subscribe" | "unsubscribe")
            if *state.intent.lock().unwrap() == Some(mode)
                && !param("hub.challenge").is_empty() =>
        {
            let _ = state.verifications.send(Verification::Confirmed {
                mode: mode.to_string(),
                lease_seconds: param("hub.lease_seconds").parse().unwrap_or(0),
            });
            (StatusCode::OK, param("hub.challenge").to_string()).into_response()
        }
        // Anything we did not ask for: refuse, so that nobody can (un)subscribe us.
        _ => (StatusCode::NOT_FOUND, "no such request pending").into_response(),
    }
}

/// `POST /callback`: a notification (a Change List).
async fn delivery(
    State(state): State<Arc<Callback>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let delivery_id = header("x-changehub-delivery").unwrap_or("?");
    match header("x-hub-signature") {
        Some(sig) if signing::verify(sig, state.secret.as_bytes(), &body) => {}
        Some(_) => {
            eprintln!("delivery {delivery_id}: wrong X-Hub-Signature; ignored");
            return StatusCode::ACCEPTED;
        }
        None => {
            eprintln!("delivery {delivery_id}: no X-Hub-Signature; ignored");
            return StatusCode::ACCEPTED;
        }
    }
    if header("x-changehub-channel").is_some_and(|c| c != state.channel) {
        eprintln!("delivery {delivery_id}: for another channel; ignored");
        return StatusCode::ACCEPTED;
    }
    let (list, entries) = match resourcesync::parse_change_list(&body, &Limits::default()) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("delivery {delivery_id}: not a Change List ({e}); ignored");
            return StatusCode::ACCEPTED;
        }
    };
    let seq_header = |name: &str| header(name).and_then(|v| v.parse::<u64>().ok());
    let (first, last) = match (
        seq_header("x-changehub-first"),
        seq_header("x-changehub-last"),
    ) {
        (Some(f), Some(l)) => (f, l),
        _ => match list.seq_range {
            Some(range) => range,
            None => {
                eprintln!("delivery {delivery_id}: no seq range; ignored");
                return StatusCode::ACCEPTED;
            }
        },
    };
    let n = state.deliveries.fetch_add(1, Ordering::Relaxed) + 1;
    if state.drop_every > 0 && n % state.drop_every == 0 {
        eprintln!("delivery {delivery_id}: dropped on purpose (--drop-every)");
        return StatusCode::ACCEPTED;
    }
    let _ = state.notifications.send(Notification {
        first,
        last,
        entries,
    });
    StatusCode::ACCEPTED
}

/// Prints notifications in order; catches up from the log on a gap.
async fn process(
    mut notifications: mpsc::UnboundedReceiver<Notification>,
    client: reqwest::Client,
    changes_url: String,
    since: Option<u64>,
    last_seen: Arc<AtomicU64>,
    printed: Arc<AtomicU64>,
) {
    let mut last: Option<u64> = since;
    if let Some(since) = since {
        match catch_up(&client, &changes_url, since, &printed).await {
            Ok(l) => last = Some(l),
            Err(e) => eprintln!("initial catch-up failed: {e:#}"),
        }
    }
    while let Some(n) = notifications.recv().await {
        eprintln!(
            "notification {}..={} ({} changes)",
            n.first,
            n.last,
            n.entries.len()
        );
        if let Some(l) = last {
            if n.first > l + 1 {
                eprintln!(
                    "gap: last seen {l}, notification starts at {}; catching up",
                    n.first
                );
                match catch_up(&client, &changes_url, l, &printed).await {
                    Ok(caught_up) => last = Some(caught_up),
                    Err(e) => {
                        // Skip it: the next notification shows the gap again and we retry.
                        eprintln!("catch-up failed: {e:#}");
                        continue;
                    }
                }
            }
        }
        for (i, entry) in n.entries.iter().enumerate() {
            let seq = entry.seq.unwrap_or(n.first + i as u64);
            if last.is_some_and(|l| seq <= l) {
                continue; // already printed (by a catch-up, or a redelivery)
            }
            print_change(seq, entry, &printed);
            last = Some(seq);
        }
        if let Some(l) = last {
            last_seen.store(l, Ordering::Relaxed);
        }
    }
}

/// Follows `changes?after=` and its `rel="next"` pages; returns the last seq printed.
async fn catch_up(
    client: &reqwest::Client,
    changes_url: &str,
    after: u64,
    printed: &AtomicU64,
) -> anyhow::Result<u64> {
    let mut last = after;
    let mut url = format!("{changes_url}?after={after}");
    let mut pages = 0;
    loop {
        let resp = client.get(&url).send().await.context("GET changes")?;
        if resp.status() == reqwest::StatusCode::GONE {
            let v: serde_json::Value = resp.json().await.unwrap_or_default();
            let oldest = v["oldest"].as_u64().context("410 without oldest")?;
            eprintln!(
                "changes {}..{} are no longer retained; continuing from {oldest}",
                last + 1,
                oldest.saturating_sub(1)
            );
            last = oldest.saturating_sub(1);
            url = format!("{changes_url}?after={last}");
            continue;
        }
        if !resp.status().is_success() {
            bail!("GET {url}: {}", resp.status());
        }
        let body = resp.bytes().await?;
        let (list, entries) = resourcesync::parse_change_list(&body, &Limits::default())?;
        pages += 1;
        for entry in &entries {
            let seq = entry.seq.context("a change without ch:seq")?;
            if seq > last {
                print_change(seq, entry, printed);
                last = seq;
            }
        }
        match list.links.iter().find(|l| l.rel == "next") {
            Some(next) => url = next.href.clone(),
            None => break,
        }
    }
    eprintln!("caught up to seq {last} ({pages} pages)");
    Ok(last)
}

fn print_change(seq: u64, entry: &ParsedEntry, printed: &AtomicU64) {
    println!("{seq}\t{}\t{}", entry.change.change, entry.change.loc);
    printed.fetch_add(1, Ordering::Relaxed);
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}
