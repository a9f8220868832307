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

use super::{external, net};
use crate::http::AppState;
use crate::ingest::{parse_body, Format};

/// One link of a `Link` header (RFC 8288): its target, its rel values (lowercased) and the
/// text it was written as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkValue {
    pub target: String,
    pub rels: Vec<String>,
    pub raw: String,
}

impl LinkValue {
    pub fn has_rel(&self, rel: &str) -> bool {
        self.rels.iter().any(|r| r.eq_ignore_ascii_case(rel))
    }
}

/// Splits `s` on `sep` outside `<…>` and quoted strings.
fn split_outside(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut in_angle, mut in_quote, mut escaped) = (false, false, false);
    let mut start = 0;
    for (i, ch) in s.char_indices() {
        if in_quote {
            match ch {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_quote = false,
                _ => {}
            }
            continue;
        }
        match ch {
            '"' if !in_angle => in_quote = true,
            '<' => in_angle = true,
            '>' => in_angle = false,
            c if c == sep && !in_angle => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Parses one `Link` header value, which may hold several links. Accepts quoted and unquoted
/// parameter values (`rel=self`, `rel="self"`, `rel="self hub"`); skips what it cannot read.
pub fn parse_links(value: &str) -> Vec<LinkValue> {
    let mut out = Vec::new();
    for link in split_outside(value, ',') {
        let raw = link.trim();
        let mut parts = split_outside(raw, ';').into_iter();
        let Some(target) = parts
            .next()
            .map(str::trim)
            .and_then(|t| t.strip_prefix('<'))
            .and_then(|t| t.strip_suffix('>'))
        else {
            continue;
        };
        let mut rels = Vec::new();
        for param in parts {
            let Some((name, value)) = param.split_once('=') else {
                continue;
            };
            if !name.trim().eq_ignore_ascii_case("rel") {
                continue;
            }
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            rels.extend(value.split_ascii_whitespace().map(str::to_ascii_lowercase));
        }
        out.push(LinkValue {
            target: target.trim().to_string(),
            rels,
            raw: raw.to_string(),
        });
    }
    out
}

/// True for the media types of a fat ping.
pub fn is_xml(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(essence.as_str(), "application/xml" | "text/xml")
}

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
    let links: Vec<LinkValue> = headers
        .get_all(http::header::LINK)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(parse_links)
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
    fn link_headers_in_every_spelling() {
        let l = parse_links("<http://t/x.xml>;rel=self, <http://h/hub>;rel=hub");
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].target, "http://t/x.xml");
        assert!(l[0].has_rel("self") && l[1].has_rel("hub"));
        let l = parse_links(r#"<http://t/a,b>; rel="self hub"; title="x, y; z""#);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].target, "http://t/a,b");
        assert!(l[0].has_rel("self") && l[0].has_rel("hub"));
        let l = parse_links(r#"<http://t/p>; type="text/html"; REL="Alternate""#);
        assert!(l[0].has_rel("alternate"));
        assert!(parse_links("garbage, <>").iter().all(|l| l.rels.is_empty()));
    }

    #[test]
    fn ping_topic_names() {
        assert_eq!(
            ping_topics(b"hub.mode=publish&hub.url=http%3A%2F%2Fa%2F1&hub.topic=http%3A%2F%2Fa%2F2&hub.url="),
            vec!["http://a/1", "http://a/2"]
        );
        assert!(is_xml("application/xml; charset=utf-8"));
        assert!(is_xml("Text/XML"));
        assert!(!is_xml("application/x-www-form-urlencoded"));
    }
}
