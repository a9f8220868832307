//! The Change Dumps of a channel: `GET /channels/{name}/changedump.xml` (the Change Dump, a
//! Change Dump Index with `?page=K` pages when it lists many dumps; also the topic that
//! announces new dumps, hence its `Link` rel=hub/self) and
//! `GET /channels/{name}/changedump/{FIRST-LAST}.zip` / `.manifest.xml` (a package and the
//! copy of its manifest). Private channels need their read token. Rendering and the list are
//! [`crate::dumps`]'.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{read_token, ApiError, AppState};
use crate::model::DumpSettings;
use crate::{auth, dumps, net};

#[derive(Debug, Default, Deserialize)]
pub struct DumpQuery {
    token: Option<String>,
    page: Option<String>,
}

/// The channel's dump settings, once the request may read it.
fn readable(
    state: &AppState,
    name: &str,
    headers: &HeaderMap,
    token: Option<&str>,
) -> Result<DumpSettings, ApiError> {
    let channel = state
        .feeds
        .get(name)
        .ok_or_else(|| ApiError::not_found(format!("no channel {name:?}")))?;
    if !auth::can_read(&channel.spec, read_token(headers, token)) {
        return Err(ApiError::unauthorized(
            "this channel is private: give its read token",
        ));
    }
    channel
        .spec
        .dumps
        .ok_or_else(|| ApiError::not_found(format!("channel {name:?} publishes no Change Dumps")))
}

/// `GET /channels/{name}/changedump.xml[?page=K]`
pub async fn change_dump(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<DumpQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let settings = readable(&state, &name, &headers, q.token.as_deref())?;
    let page = match q.page.as_deref() {
        None => None,
        Some(p) => Some(
            p.parse::<u64>()
                .ok()
                .filter(|k| *k >= 1)
                .ok_or_else(|| ApiError::bad_request("page must be a number from 1"))?,
        ),
    };
    let body = dumps::document(
        &state.config,
        state.store.as_ref(),
        &name,
        settings.per_document,
        page,
    )
    .await?
    .ok_or_else(|| ApiError::not_found("no such page of the Change Dump Index"))?;
    let mut response = (
        [(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/xml"),
        )],
        body,
    )
        .into_response();
    let links = net::hub_links(
        &state.config.urls.hub(),
        &state.config.urls.change_dump(&name),
    );
    if let Ok(v) = HeaderValue::from_str(&links) {
        response.headers_mut().insert(http::header::LINK, v);
    }
    response.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    Ok(response)
}

/// `GET /channels/{name}/changedump/{file}`: `FIRST-LAST.zip` or `FIRST-LAST.manifest.xml`
/// of a listed dump (immutable once listed).
pub async fn dump_file(
    State(state): State<AppState>,
    Path((name, file)): Path<(String, String)>,
    Query(q): Query<DumpQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    readable(&state, &name, &headers, q.token.as_deref())?;
    let not_found = || ApiError::not_found(format!("no Change Dump file {file:?}"));
    let (path, media_type) = dumps::listed_file(&state.config, state.store.as_ref(), &name, &file)
        .await?
        .ok_or_else(not_found)?;
    let opened = tokio::fs::File::open(&path).await;
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot open a Change Dump file");
            return Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "cannot read the Change Dump file now",
            ));
        }
    };
    let length = file.metadata().await.map(|m| m.len()).ok();
    let mut response = Body::from_stream(tokio_util::io::ReaderStream::new(file)).into_response();
    let h = response.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(media_type),
    );
    if let Some(length) = length {
        h.insert(http::header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    Ok(response)
}
