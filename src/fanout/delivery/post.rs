//! One POST to a callback: the headers every delivery carries (hub and self links, the
//! channel, the delivery id, the seq range, the signature) and what the answer means.

use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::fanout::signing::Lane;
use crate::fanout::Fanout;
use crate::model::signature;
use crate::model::Notification;
use crate::model::Subscription;
use crate::net::callback::{Callback, CallbackConn};
use crate::net::http1::HeaderLines;
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
/// the parsed and checked callback URL, and the header lines that never change.
pub(super) struct Target {
    pub(super) sub: Arc<Subscription>,
    /// The callback, or why nothing can be sent to it.
    callback: Result<Callback, String>,
    /// `Link: <hub>; rel="hub", <topic>; rel="self"` and `X-Changehub-Channel`.
    lines: HeaderLines,
    /// The key of `X-Hub-Signature`, when the subscription has a secret.
    signer: Option<signature::Signer>,
    /// The subscription's place among those that sign shared notifications together (SHA-256
    /// secrets only, on CPUs that can).
    lane: Option<Lane>,
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
        let mut lines = HeaderLines::default();
        lines.push("link", link);
        lines.push("x-changehub-channel", &sub.channel);
        let signer = sub
            .secret
            .as_ref()
            .map(|secret| signature::Signer::new(sub.algorithm, secret.as_bytes()));
        let lane = match (&sub.secret, sub.algorithm) {
            (Some(secret), signature::Algorithm::Sha256) => {
                fanout.signing.join(&sub.channel, secret.as_bytes())
            }
            _ => None,
        };
        Target {
            callback,
            lines,
            signer,
            lane,
            sub,
        }
    }
}

/// `X-Changehub-Delivery` and `webhook-id`: the same on every retry of the same payload.
pub(super) enum DeliveryId<'a> {
    /// A Change List notification. The epoch is in the id: after the log starts again, the
    /// same seqs are other changes.
    Seqs {
        sub: &'a str,
        epoch: Option<&'a str>,
        first: u64,
        last: u64,
    },
    /// A version of an external topic's content.
    Content { sub: &'a str, version: u64 },
}

impl DeliveryId<'_> {
    /// Appends the id to `out` (`SUB-EPOCH-FIRST-LAST`, `SUB-FIRST-LAST` or `SUB-cVERSION`).
    fn write_to(&self, out: &mut Vec<u8>) {
        let mut number = itoa::Buffer::new();
        match self {
            DeliveryId::Seqs {
                sub,
                epoch,
                first,
                last,
            } => {
                out.extend_from_slice(sub.as_bytes());
                if let Some(epoch) = epoch {
                    out.push(b'-');
                    out.extend_from_slice(epoch.as_bytes());
                }
                out.push(b'-');
                out.extend_from_slice(number.format(*first).as_bytes());
                out.push(b'-');
                out.extend_from_slice(number.format(*last).as_bytes());
            }
            DeliveryId::Content { sub, version } => {
                out.extend_from_slice(sub.as_bytes());
                out.extend_from_slice(b"-c");
                out.extend_from_slice(number.format(*version).as_bytes());
            }
        }
    }
}

/// What one POST carries.
pub(super) struct Payload<'a> {
    pub(super) body: Bytes,
    /// The notification `body` is of, when other workers send it too: then its signature may
    /// be made with theirs.
    pub(super) shared: Option<&'a Arc<Notification>>,
    /// The topic's media type (`None`: the topic gave none, so none is sent).
    pub(super) content_type: Option<&'a str>,
    /// `Link` values sent after the hub's own `rel=hub` / `rel=self` header.
    pub(super) extra_links: &'a [String],
    pub(super) delivery_id: DeliveryId<'a>,
    /// The seq range of a Change List notification (`X-Changehub-First` / `-Last`).
    pub(super) seqs: Option<(u64, u64)>,
    /// The epoch of the log those seqs belong to (`X-Changehub-Epoch`).
    pub(super) epoch: Option<&'a str>,
}

/// POSTs one notification to the callback.
pub(super) async fn deliver(
    conn: &mut CallbackConn,
    target: &Target,
    n: &Arc<Notification>,
    epoch: Option<&str>,
) -> Outcome {
    let (first, last) = (n.first, n.last);
    let delivery_id = DeliveryId::Seqs {
        sub: &target.sub.id,
        epoch,
        first,
        last,
    };
    let payload = Payload {
        body: n.body.clone(),
        shared: Some(n),
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
    // Room for every line of a delivery's head, so that it is made with one allocation.
    let mut lines = HeaderLines::with_capacity(target.lines.len() + 512);
    lines.extend(&target.lines);
    lines.push_twice("x-changehub-delivery", "webhook-id", |out| {
        payload.delivery_id.write_to(out)
    });
    for extra in payload.extra_links {
        lines.push("link", extra);
    }
    if let Some(ct) = payload.content_type {
        lines.push("content-type", ct);
    }
    if let Some((first, last)) = payload.seqs {
        lines.push_u64("x-changehub-first", first);
        lines.push_u64("x-changehub-last", last);
    }
    if let Some(epoch) = payload.epoch {
        lines.push("x-changehub-epoch", epoch);
    }
    if let Some(signer) = &target.signer {
        let together = target.lane.as_ref().zip(payload.shared);
        match together.and_then(|(lane, shared)| lane.sign(shared)) {
            Some(tag) => lines.push_with("x-hub-signature", |out| {
                signature::write_value(signature::Algorithm::Sha256, &tag, out)
            }),
            None => lines.push_with("x-hub-signature", |out| signer.write(&payload.body, out)),
        }
    }
    match conn.post(callback, &lines, payload.body).await {
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

#[cfg(test)]
mod tests {
    use super::DeliveryId;

    #[test]
    fn delivery_ids_are_the_subscription_the_epoch_and_the_range_or_the_version() {
        let id = |d: DeliveryId| {
            let mut out = Vec::new();
            d.write_to(&mut out);
            String::from_utf8(out).unwrap()
        };
        let seqs = |epoch| DeliveryId::Seqs {
            sub: "s7",
            epoch,
            first: 1,
            last: u64::MAX,
        };
        assert_eq!(id(seqs(Some("e0f1"))), format!("s7-e0f1-1-{}", u64::MAX));
        assert_eq!(id(seqs(None)), format!("s7-1-{}", u64::MAX));
        let content = DeliveryId::Content {
            sub: "s7",
            version: 0,
        };
        assert_eq!(id(content), "s7-c0");
    }
}
