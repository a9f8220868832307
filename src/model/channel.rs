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

/// How long a channel's changes are kept: at most `max_changes`, and none older than
/// `max_age` when set. The newest change is always kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_changes: u64,
    pub max_age: Option<Duration>,
}

impl Retention {
    /// One million changes, whatever their age.
    pub const DEFAULT: Retention = Retention {
        max_changes: 1_000_000,
        max_age: None,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

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
