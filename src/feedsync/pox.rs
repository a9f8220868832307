//! The POX (plain old XML) form of a collection: written, and parsed into a small element
//! tree that is then read as items.

use quick_xml::escape::resolve_xml_entity;
use quick_xml::events::{BytesStart, Event};
use quick_xml::name::ResolveResult;
use quick_xml::{NsReader, XmlVersion};

use super::{
    check_item, format_when, parse_bool, parse_count, parse_when, sharing_value, Collection,
    ParseError, HUB_NS, MAX_DEPTH, RS_NS,
};
use crate::model::feedsync::{History, Item, ItemData, SyncState, NAMESPACE};
use crate::model::{format_datetime, parse_w3c_datetime};

/// Renders `collection` as a POX collection.
pub fn write_pox(collection: &Collection) -> String {
    let mut out = String::with_capacity(256 + collection.items.len() * 512);
    out.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str(&format!(
        "<collection xmlns:sx=\"{NAMESPACE}\" xmlns:rs=\"{RS_NS}\" xmlns:ch=\"{HUB_NS}\">\n"
    ));
    out.push_str(&format!(
        "  <sx:sharing since=\"{}\" until=\"{}\"/>\n",
        sharing_value(collection.since),
        sharing_value(collection.until)
    ));
    for entry in &collection.items {
        item(&mut out, &entry.item, Some(entry.seq), "  ");
    }
    out.push_str("</collection>\n");
    out
}

fn item(out: &mut String, item: &Item, seq: Option<u64>, indent: &str) {
    out.push_str(indent);
    out.push_str("<item");
    if let Some(seq) = seq {
        out.push_str(&format!(" ch:seq=\"{seq}\""));
    }
    out.push_str(">\n");
    let inner = format!("{indent}  ");
    sync(out, &item.sync, &inner);
    let data = &item.data;
    out.push_str(&format!("{inner}<loc>{}</loc>\n", escape(&data.loc)));
    if let Some(lastmod) = data.lastmod {
        out.push_str(&format!(
            "{inner}<lastmod>{}</lastmod>\n",
            format_datetime(lastmod)
        ));
    }
    if data.hash.is_some() || data.length.is_some() || data.media_type.is_some() {
        out.push_str(&inner);
        out.push_str("<rs:md");
        if let Some(hash) = &data.hash {
            attr(out, "hash", hash);
        }
        if let Some(length) = data.length {
            attr(out, "length", &length.to_string());
        }
        if let Some(t) = &data.media_type {
            attr(out, "type", t);
        }
        out.push_str("/>\n");
    }
    out.push_str(indent);
    out.push_str("</item>\n");
}

fn sync(out: &mut String, sync: &SyncState, indent: &str) {
    out.push_str(indent);
    out.push_str("<sx:sync");
    attr(out, "id", &sync.id);
    attr(out, "updates", &sync.updates.to_string());
    if sync.deleted {
        attr(out, "deleted", "true");
    }
    if sync.noconflicts {
        attr(out, "noconflicts", "true");
    }
    out.push_str(">\n");
    let inner = format!("{indent}  ");
    for h in &sync.history {
        out.push_str(&inner);
        out.push_str("<sx:history");
        attr(out, "sequence", &h.sequence.to_string());
        if let Some(when) = h.when {
            attr(out, "when", &format_when(when));
        }
        if let Some(by) = &h.by {
            attr(out, "by", by);
        }
        out.push_str("/>\n");
    }
    if !sync.conflicts.is_empty() {
        out.push_str(&format!("{inner}<sx:conflicts>\n"));
        for c in &sync.conflicts {
            item(out, c, None, &format!("{inner}  "));
        }
        out.push_str(&format!("{inner}</sx:conflicts>\n"));
    }
    out.push_str(indent);
    out.push_str("</sx:sync>\n");
}

fn attr(out: &mut String, name: &str, value: &str) {
    out.push(' ');
    out.push_str(name);
    out.push_str("=\"");
    out.push_str(&escape(value));
    out.push('"');
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// Where an element or attribute name lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ns {
    Sx,
    Rs,
    Hub,
    None,
    Other,
}

/// An element of the parsed tree.
#[derive(Debug)]
struct Element {
    ns: Ns,
    name: String,
    attrs: Vec<(Ns, String, String)>,
    children: Vec<Element>,
    text: String,
}

impl Element {
    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(ns, n, _)| n == name && matches!(ns, Ns::None))
            .map(|(_, _, v)| v.as_str())
    }

    fn children<'a>(&'a self, ns: Ns, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children
            .iter()
            .filter(move |c| c.ns == ns && c.name == name)
    }

    fn child<'a>(&'a self, ns: Ns, name: &'a str) -> Option<&'a Element> {
        self.children(ns, name).next()
    }
}

fn classify(result: ResolveResult<'_>) -> Result<Ns, ParseError> {
    Ok(match result {
        ResolveResult::Bound(ns) => match ns.into_inner() {
            b if b == NAMESPACE => Ns::Sx,
            b if b == RS_NS => Ns::Rs,
            b if b == HUB_NS => Ns::Hub,
            _ => Ns::Other,
        },
        ResolveResult::Unbound => Ns::None,
        ResolveResult::Unknown(_) => {
            return Err(ParseError::Malformed("undeclared namespace prefix".into()))
        }
    })
}

fn malformed(e: impl std::fmt::Display) -> ParseError {
    ParseError::Malformed(e.to_string())
}

fn open(reader: &NsReader<&[u8]>, e: &BytesStart<'_>) -> Result<Element, ParseError> {
    let (result, local) = reader.resolver().resolve_element(e.name());
    let ns = classify(result)?;
    let name = local.into_inner().to_string();
    let mut attrs = Vec::new();
    for a in e.attributes() {
        let a = a.map_err(malformed)?;
        if a.key.as_namespace_binding().is_some() {
            continue;
        }
        let (result, local) = reader.resolver().resolve_attribute(a.key);
        let value = a
            .normalized_value(XmlVersion::Implicit1_0)
            .map_err(malformed)?
            .into_owned();
        attrs.push((classify(result)?, local.into_inner().to_string(), value));
    }
    Ok(Element {
        ns,
        name,
        attrs,
        children: Vec::new(),
        text: String::new(),
    })
}

/// The document's root element, as a tree.
fn tree(body: &[u8], max_elements: usize) -> Result<Element, ParseError> {
    let text = std::str::from_utf8(body).map_err(|_| malformed("not UTF-8"))?;
    let mut reader = NsReader::from_str(text);
    let mut stack: Vec<Element> = Vec::new();
    let mut count = 0usize;
    loop {
        let event = reader.read_event().map_err(malformed)?;
        match event {
            Event::DocType(_) => return Err(malformed("a DOCTYPE is not allowed")),
            Event::Start(e) | Event::Empty(e) if stack.len() >= MAX_DEPTH => {
                let _ = e;
                return Err(malformed(format!("nested deeper than {MAX_DEPTH}")));
            }
            Event::Start(e) => {
                count += 1;
                if count > max_elements {
                    return Err(malformed("too many elements"));
                }
                stack.push(open(&reader, &e)?);
            }
            Event::Empty(e) => {
                count += 1;
                if count > max_elements {
                    return Err(malformed("too many elements"));
                }
                let element = open(&reader, &e)?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(element),
                    None => return Ok(element),
                }
            }
            Event::End(_) => {
                let Some(done) = stack.pop() else {
                    return Err(malformed("unexpected end tag"));
                };
                match stack.last_mut() {
                    Some(parent) => parent.children.push(done),
                    None => return Ok(done),
                }
            }
            Event::Text(t) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&t.xml10_content());
                }
            }
            Event::CData(c) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&c.xml10_content());
                }
            }
            Event::GeneralRef(r) => {
                let name: &str = &r;
                let name = name.to_string();
                let resolved = match name.strip_prefix('#') {
                    Some(n) => match n.strip_prefix('x') {
                        Some(hex) => u32::from_str_radix(hex, 16).ok(),
                        None => n.parse().ok(),
                    }
                    .and_then(char::from_u32)
                    .filter(|c| *c != '\0')
                    .map(String::from),
                    None => resolve_xml_entity(&name).map(str::to_string),
                };
                let resolved =
                    resolved.ok_or_else(|| malformed(format!("unknown reference &{name};")))?;
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&resolved);
                }
            }
            Event::Eof => return Err(malformed("no root element, or it is not closed")),
            _ => {}
        }
    }
}

/// Parses a POX collection into its items (at most `max_items`), each checked.
pub fn parse_pox(body: &[u8], max_items: usize) -> Result<Vec<Item>, ParseError> {
    let root = tree(body, max_items.saturating_mul(64).max(1024))?;
    if root.name != "collection" || !matches!(root.ns, Ns::None | Ns::Other) {
        return Err(malformed(format!(
            "the root element is <{}>, not <collection>",
            root.name
        )));
    }
    let mut items = Vec::new();
    for (index, element) in root.children(root.ns, "item").enumerate() {
        if index >= max_items {
            return Err(ParseError::TooMany { limit: max_items });
        }
        let item = read_item(element, true).map_err(|r| ParseError::item(index, r))?;
        check_item(&item).map_err(|r| ParseError::item(index, r))?;
        items.push(item);
    }
    Ok(items)
}

fn read_item(element: &Element, top: bool) -> Result<Item, String> {
    let sync = element
        .child(Ns::Sx, "sync")
        .ok_or("the item has no sx:sync")?;
    let mut state = SyncState {
        id: sync.attr("id").ok_or("sx:sync has no id")?.to_string(),
        updates: parse_count(
            "updates",
            sync.attr("updates").ok_or("sx:sync has no updates")?,
        )?,
        deleted: sync
            .attr("deleted")
            .map(|v| parse_bool("deleted", v))
            .transpose()?
            .unwrap_or(false),
        noconflicts: sync
            .attr("noconflicts")
            .map(|v| parse_bool("noconflicts", v))
            .transpose()?
            .unwrap_or(false),
        history: Vec::new(),
        conflicts: Vec::new(),
    };
    for h in sync.children(Ns::Sx, "history") {
        state.history.push(History {
            sequence: parse_count(
                "sequence",
                h.attr("sequence").ok_or("sx:history has no sequence")?,
            )?,
            when: h.attr("when").map(parse_when).transpose()?,
            by: h.attr("by").map(str::to_string),
        });
    }
    if let Some(conflicts) = sync.child(Ns::Sx, "conflicts") {
        if !top {
            return Err("a conflict item may not have conflicts of its own".into());
        }
        for c in conflicts.children(element.ns, "item") {
            state.conflicts.push(read_item(c, false)?);
        }
    }
    let text = |name: &str| {
        element
            .child(element.ns, name)
            .map(|e| e.text.trim().to_string())
    };
    let md = element.child(Ns::Rs, "md");
    let md_attr = |name: &str| md.and_then(|m| m.attr(name)).map(str::to_string);
    let data = ItemData {
        loc: text("loc").ok_or("the item has no <loc>")?,
        lastmod: text("lastmod")
            .map(|t| parse_w3c_datetime(&t))
            .transpose()
            .map_err(|e| format!("lastmod: {e}"))?,
        hash: md_attr("hash"),
        length: md_attr("length")
            .map(|l| l.parse::<u64>().map_err(|_| format!("length {l:?}")))
            .transpose()?,
        media_type: md_attr("type"),
    };
    Ok(Item { sync: state, data })
}
