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
//! Fat pings ([`External::record`] called from [`publish`]) skip the fetch: the posted
//! Change List is recorded the same way.
//!
//! "Seen" is decided per topic by the key (`loc`, `change`, `datetime`) and a high-water mark:
//! an entry is new when its key was never seen and it is not older than the newest change
//! already recorded. The memory is rebuilt from the log after a restart.
//!
//! Files: this one holds the registry ([`External`]: topics by channel, pings, following the
//! other instances); `topic.rs` one topic and its latest content; `fetch.rs` fetching and
//! deciding what a topic is; `seen.rs` the seen-set; `record.rs` the log writer;
//! `publish.rs` what publishers send (pings, fat pings).
//!
//! Invariants:
//! - HTTP handlers never wait for a fetch; only [`External::record`] (fat pings) waits, for the
//!   store append.
//! - Changes of an external topic go through the log before any subscriber sees them.
//! - Generic content is held in memory only (latest version per topic): it is not replayed
//!   after a restart.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

use crate::batcher::{Batcher, ChannelFeed};
use crate::config::Config;
use crate::ownership::Ownership;
use crate::store::{ClusterEvent, Store, StoreError};
use crate::work::Work;

mod fetch;
pub mod publish;
mod record;
mod seen;
mod topic;

pub use fetch::{fetch, Fetched, MAX_FETCH_BYTES, MAX_INDEX_LISTS};
pub use record::LISTS;
pub use topic::{Content, ContentRetry, FetchStatus, Kind, Topic};

/// Prefix of internal channel names of external topics (not a valid `--channel` name).
pub const CHANNEL_PREFIX: &str = "_ext-";

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

/// The registry of external topics.
pub struct External {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    client: reqwest::Client,
    topics: Mutex<HashMap<String, Arc<Topic>>>,
    retries: Mutex<HashMap<String, ContentRetry>>,
    /// Which internal channels this instance delivers: it fetches only those topics.
    ownership: Arc<Ownership>,
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
        ownership: Arc<Ownership>,
        work: &Work,
    ) -> Arc<External> {
        Arc::new(External {
            config,
            store,
            client,
            topics: Mutex::new(HashMap::new()),
            retries: Mutex::new(HashMap::new()),
            ownership,
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
    /// over), and the publish pings they forward to the owner. Runs until the hub stops.
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
                Ok(ClusterEvent::Pinged { channel }) => {
                    if let Some(topic) = self.by_channel(&channel) {
                        if self.ownership.owns(&channel) {
                            tracing::debug!(topic = %topic.url, "forwarded publish ping: fetching");
                            self.ping(topic);
                        }
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
        let topic = Arc::new(Topic::new(url, &channel, feed));
        topics.insert(channel, topic.clone());
        tracing::debug!(topic = url, "external topic registered");
        topic
    }

    /// A publish ping for the topic at `url`: fetched in the background when somebody
    /// subscribes to it (a topic nobody subscribes to has nothing to distribute).
    ///
    /// The instance that owns the topic's channel fetches it, since it delivers what the fetch
    /// finds. On a shared store, another instance forwards the ping to the owner
    /// ([`ClusterEvent::Pinged`]) and also keeps it, in case it becomes the owner itself
    /// before anyone has acted on it (see [`Topic::take_missed_ping`]).
    pub fn ping_url(self: &Arc<Self>, url: &str) {
        let Some(topic) = self.by_url(url) else {
            tracing::debug!(topic = %url, "publish ping for a topic without subscribers");
            return;
        };
        if self.ownership.owns(&topic.channel) {
            tracing::debug!(topic = %url, "publish ping: fetching");
            self.ping(topic);
            return;
        }
        topic.miss_ping();
        tracing::debug!(topic = %url, "publish ping: forwarded to the owner");
        let (store, channel) = (self.store.clone(), topic.channel.clone());
        self.work.tasks.spawn(async move {
            let event = ClusterEvent::Pinged { channel };
            if let Err(e) = store.announce(&event).await {
                tracing::warn!(error = %e, "cannot forward a publish ping to the owner");
            }
        });
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
            // Whatever ends this task (a panic included), the topic can be fetched again.
            let mut mark = RunningMark(Some(topic.clone()));
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = this.fetch_and_distribute(&topic) => {}
                }
                let mut gate = topic.gate.lock().unwrap_or_else(|e| e.into_inner());
                if gate.again {
                    gate.again = false;
                } else {
                    // Cleared under the lock that a ping checks, so no ping is lost.
                    gate.running = false;
                    mark.0 = None;
                    return;
                }
            }
        });
    }
}

/// Clears a topic's running fetch when the fetch task ends any other way than by finishing
/// (a panic, cancellation), so that the next ping fetches again.
struct RunningMark(Option<Arc<Topic>>);

impl Drop for RunningMark {
    fn drop(&mut self) {
        if let Some(topic) = self.0.take() {
            let mut gate = topic.gate.lock().unwrap_or_else(|e| e.into_inner());
            gate.running = false;
            gate.again = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetch_that_dies_leaves_the_topic_fetchable() {
        let feed = Arc::new(ChannelFeed::new("_ext-x"));
        let topic = Arc::new(Topic::new("http://127.0.0.1/t", "_ext-x", feed));
        topic.gate.lock().unwrap().running = true;
        let died = std::thread::spawn({
            let topic = topic.clone();
            move || {
                let _mark = RunningMark(Some(topic));
                panic!("a fetch task dies");
            }
        })
        .join();
        assert!(died.is_err());
        let gate = topic.gate.lock().unwrap_or_else(|e| e.into_inner());
        assert!(!gate.running, "the next ping fetches again");
    }

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
}
