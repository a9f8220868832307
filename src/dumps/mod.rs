//! Change Dumps: ZIP packages of the resources a channel's changes name, fetched by the hub.
//!
//! Opt-in per channel ([`DumpSettings`] in its [`ChannelSpec`](crate::model::ChannelSpec)). One task per such channel,
//! on the instance that owns the channel ([`Ownership::owns`]), follows the channel's log:
//! when `every` changes are pending, or `interval` passed since the last dump and some are,
//! it cuts a dump of the seqs after the previous dump's last (at most `every` of them), so
//! that the periods are contiguous and never overlap:
//!
//! 1. reads the changes back from the log and keeps the last change of each `loc`;
//! 2. fetches the latest state of every created/updated resource ([`package`]: the hub's
//!    outbound client — no redirects, the private-address guard — bounded concurrency, size
//!    limits, `hash`/`length` checked when the change carries them, transient failures
//!    retried); a resource that cannot be had is left out and counted (`ch:skipped`);
//! 3. writes the ZIP (bitstreams under `changes/`, `manifest.xml` at the root) and a copy of
//!    the manifest into the dump folder, each to a temporary file renamed into place;
//! 4. appends one entry to the channel's internal dump channel ([`channel_name`]:
//!    `_dump-NAME`), with an idempotency key naming the seq range: that log *is* the list of
//!    dumps. Its ordinary batcher and delivery workers announce each new dump to the
//!    subscribers of the Change Dump's URL (rendered by [`render`] as a Change Dump
//!    document, not a Change List), with retries, signatures and redelivery;
//! 5. records how far it got with [`Store::put_bridge_cursor`] under the name [`BRIDGE`];
//! 6. applies retention: the dump channel's log is trimmed to `keep` entries, and files of
//!    dumps no longer listed (and temporary files) are deleted.
//!
//! Restarts: the position is the larger of the cursor and the range of the newest listed
//! dump, so a crash between steps 4 and 5 neither repeats nor loses a dump; a crash before
//! step 4 leaves at most files nobody lists, removed at the next retention pass.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::batcher::Feeds;
use crate::config::Config;
use crate::model::{
    format_datetime, parse_w3c_datetime, Change, ChangeType, DumpSettings, Link, NewChange,
    Retention,
};
use crate::ownership::Ownership;
use crate::resourcesync::{self, ChangeListHeader, DocLink, DumpEntry, IndexEntry};
use crate::store::{IdempotencyKey, Store, StoreError};

pub mod package;

/// Prefix of the internal channels that list a channel's dumps (not a valid channel name).
pub const CHANNEL_PREFIX: &str = "_dump-";

/// The bridge cursor name under which the position of a channel's dumps is kept.
pub const BRIDGE: &str = "changedump";

/// Media type of a dump package.
pub const ZIP_TYPE: &str = "application/zip";

/// The internal channel listing the dumps of `channel`.
pub fn channel_name(channel: &str) -> String {
    format!("{CHANNEL_PREFIX}{channel}")
}

/// The hosted channel whose dumps the internal channel `internal` lists.
pub fn source_of(internal: &str) -> Option<&str> {
    internal.strip_prefix(CHANNEL_PREFIX)
}

/// Where the files of `channel`'s dumps are.
pub fn folder(dir: &Path, channel: &str) -> PathBuf {
    dir.join(channel)
}

/// The file name of the package of the seqs `first..=last`.
pub fn package_file(first: u64, last: u64) -> String {
    format!("{first}-{last}.zip")
}

/// The file name of the copy of that package's manifest.
pub fn manifest_file(first: u64, last: u64) -> String {
    format!("{first}-{last}.manifest.xml")
}

/// Why a dump could not be made (it is tried again later).
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("dump files: {0}")]
    Io(#[from] std::io::Error),
    #[error("zip: {0}")]
    Zip(String),
}

// -------------------------------------------------------------------------------------------
// The dump channel's log entries and the documents made from them

/// What one entry of a dump channel's log records (as the `contents` link's attributes:
/// the log holds ordinary changes).
fn dump_change(
    config: &Config,
    channel: &str,
    made: &package::Made,
    from: OffsetDateTime,
    until: OffsetDateTime,
) -> NewChange {
    let (first, last) = made.range;
    let mut attrs = BTreeMap::new();
    attrs.insert("type".to_string(), "application/xml".to_string());
    attrs.insert("first".to_string(), first.to_string());
    attrs.insert("last".to_string(), last.to_string());
    attrs.insert("from".to_string(), format_datetime(from));
    attrs.insert("until".to_string(), format_datetime(until));
    attrs.insert("skipped".to_string(), made.skipped.to_string());
    NewChange {
        loc: config.urls.dump_package(channel, first, last),
        change: ChangeType::Created,
        datetime: None,
        lastmod: None,
        hash: Some(made.hash.clone()),
        length: Some(made.length),
        media_type: Some(ZIP_TYPE.into()),
        links: vec![Link {
            rel: "contents".into(),
            href: config.urls.dump_manifest(channel, first, last),
            attrs,
        }],
        source: None,
    }
}

/// The dump an entry of the dump channel's log describes (`None`: not one of the hub's).
/// URLs are built from the current public URL and the seq range.
pub fn entry_of(config: &Config, channel: &str, change: &Change) -> Option<DumpEntry> {
    let link = change.links.iter().find(|l| l.rel == "contents")?;
    let first: u64 = link.attrs.get("first")?.parse().ok()?;
    let last: u64 = link.attrs.get("last")?.parse().ok()?;
    let time = |name: &str| {
        link.attrs
            .get(name)
            .and_then(|v| parse_w3c_datetime(v).ok())
    };
    Some(DumpEntry {
        loc: config.urls.dump_package(channel, first, last),
        lastmod: Some(change.datetime),
        media_type: Some(ZIP_TYPE.into()),
        length: change.length,
        hash: change.hash.clone(),
        from: time("from"),
        until: time("until"),
        contents: Some(config.urls.dump_manifest(channel, first, last)),
        seq_range: Some((first, last)),
        skipped: link
            .attrs
            .get("skipped")
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0),
    })
}

/// The links every Change Dump document of `channel` carries.
fn dump_links(config: &Config, channel: &str) -> Vec<DocLink> {
    vec![
        DocLink::new("up", config.urls.capability_list(channel)),
        DocLink::new("hub", config.urls.hub()),
        DocLink::new("self", config.urls.change_dump(channel)),
    ]
}

/// The body of a notification of the dump channel `internal`: a Change Dump document that
/// lists the dumps of `changes`, with `ch:first`/`ch:last` the seqs of the dump channel
/// (the delivery's range) and the epoch of its log.
pub fn render(config: &Config, internal: &str, epoch: &str, changes: &[Change]) -> Vec<u8> {
    let channel = source_of(internal).unwrap_or(internal);
    let entries: Vec<DumpEntry> = changes
        .iter()
        .filter_map(|c| entry_of(config, channel, c))
        .collect();
    let header = ChangeListHeader {
        from: entries.first().and_then(|e| e.from),
        until: None,
        links: dump_links(config, channel),
        seq_range: match (changes.first(), changes.last()) {
            (Some(f), Some(l)) => Some((f.seq, l.seq)),
            _ => None,
        },
        epoch: Some(epoch.to_string()),
    };
    resourcesync::write_change_dump(&header, &entries)
}

/// Most entries of a dump channel read for one document.
const MAX_READ: usize = 100_000;

/// `GET /channels/NAME/changedump.xml` (`page` `None`) and its pages: the Change Dump of
/// `channel` when it lists at most `per_document` dumps, else a Change Dump Index whose
/// page k holds the dumps of the dump channel's seqs ((k−1)·per_document, k·per_document].
/// `None` for a page that does not exist.
pub async fn document(
    config: &Config,
    store: &dyn Store,
    channel: &str,
    per_document: u64,
    page: Option<u64>,
) -> Result<Option<Vec<u8>>, StoreError> {
    let internal = channel_name(channel);
    let head = store.head(&internal).await?;
    let changes = if head.last >= head.oldest {
        store
            .read(
                &internal,
                head.oldest - 1,
                ((head.last - head.oldest + 1) as usize).min(MAX_READ),
            )
            .await?
    } else {
        Vec::new()
    };
    let per = per_document.max(1);
    let page_of = |seq: u64| (seq - 1) / per + 1;
    let mut pages: BTreeMap<u64, Vec<DumpEntry>> = BTreeMap::new();
    for c in &changes {
        if let Some(e) = entry_of(config, channel, c) {
            pages.entry(page_of(c.seq)).or_default().push(e);
        }
    }
    let mut links = dump_links(config, channel);
    match page {
        None if pages.len() <= 1 => {
            let entries = pages.into_values().next().unwrap_or_default();
            // `from` is mandatory: without a dump yet, when the channel began.
            let from = match entries.first().and_then(|e| e.from) {
                Some(from) => from,
                None => {
                    store
                        .origin(channel, OffsetDateTime::now_utc())
                        .await?
                        .created
                }
            };
            let header = ChangeListHeader {
                from: Some(from),
                links,
                ..ChangeListHeader::default()
            };
            Ok(Some(resourcesync::write_change_dump(&header, &entries)))
        }
        None => {
            let last_page = pages.keys().next_back().copied();
            let index: Vec<IndexEntry> = pages
                .iter()
                .map(|(k, entries)| IndexEntry {
                    loc: config.urls.change_dump_page(channel, *k),
                    from: entries.first().and_then(|e| e.from),
                    // The newest page is still open.
                    until: if Some(*k) == last_page {
                        None
                    } else {
                        entries.last().and_then(|e| e.until)
                    },
                })
                .collect();
            links.retain(|l| l.rel != "hub");
            let header = ChangeListHeader {
                from: index.first().and_then(|e| e.from),
                links,
                ..ChangeListHeader::default()
            };
            Ok(Some(resourcesync::write_change_dump_index(&header, &index)))
        }
        Some(k) => {
            let Some(entries) = pages.remove(&k) else {
                return Ok(None);
            };
            links.retain(|l| l.rel != "self");
            links.push(DocLink::new("index", config.urls.change_dump(channel)));
            let header = ChangeListHeader {
                from: entries.first().and_then(|e| e.from),
                links,
                ..ChangeListHeader::default()
            };
            Ok(Some(resourcesync::write_change_dump(&header, &entries)))
        }
    }
}

/// The path of a dump file of `channel` named `file` (`FIRST-LAST.zip` or
/// `FIRST-LAST.manifest.xml`), when the name is one and the dump is listed.
pub async fn listed_file(
    config: &Config,
    store: &dyn Store,
    channel: &str,
    file: &str,
) -> Result<Option<(PathBuf, &'static str)>, StoreError> {
    let Some(dir) = &config.dump_dir else {
        return Ok(None);
    };
    let (range, media_type) = if let Some(r) = file.strip_suffix(".zip") {
        (r, ZIP_TYPE)
    } else if let Some(r) = file.strip_suffix(".manifest.xml") {
        (r, "application/xml")
    } else {
        return Ok(None);
    };
    let Some((first, last)) = range
        .split_once('-')
        .and_then(|(f, l)| Some((f.parse::<u64>().ok()?, l.parse::<u64>().ok()?)))
    else {
        return Ok(None);
    };
    // Only what the list holds is served (a file being written or removed is not).
    let loc = config.urls.dump_package(channel, first, last);
    let internal = channel_name(channel);
    let head = store.head(&internal).await?;
    if head.last < head.oldest {
        return Ok(None);
    }
    let changes = store
        .read(
            &internal,
            head.oldest - 1,
            ((head.last - head.oldest + 1) as usize).min(MAX_READ),
        )
        .await?;
    let listed = changes
        .iter()
        .any(|c| entry_of(config, channel, c).is_some_and(|e| e.loc == loc));
    if !listed {
        return Ok(None);
    }
    let name = if media_type == ZIP_TYPE {
        package_file(first, last)
    } else {
        manifest_file(first, last)
    };
    Ok(Some((folder(dir, channel).join(name), media_type)))
}

// -------------------------------------------------------------------------------------------
// The task that makes a channel's dumps

/// What the dump task of a channel needs.
pub struct Dumper {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub feeds: Feeds,
    pub ownership: Arc<Ownership>,
    /// The outbound client (no redirects, the private-address guard), with a timeout fit for
    /// large resources.
    pub client: reqwest::Client,
    pub channel: String,
}

/// Pause after a failed dump before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

impl Dumper {
    /// The settings of the channel now (`None`: removed, or dumps turned off).
    fn settings(&self) -> Option<DumpSettings> {
        self.feeds.spec(&self.channel).and_then(|s| s.dumps)
    }

    /// How far the dumps got: the larger of the cursor and the newest listed dump's last seq;
    /// and when the newest dump was made.
    async fn position(&self) -> Result<(u64, Option<OffsetDateTime>), StoreError> {
        let cursor = self
            .store
            .bridge_cursor(&self.channel, BRIDGE)
            .await?
            .unwrap_or(0);
        let internal = channel_name(&self.channel);
        let head = self.store.head(&internal).await?;
        if head.last == 0 {
            return Ok((cursor, None));
        }
        let newest = self.store.read(&internal, head.last - 1, 1).await?;
        let listed = newest
            .first()
            .and_then(|c| Some((entry_of(&self.config, &self.channel, c)?, c.datetime)));
        Ok(match listed {
            Some((entry, made)) => (cursor.max(entry.seq_range.map_or(0, |r| r.1)), Some(made)),
            None => (cursor, None),
        })
    }

    /// Runs until `stop`, or until the channel is removed or its dumps turned off.
    pub async fn run(self, stop: CancellationToken) {
        let started = OffsetDateTime::now_utc();
        let mut head_rx = self.store.watch_head(&self.channel);
        // The position, read from the store when this instance does not own the channel, after
        // each dump, failure or timed wait — not at every move of the head: while it owns the
        // channel, this instance alone makes its dumps. (Should another instance have made one
        // in between all the same, the dump's idempotency key keeps it listed once.)
        let mut known = None;
        loop {
            let Some(settings) = self.settings() else {
                tracing::info!(channel = %self.channel, "Change Dumps stopped");
                return;
            };
            let mut wait = Duration::from_secs(1);
            if !self.ownership.owns(&self.channel) {
                known = None;
            } else {
                let head = *head_rx.borrow_and_update();
                match self.step(&settings, started, head, &mut known).await {
                    Ok(Some(next)) => wait = next,
                    Ok(None) => {
                        known = None;
                        continue;
                    }
                    Err(e) => {
                        known = None;
                        tracing::warn!(channel = %self.channel, error = %e, "cannot make a Change Dump; trying again");
                        wait = RETRY_AFTER;
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = head_rx.changed() => {
                    if changed.is_err() {
                        // The store is going away: no more news from it, only the clock.
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                }
                _ = tokio::time::sleep(wait) => known = None,
            }
        }
    }

    /// Makes a dump when one is due: `Ok(None)` after a dump (look again at once), else how
    /// long to wait at most.
    async fn step(
        &self,
        settings: &DumpSettings,
        started: OffsetDateTime,
        head: u64,
        known: &mut Option<(u64, Option<OffsetDateTime>)>,
    ) -> Result<Option<Duration>, DumpError> {
        let (after, last_made) = match *known {
            Some(position) => position,
            None => *known.insert(self.position().await?),
        };
        let pending = head.saturating_sub(after);
        if pending == 0 {
            return Ok(Some(Duration::from_secs(60)));
        }
        let since = last_made.unwrap_or(started);
        let now = OffsetDateTime::now_utc();
        let due_at = settings.interval.map(|i| since + i);
        let due = pending >= settings.every || due_at.is_some_and(|at| now >= at);
        if !due {
            let wait = due_at
                .map(|at| Duration::try_from(at - now).unwrap_or_default())
                .unwrap_or(Duration::from_secs(60));
            return Ok(Some(
                wait.clamp(Duration::from_millis(50), Duration::from_secs(60)),
            ));
        }
        let upto = head.min(after + settings.every);
        self.make(settings, after, upto).await?;
        Ok(None)
    }

    /// Makes the dump of the seqs after `after` up to `upto`, lists it, moves the cursor and
    /// applies retention.
    async fn make(&self, settings: &DumpSettings, after: u64, upto: u64) -> Result<(), DumpError> {
        let Some(dir) = self.config.dump_dir.clone() else {
            return Err(DumpError::Io(std::io::Error::other(
                "no dump folder configured",
            )));
        };
        let changes = self
            .store
            .read(&self.channel, after, (upto - after) as usize)
            .await?;
        let (Some(first), Some(last)) = (changes.first(), changes.last()) else {
            // Trimmed away before it could be dumped.
            self.store
                .put_bridge_cursor(&self.channel, BRIDGE, upto)
                .await?;
            return Ok(());
        };
        let (from, until) = (first.datetime, last.datetime);
        let range = (first.seq, last.seq);
        let folder = folder(&dir, &self.channel);
        let made = package::make(
            &self.client,
            &self.config,
            &self.channel,
            settings,
            &folder,
            range,
            &changes,
        )
        .await?;
        let change = dump_change(&self.config, &self.channel, &made, from, until);
        let key = format!("dump-{}-{}", range.0, range.1);
        let appended = self
            .store
            .append(
                &channel_name(&self.channel),
                vec![change],
                Some(IdempotencyKey {
                    key: key.clone(),
                    fingerprint: key,
                }),
                OffsetDateTime::now_utc(),
            )
            .await?;
        self.store
            .put_bridge_cursor(&self.channel, BRIDGE, range.1)
            .await?;
        metrics::counter!("changehub_dumps_total", "channel" => self.channel.clone()).increment(1);
        metrics::counter!("changehub_dump_skipped_total", "channel" => self.channel.clone())
            .increment(made.skipped);
        tracing::info!(channel = %self.channel, first = range.0, last = range.1,
            resources = made.resources, skipped = made.skipped, bytes = made.length,
            seq = appended.last, "Change Dump published");
        self.retain(settings, &folder).await
    }

    /// Trims the list to `keep` dumps and deletes the files of dumps it no longer holds.
    async fn retain(&self, settings: &DumpSettings, folder: &Path) -> Result<(), DumpError> {
        let internal = channel_name(&self.channel);
        self.store
            .trim(
                &internal,
                Retention {
                    max_changes: settings.keep,
                    max_age: None,
                    list_size: 1,
                },
                OffsetDateTime::now_utc(),
            )
            .await?;
        let head = self.store.head(&internal).await?;
        let listed = if head.last >= head.oldest {
            self.store
                .read(
                    &internal,
                    head.oldest - 1,
                    ((head.last - head.oldest + 1) as usize).min(MAX_READ),
                )
                .await?
        } else {
            Vec::new()
        };
        let mut keep = HashSet::new();
        for c in &listed {
            if let Some((first, last)) =
                entry_of(&self.config, &self.channel, c).and_then(|e| e.seq_range)
            {
                keep.insert(package_file(first, last));
                keep.insert(manifest_file(first, last));
            }
        }
        let folder = folder.to_path_buf();
        let removed = tokio::task::spawn_blocking(move || package::remove_unlisted(&folder, &keep))
            .await
            .map_err(|e| DumpError::Io(std::io::Error::other(e.to_string())))??;
        if removed > 0 {
            tracing::debug!(channel = %self.channel, removed, "old Change Dump files removed");
        }
        Ok(())
    }
}
