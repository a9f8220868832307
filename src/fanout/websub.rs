//! WebSub subscription requests (`POST /hub`; the HTTP side is `crate::http::websub`).
//!
//! [`parse_request`] checks a request; the caller answers 202 and runs [`process`] in the
//! background: it
//! validates the topic (a channel's topic, or an external topic under an
//! `--allow-external-topics` prefix; anything else is denied with `hub.mode=denied` and a
//! `hub.reason`), then verifies the
//! subscriber's intent with a GET carrying a random single-use `hub.challenge` (the callback's
//! own query string kept), and only when the callback answers 2xx with exactly the challenge
//! does the subscription change. A failed verification leaves everything as it was.

use http::StatusCode;
use rand::RngCore;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

use super::Fanout;
use crate::external::{self, External};
use crate::model::{subscription_id, Algorithm, Subscription};
use crate::net;

/// `hub.secret` must be shorter than this (WebSub §5.1).
pub const MAX_SECRET_BYTES: usize = 200;
/// Longest callback or topic URL accepted.
pub const MAX_URL_LEN: usize = 2048;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Subscribe,
    Unsubscribe,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Subscribe => "subscribe",
            Mode::Unsubscribe => "unsubscribe",
        }
    }
}

/// A checked subscription request.
#[derive(Debug, Clone)]
pub struct Request {
    pub mode: Mode,
    pub topic: String,
    pub callback: url::Url,
    pub lease_seconds: Option<u64>,
    pub secret: Option<String>,
    pub algorithm: Option<Algorithm>,
    pub verify_token: Option<String>,
}

/// A refused request: the status and a plain-text reason.
pub use crate::external::publish::Refusal;

fn bad(reason: impl Into<String>) -> Refusal {
    (StatusCode::BAD_REQUEST, reason.into())
}

/// Parses a form-encoded request body. Unknown parameters are ignored.
pub fn parse_request(body: &[u8], allow_private: bool) -> Result<Request, Refusal> {
    let mut mode = None;
    let mut topic = None;
    let mut callback = None;
    let mut lease = None;
    let mut secret = None;
    let mut algorithm = None;
    let mut verify_token = None;
    for (k, v) in form_urlencoded::parse(body) {
        let slot = match k.as_ref() {
            "hub.mode" => &mut mode,
            "hub.topic" | "hub.url" => &mut topic,
            "hub.callback" => &mut callback,
            "hub.lease_seconds" => &mut lease,
            "hub.secret" => &mut secret,
            "hub.signature_algorithm" => &mut algorithm,
            "hub.verify_token" => &mut verify_token,
            _ => continue,
        };
        if slot.is_none() {
            *slot = Some(v.into_owned());
        }
    }
    let mode = match mode.as_deref() {
        Some("subscribe") => Mode::Subscribe,
        Some("unsubscribe") => Mode::Unsubscribe,
        Some("publish") => return Err(bad("hub.mode=publish is a ping, not a subscription")),
        Some(other) => return Err(bad(format!("unknown hub.mode {other:?}"))),
        None => return Err(bad("missing hub.mode")),
    };
    let topic = topic.ok_or_else(|| bad("missing hub.topic"))?;
    if topic.len() > MAX_URL_LEN {
        return Err(bad("hub.topic is too long"));
    }
    let callback = callback.ok_or_else(|| bad("missing hub.callback"))?;
    if callback.len() > MAX_URL_LEN {
        return Err(bad("hub.callback is too long"));
    }
    let callback = url::Url::parse(&callback)
        .map_err(|e| bad(format!("hub.callback is not an absolute URL: {e}")))?;
    if !matches!(callback.scheme(), "http" | "https") {
        return Err(bad("hub.callback must be an http or https URL"));
    }
    if callback.fragment().is_some() {
        return Err(bad("hub.callback must not have a fragment"));
    }
    net::check_target(&callback, allow_private)
        .map_err(|e| (StatusCode::FORBIDDEN, format!("hub.callback refused: {e}")))?;
    let lease_seconds = match lease.as_deref() {
        None | Some("") => None,
        Some(s) => match s.parse::<u64>() {
            Ok(n) if n > 0 => Some(n),
            _ => return Err(bad("hub.lease_seconds must be a positive integer")),
        },
    };
    let secret = secret.filter(|s| !s.is_empty());
    if secret.as_ref().is_some_and(|s| s.len() >= MAX_SECRET_BYTES) {
        return Err(bad(format!(
            "hub.secret must be shorter than {MAX_SECRET_BYTES} bytes"
        )));
    }
    let algorithm = match algorithm {
        Some(a) => Some(a.parse::<Algorithm>().map_err(bad)?),
        None => None,
    };
    Ok(Request {
        mode,
        topic,
        callback,
        lease_seconds,
        secret,
        algorithm,
        verify_token,
    })
}

/// Validates, verifies and applies one request (in the background).
pub async fn process(fanout: Arc<Fanout>, external: Arc<External>, request: Request) {
    let config = &fanout.config;
    let own = config
        .urls
        .channel_of_topic(&request.topic)
        .map(str::to_string);
    let dump_of = config
        .urls
        .channel_of_dump_topic(&request.topic)
        .map(str::to_string);
    let (channel, is_external) = if let Some(name) = dump_of {
        // A channel's Change Dump: subscribers hear of each new dump.
        let Some(ch) = fanout.feeds.spec(&name).filter(|s| s.dumps.is_some()) else {
            deny(
                &fanout,
                &request,
                &format!("no channel {name:?} with Change Dumps on this hub"),
            )
            .await;
            return;
        };
        if ch.read_token.is_some() && request.mode == Mode::Subscribe {
            let reason = "this channel is private; read its Change Dump with its read token";
            deny(&fanout, &request, reason).await;
            return;
        }
        (crate::dumps::channel_name(&ch.name), false)
    } else if let Some(name) = own {
        // A topic URL of this hub is never an external topic.
        let Some(ch) = fanout.feeds.spec(&name) else {
            deny(
                &fanout,
                &request,
                &format!("no channel {name:?} on this hub"),
            )
            .await;
            return;
        };
        if ch.read_token.is_some() && request.mode == Mode::Subscribe {
            let reason =
                "this channel is private; follow it over the websocket or SSE with its read token";
            deny(&fanout, &request, reason).await;
            return;
        }
        (ch.name.clone(), false)
    } else if external::is_allowed(config, &request.topic) {
        let refused = url::Url::parse(&request.topic)
            .map_err(|e| e.to_string())
            .and_then(|u| {
                net::check_target(&u, config.allow_private_callbacks).map_err(|e| e.to_string())
            });
        if let Err(e) = refused {
            deny(&fanout, &request, &format!("topic refused: {e}")).await;
            return;
        }
        (external::channel_name(&request.topic), true)
    } else {
        let reason = if config.allow_external_topics.is_empty() {
            "unknown topic: this hub serves its channels' changelist.xml URLs"
        } else {
            "unknown topic: neither a channel of this hub nor under an allowed external prefix"
        };
        deny(&fanout, &request, reason).await;
        return;
    };
    let lease = request
        .lease_seconds
        .map(Duration::from_secs)
        .unwrap_or(config.lease_default)
        .clamp(config.lease_min, config.lease_max);
    if request.mode == Mode::Subscribe {
        if let Some(reason) = over_a_cap(&fanout, &request).await {
            deny(&fanout, &request, &reason).await;
            return;
        }
    }
    let verified_at = OffsetDateTime::now_utc();
    match verify(&fanout, &request, lease).await {
        Ok(()) => {}
        Err(reason) => {
            tracing::info!(callback = %crate::net::shown(request.callback.as_str()), topic = %request.topic, %reason,
                "verification of intent failed; nothing changed");
            return;
        }
    }
    let id = subscription_id(&request.topic, request.callback.as_str());
    let result = match request.mode {
        Mode::Subscribe => {
            if is_external {
                external.ensure(&request.topic);
            }
            let sub = Subscription {
                id,
                channel,
                topic: request.topic.clone(),
                callback: request.callback.to_string(),
                secret: request.secret.clone(),
                algorithm: request.algorithm.unwrap_or(config.signature_algorithm),
                lease_seconds: lease.as_secs(),
                expires_at: verified_at + lease,
                created_at: verified_at,
            };
            tracing::info!(callback = %crate::net::shown(&sub.callback), topic = %sub.topic, lease = sub.lease_seconds, "subscription verified");
            fanout.activate(sub).await
        }
        Mode::Unsubscribe => {
            tracing::info!(callback = %crate::net::shown(request.callback.as_str()), topic = %request.topic, "unsubscription verified");
            fanout.remove(&id).await.map(|_| ())
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "cannot store the verified subscription change");
    }
}

/// How long the subscription counts read from the store serve the caps.
const COUNTS_FOR: Duration = Duration::from_secs(1);

/// How many subscriptions each topic and each callback host has, as the caps
/// (`--max-subscriptions-per-topic` and `-per-host`) see them: read from the store at most
/// once per `COUNTS_FOR` (not once per request, which would make a burst of N requests
/// read N·N subscriptions), and counted up here for every new subscription let through
/// meanwhile, so that a burst cannot pass a cap between two reads. A removal here reads them
/// again ([`SubscriptionCounts::forget`]); one on another instance shows at the next read.
#[derive(Default)]
pub struct SubscriptionCounts {
    counts: tokio::sync::Mutex<Option<Counts>>,
}

struct Counts {
    read_at: std::time::Instant,
    ids: std::collections::HashSet<String>,
    topics: std::collections::HashMap<String, usize>,
    hosts: std::collections::HashMap<String, usize>,
}

impl Counts {
    fn of(subs: &[Subscription]) -> Counts {
        let mut counts = Counts {
            read_at: std::time::Instant::now(),
            ids: Default::default(),
            topics: Default::default(),
            hosts: Default::default(),
        };
        for s in subs {
            let host = url::Url::parse(&s.callback)
                .ok()
                .and_then(|u| u.host_str().map(str::to_string));
            counts.count(&s.id, &s.topic, host.as_deref().unwrap_or(""));
        }
        counts
    }

    fn count(&mut self, id: &str, topic: &str, host: &str) {
        self.ids.insert(id.to_string());
        *self.topics.entry(topic.to_string()).or_default() += 1;
        *self.hosts.entry(host.to_string()).or_default() += 1;
    }
}

impl SubscriptionCounts {
    /// Makes the next check read the counts again.
    pub async fn forget(&self) {
        *self.counts.lock().await = None;
    }
}

/// Why a new subscription would be one too many (`--max-subscriptions-per-topic` and
/// `-per-host`); a renewal of an existing one never is. When the store cannot say, the
/// subscription goes on (the store failure shows when it is stored).
async fn over_a_cap(fanout: &Fanout, request: &Request) -> Option<String> {
    let id = subscription_id(&request.topic, request.callback.as_str());
    let mut guard = fanout.counts.counts.lock().await;
    if guard
        .as_ref()
        .is_none_or(|c| c.read_at.elapsed() > COUNTS_FOR)
    {
        let subs = fanout.store.subscriptions().await.ok()?;
        *guard = Some(Counts::of(&subs));
    }
    let counts = guard.as_mut()?;
    if counts.ids.contains(&id) {
        return None;
    }
    let config = &fanout.config;
    let on_topic = counts.topics.get(&request.topic).copied().unwrap_or(0);
    if on_topic >= config.max_subscriptions_per_topic {
        return Some(format!(
            "this topic has the most subscriptions this hub takes ({})",
            config.max_subscriptions_per_topic
        ));
    }
    let host = request.callback.host_str().unwrap_or("");
    let on_host = counts.hosts.get(host).copied().unwrap_or(0);
    if on_host >= config.max_subscriptions_per_host {
        return Some(format!(
            "callbacks on {host} have the most subscriptions this hub takes ({})",
            config.max_subscriptions_per_host
        ));
    }
    counts.count(&id, &request.topic, host);
    None
}

/// The verification GET: 2xx with a body equal to the challenge, nothing else.
async fn verify(fanout: &Fanout, request: &Request, lease: Duration) -> Result<(), String> {
    let mut challenge = [0u8; 24];
    rand::rng().fill_bytes(&mut challenge);
    let challenge = hex::encode(challenge);
    let mut url = request.callback.clone();
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("hub.mode", request.mode.as_str())
            .append_pair("hub.topic", &request.topic)
            .append_pair("hub.challenge", &challenge)
            .append_pair("hub.lease_seconds", &lease.as_secs().to_string());
        if let Some(token) = &request.verify_token {
            q.append_pair("hub.verify_token", token);
        }
    }
    let mut resp = fanout
        .client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("verification request failed: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("callback answered {}", resp.status()));
    }
    // Read at most a little more than the challenge: the body must equal it exactly.
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("reading the answer failed: {e}"))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > challenge.len() + 2 {
            break;
        }
    }
    if body != challenge.as_bytes() {
        return Err("callback did not echo the challenge".into());
    }
    Ok(())
}

/// Tells the callback its request was refused (`hub.mode=denied`).
async fn deny(fanout: &Fanout, request: &Request, reason: &str) {
    let mut url = request.callback.clone();
    url.query_pairs_mut()
        .append_pair("hub.mode", "denied")
        .append_pair("hub.topic", &request.topic)
        .append_pair("hub.reason", reason);
    tracing::info!(callback = %crate::net::shown(request.callback.as_str()), topic = %request.topic, reason, "subscription denied");
    if let Err(e) = fanout.client.get(url).send().await {
        tracing::debug!(error = %e, "denial notice not delivered");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_ignores_unknown_parameters() {
        let body = b"hub.mode=subscribe&hub.topic=http%3A%2F%2Fh%2Fchannels%2Fa%2Fchangelist.xml&hub.callback=http%3A%2F%2Fexample.com%2Fcb%3Fx%3D1&foo=bar&hub.foo=hub.bar&hub.lease_seconds=60";
        let r = parse_request(body, false).unwrap();
        assert_eq!(r.mode, Mode::Subscribe);
        assert_eq!(r.topic, "http://h/channels/a/changelist.xml");
        assert_eq!(r.callback.as_str(), "http://example.com/cb?x=1");
        assert_eq!(r.lease_seconds, Some(60));
        assert!(r.secret.is_none());
    }

    #[test]
    fn refuses_bad_requests() {
        let cases: &[&[u8]] = &[
            b"hub.topic=t&hub.callback=http://example.com/",
            b"hub.mode=watch&hub.topic=t&hub.callback=http://example.com/",
            b"hub.mode=subscribe&hub.callback=http://example.com/",
            b"hub.mode=subscribe&hub.topic=t",
            b"hub.mode=subscribe&hub.topic=t&hub.callback=/relative",
            b"hub.mode=subscribe&hub.topic=t&hub.callback=http://example.com/&hub.lease_seconds=-1",
            b"hub.mode=subscribe&hub.topic=t&hub.callback=http://127.0.0.1/",
        ];
        for body in cases {
            assert!(
                parse_request(body, false).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let long = format!(
            "hub.mode=subscribe&hub.topic=t&hub.callback=http://example.com/&hub.secret={}",
            "s".repeat(200)
        );
        assert!(parse_request(long.as_bytes(), false).is_err());
        let ok = format!(
            "hub.mode=subscribe&hub.topic=t&hub.callback=http://example.com/&hub.secret={}",
            "s".repeat(199)
        );
        assert!(parse_request(ok.as_bytes(), false).is_ok());
    }
}
