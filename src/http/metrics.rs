//! `GET /metrics`: Prometheus text exposition (see [`crate::telemetry`] for the names). The
//! state gauges are set from the hub's state first, so they are current. With
//! `--metrics-token`, the bearer token is needed.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use std::sync::atomic::Ordering;

use super::{ApiError, AppState};
use crate::telemetry::Gauges;

pub async fn metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if let Some(token) = &state.config.metrics_token {
        ApiError::check_bearer(&headers, token, "/metrics")?;
    }
    let Some(handle) = &state.metrics else {
        return Err(ApiError::not_found(
            "metrics are off: the program embedding the hub installed its own recorder",
        ));
    };
    gauges(&state).await?.set();
    if let Some(bridge) = &state.xmpp {
        bridge.set_gauges();
    }
    handle.run_upkeep();
    Ok((
        [(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        handle.render(),
    )
        .into_response())
}

/// The state gauges: connections, owned channels, and the subscriptions this instance
/// delivers, with their delivery state from the store.
async fn gauges(state: &AppState) -> Result<Gauges, ApiError> {
    let mut g = Gauges {
        websocket_connections: state.connections.open(),
        sse_connections: state.connections.sse.load(Ordering::Relaxed),
        channels_owned: state
            .feeds
            .names()
            .iter()
            .filter(|c| state.fanout.owns(c))
            .count(),
        ..Gauges::default()
    };
    for channel in state.feeds.names() {
        g.lag_max.insert(channel, 0);
    }
    let active = state.fanout.active();
    let mut deliveries = state.fanout.delivery_states(&active).await?;
    for sub in active {
        let delivery = deliveries.remove(&sub.id).unwrap_or_default();
        if delivery.pending.is_some() {
            g.retrying += 1;
        } else {
            g.delivering += 1;
        }
        let published = state
            .fanout
            .feed(&sub.channel)
            .map(|f| f.published_seq())
            .unwrap_or(0);
        let lag = published.saturating_sub(delivery.cursor);
        let max = g.lag_max.entry(sub.channel.clone()).or_default();
        *max = (*max).max(lag);
    }
    Ok(g)
}
