//! Live: channels followed by people and programs as they change.
//!
//! - [`follow`]: replay from the log, then live, without a gap or a duplicate (shared).
//! - [`ws`]: `GET /ws`, the websocket protocol (`proto/websocket.md`).
//! - [`sse`]: `GET /channels/{name}/events`, server-sent events.
//! - [`frames`]: the JSON frames both speak.
//! - [`dashboard`]: `GET /`, the page, compiled into the binary.
//!
//! Everything here only reads: the log through the store, and notifications through each
//! channel's [`crate::batcher::ChannelFeed`].

pub mod dashboard;
pub mod follow;
pub mod frames;
pub mod sse;
pub mod ws;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::Serialize;

use crate::config::ChannelConfig;
use crate::http::{ApiError, AppState};

/// True when `token` may read `channel` (public channels need none).
pub fn read_allowed(channel: &ChannelConfig, token: Option<&str>) -> bool {
    match &channel.read_token {
        None => true,
        Some(expected) => {
            token.is_some_and(|t| crate::auth::same_secret(t.as_bytes(), expected.as_bytes()))
        }
    }
}

/// The read token of a request: `Authorization: Bearer …` or `?token=`.
pub fn request_token<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> Option<&'a str> {
    crate::auth::bearer(headers).ok().flatten().or(query)
}

#[derive(Serialize)]
pub struct ChannelSummary {
    pub name: String,
    pub topic: String,
    pub private: bool,
    pub oldest: u64,
    pub last: u64,
    pub published: u64,
}

/// `GET /channels`: every channel with its position (public; used by the dashboard).
pub async fn channels(
    State(state): State<AppState>,
) -> Result<Json<Vec<ChannelSummary>>, ApiError> {
    let mut out = Vec::with_capacity(state.feeds.len());
    for (name, feed) in state.feeds.iter() {
        let head = state.store.head(name).await?;
        out.push(ChannelSummary {
            name: name.clone(),
            topic: state.config.urls.topic(name),
            private: state
                .config
                .channels
                .get(name)
                .is_some_and(|c| c.read_token.is_some()),
            oldest: head.oldest,
            last: head.last,
            published: feed.published_seq(),
        });
    }
    Ok(Json(out))
}
