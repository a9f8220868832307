//! A minimal WebSub subscriber: a callback server on `127.0.0.1:PORT/callback` that subscribes to
//! a channel with a random secret, answers the hub's verification, checks `X-Hub-Signature` of
//! every delivery with `changehub::model::signature::verify`, parses the Change List with
//! `changehub::resourcesync::parse_change_list` and prints `seq<TAB>change<TAB>loc`. A delivery
//! without a valid signature is acknowledged and ignored, as WebSub asks. With `--count N` it
//! stops after N changes.
//!
//! Against a hub started as in the README (it must allow loopback callbacks):
//!
//! ```text
//! cargo run --release -- serve --channel news=secret-token --allow-private-callbacks
//! cargo run --example destination -- http://127.0.0.1:8080 news 9000
//! cargo run --example source -- http://127.0.0.1:8080 news secret-token 5   # elsewhere
//! ```
//!
//! It prints what is delivered after it subscribed, nothing more: no catch-up of lost deliveries,
//! no cursor, no lease renewal, no unsubscribe. `changehub subscribe` does all that (and
//! websockets, and `--mirror DIR`); this shows the protocol underneath.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{body::Bytes, routing::get, Router};
use changehub::model::signature;
use changehub::resourcesync::{parse_change_list, Limits, ParsedEntry};
use clap::Parser;
use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

#[derive(Parser)]
struct Args {
    /// Base URL of the hub, e.g. http://127.0.0.1:8080
    hub: String,
    channel: String,
    /// Port of the callback server on 127.0.0.1 (0: any free port)
    #[arg(default_value_t = 0)]
    port: u16,
    /// Stop after printing this many changes
    #[arg(long)]
    count: Option<usize>,
}

struct Callback {
    topic: String,
    secret: String,
    changes: UnboundedSender<Vec<ParsedEntry>>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let hub = args.hub.trim_end_matches('/');
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let callback = format!("http://{}/callback", listener.local_addr()?);
    let (changes, mut received) = unbounded_channel();
    let state = Arc::new(Callback {
        topic: format!("{hub}/channels/{}/changelist.xml", args.channel),
        secret: format!("{:032x}", rand::random::<u128>()),
        changes,
    });
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("hub.mode", "subscribe")
        .append_pair("hub.topic", &state.topic)
        .append_pair("hub.callback", &callback)
        .append_pair("hub.secret", &state.secret)
        .finish();
    let app = Router::new().route("/callback", get(verification).post(delivery));
    tokio::spawn(axum::serve(listener, app.with_state(state)).into_future());

    // The hub answers 202, then verifies our intent with a GET to the callback.
    let answer = reqwest::Client::new()
        .post(format!("{hub}/hub"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await?;
    anyhow::ensure!(answer.status() == 202, "refused: {}", answer.text().await?);
    let (count, mut printed, mut last) = (args.count.unwrap_or(usize::MAX), 0, 0);
    while let Some(entries) = received.recv().await {
        for e in entries {
            // At least once: a delivery may come again; its seqs tell.
            let seq = e.seq.unwrap_or_default();
            if seq > last && printed < count {
                println!("{seq}\t{}\t{}", e.change.change, e.change.loc);
                (printed, last) = (printed + 1, seq);
            }
        }
        if printed == count {
            break;
        }
    }
    Ok(())
}

/// `GET /callback`: the hub verifies that we asked for this subscription (or says it denied it).
async fn verification(
    State(state): State<Arc<Callback>>,
    Query(q): Query<HashMap<String, String>>,
) -> (StatusCode, String) {
    let param = |name: &str| q.get(name).cloned().unwrap_or_default();
    eprintln!("hub: {} {}", param("hub.mode"), param("hub.reason"));
    if param("hub.topic") != state.topic {
        return (StatusCode::NOT_FOUND, String::new());
    }
    match param("hub.mode").as_str() {
        "subscribe" => (StatusCode::OK, param("hub.challenge")),
        "denied" => std::process::exit(1), // its reason is printed above
        _ => (StatusCode::NOT_FOUND, String::new()), // not asked for: refuse
    }
}

/// `POST /callback`: a notification, a Change List signed with our secret.
async fn delivery(
    State(state): State<Arc<Callback>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let signed = headers.get("x-hub-signature").and_then(|v| v.to_str().ok());
    if !signed.is_some_and(|sig| signature::verify(sig, state.secret.as_bytes(), &body)) {
        eprintln!("a delivery without a valid X-Hub-Signature: ignored");
        return StatusCode::ACCEPTED; // acknowledged, as WebSub asks, but not believed
    }
    match parse_change_list(&body, &Limits::default()) {
        Ok((_, entries)) => drop(state.changes.send(entries)),
        Err(e) => eprintln!("not a Change List ({e}): ignored"),
    }
    StatusCode::ACCEPTED
}
