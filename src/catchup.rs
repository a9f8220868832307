//! Catch-up and discovery: the documents anyone can pull, rendered from the log.
//!
//! - [`changelist`]: the topic, an open Change List of the newest retained changes, with an
//!   [`etag`] that changes whenever the log does.
//! - [`changes_after`]: the exact page of changes after a seq, with a `next` link while more
//!   remain; [`CatchupError::Gone`] with the oldest retained seq when the seq fell out of
//!   retention.
//! - [`resource_list`]: the Resource List, from the resource index, with the seq it reflects
//!   (a Resource List Index of pages when the channel has more than [`MAX_RESOURCES`]
//!   resources); [`resource_list_page`] serves one page.
//! - [`capability_list`] and [`source_description`]: ResourceSync discovery.
//!
//! Everything here only reads the store. Access rules (private channels) are checked by the
//! caller.

use time::OffsetDateTime;

use crate::model::{Change, ChangeType};
use crate::net::Urls;
use crate::resourcesync::{self, Capability, ChangeListHeader, DocLink, ResourceListHeader};
use crate::store::{Store, StoreError};

/// Most changes in the open Change List and in one `changes?after=` page.
pub const MAX_LIST: usize = 50_000;
/// Most resources in one Resource List (or one page of its index).
pub const MAX_RESOURCES: usize = 50_000;
/// Index entries read from the store at a time.
const INDEX_READ: usize = 5_000;
/// Default page size of `changes?after=`.
pub const DEFAULT_PAGE: usize = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum CatchupError {
    /// The changes after the asked seq are no longer retained.
    #[error("changes after {after} are no longer retained; the oldest retained seq is {oldest}")]
    Gone { after: u64, oldest: u64 },
    /// A Resource List page whose bounds make no sense.
    #[error("{0}")]
    BadPage(String),
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
    // `from` is mandatory: an empty list starts when the channel began.
    let from = match changes.first() {
        Some(first) => first.datetime,
        None => {
            store
                .channel_created(channel, OffsetDateTime::now_utc())
                .await?
        }
    };
    let header = ChangeListHeader {
        from: Some(from),
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

/// A Resource List (or one of its pages, or its index) and the seq it reflects: a destination
/// that mirrors it goes on with `changes?after=` that seq, and nothing is lost.
#[derive(Debug)]
pub struct Snapshot {
    pub body: Vec<u8>,
    pub seq: u64,
}

/// The Resource List of `channel`: every resource whose latest change is not `deleted`. When
/// the index describes more than [`MAX_RESOURCES`] resources, a Resource List Index whose
/// pages split the index by seq ([`Store::resource_marks`]).
pub async fn resource_list(
    store: &dyn Store,
    urls: &Urls,
    channel: &str,
) -> Result<Snapshot, StoreError> {
    let at = OffsetDateTime::now_utc();
    let up = DocLink::new("up", urls.capability_list(channel));
    if store.resource_count(channel).await? <= MAX_RESOURCES as u64 {
        let (resources, seq) = listed(store, channel, 0, None, usize::MAX)
            .await?
            .unwrap_or_default();
        let header = ResourceListHeader {
            at,
            completed: Some(OffsetDateTime::now_utc()),
            links: vec![up],
            seq: Some(seq),
        };
        return Ok(Snapshot {
            body: resourcesync::write_resource_list(&header, &resources),
            seq,
        });
    }
    let seq = store.head(channel).await?.last;
    let marks = store.resource_marks(channel, MAX_RESOURCES).await?;
    let mut pages = Vec::with_capacity(marks.len() + 1);
    let mut after = 0;
    for &mark in &marks {
        pages.push(urls.resource_list_page(channel, after, Some(mark)));
        after = mark;
    }
    pages.push(urls.resource_list_page(channel, after, None));
    let header = ResourceListHeader {
        at,
        completed: Some(OffsetDateTime::now_utc()),
        links: vec![up],
        seq: Some(seq),
    };
    Ok(Snapshot {
        body: resourcesync::write_resource_list_index(&header, &pages),
        seq,
    })
}

/// One page of a Resource List Index: the resources whose latest change has a seq in
/// (`after`, `upto`] (`upto` absent: to the end), deleted ones left out.
pub async fn resource_list_page(
    store: &dyn Store,
    urls: &Urls,
    channel: &str,
    after: u64,
    upto: Option<u64>,
) -> Result<Snapshot, CatchupError> {
    let at = OffsetDateTime::now_utc();
    if let Some(upto) = upto {
        if upto <= after {
            return Err(CatchupError::BadPage(format!(
                "upto ({upto}) must be greater than after ({after})"
            )));
        }
        if upto - after > (MAX_RESOURCES as u64) * 64 {
            return Err(CatchupError::BadPage(
                "not a page of this hub's Resource List Index".into(),
            ));
        }
    }
    let head = store.head(channel).await?;
    if after > head.last {
        return Err(CatchupError::BadPage(format!(
            "after ({after}) is beyond the channel's newest seq ({})",
            head.last
        )));
    }
    // A page of the index lists about MAX_RESOURCES (more when resources moved to the last
    // page meanwhile); anything much larger is no page the index gave.
    let (resources, seq) = listed(store, channel, after, upto, MAX_RESOURCES * 2)
        .await?
        .ok_or_else(|| {
            CatchupError::BadPage("not a page of this hub's Resource List Index".into())
        })?;
    let header = ResourceListHeader {
        at,
        completed: Some(OffsetDateTime::now_utc()),
        links: vec![
            DocLink::new("up", urls.capability_list(channel)),
            DocLink::new("index", urls.resource_list(channel)),
        ],
        seq: Some(seq),
    };
    Ok(Snapshot {
        body: resourcesync::write_resource_list(&header, &resources),
        seq,
    })
}

/// The resources of the index whose latest change has a seq in (`after`, `upto`], not
/// deleted, and the channel's seq when the first part was read; `None` as soon as there are
/// more than `cap` of them.
async fn listed(
    store: &dyn Store,
    channel: &str,
    after: u64,
    upto: Option<u64>,
    cap: usize,
) -> Result<Option<(Vec<Change>, u64)>, StoreError> {
    let mut out = Vec::new();
    let mut seq = None;
    let mut cursor = after;
    loop {
        let page = store.resources(channel, cursor, INDEX_READ).await?;
        seq.get_or_insert(page.last);
        let read = page.resources.len();
        for change in page.resources {
            if upto.is_some_and(|upto| change.seq > upto) {
                return Ok(Some((out, seq.unwrap_or(0))));
            }
            cursor = change.seq;
            if change.change != ChangeType::Deleted {
                if out.len() == cap {
                    return Ok(None);
                }
                out.push(change);
            }
        }
        if read < INDEX_READ {
            return Ok(Some((out, seq.unwrap_or(0))));
        }
    }
}

/// The Capability List of `channel`.
pub fn capability_list(urls: &Urls, channel: &str) -> Vec<u8> {
    let links = [
        DocLink::new("up", urls.source_description()),
        DocLink::new("hub", urls.hub()),
    ];
    let caps = [
        Capability {
            loc: urls.topic(channel),
            capability: "changelist".into(),
        },
        Capability {
            loc: urls.resource_list(channel),
            capability: "resourcelist".into(),
        },
    ];
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
