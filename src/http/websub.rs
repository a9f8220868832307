//! `POST /hub` (also `POST /publish`, the name ResourceSync publishers use): WebSub. By
//! `Content-Type` and `hub.mode`:
//! - an XML body is a fat ping ([`crate::external::publish::fat_ping`]): 202 once its new changes
//!   are durable;
//! - `hub.mode=publish` is a publish ping ([`crate::external::publish::ping`]): 202 at once;
//! - `hub.mode=subscribe|unsubscribe` is checked ([`websub::parse_request`]), answered 202,
//!   and verified in the background ([`websub::process`]): this handler never waits on
//!   outbound HTTP.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;

use super::{ApiError, AppState};
use crate::external::publish::{self, FatPingError};
use crate::fanout::websub;
use crate::net::media;

/// Largest form body: a WebSub request is a few parameters.
const FORM_LIMIT: usize = 64 * 1024;

/// `POST /hub`. The body is read after its type is known, up to the limit of that kind of
/// request: a form to [`FORM_LIMIT`], a fat ping's Change List to `--max-body`.
pub async fn hub(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/x-www-form-urlencoded");
    let is_xml = media::is_xml(content_type);
    if !is_xml && media::essence(content_type) != "application/x-www-form-urlencoded" {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "WebSub requests are application/x-www-form-urlencoded",
        )
            .into_response();
    }
    let limit = if is_xml {
        state.config.max_body
    } else {
        FORM_LIMIT
    };
    let body: Bytes = match super::read_body(body, limit, state.config.http.body_timeout).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    if is_xml {
        let links: Vec<&str> = headers
            .get_all(http::header::LINK)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        return match publish::fat_ping(&state.config, &state.external, &links, &body).await {
            Ok(done) => (StatusCode::ACCEPTED, Json(done)).into_response(),
            Err(FatPingError::Refused(refusal)) => refusal.into_response(),
            Err(FatPingError::Store(e)) => ApiError::from(e).into_response(),
        };
    }
    if form_urlencoded::parse(&body).any(|(k, v)| k == "hub.mode" && v == "publish") {
        return match publish::ping(&state.config, &state.external, &body) {
            Ok(()) => StatusCode::ACCEPTED.into_response(),
            Err(refusal) => refusal.into_response(),
        };
    }
    let request = match websub::parse_request(&body, state.config.allow_private_callbacks) {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    let (fanout, external) = (state.fanout.clone(), state.external.clone());
    state
        .tasks
        .spawn(websub::process(fanout, external, request));
    StatusCode::ACCEPTED.into_response()
}
