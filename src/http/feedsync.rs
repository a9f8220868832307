//! FeedSync: `GET /channels/{name}/feedsync.xml` and `feedsync.json` (the channel's items as a
//! FeedSync collection, complete or `?since=SEQ`; private channels need the read token), and
//! `POST /channels/{name}/feedsync` (a source merges a collection, POX as `application/xml`
//! or JSON as `application/json`, with a publisher token; 202 once the changes it makes are
//! durable). Rendering and parsing are [`crate::feedsync`]'s, the merge
//! [`crate::ingest::feedsync`]'s, the collection [`crate::catchup::feedsync_collection`]'s.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::{read_token, ApiError, AppState};
use crate::ingest::feedsync::{incorporate, MergeError, MAX_ITEMS};
use crate::{auth, catchup, feedsync};

#[derive(Debug, Deserialize)]
pub struct CollectionQuery {
    since: Option<String>,
    token: Option<String>,
}

/// The collection of a channel a request may read.
async fn collection(
    state: &AppState,
    name: &str,
    headers: &HeaderMap,
    q: &CollectionQuery,
) -> Result<feedsync::Collection, ApiError> {
    match state.feeds.get(name) {
        Some(channel) => {
            if !auth::can_read(&channel.spec, read_token(headers, q.token.as_deref())) {
                return Err(ApiError::unauthorized(
                    "this channel is private: give its read token",
                ));
            }
        }
        None if state.external.by_channel(name).is_some() => {}
        None => return Err(ApiError::not_found(format!("no channel {name:?}"))),
    }
    let since = match q.since.as_deref() {
        None => 0,
        Some(s) => s.parse::<u64>().map_err(|_| {
            ApiError::bad_request("since must be a seq (the until of an earlier collection)")
        })?,
    };
    Ok(catchup::feedsync_collection(state.store.as_ref(), name, since).await?)
}

fn document(content_type: &'static str, body: String, until: u64) -> Response {
    let mut response = ([(http::header::CONTENT_TYPE, content_type)], body).into_response();
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&until.to_string()) {
        headers.insert("x-changehub-seq", v);
    }
    headers.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    response
}

/// `GET /channels/{name}/feedsync.xml[?since=SEQ]`
pub async fn collection_xml(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<CollectionQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = collection(&state, &name, &headers, &q).await?;
    Ok(document(
        "application/xml",
        feedsync::write_pox(&c),
        c.until,
    ))
}

/// `GET /channels/{name}/feedsync.json[?since=SEQ]`
pub async fn collection_json(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<CollectionQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let c = collection(&state, &name, &headers, &q).await?;
    let body = feedsync::write_json(&c).to_string();
    Ok(document("application/json", body, c.until))
}

impl From<MergeError> for ApiError {
    fn from(e: MergeError) -> ApiError {
        match e {
            MergeError::Parse(e) => ApiError::bad_request(e.to_string()),
            e @ MergeError::Item { .. } => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
            }
            e @ MergeError::Busy => ApiError::new(StatusCode::CONFLICT, e.to_string()),
            MergeError::Store(e) => ApiError::from(e),
        }
    }
}

/// `POST /channels/{name}/feedsync`: 202 `{"items", "accepted", "first", "last",
/// "conflicts"}` (`first`/`last` only when something was appended).
pub async fn post_collection(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let channel = state
        .feeds
        .spec(&name)
        .ok_or_else(|| ApiError::not_found(format!("no channel {name:?}")))?;
    let publisher = ApiError::check_publisher(&headers, &channel)?;
    let essence = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(crate::net::media::essence);
    let json = match essence.as_deref() {
        Some("application/json") => true,
        Some("application/xml" | "text/xml") => false,
        _ => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Content-Type must be application/xml (a POX collection) or application/json",
            ))
        }
    };
    let bytes =
        super::read_body(body, state.config.max_body, state.config.http.body_timeout).await?;
    let items = if json {
        feedsync::parse_json(&bytes, MAX_ITEMS)
    } else {
        feedsync::parse_pox(&bytes, MAX_ITEMS)
    }
    .map_err(MergeError::from)?;
    let now = time::OffsetDateTime::now_utc();
    let done = incorporate(state.store.as_ref(), &name, &publisher, &items, now).await?;
    let mut answer = serde_json::json!({
        "items": done.items,
        "accepted": done.appended.map_or(0, |a| a.accepted),
        "conflicts": done.conflicts,
    });
    if let Some(a) = done.appended {
        answer["first"] = a.first.into();
        answer["last"] = a.last.into();
    }
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}
