//! Catch-up and discovery: the documents anyone can pull, rendered from the log.
//!
//! - [`changelist`]: the topic, the open Change List (the changes since the last close), with
//!   an [`etag`] that changes whenever it does.
//! - [`archive`] and [`closed_list`]: the Change List Archive, and the closed lists it
//!   points to. The log is cut into lists by seq ([`Lists`]): closed list k holds the seqs
//!   ((k−1)·N, k·N], so a closed list never changes and its URL names its range.
//! - [`changes_after`]: the exact page of changes after a seq, with a `next` link while more
//!   remain; [`CatchupError::Gone`] with the oldest retained seq when the seq fell out of
//!   retention.
//! - [`resource_list`]: the Resource List, from the resource index, with the seq it reflects
//!   (a Resource List Index of pages when the channel has more than [`MAX_RESOURCES`]
//!   resources); [`resource_list_page`] serves one page.
//! - [`capability_list`] and [`source_description`]: ResourceSync discovery.
//! - [`feedsync_collection`]: the channel's FeedSync items as a collection (complete, or
//!   partial from a seq).
//!
//! The entries of the topic, the closed lists and the pages come from blocks rendered once
//! ([`pages`]): a document is its header and the blocks' bytes, not changes read from the
//! store and rendered again for each request.
//!
//! Everything here only reads the store. Access rules (private channels) are checked by the
//! caller.

pub mod pages;

use std::sync::Arc;

use bytes::Bytes;
use time::OffsetDateTime;

use crate::feedsync;
use crate::model::{Change, ChangeType, Lists};
use crate::net::Urls;
use crate::resourcesync::{
    self, Capability, ChangeListHeader, DocLink, IndexEntry, ResourceListHeader,
};
use crate::store::{ChannelHead, Origin, Store, StoreError};

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
    /// No such closed Change List or archive page.
    #[error("{0}")]
    NotFound(String),
    /// The cursor is not a seq of this log: beyond its newest seq, or of another epoch.
    #[error("{reason}")]
    NotThisLog {
        reason: String,
        last: u64,
        epoch: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One channel's log as the documents see it: where it is, how it is cut into Change Lists,
/// and its origin (the epoch every document carries as `ch:epoch`).
#[derive(Clone, Copy)]
pub struct Log<'a> {
    pub store: &'a dyn Store,
    pub urls: &'a Urls,
    pub channel: &'a str,
    pub lists: Lists,
    pub origin: &'a Origin,
    /// Page entries rendered before (shared by every channel).
    pub pages: &'a pages::PageCache,
}

impl Log<'_> {
    /// The header of a Change List of the seqs `seq_range` from this log: its epoch, the links
    /// every Change List carries (then `more_links`), `from` and `until`.
    fn header(
        &self,
        seq_range: Option<(u64, u64)>,
        from: Option<OffsetDateTime>,
        until: Option<OffsetDateTime>,
        more_links: Option<DocLink>,
    ) -> ChangeListHeader {
        let mut links = change_list_links(self.urls, self.channel);
        links.extend(more_links);
        ChangeListHeader {
            epoch: Some(self.origin.epoch.clone()),
            from,
            until,
            links,
            seq_range,
        }
    }
}

/// The entity tag of a channel's topic document: it changes whenever the open list does.
pub async fn etag(log: Log<'_>) -> Result<String, StoreError> {
    let Log {
        store,
        channel,
        lists,
        ..
    } = log;
    let head = store.head(channel).await?;
    Ok(format!(
        "\"{}-{}-{}\"",
        open_after(head, lists),
        head.last,
        lists.size
    ))
}

/// The topic starts after this seq: the last seq of the last closed list, or the last trimmed
/// seq when retention cut further (only logs trimmed before lists were closed).
fn open_after(head: ChannelHead, lists: Lists) -> u64 {
    lists
        .closed_upto(head.last)
        .max(head.oldest.saturating_sub(1))
}

/// The topic document of `channel`: the open Change List, the changes after the last closed
/// list. Its `from` is the `until` of the last closed list (the datetime of its last change),
/// or when that is no longer retained the first change's datetime, or when the list is empty
/// and nothing was ever closed, when the channel began.
pub async fn changelist(log: Log<'_>) -> Result<Bytes, CatchupError> {
    let Log {
        store,
        channel,
        lists,
        origin,
        ..
    } = log;
    for _ in 0..TOPIC_ATTEMPTS {
        let head = store.head(channel).await?;
        let after = open_after(head, lists);
        let closed = lists.closed_upto(head.last);
        // Bounded by the head just read: changes appended meanwhile wait for the next request
        // (the topic's entity tag is of a head too).
        let end = head.last.min(after.saturating_add(MAX_LIST as u64));
        let Some(parts) = entries(log, &head, after + 1, end).await? else {
            continue; // its start trimmed since the head was read: read the head again
        };
        let boundary = if closed >= head.oldest && closed > 0 {
            datetime_of(store, channel, closed).await?
        } else {
            None
        };
        let from = match (boundary, parts.first()) {
            (Some(until), _) => until,
            (None, Some(first)) => first.from,
            (None, None) => origin.created,
        };
        let header = log.header(
            (end > after).then_some((after + 1, end)),
            Some(from),
            None,
            None,
        );
        return Ok(joined(&header, parts));
    }
    Err(StoreError::Unavailable(format!(
        "the log of {channel} was trimmed at the topic's start {TOPIC_ATTEMPTS} times while it was read"
    ))
    .into())
}

/// Reads of the head a topic request makes at most while retention trims the open list's
/// start under it (only a log retaining fewer changes than a list holds can see this).
const TOPIC_ATTEMPTS: usize = 3;

/// A whole Change List document, as one buffer, from `parts` (the rendered entries of its
/// seqs, in order): the topic and closed lists are kept and compressed whole
/// (`http::rendered`). A document of [`OWN_MAPPING`] bytes or more is put in a mapping of
/// its own ([`mapped`]).
fn joined(header: &ChangeListHeader, parts: Vec<pages::Entries>) -> Bytes {
    let pieces = resourcesync::write_change_list_pieces(
        header,
        parts.into_iter().map(|p| p.bytes).collect(),
    );
    let length = pieces.iter().map(|p| p.len()).sum();
    if length >= OWN_MAPPING {
        if let Some(document) = mapped(&pieces, length) {
            return document;
        }
    }
    Bytes::from(pieces.concat())
}

/// Documents of this many bytes or more get a mapping of their own: a closed list of the
/// default 10,000 changes is about 2.8 MB. glibc maps blocks of 1 MiB or more on their own
/// (`server::tune_malloc`) only when no heap has room for them; otherwise such a document
/// takes the room, and the hole it leaves when it goes often does not fit the next one, a few
/// bytes longer, so both stay resident until the next trim. A mapping goes back to the
/// system as soon as the document is dropped. Measured with one closed-list read a second
/// on a quiet hub (`scripts/closed_list_rss.py`, `docs/performance.md`, forty-fifth and
/// forty-sixth passes): the RSS rise summed over 30 reads 10.8–32.4 MiB with the heap,
/// 2.5–8.5 MiB with a mapping.
pub const OWN_MAPPING: usize = 1 << 20;

/// `pieces` (`length` bytes in all) copied into an anonymous mapping made read-only, or
/// None when the system refuses the mapping (the caller then uses the heap).
///
/// The mapping is populated (`MAP_POPULATE`): its pages are all made in the one call, not one
/// page fault at a time while it is filled. A closed list rendered on a cache miss then costs
/// the hub less CPU than from the heap, not more (`scripts/closed_list_misses.py`,
/// `docs/performance.md`, forty-seventh pass: 1.41–1.47 ms a read, against 1.62–1.73 from the
/// heap and 1.75–1.82 unpopulated).
fn mapped(pieces: &[Bytes], length: usize) -> Option<Bytes> {
    let mut map = memmap2::MmapOptions::new()
        .len(length)
        .populate()
        .map_anon()
        .ok()?;
    let mut at = 0;
    for piece in pieces {
        map[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    }
    Some(Bytes::from_owner(map.make_read_only().ok()?))
}

/// The links every Change List of `channel` carries: up to its Capability List, and to its
/// Change List Archive.
pub fn change_list_links(urls: &Urls, channel: &str) -> Vec<DocLink> {
    vec![
        DocLink::new("up", urls.capability_list(channel)),
        DocLink::new("archives", urls.archive(channel)),
    ]
}

/// A closed Change List: the changes `first..=last`, all of them at or before the newest seq,
/// so its bytes never change (`from` and `until` are the datetimes of its first and last
/// change). The archive lists the closed lists of [`Lists`]; any other range of at most
/// [`MAX_LIST`] closed changes is served the same way. `before_render` runs once the range
/// is known to be a retained closed list, before its bytes are put together (a cache makes
/// room there, so that a request for a range that is not one changes nothing).
pub async fn closed_list(
    log: Log<'_>,
    first: u64,
    last: u64,
    before_render: impl FnOnce(),
) -> Result<Bytes, CatchupError> {
    let Log { store, channel, .. } = log;
    if first == 0 || last < first || last - first >= MAX_LIST as u64 {
        return Err(CatchupError::NotFound(format!(
            "{first}-{last} is not a Change List of this hub: closed lists are FIRST-LAST with \
             1 <= FIRST <= LAST and at most {MAX_LIST} changes"
        )));
    }
    let head = store.head(channel).await?;
    if last > head.last {
        return Err(CatchupError::NotFound(format!(
            "{first}-{last} is not closed: the newest seq of the channel is {}",
            head.last
        )));
    }
    let gone = CatchupError::Gone {
        after: first - 1,
        oldest: head.oldest,
    };
    if first < head.oldest {
        return Err(gone);
    }
    before_render();
    let Some(parts) = entries(log, &head, first, last).await? else {
        return Err(gone); // trimmed meanwhile
    };
    let header = log.header(
        Some((first, last)),
        parts.first().map(|p| p.from),
        parts.last().map(|p| p.until),
        None,
    );
    Ok(joined(&header, parts))
}

/// Closed Change Lists per Change List Archive document; beyond that the archive becomes an
/// archive index whose page P lists the closed lists ((P−1)·ARCHIVE_PAGE, P·ARCHIVE_PAGE].
pub const ARCHIVE_PAGE: u64 = 1_000;

/// The Change List Archive of `channel`: one entry per retained closed list, oldest first —
/// or, when there are more than [`ARCHIVE_PAGE`], an archive index of pages. `page` asks for
/// one page of that index.
pub async fn archive(log: Log<'_>, page: Option<u64>) -> Result<Vec<u8>, CatchupError> {
    let Log {
        store,
        urls,
        channel,
        lists,
        origin,
        ..
    } = log;
    let head = store.head(channel).await?;
    let last_list = lists.closed_upto(head.last) / lists.size;
    let first_list = lists.list_of(head.oldest);
    let page_of = |k: u64| (k - 1) / ARCHIVE_PAGE + 1;
    let up = DocLink::new("up", urls.capability_list(channel));
    let mut header = ChangeListHeader {
        epoch: Some(origin.epoch.clone()),
        links: vec![up],
        ..ChangeListHeader::default()
    };
    let (from_list, to_list) = match page {
        Some(p) => {
            if last_list < first_list || p < page_of(first_list) || p > page_of(last_list) {
                return Err(CatchupError::NotFound(format!(
                    "the Change List Archive of {channel:?} has no page {p}"
                )));
            }
            header
                .links
                .push(DocLink::new("index", urls.archive(channel)));
            let (a, b) = ((p - 1) * ARCHIVE_PAGE + 1, p * ARCHIVE_PAGE);
            (a.max(first_list), b.min(last_list))
        }
        None if last_list >= first_list && last_list - first_list >= ARCHIVE_PAGE => {
            let mut pages = Vec::new();
            for p in page_of(first_list)..=page_of(last_list) {
                let (a, b) = ((p - 1) * ARCHIVE_PAGE + 1, p * ARCHIVE_PAGE);
                let (first, _) = bounds(lists, a.max(first_list), head);
                let (_, last) = bounds(lists, b.min(last_list), head);
                pages.push(IndexEntry {
                    loc: urls.archive_page(channel, p),
                    from: datetime_of(store, channel, first).await?,
                    until: datetime_of(store, channel, last).await?,
                });
            }
            header.seq_range = Some((head.oldest, lists.closed_upto(head.last)));
            return Ok(resourcesync::write_change_list_archive_index(
                &header, &pages,
            ));
        }
        None => (first_list, last_list),
    };
    let mut entries = Vec::new();
    for k in from_list..=to_list {
        if k > last_list || k < first_list {
            break;
        }
        let (first, last) = bounds(lists, k, head);
        entries.push(IndexEntry {
            loc: urls.closed_list(channel, first, last),
            from: datetime_of(store, channel, first).await?,
            until: datetime_of(store, channel, last).await?,
        });
    }
    if from_list <= to_list && to_list <= last_list {
        header.seq_range = Some((
            bounds(lists, from_list, head).0,
            bounds(lists, to_list, head).1,
        ));
    }
    Ok(resourcesync::write_change_list_archive(&header, &entries))
}

/// The retained seqs of closed list `k`: all of it, or for a list that retention cut before
/// lists were closed, its retained end.
fn bounds(lists: Lists, k: u64, head: ChannelHead) -> (u64, u64) {
    let (first, last) = lists.range(k);
    (first.max(head.oldest), last)
}

/// The datetime of change `seq`, if retained.
async fn datetime_of(
    store: &dyn Store,
    channel: &str,
    seq: u64,
) -> Result<Option<OffsetDateTime>, StoreError> {
    Ok(store
        .read(channel, seq.saturating_sub(1), 1)
        .await?
        .into_iter()
        .find(|c| c.seq == seq)
        .map(|c| c.datetime))
}

/// One page of `changes?after=`.
#[derive(Debug)]
pub struct Page {
    /// The document in pieces, to be sent one after another (see
    /// [`resourcesync::write_change_list_pieces`]).
    pub body: Vec<bytes::Bytes>,
    /// The next page, while more changes remain.
    pub next: Option<String>,
}

/// The changes of `channel` after seq `after`, at most `limit`.
pub async fn changes_after(
    log: Log<'_>,
    after: u64,
    limit: usize,
    epoch: Option<&str>,
) -> Result<Page, CatchupError> {
    let Log {
        store,
        urls,
        channel,
        origin,
        ..
    } = log;
    let head = store.head(channel).await?;
    let not_this_log = |reason: String| CatchupError::NotThisLog {
        reason,
        last: head.last,
        epoch: origin.epoch.clone(),
    };
    if let Some(epoch) = epoch.filter(|e| *e != origin.epoch) {
        return Err(not_this_log(format!(
            "the cursor is of epoch {epoch}, but this log's epoch is {}: the log was started \
             again, so start again from its beginning",
            origin.epoch
        )));
    }
    if after > head.last {
        return Err(not_this_log(format!(
            "after ({after}) is beyond the newest seq ({}) of this log (epoch {}): the log was \
             started again, or the seq is of another channel or hub",
            head.last, origin.epoch
        )));
    }
    if after.saturating_add(1) < head.oldest {
        return Err(CatchupError::Gone {
            after,
            oldest: head.oldest,
        });
    }
    let end = after.saturating_add(limit as u64).min(head.last);
    let Some(parts) = entries(log, &head, after + 1, end).await? else {
        // Trimmed since the head was read.
        let oldest = store.head(channel).await?.oldest;
        return Err(CatchupError::Gone { after, oldest });
    };
    // The last seq of the page.
    let last = end;
    let next = (last < head.last).then(|| urls.changes_after(channel, last, limit));
    let header = log.header(
        (last > after).then_some((after + 1, last)),
        parts.first().map(|p| p.from),
        parts.last().map(|p| p.until),
        next.as_ref().map(|n| DocLink::new("next", n.clone())),
    );
    Ok(Page {
        body: resourcesync::write_change_list_pieces(
            &header,
            parts.into_iter().map(|p| p.bytes).collect(),
        ),
        next,
    })
}

/// The rendered entries of seqs `first..=end` (none when `end < first`), block by block (see
/// [`page_entries`]): what every Change List document of the log is made of. `None` when the
/// log was trimmed meanwhile. The caller checked that `first` is retained.
async fn entries(
    log: Log<'_>,
    head: &ChannelHead,
    first: u64,
    end: u64,
) -> Result<Option<Vec<pages::Entries>>, CatchupError> {
    let mut parts = Vec::new();
    let mut seq = first;
    while seq <= end {
        let Some(part) = page_entries(log, head, seq, end).await? else {
            return Ok(None);
        };
        seq = part.last + 1;
        parts.push(part);
    }
    Ok(Some(parts))
}

/// The rendered entries `seq..=` `end` or up to the end of the block holding `seq`: from
/// memory; else from the block's file; else read from the store and rendered (the block is
/// kept when complete). A block that is not complete is read only up to `end`. `None` when
/// the log was trimmed meanwhile. The caller checked that `seq` is retained: neither tier of
/// the cache knows about retention.
async fn page_entries(
    log: Log<'_>,
    head: &ChannelHead,
    seq: u64,
    end: u64,
) -> Result<Option<pages::Entries>, CatchupError> {
    let Log {
        store,
        channel,
        origin,
        pages,
        ..
    } = log;
    let number = (seq - 1) / pages::BLOCK;
    let first = number * pages::BLOCK + 1;
    let last = first + pages::BLOCK - 1;
    let upto = end.min(last);
    if let Some(found) = pages.get(channel, &origin.epoch, number) {
        return Ok(found.entries(seq..=upto));
    }
    if let Some(found) = pages
        .read(channel, &origin.epoch, number, seq..upto + 1)
        .await
    {
        return Ok(Some(found));
    }
    let complete = first >= head.oldest && last <= head.last;
    let from = if complete { first } else { seq };
    let to = if complete { last } else { upto };
    let changes = store
        .read(channel, from - 1, (to - from + 1) as usize)
        .await?;
    if changes.is_empty() {
        return Ok(None);
    }
    let block = pages::Block::render(&changes).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "the log of {channel} has a gap between seqs {from} and {to}"
        ))
    })?;
    let block = Arc::new(block);
    if complete {
        pages.keep(channel, &origin.epoch, number, block.clone());
    }
    Ok(block.entries(seq..=upto))
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
pub async fn resource_list(log: Log<'_>) -> Result<Snapshot, StoreError> {
    let Log {
        store,
        urls,
        channel,
        origin,
        ..
    } = log;
    let at = OffsetDateTime::now_utc();
    let up = DocLink::new("up", urls.capability_list(channel));
    if store.resource_count(channel).await? <= MAX_RESOURCES as u64 {
        let (resources, seq) = listed(store, channel, 0, None, usize::MAX)
            .await?
            .unwrap_or_default();
        let header = ResourceListHeader {
            epoch: Some(origin.epoch.clone()),
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
        epoch: Some(origin.epoch.clone()),
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
    log: Log<'_>,
    after: u64,
    upto: Option<u64>,
) -> Result<Snapshot, CatchupError> {
    let Log {
        store,
        urls,
        channel,
        origin,
        ..
    } = log;
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
        epoch: Some(origin.epoch.clone()),
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

/// The rel of the link to a channel's XMPP PubSub node (an `xmpp:` URI naming the node), in
/// the Capability List and the topic's `Link` header.
pub const XMPP_REL: &str = "notification";

/// The Capability List of `channel`; `xmpp_node` is the `xmpp:` URI of its PubSub node when
/// the XMPP bridge publishes it.
pub fn capability_list(
    urls: &Urls,
    channel: &str,
    xmpp_node: Option<&str>,
    dumps: bool,
) -> Vec<u8> {
    let mut links = vec![
        DocLink::new("up", urls.source_description()),
        DocLink::new("hub", urls.hub()),
    ];
    links.extend(xmpp_node.map(|uri| DocLink::new(XMPP_REL, uri)));
    let mut caps = vec![
        Capability {
            loc: urls.topic(channel),
            capability: "changelist".into(),
        },
        Capability {
            loc: urls.archive(channel),
            capability: "changelist-archive".into(),
        },
        Capability {
            loc: urls.resource_list(channel),
            capability: "resourcelist".into(),
        },
    ];
    if dumps {
        caps.push(Capability {
            loc: urls.change_dump(channel),
            capability: "changedump".into(),
        });
    }
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

/// Most items in one FeedSync collection document.
pub const MAX_COLLECTION: usize = 10_000;

/// The FeedSync collection of `channel`: the items of the resources whose latest change is
/// after seq `since` (0: the complete collection), at most [`MAX_COLLECTION`] of them, in seq
/// order. Its `until` is the channel's newest seq, or the seq of the last item when more
/// remain (read on with `since` = that `until`).
pub async fn feedsync_collection(
    store: &dyn Store,
    channel: &str,
    since: u64,
) -> Result<feedsync::Collection, StoreError> {
    let page = store.sync_items(channel, since, MAX_COLLECTION).await?;
    let until = match page.items.last() {
        Some(last) if page.items.len() == MAX_COLLECTION => last.change.seq,
        _ => page.last.max(since),
    };
    let items = page
        .items
        .iter()
        .map(|synced| feedsync::Entry {
            seq: synced.change.seq,
            item: crate::model::feedsync::Item::of(synced),
        })
        .collect();
    Ok(feedsync::Collection {
        since,
        until,
        items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(first: u64, bytes: Vec<u8>) -> pages::Entries {
        let at = OffsetDateTime::UNIX_EPOCH;
        pages::Entries {
            first,
            last: first,
            bytes: Bytes::from(bytes),
            from: at,
            until: at,
        }
    }

    /// A document of OWN_MAPPING bytes or more is its pieces byte for byte, in a mapping of
    /// its own (page-aligned, which blocks from malloc's heaps are not); a small one is its
    /// pieces too.
    #[test]
    fn a_large_document_is_its_pieces_in_a_mapping_of_its_own() {
        let header = ChangeListHeader {
            from: Some(OffsetDateTime::UNIX_EPOCH),
            until: Some(OffsetDateTime::UNIX_EPOCH),
            links: vec![DocLink::new("up", "http://hub.test/capabilitylist.xml")],
            seq_range: Some((1, 3)),
            epoch: Some("e".into()),
        };
        let big: Vec<Vec<u8>> = (0..3u8)
            .map(|k| {
                (0..OWN_MAPPING / 2)
                    .map(|i| b'a' + ((i + k as usize) % 26) as u8)
                    .collect()
            })
            .collect();
        let parts = || {
            big.iter()
                .enumerate()
                .map(|(k, b)| entries(k as u64 + 1, b.clone()))
                .collect::<Vec<_>>()
        };
        let expected = resourcesync::write_change_list_pieces(
            &header,
            parts().into_iter().map(|p| p.bytes).collect(),
        )
        .concat();
        let document = joined(&header, parts());
        assert!(document.len() >= OWN_MAPPING);
        assert_eq!(&document[..], &expected[..]);
        assert_eq!(
            document.as_ptr() as usize % 4096,
            0,
            "not in a mapping of its own"
        );

        let small = joined(&header, vec![entries(1, b"<url/>".to_vec())]);
        let expected =
            resourcesync::write_change_list_pieces(&header, vec![Bytes::from_static(b"<url/>")])
                .concat();
        assert_eq!(&small[..], &expected[..]);
    }
}
