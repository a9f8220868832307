//! One POST to a callback: the headers every delivery carries (hub and self links, the
//! channel, the delivery id, the seq range, the signature) and what the answer means.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, LINK, RETRY_AFTER};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::fanout::Fanout;
use crate::model::signature;
use crate::model::Subscription;
use crate::{net, retry};

/// What one delivery attempt came to.
#[derive(Debug)]
pub(super) enum Outcome {
    Delivered,
    /// 410 Gone: the subscriber wants no more.
    Gone,
    Failed {
        reason: String,
        retry_after: Option<Duration>,
    },
}

/// What every POST to one version of a subscription shares, made once (not per delivery):
/// the parsed and checked callback URL, and the header values that never change.
pub(super) struct Target {
    pub(super) sub: Arc<Subscription>,
    /// The callback, or why nothing can be sent to it.
    url: Result<reqwest::Url, String>,
    /// `Link: <hub>; rel="hub", <topic>; rel="self"`.
    link: HeaderValue,
    /// `X-Changehub-Channel`.
    channel: HeaderValue,
}

impl Target {
    pub(super) fn of(fanout: &Fanout, sub: Arc<Subscription>) -> Target {
        let url = url::Url::parse(&sub.callback)
            .map_err(|e| format!("bad callback URL: {e}"))
            .and_then(|url| {
                net::check_target(&url, fanout.config.allow_private_callbacks)
                    .map(|()| url)
                    .map_err(|e| e.to_string())
            });
        let link = format!(
            "<{}>; rel=\"hub\", <{}>; rel=\"self\"",
            fanout.config.urls.hub(),
            sub.topic
        );
        Target {
            url,
            link: header_value(link),
            channel: header_value(sub.channel.clone()),
            sub,
        }
    }
}

/// A header value from text the hub made or checked (URLs, channel names); a value that is
/// not one (never expected) is sent empty rather than failing the delivery.
fn header_value(s: String) -> HeaderValue {
    HeaderValue::try_from(s).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// What one POST carries.
pub(super) struct Payload<'a> {
    pub(super) body: Bytes,
    /// The topic's media type (`None`: the topic gave none, so none is sent).
    pub(super) content_type: Option<&'a str>,
    /// `Link` values sent after the hub's own `rel=hub` / `rel=self` header.
    pub(super) extra_links: &'a [String],
    /// `X-Changehub-Delivery` and `webhook-id`: the same on every retry of the same payload.
    pub(super) delivery_id: String,
    /// The seq range of a Change List notification (`X-Changehub-First` / `-Last`).
    pub(super) seqs: Option<(u64, u64)>,
    /// The epoch of the log those seqs belong to (`X-Changehub-Epoch`).
    pub(super) epoch: Option<&'a str>,
}

/// POSTs one notification to the callback.
pub(super) async fn deliver(
    client: &reqwest::Client,
    target: &Target,
    body: Bytes,
    (first, last): (u64, u64),
    epoch: Option<&str>,
) -> Outcome {
    let sub = &target.sub;
    // The epoch is in the id: after the log starts again, the same seqs are other changes.
    let delivery_id = match epoch {
        Some(epoch) => format!("{}-{epoch}-{first}-{last}", sub.id),
        None => format!("{}-{first}-{last}", sub.id),
    };
    let payload = Payload {
        body,
        content_type: Some("application/xml"),
        extra_links: &[],
        delivery_id,
        seqs: Some((first, last)),
        epoch,
    };
    post(client, target, payload).await
}

/// POSTs a payload to the callback: the topic's `Content-Type`, `Link` rel=hub and rel=self
/// (then the topic's other links), and `X-Hub-Signature` over the exact body exactly when the
/// subscription has a secret.
pub(super) async fn post(
    client: &reqwest::Client,
    target: &Target,
    payload: Payload<'_>,
) -> Outcome {
    let url = match &target.url {
        Ok(url) => url.clone(),
        Err(reason) => {
            return Outcome::Failed {
                reason: reason.clone(),
                retry_after: None,
            }
        }
    };
    let sub = &target.sub;
    let delivery_id = header_value(payload.delivery_id);
    let mut request = client
        .post(url)
        .header(LINK, target.link.clone())
        .header("X-Changehub-Channel", target.channel.clone())
        .header("X-Changehub-Delivery", delivery_id.clone())
        .header("webhook-id", delivery_id);
    for extra in payload.extra_links {
        request = request.header(LINK, extra);
    }
    if let Some(ct) = payload.content_type {
        request = request.header(CONTENT_TYPE, ct);
    }
    if let Some((first, last)) = payload.seqs {
        request = request
            .header("X-Changehub-First", first)
            .header("X-Changehub-Last", last);
    }
    if let Some(epoch) = payload.epoch {
        request = request.header("X-Changehub-Epoch", epoch);
    }
    if let Some(secret) = &sub.secret {
        request = request.header(
            "X-Hub-Signature",
            signature::signature(sub.algorithm, secret.as_bytes(), &payload.body),
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
