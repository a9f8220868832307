//! `POST /channels/{name}/changes`: sources push changes. The channel's bearer token is
//! checked before the body is read; the body is read up to `--max-body`; [`ingest::accept`]
//! does the rest. 202 `{"accepted", "first", "last"}` once durable.

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{ApiError, AppState};
use crate::ingest::{self, Format, IngestError, MAX_IDEMPOTENCY_KEY};

/// `POST /channels/{name}/changes`.
pub async fn post_changes(
    State(state): State<AppState>,
    Path(name): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    // The head by value, not a copy of its header map (the `HeaderMap` extractor clones it).
    let (head, body) = request.into_parts();
    let headers = &head.headers;
    let hosted = state
        .feeds
        .get(&name)
        .ok_or_else(|| ApiError::not_found(format!("no channel {name:?}")))?;
    let counters = hosted.feed.counters();
    let source = ApiError::check_publisher(headers, &hosted.spec)?;

    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("invalid"));
    let format = Format::from_content_type(content_type).ok_or_else(|| {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json, application/x-ndjson or application/xml",
        )
    })?;
    let idempotency_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let key = v
                .to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"
                    ))
                })?;
            Some(key.to_string())
        }
    };

    let max_body = state.config.max_body;
    let bytes = super::read_body(body, max_body, state.config.http.body_timeout)
        .await
        .map_err(|e| match e.status {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                e.status,
                format!(
                    "the body is larger than --max-body ({max_body} bytes), or was cut off: send \
                     fewer changes per request (changehub publish splits a file for you) or \
                     start the hub with a larger --max-body"
                ),
            ),
            _ => e,
        })?;
    let appended = ingest::accept(
        state.store.as_ref(),
        &name,
        &source,
        format,
        &bytes,
        idempotency_key,
        state.config.max_future,
    )
    .await
    .inspect_err(|e| match e {
        IngestError::Store(_) => counters.failed.increment(1),
        _ => counters.rejected.increment(1),
    })
    .map_err(|e| match e {
        IngestError::Body(e) => ApiError {
            index: e.index,
            ..ApiError::bad_request(e.reason)
        },
        e @ IngestError::IdempotencyConflict => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
        }
        IngestError::Store(e) => ApiError::from(e),
    })?;
    tracing::debug!(channel = %name, first = appended.first, last = appended.last, replayed = appended.replayed, "changes accepted");
    if appended.replayed {
        counters.replayed.increment(1);
    } else {
        counters.accepted.increment(1);
        counters.changes.increment(appended.accepted as u64);
    }
    let replayed = appended.replayed;
    // {"accepted", "first", "last"}: `replayed` is the header below.
    let mut response = (StatusCode::ACCEPTED, Json(appended)).into_response();
    if replayed {
        response.headers_mut().insert(
            "idempotent-replayed",
            http::HeaderValue::from_static("true"),
        );
    }
    Ok(response)
}
