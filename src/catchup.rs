//! Catch-up and discovery: the documents anyone can pull, rendered from the log.
//!
//! - [`changelist`]: the topic, an open Change List of the newest retained changes, with an
//!   [`etag`] that changes whenever the log does.
//! - [`changes_after`]: the exact page of changes after a seq, with a `next` link while more
//!   remain; [`CatchupError::Gone`] with the oldest retained seq when the seq fell out of
//!   retention.
//! - [`capability_list`] and [`source_description`]: ResourceSync discovery.
//!
//! Everything here only reads the store. Access rules (private channels) are checked by the
//! caller.

use crate::net::Urls;
use crate::resourcesync::{self, Capability, ChangeListHeader, DocLink};
use crate::store::{Store, StoreError};

/// Most changes in the open Change List and in one `changes?after=` page.
pub const MAX_LIST: usize = 50_000;
/// Default page size of `changes?after=`.
pub const DEFAULT_PAGE: usize = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum CatchupError {
    /// The changes after the asked seq are no longer retained.
    #[error("changes after {after} are no longer retained; the oldest retained seq is {oldest}")]
    Gone { after: u64, oldest: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The entity tag of a channel's topic document: it changes whenever the log's retained range
/// does.
pub async fn etag(store: &dyn Store, channel: &str) -> Result<String, StoreError> {
    let head = store.head(channel).await?;
    Ok(format!("\"{}-{}\"", head.oldest, head.last))
}

/// The topic document of `channel`: an open Change List of its newest retained changes (at
/// most [`MAX_LIST`]).
pub async fn changelist(
    store: &dyn Store,
    urls: &Urls,
    channel: &str,
) -> Result<Vec<u8>, StoreError> {
    let changes = store.read_newest(channel, MAX_LIST).await?;
    let header = ChangeListHeader {
        from: changes.first().map(|c| c.datetime),
        until: None,
        links: vec![DocLink::new("up", urls.capability_list(channel))],
        seq_range: changes
            .first()
            .zip(changes.last())
            .map(|(f, l)| (f.seq, l.seq)),
    };
    Ok(resourcesync::write_change_list(&header, &changes))
}

/// One page of `changes?after=`.
#[derive(Debug)]
pub struct Page {
    pub body: Vec<u8>,
    /// The next page, while more changes remain.
    pub next: Option<String>,
}

/// The changes of `channel` after seq `after`, at most `limit`.
pub async fn changes_after(
    store: &dyn Store,
    urls: &Urls,
    channel: &str,
    after: u64,
    limit: usize,
) -> Result<Page, CatchupError> {
    let head = store.head(channel).await?;
    if after.saturating_add(1) < head.oldest {
        return Err(CatchupError::Gone {
            after,
            oldest: head.oldest,
        });
    }
    let changes = store.read(channel, after, limit).await?;
    let last = changes.last().map(|c| c.seq).unwrap_or(after);
    let next = (last < head.last).then(|| urls.changes_after(channel, last, limit));
    let mut links = vec![DocLink::new("up", urls.capability_list(channel))];
    if let Some(next) = &next {
        links.push(DocLink::new("next", next.clone()));
    }
    let header = ChangeListHeader {
        from: changes.first().map(|c| c.datetime),
        until: changes.last().map(|c| c.datetime),
        links,
        seq_range: changes
            .first()
            .zip(changes.last())
            .map(|(f, l)| (f.seq, l.seq)),
    };
    Ok(Page {
        body: resourcesync::write_change_list(&header, &changes),
        next,
    })
}

/// The Capability List of `channel`.
pub fn capability_list(urls: &Urls, channel: &str) -> Vec<u8> {
    let links = [
        DocLink::new("up", urls.source_description()),
        DocLink::new("hub", urls.hub()),
    ];
    let caps = [Capability {
        loc: urls.topic(channel),
        capability: "changelist".into(),
    }];
    resourcesync::write_capability_list(&links, &caps)
}

/// The Source Description: `<rs:ln rel="describedby">` to the hub's home page (the page that
/// tells people what this source offers: its channels, their topics, recent changes), then
/// one Capability List per channel.
pub fn source_description<'a>(urls: &Urls, channels: impl Iterator<Item = &'a str>) -> Vec<u8> {
    let lists: Vec<String> = channels.map(|c| urls.capability_list(c)).collect();
    let links = [DocLink::new("describedby", urls.home())];
    resourcesync::write_source_description(&links, &lists)
}
