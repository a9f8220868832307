//! One POST to a callback: the headers every delivery carries (hub and self links, the
//! channel, the delivery id, the seq range, the signature) and what the answer means.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, LINK};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::fanout::Fanout;
use crate::model::signature;
use crate::model::Subscription;
use crate::net::callback::{Callback, CallbackConn};
use crate::{net, retry};

const CHANNEL: HeaderName = HeaderName::from_static("x-changehub-channel");
const DELIVERY: HeaderName = HeaderName::from_static("x-changehub-delivery");
const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const FIRST: HeaderName = HeaderName::from_static("x-changehub-first");
const LAST: HeaderName = HeaderName::from_static("x-changehub-last");
const EPOCH: HeaderName = HeaderName::from_static("x-changehub-epoch");
const SIGNATURE: HeaderName = HeaderName::from_static("x-hub-signature");

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
/// the parsed and checked callback URL, and the headers that never change.
pub(super) struct Target {
    pub(super) sub: Arc<Subscription>,
    /// The callback, or why nothing can be sent to it.
    callback: Result<Callback, String>,
    /// `Link: <hub>; rel="hub", <topic>; rel="self"` and `X-Changehub-Channel`.
    headers: HeaderMap,
}

impl Target {
    pub(super) fn of(fanout: &Fanout, sub: Arc<Subscription>) -> Target {
        let callback = url::Url::parse(&sub.callback)
            .map_err(|e| format!("bad callback URL: {e}"))
            .and_then(|url| {
                net::check_target(&url, fanout.config.allow_private_callbacks)
                    .map_err(|e| e.to_string())?;
                Callback::of(&url).ok_or_else(|| net::TargetError::NotHttp.to_string())
            });
        let link = format!(
            "<{}>; rel=\"hub\", <{}>; rel=\"self\"",
            fanout.config.urls.hub(),
            sub.topic
        );
        let mut headers = HeaderMap::new();
        headers.insert(LINK, header_value(link));
        headers.insert(CHANNEL, header_value(sub.channel.as_str()));
        Target {
            callback,
            headers,
            sub,
        }
    }
}

/// A header value from text the hub made or checked (URLs, channel names); a value that is
/// not one (never expected) is sent empty rather than failing the delivery.
fn header_value<T>(s: T) -> HeaderValue
where
    HeaderValue: TryFrom<T>,
{
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
    conn: &mut CallbackConn,
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
    post(conn, target, payload).await
}

/// POSTs a payload to the callback: the topic's `Content-Type`, `Link` rel=hub and rel=self
/// (then the topic's other links), and `X-Hub-Signature` over the exact body exactly when the
/// subscription has a secret.
pub(super) async fn post(
    conn: &mut CallbackConn,
    target: &Target,
    payload: Payload<'_>,
) -> Outcome {
    let callback = match &target.callback {
        Ok(callback) => callback,
        Err(reason) => {
            return Outcome::Failed {
                reason: reason.clone(),
                retry_after: None,
            }
        }
    };
    let sub = &target.sub;
    // Room for every header of a delivery (the connection adds `Host`, `User-Agent` and
    // `Content-Length`), so that the map never grows while it is filled.
    let mut headers = HeaderMap::with_capacity(16);
    for (name, value) in &target.headers {
        headers.insert(name, value.clone());
    }
    let delivery_id = header_value(payload.delivery_id);
    headers.insert(DELIVERY, delivery_id.clone());
    headers.insert(WEBHOOK_ID, delivery_id);
    for extra in payload.extra_links {
        headers.append(LINK, header_value(extra.as_str()));
    }
    if let Some(ct) = payload.content_type {
        headers.insert(CONTENT_TYPE, header_value(ct));
    }
    if let Some((first, last)) = payload.seqs {
        headers.insert(FIRST, HeaderValue::from(first));
        headers.insert(LAST, HeaderValue::from(last));
    }
    if let Some(epoch) = payload.epoch {
        headers.insert(EPOCH, header_value(epoch));
    }
    if let Some(secret) = &sub.secret {
        let value = signature::signature(sub.algorithm, secret.as_bytes(), &payload.body);
        headers.insert(SIGNATURE, header_value(value));
    }
    match conn.post(callback, headers, payload.body).await {
        Ok(answer) if answer.status.is_success() => Outcome::Delivered,
        Ok(answer) if answer.status == http::StatusCode::GONE => Outcome::Gone,
        Ok(answer) => {
            let retry_after = answer
                .retry_after
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .and_then(|v| retry::parse_retry_after(v, SystemTime::now()));
            Outcome::Failed {
                reason: format!("callback answered {}", answer.status),
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
