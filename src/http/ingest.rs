//! `POST /channels/{name}/changes`: sources push changes. The channel's bearer token is
//! checked before the body is read; the body is read up to `--max-body`; [`ingest::accept`]
//! does the rest. 202 `{"accepted", "first", "last"}` once durable.
//!
//! The hub's most frequent request, so most of them come here without the router: see
//! [`direct`].

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;

use super::{ApiError, AppState};
use crate::ingest::{self, Format, IngestError, MAX_IDEMPOTENCY_KEY};

/// `POST /channels/{name}/changes` through the router (the way around it: [`direct`]).
pub async fn post_changes(
    State(state): State<AppState>,
    Path(name): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    // The head by value, not a copy of its header map (the `HeaderMap` extractor clones it).
    let (head, body) = request.into_parts();
    push(&state, &name, &head, body).await
}

/// Whether `request` can be served without the router: a `POST
/// /channels/{name}/changes` whose name needs no decoding (no `%`) and whose body no
/// `Content-Encoding` (that is the router's layers' to decode or refuse). Every other request
/// goes through the router, as does any push that does not fit these.
///
/// The router costs such a request about a third of its allocations (the path's parameters
/// and their extensions map, boxed clones of the routes, a boxed future per layer), for
/// nothing a push needs: the handler reads its body with its own limit and timeout, and
/// [`super::App`] answers a panic 500 as the layers would.
pub(super) fn direct<B>(request: &http::Request<B>) -> bool {
    request.method() == http::Method::POST
        && !request
            .headers()
            .contains_key(http::header::CONTENT_ENCODING)
        && plain_name(request.uri().path()).is_some()
}

/// The channel's name in `path` when it is `/channels/{name}/changes` and the name needs no
/// decoding.
fn plain_name(path: &str) -> Option<&str> {
    let name = path.strip_prefix("/channels/")?.strip_suffix("/changes")?;
    let plain = !name.is_empty() && !name.contains(['/', '%']);
    plain.then_some(name)
}

/// A push that [`direct`] let through: what [`post_changes`] does, the same answers.
pub(super) async fn post_direct(
    state: AppState,
    request: http::Request<hyper::body::Incoming>,
) -> Response {
    let (head, body) = request.into_parts();
    // (The name borrowed from the head: no copy of it.)
    let Some(name) = plain_name(head.uri.path()) else {
        return super::no_such_endpoint().await.into_response();
    };
    push(&state, name, &head, body).await.into_response()
}

/// Checks, reads and appends one push to channel `name`.
async fn push<B>(
    state: &AppState,
    name: &str,
    head: &http::request::Parts,
    body: B,
) -> Result<Response, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let headers = &head.headers;
    let hosted = state
        .feeds
        .get(name)
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
        name,
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

#[cfg(test)]
mod tests {
    use super::{direct, plain_name};

    fn request(method: &str, uri: &str, encoding: Option<&str>) -> http::Request<()> {
        let mut builder = http::Request::builder().method(method).uri(uri);
        if let Some(encoding) = encoding {
            builder = builder.header(http::header::CONTENT_ENCODING, encoding);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn only_plain_pushes_go_around_the_router() {
        let direct_to = |method, uri, encoding| direct(&request(method, uri, encoding));
        assert!(direct_to("POST", "/channels/news/changes", None));
        assert!(
            direct_to("POST", "http://hub/channels/news/changes?x=1", None),
            "the query is the handler's to ignore"
        );
        assert_eq!(plain_name("/channels/news/changes"), Some("news"));
        for (method, uri, encoding) in [
            ("GET", "/channels/news/changes", None),
            ("POST", "/channels/news/changes", Some("gzip")),
            ("POST", "/channels/news/changes", Some("identity")),
            ("POST", "/channels/n%65ws/changes", None),
            ("POST", "/channels//changes", None),
            ("POST", "/channels/a/b/changes", None),
            ("POST", "/channels/news/changes/", None),
            ("POST", "/channels/news/feedsync", None),
            ("POST", "/hub", None),
        ] {
            assert!(
                !direct_to(method, uri, encoding),
                "{method} {uri} {encoding:?}"
            );
        }
    }
}
