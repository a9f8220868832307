//! The retry bookkeeping after an attempt, shared by both kinds of delivery: a Change List
//! notification (its retry is [`PendingDelivery`], stored) and an external topic's generic
//! content (its retry is [`ContentAttempts`], in memory).
//!
//! A failure starts or continues a retry: the attempt count grows and the next attempt is
//! scheduled with [`retry::next_delay`] (honouring `Retry-After`), until `retry_for` has
//! passed since the first failed attempt; then the payload is given up.

use std::time::Duration;
use time::OffsetDateTime;

use super::post::Outcome;
use crate::config::Config;
use crate::model::{DeliveryState, PendingDelivery, Subscription};
use crate::retry;

/// A retry in progress: how many attempts failed, since when, and when the next one is due.
pub(super) trait Attempts {
    fn attempts_mut(&mut self) -> &mut u32;
    fn first_attempt_at(&self) -> OffsetDateTime;
    fn set_next_attempt_at(&mut self, at: OffsetDateTime);
}

impl Attempts for PendingDelivery {
    fn attempts_mut(&mut self) -> &mut u32 {
        &mut self.attempts
    }
    fn first_attempt_at(&self) -> OffsetDateTime {
        self.first_attempt_at
    }
    fn set_next_attempt_at(&mut self, at: OffsetDateTime) {
        self.next_attempt_at = at;
    }
}

/// The retry of an external topic's generic content (kept in memory only).
pub(super) struct ContentAttempts {
    pub(super) attempts: u32,
    pub(super) first_attempt_at: OffsetDateTime,
    pub(super) next_attempt_at: OffsetDateTime,
}

impl ContentAttempts {
    pub(super) fn starting(now: OffsetDateTime) -> ContentAttempts {
        ContentAttempts {
            attempts: 0,
            first_attempt_at: now,
            next_attempt_at: now,
        }
    }
}

impl Attempts for ContentAttempts {
    fn attempts_mut(&mut self) -> &mut u32 {
        &mut self.attempts
    }
    fn first_attempt_at(&self) -> OffsetDateTime {
        self.first_attempt_at
    }
    fn set_next_attempt_at(&mut self, at: OffsetDateTime) {
        self.next_attempt_at = at;
    }
}

/// How long and how often to retry: `retry_for`, `retry_initial` and `retry_max` of the config.
pub(super) struct Policy {
    pub(super) give_up_after: Duration,
    pub(super) initial: Duration,
    pub(super) max: Duration,
}

impl Policy {
    pub(super) fn of(config: &Config) -> Policy {
        Policy {
            give_up_after: config.retry_for,
            initial: config.retry_initial,
            max: config.retry_max,
        }
    }
}

/// What was being delivered, named in logs and in `last_error` (only formatted when used,
/// so that a delivery that goes well costs no string).
#[derive(Debug, Clone, Copy)]
pub(super) enum What {
    /// A Change List notification of these seqs.
    Seqs(u64, u64),
    /// An external topic's content.
    Content,
}

impl std::fmt::Display for What {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            What::Seqs(first, last) => write!(f, "seqs {first}-{last}"),
            What::Content => f.write_str("topic content"),
        }
    }
}

/// What an attempt came to, once its retry is accounted for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Settled {
    Delivered,
    /// 410 Gone: the subscription ends.
    Gone,
    WillRetry {
        attempts: u32,
        delay: Duration,
        reason: String,
    },
    /// Failed for longer than `retry_for`: the payload is skipped.
    GaveUp {
        attempts: u32,
        reason: String,
    },
}

/// Accounts for `outcome` in `retry` (the retry in progress, if any; `start` makes a new one)
/// and says what it came to. `retry` is `None` afterwards unless another attempt is due.
pub(super) fn settle<R: Attempts>(
    outcome: Outcome,
    retry: &mut Option<R>,
    start: impl FnOnce(OffsetDateTime) -> R,
    policy: &Policy,
    now: OffsetDateTime,
) -> Settled {
    match outcome {
        Outcome::Delivered => {
            *retry = None;
            Settled::Delivered
        }
        Outcome::Gone => Settled::Gone,
        Outcome::Failed {
            reason,
            retry_after,
        } => {
            let current = retry.get_or_insert_with(|| start(now));
            *current.attempts_mut() += 1;
            let attempts = *current.attempts_mut();
            if now - current.first_attempt_at() >= policy.give_up_after {
                *retry = None;
                return Settled::GaveUp { attempts, reason };
            }
            let delay = retry::next_delay(attempts, retry_after, policy.initial, policy.max);
            current.set_next_attempt_at(now + delay);
            Settled::WillRetry {
                attempts,
                delay,
                reason,
            }
        }
    }
}

impl Settled {
    /// Logs the result and records it in the subscription's health (`last_success`,
    /// `last_error`, shown by the admin API). Logged: the first failure of a streak (warn),
    /// the recovery (info), a payload given up (warn) and 410 (info); retries in between at
    /// debug level. `what` names the payload.
    /// "topic content".
    pub(super) fn record(
        &self,
        state: &mut DeliveryState,
        sub: &Subscription,
        what: What,
        now: OffsetDateTime,
    ) {
        // A failing subscription logs when its trouble starts, when it ends, and when a
        // payload is given up; the retries in between only at debug level.
        let failing = state.last_error.is_some();
        let outcome = match self {
            Settled::Delivered => "delivered",
            Settled::Gone => "gone",
            Settled::WillRetry { .. } => "failed",
            Settled::GaveUp { .. } => "given_up",
        };
        metrics::counter!("changehub_deliveries_total", "outcome" => outcome).increment(1);
        match self {
            Settled::Delivered => {
                if failing {
                    tracing::info!(callback = %crate::net::shown(&sub.callback), %what, "delivery recovered");
                }
                state.last_success = Some(now);
                state.last_error = None;
            }
            Settled::Gone => {
                tracing::info!(callback = %crate::net::shown(&sub.callback), "callback answered 410 Gone; subscription removed");
            }
            Settled::WillRetry {
                attempts,
                delay,
                reason,
            } => {
                if failing {
                    tracing::debug!(callback = %crate::net::shown(&sub.callback), %what, attempts, %reason, ?delay,
                        "delivery failed; will retry");
                } else {
                    tracing::warn!(callback = %crate::net::shown(&sub.callback), %what, %reason, ?delay,
                        "delivery failing; will retry (logged again when it recovers or gives up)");
                }
                state.last_error = Some(reason.clone());
            }
            Settled::GaveUp { attempts, reason } => {
                tracing::warn!(callback = %crate::net::shown(&sub.callback), %what, attempts, %reason,
                    "giving up after retrying");
                state.last_error = Some(format!(
                    "gave up on {what} after {attempts} attempts: {reason}"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(give_up_after: Duration) -> Policy {
        Policy {
            give_up_after,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }

    fn failed() -> Outcome {
        Outcome::Failed {
            reason: "callback answered 500".into(),
            retry_after: None,
        }
    }

    #[test]
    fn failures_count_up_then_give_up_and_success_clears() {
        let config = policy(Duration::from_secs(30));
        let t0 = OffsetDateTime::now_utc();
        let mut retry: Option<ContentAttempts> = None;

        let first = settle(failed(), &mut retry, ContentAttempts::starting, &config, t0);
        assert!(matches!(first, Settled::WillRetry { attempts: 1, .. }));
        let due = retry.as_ref().map(|r| r.next_attempt_at);
        assert!(due.is_some_and(|at| at > t0));

        let t1 = t0 + Duration::from_secs(10);
        let second = settle(failed(), &mut retry, ContentAttempts::starting, &config, t1);
        assert!(matches!(second, Settled::WillRetry { attempts: 2, .. }));
        assert_eq!(retry.as_ref().map(|r| r.first_attempt_at), Some(t0));

        let late = t0 + Duration::from_secs(30);
        let third = settle(
            failed(),
            &mut retry,
            ContentAttempts::starting,
            &config,
            late,
        );
        assert!(matches!(third, Settled::GaveUp { attempts: 3, .. }));
        assert!(retry.is_none());

        settle(
            failed(),
            &mut retry,
            ContentAttempts::starting,
            &config,
            late,
        );
        let ok = settle(
            Outcome::Delivered,
            &mut retry,
            ContentAttempts::starting,
            &config,
            late,
        );
        assert_eq!(ok, Settled::Delivered);
        assert!(retry.is_none());
    }

    #[test]
    fn the_record_shows_the_last_error_until_a_success() {
        let now = OffsetDateTime::now_utc();
        let sub = Subscription {
            id: "s1".into(),
            channel: "c".into(),
            topic: "http://127.0.0.1/t".into(),
            callback: "http://127.0.0.1/cb".into(),
            secret: None,
            algorithm: Default::default(),
            lease_seconds: 60,
            expires_at: now,
            created_at: now,
        };
        let mut state = DeliveryState::default();
        Settled::GaveUp {
            attempts: 4,
            reason: "callback answered 500".into(),
        }
        .record(&mut state, &sub, What::Seqs(3, 5), now);
        assert_eq!(
            state.last_error.as_deref(),
            Some("gave up on seqs 3-5 after 4 attempts: callback answered 500")
        );
        Settled::Delivered.record(&mut state, &sub, What::Seqs(6, 6), now);
        assert_eq!(state.last_error, None);
        assert_eq!(state.last_success, Some(now));
    }
}
