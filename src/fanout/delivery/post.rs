//! One POST to a callback: the headers every delivery carries (hub and self links, the
//! channel, the delivery id, the seq range, the signature) and what the answer means.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, LINK, RETRY_AFTER};
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
    fanout: &Fanout,
    sub: &Subscription,
    body: Bytes,
    (first, last): (u64, u64),
    epoch: Option<&str>,
) -> Outcome {
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
    post(client, fanout, sub, payload).await
}

/// POSTs a payload to the callback: the topic's `Content-Type`, `Link` rel=hub and rel=self
/// (then the topic's other links), and `X-Hub-Signature` over the exact body exactly when the
/// subscription has a secret.
pub(super) async fn post(
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
