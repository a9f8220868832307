//! FeedSync collections as documents (FeedSync for Collections, draft 2, §1.4): a channel's
//! items written as the POX (XML) and JSON forms, and collections a source sends parsed back
//! into items. No HTTP, no store; the sync algorithms are in [`crate::model::feedsync`].
//!
//! The item of a resource is the item element the specification leaves to each application:
//! `<sx:sync>` (with its `<sx:history>` and `<sx:conflicts>`), then the resource as a Resource
//! List entry describes it (`<loc>`, `<lastmod>`, `<rs:md hash length type>`), and the hub's
//! `ch:seq` (the seq of the resource's latest change). The JSON form has the same fields,
//! with `sync` as in the specification's JSON example (counts as strings).
//!
//! `<sx:sharing since until>` are seqs of the channel, written as 20 decimal digits so that
//! they collate as strings (§4): the collection holds every item whose latest change has a seq
//! in (since, until].
//!
//! Parsing treats input as hostile: no DOCTYPE, bounded depth and item count, every value
//! checked ([`crate::model::feedsync::SyncState::check`], [`crate::model::NewChange::validate`]).

mod json;
mod pox;

#[cfg(test)]
mod tests;

pub use json::{parse_json, write_json};
pub use pox::{parse_pox, write_pox};

use crate::model::feedsync::{Item, MAX_COUNT};
use crate::model::{format_datetime, parse_w3c_datetime};
use time::OffsetDateTime;

/// The hub's own namespace (`ch:`), as in the ResourceSync documents.
pub const HUB_NS: &str = "https://changehub.dev/ns/1.0";
/// The ResourceSync namespace (`rs:`).
pub const RS_NS: &str = "http://www.openarchives.org/rs/terms/";
/// Deepest element nesting a collection may have.
pub const MAX_DEPTH: usize = 16;

/// A collection to write: the items whose latest change has a seq in (`since`, `until`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collection {
    pub since: u64,
    pub until: u64,
    pub items: Vec<Entry>,
}

/// One item of a collection, with the seq of its resource's latest change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub item: Item,
}

/// Why a collection was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("malformed collection: {0}")]
    Malformed(String),
    #[error("item {index}: {reason}")]
    Item { index: usize, reason: String },
    #[error("more than {limit} items")]
    TooMany { limit: usize },
}

impl ParseError {
    fn item(index: usize, reason: impl Into<String>) -> ParseError {
        ParseError::Item {
            index,
            reason: reason.into(),
        }
    }
}

/// A `since`/`until` value: a seq as 20 decimal digits.
pub fn sharing_value(seq: u64) -> String {
    format!("{seq:020}")
}

/// `when` (seconds since the epoch) as FeedSync writes it: RFC 3339, whole seconds, `Z`.
fn format_when(secs: i64) -> String {
    OffsetDateTime::from_unix_timestamp(secs)
        .map(format_datetime)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// A FeedSync date-time (§2.1.5): RFC 3339 in whole seconds; read in UTC.
fn parse_when(text: &str) -> Result<i64, String> {
    if !text.contains('T') {
        return Err(format!("when {text:?} is not an RFC 3339 date-time"));
    }
    let dt = parse_w3c_datetime(text).map_err(|e| format!("when: {e}"))?;
    if dt.nanosecond() != 0 {
        return Err(format!("when {text:?} has fractional seconds"));
    }
    Ok(dt.unix_timestamp())
}

/// A count (`updates`, `sequence`): 1 to 2^31 − 1.
fn parse_count(name: &str, text: &str) -> Result<u32, String> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_COUNT).contains(n))
        .ok_or_else(|| format!("{name} {text:?} is not an integer from 1 to 2147483647"))
}

/// A FeedSync boolean: `true` or `false`, lower case.
fn parse_bool(name: &str, text: &str) -> Result<bool, String> {
    match text {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{name} must be true or false, not {text:?}")),
    }
}

/// Checks an item read from a collection: its sync metadata and its resource.
fn check_item(item: &Item) -> Result<(), String> {
    item.sync.check()?;
    for data in std::iter::once(&item.data).chain(item.sync.conflicts.iter().map(|c| &c.data)) {
        if data.loc != item.data.loc {
            return Err("a conflict item describes another loc".into());
        }
        let change = crate::model::NewChange {
            lastmod: data.lastmod,
            hash: data.hash.clone(),
            length: data.length,
            media_type: data.media_type.as_deref().map(Into::into),
            ..crate::model::NewChange::new(data.loc.clone(), crate::model::ChangeType::Updated)
        };
        change.validate().map_err(|e| e.to_string())?;
    }
    Ok(())
}
