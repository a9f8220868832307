//! changehub: a ResourceSync change-notification hub.
//!
//! Data flows one way, and the modules follow it:
//!
//! ```text
//! source ──POST──▶ ingest ──append──▶ store (the log) ──head──▶ batcher ──notification──▶ fanout ──POST──▶ callbacks
//!                                        ▲                                                   (websub, delivery)
//!                                        └──────────────── catchup (changelist.xml, changes?after=) ◀── anyone
//! ```
//!
//! - [`change`]: the change model and its validation.
//! - [`resourcesync`]: ResourceSync documents, written and parsed; no HTTP.
//! - [`ingest`]: `POST /channels/{name}/changes`.
//! - [`store`]: the [`store::Store`] trait and its engines (embedded redb, Redis).
//! - [`cluster`]: several instances on one Redis: channel ownership leases, followers.
//! - [`batcher`]: cuts the log into notifications per channel.
//! - [`fanout`]: WebSub subscriptions, verification, signed delivery with retries.
//! - [`catchup`]: the documents subscribers pull to catch up, and discovery.
//! - [`live`]: websockets, server-sent events and the dashboard.
//! - [`http`]: state, router, errors, health.
//! - [`api`]: the admin API.
//! - [`config`]: `changehub serve` settings.
//!
//! [`run`] is the one entry point, shared by the binary and the tests: it serves on a listener
//! until the `shutdown` future completes, then flushes the batchers and stops every task.

pub mod api;
pub mod auth;
pub mod batcher;
pub mod catchup;
pub mod client;
pub mod cluster;
pub mod config;
pub mod fanout;
pub mod http;
pub mod ingest;
pub mod live;
pub mod model;
pub mod net;
pub mod resourcesync;
pub mod retry;
pub mod store;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batcher::ChannelFeed;
use crate::config::{Config, StoreConfig};
use crate::store::{EmbeddedStore, RedisStore, Store, StoreError};

/// How long shutdown waits for background tasks before giving up on them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("store: {0}")]
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
    let tasks = TaskTracker::new();
    // Shutdown happens in three steps, each with its own token: the batchers flush what is
    // pending (`batcher_cancel`), the workers deliver what is published and stop when idle
    // (`drain`), and whatever still runs after the grace period is stopped (`cancel`).
    let drain = CancellationToken::new();
    let cancel = CancellationToken::new();
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

    let feeds: Arc<BTreeMap<String, Arc<ChannelFeed>>> = Arc::new(
        config
            .channels
            .keys()
            .map(|name| (name.clone(), Arc::new(ChannelFeed::new(name))))
            .collect(),
    );
    // Batchers get their own token: they must flush after the server stops taking changes
    // and before the store goes away.
    let batchers = TaskTracker::new();
    let batcher_cancel = CancellationToken::new();
    if !store.shared() {
        for feed in feeds.values() {
            let batcher = batcher::Batcher::new(feed.clone(), store.clone(), config.clone());
            batchers.spawn(batcher.run(batcher_cancel.clone()));
        }
    }

    let client = net::outbound_client(config.allow_private_callbacks, config.delivery_timeout);
    let external = fanout::external::External::new(
        config.clone(),
        store.clone(),
        client.clone(),
        batchers.clone(),
        batcher_cancel.clone(),
        tasks.clone(),
        cancel.clone(),
    );
    let fanout = fanout::Fanout::new(
        config.clone(),
        store.clone(),
        feeds.clone(),
        external,
        client,
        tasks.clone(),
        cancel.clone(),
        drain.clone(),
    );
    // On a shared store, each channel is batched and delivered by the instance that owns it.
    let cluster = if store.shared() {
        let cluster =
            cluster::Cluster::new(store.clone(), config.clone(), feeds.clone(), fanout.clone());
        cluster.start(&batchers, batcher_cancel.clone()).await;
        Some(cluster)
    } else {
        None
    };
    let resumed = match &cluster {
        None => fanout.resume().await?,
        Some(_) => 0,
    };
    tasks.spawn(trim_loop(store.clone(), config.clone(), drain.clone()));

    let state = http::AppState {
        config: config.clone(),
        store: store.clone(),
        feeds,
        fanout,
        tasks: tasks.clone(),
        shutdown: stopping.clone(),
        connections: Arc::default(),
    };
    let app = http::router(state);
    tracing::info!(
        listen = %listener.local_addr()?,
        public_url = %config.public_url,
        channels = config.channels.len(),
        subscriptions = resumed,
        "changehub serving"
    );
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(stopping.clone().cancelled_owned())
    .await;

    tracing::info!("shutting down: flushing batches");
    batcher_cancel.cancel();
    batchers.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, batchers.wait())
        .await
        .is_err()
    {
        tracing::warn!("batchers did not finish in time");
    }
    tracing::info!("shutting down: delivering what is published");
    drain.cancel();
    tasks.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("deliveries did not finish in time; stopping them");
        cancel.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), tasks.wait()).await;
    }
    if let Some(cluster) = &cluster {
        cluster.release_all().await;
    }
    served?;
    Ok(())
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
