//! The parser: one pass of [`NsReader`] events over untrusted bytes.
//!
//! Order of checks: size ([`ParseError::TooLarge`]) before anything, then UTF-8, then the
//! events. A `<!DOCTYPE` is refused as soon as it is seen, so no entity is ever defined, let
//! alone expanded; only the five predefined entities and character references are resolved.
//! Nesting is bounded by [`MAX_DEPTH`], entries by [`Limits::max_entries`], `<loc>`/`href` by
//! [`MAX_URI_LEN`] and other values by [`MAX_ATTR_LEN`]. Elements are recognised by namespace
//! URI and local name; ResourceSync attributes are unprefixed (a prefix bound to the
//! ResourceSync namespace is tolerated); the hub's `seq`/`first`/`last` are in [`HUB_NS`].
//! Anything else (elements, attributes, comments, processing instructions) is skipped.

use std::collections::BTreeMap;

use quick_xml::escape::resolve_xml_entity;
use quick_xml::events::{BytesDecl, BytesStart, Event};
use quick_xml::name::ResolveResult;
use quick_xml::{NsReader, XmlVersion};
use time::OffsetDateTime;

use super::{
    Capability, ChangeListHeader, DocLink, Document, IndexEntry, Limits, ParseError, ParsedEntry,
    HUB_NS, MAX_DEPTH, RS_NS, SITEMAP_NS,
};
use crate::model::{
    parse_w3c_datetime, ChangeType, Link, NewChange, MAX_ATTR_LEN, MAX_LINKS, MAX_URI_LEN,
};

/// Longest `<lastmod>` text accepted (a W3C datetime is at most ~35 characters).
const MAX_DATETIME_LEN: usize = 64;
/// Most top-level `<rs:ln>` links accepted.
const MAX_DOC_LINKS: usize = 64;

/// Detects the kind from the root element and the top-level rs:md capability.
///
/// Accepted: `<urlset>` with `changelist`, `capabilitylist` or `description`, and
/// `<sitemapindex>` with `changelist`. The top-level `<rs:md>` must come before the first
/// entry (as the Sitemap schema has it), otherwise [`ParseError::MissingCapability`].
pub fn parse_document(xml: &[u8], limits: &Limits) -> Result<Document, ParseError> {
    if xml.len() > limits.max_bytes {
        return Err(ParseError::TooLarge {
            limit: limits.max_bytes,
        });
    }
    let (xml, skipped) = match xml.strip_prefix(b"\xEF\xBB\xBF") {
        Some(rest) => (rest, 3),
        None => (xml, 0),
    };
    let text = std::str::from_utf8(xml).map_err(|e| ParseError::NotUtf8 {
        offset: skipped + e.valid_up_to(),
    })?;
    let mut parser = Parser {
        reader: NsReader::from_str(text),
        text,
        depth: 0,
        limits: *limits,
    };
    parser.document()
}

/// Convenience: parse and insist on a Change List (a Change List Index is
/// [`ParseError::ChangeListIndex`], any other document [`ParseError::UnexpectedCapability`]).
pub fn parse_change_list(
    xml: &[u8],
    limits: &Limits,
) -> Result<(ChangeListHeader, Vec<ParsedEntry>), ParseError> {
    let unexpected = |found: &str| ParseError::UnexpectedCapability {
        expected: "changelist".into(),
        found: found.into(),
    };
    match parse_document(xml, limits)? {
        Document::ChangeList { header, entries } => Ok((header, entries)),
        Document::ChangeListIndex { .. } => Err(ParseError::ChangeListIndex),
        Document::CapabilityList { .. } => Err(unexpected("capabilitylist")),
        Document::SourceDescription { .. } => Err(unexpected("description")),
    }
}

/// The namespace of an element or attribute, as far as these documents care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ns {
    Sitemap,
    Rs,
    Hub,
    /// No namespace (unprefixed attributes, elements outside any default namespace).
    Unbound,
    Other,
}

impl Ns {
    /// Where ResourceSync attributes live: unprefixed, or (tolerated) prefixed with the
    /// ResourceSync namespace.
    fn is_rs_attr(self) -> bool {
        matches!(self, Ns::Unbound | Ns::Rs)
    }
}

fn classify(result: ResolveResult<'_>) -> Result<Ns, ParseError> {
    match result {
        ResolveResult::Bound(ns) => Ok(match ns.into_inner() {
            SITEMAP_NS => Ns::Sitemap,
            RS_NS => Ns::Rs,
            HUB_NS => Ns::Hub,
            _ => Ns::Other,
        }),
        ResolveResult::Unbound => Ok(Ns::Unbound),
        ResolveResult::Unknown(prefix) => Err(ParseError::Malformed(format!(
            "namespace prefix {:?} is not declared",
            truncate(&prefix)
        ))),
    }
}

/// An attribute with its namespace resolved and its value normalised.
struct Attr {
    ns: Ns,
    name: String,
    value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Root {
    UrlSet,
    SitemapIndex,
}

impl Root {
    fn entry_name(self) -> &'static str {
        match self {
            Root::UrlSet => "url",
            Root::SitemapIndex => "sitemap",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ChangeList,
    ChangeListIndex,
    CapabilityList,
    SourceDescription,
}

/// A `<url>`/`<sitemap>` as read, before the document kind gives it meaning.
#[derive(Default)]
struct RawEntry {
    loc: Option<String>,
    lastmod: Option<String>,
    md: Option<Vec<Attr>>,
    links: Vec<Link>,
}

/// What the children of the root element gave.
struct Body {
    kind: Option<Kind>,
    header: ChangeListHeader,
    changes: Vec<ParsedEntry>,
    index: Vec<IndexEntry>,
    caps: Vec<Capability>,
    lists: Vec<String>,
}

struct Parser<'a> {
    reader: NsReader<&'a [u8]>,
    text: &'a str,
    /// Open elements.
    depth: usize,
    limits: Limits,
}

impl<'a> Parser<'a> {
    /// The next event, with depth accounting and the DOCTYPE / truncation checks.
    fn next(&mut self) -> Result<Event<'a>, ParseError> {
        let event = self.reader.read_event().map_err(|e| {
            ParseError::Malformed(format!(
                "{} (near byte {})",
                truncate(&e.to_string()),
                self.reader.buffer_position()
            ))
        })?;
        match &event {
            Event::Start(_) => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(ParseError::TooDeep { limit: MAX_DEPTH });
                }
            }
            Event::Empty(_) if self.depth + 1 > MAX_DEPTH => {
                return Err(ParseError::TooDeep { limit: MAX_DEPTH });
            }
            // The reader checks that end tags match their start tags.
            Event::End(_) => self.depth = self.depth.saturating_sub(1),
            Event::DocType(_) => return Err(ParseError::Doctype),
            Event::Eof if self.depth > 0 => {
                return Err(ParseError::Malformed(
                    "document ends before all its elements are closed".into(),
                ));
            }
            _ => {}
        }
        Ok(event)
    }

    /// Namespace and local name of an element.
    fn element<'e>(&self, e: &'e BytesStart<'_>) -> Result<(Ns, &'e str), ParseError> {
        let (result, local) = self.reader.resolver().resolve_element(e.name());
        Ok((classify(result)?, local.into_inner()))
    }

    /// The attributes of an element, namespace declarations left out.
    fn attrs(&self, e: &BytesStart<'_>) -> Result<Vec<Attr>, ParseError> {
        let mut out = Vec::new();
        for attr in e.attributes() {
            let attr = attr.map_err(|err| {
                ParseError::Malformed(format!("bad attribute: {}", truncate(&err.to_string())))
            })?;
            if attr.key.as_namespace_binding().is_some() {
                continue;
            }
            let (result, local) = self.reader.resolver().resolve_attribute(attr.key);
            let ns = classify(result)?;
            let value = attr
                .normalized_value(XmlVersion::Implicit1_0)
                .map_err(|err| {
                    ParseError::Malformed(format!(
                        "bad attribute value: {}",
                        truncate(&err.to_string())
                    ))
                })?
                .into_owned();
            out.push(Attr {
                ns,
                name: local.into_inner().to_owned(),
                value,
            });
        }
        Ok(out)
    }

    /// Skips the content of an element whose start tag was just read, up to its end tag.
    fn skip(&mut self) -> Result<(), ParseError> {
        let target = self.depth - 1;
        loop {
            if let Event::End(_) = self.next()? {
                if self.depth == target {
                    return Ok(());
                }
            }
        }
    }

    /// The text content of a simple element (`<loc>`, `<lastmod>`) whose start tag was just
    /// read, with references resolved and surrounding whitespace trimmed.
    fn simple_text(
        &mut self,
        index: usize,
        element: &str,
        limit: usize,
    ) -> Result<String, ParseError> {
        let too_long = || ParseError::Entry {
            index,
            reason: format!("<{element}> is longer than {limit} bytes"),
        };
        let mut text = String::new();
        loop {
            match self.next()? {
                Event::Text(t) => text.push_str(&t.xml10_content()),
                Event::CData(c) => text.push_str(&c.xml10_content()),
                Event::GeneralRef(r) => push_reference(&mut text, &r)?,
                Event::End(_) => break,
                Event::Start(_) | Event::Empty(_) => {
                    return Err(ParseError::Entry {
                        index,
                        reason: format!("unexpected element inside <{element}>"),
                    })
                }
                _ => {}
            }
            // Leave room for indentation around the value; the exact check is below.
            if text.len() > limit + 1024 {
                return Err(too_long());
            }
        }
        let trimmed = trim_xml(&text);
        if trimmed.len() > limit {
            return Err(too_long());
        }
        Ok(if trimmed.len() == text.len() {
            text
        } else {
            trimmed.to_owned()
        })
    }

    fn document(&mut self) -> Result<Document, ParseError> {
        // Prolog.
        let (root, empty) = loop {
            match self.next()? {
                Event::Decl(decl) => self.check_decl(&decl)?,
                Event::PI(_) | Event::Comment(_) => {}
                Event::Text(t) if is_blank(&t) => {}
                Event::Start(e) => break (e, false),
                Event::Empty(e) => break (e, true),
                Event::Eof => return Err(ParseError::Malformed("no root element".into())),
                _ => {
                    return Err(ParseError::Malformed(
                        "content before the root element".into(),
                    ))
                }
            }
        };
        let (ns, local) = self.element(&root)?;
        let root_kind = match (ns, local) {
            (Ns::Sitemap, "urlset") => Root::UrlSet,
            (Ns::Sitemap, "sitemapindex") => Root::SitemapIndex,
            (Ns::Sitemap, _) => {
                return Err(ParseError::WrongRoot(format!("<{}>", truncate(local))))
            }
            _ => {
                let name = root.name();
                return Err(ParseError::WrongRoot(format!(
                    "<{}> outside the sitemap namespace",
                    truncate(name.as_ref())
                )));
            }
        };
        let mut body = Body {
            kind: None,
            header: ChangeListHeader::default(),
            changes: Vec::new(),
            index: Vec::new(),
            caps: Vec::new(),
            lists: Vec::new(),
        };
        if !empty {
            self.root_children(root_kind, &mut body)?;
        }
        // Epilog.
        loop {
            match self.next()? {
                Event::Eof => break,
                Event::PI(_) | Event::Comment(_) => {}
                Event::Text(t) if is_blank(&t) => {}
                _ => {
                    return Err(ParseError::Malformed(
                        "content after the root element".into(),
                    ))
                }
            }
        }
        let Body {
            kind,
            header,
            changes,
            index,
            caps,
            lists,
        } = body;
        Ok(match kind.ok_or(ParseError::MissingCapability)? {
            Kind::ChangeList => Document::ChangeList {
                header,
                entries: changes,
            },
            Kind::ChangeListIndex => Document::ChangeListIndex {
                header,
                entries: index,
            },
            Kind::CapabilityList => Document::CapabilityList {
                links: header.links,
                caps,
            },
            Kind::SourceDescription => Document::SourceDescription {
                links: header.links,
                capability_lists: lists,
            },
        })
    }

    /// Only UTF-8 is read; another declared encoding is accepted only for pure ASCII input,
    /// which every ASCII-compatible encoding reads the same.
    fn check_decl(&self, decl: &BytesDecl<'_>) -> Result<(), ParseError> {
        if let Some(Ok(encoding)) = decl.encoding() {
            let utf8 =
                encoding.eq_ignore_ascii_case("utf-8") || encoding.eq_ignore_ascii_case("utf8");
            if !utf8 && !self.text.is_ascii() {
                return Err(ParseError::Malformed(format!(
                    "encoding {:?} is not supported, only UTF-8",
                    truncate(&encoding)
                )));
            }
        }
        Ok(())
    }

    fn root_children(&mut self, root: Root, body: &mut Body) -> Result<(), ParseError> {
        let mut seen_md = false;
        let mut count = 0usize;
        loop {
            let (e, empty) = match self.next()? {
                Event::Start(e) => (e, false),
                Event::Empty(e) => (e, true),
                Event::End(_) => return Ok(()),
                Event::Text(t) if is_blank(&t) => continue,
                Event::Comment(_) | Event::PI(_) => continue,
                _ => {
                    return Err(ParseError::Malformed(format!(
                        "text directly inside <{}>",
                        match root {
                            Root::UrlSet => "urlset",
                            Root::SitemapIndex => "sitemapindex",
                        }
                    )))
                }
            };
            let (ns, local) = self.element(&e)?;
            match (ns, local) {
                (Ns::Rs, "md") => {
                    if seen_md {
                        return Err(ParseError::Header("more than one top-level <rs:md>".into()));
                    }
                    seen_md = true;
                    let attrs = self.attrs(&e)?;
                    body.kind = Some(top_md(root, attrs, &mut body.header)?);
                }
                (Ns::Rs, "ln") => {
                    if body.header.links.len() >= MAX_DOC_LINKS {
                        return Err(ParseError::Header(format!(
                            "more than {MAX_DOC_LINKS} top-level <rs:ln>"
                        )));
                    }
                    let link = doc_link(self.attrs(&e)?)?;
                    body.header.links.push(link);
                }
                (Ns::Sitemap, "url" | "sitemap") => {
                    let index = count;
                    if index >= self.limits.max_entries {
                        return Err(ParseError::TooManyEntries {
                            limit: self.limits.max_entries,
                        });
                    }
                    count += 1;
                    if local != root.entry_name() {
                        return Err(ParseError::Entry {
                            index,
                            reason: format!("<{local}> where <{}> was expected", root.entry_name()),
                        });
                    }
                    let kind = body.kind.ok_or(ParseError::MissingCapability)?;
                    let raw = if empty {
                        RawEntry::default()
                    } else {
                        self.entry(index)?
                    };
                    match kind {
                        Kind::ChangeList => body.changes.push(change_entry(raw, index)?),
                        Kind::ChangeListIndex => body.index.push(index_entry(raw, index)?),
                        Kind::CapabilityList => body.caps.push(capability_entry(raw, index)?),
                        Kind::SourceDescription => body.lists.push(required_loc(raw.loc, index)?),
                    }
                    continue;
                }
                _ => {}
            }
            if !empty {
                self.skip()?;
            }
        }
    }

    /// The children of a `<url>`/`<sitemap>` whose start tag was just read.
    fn entry(&mut self, index: usize) -> Result<RawEntry, ParseError> {
        let bad = |reason: String| ParseError::Entry { index, reason };
        let mut raw = RawEntry::default();
        loop {
            let (e, empty) = match self.next()? {
                Event::Start(e) => (e, false),
                Event::Empty(e) => (e, true),
                Event::End(_) => return Ok(raw),
                // Stray text, comments and the like inside <url> carry nothing.
                _ => continue,
            };
            let (ns, local) = self.element(&e)?;
            match (ns, local) {
                (Ns::Sitemap, "loc") => {
                    if raw.loc.is_some() {
                        return Err(bad("more than one <loc>".into()));
                    }
                    raw.loc = Some(if empty {
                        String::new()
                    } else {
                        self.simple_text(index, "loc", MAX_URI_LEN)?
                    });
                    continue;
                }
                (Ns::Sitemap, "lastmod") => {
                    if raw.lastmod.is_some() {
                        return Err(bad("more than one <lastmod>".into()));
                    }
                    raw.lastmod = Some(if empty {
                        String::new()
                    } else {
                        self.simple_text(index, "lastmod", MAX_DATETIME_LEN)?
                    });
                    continue;
                }
                (Ns::Rs, "md") => {
                    if raw.md.is_some() {
                        return Err(bad("more than one <rs:md>".into()));
                    }
                    raw.md = Some(self.attrs(&e)?);
                }
                (Ns::Rs, "ln") => {
                    if raw.links.len() >= MAX_LINKS {
                        return Err(bad(format!("more than {MAX_LINKS} <rs:ln>")));
                    }
                    let link = entry_link(self.attrs(&e)?).map_err(bad)?;
                    raw.links.push(link);
                }
                _ => {}
            }
            if !empty {
                self.skip()?;
            }
        }
    }
}

/// Reads the top-level `<rs:md>` into `header` and decides the document kind.
fn top_md(root: Root, attrs: Vec<Attr>, header: &mut ChangeListHeader) -> Result<Kind, ParseError> {
    let mut capability = None;
    let (mut first, mut last) = (None, None);
    for attr in attrs {
        match (attr.ns, attr.name.as_str()) {
            (ns, "capability") if ns.is_rs_attr() => capability = Some(attr.value),
            (ns, "from") if ns.is_rs_attr() => {
                header.from = Some(
                    datetime(&attr.value).map_err(|e| ParseError::Header(format!("from: {e}")))?,
                )
            }
            (ns, "until") if ns.is_rs_attr() => {
                header.until = Some(
                    datetime(&attr.value).map_err(|e| ParseError::Header(format!("until: {e}")))?,
                )
            }
            (Ns::Hub, "first") => {
                first = Some(
                    number(&attr.value)
                        .map_err(|e| ParseError::Header(format!("ch:first: {e}")))?,
                )
            }
            (Ns::Hub, "last") => {
                last = Some(
                    number(&attr.value).map_err(|e| ParseError::Header(format!("ch:last: {e}")))?,
                )
            }
            _ => {}
        }
    }
    header.seq_range = match (first, last) {
        (Some(first), Some(last)) if first <= last => Some((first, last)),
        (Some(_), Some(_)) => {
            return Err(ParseError::Header(
                "ch:first is greater than ch:last".into(),
            ))
        }
        (None, None) => None,
        _ => {
            return Err(ParseError::Header(
                "ch:first and ch:last go together".into(),
            ))
        }
    };
    let capability = capability.ok_or(ParseError::MissingCapability)?;
    match (root, capability.as_str()) {
        (Root::UrlSet, "changelist") => Ok(Kind::ChangeList),
        (Root::SitemapIndex, "changelist") => Ok(Kind::ChangeListIndex),
        (Root::UrlSet, "capabilitylist") => Ok(Kind::CapabilityList),
        (Root::UrlSet, "description") => Ok(Kind::SourceDescription),
        (Root::UrlSet, _) => Err(ParseError::UnexpectedCapability {
            expected: "changelist, capabilitylist or description".into(),
            found: truncate(&capability).into(),
        }),
        (Root::SitemapIndex, _) => Err(ParseError::UnexpectedCapability {
            expected: "changelist (in a <sitemapindex>)".into(),
            found: truncate(&capability).into(),
        }),
    }
}

/// A top-level `<rs:ln>`.
fn doc_link(attrs: Vec<Attr>) -> Result<DocLink, ParseError> {
    let (mut rel, mut href) = (None, None);
    for attr in attrs {
        match (attr.ns, attr.name.as_str()) {
            (ns, "rel") if ns.is_rs_attr() => rel = Some(attr.value),
            (ns, "href") if ns.is_rs_attr() => href = Some(attr.value),
            _ => {}
        }
    }
    let rel = rel.ok_or_else(|| ParseError::Header("<rs:ln> without rel".into()))?;
    let href = href.ok_or_else(|| ParseError::Header("<rs:ln> without href".into()))?;
    if rel.len() > MAX_ATTR_LEN {
        return Err(ParseError::Header(format!(
            "<rs:ln> rel is longer than {MAX_ATTR_LEN} bytes"
        )));
    }
    if href.len() > MAX_URI_LEN {
        return Err(ParseError::Header(format!(
            "<rs:ln> href is longer than {MAX_URI_LEN} bytes"
        )));
    }
    Ok(DocLink { rel, href })
}

/// An `<rs:ln>` of an entry: rel, href and the other ResourceSync attributes by local name.
fn entry_link(attrs: Vec<Attr>) -> Result<Link, String> {
    let (mut rel, mut href) = (None, None);
    let mut others = BTreeMap::new();
    for attr in attrs {
        if !attr.ns.is_rs_attr() {
            continue;
        }
        match attr.name.as_str() {
            "rel" => rel = Some(attr.value),
            "href" => href = Some(attr.value),
            _ => {
                if attr.value.len() > MAX_ATTR_LEN {
                    return Err(format!(
                        "<rs:ln> {} is longer than {MAX_ATTR_LEN} bytes",
                        attr.name
                    ));
                }
                others.insert(attr.name, attr.value);
            }
        }
    }
    let rel = rel.ok_or("<rs:ln> without rel")?;
    let href = href.ok_or("<rs:ln> without href")?;
    if rel.len() > MAX_ATTR_LEN {
        return Err(format!("<rs:ln> rel is longer than {MAX_ATTR_LEN} bytes"));
    }
    if href.len() > MAX_URI_LEN {
        return Err(format!("<rs:ln> href is longer than {MAX_URI_LEN} bytes"));
    }
    Ok(Link {
        rel,
        href,
        attrs: others,
    })
}

fn required_loc(loc: Option<String>, index: usize) -> Result<String, ParseError> {
    match loc {
        Some(loc) if !loc.is_empty() => Ok(loc),
        Some(_) => Err(ParseError::Entry {
            index,
            reason: "empty <loc>".into(),
        }),
        None => Err(ParseError::Entry {
            index,
            reason: "no <loc>".into(),
        }),
    }
}

fn change_entry(raw: RawEntry, index: usize) -> Result<ParsedEntry, ParseError> {
    let bad = |reason: String| ParseError::Entry { index, reason };
    let loc = required_loc(raw.loc, index)?;
    let md = raw
        .md
        .ok_or_else(|| bad("no <rs:md change=\"…\">".into()))?;
    let mut change = None;
    let mut when = None;
    let mut hash = None;
    let mut length = None;
    let mut media_type = None;
    let mut seq = None;
    for attr in md {
        match (attr.ns, attr.name.as_str()) {
            (ns, "change") if ns.is_rs_attr() => change = Some(attr.value),
            (ns, "datetime") if ns.is_rs_attr() => {
                when = Some(datetime(&attr.value).map_err(|e| bad(format!("datetime: {e}")))?)
            }
            (ns, "hash") if ns.is_rs_attr() => {
                hash = Some(bounded(attr.value, "hash").map_err(bad)?)
            }
            (ns, "length") if ns.is_rs_attr() => {
                length = Some(number(&attr.value).map_err(|e| bad(format!("length: {e}")))?)
            }
            (ns, "type") if ns.is_rs_attr() => {
                media_type = Some(bounded(attr.value, "type").map_err(bad)?)
            }
            (Ns::Hub, "seq") => {
                seq = Some(number(&attr.value).map_err(|e| bad(format!("ch:seq: {e}")))?)
            }
            _ => {}
        }
    }
    let change = match change {
        None => return Err(bad("<rs:md> has no change attribute".into())),
        Some(value) => ChangeType::parse(&value).ok_or_else(|| {
            bad(format!(
                "unknown change type {:?} (expected created, updated or deleted)",
                truncate(&value)
            ))
        })?,
    };
    let lastmod = raw
        .lastmod
        .map(|text| datetime(&text).map_err(|e| bad(format!("lastmod: {e}"))))
        .transpose()?;
    let (datetime, lastmod) = match when {
        // 1.1: the change time is rs:md datetime; <lastmod> is the resource's own time, kept
        // only when it says something more (the writer repeats datetime there for 1.0 clients).
        Some(dt) => (Some(dt), lastmod.filter(|lm| *lm != dt)),
        // 1.0: <lastmod> is the only time given, and it is the time of the change.
        None => (lastmod, None),
    };
    Ok(ParsedEntry {
        seq,
        change: NewChange {
            loc,
            change,
            datetime,
            lastmod,
            hash,
            length,
            media_type,
            links: raw.links,
        },
    })
}

fn index_entry(raw: RawEntry, index: usize) -> Result<IndexEntry, ParseError> {
    let bad = |reason: String| ParseError::Entry { index, reason };
    let loc = required_loc(raw.loc, index)?;
    let (mut from, mut until) = (None, None);
    for attr in raw.md.unwrap_or_default() {
        match (attr.ns, attr.name.as_str()) {
            (ns, "from") if ns.is_rs_attr() => {
                from = Some(datetime(&attr.value).map_err(|e| bad(format!("from: {e}")))?)
            }
            (ns, "until") if ns.is_rs_attr() => {
                until = Some(datetime(&attr.value).map_err(|e| bad(format!("until: {e}")))?)
            }
            _ => {}
        }
    }
    Ok(IndexEntry { loc, from, until })
}

fn capability_entry(raw: RawEntry, index: usize) -> Result<Capability, ParseError> {
    let loc = required_loc(raw.loc, index)?;
    let capability = raw
        .md
        .unwrap_or_default()
        .into_iter()
        .find(|a| a.ns.is_rs_attr() && a.name == "capability")
        .map(|a| a.value)
        .ok_or_else(|| ParseError::Entry {
            index,
            reason: "no <rs:md capability=\"…\">".into(),
        })?;
    let capability =
        bounded(capability, "capability").map_err(|reason| ParseError::Entry { index, reason })?;
    Ok(Capability { loc, capability })
}

fn datetime(value: &str) -> Result<OffsetDateTime, String> {
    if value.len() > MAX_DATETIME_LEN {
        return Err(format!("longer than {MAX_DATETIME_LEN} bytes"));
    }
    parse_w3c_datetime(value)
}

fn number(value: &str) -> Result<u64, String> {
    let digits = trim_xml(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{:?} is not a non-negative integer",
            truncate(value)
        ));
    }
    digits
        .parse()
        .map_err(|_| format!("{:?} is too large", truncate(value)))
}

fn bounded(value: String, name: &str) -> Result<String, String> {
    if value.len() > MAX_ATTR_LEN {
        return Err(format!("{name} is longer than {MAX_ATTR_LEN} bytes"));
    }
    Ok(value)
}

/// Appends the replacement of `&name;`: a character reference or one of the five predefined
/// entities. Nothing else is defined, since DOCTYPEs are refused.
fn push_reference(text: &mut String, name: &str) -> Result<(), ParseError> {
    if let Some(number) = name.strip_prefix('#') {
        let code = match number.strip_prefix('x') {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => number.parse::<u32>().ok(),
        };
        match code.and_then(char::from_u32) {
            Some(c) if c != '\0' => text.push(c),
            _ => {
                return Err(ParseError::Malformed(format!(
                    "bad character reference &{};",
                    truncate(name)
                )))
            }
        }
    } else {
        match resolve_xml_entity(name) {
            Some(s) => text.push_str(s),
            None => {
                return Err(ParseError::Malformed(format!(
                    "undefined entity &{};",
                    truncate(name)
                )))
            }
        }
    }
    Ok(())
}

fn trim_xml(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
}

fn is_blank(s: &str) -> bool {
    trim_xml(s).is_empty()
}

/// At most 64 characters of something taken from the input, for error messages.
fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}
