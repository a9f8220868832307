//! The wiring: opens the store, starts every room in order, serves HTTP, and shuts down in
//! steps. [`run`] is the one entry point, shared by the binary and the tests; [`Hub`] is the
//! same hub without HTTP (tests of several instances use it).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::batcher::{Batcher, ChannelFeed, Feeds};
use crate::cluster::Cluster;
use crate::config::{Config, StoreConfig};
use crate::external::External;
use crate::fanout::{Fanout, FanoutParts};
use crate::ownership::Ownership;
use crate::store::{EmbeddedStore, RedisStore, Store, StoreError};
use crate::work::Work;
use crate::{http, net};

/// How long shutdown waits for background tasks before giving up on them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // `transparent`: the store's message is the whole message (printed once, not again as
    // the cause).
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

/// Opens the configured store.
pub fn open_store(config: &Config) -> Result<Arc<dyn Store>, Error> {
    match &config.store {
        StoreConfig::Embedded { data_dir } => Ok(Arc::new(EmbeddedStore::open(data_dir)?)),
        StoreConfig::Redis { url } => Ok(Arc::new(RedisStore::open(url)?)),
    }
}

/// Runs the hub on `listener` until `shutdown` completes.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let config = Arc::new(config);
    let store = open_store(&config)?;
    let hub = Hub::start(config.clone(), store).await?;
    // `stopping` fires when `shutdown` completes: the server stops accepting, and websockets
    // and event streams end.
    let stopping = CancellationToken::new();
    {
        let stopping = stopping.clone();
        tokio::spawn(async move {
            shutdown.await;
            stopping.cancel();
        });
    }
    let state = http::AppState {
        config: config.clone(),
        store: hub.store.clone(),
        feeds: hub.feeds.clone(),
        fanout: hub.fanout.clone(),
        external: hub.external.clone(),
        tasks: hub.work.tasks.clone(),
        shutdown: stopping.clone(),
        connections: Arc::default(),
        metrics: crate::telemetry::install(),
    };
    let mut channels: Vec<&str> = config.channels.keys().map(String::as_str).collect();
    channels.sort_unstable();
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %listener.local_addr()?,
        public_url = %config.urls.public(),
        dashboard = %config.urls.home(),
        store = %store_summary(&config.store),
        channels = %channels.join(","),
        admin_api = if config.admin_token.is_some() { "on" } else { "off (no --admin-token)" },
        subscriptions = hub.resumed,
        "changehub serving"
    );
    let served = http::serve(listener, state, stopping.cancelled_owned()).await;
    hub.stop().await;
    served?;
    Ok(())
}

/// Which store, and where, for the start-up line (a Redis password is not shown).
fn store_summary(store: &StoreConfig) -> String {
    match store {
        StoreConfig::Embedded { data_dir } => format!("embedded at {}", data_dir.display()),
        StoreConfig::Redis { url } => {
            let shown = match (url.find("://"), url.rfind('@')) {
                (Some(scheme), Some(at)) if at > scheme => {
                    format!("{}***{}", &url[..scheme + 3], &url[at..])
                }
                _ => url.clone(),
            };
            format!("redis at {shown}")
        }
    }
}

/// A running hub without its web layer: the store, the feeds of the hosted channels, external
/// topics, the fan-out, and on a shared store the cluster.
pub struct Hub {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub feeds: Feeds,
    pub external: Arc<External>,
    pub fanout: Arc<Fanout>,
    /// On a shared store: channel ownership among instances.
    pub cluster: Option<Arc<Cluster>>,
    pub work: Work,
    /// Subscriptions whose delivery resumed at start-up (on this instance).
    pub resumed: usize,
}

impl Hub {
    /// Starts batching, delivery and retention on `store`.
    pub async fn start(config: Arc<Config>, store: Arc<dyn Store>) -> Result<Hub, Error> {
        let work = Work::new();
        let feeds: Feeds = Arc::new(
            config
                .channels
                .keys()
                .map(|name| (name.clone(), Arc::new(ChannelFeed::new(name))))
                .collect(),
        );
        let ownership = if store.shared() {
            Ownership::leased()
        } else {
            Ownership::everything()
        };
        let client = net::outbound_client(config.allow_private_callbacks, config.delivery_timeout);
        let external = External::new(
            config.clone(),
            store.clone(),
            client.clone(),
            ownership.clone(),
            &work,
        );
        let fanout = Fanout::new(FanoutParts {
            config: config.clone(),
            store: store.clone(),
            feeds: feeds.clone(),
            external: external.clone(),
            client,
            ownership: ownership.clone(),
            work: work.clone(),
        });
        let cluster = if store.shared() {
            // Each channel is batched and delivered by the instance that owns it.
            let cluster = Cluster::new(
                store.clone(),
                config.clone(),
                fanout.clone(),
                ownership,
                &work,
            );
            let starter = cluster.clone();
            external.set_channel_starter(Box::new(move |feed| starter.add_channel(feed)));
            cluster.start(&feeds).await;
            work.tasks.spawn(external.clone().follow_other_instances());
            Some(cluster)
        } else {
            for feed in feeds.values() {
                let batcher = Batcher::new(feed.clone(), store.clone(), config.clone());
                work.batchers.spawn(batcher.run(work.batcher_stop.clone()));
            }
            None
        };
        // Each channel's origin is recorded once: when it began (an empty Change List's
        // `from`) and the epoch of its log.
        for (name, feed) in feeds.iter() {
            if let Err(e) = feed.origin(store.as_ref()).await {
                tracing::warn!(channel = %name, error = %e, "cannot record the channel's origin; will on first use");
            }
        }
        // External topics with stored subscriptions are served again (on every store).
        if let Err(e) = external.register_subscribed().await {
            tracing::warn!(error = %e, "cannot load the subscriptions of external topics");
        }
        let resumed = match &cluster {
            None => fanout.resume().await?,
            Some(_) => 0, // the owner of each channel starts its workers
        };
        work.tasks
            .spawn(trim_loop(store.clone(), config.clone(), work.drain.clone()));
        Ok(Hub {
            config,
            store,
            feeds,
            external,
            fanout,
            cluster,
            work,
            resumed,
        })
    }

    /// Shuts down in steps: batchers publish what is pending, workers deliver what is
    /// published (then whatever still runs after a grace period is stopped), and on a shared
    /// store the leases are released so that another instance takes over at once.
    pub async fn stop(self) {
        let work = &self.work;
        tracing::info!("shutting down: flushing batches");
        work.batcher_stop.cancel();
        work.batchers.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, work.batchers.wait())
            .await
            .is_err()
        {
            tracing::warn!("batchers did not finish in time");
        }
        tracing::info!("shutting down: delivering what is published");
        work.drain.cancel();
        work.tasks.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, work.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("deliveries did not finish in time; stopping them");
            work.cancel.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(2), work.tasks.wait()).await;
        }
        if let Some(cluster) = &self.cluster {
            cluster.release_all().await;
        }
    }
}

async fn trim_loop(store: Arc<dyn Store>, config: Arc<Config>, stop: CancellationToken) {
    let mut interval = tokio::time::interval(config.trim_interval);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = interval.tick() => {}
        }
        for channel in config.channels.values() {
            let now = time::OffsetDateTime::now_utc();
            match store.trim(&channel.name, channel.retention, now).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(channel = %channel.name, removed = n, "retention applied"),
                Err(e) => tracing::warn!(channel = %channel.name, error = %e, "retention failed"),
            }
        }
    }
}
