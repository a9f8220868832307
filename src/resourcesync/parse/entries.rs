//! The entries: reading a `<url>`/`<sitemap>` element ([`RawEntry`]) and giving it the
//! meaning of the document kind — a change, a Change List of an index, a capability.

use quick_xml::events::Event;
use std::collections::BTreeMap;

use super::reader::{bounded, datetime, number, truncate, Attr, Ns, Parser, MAX_DATETIME_LEN};
use crate::model::{ChangeType, Link, NewChange, MAX_ATTR_LEN, MAX_LINKS, MAX_URI_LEN};
use crate::resourcesync::{
    Capability, DumpEntry, IndexEntry, ManifestEntry, ParseError, ParsedEntry,
};

/// A `<url>`/`<sitemap>` as read, before the document kind gives it meaning.
#[derive(Default)]
pub(super) struct RawEntry {
    pub(super) loc: Option<String>,
    pub(super) lastmod: Option<String>,
    pub(super) md: Option<Vec<Attr>>,
    pub(super) links: Vec<Link>,
}

impl<'a> Parser<'a> {
    /// The children of a `<url>`/`<sitemap>` whose start tag was just read.
    pub(super) fn entry(&mut self, index: usize) -> Result<RawEntry, ParseError> {
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

pub(super) fn required_loc(loc: Option<String>, index: usize) -> Result<String, ParseError> {
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

/// A `<url>` of a Change List: a change, with the hub's `ch:seq` when it came from a hub.
pub(super) fn change_entry(raw: RawEntry, index: usize) -> Result<ParsedEntry, ParseError> {
    url_entry(raw, index, true)
}

/// A `<url>` of a Resource List: a resource as it is now, read as a `created` change of it
/// (with `ch:seq`, the seq of the change that made it so). A `change` attribute is ignored.
pub(super) fn resource_entry(raw: RawEntry, index: usize) -> Result<ParsedEntry, ParseError> {
    url_entry(raw, index, false)
}

fn url_entry(raw: RawEntry, index: usize, is_change: bool) -> Result<ParsedEntry, ParseError> {
    let bad = |reason: String| ParseError::Entry { index, reason };
    let loc = required_loc(raw.loc, index)?;
    let md = match raw.md {
        Some(md) => md,
        None if is_change => return Err(bad("no <rs:md change=\"…\">".into())),
        None => Vec::new(),
    };
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
        _ if !is_change => ChangeType::Created,
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
            media_type: media_type.map(Into::into),
            links: raw.links,
            source: None,
        },
    })
}

pub(super) fn index_entry(raw: RawEntry, index: usize) -> Result<IndexEntry, ParseError> {
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

pub(super) fn capability_entry(raw: RawEntry, index: usize) -> Result<Capability, ParseError> {
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

/// A `<url>` of a Change Dump: a package, its period and its manifest.
pub(super) fn dump_entry(raw: RawEntry, index: usize) -> Result<DumpEntry, ParseError> {
    let bad = |reason: String| ParseError::Entry { index, reason };
    let loc = required_loc(raw.loc, index)?;
    let lastmod = raw
        .lastmod
        .map(|text| datetime(&text).map_err(|e| bad(format!("lastmod: {e}"))))
        .transpose()?;
    let mut entry = DumpEntry {
        loc,
        lastmod,
        ..DumpEntry::default()
    };
    let (mut first, mut last) = (None, None);
    for attr in raw.md.unwrap_or_default() {
        match (attr.ns, attr.name.as_str()) {
            (ns, "type") if ns.is_rs_attr() => {
                entry.media_type = Some(bounded(attr.value, "type").map_err(bad)?)
            }
            (ns, "length") if ns.is_rs_attr() => {
                entry.length = Some(number(&attr.value).map_err(|e| bad(format!("length: {e}")))?)
            }
            (ns, "hash") if ns.is_rs_attr() => {
                entry.hash = Some(bounded(attr.value, "hash").map_err(bad)?)
            }
            (ns, "from") if ns.is_rs_attr() => {
                entry.from = Some(datetime(&attr.value).map_err(|e| bad(format!("from: {e}")))?)
            }
            (ns, "until") if ns.is_rs_attr() => {
                entry.until = Some(datetime(&attr.value).map_err(|e| bad(format!("until: {e}")))?)
            }
            (Ns::Hub, "first") => {
                first = Some(number(&attr.value).map_err(|e| bad(format!("ch:first: {e}")))?)
            }
            (Ns::Hub, "last") => {
                last = Some(number(&attr.value).map_err(|e| bad(format!("ch:last: {e}")))?)
            }
            (Ns::Hub, "skipped") => {
                entry.skipped =
                    Some(number(&attr.value).map_err(|e| bad(format!("ch:skipped: {e}")))?)
            }
            _ => {}
        }
    }
    entry.seq_range = match (first, last) {
        (Some(first), Some(last)) if first <= last => Some((first, last)),
        (None, None) => None,
        _ => {
            return Err(bad(
                "ch:first and ch:last must come together, first <= last".into(),
            ))
        }
    };
    entry.contents = raw
        .links
        .into_iter()
        .find(|l| l.rel == "contents")
        .map(|l| l.href);
    Ok(entry)
}

/// A `<url>` of a Change Dump Manifest: a change (as in a Change List; `<lastmod>` is
/// mandatory) and the `path` of its bitstream, which every change but a deletion has.
pub(super) fn manifest_entry(raw: RawEntry, index: usize) -> Result<ManifestEntry, ParseError> {
    let bad = |reason: String| ParseError::Entry { index, reason };
    let lastmod_text = raw.lastmod.clone();
    let path = raw
        .md
        .as_ref()
        .and_then(|md| md.iter().find(|a| a.ns.is_rs_attr() && a.name == "path"))
        .map(|a| a.value.clone());
    let parsed = url_entry(raw, index, true)?;
    let lastmod = match lastmod_text {
        Some(text) => datetime(&text).map_err(|e| bad(format!("lastmod: {e}")))?,
        None => return Err(bad("no <lastmod>".into())),
    };
    let path = match path {
        Some(p) => {
            let p = bounded(p, "path").map_err(bad)?;
            if !p.starts_with('/') {
                return Err(bad("path must start with /".into()));
            }
            Some(p)
        }
        None if parsed.change.change != ChangeType::Deleted => {
            return Err(bad("a change other than deleted needs a path".into()))
        }
        None => None,
    };
    let change = parsed.change;
    Ok(ManifestEntry {
        loc: change.loc,
        lastmod,
        change: change.change,
        // url_entry keeps the datetime of rs:md, or <lastmod> when there is none.
        datetime: change.datetime,
        hash: change.hash,
        length: change.length,
        media_type: change.media_type.as_deref().map(String::from),
        path,
        seq: parsed.seq,
    })
}
