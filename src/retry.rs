//! Retrying, in one place.
//!
//! - Deliveries (and external-topic content) follow a schedule that is a pure function of the
//!   attempt count ([`backoff`], [`next_delay`]), so that a restarted hub continues the same
//!   schedule from the persisted [`PendingDelivery`]. Delay before retry `n` (1-based):
//!   `initial × 2^(n-1)`, capped at `max`, with ±20% jitter; a `Retry-After` from the
//!   subscriber replaces the computed delay (capped at `max`).
//! - Reconnection loops (the Redis event listener, `changehub tail`) use [`Reconnect`]: an
//!   exponential schedule from the `backon` crate that starts over after a success.
//!
//! [`PendingDelivery`]: crate::model::PendingDelivery

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use rand::Rng;
use std::time::{Duration, SystemTime};

/// The delays of a reconnection loop: `first`, doubling up to `max`, again from `first` after
/// [`Reconnect::reset`]. Never runs out.
#[derive(Debug)]
pub struct Reconnect {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
}

impl Reconnect {
    pub fn new(first: Duration, max: Duration) -> Reconnect {
        let builder = ExponentialBuilder::new()
            .with_min_delay(first)
            .with_max_delay(max)
            .with_factor(2.0)
            .without_max_times();
        Reconnect {
            builder,
            delays: builder.build(),
        }
    }

    /// The delay before the next attempt.
    pub fn delay(&mut self) -> Duration {
        self.delays.next().unwrap_or(Duration::ZERO)
    }

    /// After a success: the next delay is `first` again.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }

    /// Sleeps the next delay; true when `stop` fired meanwhile.
    pub async fn sleep_or_stop(&mut self, stop: &tokio_util::sync::CancellationToken) -> bool {
        let delay = self.delay();
        tokio::select! {
            _ = stop.cancelled() => true,
            _ = tokio::time::sleep(delay) => false,
        }
    }
}

/// Delay before retry number `attempts` (the count of failed attempts so far, ≥ 1).
pub fn backoff(attempts: u32, initial: Duration, max: Duration) -> Duration {
    let exp = attempts.saturating_sub(1).min(30);
    let base = initial.saturating_mul(1u32 << exp).min(max);
    let jitter = rand::rng().random_range(0.8..=1.2);
    base.mul_f64(jitter).min(max)
}

/// Parses `Retry-After`: delay-seconds or an HTTP date. `None` when absent or unreadable.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The delay before the next attempt: the subscriber's `Retry-After` when given, otherwise
/// the backoff; never more than `max`.
pub fn next_delay(
    attempts: u32,
    retry_after: Option<Duration>,
    initial: Duration,
    max: Duration,
) -> Duration {
    match retry_after {
        Some(d) => d.min(max),
        None => backoff(attempts, initial, max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_jitter_and_caps() {
        let s = Duration::from_secs;
        for (n, base) in [(1, 5), (2, 10), (3, 20), (4, 40)] {
            let d = backoff(n, s(5), s(3600));
            assert!(
                d >= s(base).mul_f64(0.8) && d <= s(base).mul_f64(1.2),
                "{n}: {d:?}"
            );
        }
        assert!(backoff(40, s(5), s(3600)) <= s(3600));
    }

    #[test]
    fn reconnect_doubles_to_its_cap_and_starts_over() {
        let mut r = Reconnect::new(Duration::from_millis(500), Duration::from_secs(10));
        let delays: Vec<u64> = (0..8).map(|_| r.delay().as_millis() as u64).collect();
        assert_eq!(
            delays,
            [500, 1000, 2000, 4000, 8000, 10_000, 10_000, 10_000]
        );
        r.reset();
        assert_eq!(r.delay(), Duration::from_millis(500));
    }

    #[test]
    fn retry_after_forms() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(
            next_delay(
                1,
                Some(Duration::from_secs(99_999)),
                Duration::from_secs(5),
                Duration::from_secs(60)
            ),
            Duration::from_secs(60)
        );
    }
}
