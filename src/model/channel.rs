//! Channels: their names and how long their changes are kept.

use std::time::Duration;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_changes: u64,
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
