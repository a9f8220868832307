//! `GET /channels/{name}/events`: server-sent events. Each notification is an event with
//! `event: notification`, `id:` its last seq and the websocket's `notification` frame as data;
//! `caught_up` and `reset` events carry no id. A client resumes with `Last-Event-ID` (browsers
//! send it by themselves on reconnect) or `?since=`; without either it gets live changes only.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use std::convert::Infallible;

use super::ws::SseGuard;
use super::{read_token, ApiError, AppState};
use crate::auth;
use crate::live::follow::{Event, Follower};
use crate::live::frames;

#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    since: Option<String>,
    token: Option<String>,
    /// The epoch `since` (or `Last-Event-ID`) belongs to.
    epoch: Option<String>,
}

/// `GET /channels/{name}/events`
pub async fn events(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let channel = state
        .feeds
        .get(&name)
        .ok_or_else(|| ApiError::not_found(format!("no channel {name:?}")))?;
    if !auth::can_read(&channel.spec, read_token(&headers, query.token.as_deref())) {
        return Err(ApiError::unauthorized(
            "this channel is private: give its read token",
        ));
    }
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let since = match last_event_id.or(query.since) {
        None => None,
        Some(s) => Some(s.trim().parse::<u64>().map_err(|_| {
            ApiError::bad_request("Last-Event-ID / since must be a seq (a non-negative integer)")
        })?),
    };
    let feed = channel.feed;
    let follower = Follower::new(feed, state.store.clone(), since, query.epoch.clone());
    let open = (follower, SseGuard::new(&state.connections));
    let stream = futures_util::stream::unfold(open, move |(mut follower, guard)| {
        let name = name.clone();
        async move {
            match follower.next().await {
                Ok(Some(event)) => Some((
                    Ok::<_, Infallible>(sse_event(&name, &event, follower.epoch())),
                    (follower, guard),
                )),
                Ok(None) => None,
                Err(e) => {
                    if !e.logged_by_store() {
                        tracing::warn!(channel = %name, error = %e, "event stream cannot read the log");
                    }
                    None
                }
            }
        }
    })
    .take_until(state.shutdown.clone().cancelled_owned());
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

fn sse_event(channel: &str, event: &Event, epoch: Option<&str>) -> SseEvent {
    let data = frames::event(channel, event, epoch);
    let sse = SseEvent::default().data(data);
    match event {
        Event::Replay(_) | Event::Live(..) => sse.event("notification").id(event
            .changes()
            .last()
            .map(|c| c.seq)
            .unwrap_or(0)
            .to_string()),
        Event::CaughtUp(_) => sse.event("caught_up"),
        // The id moves to where the replay goes on, so a reconnection resumes from there.
        Event::Reset { oldest, .. } => sse.event("reset").id((oldest - 1).to_string()),
    }
}
