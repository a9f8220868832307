//! The parser: one pass of [`NsReader`] events over untrusted bytes.
//!
//! Order of checks: size ([`ParseError::TooLarge`]) before anything, then UTF-8, then the
//! events. A `<!DOCTYPE` is refused as soon as it is seen, so no entity is ever defined, let
//! alone expanded; only the five predefined entities and character references are resolved.
//! Nesting is bounded by [`MAX_DEPTH`](crate::resourcesync::MAX_DEPTH), entries by [`Limits::max_entries`], `<loc>`/`href` by
//! [`MAX_URI_LEN`](crate::model::MAX_URI_LEN) and other values by [`MAX_ATTR_LEN`](crate::model::MAX_ATTR_LEN). Elements are recognised by namespace
//! URI and local name; ResourceSync attributes are unprefixed (a prefix bound to the
//! ResourceSync namespace is tolerated); the hub's `seq`/`first`/`last` are in [`HUB_NS`](crate::resourcesync::HUB_NS).
//! Anything else (elements, attributes, comments, processing instructions) is skipped.
//!
//! Files: `reader.rs` the XML layer (events, names, attributes, text, values); `header.rs`
//! the top-level `<rs:md>` and `<rs:ln>`; `entries.rs` the `<url>`/`<sitemap>` entries; this
//! file the entry points and the document's structure (prolog, root, children, epilog).

use quick_xml::events::Event;
use quick_xml::NsReader;

use super::{
    Capability, ChangeListHeader, Document, DumpEntry, IndexEntry, Limits, ManifestEntry,
    ParseError, ParsedEntry, ResourceListHeader,
};
use entries::{
    capability_entry, change_entry, dump_entry, index_entry, manifest_entry, required_loc,
    resource_entry, RawEntry,
};
use header::{doc_link, top_md, ListTimes, MAX_DOC_LINKS};
use reader::{is_blank, truncate, Ns, Parser};

mod entries;
mod header;
mod reader;

/// Detects the kind from the root element and the top-level rs:md capability.
///
/// Accepted: `<urlset>` with `changelist`, `resourcelist`, `changedump`,
/// `changedump-manifest`, `capabilitylist` or `description`, and `<sitemapindex>` with
/// `changelist`, `resourcelist` or `changedump`. The top-level `<rs:md>` must come before the first
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
        Document::ResourceList { .. } | Document::ResourceListIndex { .. } => {
            Err(unexpected("resourcelist"))
        }
        Document::ChangeDump { .. } | Document::ChangeDumpIndex { .. } => {
            Err(unexpected("changedump"))
        }
        Document::ChangeDumpManifest { .. } => Err(unexpected("changedump-manifest")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Root {
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
pub(super) enum Kind {
    ChangeList,
    ChangeListIndex,
    CapabilityList,
    SourceDescription,
    ResourceList,
    ResourceListIndex,
    ChangeDump,
    ChangeDumpIndex,
    ChangeDumpManifest,
}

/// What the children of the root element gave.
struct Body {
    kind: Option<Kind>,
    header: ChangeListHeader,
    list: ListTimes,
    changes: Vec<ParsedEntry>,
    index: Vec<IndexEntry>,
    caps: Vec<Capability>,
    lists: Vec<String>,
    dumps: Vec<DumpEntry>,
    manifest: Vec<ManifestEntry>,
}

impl<'a> Parser<'a> {
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
            list: ListTimes::default(),
            changes: Vec::new(),
            index: Vec::new(),
            caps: Vec::new(),
            lists: Vec::new(),
            dumps: Vec::new(),
            manifest: Vec::new(),
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
            list,
            changes,
            index,
            caps,
            lists,
            dumps,
            manifest,
        } = body;
        let list_header = |header: ChangeListHeader| -> Result<ResourceListHeader, ParseError> {
            Ok(ResourceListHeader {
                at: list.at.ok_or_else(|| {
                    ParseError::Header("a Resource List's <rs:md> has no at".into())
                })?,
                completed: list.completed,
                links: header.links,
                seq: list.seq,
                epoch: header.epoch,
            })
        };
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
            Kind::ResourceList => Document::ResourceList {
                header: list_header(header)?,
                entries: changes,
            },
            Kind::ResourceListIndex => Document::ResourceListIndex {
                header: list_header(header)?,
                pages: lists,
            },
            Kind::ChangeDump => Document::ChangeDump {
                header,
                entries: dumps,
            },
            Kind::ChangeDumpIndex => Document::ChangeDumpIndex {
                header,
                entries: index,
            },
            Kind::ChangeDumpManifest => Document::ChangeDumpManifest {
                header,
                entries: manifest,
            },
        })
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
                    body.kind = Some(top_md(root, attrs, &mut body.header, &mut body.list)?);
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
                        Kind::ChangeListIndex | Kind::ChangeDumpIndex => {
                            body.index.push(index_entry(raw, index)?)
                        }
                        Kind::ChangeDump => body.dumps.push(dump_entry(raw, index)?),
                        Kind::ChangeDumpManifest => body.manifest.push(manifest_entry(raw, index)?),
                        Kind::CapabilityList => body.caps.push(capability_entry(raw, index)?),
                        Kind::SourceDescription | Kind::ResourceListIndex => {
                            body.lists.push(required_loc(raw.loc, index)?)
                        }
                        Kind::ResourceList => body.changes.push(resource_entry(raw, index)?),
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
}
