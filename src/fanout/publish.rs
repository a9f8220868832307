//! Publishing through `POST /hub` (and `/publish`): publish pings and fat pings.
//!
//! - A **publish ping** is form-encoded `hub.mode=publish` with `hub.url` or `hub.topic`
//!   (repeatable; both names are in use). A hosted channel's topic needs nothing (the hub
//!   already knows); an external topic allowed by `--allow-external-topics` is fetched in the
//!   background ([`super::external::External::ping`]); anything else is refused with 403 and a
//!   reason. The answer is 202 and never waits for the fetch.
//! - A **fat ping** is a ResourceSync Change List posted as `application/xml` (or `text/xml`)
//!   with `Link: <topic>; rel=self` — the way the ResourceSync PubSubHubbub publisher
//!   (resourcesync_push) sends notifications, with unquoted rel values. The document is
//!   validated (400 with the reason when it is not a valid Change List) and its new changes are
//!   recorded in the topic's log without fetching anything; 202 once they are durable.
//!   Hosted channels take changes only through authenticated ingest, so a fat ping naming a
//!   hosted topic is refused.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;

use super::external;
use crate::http::AppState;
use crate::ingest::{parse_body, Format};
use crate::net;

fn refuse(status: StatusCode, reason: impl Into<String>) -> Response {
    (status, reason.into()).into_response()
}

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

fn classify(state: &AppState, topic: &str) -> Result<Target, (StatusCode, String)> {
    if topic.len() > super::websub::MAX_URL_LEN {
        return Err((StatusCode::BAD_REQUEST, "topic URL is too long".to_string()));
    }
    if state.config.channel_for_topic(topic).is_some() {
        return Ok(Target::Hosted);
    }
    let url = url::Url::parse(topic)
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("topic {topic:?}: {e}")))?;
    if !external::is_allowed(&state.config, topic) {
        return Err((
            StatusCode::FORBIDDEN,
            format!(
                "topic {topic} is neither a channel of this hub nor under an allowed external prefix (--allow-external-topics)"
            ),
        ));
    }
    net::check_target(&url, state.config.allow_private_callbacks)
        .map_err(|e| (StatusCode::FORBIDDEN, format!("topic {topic} refused: {e}")))?;
    Ok(Target::External)
}

/// `hub.mode=publish`: 202, and the allowed external topics are fetched in the background.
pub fn ping(state: &AppState, body: &[u8]) -> Response {
    let topics = ping_topics(body);
    if topics.is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "hub.mode=publish needs hub.url or hub.topic",
        );
    }
    let mut external = Vec::new();
    for topic in &topics {
        match classify(state, topic) {
            Ok(Target::Hosted) => {}
            Ok(Target::External) => external.push(topic),
            Err(refusal) => return refusal.into_response(),
        }
    }
    for topic in external {
        // A topic nobody subscribes to has nothing to distribute.
        match state.fanout.external.by_url(topic) {
            Some(t) => {
                tracing::debug!(topic = %topic, "publish ping: fetching");
                state.fanout.external.ping(t);
            }
            None => tracing::debug!(topic = %topic, "publish ping for a topic without subscribers"),
        }
    }
    StatusCode::ACCEPTED.into_response()
}

/// A fat ping: a Change List with `Link: <topic>; rel=self`.
pub async fn fat_ping(state: &AppState, headers: &HeaderMap, body: Bytes) -> Response {
    let links: Vec<net::LinkValue> = headers
        .get_all(http::header::LINK)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(net::parse_links)
        .collect();
    let Some(topic) = links.iter().find(|l| l.has_rel("self")).map(|l| &l.target) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "a Change List posted to the hub needs a Link header naming its topic with rel=self",
        );
    };
    match classify(state, topic) {
        Ok(Target::Hosted) => {
            return refuse(
                StatusCode::FORBIDDEN,
                "this is a channel of this hub: its source pushes changes to /channels/{name}/changes with the channel token",
            )
        }
        Ok(Target::External) => {}
        Err(refusal) => return refusal.into_response(),
    }
    let changes = match parse_body(
        Format::Xml,
        &body,
        crate::resourcesync::Limits::default().max_entries,
    ) {
        Ok(changes) => changes,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("not a valid Change List: {}", e.reason),
            )
        }
    };
    let received = changes.len();
    let recorded = match state.fanout.external.by_url(topic) {
        Some(t) => match state.fanout.external.record(&t, changes).await {
            Ok(n) => n,
            Err(e) => return crate::http::ApiError::from(e).into_response(),
        },
        None => {
            tracing::debug!(topic = %topic, "fat ping for a topic without subscribers");
            0
        }
    };
    (
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "topic": topic, "received": received, "new": recorded })),
    )
        .into_response()
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
