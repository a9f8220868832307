//! The wiring: opens the store, starts every room in order, serves HTTP, and shuts down in
//! steps. [`run`] is the one entry point, shared by the binary and the tests; [`Hub`] is the
//! same hub without HTTP (tests of several instances use it).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::batcher::{Batcher, ChannelFeed, Feeds};
use crate::catchup::pages::{PageCache, PageFiles};
use crate::cluster::Cluster;
use crate::config::{Config, PagesConfig, StoreConfig};
use crate::external::External;
use crate::fanout::{Fanout, FanoutParts};
use crate::hosted::{Declared, Hosted};
use crate::ownership::Ownership;
use crate::store::{ClusterEvent, EmbeddedStore, RedisStore, Store, StoreError};
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
        StoreConfig::Embedded {
            data_dir,
            cache_size,
        } => Ok(Arc::new(EmbeddedStore::open_with_cache(
            data_dir,
            *cache_size,
        )?)),
        StoreConfig::Redis { url } => Ok(Arc::new(RedisStore::open_holding(
            url,
            config.held_changes,
        )?)),
    }
}

/// Settles how glibc's malloc keeps memory, unless the operator set the same through its
/// environment (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`). Call it first thing in the
/// process: arenas are made as threads first allocate.
///
/// - **At most two arenas per CPU** (its default is eight). The hub runs many threads
///   (runtime workers, the delivery runtime, the store's writer, blocking reads); each can get
///   an arena of its own, and memory freed in one arena is not reused by the threads of
///   another, so a long-running hub's resident memory kept growing with memory it had freed
///   (the steady run of `docs/performance.md`). Fewer arenas save more memory but cost
///   speed: on 2 CPUs, one arena took the steady run's peak from 106 to 94 MiB and ingest
///   down by about a third; two (one per CPU), 102 MiB and ingest down by 13–27%.
/// - **Blocks of 1 MiB and more mapped on their own** and handed back when freed. glibc's
///   default threshold starts at 128 KiB and rises to the size of each mapped block freed, up
///   to 32 MiB; after the first large document, every later one was taken from the arenas,
///   and the holes such documents (Change Lists, topics, gzip forms rendered for a read) leave
///   behind when they go stay resident. 1 MiB keeps the smaller blocks that are read again and
///   again (the 1,000-entry page blocks, a few hundred KB) in the arenas. Measured in the
///   steady run at `BENCH_SCALE=0.5` (`--cache-size 64`): RSS about 10 MiB lower all along,
///   at most 118 MiB against 130. glibc applies the threshold only when no heap has free room
///   for the block, so the Change Lists of 1 MiB or more get a mapping of their own from the
///   hub itself ([`crate::catchup::OWN_MAPPING`]).
/// - **A heap's free top kept until the periodic trim** ([`trim_freed_memory`]). Setting the
///   mmap threshold also fixes the threshold at which `free` shrinks a heap at its default,
///   128 KiB, where it used to follow the mmap threshold up; a heap could then shrink and
///   grow back again and again under load. 64 MiB leaves handing memory back to the trim
///   alone. (In one benchmark run with 128 KiB, `changes?after=` pages and fan-out were
///   10–25% below the old binary's; in one with 64 MiB, above it. Runs here vary by as
///   much, so this is a precaution, not a measured gain.)
pub fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let unset = |name: &str| std::env::var_os(name).is_none();
        if unset("MALLOC_ARENA_MAX") {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let arenas = libc::c_int::try_from(2 * cpus).unwrap_or(libc::c_int::MAX);
            // SAFETY: mallopt takes no pointers; M_ARENA_MAX only bounds how many arenas malloc
            // makes from now on. A refusal (0) leaves the default, which is harmless.
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, arenas);
            }
        }
        if unset("MALLOC_MMAP_THRESHOLD_") {
            // SAFETY: as above; M_MMAP_THRESHOLD only decides how later blocks are obtained.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            }
        }
        if unset("MALLOC_TRIM_THRESHOLD_") {
            // SAFETY: as above; M_TRIM_THRESHOLD only decides when `free` shrinks a heap.
            unsafe {
                libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
            }
        }
    }
}

/// See [`tune_malloc`].
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 1 << 20;
/// See [`tune_malloc`].
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 64 << 20;

/// How often `serve` hands freed memory back to the system ([`trim_freed_memory`]).
pub const TRIM_EVERY: Duration = Duration::from_millis(250);

/// Every `every`, hands the memory malloc keeps after it was freed back to the system
/// (`malloc_trim`, glibc only; elsewhere nothing), on a blocking thread. glibc keeps the
/// free pages that sit between live allocations resident; under a steady load, the caches
/// turning over leave such pages behind. Measured with the steady run of `scripts/bench.sh`
/// (`--cache-size 64`, 10 minutes): RSS at most 169 MiB without, 146 MiB with a trim every
/// 10 s, hub CPU 45% and 47% of a core. A trim gives back about 18 MiB in that run, and
/// within 2 s the load has touched about 14 MiB of it again. Sampled every 50 ms, the steady
/// run's RSS is a saw: each second's reads (a closed list and pages put together from blocks
/// read from their files) leave 3–4 MiB freed but resident until the next trim. With a
/// trim every 2 s the half-length run's RSS was 96.5 MiB at the median and at most 105 MiB;
/// every 250 ms, 92.5 and 99.9 MiB, the hub's CPU the same (26–27% of a core), and 1-change
/// ingest no slower; hence [`TRIM_EVERY`] of 250 ms.
/// Must be called inside the runtime; `serve` calls it, the [`run`] seam does not.
pub fn trim_freed_memory(every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let _ = tokio::task::spawn_blocking(crate::http::ws::trim_heap).await;
        }
    });
}

/// Runs the hub on `listener` until `shutdown` completes.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let config = Arc::new(config);
    // Before anything counts: the channels' counters are registered with the recorder there
    // is when they are first used (`ChannelCounters`).
    let metrics = crate::telemetry::install();
    let store = open_store(&config)?;
    let hub = Hub::start(config.clone(), store).await?;
    if let Some(handle) = &metrics {
        hub.work.tasks.spawn(crate::telemetry::fold_histograms(
            handle.clone(),
            crate::telemetry::FOLD_EVERY,
            hub.work.drain.clone(),
        ));
    }
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
    let state = Arc::new(http::Shared {
        config: config.clone(),
        store: hub.store.clone(),
        feeds: hub.feeds.clone(),
        fanout: hub.fanout.clone(),
        external: hub.external.clone(),
        tasks: hub.work.tasks.clone(),
        shutdown: stopping.clone(),
        connections: Arc::default(),
        metrics,
        control: hub.control.clone(),
        rendered: Arc::new(http::rendered::RenderedDocs::new(config.rendered_docs)),
        pages: hub.pages.clone(),
        xmpp: hub.xmpp.clone(),
    });
    // Declared ones and those of the admin API, by name.
    let channels = hub.feeds.names();
    if let Some(fds) = crate::config::open_file_limit().filter(|&n| n < 4096) {
        tracing::warn!(
            open_file_limit = fds,
            max_connections = config.http.max_connections,
            "the open-file limit is low: the hub takes at most max_connections connections; raise it (ulimit -n) for more"
        );
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %listener.local_addr()?,
        public_url = %config.urls.public(),
        dashboard = %config.urls.home(),
        store = %store_summary(&config.store),
        channels = %channels.join(","),
        admin_api = if config.admin_token.is_some() { "on" } else { "off (no --admin-token)" },
        max_connections = config.http.max_connections,
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
        StoreConfig::Embedded { data_dir, .. } => {
            format!("embedded at {}", data_dir.display())
        }
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

/// The cache of page entries `config` asks for: memory, and block files unless their size
/// is 0 or their folder cannot be made (then memory only, with a warning).
async fn open_pages(config: &PagesConfig) -> PageCache {
    if config.files == 0 {
        // Files left by an earlier run are not kept for a later one: this run does not check
        // them against the store (see `PageFiles::retain`).
        if let Some(dir) = config.dir.clone() {
            let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
            if let Ok(Err(e)) = removed {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = ?config.dir, error = %e, "cannot remove the folder of page entry files");
                }
            }
        }
        return PageCache::with_bound(config.memory);
    }
    let (dir, bound) = (config.dir.clone(), config.files);
    let opened = tokio::task::spawn_blocking(move || match dir {
        Some(dir) => PageFiles::open(&dir, bound),
        None => PageFiles::temporary(bound),
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    match opened {
        Ok(files) => {
            tracing::debug!(dir = %files.dir().display(), bytes = bound, "page entry files");
            PageCache::with_files(config.memory, files)
        }
        Err(e) => {
            tracing::warn!(dir = ?config.dir, error = %e, "cannot make the folder of page entry files; Change List entries not in memory are rendered from the store");
            PageCache::with_bound(config.memory)
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
    /// Starts and stops the channels of the admin API.
    pub control: Arc<Control>,
    /// The XMPP PubSub bridge, when configured.
    pub xmpp: Option<Arc<crate::xmpp::Bridge>>,
    /// The rendered entries of `changes?after=` pages (the feeds of hosted channels write
    /// the blocks they complete).
    pub pages: Arc<PageCache>,
}

/// How often every instance reloads the channels of the admin API (the announcements that
/// also carry them are at most once).
const CHANNELS_REFRESH: Duration = Duration::from_secs(5);

/// Brings the hosted channels in line with the channels the admin API stored: starts the
/// new ones, changes the settings of the changed ones, stops the removed ones.
pub struct Control {
    store: Arc<dyn Store>,
    config: Arc<Config>,
    feeds: Feeds,
    fanout: Arc<Fanout>,
    cluster: Option<Arc<Cluster>>,
    work: Work,
    /// Cancelled when the channel is removed (its batcher or cluster role stops).
    removed: std::sync::Mutex<std::collections::HashMap<String, CancellationToken>>,
    ownership: Arc<Ownership>,
    /// The outbound client of Change Dump fetches (the guard of every outbound request, a
    /// timeout fit for large resources).
    dump_client: reqwest::Client,
    /// Channels whose Change Dump task runs.
    dumpers: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// Timeout of one resource fetch for a Change Dump.
const DUMP_FETCH_TIMEOUT: Duration = Duration::from_secs(300);

impl Control {
    fn removal_token(&self, channel: &str) -> CancellationToken {
        let token = self.work.batcher_stop.child_token();
        self.removed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(channel.to_string(), token.clone());
        token
    }

    /// Runs the batcher of a channel on a store of one instance.
    fn start_batcher(&self, feed: Arc<ChannelFeed>) {
        let stop = self.removal_token(&feed.name);
        let batcher = Batcher::new(feed, self.store.clone(), self.config.clone());
        self.fanout
            .spawn_on_delivery_side(&self.work.batchers, batcher.run(stop));
    }

    /// Starts the Change Dumps of `channel` when its settings ask for them and they do not run
    /// yet: the internal channel that lists its dumps (feed and batcher, or on a shared store
    /// its cluster role) and the task that makes them ([`crate::dumps::Dumper`]).
    pub async fn start_dumps(&self, channel: &str) -> Result<(), StoreError> {
        if self
            .feeds
            .spec(channel)
            .and_then(|spec| spec.dumps)
            .is_none()
        {
            return Ok(());
        }
        let internal = crate::dumps::channel_name(channel);
        let (new, feed) = self.feeds.put_internal(&internal);
        if new {
            match &self.cluster {
                Some(cluster) => {
                    let head = self.store.head(&internal).await?;
                    feed.start_at(head.last);
                    cluster.add_channel(feed);
                }
                None => self.start_batcher(feed),
            }
        }
        if !self
            .dumpers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(channel.to_string())
        {
            return Ok(());
        }
        // The first time, dumps begin with the changes that come after: the past is not
        // fetched again (a channel with a long log would otherwise dump all of it at once).
        let begin = async {
            if self
                .store
                .bridge_cursor(channel, crate::dumps::BRIDGE)
                .await?
                .is_none()
            {
                let head = self.store.head(channel).await?;
                self.store
                    .put_bridge_cursor(channel, crate::dumps::BRIDGE, head.last)
                    .await?;
            }
            Ok::<(), StoreError>(())
        };
        if let Err(e) = begin.await {
            tracing::warn!(%channel, error = %e, "cannot record where the Change Dumps begin; they begin with the oldest retained change");
        }
        tracing::info!(%channel, "Change Dumps started");
        let dumper = crate::dumps::Dumper {
            config: self.config.clone(),
            store: self.store.clone(),
            feeds: self.feeds.clone(),
            ownership: self.ownership.clone(),
            client: self.dump_client.clone(),
            channel: channel.to_string(),
        };
        let dumpers = self.dumpers.clone();
        let name = channel.to_string();
        let stop = self.work.batcher_stop.clone();
        self.work.tasks.spawn(async move {
            dumper.run(stop).await;
            dumpers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&name);
        });
        Ok(())
    }

    /// Loads the stored settings of `channel` and applies them: a new channel starts, a
    /// changed one takes its new settings at once, a removed one stops. Channels declared at
    /// start-up are left alone.
    pub async fn apply(&self, channel: &str) -> Result<(), StoreError> {
        if self
            .feeds
            .get(channel)
            .is_some_and(|c| c.declared == Declared::StartUp)
        {
            return Ok(());
        }
        match self.store.stored_channel(channel).await? {
            Some(spec) => {
                if let Err(e) = spec.check() {
                    tracing::warn!(%channel, error = %e, "ignoring a stored channel");
                    return Ok(());
                }
                let (new, feed) = self.feeds.put(spec, Declared::Api);
                self.start_dumps(channel).await?;
                if new {
                    tracing::info!(%channel, "channel created");
                    if let Err(e) = feed.origin(self.store.as_ref()).await {
                        tracing::warn!(%channel, error = %e, "cannot record the channel's origin; will on first use");
                    }
                    match &self.cluster {
                        Some(cluster) => {
                            let head = self.store.head(channel).await?;
                            feed.start_at(head.last);
                            cluster.add_removable_channel(feed, self.removal_token(channel));
                        }
                        None => {
                            self.start_batcher(feed);
                            self.fanout.take_channel(channel).await?;
                        }
                    }
                }
            }
            None => {
                if self.feeds.remove(channel).is_some() {
                    tracing::info!(%channel, "channel removed");
                    let token = self
                        .removed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(channel);
                    if let Some(token) = token {
                        token.cancel();
                    }
                    self.fanout.drop_channel(channel);
                }
            }
        }
        Ok(())
    }

    /// Follows the channels of the admin API: on every announcement of a change, and every
    /// [`CHANNELS_REFRESH`] all of them (announcements can be lost).
    async fn follow_changes(self: Arc<Self>, stop: CancellationToken) {
        let mut events = self.store.events();
        let mut refresh = tokio::time::interval(CHANNELS_REFRESH);
        loop {
            let changed = tokio::select! {
                _ = stop.cancelled() => return,
                _ = refresh.tick() => None,
                event = next_channel_event(&mut events) => event,
            };
            let result = match changed {
                Some(channel) => self.apply(&channel).await,
                None => self.refresh().await,
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "cannot follow the channels of the admin API now");
            }
        }
    }

    /// Applies every stored channel, and removes the channels of the admin API that are no
    /// longer stored.
    async fn refresh(&self) -> Result<(), StoreError> {
        let stored = self.store.stored_channels().await?;
        let mut names: Vec<String> = stored.into_iter().map(|s| s.name).collect();
        for channel in self.feeds.all() {
            if channel.declared == Declared::Api && !names.contains(&channel.spec.name) {
                names.push(channel.spec.name.to_string());
            }
        }
        for name in names {
            self.apply(&name).await?;
        }
        Ok(())
    }
}

/// The next channel named by a [`ClusterEvent::Channel`] (never, on a store of one instance).
async fn next_channel_event(
    events: &mut Option<tokio::sync::broadcast::Receiver<ClusterEvent>>,
) -> Option<String> {
    let Some(rx) = events else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(ClusterEvent::Channel { channel }) => return Some(channel),
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return None,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                *events = None;
                return None;
            }
        }
    }
}

impl Hub {
    /// Starts batching, delivery and retention on `store`.
    pub async fn start(config: Arc<Config>, store: Arc<dyn Store>) -> Result<Hub, Error> {
        let work = Work::new();
        let pages = Arc::new(open_pages(&config.pages).await);
        let feeds: Feeds = Arc::new(Hosted::with_pages(
            pages.clone(),
            config.recent_notifications,
        ));
        for spec in config.channels.values() {
            feeds.put(spec.clone(), Declared::StartUp);
        }
        // Channels created through the admin API (a start-up declaration of the same name
        // wins).
        match store.stored_channels().await {
            Ok(stored) => {
                for spec in stored {
                    if feeds.contains(&spec.name) {
                        tracing::warn!(channel = %spec.name, "a channel of the admin API is also declared at start-up; the declaration wins");
                    } else if let Err(e) = spec.check() {
                        tracing::warn!(channel = %spec.name, error = %e, "ignoring a stored channel");
                    } else {
                        feeds.put(spec, Declared::Api);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot load the channels of the admin API; will retry")
            }
        }
        let dump_client = net::outbound_client(
            config.allow_private_callbacks,
            DUMP_FETCH_TIMEOUT.max(config.delivery_timeout),
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
        let xmpp = config.xmpp.clone().map(|x| {
            crate::xmpp::Bridge::new(
                x,
                config.clone(),
                store.clone(),
                feeds.clone(),
                ownership.clone(),
            )
        });
        let fanout = Fanout::new(FanoutParts {
            config: config.clone(),
            store: store.clone(),
            feeds: feeds.clone(),
            external: external.clone(),
            client,
            ownership: ownership.clone(),
            work: work.clone(),
        });
        fanout.start_progress();
        let cluster = if store.shared() {
            // Each channel is batched and delivered by the instance that owns it.
            let cluster = Cluster::new(
                store.clone(),
                config.clone(),
                fanout.clone(),
                ownership.clone(),
                &work,
            );
            let starter = cluster.clone();
            external.set_channel_starter(Box::new(move |feed| starter.add_channel(feed)));
            cluster.start(&feeds).await;
            work.tasks.spawn(external.clone().follow_other_instances());
            Some(cluster)
        } else {
            None
        };
        let control = Arc::new(Control {
            store: store.clone(),
            config: config.clone(),
            feeds: feeds.clone(),
            fanout: fanout.clone(),
            cluster: cluster.clone(),
            work: work.clone(),
            removed: std::sync::Mutex::default(),
            ownership,
            dump_client,
            dumpers: Arc::default(),
        });
        if cluster.is_none() {
            for feed in feeds.feeds() {
                control.start_batcher(feed);
            }
        }
        // Each channel's origin is recorded once: when it began (an empty Change List's
        // `from`) and the epoch of its log.
        // The block files an earlier run left are kept for the logs they are still of, as far
        // as each log's newest seq (a store put back to an earlier state may have other
        // changes under later seqs), before any page is served.
        let mut logs = std::collections::HashMap::new();
        for feed in feeds.feeds() {
            match feed.origin(store.as_ref()).await {
                Ok(origin) => {
                    if let Ok(head) = store.head(&feed.name).await {
                        logs.insert(feed.name.clone(), (origin.epoch.clone(), head.last));
                    }
                }
                Err(e) => {
                    tracing::warn!(channel = %feed.name, error = %e, "cannot record the channel's origin; will on first use");
                }
            }
        }
        let kept = pages.clone();
        let retained = tokio::task::spawn_blocking(move || {
            kept.retain_files(|channel, epoch| {
                logs.get(channel)
                    .filter(|(e, _)| e == epoch)
                    .map(|(_, last)| *last)
            })
        });
        if let Err(e) = retained.await {
            tracing::warn!(error = %e, "cannot check the block files found at start-up");
        }
        // Change Dumps (before delivery resumes: their subscriptions need the feeds).
        for channel in feeds.all() {
            if let Err(e) = control.start_dumps(&channel.spec.name).await {
                tracing::warn!(channel = %channel.spec.name, error = %e, "cannot start the Change Dumps; will with the next reload");
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
        work.tasks.spawn(trim_loop(
            store.clone(),
            feeds.clone(),
            config.trim_interval,
            work.drain.clone(),
        ));
        work.tasks
            .spawn(control.clone().follow_changes(work.drain.clone()));
        if let Some(bridge) = &xmpp {
            bridge.spawn(&work);
        }
        Ok(Hub {
            xmpp,
            config,
            store,
            feeds,
            external,
            fanout,
            cluster,
            work,
            resumed,
            control,
            pages,
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
        self.fanout.close().await;
        if let Some(cluster) = &self.cluster {
            cluster.release_all().await;
        }
        // A temporary folder of page entry files goes (DATA_DIR/pages waits for the next
        // start, which empties it).
        let pages = self.pages.clone();
        let _ = tokio::task::spawn_blocking(move || pages.close()).await;
    }
}

async fn trim_loop(store: Arc<dyn Store>, feeds: Feeds, every: Duration, stop: CancellationToken) {
    let mut interval = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = interval.tick() => {}
        }
        for channel in feeds.all() {
            let channel = &channel.spec;
            let now = time::OffsetDateTime::now_utc();
            match store.trim(&channel.name, channel.retention, now).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(channel = %channel.name, removed = n, "retention applied"),
                Err(e) if e.logged_by_store() => {}
                Err(e) => tracing::warn!(channel = %channel.name, error = %e, "retention failed"),
            }
        }
    }
}
