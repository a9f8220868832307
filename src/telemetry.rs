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
//! | `changehub_deliveries_total` | counter | `outcome` (`delivered`, `failed`, `gone`, `given_up`) |
//! | `changehub_delivery_latency_seconds` | histogram: from the changes' 202 to the callback's 2xx | |
//! | `changehub_delivery_retry_queue` | gauge: subscriptions waiting to retry | |
//! | `changehub_subscriptions` | gauge | `state` (`delivering`, `retrying`) |
//! | `changehub_subscriber_lag_max` | gauge: seqs the furthest-behind subscriber is behind the published head | `channel` |
//! | `changehub_websocket_connections`, `changehub_sse_connections` | gauge | |
//! | `changehub_channels_owned` | gauge | |
//!
//! The recorder is process-wide: several hubs in one process (tests) share it.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Latency buckets, seconds: 1 ms to 1 minute.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

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
