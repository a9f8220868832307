//! Channels: their names, who may publish to them, who may read them, and how long their
//! changes are kept.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A hosted channel: declared at start-up (flags, the file) or at runtime through the admin
/// API (then stored, so that every instance and every restart sees it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelSpec {
    pub name: String,
    /// Who may push changes (ingest), each with a name and a token; the name is recorded as
    /// the source of every change it sends. Several at once allow rotating a token.
    pub publishers: Vec<Publisher>,
    /// When set, the channel is private: reads (websocket, SSE, catch-up) need this token.
    #[serde(default)]
    pub read_token: Option<String>,
    pub retention: Retention,
    /// When set, the hub publishes Change Dumps of this channel (see [`DumpSettings`]).
    #[serde(default)]
    pub dumps: Option<DumpSettings>,
}

/// How a channel's Change Dumps are made: ZIP packages of the latest state of every resource
/// changed in a period, each with its Change Dump Manifest.
///
/// A dump is cut when `every` changes are pending, or when `interval` has passed since the
/// last dump and at least one change is pending, whichever comes first; it holds at most
/// `every` changes (the seqs after the previous dump's last). Stored with the channel, so
/// every field has a default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DumpSettings {
    /// Changes per dump: a dump is cut as soon as this many are pending (at least 1).
    pub every: u64,
    /// A dump of whatever is pending is cut when this much time passed since the last one.
    #[serde(with = "seconds")]
    pub interval: Option<Duration>,
    /// How many dumps are kept (older ones are removed, files included; at least 1).
    pub keep: u64,
    /// Largest resource fetched into a dump, in bytes; a larger one is left out.
    pub max_resource_bytes: u64,
    /// Largest dump, in bytes of resources; resources past it are left out.
    pub max_dump_bytes: u64,
    /// Resources fetched at once.
    pub concurrency: usize,
    /// Dumps listed per Change Dump document; more make it a Change Dump Index of pages.
    pub per_document: u64,
}

impl Default for DumpSettings {
    fn default() -> DumpSettings {
        DumpSettings {
            every: 1000,
            interval: Some(Duration::from_secs(3600)),
            keep: 30,
            max_resource_bytes: 64 << 20,
            max_dump_bytes: 1 << 30,
            concurrency: 4,
            per_document: 1000,
        }
    }
}

impl DumpSettings {
    /// What is wrong with these settings, if anything.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_LIST_SIZE).contains(&self.every) {
            return Err(format!(
                "dump_every must be between 1 and {MAX_LIST_SIZE} (changes per dump)"
            ));
        }
        if self.interval.is_some_and(|d| d.as_secs() == 0) {
            return Err("dump_interval must be at least one second".into());
        }
        if !(1..=MAX_DUMPS_KEPT).contains(&self.keep) {
            return Err(format!("dump_keep must be between 1 and {MAX_DUMPS_KEPT}"));
        }
        if self.max_resource_bytes == 0 || self.max_dump_bytes == 0 {
            return Err("dump size limits must be at least 1 byte".into());
        }
        if !(1..=64).contains(&self.concurrency) {
            return Err("dump_concurrency must be between 1 and 64".into());
        }
        if !(1..=MAX_LIST_SIZE).contains(&self.per_document) {
            return Err(format!(
                "dumps_per_document must be between 1 and {MAX_LIST_SIZE}"
            ));
        }
        Ok(())
    }
}

/// A publisher of a channel: its name (`[a-z0-9][a-z0-9._-]{0,63}`) and its bearer token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publisher {
    pub name: String,
    pub token: String,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("name", &self.name)
            .field("token", &"…")
            .finish()
    }
}

/// The name of the publisher that `--channel NAME=TOKEN` (or `token` in the file) declares.
pub const DEFAULT_PUBLISHER: &str = "default";

impl ChannelSpec {
    /// A channel with one publisher, named [`DEFAULT_PUBLISHER`].
    pub fn new(name: &str, token: &str, retention: Retention) -> ChannelSpec {
        ChannelSpec {
            name: name.to_string(),
            publishers: vec![Publisher {
                name: DEFAULT_PUBLISHER.into(),
                token: token.to_string(),
            }],
            read_token: None,
            retention,
            dumps: None,
        }
    }

    /// Sets the token of publisher `name`, adding it when new.
    pub fn set_publisher(&mut self, name: &str, token: &str) {
        match self.publishers.iter_mut().find(|p| p.name == name) {
            Some(p) => p.token = token.to_string(),
            None => self.publishers.push(Publisher {
                name: name.to_string(),
                token: token.to_string(),
            }),
        }
    }

    /// What is wrong with this channel's settings, if anything: its name, its publishers
    /// (at least one; valid names; non-empty tokens, each its own), its retention.
    pub fn check(&self) -> Result<(), String> {
        if !valid_channel_name(&self.name) {
            return Err(format!(
                "channel name {:?} must match [a-z0-9][a-z0-9._-]{{0,63}}",
                self.name
            ));
        }
        if self.publishers.is_empty() {
            return Err(format!(
                "channel {:?} has no publisher: give it a token",
                self.name
            ));
        }
        for (i, p) in self.publishers.iter().enumerate() {
            if !valid_channel_name(&p.name) {
                return Err(format!(
                    "publisher name {:?} of channel {:?} must match [a-z0-9][a-z0-9._-]{{0,63}}",
                    p.name, self.name
                ));
            }
            if p.token.is_empty() {
                return Err(format!(
                    "publisher {:?} of channel {:?} has an empty token",
                    p.name, self.name
                ));
            }
            if self.publishers[..i].iter().any(|q| q.token == p.token) {
                return Err(format!(
                    "publishers of channel {:?} share a token: each needs its own",
                    self.name
                ));
            }
        }
        if self.read_token.as_deref() == Some("") {
            return Err(format!("channel {:?} has an empty read token", self.name));
        }
        if self.retention.max_changes == 0 {
            return Err("retain_changes must be at least 1".into());
        }
        if !(1..=MAX_LIST_SIZE).contains(&self.retention.list_size) {
            return Err(format!(
                "archive_every must be between 1 and {MAX_LIST_SIZE} (changes per closed Change List)"
            ));
        }
        if let Some(dumps) = &self.dumps {
            dumps.check()?;
        }
        Ok(())
    }
}

/// Channel names: `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn valid_channel_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

/// How a channel's changes are kept: at most `max_changes`, and none older than `max_age`
/// when set, dropped only as whole closed Change Lists of `list_size` changes.
///
/// Closed Change List k holds the seqs ((k−1)·`list_size`, k·`list_size`]; the open list (the
/// topic) holds the changes after the last multiple of `list_size`. Retention keeps at least
/// what `max_changes` and `max_age` ask for and cuts only at the start of a closed list, so no
/// closed list is ever partly retained. The newest change is always kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    pub max_changes: u64,
    #[serde(default, with = "seconds")]
    pub max_age: Option<Duration>,
    /// Changes per closed Change List (at least 1).
    pub list_size: u64,
}

impl Retention {
    /// One million changes, whatever their age, in closed lists of 10,000.
    pub const DEFAULT: Retention = Retention {
        max_changes: 1_000_000,
        max_age: None,
        list_size: DEFAULT_LIST_SIZE,
    };

    /// The first seq to keep when the limits alone would keep the seqs from `wanted` on:
    /// `wanted` moved back to the start of its closed list.
    pub fn cut(&self, wanted: u64) -> u64 {
        let size = self.list_size.max(1);
        match wanted {
            0 | 1 => wanted,
            _ => (wanted - 1) / size * size + 1,
        }
    }
}

/// An optional duration as whole seconds.
mod seconds {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        d.map(|d| d.as_secs()).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_secs))
    }
}

/// The most Change Dumps a channel keeps.
pub const MAX_DUMPS_KEPT: u64 = 100_000;

/// Changes per closed Change List unless configured.
pub const DEFAULT_LIST_SIZE: u64 = 10_000;
/// The most changes a closed Change List may hold (a Sitemap holds at most 50,000 URLs).
pub const MAX_LIST_SIZE: u64 = 50_000;

/// Where a channel's log is cut into Change Lists of `size` changes (see [`Retention`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lists {
    pub size: u64,
}

impl Lists {
    /// The last seq of the last closed list when the newest seq is `last` (0: none closed).
    pub fn closed_upto(&self, last: u64) -> u64 {
        last / self.size.max(1) * self.size.max(1)
    }

    /// The seqs of closed list `k` (from 1).
    pub fn range(&self, k: u64) -> (u64, u64) {
        let size = self.size.max(1);
        ((k - 1) * size + 1, k * size)
    }

    /// The closed list that holds `seq` (from 1), if it were closed.
    pub fn list_of(&self, seq: u64) -> u64 {
        (seq.max(1) - 1) / self.size.max(1) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_cuts_only_at_the_start_of_a_closed_list() {
        let r = Retention {
            list_size: 10,
            ..Retention::DEFAULT
        };
        assert_eq!(r.cut(1), 1);
        assert_eq!(r.cut(10), 1);
        assert_eq!(r.cut(11), 11);
        assert_eq!(r.cut(25), 21);
        let one = Retention {
            list_size: 1,
            ..Retention::DEFAULT
        };
        assert_eq!(one.cut(25), 25);
        let lists = Lists { size: 10 };
        assert_eq!(lists.closed_upto(25), 20);
        assert_eq!(lists.closed_upto(9), 0);
        assert_eq!(lists.range(3), (21, 30));
        assert_eq!(lists.list_of(21), 3);
        assert_eq!(lists.list_of(20), 2);
    }

    #[test]
    fn channel_names() {
        for ok in ["a", "0", "news.feed_1-x", &"a".repeat(64)] {
            assert!(valid_channel_name(ok), "{ok}");
        }
        for bad in ["", "A", "-a", ".a", "a/b", "a b", &"a".repeat(65)] {
            assert!(!valid_channel_name(bad), "{bad}");
        }
    }
}
