//! The admin API under `/api/`, behind the admin bearer token: channels with their log
//! position, subscriptions with their delivery state, and removal of a subscription.
//! Secrets are never returned: only whether a subscription has one.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use time::OffsetDateTime;

use crate::http::{ApiError, AppState};
use crate::ingest::check_bearer;
use crate::store::PendingDelivery;

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    match &state.config.admin_token {
        Some(token) => check_bearer(headers, token, "the admin API"),
        None => Err(ApiError::not_found(
            "the admin API is disabled; start the hub with --admin-token",
        )),
    }
}

#[derive(Serialize)]
struct ChannelView {
    name: String,
    topic: String,
    oldest: u64,
    last: u64,
    published: u64,
}

/// `GET /api/channels`
pub async fn channels(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let mut out = Vec::new();
    for (name, feed) in state.feeds.iter() {
        let head = state.store.head(name).await?;
        out.push(ChannelView {
            name: name.clone(),
            topic: state.config.topic_url(name),
            oldest: head.oldest,
            last: head.last,
            published: feed.published_seq(),
        });
    }
    Ok(Json(out).into_response())
}

#[derive(Serialize)]
struct SubscriptionView {
    id: String,
    channel: String,
    topic: String,
    callback: String,
    has_secret: bool,
    algorithm: String,
    lease_seconds: u64,
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
    cursor: u64,
    /// Changes published but not yet delivered.
    lag: u64,
    pending: Option<PendingDelivery>,
    #[serde(with = "time::serde::rfc3339::option")]
    last_success: Option<OffsetDateTime>,
    last_error: Option<String>,
}

/// `GET /api/subscriptions`
pub async fn subscriptions(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    // On a shared store, workers run only on each channel's owner: list the store's.
    let mut subs = if state.store.shared() {
        state
            .store
            .subscriptions()
            .await?
            .into_iter()
            .map(std::sync::Arc::new)
            .collect()
    } else {
        state.fanout.active()
    };
    subs.sort_by(|a, b| (&a.channel, &a.callback).cmp(&(&b.channel, &b.callback)));
    let mut out = Vec::with_capacity(subs.len());
    for sub in subs {
        let delivery = state.store.delivery(&sub.id).await?.unwrap_or_default();
        let published = state
            .feeds
            .get(&sub.channel)
            .map(|f| f.published_seq())
            .unwrap_or(0);
        out.push(SubscriptionView {
            id: sub.id.clone(),
            channel: sub.channel.clone(),
            topic: sub.topic.clone(),
            callback: sub.callback.clone(),
            has_secret: sub.secret.is_some(),
            algorithm: sub.algorithm.to_string(),
            lease_seconds: sub.lease_seconds,
            expires_at: sub.expires_at,
            cursor: delivery.cursor,
            lag: published.saturating_sub(delivery.cursor),
            pending: delivery.pending,
            last_success: delivery.last_success,
            last_error: delivery.last_error,
        });
    }
    Ok(Json(out).into_response())
}

/// `DELETE /api/subscriptions/{id}`
pub async fn delete_subscription(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    if state.fanout.remove(&id).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found(format!("no subscription {id:?}")))
    }
}
