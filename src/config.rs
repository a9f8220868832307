//! Configuration of `changehub serve`: command-line flags (each also read from a `CHANGEHUB_*`
//! environment variable), an optional TOML file given by `--config`, and the defaults, merged in
//! that order of precedence into one [`Config`].

use clap::Args;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::model::{Algorithm, DumpSettings, Retention, MAX_LIST_SIZE};
use crate::net::Urls;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Toml {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))
}

/// Flags of `changehub serve`. Every value is optional here so that the TOML file can supply
/// it; defaults are applied in [`ServeArgs::resolve`].
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with the same settings (flag names with `_` for `-`) and `[channels.NAME]` tables.
    #[arg(long, env = "CHANGEHUB_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on: IP:PORT or HOST:PORT (default 127.0.0.1:8080).
    #[arg(long, env = "CHANGEHUB_LISTEN")]
    pub listen: Option<String>,
    /// Public base URL of the hub (default `http://{listen}`); topic URLs are built from it.
    #[arg(long, env = "CHANGEHUB_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Folder of the embedded store, the default store (default ./changehub-data).
    #[arg(long, env = "CHANGEHUB_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Use the Redis store at this URL (`redis://host:6379/`), or on a Redis Cluster
    /// (`redis+cluster://host:7000,host:7001,host:7002`: seed nodes), instead of the embedded
    /// store; several instances on one Redis (or cluster) act as one hub.
    #[arg(long, env = "CHANGEHUB_REDIS")]
    pub redis: Option<String>,
    /// Declare a channel and its publisher token: `NAME=TOKEN` (repeatable). That publisher
    /// is named "default".
    #[arg(long = "channel", env = "CHANGEHUB_CHANNELS", value_delimiter = ',')]
    pub channels: Vec<String>,
    /// Add a named publisher to a channel: `CHANNEL:PUBLISHER=TOKEN` (repeatable; declares
    /// the channel when new). Its name is recorded as the source of every change it pushes.
    #[arg(
        long = "publisher",
        env = "CHANGEHUB_PUBLISHERS",
        value_delimiter = ','
    )]
    pub publishers: Vec<String>,
    /// Bearer token for the admin API.
    #[arg(long, env = "CHANGEHUB_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// Bearer token that `GET /metrics` asks for (default: none, metrics are public).
    #[arg(long, env = "CHANGEHUB_METRICS_TOKEN")]
    pub metrics_token: Option<String>,
    /// Allow callbacks that resolve to loopback, private or link-local addresses.
    #[arg(long, env = "CHANGEHUB_ALLOW_PRIVATE_CALLBACKS")]
    pub allow_private_callbacks: bool,
    /// Serve external topics under this URL prefix (`*` for any; repeatable).
    #[arg(
        long = "allow-external-topics",
        env = "CHANGEHUB_ALLOW_EXTERNAL_TOPICS"
    )]
    pub allow_external_topics: Vec<String>,
    /// Most changes in one notification (default 1000).
    #[arg(long, env = "CHANGEHUB_MAX_BATCH")]
    pub max_batch: Option<usize>,
    /// How long a batch waits for more changes before it is sent (default 100ms).
    #[arg(long, env = "CHANGEHUB_LINGER", value_parser = parse_duration)]
    pub linger: Option<Duration>,
    /// Largest ingest request body in bytes (default 8 MiB).
    #[arg(long, env = "CHANGEHUB_MAX_BODY")]
    pub max_body: Option<usize>,
    /// Memory for the hub's caches, all together, in MiB (default 256): half for the embedded
    /// store's file, a quarter for rendered Change List entries (`changes?after=` pages, the
    /// topic and closed lists are made of them), an eighth
    /// for rendered topics and closed Change Lists, an eighth for the recent notifications
    /// that delivery shares. It bounds the hub's resident memory however long the log grows;
    /// more makes reads of older changes faster. With --redis an eighth (of the store's half) holds the
    /// large requests just appended until the batcher has read them.
    #[arg(long, env = "CHANGEHUB_CACHE_SIZE")]
    pub cache_size: Option<usize>,
    /// Disk the files of rendered Change List entries (of which `changes?after=` pages, the
    /// topic and closed lists are made) may take, in MiB (default 2048; 0: no files, entries
    /// are rendered from the store when memory does not hold them, and the folder an earlier
    /// run left is removed).
    /// The files are a cache: in `pages` in the data directory, kept across restarts (a
    /// restarted hub serves pages from them at once), or with --redis in a temporary folder
    /// removed when the hub stops. About 300 bytes per retained change: size it to the
    /// retention of all channels together.
    #[arg(long, env = "CHANGEHUB_PAGE_FILES_SIZE")]
    pub page_files_size: Option<u64>,
    /// Lease granted when a subscriber asks for none (default 10 days).
    #[arg(long, env = "CHANGEHUB_LEASE_DEFAULT", value_parser = parse_duration)]
    pub lease_default: Option<Duration>,
    /// Shortest lease granted (default 5 minutes).
    #[arg(long, env = "CHANGEHUB_LEASE_MIN", value_parser = parse_duration)]
    pub lease_min: Option<Duration>,
    /// Longest lease granted (default 30 days).
    #[arg(long, env = "CHANGEHUB_LEASE_MAX", value_parser = parse_duration)]
    pub lease_max: Option<Duration>,
    /// How long a notification is retried before it is given up (default 24h).
    #[arg(long, env = "CHANGEHUB_RETRY_FOR", value_parser = parse_duration)]
    pub retry_for: Option<Duration>,
    /// How far in the future a change's datetime may be; later ones are refused with 400
    /// (default 1day). A far-future datetime would hold every later change of the channel at
    /// that date, since datetimes never go backwards within a channel.
    #[arg(long, env = "CHANGEHUB_MAX_FUTURE", value_parser = parse_duration)]
    pub max_future: Option<Duration>,
    /// Most subscriptions to one topic (default 10000); past it a subscription is denied.
    #[arg(long, env = "CHANGEHUB_MAX_SUBSCRIPTIONS_PER_TOPIC")]
    pub max_subscriptions_per_topic: Option<usize>,
    /// Most subscriptions whose callbacks are on one host (default 1000); past it, denied.
    #[arg(long, env = "CHANGEHUB_MAX_SUBSCRIPTIONS_PER_HOST")]
    pub max_subscriptions_per_host: Option<usize>,
    /// First retry delay; later ones double, with jitter (default 5s).
    #[arg(long, env = "CHANGEHUB_RETRY_INITIAL", value_parser = parse_duration)]
    pub retry_initial: Option<Duration>,
    /// Longest delay between two retries (default 1h).
    #[arg(long, env = "CHANGEHUB_RETRY_MAX", value_parser = parse_duration)]
    pub retry_max: Option<Duration>,
    /// Timeout of one delivery or verification request (default 10s).
    #[arg(long, env = "CHANGEHUB_DELIVERY_TIMEOUT", value_parser = parse_duration)]
    pub delivery_timeout: Option<Duration>,
    /// Default `X-Hub-Signature` algorithm: sha1, sha256, sha384, sha512 (default sha256).
    #[arg(long, env = "CHANGEHUB_SIGNATURE_ALGORITHM")]
    pub signature_algorithm: Option<Algorithm>,
    /// Keep at most this many changes per channel (default 1,000,000).
    #[arg(long, env = "CHANGEHUB_RETAIN_CHANGES")]
    pub retain_changes: Option<u64>,
    /// Drop changes older than this (default: keep by count only).
    #[arg(long, env = "CHANGEHUB_RETAIN_FOR", value_parser = parse_duration)]
    pub retain_for: Option<Duration>,
    /// Close the open Change List (the topic) into the archive every N changes (default
    /// 10,000, at most 50,000). Retention drops whole closed lists.
    #[arg(long, env = "CHANGEHUB_ARCHIVE_EVERY")]
    pub archive_every: Option<u64>,
    /// How often retention is applied (default 10s).
    #[arg(long, env = "CHANGEHUB_TRIM_INTERVAL", value_parser = parse_duration, hide = true)]
    pub trim_interval: Option<Duration>,
    /// Make a channel private: websocket, SSE and catch-up reads need this token
    /// (`NAME=TOKEN`, repeatable).
    #[arg(
        long = "read-token",
        env = "CHANGEHUB_READ_TOKENS",
        value_delimiter = ','
    )]
    pub read_tokens: Vec<String>,
    /// Most websocket connections from one IP address (default 1000).
    #[arg(long, env = "CHANGEHUB_WS_MAX_CONNECTIONS_PER_IP")]
    pub ws_max_connections_per_ip: Option<usize>,
    /// Most channel subscriptions on one websocket (default 64).
    #[arg(long, env = "CHANGEHUB_WS_MAX_SUBSCRIPTIONS")]
    pub ws_max_subscriptions: Option<usize>,
    /// Outgoing frames queued per websocket before a slow client is closed (default 256).
    #[arg(long, env = "CHANGEHUB_WS_QUEUE")]
    pub ws_queue: Option<usize>,
    /// Interval of websocket pings (default 30s).
    #[arg(long, env = "CHANGEHUB_WS_PING", value_parser = parse_duration)]
    pub ws_ping: Option<Duration>,
    /// Bytes of outgoing frames queued per websocket (default 1048576): replay waits for room,
    /// a live frame that finds none closes the connection (4008), and so does a replay that
    /// waits longer than `--ws-stall`.
    #[arg(long, env = "CHANGEHUB_WS_QUEUE_BYTES")]
    pub ws_queue_bytes: Option<usize>,
    /// Most connections at once (default: 10,000, or less when the open-file limit is lower);
    /// past it a connection gets 503 at once.
    #[arg(long, env = "CHANGEHUB_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Most connections at once from one client address (default 1000); past it, 429.
    #[arg(long, env = "CHANGEHUB_MAX_CONNECTIONS_PER_IP")]
    pub max_connections_per_ip: Option<usize>,
    /// How long a client may take to send a request's headers, and how long an idle
    /// keep-alive connection stays open (default 10s).
    #[arg(long, env = "CHANGEHUB_HEADER_READ_TIMEOUT", value_parser = parse_duration)]
    pub header_read_timeout: Option<Duration>,
    /// How long a client may take to send a request body (default 30s; 408 past it).
    #[arg(long, env = "CHANGEHUB_BODY_TIMEOUT", value_parser = parse_duration)]
    pub body_timeout: Option<Duration>,
    /// How long a websocket replay waits for a client that reads nothing (default 30s).
    #[arg(long, env = "CHANGEHUB_WS_STALL", value_parser = parse_duration)]
    pub ws_stall: Option<Duration>,
    /// Publish every channel's notifications to an XMPP PubSub service as this account
    /// (`hub@example.org`); needs `--xmpp-password` and `--xmpp-service`.
    #[arg(long, env = "CHANGEHUB_XMPP_JID")]
    pub xmpp_jid: Option<String>,
    /// Password of the `--xmpp-jid` account (never logged).
    #[arg(long, env = "CHANGEHUB_XMPP_PASSWORD", hide_env_values = true)]
    pub xmpp_password: Option<String>,
    /// The XMPP PubSub service (XEP-0060) that gets one node per channel
    /// (`pubsub.example.org`).
    #[arg(long, env = "CHANGEHUB_XMPP_SERVICE")]
    pub xmpp_service: Option<String>,
    /// Connect to this XMPP server (HOST:PORT) instead of the one DNS names for the JID's
    /// domain.
    #[arg(long, env = "CHANGEHUB_XMPP_SERVER")]
    pub xmpp_server: Option<String>,
    /// Talk to `--xmpp-server` without TLS; only for a server on a loopback address.
    #[arg(long, env = "CHANGEHUB_XMPP_PLAINTEXT")]
    pub xmpp_plaintext: bool,
    /// Node names are this prefix followed by the channel name (default `changehub/`).
    #[arg(long, env = "CHANGEHUB_XMPP_NODE_PREFIX")]
    pub xmpp_node_prefix: Option<String>,
    /// Publish Change Dumps of this channel (repeatable): ZIP packages of the resources its
    /// changes name, fetched by the hub, listed in `/channels/NAME/changedump.xml`.
    #[arg(
        long = "dump",
        env = "CHANGEHUB_DUMPS",
        value_delimiter = ',',
        value_name = "CHANNEL"
    )]
    pub dumps: Vec<String>,
    /// A Change Dump holds at most this many changes and is cut as soon as they are pending
    /// (default 1000, at most 50,000).
    #[arg(long, env = "CHANGEHUB_DUMP_EVERY")]
    pub dump_every: Option<u64>,
    /// A Change Dump of whatever is pending is cut when this much time passed since the last
    /// one (default 1h; `0s`: only by count).
    #[arg(long, env = "CHANGEHUB_DUMP_INTERVAL", value_parser = parse_duration)]
    pub dump_interval: Option<Duration>,
    /// Change Dumps kept per channel; older ones and their files are removed (default 30).
    #[arg(long, env = "CHANGEHUB_DUMP_KEEP")]
    pub dump_keep: Option<u64>,
    /// Largest resource put into a Change Dump, in bytes (default 67108864); a larger one is
    /// left out.
    #[arg(long, env = "CHANGEHUB_DUMP_MAX_RESOURCE")]
    pub dump_max_resource: Option<u64>,
    /// Largest Change Dump, in bytes of resources (default 1073741824); resources past it are
    /// left out.
    #[arg(long, env = "CHANGEHUB_DUMP_MAX_SIZE")]
    pub dump_max_size: Option<u64>,
    /// Resources fetched at once for one Change Dump (default 4).
    #[arg(long, env = "CHANGEHUB_DUMP_CONCURRENCY")]
    pub dump_concurrency: Option<usize>,
    /// Folder of the Change Dump files (default: `dumps` in the data directory). Needed with
    /// `--redis`; several instances must share it (a network file system).
    #[arg(long, env = "CHANGEHUB_DUMP_DIR")]
    pub dump_dir: Option<PathBuf>,
}

/// The TOML file: the same settings, plus per-channel tables.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    public_url: Option<String>,
    data_dir: Option<PathBuf>,
    redis: Option<String>,
    admin_token: Option<String>,
    metrics_token: Option<String>,
    allow_private_callbacks: Option<bool>,
    #[serde(default)]
    allow_external_topics: Vec<String>,
    max_batch: Option<usize>,
    #[serde(default, with = "humantime_serde_opt")]
    linger: Option<Duration>,
    max_body: Option<usize>,
    cache_size: Option<usize>,
    page_files_size: Option<u64>,
    #[serde(default, with = "humantime_serde_opt")]
    lease_default: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    lease_min: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    lease_max: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    retry_for: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    max_future: Option<Duration>,
    max_subscriptions_per_topic: Option<usize>,
    max_subscriptions_per_host: Option<usize>,
    #[serde(default, with = "humantime_serde_opt")]
    retry_initial: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    retry_max: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    delivery_timeout: Option<Duration>,
    signature_algorithm: Option<String>,
    retain_changes: Option<u64>,
    #[serde(default, with = "humantime_serde_opt")]
    retain_for: Option<Duration>,
    archive_every: Option<u64>,
    ws_max_connections_per_ip: Option<usize>,
    ws_max_subscriptions: Option<usize>,
    ws_queue: Option<usize>,
    #[serde(default, with = "humantime_serde_opt")]
    ws_ping: Option<Duration>,
    ws_queue_bytes: Option<usize>,
    #[serde(default, with = "humantime_serde_opt")]
    ws_stall: Option<Duration>,
    max_connections: Option<usize>,
    max_connections_per_ip: Option<usize>,
    #[serde(default, with = "humantime_serde_opt")]
    header_read_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    body_timeout: Option<Duration>,
    xmpp_jid: Option<String>,
    xmpp_password: Option<String>,
    xmpp_service: Option<String>,
    xmpp_server: Option<String>,
    xmpp_plaintext: Option<bool>,
    xmpp_node_prefix: Option<String>,
    dump_every: Option<u64>,
    #[serde(default, with = "humantime_serde_opt")]
    dump_interval: Option<Duration>,
    dump_keep: Option<u64>,
    dump_max_resource: Option<u64>,
    dump_max_size: Option<u64>,
    dump_concurrency: Option<usize>,
    dumps_per_document: Option<u64>,
    dump_dir: Option<PathBuf>,
    #[serde(default)]
    channels: BTreeMap<String, FileChannel>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileChannel {
    /// The token of the publisher named "default".
    token: Option<String>,
    /// More publishers: name → token.
    #[serde(default)]
    publishers: BTreeMap<String, String>,
    read_token: Option<String>,
    retain_changes: Option<u64>,
    #[serde(default, with = "humantime_serde_opt")]
    retain_for: Option<Duration>,
    archive_every: Option<u64>,
    /// Publish Change Dumps of this channel.
    dump: Option<bool>,
    dump_every: Option<u64>,
    #[serde(default, with = "humantime_serde_opt")]
    dump_interval: Option<Duration>,
    dump_keep: Option<u64>,
}

mod humantime_serde_opt {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| humantime::parse_duration(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Which store backs the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// `cache_size`: bytes of the file kept in memory.
    Embedded {
        data_dir: PathBuf,
        cache_size: usize,
    },
    Redis {
        url: String,
    },
}

/// A hosted channel's settings (see [`crate::model::ChannelSpec`]).
pub type ChannelConfig = crate::model::ChannelSpec;
pub use crate::model::{Publisher, DEFAULT_PUBLISHER};

/// Limits of plain HTTP connections (see `http::listen`).
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub header_read_timeout: Duration,
    /// How long a request body may take to arrive.
    pub body_timeout: Duration,
}

/// The soft limit of open files of this process, where the system says it.
pub fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Limits of the websocket endpoint.
#[derive(Debug, Clone, Copy)]
pub struct LiveLimits {
    pub max_connections_per_ip: usize,
    pub max_subscriptions: usize,
    /// Largest client frame, bytes.
    pub max_frame: usize,
    /// Outgoing frames queued per connection before a slow client is closed.
    pub queue: usize,
    /// Outgoing bytes queued per connection (see `--ws-queue-bytes`).
    pub queue_bytes: usize,
    /// How long a replay waits for room before the client counts as not reading.
    pub stall: Duration,
    pub ping: Duration,
}

/// The resolved configuration the hub runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// Every URL the hub publishes, built from `--public-url` (`urls.public()` is that URL,
    /// without a trailing slash).
    pub urls: Urls,
    pub store: StoreConfig,
    pub channels: BTreeMap<String, ChannelConfig>,
    pub admin_token: Option<String>,
    /// When set, `GET /metrics` needs this bearer token.
    pub metrics_token: Option<String>,
    /// The retention of channels that do not set their own (also those of the admin API).
    pub retention: Retention,
    pub allow_private_callbacks: bool,
    pub allow_external_topics: Vec<String>,
    pub max_batch: usize,
    pub linger: Duration,
    pub max_body: usize,
    pub lease_default: Duration,
    pub lease_min: Duration,
    pub lease_max: Duration,
    pub retry_for: Duration,
    /// How far in the future a change's datetime may be (`--max-future`).
    pub max_future: Duration,
    /// Most subscriptions per topic, and per callback host.
    pub max_subscriptions_per_topic: usize,
    pub max_subscriptions_per_host: usize,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub delivery_timeout: Duration,
    pub signature_algorithm: Algorithm,
    pub trim_interval: Duration,
    pub live: LiveLimits,
    pub http: HttpLimits,
    /// The XMPP PubSub bridge, when `--xmpp-jid` is given.
    pub xmpp: Option<XmppConfig>,
    /// The Change Dump settings of channels that turn dumps on without giving their own
    /// (`--dump-*`; also the admin API's defaults).
    pub dump_defaults: DumpSettings,
    /// Where Change Dump files go (`--dump-dir`, else `dumps` in the data directory; none
    /// with Redis unless given).
    pub dump_dir: Option<PathBuf>,
    /// The rendered entries of `changes?after=` pages kept.
    pub pages: PagesConfig,
    /// Most bytes of rendered topics and closed Change Lists kept in memory, gzip forms
    /// included (an eighth of `--cache-size`; kept by the web layer, `http/rendered.rs`).
    pub rendered_docs: usize,
    /// Most bytes of recent notifications (bodies and changes) that the channels' feeds keep
    /// for delivery workers to share, all feeds together (an eighth of `--cache-size`; see
    /// [`crate::batcher::RecentBudget`]).
    pub recent_notifications: usize,
    /// With Redis: most bytes of the changes of large requests this instance appended last,
    /// held for the batcher to read without the log (an eighth of `--cache-size`, from the
    /// store's half, which Redis does not use; see `store/redis/recent.rs`).
    pub held_changes: usize,
}

/// How `--cache-size` is shared out among the hub's caches: half to the embedded store's
/// file, a quarter to the rendered entries of `changes?after=` pages, an eighth each to
/// rendered topics and closed Change Lists and to the recent notifications delivery workers
/// share. With Redis a quarter of the store's half holds the changes the batcher reads next;
/// the rest is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caches {
    pub store: usize,
    pub pages: usize,
    pub rendered_docs: usize,
    pub recent_notifications: usize,
    pub held_changes: usize,
}

impl Caches {
    /// `--cache-size` unless given, bytes.
    pub const DEFAULT: usize = 256 << 20;

    pub fn of(total: usize) -> Caches {
        Caches {
            store: total / 2,
            pages: total / 4,
            rendered_docs: total / 8,
            recent_notifications: total / 8,
            held_changes: total / 8,
        }
    }
}

/// How much of the rendered entries of `changes?after=` pages is kept, and where (see
/// [`crate::catchup::pages`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PagesConfig {
    /// Bytes kept in memory.
    pub memory: usize,
    /// Bytes of block files kept on disk (`--page-files-size`; 0: no files).
    pub files: u64,
    /// The folder of the files: `pages` in the data directory; `None` with Redis (a
    /// temporary folder of the process).
    pub dir: Option<PathBuf>,
}

/// The XMPP PubSub bridge's settings (see [`crate::xmpp`]).
#[derive(Clone, PartialEq, Eq)]
pub struct XmppConfig {
    /// The hub's account (a bare JID).
    pub jid: String,
    pub password: String,
    /// The PubSub service's JID.
    pub service: String,
    /// HOST:PORT to connect to instead of the DNS lookup of the JID's domain.
    pub server: Option<String>,
    /// No TLS (`server` is then a loopback address).
    pub plaintext: bool,
    pub node_prefix: String,
}

impl std::fmt::Debug for XmppConfig {
    /// Everything but the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XmppConfig")
            .field("jid", &self.jid)
            .field("password", &"…")
            .field("service", &self.service)
            .field("server", &self.server)
            .field("plaintext", &self.plaintext)
            .field("node_prefix", &self.node_prefix)
            .finish()
    }
}

impl XmppConfig {
    /// The PubSub node of `channel`.
    pub fn node(&self, channel: &str) -> String {
        format!("{}{channel}", self.node_prefix)
    }

    /// The XMPP URI (RFC 5122, XEP-0060's `pubsub` query) that subscribes to the node of
    /// `channel`: what the Capability List and the topic's `Link` header advertise.
    pub fn node_uri(&self, channel: &str) -> String {
        let node = self.node(channel);
        let node = percent_encoding::utf8_percent_encode(&node, percent_encoding::NON_ALPHANUMERIC);
        format!("xmpp:{}?pubsub;action=subscribe;node={node}", self.service)
    }

    /// Checks the settings given as flags or in the file; `None` when the bridge is off.
    fn resolve(
        jid: Option<String>,
        password: Option<String>,
        service: Option<String>,
        server: Option<String>,
        plaintext: bool,
        node_prefix: Option<String>,
    ) -> Result<Option<XmppConfig>, ConfigError> {
        let invalid = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        let (jid, password, service) =
            match (jid, password, service) {
                (None, None, None) if server.is_none() && !plaintext => return Ok(None),
                (Some(j), Some(p), Some(s)) => (j, p, s),
                _ => return invalid(
                    "the XMPP bridge needs --xmpp-jid, --xmpp-password and --xmpp-service together",
                ),
            };
        match tokio_xmpp::jid::BareJid::new(&jid) {
            Ok(bare) if bare.node().is_some() => {}
            _ => {
                return invalid("--xmpp-jid must be an account's bare JID, such as hub@example.org")
            }
        }
        if tokio_xmpp::jid::BareJid::new(&service).is_err() {
            return invalid("--xmpp-service must be a JID, such as pubsub.example.org");
        }
        if let Some(server) = &server {
            if server
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .is_none()
            {
                return invalid("--xmpp-server must be HOST:PORT");
            }
        }
        if plaintext {
            let loopback = server
                .as_deref()
                .and_then(|s| s.parse::<SocketAddr>().ok())
                .is_some_and(|a| a.ip().is_loopback());
            if !loopback {
                return invalid(
                    "--xmpp-plaintext sends the password unencrypted: it needs --xmpp-server \
                     with a loopback address (127.0.0.1:PORT)",
                );
            }
        }
        let node_prefix = node_prefix.unwrap_or_else(|| "changehub/".to_string());
        Ok(Some(XmppConfig {
            jid,
            password,
            service,
            server,
            plaintext,
            node_prefix,
        }))
    }
}

impl Config {
    /// A configuration with every default, an embedded store in `data_dir`, listening on
    /// `listen`. Tests and embedders start from here.
    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> Config {
        ServeArgs {
            listen: Some(listen.to_string()),
            data_dir: Some(data_dir),
            ..ServeArgs::default()
        }
        .resolve()
        .expect("defaults are valid")
    }

    /// Declares a channel with the default retention.
    pub fn with_channel(mut self, name: &str, token: &str) -> Config {
        self.channels.insert(
            name.to_string(),
            ChannelConfig::new(name, token, DEFAULT_RETENTION),
        );
        self
    }
}

const DEFAULT_RETENTION: Retention = Retention::DEFAULT;

impl ServeArgs {
    /// Merges flags, the TOML file and defaults, and checks the result.
    pub fn resolve(self) -> Result<Config, ConfigError> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                toml::from_str::<FileConfig>(&text).map_err(|source| ConfigError::Toml {
                    path: path.clone(),
                    source,
                })?
            }
            None => FileConfig::default(),
        };
        let invalid = |m: String| ConfigError::Invalid(m);

        let listen_as_given = self
            .listen
            .or(file.listen)
            .unwrap_or_else(|| "127.0.0.1:8080".to_string());
        let listen = resolve_listen(&listen_as_given)?;
        let public_url = match self.public_url.or(file.public_url) {
            Some(url) => url,
            // A wildcard address is no address anyone can reach the hub at.
            None if listen.ip().is_unspecified() => {
                return Err(invalid(format!(
                    "--listen {listen} listens on every interface, so it is not an address \
                     to put in topic URLs: give --public-url with the URL sources and \
                     subscribers reach this hub at (e.g. --public-url http://hub.example.org:{})",
                    listen.port()
                )))
            }
            None => format!("http://{listen_as_given}"),
        };
        let public_url = public_url.trim_end_matches('/').to_string();
        let parsed = url::Url::parse(&public_url)
            .map_err(|e| invalid(format!("--public-url {public_url:?}: {e}")))?;
        let urls = Urls::new(&public_url)
            .map_err(|e| invalid(format!("--public-url {public_url:?}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.query().is_some() {
            return Err(invalid(format!(
                "--public-url {public_url:?} must be an http(s) URL without a query"
            )));
        }

        let caches = Caches::of(
            self.cache_size
                .or(file.cache_size)
                .map_or(Caches::DEFAULT, |mib| mib.saturating_mul(1 << 20)),
        );
        let store = match self.redis.or(file.redis) {
            Some(url) => {
                crate::store::redis::Target::parse(&url)
                    .map_err(|e| invalid(format!("--redis {e}")))?;
                StoreConfig::Redis { url }
            }
            None => StoreConfig::Embedded {
                data_dir: self
                    .data_dir
                    .or(file.data_dir)
                    .unwrap_or_else(|| PathBuf::from("changehub-data")),
                cache_size: caches.store,
            },
        };

        let retention = Retention {
            max_changes: self
                .retain_changes
                .or(file.retain_changes)
                .unwrap_or(DEFAULT_RETENTION.max_changes),
            max_age: self.retain_for.or(file.retain_for),
            list_size: self
                .archive_every
                .or(file.archive_every)
                .unwrap_or(DEFAULT_RETENTION.list_size),
        };
        if retention.max_changes == 0 {
            return Err(invalid("--retain-changes must be at least 1".into()));
        }
        let list_size = |n: u64, what: &str| {
            if (1..=MAX_LIST_SIZE).contains(&n) {
                Ok(n)
            } else {
                Err(invalid(format!(
                    "{what} must be between 1 and {MAX_LIST_SIZE} (changes per closed Change List)"
                )))
            }
        };
        list_size(retention.list_size, "--archive-every")?;

        let dump_defaults = DumpSettings {
            every: self
                .dump_every
                .or(file.dump_every)
                .unwrap_or(DumpSettings::default().every),
            interval: match self.dump_interval.or(file.dump_interval) {
                Some(d) if d.is_zero() => None,
                Some(d) => Some(d),
                None => DumpSettings::default().interval,
            },
            keep: self
                .dump_keep
                .or(file.dump_keep)
                .unwrap_or(DumpSettings::default().keep),
            max_resource_bytes: self
                .dump_max_resource
                .or(file.dump_max_resource)
                .unwrap_or(DumpSettings::default().max_resource_bytes),
            max_dump_bytes: self
                .dump_max_size
                .or(file.dump_max_size)
                .unwrap_or(DumpSettings::default().max_dump_bytes),
            concurrency: self
                .dump_concurrency
                .or(file.dump_concurrency)
                .unwrap_or(DumpSettings::default().concurrency),
            per_document: file
                .dumps_per_document
                .unwrap_or(DumpSettings::default().per_document),
        };
        dump_defaults
            .check()
            .map_err(|e| invalid(format!("dump settings: {e}")))?;

        let mut channels = BTreeMap::new();
        for (name, ch) in file.channels {
            let dumps = (ch.dump.unwrap_or(false)
                || ch.dump_every.is_some()
                || ch.dump_interval.is_some()
                || ch.dump_keep.is_some())
            .then(|| DumpSettings {
                every: ch.dump_every.unwrap_or(dump_defaults.every),
                interval: match ch.dump_interval {
                    Some(d) if d.is_zero() => None,
                    Some(d) => Some(d),
                    None => dump_defaults.interval,
                },
                keep: ch.dump_keep.unwrap_or(dump_defaults.keep),
                ..dump_defaults
            })
            .filter(|_| ch.dump != Some(false));
            let mut publishers = Vec::new();
            if let Some(token) = ch.token {
                publishers.push(Publisher {
                    name: DEFAULT_PUBLISHER.into(),
                    token,
                });
            }
            for (publisher, token) in ch.publishers {
                publishers.push(Publisher {
                    name: publisher,
                    token,
                });
            }
            let config = ChannelConfig {
                name: name.clone(),
                publishers,
                read_token: ch.read_token,
                retention: Retention {
                    max_changes: ch.retain_changes.unwrap_or(retention.max_changes),
                    max_age: ch.retain_for.or(retention.max_age),
                    list_size: list_size(
                        ch.archive_every.unwrap_or(retention.list_size),
                        &format!("archive_every of channel {name:?}"),
                    )?,
                },
                dumps,
            };
            channels.insert(name, config);
        }
        for spec in self.channels {
            let (name, token) = spec
                .split_once('=')
                .ok_or_else(|| invalid(format!("--channel {spec:?}: expected NAME=TOKEN")))?;
            let entry = channels
                .entry(name.to_string())
                .or_insert_with(|| ChannelConfig {
                    retention,
                    publishers: Vec::new(),
                    ..ChannelConfig::new(name, "", DEFAULT_RETENTION)
                });
            entry.set_publisher(DEFAULT_PUBLISHER, token);
        }
        for spec in self.publishers {
            let ((name, publisher), token) = spec
                .split_once('=')
                .and_then(|(who, token)| Some((who.split_once(':')?, token)))
                .ok_or_else(|| {
                    invalid(format!(
                        "--publisher {spec:?}: expected CHANNEL:PUBLISHER=TOKEN"
                    ))
                })?;
            let entry = channels
                .entry(name.to_string())
                .or_insert_with(|| ChannelConfig {
                    retention,
                    publishers: Vec::new(),
                    ..ChannelConfig::new(name, "", DEFAULT_RETENTION)
                });
            entry.set_publisher(publisher, token);
        }
        for spec in self.read_tokens {
            let (name, token) = spec
                .split_once('=')
                .ok_or_else(|| invalid(format!("--read-token {spec:?}: expected NAME=TOKEN")))?;
            let channel = channels.get_mut(name).ok_or_else(|| {
                invalid(format!(
                    "--read-token {name:?}: no such channel (declare it with --channel)"
                ))
            })?;
            channel.read_token = Some(token.to_string());
        }
        for name in self.dumps {
            let channel = channels.get_mut(&name).ok_or_else(|| {
                invalid(format!(
                    "--dump {name:?}: no such channel (declare it with --channel)"
                ))
            })?;
            channel.dumps.get_or_insert(dump_defaults);
        }
        for ch in channels.values() {
            ch.check().map_err(invalid)?;
        }
        let dump_dir = match (self.dump_dir.or(file.dump_dir), &store) {
            (Some(dir), _) => Some(dir),
            (None, StoreConfig::Embedded { data_dir, .. }) => Some(data_dir.join("dumps")),
            (None, StoreConfig::Redis { .. }) => None,
        };
        if dump_dir.is_none() && channels.values().any(|c| c.dumps.is_some()) {
            return Err(invalid(
                "Change Dumps with --redis need --dump-dir (a folder every instance shares)".into(),
            ));
        }

        let signature_algorithm = match (self.signature_algorithm, file.signature_algorithm) {
            (Some(a), _) => a,
            (None, Some(s)) => s
                .parse()
                .map_err(|e: String| invalid(format!("signature_algorithm: {e}")))?,
            (None, None) => Algorithm::Sha256,
        };

        let xmpp = XmppConfig::resolve(
            self.xmpp_jid.or(file.xmpp_jid),
            self.xmpp_password.or(file.xmpp_password),
            self.xmpp_service.or(file.xmpp_service),
            self.xmpp_server.or(file.xmpp_server),
            self.xmpp_plaintext || file.xmpp_plaintext.unwrap_or(false),
            self.xmpp_node_prefix.or(file.xmpp_node_prefix),
        )?;

        let pages = PagesConfig {
            memory: caches.pages,
            files: self
                .page_files_size
                .or(file.page_files_size)
                .map_or(crate::catchup::pages::FILES_BYTES, |mib| {
                    mib.saturating_mul(1 << 20)
                }),
            dir: match &store {
                StoreConfig::Embedded { data_dir, .. } => Some(data_dir.join("pages")),
                StoreConfig::Redis { .. } => None,
            },
        };

        let config = Config {
            dump_defaults,
            dump_dir,
            pages,
            rendered_docs: caches.rendered_docs,
            recent_notifications: caches.recent_notifications,
            held_changes: caches.held_changes,
            xmpp,
            listen,
            urls,
            store,
            channels,
            admin_token: self.admin_token.or(file.admin_token),
            metrics_token: self.metrics_token.or(file.metrics_token),
            retention,
            allow_private_callbacks: self.allow_private_callbacks
                || file.allow_private_callbacks.unwrap_or(false),
            allow_external_topics: [self.allow_external_topics, file.allow_external_topics]
                .concat(),
            max_batch: self.max_batch.or(file.max_batch).unwrap_or(1000),
            linger: self
                .linger
                .or(file.linger)
                .unwrap_or(Duration::from_millis(100)),
            max_body: self.max_body.or(file.max_body).unwrap_or(8 << 20),
            lease_default: self
                .lease_default
                .or(file.lease_default)
                .unwrap_or(Duration::from_secs(10 * 86_400)),
            lease_min: self
                .lease_min
                .or(file.lease_min)
                .unwrap_or(Duration::from_secs(300)),
            lease_max: self
                .lease_max
                .or(file.lease_max)
                .unwrap_or(Duration::from_secs(30 * 86_400)),
            retry_for: self
                .retry_for
                .or(file.retry_for)
                .unwrap_or(Duration::from_secs(86_400)),
            max_future: self
                .max_future
                .or(file.max_future)
                .unwrap_or(Duration::from_secs(86_400)),
            max_subscriptions_per_topic: self
                .max_subscriptions_per_topic
                .or(file.max_subscriptions_per_topic)
                .unwrap_or(10_000)
                .max(1),
            max_subscriptions_per_host: self
                .max_subscriptions_per_host
                .or(file.max_subscriptions_per_host)
                .unwrap_or(1000)
                .max(1),
            retry_initial: self
                .retry_initial
                .or(file.retry_initial)
                .unwrap_or(Duration::from_secs(5)),
            retry_max: self
                .retry_max
                .or(file.retry_max)
                .unwrap_or(Duration::from_secs(3600)),
            delivery_timeout: self
                .delivery_timeout
                .or(file.delivery_timeout)
                .unwrap_or(Duration::from_secs(10)),
            signature_algorithm,
            trim_interval: self
                .trim_interval
                .unwrap_or(Duration::from_secs(10))
                .max(Duration::from_millis(10)),
            http: HttpLimits {
                max_connections: self
                    .max_connections
                    .or(file.max_connections)
                    .unwrap_or_else(|| {
                        // Leave room for the store, outbound deliveries and the listener.
                        let fds = open_file_limit().unwrap_or(u64::MAX);
                        (fds.saturating_sub(256) as usize).clamp(16, 10_000)
                    })
                    .max(1),
                max_connections_per_ip: self
                    .max_connections_per_ip
                    .or(file.max_connections_per_ip)
                    .unwrap_or(1000)
                    .max(1),
                header_read_timeout: self
                    .header_read_timeout
                    .or(file.header_read_timeout)
                    .unwrap_or(Duration::from_secs(10))
                    .max(Duration::from_millis(100)),
                body_timeout: self
                    .body_timeout
                    .or(file.body_timeout)
                    .unwrap_or(Duration::from_secs(30))
                    .max(Duration::from_millis(100)),
            },
            live: LiveLimits {
                max_connections_per_ip: self
                    .ws_max_connections_per_ip
                    .or(file.ws_max_connections_per_ip)
                    .unwrap_or(1000),
                max_subscriptions: self
                    .ws_max_subscriptions
                    .or(file.ws_max_subscriptions)
                    .unwrap_or(64),
                max_frame: 64 * 1024,
                queue: self.ws_queue.or(file.ws_queue).unwrap_or(256).max(1),
                queue_bytes: self
                    .ws_queue_bytes
                    .or(file.ws_queue_bytes)
                    .unwrap_or(1 << 20)
                    .max(4096),
                stall: self
                    .ws_stall
                    .or(file.ws_stall)
                    .unwrap_or(Duration::from_secs(30))
                    .max(Duration::from_millis(100)),
                ping: self
                    .ws_ping
                    .or(file.ws_ping)
                    .unwrap_or(Duration::from_secs(30))
                    .max(Duration::from_millis(100)),
            },
        };
        for prefix in &config.allow_external_topics {
            if prefix != "*" && !(prefix.starts_with("http://") || prefix.starts_with("https://")) {
                return Err(invalid(format!(
                    "--allow-external-topics {prefix:?}: expected `*` or an http(s) URL prefix"
                )));
            }
        }
        if config.max_batch == 0 {
            return Err(invalid("--max-batch must be at least 1".into()));
        }
        if config.lease_min.is_zero() || config.lease_min > config.lease_max {
            return Err(invalid(
                "--lease-min must be positive and at most --lease-max".into(),
            ));
        }
        if config.lease_default < config.lease_min || config.lease_default > config.lease_max {
            return Err(invalid(
                "--lease-default must lie between --lease-min and --lease-max".into(),
            ));
        }
        Ok(config)
    }
}

/// `--listen`: an IP address and port, or a host name and port (resolved once, at start).
fn resolve_listen(given: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(addr) = given.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let invalid = |why: String| {
        ConfigError::Invalid(format!(
            "--listen {given:?}: {why} (expected IP:PORT or HOST:PORT)"
        ))
    };
    let mut addrs =
        std::net::ToSocketAddrs::to_socket_addrs(given).map_err(|e| invalid(e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| invalid("the name has no address".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_a_host_name() {
        let config = ServeArgs {
            listen: Some("localhost:8181".into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert!(config.listen.ip().is_loopback(), "{}", config.listen);
        assert_eq!(config.listen.port(), 8181);
        assert_eq!(config.urls.public(), "http://localhost:8181");
        for bad in ["localhost", ":::", "127.0.0.1:notaport"] {
            let err = ServeArgs {
                listen: Some(bad.into()),
                ..ServeArgs::default()
            }
            .resolve()
            .unwrap_err()
            .to_string();
            assert!(err.contains("--listen"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_wildcard_listen_address_needs_a_public_url() {
        for listen in ["0.0.0.0:8080", "[::]:8080"] {
            let args = ServeArgs {
                listen: Some(listen.into()),
                ..ServeArgs::default()
            };
            let err = args.clone().resolve().unwrap_err().to_string();
            assert!(err.contains("--public-url"), "{err}");
            let config = ServeArgs {
                public_url: Some("http://hub.example.org:8080".into()),
                ..args
            }
            .resolve()
            .unwrap();
            assert_eq!(config.urls.public(), "http://hub.example.org:8080");
        }
    }

    #[test]
    fn the_cache_size_is_mebibytes_from_the_flag_or_the_file_shared_among_the_caches() {
        // (store's cache, page entries, closed lists), bytes.
        let caches = |args: ServeArgs| {
            let config = args.resolve().unwrap();
            let store = match config.store {
                StoreConfig::Embedded { cache_size, .. } => cache_size,
                StoreConfig::Redis { .. } => panic!("not embedded"),
            };
            let rest = (config.pages.memory, config.rendered_docs);
            (store, rest, config.recent_notifications)
        };
        assert_eq!(
            caches(ServeArgs::default()),
            (128 << 20, (64 << 20, 32 << 20), 32 << 20),
            "256 MiB by default: half to the store, a quarter to pages, an eighth each to \
             closed lists and to notifications"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.toml");
        std::fs::write(&path, "cache_size = 32\n").unwrap();
        let from_file = ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        };
        assert_eq!(
            caches(from_file.clone()),
            (16 << 20, (8 << 20, 4 << 20), 4 << 20)
        );
        let flag = ServeArgs {
            cache_size: Some(64),
            ..from_file
        };
        assert_eq!(caches(flag), (32 << 20, (16 << 20, 8 << 20), 8 << 20));
        let redis = ServeArgs {
            redis: Some("redis://127.0.0.1:1/".into()),
            cache_size: Some(64),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            (redis.pages.memory, redis.rendered_docs),
            (16 << 20, 8 << 20)
        );
    }

    #[test]
    fn page_files_are_in_the_data_dir_or_temporary_and_sized_in_mebibytes() {
        let dir = tempfile::tempdir().unwrap();
        let embedded = ServeArgs {
            data_dir: Some(dir.path().into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(embedded.pages.dir, Some(dir.path().join("pages")));
        assert_eq!(embedded.pages.files, crate::catchup::pages::FILES_BYTES);
        let path = dir.path().join("hub.toml");
        std::fs::write(
            &path,
            "page_files_size = 0\nredis = \"redis://127.0.0.1/\"\n",
        )
        .unwrap();
        let from_file = ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        };
        let redis = from_file.clone().resolve().unwrap();
        assert_eq!((redis.pages.dir, redis.pages.files), (None, 0));
        let flag = ServeArgs {
            page_files_size: Some(100),
            ..from_file
        };
        assert_eq!(flag.resolve().unwrap().pages.files, 100 << 20);
    }

    #[test]
    fn dump_settings_come_from_flags_the_file_and_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.toml");
        std::fs::write(
            &path,
            "dump_keep = 3\n[channels.news]\ntoken = \"t1\"\ndump_every = 50\ndump_interval = \"0s\"\n[channels.quiet]\ntoken = \"t3\"\ndump = false\n",
        )
        .unwrap();
        let config = ServeArgs {
            config: Some(path.clone()),
            channels: vec!["other=t2".into()],
            dumps: vec!["other".into()],
            dump_every: Some(200),
            data_dir: Some(dir.path().into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        let news = config.channels["news"].dumps.unwrap();
        assert_eq!((news.every, news.interval, news.keep), (50, None, 3));
        let other = config.channels["other"].dumps.unwrap();
        assert_eq!(other.every, 200);
        assert_eq!(other.interval, Some(Duration::from_secs(3600)));
        assert_eq!(config.channels["quiet"].dumps, None);
        assert_eq!(config.dump_dir, Some(dir.path().join("dumps")));
        // Refused: an unknown channel, a bad count, dumps on Redis without a folder.
        for args in [
            ServeArgs {
                dumps: vec!["nope".into()],
                ..ServeArgs::default()
            },
            ServeArgs {
                channels: vec!["a=t".into()],
                dumps: vec!["a".into()],
                dump_every: Some(0),
                ..ServeArgs::default()
            },
            ServeArgs {
                channels: vec!["a=t".into()],
                dumps: vec!["a".into()],
                redis: Some("redis://127.0.0.1:1/".into()),
                ..ServeArgs::default()
            },
        ] {
            assert!(args.resolve().is_err());
        }
    }

    #[test]
    fn flags_override_file_and_defaults_apply() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.toml");
        std::fs::write(
            &path,
            "max_batch = 50\nlinger = \"20ms\"\n[channels.news]\ntoken = \"t1\"\nretain_changes = 10\narchive_every = 500\n",
        )
        .unwrap();
        let config = ServeArgs {
            config: Some(path),
            max_batch: Some(7),
            channels: vec!["other=t2".into()],
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(config.max_batch, 7);
        assert_eq!(config.linger, Duration::from_millis(20));
        assert_eq!(config.channels["news"].retention.max_changes, 10);
        assert_eq!(config.channels["news"].retention.list_size, 500);
        assert_eq!(
            config.channels["other"].publishers,
            vec![Publisher {
                name: "default".into(),
                token: "t2".into()
            }]
        );
        assert_eq!(config.channels["other"].retention.list_size, 10_000);
        assert_eq!(config.urls.public(), "http://127.0.0.1:8080");
    }

    #[test]
    fn external_topic_prefixes_are_checked() {
        let args = |p: &str| ServeArgs {
            allow_external_topics: vec![p.into()],
            ..ServeArgs::default()
        };
        assert!(args("*").resolve().is_ok());
        assert!(args("https://example.org/feeds/").resolve().is_ok());
        assert!(args("example.org").resolve().is_err());
    }

    #[test]
    fn xmpp_settings_come_together_and_hide_the_password() {
        let xmpp = |jid: &str, server: Option<&str>, plaintext: bool| ServeArgs {
            xmpp_jid: Some(jid.into()),
            xmpp_password: Some("pa55word".into()),
            xmpp_service: Some("pubsub.example.org".into()),
            xmpp_server: server.map(String::from),
            xmpp_plaintext: plaintext,
            ..ServeArgs::default()
        };
        assert_eq!(ServeArgs::default().resolve().unwrap().xmpp, None);
        let config = xmpp("hub@example.org", None, false).resolve().unwrap();
        let x = config.xmpp.unwrap();
        assert_eq!(x.node("news"), "changehub/news");
        assert_eq!(
            x.node_uri("news"),
            "xmpp:pubsub.example.org?pubsub;action=subscribe;node=changehub%2Fnews"
        );
        assert!(!format!("{x:?}").contains("pa55word"));
        assert!(xmpp("hub@example.org", Some("127.0.0.1:5222"), true)
            .resolve()
            .is_ok());
        for bad in [
            xmpp("example.org", None, false),
            xmpp("hub@example.org", Some("xmpp.example.org"), false),
            xmpp("hub@example.org", Some("192.0.2.1:5222"), true),
            xmpp("hub@example.org", None, true),
            ServeArgs {
                xmpp_jid: Some("hub@example.org".into()),
                ..ServeArgs::default()
            },
        ] {
            let e = bad.resolve().unwrap_err().to_string();
            assert!(e.contains("xmpp") && !e.contains("pa55word"), "{e}");
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad_channel = ServeArgs {
            channels: vec!["Bad=t".into()],
            ..ServeArgs::default()
        };
        assert!(bad_channel.resolve().is_err());
        let no_token = ServeArgs {
            channels: vec!["news".into()],
            ..ServeArgs::default()
        };
        assert!(no_token.resolve().is_err());
        let publishers = |specs: &[&str]| ServeArgs {
            channels: vec!["news=t1".into()],
            publishers: specs.iter().map(|s| s.to_string()).collect(),
            ..ServeArgs::default()
        };
        let ok = publishers(&["news:alice=t2", "other:bob=t3"])
            .resolve()
            .unwrap();
        let names = |c: &str| -> Vec<String> {
            ok.channels[c]
                .publishers
                .iter()
                .map(|p| p.name.clone())
                .collect()
        };
        assert_eq!(names("news"), vec!["default", "alice"]);
        assert_eq!(names("other"), vec!["bob"]);
        for bad in [
            "news-alice=t2",
            "news:alice",
            "news:Alice=t2",
            "news:alice=",
            "news:alice=t1",
        ] {
            assert!(publishers(&[bad]).resolve().is_err(), "{bad}");
        }
        for every in [0, 50_001] {
            let err = ServeArgs {
                archive_every: Some(every),
                ..ServeArgs::default()
            }
            .resolve()
            .unwrap_err()
            .to_string();
            assert!(err.contains("--archive-every"), "{err}");
        }
        let redis = |url: &str| ServeArgs {
            redis: Some(url.into()),
            ..ServeArgs::default()
        };
        assert!(redis("redis+cluster://127.0.0.1:7000/3").resolve().is_err());
        assert_eq!(
            redis("redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
                .resolve()
                .unwrap()
                .store,
            StoreConfig::Redis {
                url: "redis+cluster://127.0.0.1:7000,127.0.0.1:7001".into()
            }
        );
    }
}
