//! The delivery worker of one subscription.
//!
//! Invariants:
//! - Notifications reach the callback in seq order, one request in flight.
//! - The cursor advances only after a 2xx (or when a notification is given up after
//!   `retry_for`): delivery is at least once.
//! - A failing notification keeps its seq range until it succeeds or is given up, so its
//!   delivery id (`{subscription}-{first}-{last}`) and body are the same on every retry.
//! - While the worker is behind, it coalesces up to `max_batch` changes per request, read from
//!   the log; when it is caught up it sends the bytes the batcher rendered (shared by all).
//! - An expired lease or a 410 ends the subscription; nothing is delivered after expiry.
//! - On shutdown (drain), a worker finishes delivering what is published, then stops when it
//!   is caught up or has to wait for a retry.
//! - Subscriptions to an external generic topic (see [`super::external`]) also follow the
//!   topic's latest [`Content`](crate::external::Content): once the log is caught up, a
//!   version newer than the last delivered one is POSTed with the topic's `Content-Type` and
//!   links, retried like a notification (each retry sends the latest version). This state is
//!   in memory only.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, LINK, RETRY_AFTER};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{signing, Fanout};
use crate::batcher::render_notification;
use crate::model::{DeliveryState, PendingDelivery, Subscription};
use crate::{net, retry};

/// What one delivery attempt came to.
#[derive(Debug)]
pub enum Outcome {
    Delivered,
    /// 410 Gone: the subscriber wants no more.
    Gone,
    Failed {
        reason: String,
        retry_after: Option<Duration>,
    },
}

/// What one POST carries.
pub struct Payload<'a> {
    pub body: Bytes,
    /// The topic's media type (`None`: the topic gave none, so none is sent).
    pub content_type: Option<&'a str>,
    /// `Link` values sent after the hub's own `rel=hub` / `rel=self` header.
    pub extra_links: &'a [String],
    /// `X-Changehub-Delivery` and `webhook-id`: the same on every retry of the same payload.
    pub delivery_id: String,
    /// The seq range of a Change List notification (`X-Changehub-First` / `-Last`).
    pub seqs: Option<(u64, u64)>,
}

/// POSTs one notification to the callback.
pub async fn deliver(
    client: &reqwest::Client,
    fanout: &Fanout,
    sub: &Subscription,
    body: Bytes,
    first: u64,
    last: u64,
) -> Outcome {
    let payload = Payload {
        body,
        content_type: Some("application/xml"),
        extra_links: &[],
        delivery_id: format!("{}-{first}-{last}", sub.id),
        seqs: Some((first, last)),
    };
    post(client, fanout, sub, payload).await
}

/// POSTs a payload to the callback: the topic's `Content-Type`, `Link` rel=hub and rel=self
/// (then the topic's other links), and `X-Hub-Signature` over the exact body exactly when the
/// subscription has a secret.
pub async fn post(
    client: &reqwest::Client,
    fanout: &Fanout,
    sub: &Subscription,
    payload: Payload<'_>,
) -> Outcome {
    let callback = match url::Url::parse(&sub.callback) {
        Ok(u) => u,
        Err(e) => {
            return Outcome::Failed {
                reason: format!("bad callback URL: {e}"),
                retry_after: None,
            }
        }
    };
    if let Err(e) = net::check_target(&callback, fanout.config.allow_private_callbacks) {
        return Outcome::Failed {
            reason: e.to_string(),
            retry_after: None,
        };
    }
    let link = format!(
        "<{}>; rel=\"hub\", <{}>; rel=\"self\"",
        fanout.config.urls.hub(),
        sub.topic
    );
    let mut request = client
        .post(callback)
        .header(LINK, link)
        .header("X-Changehub-Channel", &sub.channel)
        .header("X-Changehub-Delivery", &payload.delivery_id)
        .header("webhook-id", &payload.delivery_id);
    for extra in payload.extra_links {
        request = request.header(LINK, extra);
    }
    if let Some(ct) = payload.content_type {
        request = request.header(CONTENT_TYPE, ct);
    }
    if let Some((first, last)) = payload.seqs {
        request = request
            .header("X-Changehub-First", first.to_string())
            .header("X-Changehub-Last", last.to_string());
    }
    if let Some(secret) = &sub.secret {
        request = request.header(
            "X-Hub-Signature",
            signing::signature(sub.algorithm, secret.as_bytes(), &payload.body),
        );
    }
    match request.body(payload.body).send().await {
        Ok(resp) if resp.status().is_success() => Outcome::Delivered,
        Ok(resp) if resp.status() == reqwest::StatusCode::GONE => Outcome::Gone,
        Ok(resp) => {
            let retry_after = resp
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| retry::parse_retry_after(v, SystemTime::now()));
            Outcome::Failed {
                reason: format!("callback answered {}", resp.status()),
                retry_after,
            }
        }
        Err(e) => Outcome::Failed {
            reason: format!("request failed: {}", error_chain(&e)),
            retry_after: None,
        },
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

fn to_std(d: time::Duration) -> Duration {
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

/// Runs until the subscription ends or the hub stops.
pub async fn run_worker(
    fanout: Arc<Fanout>,
    mut sub_rx: watch::Receiver<Arc<Subscription>>,
    mut state: DeliveryState,
    cancel: CancellationToken,
    generation: u64,
    content_version: u64,
) {
    let channel = sub_rx.borrow().channel.clone();
    let Some(feed) = fanout.feed(&channel) else {
        return;
    };
    let config = fanout.config.clone();
    let mut published_rx = feed.published();
    // External generic topics: the latest fetched content, delivered after the log.
    let mut content_rx = fanout.external.by_channel(&channel).map(|t| t.content());
    let mut generic = GenericState {
        delivered: content_version,
        pending: None,
    };
    loop {
        let sub = sub_rx.borrow_and_update().clone();
        let now = OffsetDateTime::now_utc();
        if sub.expires_at <= now {
            tracing::info!(callback = %sub.callback, topic = %sub.topic, "lease expired; subscription removed");
            fanout.remove_own(&sub.id, generation).await;
            return;
        }
        let until_expiry = to_std(sub.expires_at - now);

        // Decide the range to deliver, or wait.
        let range = match &state.pending {
            Some(p) if p.next_attempt_at > now => {
                let wait = to_std(p.next_attempt_at - now).min(until_expiry);
                if fanout.work.drain.is_cancelled() {
                    return; // shutting down: the retry waits for the next start
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = fanout.work.drain.cancelled() => {}
                    _ = sub_rx.changed() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            Some(p) => (p.first, p.last),
            None => {
                let published = *published_rx.borrow_and_update();
                if published <= state.cursor {
                    let mut wait = until_expiry;
                    let latest = content_rx
                        .as_mut()
                        .and_then(|rx| rx.borrow_and_update().clone())
                        .filter(|c| c.version > generic.delivered);
                    if let Some(content) = latest {
                        match &generic.pending {
                            Some(p) if p.next_attempt_at > now => {
                                wait = wait.min(to_std(p.next_attempt_at - now));
                            }
                            _ => {
                                let payload = Payload {
                                    body: content.body.clone(),
                                    content_type: content.content_type.as_deref(),
                                    extra_links: &content.links,
                                    delivery_id: format!("{}-c{}", sub.id, content.version),
                                    seqs: None,
                                };
                                let outcome = tokio::select! {
                                    _ = cancel.cancelled() => return,
                                    o = post(&fanout.client, &fanout, &sub, payload) => o,
                                };
                                if !generic.settle(
                                    &fanout,
                                    &sub,
                                    &mut state,
                                    content.version,
                                    outcome,
                                ) {
                                    fanout.remove_own(&sub.id, generation).await;
                                    return;
                                }
                                persist(&fanout, &sub, &state).await;
                                continue;
                            }
                        }
                    }
                    if fanout.work.drain.is_cancelled() {
                        return; // shutting down and caught up
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = fanout.work.drain.cancelled() => {}
                        _ = sub_rx.changed() => {}
                        changed = published_rx.changed() => if changed.is_err() { return },
                        changed = content_changed(&mut content_rx) => if changed.is_err() { content_rx = None },
                        _ = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
                let first = state.cursor + 1;
                let last = match feed.cached(first) {
                    Some(n) => n.last,
                    None => published.min(state.cursor + config.max_batch as u64),
                };
                (first, last)
            }
        };

        // The body: shared bytes when the batcher rendered exactly this range, else from the log.
        let (first, last, body) = match feed.cached(range.0).filter(|n| n.last == range.1) {
            Some(n) => (n.first, n.last, n.body.clone()),
            None => {
                let limit = (range.1 - range.0 + 1) as usize;
                match fanout.store.read(&channel, range.0 - 1, limit).await {
                    Ok(changes) if changes.is_empty() => {
                        // Trimmed by retention before delivery: skip to what is retained.
                        state.cursor = range.1;
                        state.pending = None;
                        persist(&fanout, &sub, &state).await;
                        continue;
                    }
                    Ok(changes) => {
                        let n = render_notification(&config, &channel, changes);
                        (n.first, n.last, n.body)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the log for delivery; retrying");
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                        continue;
                    }
                }
            }
        };

        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            o = deliver(&fanout.client, &fanout, &sub, body, first, last) => o,
        };
        let now = OffsetDateTime::now_utc();
        match outcome {
            Outcome::Delivered => {
                state.cursor = last;
                state.pending = None;
                state.last_success = Some(now);
                state.last_error = None;
            }
            Outcome::Gone => {
                tracing::info!(callback = %sub.callback, "callback answered 410 Gone; subscription removed");
                fanout.remove_own(&sub.id, generation).await;
                return;
            }
            Outcome::Failed {
                reason,
                retry_after,
            } => {
                let pending = state.pending.get_or_insert(PendingDelivery {
                    first,
                    last,
                    attempts: 0,
                    first_attempt_at: now,
                    next_attempt_at: now,
                });
                pending.attempts += 1;
                let attempts = pending.attempts;
                if now - pending.first_attempt_at >= config.retry_for {
                    tracing::warn!(callback = %sub.callback, first, last, attempts, %reason,
                        "giving up on notification after retrying");
                    state.last_error = Some(format!(
                        "gave up on seqs {first}-{last} after {attempts} attempts: {reason}"
                    ));
                    state.cursor = last;
                    state.pending = None;
                } else {
                    let delay = retry::next_delay(
                        attempts,
                        retry_after,
                        config.retry_initial,
                        config.retry_max,
                    );
                    pending.next_attempt_at = now + delay;
                    tracing::debug!(callback = %sub.callback, first, last, attempts, %reason, ?delay, "delivery failed; will retry");
                    state.last_error = Some(reason);
                }
            }
        }
        persist(&fanout, &sub, &state).await;
    }
}

/// Delivery of an external topic's generic content: the version last delivered (or given
/// up), and the retry in progress. Kept in memory: generic content is not replayable.
struct GenericState {
    delivered: u64,
    pending: Option<GenericRetry>,
}

struct GenericRetry {
    attempts: u32,
    first_attempt_at: OffsetDateTime,
    next_attempt_at: OffsetDateTime,
}

impl GenericState {
    /// Records the outcome of delivering content `version`; false when the subscription ends.
    fn settle(
        &mut self,
        fanout: &Fanout,
        sub: &Subscription,
        state: &mut DeliveryState,
        version: u64,
        outcome: Outcome,
    ) -> bool {
        let now = OffsetDateTime::now_utc();
        let config = &fanout.config;
        match outcome {
            Outcome::Delivered => {
                self.delivered = version;
                self.pending = None;
                state.last_success = Some(now);
                state.last_error = None;
            }
            Outcome::Gone => {
                tracing::info!(callback = %sub.callback, "callback answered 410 Gone; subscription removed");
                return false;
            }
            Outcome::Failed {
                reason,
                retry_after,
            } => {
                let retry = self.pending.get_or_insert(GenericRetry {
                    attempts: 0,
                    first_attempt_at: now,
                    next_attempt_at: now,
                });
                retry.attempts += 1;
                if now - retry.first_attempt_at >= config.retry_for {
                    tracing::warn!(callback = %sub.callback, version, attempts = retry.attempts, %reason,
                        "giving up on topic content after retrying");
                    state.last_error = Some(format!(
                        "gave up on topic content after {} attempts: {reason}",
                        retry.attempts
                    ));
                    self.delivered = version;
                    self.pending = None;
                } else {
                    let delay = retry::next_delay(
                        retry.attempts,
                        retry_after,
                        config.retry_initial,
                        config.retry_max,
                    );
                    retry.next_attempt_at = now + delay;
                    tracing::debug!(callback = %sub.callback, version, attempts = retry.attempts, %reason, ?delay, "content delivery failed; will retry");
                    state.last_error = Some(reason);
                }
            }
        }
        fanout.external.set_retry(
            &sub.id,
            self.pending
                .as_ref()
                .map(|r| crate::external::ContentRetry {
                    version,
                    attempts: r.attempts,
                    next_attempt_at: r.next_attempt_at,
                }),
        );
        true
    }
}

type ContentRx = watch::Receiver<Option<Arc<crate::external::Content>>>;

/// Waits for new content; never returns when there is no content to follow.
async fn content_changed(rx: &mut Option<ContentRx>) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

async fn persist(fanout: &Fanout, sub: &Subscription, state: &DeliveryState) {
    if let Err(e) = fanout.store.put_delivery(&sub.id, state).await {
        tracing::warn!(subscription = %sub.id, error = %e, "cannot save delivery state");
    }
}
