//! `GET /`: the live dashboard. Its three files are compiled into the binary: no build step,
//! no CDN, works without internet access (the rate chart is plain SVG drawn by `app.js`).
//! `GET /channels` lists the channels it shows, with their rates over the last 10 minutes
//! (changes published and notifications delivered per 10-second step, counted by each
//! channel's feed: [`crate::telemetry::RateWindow`]) and what its view of one channel shows;
//! subscription health comes from the admin API.

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;

use super::{ApiError, AppState};
use crate::telemetry::Rates;
use std::time::SystemTime;

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
    pub archive: String,
    pub resource_list: String,
    /// The channel's Change Dump, when it has dumps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change_dump: Option<String>,
    pub private: bool,
    /// The epoch of the channel's log.
    pub epoch: String,
    pub oldest: u64,
    pub last: u64,
    pub published: u64,
    /// Notifications delivered to callbacks by this instance since it started.
    pub delivered: u64,
    /// Changes published and notifications delivered per 10-second step of the last 10
    /// minutes (this instance's deliveries): what the dashboard charts.
    pub rates: Rates,
    /// Subscriptions this instance delivers.
    pub subscribers: usize,
    pub retention: RetentionSummary,
}

#[derive(Serialize)]
pub struct RetentionSummary {
    pub retain_changes: u64,
    /// Seconds, when changes are also dropped by age.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retain_for: Option<u64>,
    pub archive_every: u64,
}

/// `GET /channels`: every public channel with its position, counters and documents (public;
/// used by the dashboard).
pub async fn channels(
    State(state): State<AppState>,
) -> Result<Json<Vec<ChannelSummary>>, ApiError> {
    let mut out = Vec::with_capacity(state.feeds.len());
    let subscriptions = state.fanout.active();
    // Private channels are not listed: their names are theirs to give.
    for channel in state.feeds.all() {
        if channel.spec.read_token.is_some() {
            continue;
        }
        let name = &channel.spec.name;
        let head = state.store.head(name).await?;
        let origin = channel.feed.origin(state.store.as_ref()).await?;
        let retention = &channel.spec.retention;
        out.push(ChannelSummary {
            name: name.clone(),
            topic: state.config.urls.topic(name),
            archive: state.config.urls.archive(name),
            resource_list: state.config.urls.resource_list(name),
            change_dump: channel
                .spec
                .dumps
                .map(|_| state.config.urls.change_dump(name)),
            private: false,
            epoch: origin.epoch.clone(),
            oldest: head.oldest,
            last: head.last,
            published: channel.feed.published_seq(),
            delivered: channel.feed.delivered(),
            rates: channel.feed.rates.rates(SystemTime::now()),
            subscribers: subscriptions.iter().filter(|s| &s.channel == name).count(),
            retention: RetentionSummary {
                retain_changes: retention.max_changes,
                retain_for: retention.max_age.map(|d| d.as_secs()),
                archive_every: retention.list_size,
            },
        });
    }
    Ok(Json(out))
}
