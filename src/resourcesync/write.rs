//! The writers: each document is rendered straight into one pre-sized `Vec<u8>`.
//!
//! Layout of every document (two-space indentation, one element per line):
//!
//! ```text
//! <?xml version="1.0" encoding="UTF-8"?>
//! <urlset xmlns="…sitemap…" xmlns:rs="…rs…" xmlns:ch="…hub…">
//!   <rs:md capability="…" …/>
//!   <rs:ln rel="…" href="…"/>
//!   <url>
//!     <loc>…</loc>
//!     …
//!   </url>
//! </urlset>
//! ```

use bytes::Bytes;
use time::OffsetDateTime;

use super::{
    Capability, ChangeListHeader, DocLink, DumpEntry, IndexEntry, ManifestEntry,
    ResourceListHeader, HUB_NS, RS_NS, SITEMAP_NS,
};
use crate::model::{format_datetime, write_datetime, Change, Link};

const XML_DECL: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";

/// Renders a Change List (`<urlset>`, `<rs:md capability="changelist" from=.. [until=..]>`),
/// entries in the order given (which must be forward chronological order).
///
/// Each change becomes `<url>` with `<loc>`, `<lastmod>` (its `lastmod`, else its
/// `datetime`), `<rs:md change datetime [hash] [length] [type] ch:seq/>` and one `<rs:ln>` per
/// link (`rel`, `href`, then the link's other attributes in name order).
pub fn write_change_list(header: &ChangeListHeader, changes: &[Change]) -> Vec<u8> {
    change_list(header, changes, None)
}

/// [`write_change_list`], with where its `<url>` entries are: entry `i` is
/// `bounds[i]..bounds[i + 1]` of the document, the same bytes [`write_change_entries`]
/// renders for the change. No bounds (empty) for a document of 4 GiB or more.
pub fn write_change_list_bounded(
    header: &ChangeListHeader,
    changes: &[Change],
) -> (Vec<u8>, Vec<u32>) {
    let mut bounds = Vec::with_capacity(changes.len() + 1);
    let document = change_list(header, changes, Some(&mut bounds));
    if u32::try_from(document.len()).is_err() {
        bounds = Vec::new();
    }
    (document, bounds)
}

/// See [`write_change_list_bounded`]: `bounds`, when given, gets where each entry starts, and
/// where the last ends (offsets past `u32::MAX` are cut: the caller drops them).
fn change_list(
    header: &ChangeListHeader,
    changes: &[Change],
    mut bounds: Option<&mut Vec<u32>>,
) -> Vec<u8> {
    let estimate: usize = changes.iter().map(estimate_change).sum();
    let mut out = Out::with_capacity(512 + header_size(header) + estimate);
    out.open_root("urlset", true);
    let from = header.from.or_else(|| changes.first().map(|c| c.datetime));
    out.header_md("changelist", from, header);
    out.doc_links(&header.links);
    let mut bound = |out: &Out| {
        if let Some(bounds) = bounds.as_deref_mut() {
            bounds.push(out.buf.len() as u32);
        }
    };
    bound(&out);
    for change in changes {
        out.change(change);
        bound(&out);
    }
    out.raw("</urlset>\n");
    out.buf
}

/// The `<url>` entries of `changes`, rendered as [`write_change_list`] renders them, one
/// after another, with where each ends: a document built from them later
/// ([`write_change_list_pieces`]) is byte for byte the one `write_change_list` would render.
#[derive(Debug, Default)]
pub struct RenderedEntries {
    pub bytes: Vec<u8>,
    /// `ends[i]`: the offset in `bytes` just past entry `i`.
    pub ends: Vec<usize>,
}

impl RenderedEntries {
    /// Entries `range` (indices into the changes rendered), as one slice.
    pub fn slice(&self, range: std::ops::Range<usize>) -> &[u8] {
        if range.is_empty() {
            return &[];
        }
        let start = if range.start == 0 {
            0
        } else {
            self.ends[range.start - 1]
        };
        &self.bytes[start..self.ends[range.end - 1]]
    }
}

/// Renders the `<url>` entries of `changes` (see [`RenderedEntries`]).
pub fn write_change_entries(changes: &[Change]) -> RenderedEntries {
    let estimate: usize = changes.iter().map(estimate_change).sum();
    let mut out = Out {
        buf: Vec::with_capacity(estimate),
        last_datetime: None,
    };
    let mut ends = Vec::with_capacity(changes.len());
    for change in changes {
        out.change(change);
        ends.push(out.buf.len());
    }
    RenderedEntries {
        bytes: out.buf,
        ends,
    }
}

/// Renders a Change List from entries rendered before ([`write_change_entries`]), given in
/// order, as pieces to send one after another: its start, `entries` as they are (not copied
/// into one buffer), its end. `header.from` should be set (the first entry's datetime), as
/// the entries are not read again.
pub fn write_change_list_pieces(header: &ChangeListHeader, entries: Vec<Bytes>) -> Vec<Bytes> {
    let mut start = Out::with_capacity(512 + header_size(header));
    start.open_root("urlset", true);
    start.header_md("changelist", header.from, header);
    start.doc_links(&header.links);
    let mut pieces = Vec::with_capacity(entries.len() + 2);
    pieces.push(Bytes::from(start.buf));
    pieces.extend(entries);
    pieces.push(Bytes::from_static(b"</urlset>\n"));
    pieces
}

/// Renders a Change List Index (`<sitemapindex>`, `<rs:md capability="changelist" from=..
/// [until=..]>`), each `<sitemap>` with `<loc>` and `<rs:md from=.. [until=..]>` (the `rs:md`
/// is left out when an entry has neither).
pub fn write_change_list_index(header: &ChangeListHeader, entries: &[IndexEntry]) -> Vec<u8> {
    let from = header.from.or_else(|| entries.first().and_then(|e| e.from));
    write_lists(
        ("sitemapindex", "sitemap"),
        "changelist",
        from,
        header,
        entries,
    )
}

/// Renders a Change List Archive: `<urlset>`, `<rs:md capability="changelist-archive">`
/// (`from`/`until` only when the header has them), then one `<url>` per closed Change List
/// with `<loc>` and `<rs:md from=.. until=..>`, in the order given (chronological).
pub fn write_change_list_archive(header: &ChangeListHeader, lists: &[IndexEntry]) -> Vec<u8> {
    write_lists(
        ("urlset", "url"),
        "changelist-archive",
        header.from,
        header,
        lists,
    )
}

/// Renders a Change List Archive Index: the same as [`write_change_list_archive`] with a
/// `<sitemapindex>` root and one `<sitemap>` per archive page.
pub fn write_change_list_archive_index(header: &ChangeListHeader, pages: &[IndexEntry]) -> Vec<u8> {
    write_lists(
        ("sitemapindex", "sitemap"),
        "changelist-archive",
        header.from,
        header,
        pages,
    )
}

/// Renders a Change Dump: `<urlset>`, `<rs:md capability="changedump" from=.. [until=..]>`
/// (`from` defaults to the first package's), the header's links (the spec requires
/// `rel="up"` to the Capability List), then one `<url>` per package with `<loc>`, `<lastmod>`,
/// `<rs:md type length hash from until ch:first ch:last [ch:skipped]/>` and
/// `<rs:ln rel="contents" href=.. type="application/xml"/>` to its manifest.
pub fn write_change_dump(header: &ChangeListHeader, entries: &[DumpEntry]) -> Vec<u8> {
    let estimate: usize = entries
        .iter()
        .map(|e| 400 + e.loc.len() + e.contents.as_ref().map_or(0, String::len))
        .sum();
    let mut out = Out::with_capacity(512 + header_size(header) + estimate);
    out.open_root("urlset", true);
    let from = header.from.or_else(|| entries.first().and_then(|e| e.from));
    out.header_md("changedump", from, header);
    out.doc_links(&header.links);
    for e in entries {
        out.raw("  <url>\n    <loc>");
        out.text(&e.loc);
        out.raw("</loc>\n");
        if let Some(lastmod) = e.lastmod {
            out.raw("    <lastmod>");
            out.raw(&format_datetime(lastmod));
            out.raw("</lastmod>\n");
        }
        out.raw("    <rs:md");
        if let Some(t) = &e.media_type {
            out.attr("type", t);
        }
        if let Some(length) = e.length {
            out.u64_attr("length", length);
        }
        if let Some(hash) = &e.hash {
            out.attr("hash", hash);
        }
        out.opt_datetime_attr("from", e.from);
        out.opt_datetime_attr("until", e.until);
        if let Some((first, last)) = e.seq_range {
            out.u64_attr("ch:first", first);
            out.u64_attr("ch:last", last);
        }
        if let Some(skipped) = e.skipped {
            out.u64_attr("ch:skipped", skipped);
        }
        out.raw("/>\n");
        if let Some(contents) = &e.contents {
            out.raw("    <rs:ln rel=\"contents\"");
            out.attr("href", contents);
            out.raw(" type=\"application/xml\"/>\n");
        }
        out.raw("  </url>\n");
    }
    out.raw("</urlset>\n");
    out.buf
}

/// Renders a Change Dump Index: `<sitemapindex>`, `<rs:md capability="changedump" ..>`, one
/// `<sitemap>` per Change Dump with `<rs:md from=.. [until=..]>`.
pub fn write_change_dump_index(header: &ChangeListHeader, pages: &[IndexEntry]) -> Vec<u8> {
    let from = header.from.or_else(|| pages.first().and_then(|e| e.from));
    write_lists(
        ("sitemapindex", "sitemap"),
        "changedump",
        from,
        header,
        pages,
    )
}

/// Renders a Change Dump Manifest: `<urlset>`, `<rs:md capability="changedump-manifest"
/// from=.. until=..>`, the header's links, then one `<url>` per change in the order given
/// (forward chronological) with `<loc>`, `<lastmod>` and `<rs:md change datetime [hash]
/// [length] [type] [path] ch:seq/>`.
pub fn write_change_dump_manifest(header: &ChangeListHeader, entries: &[ManifestEntry]) -> Vec<u8> {
    let estimate: usize = entries
        .iter()
        .map(|e| 320 + e.loc.len() + e.path.as_ref().map_or(0, String::len))
        .sum();
    let mut out = Out::with_capacity(512 + header_size(header) + estimate);
    out.open_root("urlset", true);
    let from = header
        .from
        .or_else(|| entries.first().map(|e| e.datetime.unwrap_or(e.lastmod)));
    out.header_md("changedump-manifest", from, header);
    out.doc_links(&header.links);
    for e in entries {
        out.raw("  <url>\n    <loc>");
        out.text(&e.loc);
        out.raw("</loc>\n    <lastmod>");
        out.raw(&format_datetime(e.lastmod));
        out.raw("</lastmod>\n    <rs:md");
        out.attr("change", e.change.as_str());
        out.opt_datetime_attr("datetime", e.datetime);
        if let Some(hash) = &e.hash {
            out.attr("hash", hash);
        }
        if let Some(length) = e.length {
            out.u64_attr("length", length);
        }
        if let Some(t) = &e.media_type {
            out.attr("type", t);
        }
        if let Some(path) = &e.path {
            out.attr("path", path);
        }
        if let Some(seq) = e.seq {
            out.u64_attr("ch:seq", seq);
        }
        out.raw("/>\n  </url>\n");
    }
    out.raw("</urlset>\n");
    out.buf
}

/// A document that lists other documents with the interval each covers.
fn write_lists(
    (root, item): (&str, &str),
    capability: &str,
    from: Option<OffsetDateTime>,
    header: &ChangeListHeader,
    entries: &[IndexEntry],
) -> Vec<u8> {
    let estimate: usize = entries.iter().map(|e| 160 + e.loc.len()).sum();
    let mut out = Out::with_capacity(512 + header_size(header) + estimate);
    out.open_root(root, true);
    out.header_md(capability, from, header);
    out.doc_links(&header.links);
    for entry in entries {
        out.raw("  <");
        out.raw(item);
        out.raw(">\n    <loc>");
        out.text(&entry.loc);
        out.raw("</loc>\n");
        if entry.from.is_some() || entry.until.is_some() {
            out.raw("    <rs:md");
            out.opt_datetime_attr("from", entry.from);
            out.opt_datetime_attr("until", entry.until);
            out.raw("/>\n");
        }
        out.raw("  </");
        out.raw(item);
        out.raw(">\n");
    }
    out.raw("</");
    out.raw(root);
    out.raw(">\n");
    out.buf
}

/// Renders a Capability List: `<urlset>`, `<rs:md capability="capabilitylist"/>`, the `links`
/// in the order given (the spec requires `rel="up"` to the Source Description; the hub adds
/// `rel="hub"`), then one `<url><loc/><rs:md capability="…"/></url>` per capability.
pub fn write_capability_list(links: &[DocLink], caps: &[Capability]) -> Vec<u8> {
    let estimate: usize = caps
        .iter()
        .map(|c| 80 + c.loc.len() + c.capability.len())
        .sum();
    let mut out = Out::with_capacity(512 + links_size(links) + estimate);
    out.open_root("urlset", false);
    out.raw("  <rs:md capability=\"capabilitylist\"/>\n");
    out.doc_links(links);
    for cap in caps {
        out.url_with_capability(&cap.loc, &cap.capability);
    }
    out.raw("</urlset>\n");
    out.buf
}

/// Renders a Source Description: `<urlset>`, `<rs:md capability="description"/>`, the `links`
/// in the order given, then one `<url><loc>…</loc><rs:md capability="capabilitylist"/></url>`
/// per Capability List.
pub fn write_source_description(links: &[DocLink], capability_lists: &[String]) -> Vec<u8> {
    let estimate: usize = capability_lists.iter().map(|l| 96 + l.len()).sum();
    let mut out = Out::with_capacity(512 + links_size(links) + estimate);
    out.open_root("urlset", false);
    out.raw("  <rs:md capability=\"description\"/>\n");
    out.doc_links(links);
    for loc in capability_lists {
        out.url_with_capability(loc, "capabilitylist");
    }
    out.raw("</urlset>\n");
    out.buf
}

/// Renders a Resource List (`<urlset>`, `<rs:md capability="resourcelist" at=..
/// [completed=..] [ch:seq=..]>`): each resource as `<url>` with `<loc>`, `<lastmod>` (its
/// `lastmod`, else the datetime of its latest change), `<rs:md [hash] [length] [type]
/// ch:seq/>` (the seq of its latest change) and its links.
pub fn write_resource_list(header: &ResourceListHeader, resources: &[Change]) -> Vec<u8> {
    let estimate: usize = resources.iter().map(estimate_change).sum();
    let mut out = Out::with_capacity(512 + links_size(&header.links) + estimate);
    out.open_root("urlset", true);
    out.resource_list_md(header);
    out.doc_links(&header.links);
    for resource in resources {
        out.resource(resource);
    }
    out.raw("</urlset>\n");
    out.buf
}

/// Renders a Resource List Index (`<sitemapindex>` with the same `rs:md` as a Resource List):
/// one `<sitemap><loc/></sitemap>` per page.
pub fn write_resource_list_index(header: &ResourceListHeader, pages: &[String]) -> Vec<u8> {
    let estimate: usize = pages.iter().map(|p| 48 + p.len()).sum();
    let mut out = Out::with_capacity(512 + links_size(&header.links) + estimate);
    out.open_root("sitemapindex", true);
    out.resource_list_md(header);
    out.doc_links(&header.links);
    for page in pages {
        out.raw("  <sitemap>\n    <loc>");
        out.text(page);
        out.raw("</loc>\n  </sitemap>\n");
    }
    out.raw("</sitemapindex>\n");
    out.buf
}

fn links_size(links: &[DocLink]) -> usize {
    links.iter().map(|l| 32 + l.rel.len() + l.href.len()).sum()
}

fn header_size(header: &ChangeListHeader) -> usize {
    links_size(&header.links)
}

/// A generous guess of the bytes one change takes, so that the buffer is allocated once.
fn estimate_change(c: &Change) -> usize {
    let links: usize = c
        .links
        .iter()
        .map(|l| {
            40 + l.rel.len()
                + l.href.len()
                + l.attrs
                    .iter()
                    .map(|(k, v)| 4 + k.len() + v.len())
                    .sum::<usize>()
        })
        .sum();
    // Fixed markup: ~190 bytes with two datetimes, a length and a seq.
    256 + c.loc.len()
        + c.hash.as_ref().map_or(0, |h| 8 + h.len())
        + c.media_type.as_ref().map_or(0, |t| 8 + t.len())
        + links
}

struct Out {
    buf: Vec<u8>,
    /// The datetime of the last entry's `<lastmod>` and where its text is in `buf`: the
    /// entries of a notification nearly always share one, copied instead of formatted again.
    last_datetime: Option<(OffsetDateTime, std::ops::Range<usize>)>,
}

impl Out {
    fn with_capacity(capacity: usize) -> Out {
        let mut buf = Vec::with_capacity(capacity);
        buf.extend_from_slice(XML_DECL.as_bytes());
        Out {
            buf,
            last_datetime: None,
        }
    }

    #[inline]
    fn raw(&mut self, s: &str) {
        self.buf.extend_from_slice(s.as_bytes());
    }

    #[inline]
    fn text(&mut self, s: &str) {
        escape_into(&mut self.buf, s);
    }

    fn open_root(&mut self, name: &str, hub_ns: bool) {
        self.raw("<");
        self.raw(name);
        self.raw(" xmlns=\"");
        self.raw(SITEMAP_NS);
        self.raw("\" xmlns:rs=\"");
        self.raw(RS_NS);
        if hub_ns {
            self.raw("\" xmlns:ch=\"");
            self.raw(HUB_NS);
        }
        self.raw("\">\n");
    }

    /// ` name="value"` with the value escaped.
    #[inline]
    fn attr(&mut self, name: &str, value: &str) {
        self.raw(" ");
        self.raw(name);
        self.raw("=\"");
        self.text(value);
        self.raw("\"");
    }

    #[inline]
    fn datetime_attr(&mut self, name: &str, dt: OffsetDateTime) {
        self.raw(" ");
        self.raw(name);
        self.raw("=\"");
        // A datetime is only digits, '-', ':', 'T', '.', 'Z': nothing to escape.
        write_datetime(dt, &mut self.buf);
        self.raw("\"");
    }

    fn opt_datetime_attr(&mut self, name: &str, dt: Option<OffsetDateTime>) {
        if let Some(dt) = dt {
            self.datetime_attr(name, dt);
        }
    }

    #[inline]
    fn u64_attr(&mut self, name: &str, n: u64) {
        self.raw(" ");
        self.raw(name);
        self.raw("=\"");
        push_u64(&mut self.buf, n);
        self.raw("\"");
    }

    fn header_md(
        &mut self,
        capability: &str,
        from: Option<OffsetDateTime>,
        header: &ChangeListHeader,
    ) {
        self.raw("  <rs:md");
        self.attr("capability", capability);
        self.opt_datetime_attr("from", from);
        self.opt_datetime_attr("until", header.until);
        if let Some((first, last)) = header.seq_range {
            self.u64_attr("ch:first", first);
            self.u64_attr("ch:last", last);
        }
        if let Some(epoch) = &header.epoch {
            self.attr("ch:epoch", epoch);
        }
        self.raw("/>\n");
    }

    fn resource_list_md(&mut self, header: &ResourceListHeader) {
        self.raw("  <rs:md capability=\"resourcelist\"");
        self.datetime_attr("at", header.at);
        self.opt_datetime_attr("completed", header.completed);
        if let Some(seq) = header.seq {
            self.u64_attr("ch:seq", seq);
        }
        if let Some(epoch) = &header.epoch {
            self.attr("ch:epoch", epoch);
        }
        self.raw("/>\n");
    }

    fn doc_links(&mut self, links: &[DocLink]) {
        for link in links {
            self.raw("  <rs:ln");
            self.attr("rel", &link.rel);
            self.attr("href", &link.href);
            self.raw("/>\n");
        }
    }

    fn url_with_capability(&mut self, loc: &str, capability: &str) {
        self.raw("  <url>\n    <loc>");
        self.text(loc);
        self.raw("</loc>\n    <rs:md");
        self.attr("capability", capability);
        self.raw("/>\n  </url>\n");
    }

    fn change(&mut self, c: &Change) {
        self.url_entry(c, true);
    }

    /// A resource of a Resource List: its latest change without `change` and `datetime`.
    fn resource(&mut self, c: &Change) {
        self.url_entry(c, false);
    }

    fn url_entry(&mut self, c: &Change, as_change: bool) {
        self.raw("  <url>\n    <loc>");
        self.text(&c.loc);
        self.raw("</loc>\n    <lastmod>");
        let at = c.lastmod.unwrap_or(c.datetime);
        let start = self.buf.len();
        match &self.last_datetime {
            Some((before, text)) if *before == at => self.buf.extend_from_within(text.clone()),
            _ => write_datetime(at, &mut self.buf),
        }
        let lastmod = start..self.buf.len();
        self.last_datetime = Some((at, lastmod.clone()));
        self.raw("</lastmod>\n    <rs:md");
        if as_change {
            self.attr("change", c.change.as_str());
            if c.lastmod.is_none() {
                // The same datetime as the lastmod just written: copied, not formatted again.
                self.raw(" datetime=\"");
                self.buf.extend_from_within(lastmod);
                self.raw("\"");
            } else {
                self.datetime_attr("datetime", c.datetime);
            }
        }
        if let Some(hash) = &c.hash {
            self.attr("hash", hash);
        }
        if let Some(length) = c.length {
            self.u64_attr("length", length);
        }
        if let Some(media_type) = &c.media_type {
            self.attr("type", media_type);
        }
        self.u64_attr("ch:seq", c.seq);
        if c.conflicts > 0 {
            self.u64_attr("ch:conflicts", u64::from(c.conflicts));
        }
        self.raw("/>\n");
        for link in &c.links {
            self.link(link);
        }
        self.raw("  </url>\n");
    }

    fn link(&mut self, link: &Link) {
        self.raw("    <rs:ln");
        self.attr("rel", &link.rel);
        self.attr("href", &link.href);
        for (name, value) in &link.attrs {
            // Validation only lets plain names through; anything else (which would break the
            // markup, duplicate rel/href or declare a namespace) is dropped, never written.
            if is_plain_attr_name(name) {
                self.attr(name, value);
            }
        }
        self.raw("/>\n");
    }
}

/// A name that is safe to write as an unprefixed attribute of `<rs:ln>`: an XML name without
/// `:`, not `rel`/`href` (written already) and not reserved (`xml…`, which includes `xmlns`).
fn is_plain_attr_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    matches!(bytes.first(), Some(b) if b.is_ascii_alphabetic() || *b == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name != "rel"
        && name != "href"
        && !name.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("xml"))
}

/// Appends `s` escaped for XML text and attribute values (both quotes included).
///
/// `\t`, `\n` and `\r` become character references so that attribute-value normalisation and
/// end-of-line handling give them back unchanged; the characters XML 1.0 cannot carry at all
/// (other C0 controls, U+FFFE, U+FFFF) become U+FFFD.
pub(crate) fn escape_into(buf: &mut Vec<u8>, s: &str) {
    const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();
    let bytes = s.as_bytes();
    if xml_plain(bytes) {
        buf.extend_from_slice(bytes);
        return;
    }
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        // Most bytes are copied as they are: one look in a table, not the match below.
        if !SPECIAL[usize::from(b)] {
            i += 1;
            continue;
        }
        let (replacement, len): (&[u8], usize) = match b {
            b'&' => (b"&amp;", 1),
            b'<' => (b"&lt;", 1),
            b'>' => (b"&gt;", 1),
            b'"' => (b"&quot;", 1),
            b'\'' => (b"&apos;", 1),
            b'\t' => (b"&#9;", 1),
            b'\n' => (b"&#10;", 1),
            b'\r' => (b"&#13;", 1),
            0..=0x1f => (REPLACEMENT, 1),
            // U+FFFE and U+FFFF are EF BF BE / EF BF BF in UTF-8.
            0xEF if bytes.get(i + 1) == Some(&0xBF)
                && matches!(bytes.get(i + 2), Some(0xBE | 0xBF)) =>
            {
                (REPLACEMENT, 3)
            }
            _ => {
                i += 1;
                continue;
            }
        };
        buf.extend_from_slice(&bytes[copied..i]);
        buf.extend_from_slice(replacement);
        i += len;
        copied = i;
    }
    buf.extend_from_slice(&bytes[copied..]);
}

/// Whether `bytes` need no escaping: none of the bytes [`SPECIAL`] marks but those of
/// characters outside ASCII other than U+FFFE and U+FFFF (whose first byte, 0xEF, counts
/// here). A fold without an early exit: the compiler checks many bytes at a time.
fn xml_plain(bytes: &[u8]) -> bool {
    bytes.iter().fold(true, |plain, &b| {
        plain
            & (b >= 0x20)
            & (b != b'&')
            & (b != b'<')
            & (b != b'>')
            & (b != b'"')
            & (b != b'\'')
            & (b != 0xEF)
    })
}

/// The bytes [`escape_into`] looks at: the markup characters, the C0 controls, and 0xEF (the
/// first byte of U+FFFE and U+FFFF).
const SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'&' as usize] = true;
    table[b'<' as usize] = true;
    table[b'>' as usize] = true;
    table[b'"' as usize] = true;
    table[b'\'' as usize] = true;
    table[0xEF] = true;
    table
};

fn push_u64(buf: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `escape_into` writes for one character, by its definition.
    fn escaped(c: char) -> String {
        match c {
            '&' => "&amp;".into(),
            '<' => "&lt;".into(),
            '>' => "&gt;".into(),
            '"' => "&quot;".into(),
            '\'' => "&apos;".into(),
            '\t' => "&#9;".into(),
            '\n' => "&#10;".into(),
            '\r' => "&#13;".into(),
            '\u{0}'..='\u{1f}' | '\u{fffe}' | '\u{ffff}' => "\u{fffd}".into(),
            c => c.to_string(),
        }
    }

    /// The quick check agrees with the table, byte by byte.
    #[test]
    fn the_plain_check_agrees_with_the_table() {
        for b in 0..=255u8 {
            assert_eq!(xml_plain(&[b]), !SPECIAL[usize::from(b)], "{b:#x}");
            assert_eq!(
                xml_plain(&[b'a', b, b'z']),
                !SPECIAL[usize::from(b)],
                "{b:#x}"
            );
        }
    }

    /// Every ASCII character, and characters whose UTF-8 begins with 0xEF or holds 0xBF,
    /// each alone and between others, come out as their definition says.
    #[test]
    fn escaping_writes_each_character_as_defined() {
        let mut chars: Vec<char> = (0u8..=127).map(char::from).collect();
        chars.extend([
            '\u{fffd}', '\u{fffe}', '\u{ffff}', '\u{f000}', '\u{ffbf}', 'é', '€',
        ]);
        for &c in &chars {
            for text in [c.to_string(), format!("a{c}b"), format!("{c}{c}\u{fffe}x")] {
                let mut buf = b"<".to_vec();
                escape_into(&mut buf, &text);
                let want: String = text.chars().map(escaped).collect();
                assert_eq!(std::str::from_utf8(&buf[1..]).unwrap(), want, "{text:?}");
            }
        }
    }
}
