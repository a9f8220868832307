//! The WebSub side of `changehub subscribe`: the callback server, and the subscription it
//! keeps alive.
//!
//! - **Verification of intent** (`GET callback?hub.mode=…`): confirmed by echoing
//!   `hub.challenge` when it is for our topic and a mode we asked for (`subscribe` always,
//!   `unsubscribe` only while we are unsubscribing); anything else is 404. `hub.mode=denied`
//!   is reported to the subscription loop, which ends the program with the hub's reason.
//! - **Deliveries** (`POST callback`): the `X-Hub-Signature` must be the HMAC of the body with
//!   our secret. An unsigned or badly signed delivery is refused — not applied, and logged —
//!   and, as WebSub asks, still answered 2xx, so that a forger learns nothing. A good one is
//!   parsed and passed to the follower; when the follower is busy it is dropped (the next
//!   notification, or the periodic poll, shows the gap and the follower reads it back).
//! - **The subscription**: [`Subscription::subscribe`] asks the hub and waits until the hub
//!   has verified it; [`Subscription::renew`] renews it (the follower does so at 3/4 of the
//!   lease, and at once when the hub's log turned out to be another one).

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

use super::hub::{limits, Topic};
use super::Event;
use crate::model::{signature, Change};
use crate::resourcesync;

/// Largest delivery accepted.
const MAX_DELIVERY: usize = 64 << 20;
/// How long the hub has to verify a subscription request.
const VERIFY_WITHIN: Duration = Duration::from_secs(60);

/// What the callback server tells the subscription loop.
#[derive(Debug)]
enum Verified {
    Subscribed { lease: Option<u64> },
    Unsubscribed,
    Denied { reason: String },
}

/// The hub denied the subscription (`hub.mode=denied`), with its reason.
#[derive(Debug, thiserror::Error)]
#[error("the hub denied the subscription: {0}")]
pub struct Denied(String);

/// Shared by the callback server's connections.
struct Callback {
    path: String,
    topic: String,
    secret: String,
    unsubscribing: AtomicBool,
    verified: mpsc::UnboundedSender<Verified>,
    events: mpsc::Sender<Event>,
}

/// A running callback server and the subscription it serves.
pub struct Subscription {
    callback: Arc<Callback>,
    verified: mpsc::UnboundedReceiver<Verified>,
    client: reqwest::Client,
    hub: String,
    callback_url: String,
    lease: Option<Duration>,
    pub address: SocketAddr,
}

impl Subscription {
    /// Binds the callback server at `listen` (serving `callback_url`'s path) and starts it.
    pub async fn start(
        listen: &str,
        callback_url: &str,
        topic: &Topic,
        secret: &str,
        lease: Option<Duration>,
        client: reqwest::Client,
        events: mpsc::Sender<Event>,
    ) -> anyhow::Result<Subscription> {
        let url = url::Url::parse(callback_url)
            .with_context(|| format!("--callback-url {callback_url:?}"))?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen} for callbacks"))?;
        let address = listener.local_addr()?;
        let (tx, verified) = mpsc::unbounded_channel();
        let callback = Arc::new(Callback {
            path: url.path().to_string(),
            topic: topic.url.clone(),
            secret: secret.to_string(),
            unsubscribing: AtomicBool::new(false),
            verified: tx,
            events,
        });
        let server = callback.clone();
        tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        eprintln!("callback server: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let state = server.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, std::convert::Infallible>(state.handle(req).await) }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Subscription {
            callback,
            verified,
            client,
            hub: topic.hub.clone(),
            callback_url: callback_url.to_string(),
            lease,
            address,
        })
    }

    /// Asks the hub for the subscription (or its renewal) and waits for its verification;
    /// returns the lease the hub granted.
    pub async fn subscribe(&mut self) -> anyhow::Result<Duration> {
        match self.request("subscribe").await? {
            Verified::Subscribed { lease } => Ok(Duration::from_secs(lease.unwrap_or(86_400))),
            Verified::Denied { reason } => Err(Denied(reason).into()),
            Verified::Unsubscribed => bail!("the hub verified an unsubscribe instead"),
        }
    }

    /// Ends the subscription (best effort: errors are only reported).
    pub async fn unsubscribe(&mut self) {
        self.callback.unsubscribing.store(true, Ordering::SeqCst);
        match tokio::time::timeout(Duration::from_secs(15), self.request("unsubscribe")).await {
            Ok(Ok(Verified::Unsubscribed)) => eprintln!("unsubscribed"),
            Ok(Ok(other)) => eprintln!("unsubscribing: unexpected answer {other:?}"),
            Ok(Err(e)) => eprintln!("unsubscribing failed: {e:#}"),
            Err(_) => eprintln!("unsubscribing: no verification within 15 s"),
        }
    }

    /// Renews the subscription: the lease granted, or `None` after a failure worth trying
    /// again (logged); a denial is an error.
    pub async fn renew(&mut self) -> anyhow::Result<Option<Duration>> {
        match self.subscribe().await {
            Ok(lease) => {
                eprintln!(
                    "subscription renewed for {}",
                    humantime::format_duration(lease)
                );
                Ok(Some(lease))
            }
            Err(e) if e.is::<Denied>() => Err(e),
            Err(e) => {
                eprintln!("renewing the subscription failed, will try again: {e:#}");
                Ok(None)
            }
        }
    }

    async fn request(&mut self, mode: &str) -> anyhow::Result<Verified> {
        while self.verified.try_recv().is_ok() {}
        let mut form = vec![
            ("hub.mode", mode.to_string()),
            ("hub.topic", self.callback.topic.clone()),
            ("hub.callback", self.callback_url.clone()),
        ];
        if mode == "subscribe" {
            form.push(("hub.secret", self.callback.secret.clone()));
            if let Some(lease) = self.lease {
                form.push(("hub.lease_seconds", lease.as_secs().to_string()));
            }
        }
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&form)
            .finish();
        let response = self
            .client
            .post(&self.hub)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .with_context(|| format!("cannot reach the hub at {}", self.hub))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!("the hub refused to {mode}: {status}: {}", body.trim());
        }
        match tokio::time::timeout(VERIFY_WITHIN, self.verified.recv()).await {
            Ok(Some(v)) => Ok(v),
            Ok(None) => bail!("the callback server stopped"),
            Err(_) => bail!(
                "the hub did not verify the {mode} within {}s: can it reach {}?",
                VERIFY_WITHIN.as_secs(),
                self.callback_url
            ),
        }
    }
}

impl Callback {
    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if req.uri().path() != self.path {
            return answer(StatusCode::NOT_FOUND, "");
        }
        match *req.method() {
            Method::GET => self.verification(&req),
            Method::POST => self.delivery(req).await,
            _ => answer(StatusCode::METHOD_NOT_ALLOWED, ""),
        }
    }

    fn verification(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        let query: HashMap<String, String> =
            form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                .into_owned()
                .collect();
        let get = |k: &str| query.get(k).map(String::as_str);
        if get("hub.topic") != Some(self.topic.as_str()) {
            return answer(StatusCode::NOT_FOUND, "not our topic");
        }
        let verified = match get("hub.mode") {
            Some("denied") => {
                let reason = get("hub.reason").unwrap_or("no reason given").to_string();
                let _ = self.verified.send(Verified::Denied { reason });
                return answer(StatusCode::OK, "");
            }
            Some("subscribe") => Verified::Subscribed {
                lease: get("hub.lease_seconds").and_then(|s| s.parse().ok()),
            },
            Some("unsubscribe") if self.unsubscribing.load(Ordering::SeqCst) => {
                Verified::Unsubscribed
            }
            _ => return answer(StatusCode::NOT_FOUND, "not an intent of this subscriber"),
        };
        let Some(challenge) = get("hub.challenge") else {
            return answer(StatusCode::BAD_REQUEST, "no hub.challenge");
        };
        let challenge = challenge.to_string();
        let _ = self.verified.send(verified);
        answer(StatusCode::OK, &challenge)
    }

    async fn delivery(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let body = match Limited::new(body, MAX_DELIVERY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => return answer(StatusCode::PAYLOAD_TOO_LARGE, "too large"),
        };
        let signed = header("x-hub-signature")
            .is_some_and(|sig| signature::verify(&sig, self.secret.as_bytes(), &body));
        if !signed {
            let what = if header("x-hub-signature").is_some() {
                "a wrong signature"
            } else {
                "no signature"
            };
            eprintln!("refused a delivery with {what} (not applied)");
            // WebSub: acknowledge, but ignore.
            return answer(StatusCode::ACCEPTED, "");
        }
        let (head, entries) = match resourcesync::parse_change_list(&body, &limits()) {
            Ok(parsed) => parsed,
            Err(e) => {
                eprintln!("ignored a delivery that is not a Change List: {e}");
                return answer(StatusCode::ACCEPTED, "");
            }
        };
        let epoch = header("x-changehub-epoch").or(head.epoch);
        let changes: Vec<Change> = entries
            .into_iter()
            .filter_map(|e| {
                let (seq, datetime) = (e.seq?, e.change.datetime?);
                Some(Change::from_new(seq, e.change, datetime))
            })
            .collect();
        if !changes.is_empty() {
            let event = Event::Changes { epoch, changes };
            if self.events.try_send(event).is_err() {
                eprintln!("busy: a delivery is left to be read back from the hub");
            }
        }
        answer(StatusCode::ACCEPTED, "")
    }
}

fn answer(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
}
