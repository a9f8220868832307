//! The XML layer of the parser: reading events with the depth and DOCTYPE checks, resolving
//! namespaces, reading attributes and simple text, and the value readers (datetimes,
//! numbers, bounded strings) every part of a document uses.

use quick_xml::escape::resolve_xml_entity;
use quick_xml::events::{BytesDecl, BytesStart, Event};
use quick_xml::name::ResolveResult;
use quick_xml::{NsReader, XmlVersion};
use time::OffsetDateTime;

use super::super::{Limits, ParseError, HUB_NS, MAX_DEPTH, RS_NS, SITEMAP_NS};
use crate::model::{parse_w3c_datetime, MAX_ATTR_LEN};

/// Longest `<lastmod>` text accepted (a W3C datetime is at most ~35 characters).
pub(super) const MAX_DATETIME_LEN: usize = 64;

/// The namespace of an element or attribute, as far as these documents care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ns {
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
    pub(super) fn is_rs_attr(self) -> bool {
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
pub(super) struct Attr {
    pub(super) ns: Ns,
    pub(super) name: String,
    pub(super) value: String,
}

pub(super) struct Parser<'a> {
    pub(super) reader: NsReader<&'a [u8]>,
    pub(super) text: &'a str,
    /// Open elements.
    pub(super) depth: usize,
    pub(super) limits: Limits,
}

impl<'a> Parser<'a> {
    /// The next event, with depth accounting and the DOCTYPE / truncation checks.
    pub(super) fn next(&mut self) -> Result<Event<'a>, ParseError> {
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
    pub(super) fn element<'e>(&self, e: &'e BytesStart<'_>) -> Result<(Ns, &'e str), ParseError> {
        let (result, local) = self.reader.resolver().resolve_element(e.name());
        Ok((classify(result)?, local.into_inner()))
    }

    /// The attributes of an element, namespace declarations left out.
    pub(super) fn attrs(&self, e: &BytesStart<'_>) -> Result<Vec<Attr>, ParseError> {
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
    pub(super) fn skip(&mut self) -> Result<(), ParseError> {
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
    pub(super) fn simple_text(
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

    /// Only UTF-8 is read; another declared encoding is accepted only for pure ASCII input,
    /// which every ASCII-compatible encoding reads the same.
    pub(super) fn check_decl(&self, decl: &BytesDecl<'_>) -> Result<(), ParseError> {
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
}

pub(super) fn datetime(value: &str) -> Result<OffsetDateTime, String> {
    if value.len() > MAX_DATETIME_LEN {
        return Err(format!("longer than {MAX_DATETIME_LEN} bytes"));
    }
    parse_w3c_datetime(value)
}

pub(super) fn number(value: &str) -> Result<u64, String> {
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

pub(super) fn bounded(value: String, name: &str) -> Result<String, String> {
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

pub(super) fn trim_xml(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
}

pub(super) fn is_blank(s: &str) -> bool {
    trim_xml(s).is_empty()
}

/// At most 64 characters of something taken from the input, for error messages.
pub(super) fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}
