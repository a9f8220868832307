//! ResourceSync documents: the model, a fast writer and a hardened parser. No HTTP here.
//!
//! The hub speaks these ResourceSync documents (ANSI/NISO Z39.99-2014, with the `datetime`
//! attribute of the 1.1 revision, and the ResourceSync Archives specification):
//!
//! | document | root | top-level `<rs:md capability=…>` | writer | parsed as |
//! |---|---|---|---|---|
//! | Change List (and every notification) | `<urlset>` | `changelist` | [`write_change_list`] | [`Document::ChangeList`] |
//! | Change List Index (of an external source) | `<sitemapindex>` | `changelist` | [`write_change_list_index`] | [`Document::ChangeListIndex`] |
//! | Change List Archive (and its index) | `<urlset>` (`<sitemapindex>`) | `changelist-archive` | [`write_change_list_archive`] ([`write_change_list_archive_index`]) | — |
//! | Resource List (and its index) | `<urlset>` (`<sitemapindex>`) | `resourcelist` | [`write_resource_list`] ([`write_resource_list_index`]) | [`Document::ResourceList`] ([`Document::ResourceListIndex`]) |
//! | Capability List | `<urlset>` | `capabilitylist` | [`write_capability_list`] | [`Document::CapabilityList`] |
//! | Source Description | `<urlset>` | `description` | [`write_source_description`] | [`Document::SourceDescription`] |
//! | Change Dump (and its index) | `<urlset>` (`<sitemapindex>`) | `changedump` | [`write_change_dump`] ([`write_change_dump_index`]) | [`Document::ChangeDump`] ([`Document::ChangeDumpIndex`]) |
//! | Change Dump Manifest (`manifest.xml` in a dump) | `<urlset>` | `changedump-manifest` | [`write_change_dump_manifest`] | [`Document::ChangeDumpManifest`] |
//!
//! Layout of the module:
//! - `mod.rs` (this file): namespaces, the document model ([`ChangeListHeader`], [`DocLink`],
//!   [`IndexEntry`], [`Capability`], [`Document`], [`ParsedEntry`]), [`Limits`] and [`ParseError`].
//! - `write.rs`: the writers. Each renders straight into one pre-sized `Vec<u8>` (no DOM, no
//!   intermediate strings besides datetimes), so a 50,000-entry Change List takes a few
//!   milliseconds. Every text and attribute value is escaped (`& < > " '`, and `\t \n \r` as
//!   character references so they survive attribute normalisation); characters that XML 1.0
//!   cannot carry at all are replaced by U+FFFD, so the output is always well-formed whatever
//!   the model holds.
//! - `parse.rs`: [`parse_document`] and [`parse_change_list`] for untrusted input: a size limit
//!   checked before anything else, UTF-8 only, no DOCTYPE (hence no entity expansion), bounded
//!   nesting ([`MAX_DEPTH`]), entry count and value lengths, elements matched by namespace URI
//!   and local name (any prefix, default namespaces), unknown elements and attributes ignored.
//!   It never panics; every refusal is a typed [`ParseError`].
//! - `tests.rs`: golden files in `proto/examples/` (writing reproduces them byte for byte),
//!   round trips, documents from other producers, hostile inputs.
//!
//! Conventions shared by writer and parser:
//! - Entries are written in the order given, which is forward chronological order; the parser
//!   keeps document order.
//! - A change is written with both `<lastmod>` (ResourceSync 1.0 clients) and
//!   `<rs:md datetime=…>` (1.1 clients); `<lastmod>` is the resource's own modification time
//!   when known, else the change's datetime. Reading back, `datetime` comes from `rs:md` when
//!   present (then a `<lastmod>` that differs from it is the `lastmod`), else from `<lastmod>`.
//!   So `parse(write(c))` gives back `c` exactly.
//! - The hub's own data travels in attributes of [`HUB_NS`] (prefix `ch`): `ch:seq` on each
//!   entry's `rs:md`, `ch:first`/`ch:last` on the top-level `rs:md` of every Change List the
//!   hub writes (notifications, the topic, `changes?after=` pages).
//! - All datetimes are written by [`crate::model::format_datetime`] (RFC 3339, UTC, `Z`) and
//!   read by [`crate::model::parse_w3c_datetime`].
//! - Parsing checks structure, not content rules: callers run [`NewChange::validate`] on each
//!   parsed change before accepting it.

use time::OffsetDateTime;

use crate::model::{ChangeType, NewChange};

mod parse;
mod write;

#[cfg(test)]
mod tests;

pub use parse::{parse_change_list, parse_document};
pub use write::{
    write_capability_list, write_change_dump, write_change_dump_index, write_change_dump_manifest,
    write_change_entries, write_change_list, write_change_list_archive,
    write_change_list_archive_index, write_change_list_bounded, write_change_list_index,
    write_change_list_pieces, write_resource_list, write_resource_list_index,
    write_source_description, RenderedEntries,
};

/// The Sitemap namespace (`<urlset>`, `<sitemapindex>`, `<url>`, `<loc>`, `<lastmod>` …).
pub const SITEMAP_NS: &str = "http://www.sitemaps.org/schemas/sitemap/0.9";
/// The ResourceSync namespace (`<rs:md>`, `<rs:ln>`).
pub const RS_NS: &str = "http://www.openarchives.org/rs/terms/";
/// The hub's own namespace for seq attributes, prefix "ch".
pub const HUB_NS: &str = "https://changehub.dev/ns/1.0";

/// Deepest element nesting the parser accepts (the documents themselves need 3).
pub const MAX_DEPTH: usize = 16;

/// A document-level link: `<rs:ln rel="…" href="…"/>` as a child of the root element
/// (`up`, `index`, `self`, `next`, `hub`, `describedby` …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocLink {
    pub rel: String,
    pub href: String,
}

impl DocLink {
    pub fn new(rel: impl Into<String>, href: impl Into<String>) -> DocLink {
        DocLink {
            rel: rel.into(),
            href: href.into(),
        }
    }
}

/// The document-level part of a Change List or Change List Index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeListHeader {
    /// `from` of the top-level `rs:md`. The spec makes it mandatory: when `None`, the writer
    /// uses the first entry's datetime (`from` of the first index entry), and leaves it out
    /// only when there is no entry either.
    pub from: Option<OffsetDateTime>,
    /// `until` of the top-level `rs:md`; present means the list is closed.
    pub until: Option<OffsetDateTime>,
    /// Written as `<rs:ln>` right after the top-level `<rs:md>`, in this order.
    pub links: Vec<DocLink>,
    /// Written as `ch:first` / `ch:last` attributes on the top-level `rs:md`.
    pub seq_range: Option<(u64, u64)>,
    /// Written as `ch:epoch` on the top-level `rs:md`: the epoch of the log the seqs belong to.
    pub epoch: Option<String>,
}

/// The document-level part of a Resource List (or of its index): when the snapshot began and
/// ended, the links, and the seq it reflects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceListHeader {
    /// `at` of the top-level `rs:md`: when the hub began to list.
    pub at: OffsetDateTime,
    /// `completed`: when it finished.
    pub completed: Option<OffsetDateTime>,
    pub links: Vec<DocLink>,
    /// Written as `ch:seq`: every change up to this seq is reflected, so a destination goes on
    /// with the changes after it.
    pub seq: Option<u64>,
    /// Written as `ch:epoch`: the epoch of the log that seq belongs to.
    pub epoch: Option<String>,
}

/// One `<sitemap>` of a Change List Index: a Change List and the interval it covers
/// (`until` present exactly when that Change List is closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub loc: String,
    pub from: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
}

/// One `<url>` of a Capability List: the document `loc` offers `capability`
/// (`changelist`, `resourcelist`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub loc: String,
    pub capability: String,
}

/// One `<url>` of a Change Dump: a ZIP package of the bitstreams of the resources changed
/// in the period `from`..`until`, with a copy of its manifest at `contents`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpEntry {
    /// The package's URL.
    pub loc: String,
    /// When the package was made.
    pub lastmod: Option<OffsetDateTime>,
    /// `type` (`application/zip`).
    pub media_type: Option<String>,
    pub length: Option<u64>,
    pub hash: Option<String>,
    /// The period the package covers: the datetimes of its first and last change.
    pub from: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    /// `<rs:ln rel="contents">`: a copy of the package's `manifest.xml`.
    pub contents: Option<String>,
    /// `ch:first` / `ch:last`: the seqs of the channel's log the package covers.
    pub seq_range: Option<(u64, u64)>,
    /// `ch:skipped`: changes whose bitstream could not be included (fetch failed, too large,
    /// hash or length not as announced).
    pub skipped: Option<u64>,
}

/// One `<url>` of a Change Dump Manifest: a change and, unless it is a deletion, where its
/// bitstream is in the package (`path`, from the package's root, with a leading `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    pub loc: String,
    /// `<lastmod>`: the resource's own time when known, else the change's datetime.
    pub lastmod: OffsetDateTime,
    pub change: ChangeType,
    /// `rs:md datetime`: when the change happened.
    pub datetime: Option<OffsetDateTime>,
    pub hash: Option<String>,
    pub length: Option<u64>,
    pub media_type: Option<String>,
    pub path: Option<String>,
    /// `ch:seq`: the seq of the change in the channel's log.
    pub seq: Option<u64>,
}

/// How much untrusted input [`parse_document`] accepts.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest document, in bytes; checked before parsing starts.
    pub max_bytes: usize,
    /// Most `<url>` / `<sitemap>` entries.
    pub max_entries: usize,
}

impl Default for Limits {
    /// 8 MiB and 100,000 entries.
    fn default() -> Limits {
        Limits {
            max_bytes: 8 * 1024 * 1024,
            max_entries: 100_000,
        }
    }
}

/// A parsed ResourceSync document; the kind comes from the root element and the
/// `capability` of the top-level `rs:md`.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    ChangeList {
        header: ChangeListHeader,
        entries: Vec<ParsedEntry>,
    },
    ChangeListIndex {
        header: ChangeListHeader,
        entries: Vec<IndexEntry>,
    },
    CapabilityList {
        links: Vec<DocLink>,
        caps: Vec<Capability>,
    },
    SourceDescription {
        links: Vec<DocLink>,
        capability_lists: Vec<String>,
    },
    /// A Resource List: each resource read as a `created` change of it, its `ch:seq` the seq
    /// of the change that made it what it is.
    ResourceList {
        header: ResourceListHeader,
        entries: Vec<ParsedEntry>,
    },
    /// A Resource List Index: the pages, each a Resource List.
    ResourceListIndex {
        header: ResourceListHeader,
        pages: Vec<String>,
    },
    /// A Change Dump: the packages, in the order published.
    ChangeDump {
        header: ChangeListHeader,
        entries: Vec<DumpEntry>,
    },
    /// A Change Dump Index: Change Dumps and the periods they cover.
    ChangeDumpIndex {
        header: ChangeListHeader,
        entries: Vec<IndexEntry>,
    },
    /// A Change Dump Manifest (`manifest.xml` of a package).
    ChangeDumpManifest {
        header: ChangeListHeader,
        entries: Vec<ManifestEntry>,
    },
}

/// One change read from a Change List: the change as a source would send it, plus the hub's
/// `ch:seq` when the document came from a hub.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedEntry {
    pub seq: Option<u64>,
    pub change: NewChange,
}

/// Why a document was refused. `Display` gives a short reason fit for an HTTP 4xx body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("document is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("document is not UTF-8 (invalid byte at offset {offset})")]
    NotUtf8 { offset: usize },
    #[error("malformed XML: {0}")]
    Malformed(String),
    #[error("DOCTYPE declarations are not allowed")]
    Doctype,
    #[error("elements are nested deeper than {limit} levels")]
    TooDeep { limit: usize },
    #[error("more than {limit} entries")]
    TooManyEntries { limit: usize },
    #[error("root element is {0}, not a sitemap <urlset> or <sitemapindex>")]
    WrongRoot(String),
    #[error("no top-level <rs:md capability=\"…\"> before the first entry")]
    MissingCapability,
    #[error("capability {found:?} where {expected} was expected")]
    UnexpectedCapability { expected: String, found: String },
    #[error("this is a Change List Index (<sitemapindex>), not a Change List; read the Change Lists it points to")]
    ChangeListIndex,
    #[error("top-level <rs:md>/<rs:ln>: {0}")]
    Header(String),
    #[error("entry {index}: {reason}")]
    Entry { index: usize, reason: String },
}
