//! External topics: WebSub topics the hub does not host, allowed by
//! `--allow-external-topics PREFIX` (`*` for any).
//!
//! Every external topic the hub knows (one that was subscribed to) is a [`Topic`] with an
//! internal channel named [`channel_name`]`(url)` (`_ext-` and a hash of the URL, a name no
//! `--channel` can take). A publish ping makes the hub fetch the topic in the background
//! (bounded in size and time, never following redirects, through the same no-private-address
//! client as callbacks; one fetch per topic at a time, a ping during a fetch causes one more
//! fetch afterwards). What was fetched decides how it is distributed:
//!
//! - A ResourceSync Change List (or a Change List Index, whose open Change Lists are fetched in
//!   turn): the entries not seen before are appended to the topic's internal channel log, and
//!   from there the ordinary batcher and delivery workers turn them into seq-ordered Change List
//!   notifications — replayable, retried, exactly like a hosted channel's.
//! - Anything else (HTML, text, JSON, Atom …): the body becomes the topic's latest
//!   [`Content`], with its `Content-Type` and `Link` headers; delivery workers POST the latest
//!   content to each subscriber (standard WebSub). A body identical to the previous one is not
//!   distributed again.
//!
//! Fat pings ([`External::record`] called from [`super::publish`]) skip the fetch: the posted
//! Change List is recorded the same way.
//!
//! "Seen" is decided per topic by the key (`loc`, `change`, `datetime`) and a high-water mark:
//! an entry is new when its key was never seen and it is not older than the newest change
//! already recorded. The memory is rebuilt from the log after a restart.
//!
//! Invariants:
//! - HTTP handlers never wait for a fetch; only [`External::record`] (fat pings) waits, for the
//!   store append.
//! - Changes of an external topic go through the log before any subscriber sees them.
//! - Generic content is held in memory only (latest version per topic): it is not replayed
//!   after a restart.

use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use time::OffsetDateTime;
use tokio::sync::{broadcast, watch};

use crate::batcher::{Batcher, ChannelFeed};
use crate::config::Config;
use crate::model::Retention;
use crate::model::{format_datetime, NewChange};
use crate::net;
use crate::resourcesync::{self, Document, Limits, ParseError};
use crate::store::{ClusterEvent, Store, StoreError};
use crate::work::Work;

/// Largest topic body fetched.
pub const MAX_FETCH_BYTES: usize = 8 << 20;
/// Most Change Lists read from one Change List Index per fetch.
pub const MAX_INDEX_LISTS: usize = 16;
/// Most remembered entry keys per topic (beyond, only the high-water mark protects).
const MAX_SEEN: usize = 200_000;
/// Retention of an external topic's log.
const RETENTION: Retention = Retention {
    max_changes: 1_000_000,
    max_age: None,
};
/// Prefix of internal channel names of external topics (not a valid `--channel` name).
pub const CHANNEL_PREFIX: &str = "_ext-";

pub mod publish;

/// The internal channel of an external topic URL.
pub fn channel_name(topic: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(topic.as_bytes());
    format!("{CHANNEL_PREFIX}{}", hex::encode(&digest[..12]))
}

/// True when `topic` falls under one of the `--allow-external-topics` prefixes.
pub fn is_allowed(config: &Config, topic: &str) -> bool {
    let Ok(url) = url::Url::parse(topic) else {
        return false;
    };
    if !matches!(url.scheme(), "http" | "https") || url.fragment().is_some() {
        return false;
    }
    config
        .allow_external_topics
        .iter()
        .any(|p| p == "*" || topic.starts_with(p.as_str()))
}

/// The latest fetched body of a generic (non-ResourceSync) topic.
#[derive(Debug)]
pub struct Content {
    /// 1, 2, 3 … per topic, in this process.
    pub version: u64,
    pub body: Bytes,
    pub content_type: Option<String>,
    /// The topic's own `Link` links other than rel=hub and rel=self, as written.
    pub links: Vec<String>,
}

/// What the last fetch found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Unknown,
    ChangeList,
    Content,
}

#[derive(Debug, Clone, Default)]
pub struct FetchStatus {
    pub fetches: u64,
    pub last_fetch: Option<OffsetDateTime>,
    pub last_error: Option<String>,
}

/// A generic-content delivery being retried (shown by the admin API; kept in memory).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ContentRetry {
    pub version: u64,
    pub attempts: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub next_attempt_at: OffsetDateTime,
}

#[derive(Default)]
struct FetchGate {
    running: bool,
    again: bool,
}

#[derive(Default)]
struct Seen {
    loaded: bool,
    keys: HashSet<(String, &'static str, String)>,
    newest: Option<OffsetDateTime>,
}

/// One external topic.
pub struct Topic {
    pub url: String,
    pub channel: String,
    pub feed: Arc<ChannelFeed>,
    content: watch::Sender<Option<Arc<Content>>>,
    gate: Mutex<FetchGate>,
    seen: tokio::sync::Mutex<Seen>,
    kind: Mutex<Kind>,
    status: Mutex<FetchStatus>,
}

impl Topic {
    /// The latest generic content and its changes.
    pub fn content(&self) -> watch::Receiver<Option<Arc<Content>>> {
        self.content.subscribe()
    }

    pub fn content_version(&self) -> u64 {
        self.content.borrow().as_ref().map_or(0, |c| c.version)
    }

    pub fn kind(&self) -> Kind {
        *self.kind.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn status(&self) -> FetchStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_kind(&self, kind: Kind) {
        *self.kind.lock().unwrap_or_else(|e| e.into_inner()) = kind;
    }
}

/// The registry of external topics.
pub struct External {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    client: reqwest::Client,
    topics: Mutex<HashMap<String, Arc<Topic>>>,
    retries: Mutex<HashMap<String, ContentRetry>>,
    work: Work,
    /// Starts the batching of a new internal channel on a shared store (the cluster's role
    /// task); unset on a store of one instance, where the batcher runs here.
    starter: OnceLock<ChannelStarter>,
}

/// Hands a new internal channel's feed to whoever batches it.
pub type ChannelStarter = Box<dyn Fn(Arc<ChannelFeed>) + Send + Sync>;

impl External {
    pub fn new(
        config: Arc<Config>,
        store: Arc<dyn Store>,
        client: reqwest::Client,
        work: &Work,
    ) -> Arc<External> {
        Arc::new(External {
            config,
            store,
            client,
            topics: Mutex::new(HashMap::new()),
            retries: Mutex::new(HashMap::new()),
            work: work.clone(),
            starter: OnceLock::new(),
        })
    }

    /// On a shared store: new internal channels are batched through `starter` (the cluster),
    /// so that one instance at a time owns each, as for hosted channels.
    pub fn set_channel_starter(&self, starter: ChannelStarter) {
        let _ = self.starter.set(starter);
    }

    /// Registers the topics of stored subscriptions to external topics (at start-up, and
    /// when another instance verified one): their internal channels are batched and served
    /// again. Subscriptions of topics no longer allowed stay idle.
    pub async fn register_subscribed(&self) -> Result<usize, StoreError> {
        let mut n = 0;
        for sub in self.store.subscriptions().await? {
            if sub.channel.starts_with(CHANNEL_PREFIX)
                && sub.channel == channel_name(&sub.topic)
                && is_allowed(&self.config, &sub.topic)
                && self.by_channel(&sub.channel).is_none()
            {
                self.ensure(&sub.topic);
                n += 1;
            }
        }
        Ok(n)
    }

    /// On a shared store: follows the subscriptions other instances verify, so that every
    /// instance knows every external topic (to serve its documents, and to take its channel
    /// over). Runs until the hub stops.
    pub async fn follow_other_instances(self: Arc<Self>) {
        let Some(mut events) = self.store.events() else {
            return;
        };
        let stop = self.work.batcher_stop.clone();
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                e = events.recv() => e,
            };
            match event {
                Ok(ClusterEvent::Subscription { channel, .. })
                    if channel.starts_with(CHANNEL_PREFIX)
                        && self.by_channel(&channel).is_none() =>
                {
                    if let Err(e) = self.register_subscribed().await {
                        tracing::warn!(%channel, error = %e, "cannot load the subscriptions of an external topic");
                    }
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// The topic of an internal channel name, if known.
    pub fn by_channel(&self, channel: &str) -> Option<Arc<Topic>> {
        let topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        topics.get(channel).cloned()
    }

    /// Records (or clears) the generic-content retry of a subscription.
    pub fn set_retry(&self, sub_id: &str, retry: Option<ContentRetry>) {
        let mut retries = self.retries.lock().unwrap_or_else(|e| e.into_inner());
        match retry {
            Some(r) => retries.insert(sub_id.to_string(), r),
            None => retries.remove(sub_id),
        };
    }

    /// The generic-content retry of a subscription, if one is in progress.
    pub fn retry(&self, sub_id: &str) -> Option<ContentRetry> {
        let retries = self.retries.lock().unwrap_or_else(|e| e.into_inner());
        retries.get(sub_id).cloned()
    }

    /// The topic at `url`, if known.
    pub fn by_url(&self, url: &str) -> Option<Arc<Topic>> {
        self.by_channel(&channel_name(url))
    }

    /// Every known topic, ordered by URL.
    pub fn topics(&self) -> Vec<Arc<Topic>> {
        let topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = topics.values().cloned().collect();
        all.sort_by(|a, b| a.url.cmp(&b.url));
        all
    }

    /// The topic at `url`, created (with its feed and batcher) when new.
    pub fn ensure(&self, url: &str) -> Arc<Topic> {
        let channel = channel_name(url);
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = topics.get(&channel) {
            return t.clone();
        }
        let feed = Arc::new(ChannelFeed::new(&channel));
        // What is durable already counts as published, before the feed is shared.
        feed.start_at(*self.store.watch_head(&channel).borrow());
        match self.starter.get() {
            Some(start) => start(feed.clone()),
            None => {
                let batcher =
                    Batcher::continuing(feed.clone(), self.store.clone(), self.config.clone());
                self.work
                    .batchers
                    .spawn(batcher.run(self.work.batcher_stop.clone()));
            }
        }
        let topic = Arc::new(Topic {
            url: url.to_string(),
            channel: channel.clone(),
            feed,
            content: watch::channel(None).0,
            gate: Mutex::default(),
            seen: tokio::sync::Mutex::default(),
            kind: Mutex::new(Kind::Unknown),
            status: Mutex::default(),
        });
        topics.insert(channel, topic.clone());
        tracing::debug!(topic = url, "external topic registered");
        topic
    }

    /// A publish ping for the topic at `url`: fetched in the background when somebody
    /// subscribes to it (a topic nobody subscribes to has nothing to distribute).
    pub fn ping_url(self: &Arc<Self>, url: &str) {
        match self.by_url(url) {
            Some(topic) => {
                tracing::debug!(topic = %url, "publish ping: fetching");
                self.ping(topic);
            }
            None => tracing::debug!(topic = %url, "publish ping for a topic without subscribers"),
        }
    }

    /// A publish ping: fetch the topic in the background, unless a fetch is already running,
    /// in which case one more fetch follows it. Never waits.
    pub fn ping(self: &Arc<Self>, topic: Arc<Topic>) {
        {
            let mut gate = topic.gate.lock().unwrap_or_else(|e| e.into_inner());
            if gate.running {
                gate.again = true;
                return;
            }
            gate.running = true;
        }
        let this = self.clone();
        let cancel = self.work.cancel.clone();
        self.work.tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = this.fetch_and_distribute(&topic) => {}
                }
                let mut gate = topic.gate.lock().unwrap_or_else(|e| e.into_inner());
                if gate.again {
                    gate.again = false;
                } else {
                    gate.running = false;
                    return;
                }
            }
        });
    }

    async fn fetch_and_distribute(&self, topic: &Topic) {
        let result = self.fetch_once(topic).await;
        let mut status = topic.status.lock().unwrap_or_else(|e| e.into_inner());
        status.fetches += 1;
        status.last_fetch = Some(OffsetDateTime::now_utc());
        status.last_error = result.err();
        if let Some(e) = &status.last_error {
            tracing::warn!(topic = %topic.url, error = %e, "external topic fetch failed");
        }
    }

    async fn fetch_once(&self, topic: &Topic) -> Result<(), String> {
        let fetched = fetch(
            &self.client,
            &topic.url,
            self.config.allow_private_callbacks,
        )
        .await?;
        let limits = Limits {
            max_bytes: MAX_FETCH_BYTES,
            ..Limits::default()
        };
        // Parsing up to 8 MiB is CPU work: keep it off the async workers.
        let parsed = if looks_like_resourcesync(&fetched.body) {
            let body = fetched.body.clone();
            let parsed =
                tokio::task::spawn_blocking(move || resourcesync::parse_document(&body, &limits))
                    .await
                    .map_err(|e| format!("parsing the topic failed: {e}"))?;
            Some(parsed)
        } else {
            None
        };
        match parsed {
            Some(Ok(Document::ChangeList { entries, .. })) => {
                topic.set_kind(Kind::ChangeList);
                let changes = valid_changes(&topic.url, entries.into_iter().map(|e| e.change));
                let n = self
                    .record(topic, changes)
                    .await
                    .map_err(|e| e.to_string())?;
                tracing::debug!(topic = %topic.url, new = n, "external Change List fetched");
                Ok(())
            }
            Some(Ok(Document::ChangeListIndex { entries, .. })) => {
                topic.set_kind(Kind::ChangeList);
                self.read_index(topic, entries).await
            }
            Some(Err(e)) if is_broken_change_list(&e) => {
                Err(format!("the topic is an invalid Change List: {e}"))
            }
            _ => {
                topic.set_kind(Kind::Content);
                self.set_content(topic, fetched);
                Ok(())
            }
        }
    }

    /// Reads the Change Lists of an index that may hold new changes (open ones, and closed
    /// ones that end after the newest change recorded), oldest first.
    async fn read_index(
        &self,
        topic: &Topic,
        mut lists: Vec<resourcesync::IndexEntry>,
    ) -> Result<(), String> {
        let newest = self.newest(topic).await.map_err(|e| e.to_string())?;
        lists.retain(|l| match (l.until, newest) {
            (Some(until), Some(newest)) => until >= newest,
            _ => true,
        });
        lists.sort_by_key(|l| l.from);
        if lists.len() > MAX_INDEX_LISTS {
            lists.drain(..lists.len() - MAX_INDEX_LISTS);
        }
        let limits = Limits {
            max_bytes: MAX_FETCH_BYTES,
            ..Limits::default()
        };
        for list in lists {
            if !is_allowed(&self.config, &list.loc) {
                tracing::warn!(topic = %topic.url, list = %list.loc, "Change List outside the allowed prefixes; skipped");
                continue;
            }
            let fetched = fetch(&self.client, &list.loc, self.config.allow_private_callbacks)
                .await
                .map_err(|e| format!("{}: {e}", list.loc))?;
            let (_, entries) = resourcesync::parse_change_list(&fetched.body, &limits)
                .map_err(|e| format!("{}: {e}", list.loc))?;
            let changes = valid_changes(&list.loc, entries.into_iter().map(|e| e.change));
            self.record(topic, changes)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn set_content(&self, topic: &Topic, fetched: Fetched) {
        let unchanged = topic
            .content
            .borrow()
            .as_ref()
            .is_some_and(|c| c.body == fetched.body && c.content_type == fetched.content_type);
        if unchanged {
            tracing::debug!(topic = %topic.url, "topic content unchanged; nothing to distribute");
            return;
        }
        let links = fetched
            .links
            .iter()
            .flat_map(|v| net::parse_links(v))
            .filter(|l| !l.has_rel("hub") && !l.has_rel("self"))
            .map(|l| l.raw)
            .collect();
        topic.content.send_modify(|c| {
            let version = c.as_ref().map_or(0, |c| c.version) + 1;
            *c = Some(Arc::new(Content {
                version,
                body: fetched.body,
                content_type: fetched.content_type,
                links,
            }));
        });
    }

    async fn newest(&self, topic: &Topic) -> Result<Option<OffsetDateTime>, StoreError> {
        let mut seen = topic.seen.lock().await;
        self.load_seen(topic, &mut seen).await?;
        Ok(seen.newest)
    }

    async fn load_seen(&self, topic: &Topic, seen: &mut Seen) -> Result<(), StoreError> {
        if seen.loaded {
            return Ok(());
        }
        let logged = self
            .store
            .read_newest(&topic.channel, crate::catchup::MAX_LIST)
            .await?;
        for c in &logged {
            seen.keys.insert((
                c.loc.clone(),
                c.change.as_str(),
                format_datetime(c.datetime),
            ));
            if let Some(lm) = c.lastmod {
                // A change dated before the log's newest was stored with a later datetime and
                // its own time as lastmod: remember that key too.
                seen.keys
                    .insert((c.loc.clone(), c.change.as_str(), format_datetime(lm)));
            }
        }
        seen.newest = logged.last().map(|c| c.datetime);
        seen.loaded = true;
        Ok(())
    }

    /// Appends the changes of `changes` not seen before to the topic's log; returns how many.
    pub async fn record(
        &self,
        topic: &Topic,
        changes: Vec<NewChange>,
    ) -> Result<usize, StoreError> {
        let mut seen = topic.seen.lock().await;
        self.load_seen(topic, &mut seen).await?;
        let mut fresh = Vec::new();
        let mut batch_keys = HashSet::new();
        let mut newest = seen.newest;
        for c in changes {
            let key = (
                c.loc.clone(),
                c.change.as_str(),
                c.datetime.map(format_datetime).unwrap_or_default(),
            );
            let old = match (c.datetime, seen.newest) {
                (Some(dt), Some(newest)) => dt < newest,
                _ => false,
            };
            if old || seen.keys.contains(&key) || !batch_keys.insert(key) {
                continue;
            }
            if let Some(dt) = c.datetime {
                newest = Some(newest.map_or(dt, |n| n.max(dt)));
            }
            fresh.push(c);
        }
        if fresh.is_empty() {
            return Ok(0);
        }
        let n = fresh.len();
        self.store
            .append(&topic.channel, fresh, None, OffsetDateTime::now_utc())
            .await?;
        if seen.keys.len() + batch_keys.len() > MAX_SEEN {
            seen.keys.clear();
        }
        seen.keys.extend(batch_keys);
        seen.newest = newest;
        if let Err(e) = self
            .store
            .trim(&topic.channel, RETENTION, OffsetDateTime::now_utc())
            .await
        {
            tracing::warn!(topic = %topic.url, error = %e, "retention failed");
        }
        tracing::info!(topic = %topic.url, new = n, "external topic changes recorded");
        Ok(n)
    }
}

/// Validated changes of a fetched document; invalid entries are skipped with a warning (the
/// document is not ours to refuse).
fn valid_changes(url: &str, changes: impl Iterator<Item = NewChange>) -> Vec<NewChange> {
    changes
        .enumerate()
        .filter_map(|(i, c)| match c.validate() {
            Ok(()) => Some(c),
            Err(e) => {
                tracing::warn!(topic = url, entry = i, error = %e, "invalid Change List entry skipped");
                None
            }
        })
        .collect()
}

/// Errors that mean "a Change List, but a broken one", as opposed to "not a ResourceSync
/// document at all" (which is distributed as generic content).
fn is_broken_change_list(e: &ParseError) -> bool {
    matches!(
        e,
        ParseError::Entry { .. } | ParseError::Header(_) | ParseError::TooManyEntries { .. }
    )
}

/// A cheap test before parsing: XML whose root is a sitemap `urlset` or `sitemapindex`.
fn looks_like_resourcesync(body: &[u8]) -> bool {
    let head = &body[..body.len().min(4096)];
    let text = String::from_utf8_lossy(head);
    text.trim_start_matches('\u{feff}')
        .trim_start()
        .starts_with('<')
        && (text.contains("urlset") || text.contains("sitemapindex"))
}

/// A fetched topic.
#[derive(Debug)]
pub struct Fetched {
    pub body: Bytes,
    pub content_type: Option<String>,
    /// Every `Link` header value.
    pub links: Vec<String>,
}

/// GETs `url`: 2xx only, no redirects, at most [`MAX_FETCH_BYTES`], within the client's
/// timeout.
pub async fn fetch(
    client: &reqwest::Client,
    url: &str,
    allow_private: bool,
) -> Result<Fetched, String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("bad topic URL: {e}"))?;
    net::check_target(&parsed, allow_private).map_err(|e| format!("topic refused: {e}"))?;
    let mut resp = client
        .get(parsed)
        .send()
        .await
        .map_err(|e| format!("fetch failed: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("topic answered {}", resp.status()));
    }
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_FETCH_BYTES as u64)
    {
        return Err(format!("topic is larger than {MAX_FETCH_BYTES} bytes"));
    }
    let content_type = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let links = resp
        .headers()
        .get_all(http::header::LINK)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect();
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("reading the topic failed: {e}"))?
    {
        if body.len() + chunk.len() > MAX_FETCH_BYTES {
            return Err(format!("topic is larger than {MAX_FETCH_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Fetched {
        body: Bytes::from(body),
        content_type,
        links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_are_stable_and_not_configurable() {
        let a = channel_name("http://example.com/a.xml");
        assert_eq!(a, channel_name("http://example.com/a.xml"));
        assert_ne!(a, channel_name("http://example.com/b.xml"));
        assert!(a.starts_with(CHANNEL_PREFIX));
        assert!(!crate::model::valid_channel_name(&a));
    }

    #[test]
    fn prefixes() {
        let mut config = Config::new(
            "127.0.0.1:1".parse().unwrap(),
            std::path::PathBuf::from("unused"),
        );
        assert!(!is_allowed(&config, "http://example.com/a"));
        config.allow_external_topics = vec!["http://example.com/feeds/".into()];
        assert!(is_allowed(&config, "http://example.com/feeds/a"));
        assert!(!is_allowed(&config, "http://example.com/other"));
        config.allow_external_topics = vec!["*".into()];
        assert!(is_allowed(&config, "https://anything.example/x?y=1"));
        assert!(!is_allowed(&config, "ftp://example.com/a"));
        assert!(!is_allowed(&config, "not a url"));
    }

    #[test]
    fn sniffing() {
        assert!(looks_like_resourcesync(
            b"\xef\xbb\xbf<?xml version=\"1.0\"?><urlset>"
        ));
        assert!(!looks_like_resourcesync(b"hello urlset"));
        assert!(!looks_like_resourcesync(b"<html><body>hi</body></html>"));
    }
}
