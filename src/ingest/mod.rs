//! Ingest: the first way changes come in. A source's request body is parsed in one of the
//! [`Format`]s, every change is validated (one bad change refuses the whole body, naming its
//! index), and the changes are appended to the channel's log. [`accept`] returns only once
//! the changes are durable; the batcher picks them up from the log.
//!
//! Invariant: ingest never talks to subscribers; it only writes the log.
//! (The second way in is [`crate::external`]: external topics fetched or fat-pinged.)
//! [`feedsync`] incorporates FeedSync collections: merged item by item, appended as changes.

pub mod feedsync;
mod parse;

pub use parse::{parse_body, BodyError, Format};

use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::model::NewChange;
use crate::store::{Appended, IdempotencyKey, Store, StoreError};

/// Longest `Idempotency-Key` accepted.
pub const MAX_IDEMPOTENCY_KEY: usize = 255;
/// Most changes in one request.
pub const MAX_CHANGES: usize = 1_000_000;

/// Why a body was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The body (or one of its changes) is invalid; nothing was appended.
    #[error("{}", .0.reason)]
    Body(BodyError),
    /// The idempotency key came before with a different body.
    #[error("idempotency key was used before with a different request")]
    IdempotencyConflict,
    #[error(transparent)]
    Store(StoreError),
}

/// Parses, validates and appends one request body to `channel`'s log, each change recorded as
/// sent by publisher `source`. With an idempotency key, a repeated request (same body, same
/// publisher) appends nothing and returns the first answer (`replayed`).
pub async fn accept(
    store: &dyn Store,
    channel: &str,
    source: &str,
    format: Format,
    body: &[u8],
    idempotency_key: Option<String>,
    max_future: std::time::Duration,
) -> Result<Appended, IngestError> {
    let mut changes = parse_body(format, body, MAX_CHANGES).map_err(IngestError::Body)?;
    // One string for the request, shared by its changes.
    let shared: std::sync::Arc<str> = source.into();
    for change in &mut changes {
        change.source = Some(shared.clone());
    }
    let now = OffsetDateTime::now_utc();
    not_too_far_ahead(&changes, now, max_future).map_err(IngestError::Body)?;
    let idempotency = idempotency_key.map(|key| IdempotencyKey {
        key,
        fingerprint: fingerprint(format, source, body),
    });
    let started = std::time::Instant::now();
    let appended = store.append(channel, changes, idempotency, now).await;
    metrics::histogram!("changehub_store_append_seconds").record(started.elapsed());
    appended.map_err(|e| match e {
        StoreError::IdempotencyConflict => IngestError::IdempotencyConflict,
        other => IngestError::Store(other),
    })
}

/// Refuses a change dated more than `max_future` after `now` (`--max-future`): within a
/// channel datetimes never go backwards, so one far-future datetime would hold every later
/// change at that date.
pub fn not_too_far_ahead(
    changes: &[NewChange],
    now: OffsetDateTime,
    max_future: std::time::Duration,
) -> Result<(), BodyError> {
    let margin = time::Duration::try_from(max_future).unwrap_or(time::Duration::DAY);
    let Some(latest) = now.checked_add(margin) else {
        return Ok(());
    };
    match changes
        .iter()
        .enumerate()
        .find_map(|(i, c)| c.datetime.filter(|dt| *dt > latest).map(|dt| (i, dt)))
    {
        Some((index, dt)) => Err(BodyError {
            reason: format!(
                "change {index}: datetime {} is more than {} in the future (--max-future)",
                crate::model::format_datetime(dt),
                humantime::format_duration(max_future)
            ),
            index: Some(index),
        }),
        None => Ok(()),
    }
}

/// What makes two requests "the same" for an idempotency key: their format, publisher and
/// body.
fn fingerprint(format: Format, source: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(format!("{format:?}").as_bytes());
    h.update(source.as_bytes());
    h.update([0]);
    h.update(body);
    hex::encode(h.finalize())
}
