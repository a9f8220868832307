//! Prometheus metrics (`GET /metrics`), through the `metrics` facade and its Prometheus
//! exporter.
//!
//! Counters and histograms are recorded where things happen (ingest, the batcher, delivery,
//! the stores); gauges that describe a state (connections, subscriptions, lag, owned
//! channels) are set from that state when `/metrics` is read ([`Gauges`]), so they are never
//! stale. The names, with their labels:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `changehub_build_info` | gauge (1) | `version` |
//! | `changehub_ingest_requests_total` | counter | `channel`, `outcome` (`accepted`, `replayed`, `rejected`, `failed`) |
//! | `changehub_ingested_changes_total` | counter | `channel` |
//! | `changehub_store_append_seconds` | histogram | |
//! | `changehub_store_errors_total` | counter | |
//! | `changehub_notifications_total` | counter | `channel` |
//! | `changehub_dumps_total` | counter: Change Dumps published | `channel` |
//! | `changehub_dump_skipped_total` | counter: resources left out of Change Dumps | `channel` |
//! | `changehub_deliveries_total` | counter | `outcome` (`delivered`, `failed`, `gone`, `given_up`) |
//! | `changehub_delivery_latency_seconds` | histogram: from the changes' 202 to the callback's 2xx | |
//! | `changehub_delivery_retry_queue` | gauge: subscriptions waiting to retry | |
//! | `changehub_subscriptions` | gauge | `state` (`delivering`, `retrying`) |
//! | `changehub_subscriber_lag_max` | gauge: seqs the furthest-behind subscriber is behind the published head | `channel` |
//! | `changehub_websocket_connections`, `changehub_sse_connections` | gauge | |
//! | `changehub_channels_owned` | gauge | |
//! | `changehub_xmpp_items_total` | counter: items the XMPP bridge published | `channel` |
//! | `changehub_xmpp_lag` | gauge: seqs published but not yet on the channel's XMPP node (set by the bridge's owner) | `channel` |
//! | `changehub_xmpp_connected` | gauge: 1 when the XMPP service answered the bridge's last request | |
//!
//! The recorder is process-wide: several hubs in one process (tests) share it. A histogram
//! keeps every value recorded until the values are folded into its buckets; a scrape does
//! that, and so does [`fold_histograms`] every [`FOLD_EVERY`] whether anyone scrapes or not,
//! so that a hub nobody scrapes does not grow by 8 bytes per append and per delivery.
//!
//! [`RateWindow`] is the dashboard's figure: per channel, the changes published and the
//! notifications delivered in each 10-second step of the last 10 minutes, counted as they
//! happen (kept by the channel's feed, in memory), so that a page opened now shows the last 10
//! minutes at once.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// Latency buckets, seconds: 1 ms to 1 minute.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// How often [`fold_histograms`] folds the values recorded meanwhile into the histograms'
/// buckets. At 60,000 appends a second (1-change requests on Redis), a second's values take
/// about 0.5 MB.
pub const FOLD_EVERY: Duration = Duration::from_secs(1);

/// Installs the Prometheus recorder (once per process) and returns its handle; `None` when
/// another recorder was installed first (an embedding program's own).
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
                .ok()?
                .install_recorder()
                .ok()?;
            describe();
            metrics::gauge!("changehub_build_info", "version" => env!("CARGO_PKG_VERSION"))
                .set(1.0);
            Some(handle)
        })
        .clone()
}

/// Every `every` until `stop`, folds the values the histograms recorded into their buckets
/// (the exporter's upkeep; a scrape does it too). Without it they are kept one by one until
/// the next scrape: a hub that was never scraped grew by 20–30 MiB in 30 s of 1-change
/// ingest at about 60,000 requests a second, and without end.
pub async fn fold_histograms(handle: PrometheusHandle, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => handle.run_upkeep(),
        }
    }
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!("changehub_build_info", "The running version (always 1).");
    describe_counter!(
        "changehub_ingest_requests_total",
        "Ingest requests by channel and outcome."
    );
    describe_counter!(
        "changehub_ingested_changes_total",
        "Changes accepted by ingest, by channel."
    );
    describe_histogram!(
        "changehub_store_append_seconds",
        Unit::Seconds,
        "Time to append one ingest request durably."
    );
    describe_counter!(
        "changehub_store_errors_total",
        "Store operations that failed."
    );
    describe_counter!(
        "changehub_notifications_total",
        "Notifications rendered, by channel."
    );
    describe_counter!(
        "changehub_dumps_total",
        "Change Dumps published, by channel."
    );
    describe_counter!(
        "changehub_dump_skipped_total",
        "Resources left out of Change Dumps (fetch failed, too large, hash or length wrong), by channel."
    );
    describe_counter!(
        "changehub_deliveries_total",
        "Callback deliveries by outcome."
    );
    describe_histogram!(
        "changehub_delivery_latency_seconds",
        Unit::Seconds,
        "From the 202 of the changes to the callback's 2xx."
    );
    describe_gauge!(
        "changehub_delivery_retry_queue",
        "Subscriptions waiting to retry a delivery."
    );
    describe_gauge!(
        "changehub_subscriptions",
        "Subscriptions delivered by this instance, by state."
    );
    describe_gauge!(
        "changehub_subscriber_lag_max",
        "Seqs the furthest-behind subscription of a channel is behind its published head."
    );
    describe_gauge!(
        "changehub_websocket_connections",
        "Open websocket connections."
    );
    describe_gauge!(
        "changehub_sse_connections",
        "Open server-sent event streams."
    );
    describe_gauge!(
        "changehub_channels_owned",
        "Channels whose batching and delivery this instance runs."
    );
}

/// The state gauges, read when `/metrics` is.
#[derive(Debug, Default)]
pub struct Gauges {
    pub websocket_connections: usize,
    pub sse_connections: usize,
    pub channels_owned: usize,
    pub delivering: usize,
    pub retrying: usize,
    /// Per channel: the largest lag of its subscriptions.
    pub lag_max: BTreeMap<String, u64>,
}

impl Gauges {
    /// Sets every state gauge.
    pub fn set(&self) {
        metrics::gauge!("changehub_websocket_connections").set(self.websocket_connections as f64);
        metrics::gauge!("changehub_sse_connections").set(self.sse_connections as f64);
        metrics::gauge!("changehub_channels_owned").set(self.channels_owned as f64);
        metrics::gauge!("changehub_subscriptions", "state" => "delivering")
            .set(self.delivering as f64);
        metrics::gauge!("changehub_subscriptions", "state" => "retrying").set(self.retrying as f64);
        metrics::gauge!("changehub_delivery_retry_queue").set(self.retrying as f64);
        for (channel, lag) in &self.lag_max {
            metrics::gauge!("changehub_subscriber_lag_max", "channel" => channel.clone())
                .set(*lag as f64);
        }
    }
}

/// A channel's counters, registered with the recorder once and kept by its feed
/// ([`crate::batcher::ChannelFeed::counters`]): a counter named with a label is otherwise
/// looked up (its key built, its label copied, the registry searched) on every increment,
/// which is a tenth of the allocations of a 1-change publish.
pub struct ChannelCounters {
    /// `changehub_ingest_requests_total` by `outcome`.
    pub accepted: metrics::Counter,
    pub replayed: metrics::Counter,
    pub rejected: metrics::Counter,
    pub failed: metrics::Counter,
    /// `changehub_ingested_changes_total`.
    pub changes: metrics::Counter,
    /// `changehub_notifications_total`.
    pub notifications: metrics::Counter,
}

impl ChannelCounters {
    /// Registers `channel`'s counters with the recorder installed now (before [`install`]:
    /// with none, and they count nothing).
    pub fn register(channel: &str) -> ChannelCounters {
        let requests = |outcome: &'static str| {
            metrics::counter!(
                "changehub_ingest_requests_total",
                "channel" => channel.to_string(),
                "outcome" => outcome
            )
        };
        let changes = metrics::counter!(
            "changehub_ingested_changes_total",
            "channel" => channel.to_string()
        );
        let notifications = metrics::counter!(
            "changehub_notifications_total",
            "channel" => channel.to_string()
        );
        ChannelCounters {
            accepted: requests("accepted"),
            replayed: requests("replayed"),
            rejected: requests("rejected"),
            failed: requests("failed"),
            changes,
            notifications,
        }
    }
}

/// Seconds per step of a [`RateWindow`].
pub const RATE_STEP_SECS: u64 = 10;
/// Steps a [`RateWindow`] keeps: 10 minutes.
pub const RATE_STEPS: usize = 60;

/// What happened in one step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Step {
    /// Seconds since the Unix epoch / [`RATE_STEP_SECS`].
    index: u64,
    changes: u64,
    deliveries: u64,
    /// The changes by type: created, updated, deleted.
    types: [u64; 3],
}

/// Changes and deliveries counted per 10-second step over the last 10 minutes.
#[derive(Debug, Default)]
pub struct RateWindow {
    steps: Mutex<VecDeque<Step>>,
}

/// A [`RateWindow`] as the dashboard reads it: [`RATE_STEPS`] counts each, oldest first; the
/// last step is the current one, `elapsed` seconds old.
#[derive(Debug, Serialize, PartialEq)]
pub struct Rates {
    pub step: u64,
    pub elapsed: f64,
    pub changes: Vec<u64>,
    pub deliveries: Vec<u64>,
    /// The changes of the whole window by type.
    pub types: TypeCounts,
}

/// Changes by type.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct TypeCounts {
    pub created: u64,
    pub updated: u64,
    pub deleted: u64,
}

fn unix_secs(now: SystemTime) -> f64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl RateWindow {
    /// Counts changes published now, of these types.
    pub fn count_changes<'a>(&self, changes: impl IntoIterator<Item = &'a crate::model::Change>) {
        let mut types = [0; 3];
        for change in changes {
            use crate::model::ChangeType;
            let i = match change.change {
                ChangeType::Created => 0,
                ChangeType::Updated => 1,
                ChangeType::Deleted => 2,
            };
            types[i] += 1;
        }
        self.count(SystemTime::now(), types, 0);
    }

    /// Counts one notification delivered now.
    pub fn count_delivery(&self) {
        self.count(SystemTime::now(), [0; 3], 1);
    }

    fn count(&self, now: SystemTime, types: [u64; 3], deliveries: u64) {
        let index = unix_secs(now) as u64 / RATE_STEP_SECS;
        let changes = types.iter().sum();
        let mut steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
        match steps.back_mut() {
            Some(last) if last.index >= index => {
                last.changes += changes;
                last.deliveries += deliveries;
                for (total, n) in last.types.iter_mut().zip(types) {
                    *total += n;
                }
            }
            _ => steps.push_back(Step {
                index,
                changes,
                deliveries,
                types,
            }),
        }
        while steps
            .front()
            .is_some_and(|s| s.index + RATE_STEPS as u64 <= index)
        {
            steps.pop_front();
        }
    }

    /// The last 10 minutes, as of `now`.
    pub fn rates(&self, now: SystemTime) -> Rates {
        let secs = unix_secs(now);
        let current = secs as u64 / RATE_STEP_SECS;
        let first = current.saturating_sub(RATE_STEPS as u64 - 1);
        let mut out = Rates {
            step: RATE_STEP_SECS,
            elapsed: secs - (current * RATE_STEP_SECS) as f64,
            changes: vec![0; RATE_STEPS],
            deliveries: vec![0; RATE_STEPS],
            types: TypeCounts::default(),
        };
        let steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
        for s in steps
            .iter()
            .filter(|s| s.index >= first && s.index <= current)
        {
            let i = (s.index - first) as usize;
            out.changes[i] = s.changes;
            out.deliveries[i] = s.deliveries;
            out.types.created += s.types[0];
            out.types.updated += s.types[1];
            out.types.deleted += s.types[2];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn counts_per_step_over_ten_minutes() {
        let w = RateWindow::default();
        w.count(at(1_000_000), [4, 1, 0], 0);
        w.count(at(1_000_004), [0, 0, 2], 1);
        w.count(at(1_000_010), [0; 3], 3);
        let r = w.rates(at(1_000_012));
        assert_eq!(r.step, 10);
        assert_eq!(r.elapsed, 2.0);
        assert_eq!(r.changes.len(), RATE_STEPS);
        assert_eq!(r.changes[RATE_STEPS - 2..], [7, 0]);
        assert_eq!(r.deliveries[RATE_STEPS - 2..], [1, 3]);
        assert_eq!(r.changes.iter().sum::<u64>(), 7);
        let types = TypeCounts {
            created: 4,
            updated: 1,
            deleted: 2,
        };
        assert_eq!(r.types, types);

        // Ten minutes on, the first step has left the window; eleven minutes on, everything.
        let r = w.rates(at(1_000_000 + 600));
        assert_eq!(r.changes.iter().sum::<u64>(), 0);
        assert_eq!(r.types, TypeCounts::default());
        assert_eq!(r.deliveries.iter().sum::<u64>(), 3);
        let r = w.rates(at(1_000_000 + 660));
        assert_eq!(r.deliveries.iter().sum::<u64>(), 0);

        // Old steps are dropped as new ones are counted.
        w.count(at(1_000_000 + 3600), [1, 0, 0], 0);
        assert_eq!(w.steps.lock().unwrap().len(), 1);
    }
}
