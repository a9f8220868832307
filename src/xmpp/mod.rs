//! The XMPP PubSub bridge: every public hosted channel as a XEP-0060 leaf node on an existing
//! XMPP server, each notification an item whose payload is the Change List and whose id is
//! its seq range (`FIRST-LAST`).
//!
//! One task ([`Bridge::run`]) with one client session (`session.rs`; the payloads are in
//! `stanzas.rs`) follows the `ChannelFeed` of every channel this instance owns, like a
//! delivery worker: from its cursor — the last seq on the node, kept in the store
//! (`Store::bridge_cursor`, bridge name [`BRIDGE`]) — it publishes the next range and records
//! the cursor once the service has acknowledged the item. So:
//! - Items reach the node in seq order, gapless: a range is published again until the service
//!   takes it (republishing an id replaces the item: at least once, no duplicates on the
//!   node), and a restart or another instance taking the channel over goes on from the
//!   stored cursor.
//! - The ranges are the batcher's notifications while the bridge keeps up; behind, up to
//!   `max_batch` changes read from the log, halved until the item fits in [`MAX_ITEM_BYTES`].
//! - A channel the bridge has never seen starts at what is published when it first sees it
//!   (the history stays in the catch-up documents).
//! - Nothing waits for the bridge: ingest and WebSub delivery go on while the XMPP server is
//!   unreachable or refuses; the bridge retries with [`Reconnect`]'s backoff and shows its lag
//!   ([`Bridge::status`]: the admin API's channels, `/metrics`).
//! - Private channels (with a read token) are not bridged: the nodes are open to anyone.
//! - The password is given to the client only; it is in no log line and no status.

mod session;
pub mod stanzas;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_xmpp::parsers::stanza_error::DefinedCondition;

use crate::batcher::{render_notification, ChannelFeed, Feeds};
use crate::config::{Config, XmppConfig};
use crate::model::Notification;
use crate::ownership::Ownership;
use crate::retry::Reconnect;
use crate::store::{Store, StoreError};
use crate::work::Work;
use session::{Session, SessionError};

/// The bridge's name among the store's bridge cursors.
pub const BRIDGE: &str = "xmpp";

/// Largest item payload the bridge sends, bytes: servers limit stanza sizes (Prosody to
/// 256 KiB by default), so a longer range is cut in halves until it fits.
pub const MAX_ITEM_BYTES: usize = 128 * 1024;

/// How often the bridge looks for new channels and ownership changes when nothing happens.
const LOOK_AROUND: Duration = Duration::from_secs(1);

/// Why publishing stopped for now.
#[derive(Debug, thiserror::Error)]
enum BridgeError {
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot build the item: {0}")]
    Build(#[from] stanzas::BuildError),
}

/// The bridge: settings, what it follows, and where it stands.
pub struct Bridge {
    xmpp: XmppConfig,
    config: Arc<Config>,
    store: Arc<dyn Store>,
    feeds: Feeds,
    ownership: Arc<Ownership>,
    state: Mutex<State>,
}

/// Where the bridge stands, for the admin API and `/metrics`.
#[derive(Default)]
struct State {
    /// Per channel, the last seq on its node (as recorded in the store).
    cursors: HashMap<String, u64>,
    /// The last request was answered (false until the first answer).
    connected: bool,
    last_error: Option<String>,
}

/// One channel as the bridge sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChannelStatus {
    /// The node's name.
    pub node: String,
    /// The XMPP URI that subscribes to the node.
    pub uri: String,
    /// The last seq on the node (`None` before the bridge first saw the channel).
    pub bridged: Option<u64>,
    /// Seqs published by the channel but not yet on the node.
    pub lag: u64,
    /// Whether the XMPP service answered the bridge's last request.
    pub connected: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl Bridge {
    pub fn new(
        xmpp: XmppConfig,
        config: Arc<Config>,
        store: Arc<dyn Store>,
        feeds: Feeds,
        ownership: Arc<Ownership>,
    ) -> Arc<Bridge> {
        Arc::new(Bridge {
            xmpp,
            config,
            store,
            feeds,
            ownership,
            state: Mutex::default(),
        })
    }

    /// Starts [`Bridge::run`] on the tasks of `work` (it drains like a delivery worker).
    pub fn spawn(self: &Arc<Self>, work: &Work) {
        work.tasks
            .spawn(self.clone().run(work.drain.clone(), work.cancel.clone()));
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How `channel`, published up to `published`, stands on its node; `None` for a channel
    /// that is not bridged (private).
    pub fn status(&self, channel: &str, published: u64, private: bool) -> Option<ChannelStatus> {
        if private {
            return None;
        }
        let state = self.state();
        let bridged = state.cursors.get(channel).copied();
        Some(ChannelStatus {
            node: self.xmpp.node(channel),
            uri: self.xmpp.node_uri(channel),
            bridged,
            lag: published.saturating_sub(bridged.unwrap_or(published)),
            connected: state.connected,
            last_error: state.last_error.clone(),
        })
    }

    /// Sets the bridge's gauges for the channels this instance owns (`/metrics` calls this at
    /// each scrape).
    pub fn set_gauges(&self) {
        metrics::gauge!("changehub_xmpp_connected").set(if self.state().connected {
            1.0
        } else {
            0.0
        });
        for channel in self.feeds.all() {
            let name = &channel.spec.name;
            let private = channel.spec.read_token.is_some();
            if !self.ownership.owns(name) {
                continue;
            }
            if let Some(s) = self.status(name, channel.feed.published_seq(), private) {
                metrics::gauge!("changehub_xmpp_lag", "channel" => name.clone()).set(s.lag as f64);
            }
        }
    }

    /// Publishes until `cancel`; once `drain` is cancelled, until every channel is on its node
    /// or the service cannot be reached.
    pub async fn run(self: Arc<Self>, drain: CancellationToken, cancel: CancellationToken) {
        let mut session = match Session::open(&self.xmpp, self.config.delivery_timeout) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "the XMPP bridge cannot start");
                return;
            }
        };
        tracing::info!(jid = %self.xmpp.jid, service = %self.xmpp.service, "XMPP bridge started");
        let mut reconnect = Reconnect::new(Duration::from_millis(500), Duration::from_secs(30));
        let mut published: HashMap<String, watch::Receiver<u64>> = HashMap::new();
        // Nodes set up on the current stream.
        let mut ready: (u64, Vec<String>) = (0, Vec::new());
        // Requests that went unanswered in a row.
        let mut unanswered = 0;
        loop {
            if cancel.is_cancelled() {
                return;
            }
            let outcome = tokio::select! {
                _ = cancel.cancelled() => return,
                o = self.step(&mut session, &mut ready, &mut published) => o,
            };
            match outcome {
                Ok(true) => {
                    reconnect.reset();
                    unanswered = 0;
                }
                Ok(false) => {
                    if drain.is_cancelled() {
                        return; // caught up
                    }
                    let news = wait_for_news(&mut published);
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = drain.cancelled() => {}
                        _ = session.idle(news) => {}
                    }
                }
                Err(e) => {
                    self.failed(&e);
                    if matches!(e, BridgeError::Session(SessionError::Timeout(_))) {
                        unanswered += 1;
                    }
                    // The client library now and then leaves answers unread on a stream it
                    // has (re)established: after two unanswered requests on a stream that was
                    // up, a new session. (Not while the server is unreachable: the client
                    // reconnects by itself, and each new one would too.)
                    if unanswered >= 2 && session.streams > 0 {
                        tracing::debug!("XMPP: requests unanswered; opening a new session");
                        match Session::open(&self.xmpp, self.config.delivery_timeout) {
                            Ok(s) => {
                                session = s;
                                ready = (u64::MAX, Vec::new());
                            }
                            Err(e) => tracing::warn!(error = %e, "XMPP: cannot open a new session"),
                        }
                        unanswered = 0;
                    }
                    if drain.is_cancelled() {
                        return; // what is left is published after the next start
                    }
                    let delay = reconnect.delay();
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = drain.cancelled() => {}
                        _ = session.idle(tokio::time::sleep(delay)) => {}
                    }
                }
            }
        }
    }

    fn failed(&self, e: &BridgeError) {
        let mut state = self.state();
        if !matches!(e, BridgeError::Store(_)) {
            state.connected = false;
        }
        let message = e.to_string();
        if state.last_error.as_deref() != Some(&message) {
            tracing::warn!(error = %message, "XMPP bridge: cannot publish now; retrying");
        }
        state.last_error = Some(message);
    }

    /// Publishes one item of the first channel that has something new; false when every
    /// channel is on its node.
    async fn step(
        &self,
        session: &mut Session,
        ready: &mut (u64, Vec<String>),
        published: &mut HashMap<String, watch::Receiver<u64>>,
    ) -> Result<bool, BridgeError> {
        let mut feeds = Vec::new();
        for channel in self.feeds.all() {
            let name = &channel.spec.name;
            if channel.spec.read_token.is_some() || !self.ownership.owns(name) {
                // Another instance may move the cursor meanwhile: read it again when this one
                // owns the channel again.
                published.remove(name.as_str());
                self.state().cursors.remove(name.as_str());
                continue;
            }
            // Seen now: what it publishes from here on wakes the bridge up.
            published
                .entry(name.clone())
                .or_insert_with(|| channel.feed.published())
                .borrow_and_update();
            feeds.push((channel.feed.clone(), channel.spec.retention.max_changes));
        }
        published.retain(|name, _| feeds.iter().any(|(f, _)| &f.name == name));
        for (feed, max_items) in feeds {
            let cursor = self.cursor(&feed).await?;
            if feed.published_seq() <= cursor {
                continue;
            }
            if ready.0 != session.streams {
                *ready = (session.streams, Vec::new());
            }
            if !ready.1.contains(&feed.name) {
                self.set_up_node(session, &feed.name, max_items).await?;
                ready.1.push(feed.name.clone());
            }
            self.publish_next(session, &feed, cursor).await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// The channel's cursor: known, or read from the store, or (a channel never bridged) the
    /// seq published now, recorded.
    async fn cursor(&self, feed: &ChannelFeed) -> Result<u64, BridgeError> {
        if let Some(c) = self.state().cursors.get(&feed.name) {
            return Ok(*c);
        }
        let cursor = match self.store.bridge_cursor(&feed.name, BRIDGE).await? {
            Some(c) => c,
            None => {
                let start = feed.published_seq();
                self.store
                    .put_bridge_cursor(&feed.name, BRIDGE, start)
                    .await?;
                start
            }
        };
        self.state().cursors.insert(feed.name.clone(), cursor);
        Ok(cursor)
    }

    /// Creates the channel's node, or configures it when it exists. A service that refuses
    /// `max_items` (above its own limit) is asked for `max` instead.
    async fn set_up_node(
        &self,
        session: &mut Session,
        channel: &str,
        max_items: u64,
    ) -> Result<(), BridgeError> {
        let node = self.xmpp.node(channel);
        let title = format!("changehub: {}", self.config.urls.topic(channel));
        let mut max = max_items.to_string();
        loop {
            let created = session.request(stanzas::create(&node, &title, &max)?).await;
            let outcome = match created {
                Err(e) if e.is(DefinedCondition::Conflict) => {
                    session
                        .request(stanzas::configure(&node, &title, &max)?)
                        .await
                }
                other => other,
            };
            match outcome {
                Ok(_) => {
                    tracing::info!(%node, max_items = %max, "XMPP node ready");
                    return Ok(());
                }
                Err(SessionError::Refused { .. }) if max != "max" => max = "max".into(),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Publishes the range after `cursor` and records the new cursor.
    async fn publish_next(
        &self,
        session: &mut Session,
        feed: &ChannelFeed,
        cursor: u64,
    ) -> Result<(), BridgeError> {
        let Some(n) = self.next_item(feed, cursor).await? else {
            return Ok(());
        };
        let node = self.xmpp.node(&feed.name);
        let id = stanzas::item_id(n.first, n.last);
        session
            .request(stanzas::publish(&node, &id, &n.body)?)
            .await?;
        {
            let mut state = self.state();
            state.connected = true;
            state.last_error = None;
        }
        metrics::counter!("changehub_xmpp_items_total", "channel" => feed.name.clone())
            .increment(1);
        tracing::debug!(%node, item = %id, "published to XMPP");
        self.advance(&feed.name, n.last).await
    }

    async fn advance(&self, channel: &str, seq: u64) -> Result<(), BridgeError> {
        self.state().cursors.insert(channel.to_string(), seq);
        self.store.put_bridge_cursor(channel, BRIDGE, seq).await?;
        Ok(())
    }

    /// The next item after `cursor`: the batcher's notification when it is still cached and
    /// fits, else a range read from the log and halved until it fits. `None` when the range
    /// was trimmed away (the cursor then moves past it).
    async fn next_item(
        &self,
        feed: &ChannelFeed,
        cursor: u64,
    ) -> Result<Option<Arc<Notification>>, BridgeError> {
        if let Some(n) = feed
            .cached(cursor + 1)
            .filter(|n| n.body.len() <= MAX_ITEM_BYTES)
        {
            return Ok(Some(n));
        }
        let published = feed.published_seq();
        let mut limit = (published - cursor).min(self.config.max_batch.max(1) as u64) as usize;
        let mut changes = self.store.read(&feed.name, cursor, limit).await?;
        changes.retain(|c| c.seq <= published);
        let Some(first) = changes.first().map(|c| c.seq) else {
            tracing::warn!(channel = %feed.name, after = cursor, upto = published, "changes trimmed away before they reached XMPP");
            self.advance(&feed.name, published).await?;
            return Ok(None);
        };
        if first > cursor + 1 {
            tracing::warn!(channel = %feed.name, from = cursor + 1, to = first - 1, "changes trimmed away before they reached XMPP");
        }
        let epoch = feed.origin(self.store.as_ref()).await?.epoch.clone();
        loop {
            let n = render_notification(
                &self.config,
                &feed.name,
                &epoch,
                changes[..limit.min(changes.len())].to_vec(),
            );
            if n.body.len() <= MAX_ITEM_BYTES || limit == 1 {
                return Ok(Some(Arc::new(n)));
            }
            limit /= 2;
        }
    }
}

/// Waits until a followed channel publishes, or [`LOOK_AROUND`] passes.
async fn wait_for_news(published: &mut HashMap<String, watch::Receiver<u64>>) {
    let changes: Vec<_> = published
        .values_mut()
        .map(|rx| Box::pin(rx.changed()))
        .collect();
    let news = async {
        if changes.is_empty() {
            std::future::pending::<()>().await;
        }
        let _ = futures_util::future::select_all(changes).await;
    };
    let _ = tokio::time::timeout(LOOK_AROUND, news).await;
}
