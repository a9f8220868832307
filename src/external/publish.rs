//! Publishing to external topics: publish pings and fat pings (`POST /hub` and `/publish`;
//! the HTTP side is `crate::http::websub`).
//!
//! - A **publish ping** is form-encoded `hub.mode=publish` with `hub.url` or `hub.topic`
//!   (repeatable; both names are in use). A hosted channel's topic needs nothing (the hub
//!   already knows); an external topic allowed by `--allow-external-topics` is fetched in the
//!   background ([`super::External::ping`]); anything else is refused with 403 and a
//!   reason. The answer is 202 and never waits for the fetch.
//! - A **fat ping** is a ResourceSync Change List posted as `application/xml` (or `text/xml`)
//!   with `Link: <topic>; rel=self` — the way the ResourceSync PubSubHubbub publisher
//!   (resourcesync_push) sends notifications, with unquoted rel values. The document is
//!   validated (400 with the reason when it is not a valid Change List) and its new changes are
//!   recorded in the topic's log without fetching anything; 202 once they are durable.
//!   Hosted channels take changes only through authenticated ingest, so a fat ping naming a
//!   hosted topic is refused.

use http::StatusCode;
use std::sync::Arc;

use super::{is_allowed, External};
use crate::config::Config;
use crate::ingest::{parse_body, Format};
use crate::net;
use crate::resourcesync::Limits;

/// A refused publish: the status and a plain-text reason.
pub type Refusal = (StatusCode, String);

/// Longest topic URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// The topic URLs of a ping: every `hub.url` and `hub.topic`.
pub fn ping_topics(body: &[u8]) -> Vec<String> {
    form_urlencoded::parse(body)
        .filter(|(k, _)| k == "hub.url" || k == "hub.topic")
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

/// What a topic named by a publisher is to this hub.
enum Target {
    Hosted,
    External,
}

fn classify(config: &Config, topic: &str) -> Result<Target, Refusal> {
    if topic.len() > MAX_URL_LEN {
        return Err((StatusCode::BAD_REQUEST, "topic URL is too long".to_string()));
    }
    // A topic URL of this hub (whether or not that channel exists now) is never external.
    if config.urls.channel_of_topic(topic).is_some() {
        return Ok(Target::Hosted);
    }
    let url = url::Url::parse(topic)
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("topic {topic:?}: {e}")))?;
    if !is_allowed(config, topic) {
        return Err((
            StatusCode::FORBIDDEN,
            format!(
                "topic {topic} is neither a channel of this hub nor under an allowed external prefix (--allow-external-topics)"
            ),
        ));
    }
    net::check_target(&url, config.allow_private_callbacks)
        .map_err(|e| (StatusCode::FORBIDDEN, format!("topic {topic} refused: {e}")))?;
    Ok(Target::External)
}

/// `hub.mode=publish` (form body): the allowed external topics are fetched in the background;
/// `Ok` means "answer 202". Never waits for a fetch.
pub fn ping(config: &Config, external: &Arc<External>, body: &[u8]) -> Result<(), Refusal> {
    let topics = ping_topics(body);
    if topics.is_empty() {
        return Err((
            StatusCode::BAD_REQUEST,
            "hub.mode=publish needs hub.url or hub.topic".to_string(),
        ));
    }
    let mut pinged = Vec::new();
    for topic in &topics {
        match classify(config, topic)? {
            Target::Hosted => {}
            Target::External => pinged.push(topic),
        }
    }
    for topic in pinged {
        external.ping_url(topic);
    }
    Ok(())
}

/// Why a fat ping was not recorded.
#[derive(Debug)]
pub enum FatPingError {
    Refused(Refusal),
    Store(crate::store::StoreError),
}

impl From<Refusal> for FatPingError {
    fn from(r: Refusal) -> FatPingError {
        FatPingError::Refused(r)
    }
}

/// What a fat ping came to.
#[derive(Debug, serde::Serialize)]
pub struct FatPing {
    pub topic: String,
    /// Changes in the posted document.
    pub received: usize,
    /// Changes not seen before, now durable in the topic's log.
    pub new: usize,
}

/// A fat ping: a Change List posted with `Link: <topic>; rel=self` (`links` are the request's
/// `Link` header values). Returns once the new changes are durable.
pub async fn fat_ping(
    config: &Config,
    external: &External,
    links: &[&str],
    body: &[u8],
) -> Result<FatPing, FatPingError> {
    let links: Vec<net::LinkValue> = links.iter().flat_map(|v| net::parse_links(v)).collect();
    let Some(topic) = links.iter().find(|l| l.has_rel("self")).map(|l| &l.target) else {
        return Err(FatPingError::Refused((
            StatusCode::BAD_REQUEST,
            "a Change List posted to the hub needs a Link header naming its topic with rel=self"
                .to_string(),
        )));
    };
    match classify(config, topic)? {
        Target::Hosted => {
            return Err(FatPingError::Refused((
                StatusCode::FORBIDDEN,
                "this is a channel of this hub: its source pushes changes to /channels/{name}/changes with the channel token".to_string(),
            )))
        }
        Target::External => {}
    }
    let changes = parse_body(Format::Xml, body, Limits::default().max_entries).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("not a valid Change List: {}", e.reason),
        )
    })?;
    crate::ingest::not_too_far_ahead(&changes, time::OffsetDateTime::now_utc(), config.max_future)
        .map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("not a valid Change List: {}", e.reason),
            )
        })?;
    let received = changes.len();
    let new = match external.by_url(topic) {
        Some(t) => external
            .record(&t, changes)
            .await
            .map_err(FatPingError::Store)?,
        None => {
            tracing::debug!(topic = %topic, "fat ping for a topic without subscribers");
            0
        }
    };
    Ok(FatPing {
        topic: topic.clone(),
        received,
        new,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_topic_names() {
        assert_eq!(
            ping_topics(b"hub.mode=publish&hub.url=http%3A%2F%2Fa%2F1&hub.topic=http%3A%2F%2Fa%2F2&hub.url="),
            vec!["http://a/1", "http://a/2"]
        );
    }
}
