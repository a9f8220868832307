//! Catch-up and discovery: the documents anyone can pull.
//!
//! - `changelist.xml`: the topic, an open Change List of the newest retained changes, with
//!   `Link` rel=hub/self and an `ETag` (304 on `If-None-Match`).
//! - `changes?after=SEQ&limit=N`: the exact page of changes after a seq, with `rel="next"`
//!   while more remain; 410 with the oldest retained seq when SEQ fell out of retention.
//! - `capabilitylist.xml` and `/.well-known/resourcesync`: ResourceSync discovery.
//!
//! Everything here only reads the store.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::batcher::capability_list_url;
use crate::http::{ApiError, AppState};
use crate::resourcesync::{self, Capability, ChangeListHeader, DocLink};

/// Most changes in the open Change List and in one `changes?after=` page.
pub const MAX_LIST: usize = 50_000;
/// Default page size of `changes?after=`.
pub const DEFAULT_PAGE: usize = 1_000;

/// The topic URL of channel `name` — a hosted channel, or the internal channel of an external
/// topic — when `headers` / `token` may read it (private channels need their read token).
fn readable(
    state: &AppState,
    name: &str,
    headers: &HeaderMap,
    token: Option<&str>,
) -> Result<String, ApiError> {
    if let Some(channel) = state.config.channels.get(name) {
        if !crate::live::read_allowed(channel, crate::live::request_token(headers, token)) {
            return Err(ApiError::unauthorized(
                "this channel is private: give its read token",
            ));
        }
    }
    topic_of(state, name)
}

/// The topic of a channel, or of the internal channel of an external topic (whose log
/// `changes?after=` serves too).
fn topic_of(state: &AppState, name: &str) -> Result<String, ApiError> {
    if state.config.channels.contains_key(name) {
        return Ok(state.config.urls.topic(name));
    }
    state
        .fanout
        .external
        .by_channel(name)
        .map(|t| t.url.clone())
        .ok_or_else(|| ApiError::not_found(format!("no channel {name:?}")))
}

fn xml(body: Vec<u8>) -> Response {
    (
        [(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/xml"),
        )],
        body,
    )
        .into_response()
}

fn hub_links(state: &AppState, topic: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!(
        "<{}>; rel=\"hub\", <{topic}>; rel=\"self\"",
        state.config.urls.hub(),
    ))
    .ok()
}

/// `GET /channels/{name}/changelist.xml`
pub async fn changelist(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let topic = readable(&state, &name, &headers, q.token.as_deref())?;
    let head = state.store.head(&name).await?;
    let etag = format!("\"{}-{}\"", head.oldest, head.last);
    let mut response = if headers
        .get(http::header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().trim_start_matches("W/") == etag)
        }) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let changes = state.store.read_newest(&name, MAX_LIST).await?;
        let header = ChangeListHeader {
            from: changes.first().map(|c| c.datetime),
            until: None,
            links: vec![DocLink {
                rel: "up".into(),
                href: capability_list_url(&state.config, &name),
            }],
            seq_range: changes
                .first()
                .zip(changes.last())
                .map(|(f, l)| (f.seq, l.seq)),
        };
        xml(resourcesync::write_change_list(&header, &changes))
    };
    let h = response.headers_mut();
    if let Some(link) = hub_links(&state, &topic) {
        h.insert(http::header::LINK, link);
    }
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(http::header::ETAG, v);
    }
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    Ok(response)
}

#[derive(Debug, Deserialize)]
pub struct AfterQuery {
    after: Option<String>,
    limit: Option<String>,
    token: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct TokenQuery {
    token: Option<String>,
}

/// `GET /channels/{name}/changes?after=SEQ&limit=N`
pub async fn changes_after(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<AfterQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let topic = readable(&state, &name, &headers, q.token.as_deref())?;
    let after = match q.after.as_deref() {
        None => 0,
        Some(s) => s
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request("after must be a seq (a non-negative integer)"))?,
    };
    let limit = match q.limit.as_deref() {
        None => DEFAULT_PAGE,
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=MAX_LIST).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "limit must be between 1 and {MAX_LIST}"
                )))
            }
        },
    };
    let head = state.store.head(&name).await?;
    if after.saturating_add(1) < head.oldest {
        return Err(ApiError {
            oldest: Some(head.oldest),
            ..ApiError::new(
                StatusCode::GONE,
                format!(
                    "changes after {after} are no longer retained; the oldest retained seq is {}",
                    head.oldest
                ),
            )
        });
    }
    let changes = state.store.read(&name, after, limit).await?;
    let last = changes.last().map(|c| c.seq).unwrap_or(after);
    let mut links = vec![DocLink {
        rel: "up".into(),
        href: capability_list_url(&state.config, &name),
    }];
    let next = (last < head.last).then(|| {
        format!(
            "{}/channels/{name}/changes?after={last}&limit={limit}",
            state.config.public_url
        )
    });
    if let Some(next) = &next {
        links.push(DocLink {
            rel: "next".into(),
            href: next.clone(),
        });
    }
    let header = ChangeListHeader {
        from: changes.first().map(|c| c.datetime),
        until: changes.last().map(|c| c.datetime),
        links,
        seq_range: changes
            .first()
            .zip(changes.last())
            .map(|(f, l)| (f.seq, l.seq)),
    };
    let mut response = xml(resourcesync::write_change_list(&header, &changes));
    let mut link = format!(
        "<{}>; rel=\"hub\", <{}>; rel=\"self\"",
        state.config.urls.hub(),
        topic
    );
    if let Some(next) = &next {
        link.push_str(&format!(", <{next}>; rel=\"next\""));
    }
    if let Ok(v) = HeaderValue::from_str(&link) {
        response.headers_mut().insert(http::header::LINK, v);
    }
    Ok(response)
}

/// `GET /channels/{name}/capabilitylist.xml`
pub async fn capability_list(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    readable(&state, &name, &headers, q.token.as_deref())?;
    let links = [
        DocLink {
            rel: "up".into(),
            href: format!("{}/.well-known/resourcesync", state.config.public_url),
        },
        DocLink {
            rel: "hub".into(),
            href: state.config.urls.hub(),
        },
    ];
    let caps = [Capability {
        loc: format!("{}/channels/{name}/changelist.xml", state.config.public_url),
        capability: "changelist".into(),
    }];
    Ok(xml(resourcesync::write_capability_list(&links, &caps)))
}

/// `GET /.well-known/resourcesync`
pub async fn source_description(State(state): State<AppState>) -> Response {
    let lists: Vec<String> = state
        .config
        .channels
        .keys()
        .map(|name| capability_list_url(&state.config, name))
        .collect();
    xml(resourcesync::write_source_description(&[], &lists))
}
