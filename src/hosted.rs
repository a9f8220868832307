//! The hosted channels, by name: each one's settings ([`ChannelSpec`]) and its feed
//! ([`ChannelFeed`]).
//!
//! Channels declared at start-up (flags, the file) are here from the start and do not change.
//! The admin API creates, changes and removes others while the hub runs; they are stored
//! (`Store::put_channel`), so every instance on one store and every restart sees them, and
//! [`crate::server::Control::apply`] brings this registry in line with the store.
//!
//! Readers take a snapshot of one entry ([`Hosted::get`]) and keep no lock: a change
//! replaces the entry's settings for the next request; a removal takes the channel away for
//! the next request (what is under way finishes).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::batcher::{ChannelFeed, RecentBudget};
use crate::catchup::pages::PageCache;
use crate::model::ChannelSpec;
use crate::net::Urls;

/// Where a channel was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    /// `--channel`, `--publisher` or the file: fixed while the hub runs.
    StartUp,
    /// The admin API: stored, may change or go away.
    Api,
}

/// One hosted channel.
#[derive(Clone)]
pub struct Channel {
    pub spec: Arc<ChannelSpec>,
    pub feed: Arc<ChannelFeed>,
    pub declared: Declared,
}

/// The hosted channels, shared by everything that serves them.
pub struct Hosted {
    channels: RwLock<BTreeMap<String, Channel>>,
    /// The feeds of internal channels that belong to hosted ones (the list of a channel's
    /// Change Dumps, [`crate::dumps::channel_name`]): found by [`Hosted::feed`], but not
    /// hosted channels themselves.
    internal: RwLock<BTreeMap<String, Arc<ChannelFeed>>>,
    /// The blocks of page entries that the feeds of hosted channels write as they publish.
    pages: Option<Arc<PageCache>>,
    /// The bound on the recent notifications that every feed here keeps.
    recent: Arc<RecentBudget>,
}

impl Hosted {
    /// No channels yet; the feeds of hosted channels will write the blocks of page entries
    /// they complete to `pages`, and all feeds keep at most `recent` bytes of recent
    /// notifications together.
    pub fn with_pages(pages: Arc<PageCache>, recent: usize) -> Hosted {
        Hosted {
            channels: RwLock::default(),
            internal: RwLock::default(),
            pages: Some(pages),
            recent: RecentBudget::new(recent),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Channel>> {
        self.channels.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Channel>> {
        self.channels.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, name: &str) -> Option<Channel> {
        self.read().get(name).cloned()
    }

    pub fn spec(&self, name: &str) -> Option<Arc<ChannelSpec>> {
        self.read().get(name).map(|c| c.spec.clone())
    }

    /// The feed of a hosted channel, or of an internal channel of one.
    pub fn feed(&self, name: &str) -> Option<Arc<ChannelFeed>> {
        match self.read().get(name) {
            Some(c) => Some(c.feed.clone()),
            None => self
                .internal
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(name)
                .cloned(),
        }
    }

    /// Adds the feed of an internal channel; returns it and whether it is new.
    pub fn put_internal(&self, name: &str) -> (bool, Arc<ChannelFeed>) {
        let mut internal = self.internal.write().unwrap_or_else(|e| e.into_inner());
        match internal.get(name) {
            Some(feed) => (false, feed.clone()),
            None => {
                let feed = Arc::new(ChannelFeed::with_budget(name, self.recent.clone()));
                internal.insert(name.to_string(), feed.clone());
                (true, feed)
            }
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.read().contains_key(name)
    }

    /// Every channel, by name.
    pub fn all(&self) -> Vec<Channel> {
        self.read().values().cloned().collect()
    }

    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    pub fn feeds(&self) -> Vec<Arc<ChannelFeed>> {
        self.read().values().map(|c| c.feed.clone()).collect()
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// The channel whose topic URL is `topic`, if it is one of this hub's.
    pub fn for_topic(&self, urls: &Urls, topic: &str) -> Option<Arc<ChannelSpec>> {
        self.spec(urls.channel_of_topic(topic)?)
    }

    /// Adds a channel, or replaces the settings of one already here (its feed stays).
    /// Returns true when it is new.
    pub fn put(&self, spec: ChannelSpec, declared: Declared) -> (bool, Arc<ChannelFeed>) {
        let mut channels = self.write();
        match channels.get_mut(&spec.name) {
            Some(existing) => {
                existing.spec = Arc::new(spec);
                (false, existing.feed.clone())
            }
            None => {
                let feed = Arc::new(match &self.pages {
                    Some(pages) => {
                        ChannelFeed::with_pages(&spec.name, self.recent.clone(), pages.clone())
                    }
                    None => ChannelFeed::with_budget(&spec.name, self.recent.clone()),
                });
                let name = spec.name.clone();
                channels.insert(
                    name,
                    Channel {
                        spec: Arc::new(spec),
                        feed: feed.clone(),
                        declared,
                    },
                );
                (true, feed)
            }
        }
    }

    /// Takes a channel away; returns it.
    pub fn remove(&self, name: &str) -> Option<Channel> {
        self.write().remove(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Notification, Retention};

    fn notification(channel: &str, first: u64) -> Notification {
        Notification {
            channel: channel.into(),
            first,
            last: first,
            changes: Vec::new(),
            body: bytes::Bytes::from(vec![b'x'; 1000]),
            entry_bounds: Vec::new(),
            accepted_at: None,
        }
    }

    /// Hosted channels and internal ones keep their recent notifications within the one
    /// bound given to the registry (the share of `--cache-size`).
    #[test]
    fn every_feed_counts_its_recent_notifications_toward_the_registry_bound() {
        let one = notification("a", 1).memory();
        let hosted = Hosted::with_pages(Arc::new(PageCache::with_bound(0)), 3 * one);
        let spec = |name: &str| ChannelSpec::new(name, "t", Retention::DEFAULT);
        let (_, a) = hosted.put(spec("a"), Declared::StartUp);
        let (_, b) = hosted.put(spec("b"), Declared::Api);
        let (_, dumps) = hosted.put_internal("a.dumps");
        for first in 1..=3 {
            a.announce(notification("a", first));
        }
        assert_eq!(hosted.recent.used(), 3 * one);
        b.announce(notification("b", 1));
        dumps.announce(notification("a.dumps", 1));
        assert_eq!(hosted.recent.used(), 5 * one, "each keeps its newest");
        a.announce(notification("a", 4));
        assert_eq!(
            hosted.recent.used(),
            3 * one,
            "over the bound: a drops its oldest"
        );
        assert!(a.cached(4).is_some() && a.cached(3).is_none());
        assert!(b.cached(1).is_some() && dumps.cached(1).is_some());
    }
}
