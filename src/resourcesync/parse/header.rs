//! The document header: the top-level `<rs:md>` (capability, `from`/`until`, a Resource
//! List's `at`/`completed`, the hub's `first`/`last`/`seq`/`epoch`), which decides the document
//! kind, and the top-level `<rs:ln>` links.

use super::reader::{datetime, number, truncate, Attr, Ns};
use super::{Kind, Root};
use crate::model::{MAX_ATTR_LEN, MAX_URI_LEN};
use crate::resourcesync::{ChangeListHeader, DocLink, ParseError};
use time::OffsetDateTime;

/// What a Resource List's top-level `<rs:md>` says beyond a Change List's header.
#[derive(Debug, Default)]
pub(super) struct ListTimes {
    pub(super) at: Option<OffsetDateTime>,
    pub(super) completed: Option<OffsetDateTime>,
    pub(super) seq: Option<u64>,
}

/// Most top-level `<rs:ln>` links accepted.
pub(super) const MAX_DOC_LINKS: usize = 64;

/// Reads the top-level `<rs:md>` into `header` (and `list` for a Resource List) and decides
/// the document kind.
pub(super) fn top_md(
    root: Root,
    attrs: Vec<Attr>,
    header: &mut ChangeListHeader,
    list: &mut ListTimes,
) -> Result<Kind, ParseError> {
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
            (ns, "at") if ns.is_rs_attr() => {
                list.at = Some(
                    datetime(&attr.value).map_err(|e| ParseError::Header(format!("at: {e}")))?,
                )
            }
            (ns, "completed") if ns.is_rs_attr() => {
                list.completed = Some(
                    datetime(&attr.value)
                        .map_err(|e| ParseError::Header(format!("completed: {e}")))?,
                )
            }
            (Ns::Hub, "seq") => {
                list.seq = Some(
                    number(&attr.value).map_err(|e| ParseError::Header(format!("ch:seq: {e}")))?,
                )
            }
            (Ns::Hub, "first") => {
                first = Some(
                    number(&attr.value)
                        .map_err(|e| ParseError::Header(format!("ch:first: {e}")))?,
                )
            }
            (Ns::Hub, "epoch") => {
                if attr.value.len() > 64 {
                    return Err(ParseError::Header("ch:epoch is longer than 64".into()));
                }
                header.epoch = Some(attr.value.to_string())
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
        (Root::UrlSet, "resourcelist") => Ok(Kind::ResourceList),
        (Root::SitemapIndex, "resourcelist") => Ok(Kind::ResourceListIndex),
        (Root::UrlSet, "changedump") => Ok(Kind::ChangeDump),
        (Root::SitemapIndex, "changedump") => Ok(Kind::ChangeDumpIndex),
        (Root::UrlSet, "changedump-manifest") => Ok(Kind::ChangeDumpManifest),
        (Root::UrlSet, _) => Err(ParseError::UnexpectedCapability {
            expected: "changelist, resourcelist, changedump, changedump-manifest, capabilitylist or description".into(),
            found: truncate(&capability).into(),
        }),
        (Root::SitemapIndex, _) => Err(ParseError::UnexpectedCapability {
            expected: "changelist, resourcelist or changedump (in a <sitemapindex>)".into(),
            found: truncate(&capability).into(),
        }),
    }
}

/// A top-level `<rs:ln>`.
pub(super) fn doc_link(attrs: Vec<Attr>) -> Result<DocLink, ParseError> {
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
