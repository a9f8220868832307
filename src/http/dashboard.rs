//! `GET /`: the live dashboard. Its three files are compiled into the binary: no build step,
//! no CDN, works without internet access. `GET /channels` lists the channels it shows.

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;

use super::{ApiError, AppState};

const INDEX: &str = include_str!("assets/index.html");
const APP: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");

pub async fn index() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
        ],
        INDEX,
    )
}

pub async fn app_js() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
        ],
        APP,
    )
}

pub async fn style_css() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
        ],
        STYLE,
    )
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
    // Private channels are not listed: their names are theirs to give.
    for channel in state.feeds.all() {
        if channel.spec.read_token.is_some() {
            continue;
        }
        let name = &channel.spec.name;
        let head = state.store.head(name).await?;
        out.push(ChannelSummary {
            name: name.clone(),
            topic: state.config.urls.topic(name),
            private: channel.spec.read_token.is_some(),
            oldest: head.oldest,
            last: head.last,
            published: channel.feed.published_seq(),
        });
    }
    Ok(Json(out))
}
