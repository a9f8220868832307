//! The admin API under `/api/`, behind the admin bearer token: channels and external topics
//! with their log position, subscriptions with their delivery state, redelivery from a seq,
//! and removal of a subscription. Secrets are never returned: only whether a subscription has
//! one.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::{ApiError, AppState};
use crate::external::{self, ContentRetry};
use crate::hosted::Declared;
use crate::model::{
    ChannelSpec, DeliveryState, DumpSettings, PendingDelivery, Publisher, Retention,
};
use crate::store::ClusterEvent;

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    match &state.config.admin_token {
        Some(token) => ApiError::check_bearer(headers, token, "the admin API"),
        None => Err(ApiError::not_found(
            "the admin API is disabled; start the hub with --admin-token",
        )),
    }
}

#[derive(Serialize)]
struct ChannelView {
    name: String,
    topic: String,
    /// `hosted` (a `--channel`) or `external` (an external topic's internal channel).
    kind: &'static str,
    /// Hosted channels: `start-up` (flags, the file) or `api` (created through this API).
    #[serde(skip_serializing_if = "Option::is_none")]
    declared: Option<&'static str>,
    /// Hosted channels: the names of their publishers (never their tokens).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    publishers: Vec<String>,
    /// Hosted channels: whether reads need a read token.
    #[serde(skip_serializing_if = "Option::is_none")]
    private: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retention: Option<RetentionView>,
    oldest: u64,
    last: u64,
    published: u64,
    /// External topics: what the last fetch found (`changelist`, `content`, `unknown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<external::Kind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_version: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fetches: Option<u64>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    last_fetch: Option<OffsetDateTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_fetch_error: Option<String>,
    /// Hosted public channels, with the XMPP bridge on: the node and how far behind it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    xmpp: Option<crate::xmpp::ChannelStatus>,
    /// Hosted channels with Change Dumps: their settings and how far they got.
    #[serde(skip_serializing_if = "Option::is_none")]
    dumps: Option<DumpsView>,
}

/// A channel's Change Dump settings, and (in `GET /api/channels`) its progress.
#[derive(Serialize)]
struct DumpsView {
    every: u64,
    /// Seconds; absent when dumps are made by count only.
    #[serde(skip_serializing_if = "Option::is_none")]
    interval: Option<u64>,
    keep: u64,
    max_resource_bytes: u64,
    max_dump_bytes: u64,
    concurrency: usize,
    per_document: u64,
    /// The last seq of the channel the dumps cover.
    #[serde(skip_serializing_if = "Option::is_none")]
    dumped_upto: Option<u64>,
    /// Dumps listed in the Change Dump.
    #[serde(skip_serializing_if = "Option::is_none")]
    listed: Option<u64>,
}

impl DumpsView {
    fn of(d: &DumpSettings) -> DumpsView {
        DumpsView {
            every: d.every,
            interval: d.interval.map(|i| i.as_secs()),
            keep: d.keep,
            max_resource_bytes: d.max_resource_bytes,
            max_dump_bytes: d.max_dump_bytes,
            concurrency: d.concurrency,
            per_document: d.per_document,
            dumped_upto: None,
            listed: None,
        }
    }
}

/// The dump settings of `spec` with their progress.
async fn dumps_view(state: &AppState, spec: &ChannelSpec) -> Result<Option<DumpsView>, ApiError> {
    let Some(settings) = &spec.dumps else {
        return Ok(None);
    };
    let mut view = DumpsView::of(settings);
    let list = state
        .store
        .head(&crate::dumps::channel_name(&spec.name))
        .await?;
    view.listed = Some(list.last + 1 - list.oldest.min(list.last + 1));
    view.dumped_upto = state
        .store
        .bridge_cursor(&spec.name, crate::dumps::BRIDGE)
        .await?;
    Ok(Some(view))
}

/// `GET /api/channels`
pub async fn channels(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let mut out = Vec::new();
    for channel in state.feeds.all() {
        let name = &channel.spec.name;
        let head = state.store.head(name).await?;
        out.push(ChannelView {
            name: name.clone(),
            topic: state.config.urls.topic(name),
            kind: "hosted",
            declared: Some(match channel.declared {
                Declared::StartUp => "start-up",
                Declared::Api => "api",
            }),
            publishers: channel
                .spec
                .publishers
                .iter()
                .map(|p| p.name.clone())
                .collect(),
            private: Some(channel.spec.read_token.is_some()),
            retention: Some(RetentionView::of(&channel.spec.retention)),
            oldest: head.oldest,
            last: head.last,
            published: channel.feed.published_seq(),
            xmpp: state.xmpp.as_ref().and_then(|b| {
                b.status(
                    name,
                    channel.feed.published_seq(),
                    channel.spec.read_token.is_some(),
                )
            }),
            content: None,
            content_version: None,
            fetches: None,
            last_fetch: None,
            last_fetch_error: None,
            dumps: dumps_view(&state, &channel.spec).await?,
        });
    }
    for topic in state.external.topics() {
        let head = state.store.head(&topic.channel).await?;
        let status = topic.status();
        out.push(ChannelView {
            name: topic.channel.clone(),
            topic: topic.url.clone(),
            kind: "external",
            declared: None,
            publishers: Vec::new(),
            private: None,
            retention: None,
            oldest: head.oldest,
            last: head.last,
            published: topic.feed.published_seq(),
            content: Some(topic.kind()),
            content_version: Some(topic.content_version()),
            fetches: Some(status.fetches),
            last_fetch: status.last_fetch,
            last_fetch_error: status.last_error,
            xmpp: None,
            dumps: None,
        });
    }
    Ok(Json(out).into_response())
}

#[derive(Serialize)]
struct RetentionView {
    retain_changes: u64,
    /// Seconds, when changes are also dropped by age.
    #[serde(skip_serializing_if = "Option::is_none")]
    retain_for: Option<u64>,
    archive_every: u64,
}

impl RetentionView {
    fn of(r: &Retention) -> RetentionView {
        RetentionView {
            retain_changes: r.max_changes,
            retain_for: r.max_age.map(|d| d.as_secs()),
            archive_every: r.list_size,
        }
    }
}

/// The body of `PUT /api/channels/{name}`: the whole settings of the channel.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelBody {
    /// Publisher name → token (at least one). Rotating a token: add the new publisher, let
    /// the source switch, then PUT again without the old one.
    publishers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    read_token: Option<String>,
    #[serde(default)]
    retain_changes: Option<u64>,
    /// A duration such as `30days` or `12h`.
    #[serde(default)]
    retain_for: Option<String>,
    #[serde(default)]
    archive_every: Option<u64>,
    /// Change Dumps: absent or `null` for none; an object (`{}` for the hub's defaults).
    #[serde(default)]
    dumps: Option<DumpsBody>,
}

/// The Change Dump settings of a channel in `PUT /api/channels/{name}`; a missing field
/// takes the hub's `--dump-*` default.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DumpsBody {
    #[serde(default)]
    every: Option<u64>,
    /// A duration such as `1h`; `0s` cuts dumps by count only.
    #[serde(default)]
    interval: Option<String>,
    #[serde(default)]
    keep: Option<u64>,
    #[serde(default)]
    max_resource_bytes: Option<u64>,
    #[serde(default)]
    max_dump_bytes: Option<u64>,
    #[serde(default)]
    concurrency: Option<usize>,
    #[serde(default)]
    per_document: Option<u64>,
}

impl DumpsBody {
    fn settings(self, defaults: DumpSettings) -> Result<DumpSettings, ApiError> {
        let interval = match self.interval.as_deref() {
            None => defaults.interval,
            Some(s) => {
                let d = humantime::parse_duration(s).map_err(|e| {
                    ApiError::bad_request(format!("dumps.interval {s:?} is not a duration: {e}"))
                })?;
                (!d.is_zero()).then_some(d)
            }
        };
        Ok(DumpSettings {
            every: self.every.unwrap_or(defaults.every),
            interval,
            keep: self.keep.unwrap_or(defaults.keep),
            max_resource_bytes: self
                .max_resource_bytes
                .unwrap_or(defaults.max_resource_bytes),
            max_dump_bytes: self.max_dump_bytes.unwrap_or(defaults.max_dump_bytes),
            concurrency: self.concurrency.unwrap_or(defaults.concurrency),
            per_document: self.per_document.unwrap_or(defaults.per_document),
        })
    }
}

/// Largest `PUT /api/channels/{name}` body.
const CHANNEL_BODY_LIMIT: usize = 64 * 1024;

/// `PUT /api/channels/{name}`: creates or changes a channel. Stored, so that every instance
/// and every restart has it; 201 when new, 200 when changed. Channels declared at start-up
/// cannot be changed here (409).
pub async fn put_channel(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    declared_at_start_up(&state, &name)?;
    let body = super::read_body(body, CHANNEL_BODY_LIMIT, state.config.http.body_timeout).await?;
    let body: ChannelBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"publishers\": {{NAME: TOKEN, …}}, \"read_token\", \"retain_changes\", \"retain_for\", \"archive_every\", \"dumps\"}}: {e}"
        ))
    })?;
    let defaults = state.config.retention;
    let max_age = match body.retain_for.as_deref() {
        None => defaults.max_age,
        Some(s) => Some(humantime::parse_duration(s).map_err(|e| {
            ApiError::bad_request(format!("retain_for {s:?} is not a duration: {e}"))
        })?),
    };
    let spec = ChannelSpec {
        name: name.clone(),
        publishers: body
            .publishers
            .into_iter()
            .map(|(name, token)| Publisher { name, token })
            .collect(),
        read_token: body.read_token,
        retention: Retention {
            max_changes: body.retain_changes.unwrap_or(defaults.max_changes),
            max_age,
            list_size: body.archive_every.unwrap_or(defaults.list_size),
        },
        dumps: body
            .dumps
            .map(|d| d.settings(state.config.dump_defaults))
            .transpose()?,
    };
    spec.check().map_err(ApiError::bad_request)?;
    if spec.dumps.is_some() && state.config.dump_dir.is_none() {
        return Err(ApiError::bad_request(
            "Change Dumps need a dump folder: start the hub with --dump-dir",
        ));
    }
    let existed = state.store.stored_channel(&name).await?.is_some();
    state.store.put_channel(&spec).await?;
    changed(&state, &name).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        Json(serde_json::json!({
            "name": name,
            "topic": state.config.urls.topic(&name),
            "publishers": spec.publishers.iter().map(|p| &p.name).collect::<Vec<_>>(),
            "private": spec.read_token.is_some(),
            "retention": RetentionView::of(&spec.retention),
            "dumps": spec.dumps.as_ref().map(DumpsView::of),
        })),
    )
        .into_response())
}

/// `DELETE /api/channels/{name}`: removes a channel created through this API. It is no
/// longer served on any instance; its log and subscriptions stay in the store (creating the
/// channel again brings them back).
pub async fn delete_channel(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    declared_at_start_up(&state, &name)?;
    if !state.store.delete_channel(&name).await? {
        return Err(ApiError::not_found(format!(
            "no channel {name:?} was created through the admin API"
        )));
    }
    changed(&state, &name).await?;
    state.rendered.forget(&name);
    state.pages.forget(&name);
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn declared_at_start_up(state: &AppState, name: &str) -> Result<(), ApiError> {
    match state.feeds.get(name) {
        Some(c) if c.declared == Declared::StartUp => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("channel {name:?} is declared at start-up (flags or file); change it there"),
        )),
        _ => Ok(()),
    }
}

/// Applies a stored change here at once, and tells the other instances.
async fn changed(state: &AppState, name: &str) -> Result<(), ApiError> {
    state.control.apply(name).await?;
    let event = ClusterEvent::Channel {
        channel: name.to_string(),
    };
    if let Err(e) = state.store.announce(&event).await {
        // The others reload every few seconds anyway.
        tracing::warn!(channel = %name, error = %e, "cannot announce a channel change");
    }
    Ok(())
}

#[derive(Deserialize)]
pub struct ResourceQuery {
    loc: String,
}

/// `GET /api/channels/{name}/resources?loc=URL`: the resource index entry of `loc` — its
/// latest change, with its seq and the publisher that sent it (`source`).
pub async fn resource(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<ResourceQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    if !state.feeds.contains(&name) && state.external.by_channel(&name).is_none() {
        return Err(ApiError::not_found(format!("no channel {name:?}")));
    }
    match state.store.resource(&name, &q.loc).await? {
        Some(change) => Ok(Json(change).into_response()),
        None => Err(ApiError::not_found(format!(
            "channel {name:?} has no resource {:?}",
            q.loc
        ))),
    }
}

/// `GET /api/channels/{name}/conflicts`: the resources whose FeedSync items carry conflicts
/// (at most 1,000, in loc order), each as an item of the JSON collection form, its
/// conflicting versions under `sync.conflicts`. A source resolves one by posting an item that
/// subsumes them (`POST /channels/{name}/feedsync`), or by a change of its own when its version
/// is the one in conflict.
pub async fn conflicts(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    if !state.feeds.contains(&name) && state.external.by_channel(&name).is_none() {
        return Err(ApiError::not_found(format!("no channel {name:?}")));
    }
    let open = state.store.sync_conflicts(&name, 1000).await?;
    let collection = crate::feedsync::Collection {
        since: 0,
        until: 0,
        items: open
            .iter()
            .map(|s| crate::feedsync::Entry {
                seq: s.change.seq,
                item: crate::model::feedsync::Item::of(s),
            })
            .collect(),
    };
    let items = crate::feedsync::write_json(&collection)["items"].take();
    Ok(Json(serde_json::json!({ "conflicts": items })).into_response())
}

#[derive(Serialize)]
struct SubscriptionView {
    id: String,
    channel: String,
    topic: String,
    callback: String,
    external: bool,
    /// Every listed subscription is verified (unverified requests change nothing).
    verified: bool,
    has_secret: bool,
    algorithm: String,
    lease_seconds: u64,
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
    cursor: u64,
    /// Changes published but not yet delivered.
    lag: u64,
    /// How old the oldest undelivered change is (by its datetime), in seconds; 0 when
    /// caught up.
    lag_seconds: u64,
    /// `healthy`, `retrying` (a delivery failed, fewer than 3 attempts), `failing` (3
    /// attempts or more) or `given_up` (the last payload was given up).
    health: &'static str,
    pending: Option<PendingDelivery>,
    /// External generic topics: the content delivery being retried.
    pending_content: Option<ContentRetry>,
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
    let mut deliveries = state.fanout.delivery_states(&subs).await?;
    let mut out = Vec::with_capacity(subs.len());
    for sub in subs {
        let delivery = deliveries.remove(&sub.id).unwrap_or_default();
        let published = state
            .fanout
            .feed(&sub.channel)
            .map(|f| f.published_seq())
            .unwrap_or(0);
        let lag = published.saturating_sub(delivery.cursor);
        let lag_seconds = if lag == 0 {
            0
        } else {
            let oldest = state.store.read(&sub.channel, delivery.cursor, 1).await?;
            oldest.first().map_or(0, |c| {
                (OffsetDateTime::now_utc() - c.datetime)
                    .whole_seconds()
                    .max(0) as u64
            })
        };
        out.push(SubscriptionView {
            id: sub.id.clone(),
            channel: sub.channel.clone(),
            topic: sub.topic.clone(),
            callback: crate::net::shown(&sub.callback).into_owned(),
            external: sub.channel.starts_with(external::CHANNEL_PREFIX),
            verified: true,
            has_secret: sub.secret.is_some(),
            algorithm: sub.algorithm.to_string(),
            lease_seconds: sub.lease_seconds,
            expires_at: sub.expires_at,
            cursor: delivery.cursor,
            lag,
            lag_seconds,
            health: health(&delivery, state.external.retry(&sub.id).is_some()),
            pending: delivery.pending,
            pending_content: state.external.retry(&sub.id),
            last_success: delivery.last_success,
            last_error: delivery.last_error,
        });
    }
    Ok(Json(out).into_response())
}

/// A subscription's health at a glance (the dashboard colours and sorts by it).
fn health(delivery: &DeliveryState, content_retry: bool) -> &'static str {
    match (&delivery.pending, &delivery.last_error) {
        (Some(p), _) if p.attempts >= 3 => "failing",
        (Some(_), _) => "retrying",
        (None, Some(_)) if content_retry => "retrying",
        // An error with nothing pending: the last payload was given up.
        (None, Some(_)) => "given_up",
        (None, None) => "healthy",
    }
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

/// `GET /api/live`: websocket connections open now, and slow clients closed so far.
pub async fn live(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    Ok(Json(serde_json::json!({
        "connections": state.connections.open(),
        "slow_closes": state.connections.slow_closes.load(std::sync::atomic::Ordering::Relaxed),
    }))
    .into_response())
}

#[derive(Debug, Default, Deserialize)]
pub struct RedeliverQuery {
    from: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct RedeliverBody {
    from: u64,
}

/// `POST /api/subscriptions/{id}/redeliver?from=SEQ` (or a JSON body `{"from": SEQ}`):
/// delivers again every change from SEQ on.
/// Largest `{"from": SEQ}` body.
const REDELIVER_BODY_LIMIT: usize = 4096;

pub async fn redeliver(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<RedeliverQuery>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    // The token first: nothing of the body is read for a caller without it.
    authorize(&state, &headers)?;
    let body = super::read_body(body, REDELIVER_BODY_LIMIT, state.config.http.body_timeout).await?;
    let from = match query.from {
        Some(s) => s
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request("from must be a seq (a positive integer)"))?,
        None if !body.is_empty() => {
            serde_json::from_slice::<RedeliverBody>(&body)
                .map_err(|e| ApiError::bad_request(format!("expected {{\"from\": SEQ}}: {e}")))?
                .from
        }
        None => return Err(ApiError::bad_request("give from=SEQ")),
    };
    if from == 0 {
        return Err(ApiError::bad_request("from must be at least 1"));
    }
    let Some(channel) = state
        .fanout
        .active()
        .into_iter()
        .find(|s| s.id == id)
        .map(|s| s.channel.clone())
    else {
        return Err(ApiError::not_found(format!("no subscription {id:?}")));
    };
    let published = state
        .fanout
        .feed(&channel)
        .map(|f| f.published_seq())
        .unwrap_or(0);
    if from > published.saturating_add(1) {
        return Err(ApiError::bad_request(format!(
            "from {from} is beyond the last published seq {published}"
        )));
    }
    match state.fanout.redeliver(&id, from).await? {
        Some(delivery) => Ok((
            StatusCode::ACCEPTED,
            Json(serde_json::json!({ "id": id, "cursor": delivery.cursor })),
        )
            .into_response()),
        None => Err(ApiError::not_found(format!("no subscription {id:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(attempts: Option<u32>, last_error: Option<&str>) -> DeliveryState {
        let now = OffsetDateTime::now_utc();
        DeliveryState {
            pending: attempts.map(|attempts| PendingDelivery {
                first: 1,
                last: 2,
                attempts,
                first_attempt_at: now,
                next_attempt_at: now,
            }),
            last_error: last_error.map(str::to_string),
            ..DeliveryState::default()
        }
    }

    #[test]
    fn health_from_the_delivery_state() {
        assert_eq!(health(&state(None, None), false), "healthy");
        assert_eq!(health(&state(Some(1), Some("500")), false), "retrying");
        assert_eq!(health(&state(Some(2), Some("500")), false), "retrying");
        assert_eq!(health(&state(Some(3), Some("500")), false), "failing");
        assert_eq!(health(&state(None, Some("gave up")), false), "given_up");
        // An external topic's content being retried keeps its error without a pending range.
        assert_eq!(health(&state(None, Some("500")), true), "retrying");
    }
}
