//! One external topic as the hub knows it: its internal channel and feed, the latest generic
//! content, what the last fetch found, and the state of its fetches.

use bytes::Bytes;
use std::sync::{Arc, Mutex};
use time::OffsetDateTime;
use tokio::sync::watch;

use super::fetch::Fetched;
use super::seen::Seen;
use crate::batcher::ChannelFeed;
use crate::net;

/// The latest fetched body of a generic (non-ResourceSync) topic.
#[derive(Debug)]
pub struct Content {
    /// 1, 2, 3 … per topic, in this process.
    pub version: u64,
    pub body: Bytes,
    pub content_type: Option<String>,
    /// The topic's own `Link` links other than rel=hub and rel=self, as written.
    pub links: Vec<String>,
    /// When this version was fetched.
    pub fetched_at: OffsetDateTime,
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

/// One fetch at a time per topic; a ping during a fetch asks for one more afterwards.
#[derive(Default)]
pub(super) struct FetchGate {
    pub(super) running: bool,
    pub(super) again: bool,
}

/// One external topic.
pub struct Topic {
    pub url: String,
    pub channel: String,
    pub feed: Arc<ChannelFeed>,
    content: watch::Sender<Option<Arc<Content>>>,
    pub(super) gate: Mutex<FetchGate>,
    pub(super) seen: tokio::sync::Mutex<Seen>,
    kind: Mutex<Kind>,
    status: Mutex<FetchStatus>,
    /// A ping arrived while this instance did not own the topic's channel.
    missed_ping: Mutex<bool>,
}

impl Topic {
    pub(super) fn new(url: &str, channel: &str, feed: Arc<ChannelFeed>) -> Topic {
        Topic {
            url: url.to_string(),
            channel: channel.to_string(),
            feed,
            content: watch::channel(None).0,
            gate: Mutex::default(),
            seen: tokio::sync::Mutex::default(),
            kind: Mutex::new(Kind::Unknown),
            status: Mutex::default(),
            missed_ping: Mutex::default(),
        }
    }

    /// The latest generic content and its changes.
    pub fn content(&self) -> watch::Receiver<Option<Arc<Content>>> {
        self.content.subscribe()
    }

    pub fn content_version(&self) -> u64 {
        self.content.borrow().as_ref().map_or(0, |c| c.version)
    }

    /// The content version a subscription verified at `verified_at` starts after: content
    /// fetched before it is not delivered to it, content fetched since is — even when its
    /// delivery worker starts later (on a shared store, once this instance owns the topic).
    pub fn content_baseline(&self, verified_at: OffsetDateTime) -> u64 {
        match self.content.borrow().as_ref() {
            Some(c) if c.fetched_at < verified_at => c.version,
            Some(c) => c.version - 1,
            None => 0,
        }
    }

    /// Notes a publish ping this instance could not act on (it did not own the topic then);
    /// true when there was one, which is then forgotten.
    pub fn take_missed_ping(&self) -> bool {
        std::mem::take(&mut *self.missed_ping.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(super) fn miss_ping(&self) {
        *self.missed_ping.lock().unwrap_or_else(|e| e.into_inner()) = true;
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

    pub(super) fn set_kind(&self, kind: Kind) {
        *self.kind.lock().unwrap_or_else(|e| e.into_inner()) = kind;
    }

    /// Counts a fetch and keeps its error (or clears the last one).
    pub(super) fn fetched(&self, result: Result<(), String>) {
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        status.fetches += 1;
        status.last_fetch = Some(OffsetDateTime::now_utc());
        status.last_error = result.err();
        if let Some(e) = &status.last_error {
            tracing::warn!(topic = %self.url, error = %e, "external topic fetch failed");
        }
    }

    /// Makes `fetched` the latest content (a new version), unless it is the same as the
    /// current one: an unchanged body is not distributed again.
    pub(super) fn set_content(&self, fetched: Fetched) {
        let unchanged = self
            .content
            .borrow()
            .as_ref()
            .is_some_and(|c| c.body == fetched.body && c.content_type == fetched.content_type);
        if unchanged {
            tracing::debug!(topic = %self.url, "topic content unchanged; nothing to distribute");
            return;
        }
        let links = fetched
            .links
            .iter()
            .flat_map(|v| net::parse_links(v))
            .filter(|l| !l.has_rel("hub") && !l.has_rel("self"))
            .map(|l| l.raw)
            .collect();
        self.content.send_modify(|c| {
            let version = c.as_ref().map_or(0, |c| c.version) + 1;
            *c = Some(Arc::new(Content {
                version,
                body: fetched.body,
                content_type: fetched.content_type,
                links,
                fetched_at: OffsetDateTime::now_utc(),
            }));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetched(body: &'static str) -> Fetched {
        Fetched {
            body: Bytes::from_static(body.as_bytes()),
            content_type: Some("text/plain".into()),
            links: vec![],
        }
    }

    #[test]
    fn content_fetched_since_verification_is_delivered_even_to_late_workers() {
        let topic = Topic::new(
            "http://127.0.0.1/t",
            "_ext-x",
            Arc::new(ChannelFeed::new("_ext-x")),
        );
        let before = OffsetDateTime::now_utc();
        assert_eq!(topic.content_baseline(before), 0);
        topic.set_content(fetched("one"));
        let after = OffsetDateTime::now_utc() + time::Duration::nanoseconds(1);
        // Verified before the fetch: version 1 is still to deliver.
        assert_eq!(topic.content_baseline(before), 0);
        // Verified after it: only later versions.
        assert_eq!(topic.content_baseline(after), 1);
        // The same body again is no new version.
        topic.set_content(fetched("one"));
        assert_eq!(topic.content_version(), 1);
        topic.set_content(fetched("two"));
        assert_eq!(topic.content_baseline(after), 1);
    }

    #[test]
    fn a_missed_ping_is_taken_once() {
        let topic = Topic::new(
            "http://127.0.0.1/t",
            "_ext-x",
            Arc::new(ChannelFeed::new("_ext-x")),
        );
        assert!(!topic.take_missed_ping());
        topic.miss_ping();
        assert!(topic.take_missed_ping());
        assert!(!topic.take_missed_ping());
    }
}
