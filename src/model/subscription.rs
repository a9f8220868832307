//! Subscriptions: a verified WebSub subscription, and how far it has been served.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::Algorithm;

/// A verified WebSub subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    /// Derived from topic and callback: see [`subscription_id`].
    pub id: String,
    pub channel: String,
    pub topic: String,
    pub callback: String,
    pub secret: Option<String>,
    pub algorithm: Algorithm,
    pub lease_seconds: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// When the subscription was verified (the latest verification, for a re-subscription).
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// The id of the subscription of `callback` to `topic` (a re-subscription has the same id).
pub fn subscription_id(topic: &str, callback: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(topic.as_bytes());
    h.update([0]);
    h.update(callback.as_bytes());
    hex::encode(&h.finalize()[..12])
}

/// A notification being retried: its seq range is fixed until it succeeds or is given up, so
/// the delivery id stays the same across retries and restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDelivery {
    pub first: u64,
    pub last: u64,
    pub attempts: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub first_attempt_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub next_attempt_at: OffsetDateTime,
}

/// How far a subscription has been served.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeliveryState {
    /// The last seq delivered (or given up); the next notification starts after it.
    pub cursor: u64,
    pub pending: Option<PendingDelivery>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub last_success: Option<OffsetDateTime>,
    pub last_error: Option<String>,
}
