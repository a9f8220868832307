//! The change model: what a source sends ([`NewChange`]), what the log holds ([`Change`]),
//! and the validation rules every ingest path (JSON, NDJSON, XML) shares.
//!
//! Invariant: a [`NewChange`] that passed [`NewChange::validate`] can be stored and rendered
//! without further checks; nothing downstream re-validates.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use time::format_description::well_known::Rfc3339;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time, UtcOffset};

/// Longest `loc` (and link `href`) accepted, in characters.
pub const MAX_URI_LEN: usize = 2048;
/// Longest free-text attribute (`hash`, `type`, link attributes) accepted, in bytes.
pub const MAX_ATTR_LEN: usize = 1024;
/// Most links one change may carry.
pub const MAX_LINKS: usize = 32;

/// The kind of change, as ResourceSync names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeType {
    Created,
    Updated,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Created => "created",
            ChangeType::Updated => "updated",
            ChangeType::Deleted => "deleted",
        }
    }

    pub fn parse(s: &str) -> Option<ChangeType> {
        match s {
            "created" => Some(ChangeType::Created),
            "updated" => Some(ChangeType::Updated),
            "deleted" => Some(ChangeType::Deleted),
            _ => None,
        }
    }
}

impl fmt::Display for ChangeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A link attached to a change (`<rs:ln>`): `rel`, `href` and any other attributes
/// (`type`, `hash`, `length`, `modified`, `pri`, …) kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub rel: String,
    pub href: String,
    #[serde(flatten, deserialize_with = "unique_attrs")]
    pub attrs: BTreeMap<String, String>,
}

/// A link's other attributes, refusing one given twice (a plain map would keep the last):
/// with `rel` and `href`, which serde refuses twice itself, a change's JSON then cannot name
/// any key twice without failing to parse, and ingest needs no separate walk to find out.
fn unique_attrs<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    struct Attrs;
    impl<'de> serde::de::Visitor<'de> for Attrs {
        type Value = BTreeMap<String, String>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a link's attributes")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut attrs = BTreeMap::new();
            while let Some((name, value)) = map.next_entry::<String, String>()? {
                if attrs.contains_key(&name) {
                    return Err(serde::de::Error::custom(format!(
                        "the key {name:?} appears twice"
                    )));
                }
                attrs.insert(name, value);
            }
            Ok(attrs)
        }
    }
    d.deserialize_map(Attrs)
}

/// A change as a source describes it, before the store gives it a seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewChange {
    pub loc: String,
    pub change: ChangeType,
    /// When the change happened; the receipt time when absent.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub datetime: Option<OffsetDateTime>,
    /// The resource's own modification time.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub lastmod: Option<OffsetDateTime>,
    #[serde(default)]
    pub hash: Option<String>,
    #[serde(default)]
    pub length: Option<u64>,
    /// Media type of the resource (`type` on the wire). Shared: the changes of one request
    /// nearly always name one or a few types, and ingest gives each a reference to one string.
    #[serde(default, rename = "type")]
    pub media_type: Option<Arc<str>>,
    #[serde(default)]
    pub links: Vec<Link>,
    /// Who sent it: the name of the publisher whose token came with it (never from the
    /// wire: the ingest endpoint sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Arc<str>>,
}

/// A change as the log holds it: numbered and dated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub seq: u64,
    pub loc: String,
    pub change: ChangeType,
    #[serde(with = "time::serde::rfc3339")]
    pub datetime: OffsetDateTime,
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub lastmod: Option<OffsetDateTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub media_type: Option<Arc<str>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Link>,
    /// The publisher that sent it, when it came through the ingest endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Arc<str>>,
    /// How many conflicting versions the resource's FeedSync item carries after this change
    /// (see [`super::feedsync`]); set by the store, 0 for most changes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub conflicts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Change {
    /// Numbers and dates a new change. `datetime` is the final (monotonic) time chosen by the
    /// store; when it differs from what the source gave and the source gave no `lastmod`,
    /// the source's time is kept as `lastmod`.
    pub fn from_new(seq: u64, new: NewChange, datetime: OffsetDateTime) -> Change {
        let lastmod = match (new.lastmod, new.datetime) {
            (Some(lm), _) => Some(lm),
            (None, Some(given)) if given != datetime => Some(given),
            _ => None,
        };
        Change {
            seq,
            loc: new.loc,
            change: new.change,
            datetime,
            lastmod,
            hash: new.hash,
            length: new.length,
            media_type: new.media_type,
            links: new.links,
            source: new.source,
            conflicts: 0,
        }
    }

    /// The bytes its strings hold on the heap (an estimate for bounding caches of changes).
    pub fn heap_size(&self) -> usize {
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
        self.loc.capacity()
            + text(&self.hash)
            // Shared by many changes, counted in each, as `source` below.
            + self.media_type.as_ref().map_or(0, |t| t.len())
            // Shared by the changes of a request, counted in each: an estimate that errs high.
            + self.source.as_ref().map_or(0, |s| s.len())
            + self.links.capacity() * std::mem::size_of::<Link>()
            + self
                .links
                .iter()
                .map(|l| {
                    l.rel.capacity()
                        + l.href.capacity()
                        + l.attrs
                            .iter()
                            .map(|(k, v)| k.len() + v.len())
                            .sum::<usize>()
                })
                .sum::<usize>()
    }
}

/// Why a change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("loc: {0}")]
    Loc(String),
    #[error("link {index}: {reason}")]
    Link { index: usize, reason: String },
    #[error("{field}: {reason}")]
    Field { field: &'static str, reason: String },
}

impl NewChange {
    /// A change of `loc` that says nothing more (no datetime: the hub stamps it on ingest).
    /// The other fields are set with struct update syntax:
    /// `NewChange { hash: Some(h), ..NewChange::new(loc, ChangeType::Updated) }`.
    pub fn new(loc: impl Into<String>, change: ChangeType) -> NewChange {
        NewChange {
            loc: loc.into(),
            change,
            datetime: None,
            lastmod: None,
            hash: None,
            length: None,
            media_type: None,
            links: vec![],
            source: None,
        }
    }

    /// Checks every field against the rules above (the limits of a change).
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_uri(&self.loc).map_err(ValidationError::Loc)?;
        if let Some(hash) = &self.hash {
            check_hash(hash).map_err(|reason| ValidationError::Field {
                field: "hash",
                reason,
            })?;
        }
        if let Some(t) = &self.media_type {
            check_text(t).map_err(|reason| ValidationError::Field {
                field: "type",
                reason,
            })?;
        }
        for (field, dt) in [("datetime", self.datetime), ("lastmod", self.lastmod)] {
            if let Some(dt) = dt {
                if dt.year() < 1 || dt.year() > 9999 {
                    return Err(ValidationError::Field {
                        field,
                        reason: "year out of range".into(),
                    });
                }
            }
        }
        if self.links.len() > MAX_LINKS {
            return Err(ValidationError::Field {
                field: "links",
                reason: format!("at most {MAX_LINKS} links"),
            });
        }
        for (index, link) in self.links.iter().enumerate() {
            let bad = |reason: String| ValidationError::Link { index, reason };
            if link.rel.is_empty() {
                return Err(bad("rel is empty".into()));
            }
            check_text(&link.rel).map_err(bad)?;
            check_uri(&link.href).map_err(|r| ValidationError::Link {
                index,
                reason: format!("href: {r}"),
            })?;
            for (name, value) in &link.attrs {
                if !is_xml_name(name)
                    || name == "rel"
                    || name == "href"
                    || name.to_ascii_lowercase().starts_with("xml")
                {
                    return Err(ValidationError::Link {
                        index,
                        reason: format!("attribute name {name:?} is not allowed"),
                    });
                }
                check_text(value).map_err(|r| ValidationError::Link {
                    index,
                    reason: format!("{name}: {r}"),
                })?;
            }
        }
        Ok(())
    }
}

thread_local! {
    /// The `scheme://authority` of the last URI [`check_uri`] accepted on this thread: the
    /// locs of one request nearly always share it.
    static ACCEPTED_AUTHORITY: std::cell::RefCell<String> =
        const { std::cell::RefCell::new(String::new()) };
}

/// Where the `scheme://authority` of `uri` ends, as a URL parser reads it for http(s): at the
/// first `/`, `\`, `?` or `#` after `://`, or at the end; `None` without `://`.
fn authority_end(uri: &str) -> Option<usize> {
    let bytes = uri.as_bytes();
    // By bytes (every character looked for is ASCII). Nearly always the first ':' is the
    // scheme's.
    let colon = bytes.iter().position(|&b| b == b':')?;
    let start = if bytes[colon..].starts_with(b"://") {
        colon + 3
    } else {
        uri.find("://")? + 3
    };
    Some(
        bytes[start..]
            .iter()
            .position(|b| matches!(b, b'/' | b'\\' | b'?' | b'#'))
            .map_or(uri.len(), |i| start + i),
    )
}

/// [`check_uri_fully`], answered without parsing when `uri` has the `scheme://authority` of
/// the last URI accepted on this thread: whatever follows the authority (path, query,
/// fragment) never makes an http(s) URL fail to parse, so only the checks on the text as a
/// whole are left (its length, no whitespace or control characters).
fn check_uri(uri: &str) -> Result<(), String> {
    let end = authority_end(uri);
    let known = end.is_some_and(|end| {
        ACCEPTED_AUTHORITY.with_borrow(|accepted| !accepted.is_empty() && *accepted == uri[..end])
    });
    if known {
        check_uri_length(uri)?;
        return check_uri_characters(uri);
    }
    check_uri_fully(uri)?;
    if let Some(end) = end {
        ACCEPTED_AUTHORITY.with_borrow_mut(|accepted| {
            accepted.clear();
            accepted.push_str(&uri[..end]);
        });
    }
    Ok(())
}

/// The first check of [`check_uri_fully`].
fn check_uri_length(uri: &str) -> Result<(), String> {
    // No more characters than bytes: most URIs need no count.
    if uri.len() > MAX_URI_LEN && uri.chars().count() > MAX_URI_LEN {
        return Err(format!("longer than {MAX_URI_LEN} characters"));
    }
    Ok(())
}

/// The last check of [`check_uri_fully`].
fn check_uri_characters(uri: &str) -> Result<(), String> {
    // Visible ASCII throughout (nearly always) is checked many bytes at a time; anything
    // else character by character.
    if !bytes_within(uri.as_bytes(), b'!', b'~')
        && uri.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err("contains whitespace or control characters".into());
    }
    Ok(())
}

fn check_uri_fully(uri: &str) -> Result<(), String> {
    check_uri_length(uri)?;
    let parsed = url::Url::parse(uri).map_err(|e| format!("not an absolute URI ({e})"))?;
    if parsed.scheme() != "http" && parsed.scheme() != "https" {
        return Err("must be an http or https URI".into());
    }
    // The parser reads `http:///a` as host `a`: the text itself must name a host.
    let authority = uri
        .split_once("://")
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""))
        .unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    if parsed.host().is_none() || host.is_empty() || host.starts_with(':') {
        return Err("has no host".into());
    }
    check_uri_characters(uri)
}

fn check_text(s: &str) -> Result<(), String> {
    if s.len() > MAX_ATTR_LEN {
        return Err(format!("longer than {MAX_ATTR_LEN} bytes"));
    }
    // Printable ASCII throughout (nearly always) is checked many bytes at a time; anything
    // else character by character.
    if !bytes_within(s.as_bytes(), b' ', b'~') && s.chars().any(char::is_control) {
        return Err("contains control characters".into());
    }
    Ok(())
}

/// Whether every byte of `bytes` is within `low..=high`. A fold without an early exit: the
/// compiler checks many bytes at a time.
fn bytes_within(bytes: &[u8], low: u8, high: u8) -> bool {
    bytes
        .iter()
        .fold(true, |within, &b| within & (b >= low) & (b <= high))
}

/// `hash`: space-separated `algorithm:hexdigest` tokens, e.g. `md5:1e0d… sha-256:854f…`.
fn check_hash(s: &str) -> Result<(), String> {
    check_text(s)?;
    if s.trim().is_empty() {
        return Err("is empty".into());
    }
    let check = |token: &str| {
        // By bytes: ':' is ASCII, and both parts may hold only ASCII.
        let bytes = token.as_bytes();
        let Some(colon) = bytes.iter().position(|&b| b == b':') else {
            return Err(format!("{token:?} is not algorithm:digest"));
        };
        let (alg, digest) = (&bytes[..colon], &bytes[colon + 1..]);
        let alg_ok = !alg.is_empty() && alg.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-');
        if !alg_ok || digest.is_empty() || !digest.iter().all(u8::is_ascii_hexdigit) {
            return Err(format!("{token:?} is not algorithm:hexdigest"));
        }
        Ok(())
    };
    if s.is_ascii() {
        // Past `check_text`, the space is the only whitespace left in ASCII.
        s.split(' ').filter(|t| !t.is_empty()).try_for_each(check)
    } else {
        s.split_whitespace().try_for_each(check)
    }
}

fn is_xml_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && s.len() <= 64
}

/// Parses a W3C Datetime (the profile of ISO 8601 that sitemaps use): `YYYY`, `YYYY-MM`,
/// `YYYY-MM-DD`, or a date with `Thh:mm`, `Thh:mm:ss` or `Thh:mm:ss.s…` and a zone
/// designator (`Z` or `±hh:mm`). Dates without a time are read as midnight UTC.
pub fn parse_w3c_datetime(s: &str) -> Result<OffsetDateTime, String> {
    let upper = s.trim().to_ascii_uppercase();
    let s = upper.as_str();
    let bad = || format!("{s:?} is not a W3C datetime");
    if s.contains('T') {
        if let Ok(dt) = OffsetDateTime::parse(s, &Rfc3339) {
            return in_utc(dt, s);
        }
        // hh:mm without seconds: insert ":00" before the zone designator.
        let (date, rest) = s.split_once('T').ok_or_else(bad)?;
        let zone_at = rest
            .find(['Z', '+', '-'])
            .ok_or_else(|| format!("{s:?} has no time zone designator"))?;
        let (clock, zone) = rest.split_at(zone_at);
        if clock.len() == 5 {
            let full = format!("{date}T{clock}:00{zone}");
            let dt = OffsetDateTime::parse(&full, &Rfc3339).map_err(|_| bad())?;
            return in_utc(dt, s);
        }
        return Err(bad());
    }
    let parts: Vec<&str> = s.split('-').collect();
    let num = |p: &str, len: usize| -> Result<u32, String> {
        if p.len() != len || !p.chars().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        p.parse().map_err(|_| bad())
    };
    let (y, m, d) = match parts.as_slice() {
        [y] => (num(y, 4)?, 1, 1),
        [y, m] => (num(y, 4)?, num(m, 2)?, 1),
        [y, m, d] => (num(y, 4)?, num(m, 2)?, num(d, 2)?),
        _ => return Err(bad()),
    };
    let month = Month::try_from(m as u8).map_err(|_| bad())?;
    let date = Date::from_calendar_date(y as i32, month, d as u8).map_err(|_| bad())?;
    Ok(PrimitiveDateTime::new(date, Time::MIDNIGHT).assume_utc())
}

/// `dt` in UTC, when that is still a year from 0000 to 9999 (`9999-12-31T23:59:59-23:59` is
/// not: in UTC it falls in the year 10000, which no document can carry).
fn in_utc(dt: OffsetDateTime, text: &str) -> Result<OffsetDateTime, String> {
    dt.checked_to_offset(UtcOffset::UTC)
        .filter(|utc| (0..=9999).contains(&utc.year()))
        .ok_or_else(|| format!("{text:?} is out of range (years 0000 to 9999 in UTC)"))
}

/// Formats a datetime the way every document of the hub writes it: RFC 3339 in UTC with `Z`.
pub fn format_datetime(dt: OffsetDateTime) -> String {
    let mut out = Vec::with_capacity(32);
    write_datetime(dt, &mut out);
    // Only ASCII is written.
    String::from_utf8(out).unwrap_or_default()
}

/// Appends [`format_datetime`]'s text to `out`, without a `String` of its own (a document
/// writes several per change).
pub fn write_datetime(dt: OffsetDateTime, out: &mut Vec<u8>) {
    /// Written for a datetime RFC 3339 cannot hold (a year before 0 or past 9999 in UTC).
    const FALLBACK: &[u8] = b"1970-01-01T00:00:00Z";
    let start = out.len();
    if dt
        .to_offset(UtcOffset::UTC)
        .format_into(out, &Rfc3339)
        .is_err()
    {
        out.truncate(start);
        out.extend_from_slice(FALLBACK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checks' ASCII shortcuts refuse exactly what the checks by character refuse, for
    /// every ASCII byte, alone and next to a character that is not ASCII.
    #[test]
    fn the_ascii_shortcuts_of_the_checks_agree_with_the_checks_by_character() {
        for b in 0u8..=127 {
            let c = char::from(b);
            for text in [
                format!("http://example.com/a{c}b"),
                format!("http://é.example/{c}"),
            ] {
                let by_char = text.chars().any(|c| c.is_control() || c.is_whitespace());
                assert_eq!(check_uri_characters(&text).is_err(), by_char, "{b:#x}");
                let by_char = text.chars().any(char::is_control);
                assert_eq!(check_text(&text).is_err(), by_char, "{b:#x}");
            }
            for hash in [
                format!("md5:0a{c}1f sha-1:ff"),
                format!("md5:0a{c}\u{a0}sha-1:ff"),
            ] {
                let by_token = check_text(&hash).is_ok()
                    && hash.split_whitespace().all(|t| {
                        t.split_once(':').is_some_and(|(alg, digest)| {
                            !alg.is_empty()
                                && alg.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                                && !digest.is_empty()
                                && digest.chars().all(|c| c.is_ascii_hexdigit())
                        })
                    });
                assert_eq!(check_hash(&hash).is_ok(), by_token, "{b:#x} in {hash:?}");
            }
        }
        let long = format!("http://example.com/{}", "é".repeat(MAX_URI_LEN / 2));
        assert!(
            check_uri_length(&long).is_ok(),
            "characters count, not bytes"
        );
        let longer = format!("http://example.com/{}", "é".repeat(MAX_URI_LEN));
        assert!(check_uri_length(&longer).is_err());
    }

    /// Where the authority ends, by bytes, is where a search by characters finds it.
    #[test]
    fn the_authority_ends_where_a_search_by_characters_says() {
        let by_chars = |uri: &str| {
            let start = uri.find("://")? + 3;
            Some(
                uri[start..]
                    .find(['/', '\\', '?', '#'])
                    .map_or(uri.len(), |i| start + i),
            )
        };
        for uri in [
            "http://example.com/a",
            "https://example.com",
            "http://é.example?q",
            "http://user:pw@host:80#f",
            "http://h\\path",
            "urn:x:http://h/p",
            "mailto:someone",
            "no scheme",
            "http:/one-slash/a",
            "",
            "://",
        ] {
            assert_eq!(authority_end(uri), by_chars(uri), "{uri:?}");
        }
    }

    #[test]
    fn datetimes_beyond_year_9999_in_utc_are_refused() {
        for text in [
            "9999-12-31T23:59:59-23:59",
            "9999-12-31T23:00-01:00",
            "0000-01-01T00:00:00+00:01",
        ] {
            let err = parse_w3c_datetime(text).unwrap_err();
            assert!(err.contains("out of range"), "{text}: {err}");
        }
        let last = parse_w3c_datetime("9999-12-31T23:59:59+23:59").unwrap();
        assert_eq!(last.year(), 9999);
        assert_eq!(format_datetime(last), "9999-12-31T00:00:59Z");
    }

    /// A datetime written into a document's buffer is the text `format_datetime` gives,
    /// after what the buffer held; one RFC 3339 cannot hold is the fallback, with nothing of
    /// a failed attempt left before it.
    #[test]
    fn datetimes_written_into_a_buffer_are_their_text() {
        // Before year 0: RFC 3339 has no such year.
        let beyond = Date::from_calendar_date(-1, Month::January, 1)
            .unwrap()
            .midnight()
            .assume_utc();
        for dt in [
            OffsetDateTime::UNIX_EPOCH,
            parse_w3c_datetime("2013-01-03T09:00:00.123456789+01:30").unwrap(),
            parse_w3c_datetime("0001-02-03T04:05:06Z").unwrap(),
            beyond,
        ] {
            let mut out = b"<lastmod>".to_vec();
            write_datetime(dt, &mut out);
            let text = format_datetime(dt);
            assert_eq!(&out[..9], b"<lastmod>");
            assert_eq!(std::str::from_utf8(&out[9..]).unwrap(), text);
        }
        assert_eq!(format_datetime(beyond), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_datetime(parse_w3c_datetime("2013-01-03T09:00:00.5+01:30").unwrap()),
            "2013-01-03T07:30:00.5Z"
        );
    }

    fn new(loc: &str) -> NewChange {
        NewChange::new(loc, ChangeType::Created)
    }

    #[test]
    fn w3c_datetimes() {
        for (input, want) in [
            ("2013-01-03T09:00:00Z", "2013-01-03T09:00:00Z"),
            ("2013-01-03T09:00Z", "2013-01-03T09:00:00Z"),
            ("2013-01-03T10:00:00+01:00", "2013-01-03T09:00:00Z"),
            ("2013-01-03T09:00:00.5Z", "2013-01-03T09:00:00.5Z"),
            ("2013-01-03", "2013-01-03T00:00:00Z"),
            ("2013-01", "2013-01-01T00:00:00Z"),
            ("2013", "2013-01-01T00:00:00Z"),
        ] {
            let dt = parse_w3c_datetime(input).unwrap();
            assert_eq!(format_datetime(dt), want, "{input}");
        }
        for bad in [
            "",
            "yesterday",
            "2013-13-01",
            "2013-01-03T09:00:00",
            "13-01-03",
            "2013-02-30",
        ] {
            assert!(parse_w3c_datetime(bad).is_err(), "{bad}");
        }
    }

    /// A URI checked right after another one with the same `scheme://authority` (the check
    /// then takes a shortcut) gets the answer it gets on its own.
    #[test]
    fn a_uri_after_one_of_the_same_authority_is_checked_the_same() {
        let uris = [
            "http://example.com/a",
            "http://example.com",
            "http://example.com/",
            "http://example.com?q",
            "http://example.com#f",
            "http://example.com\\x",
            "http://example.com/a b",
            "http://example.com/a\tb",
            "http://example.com/%zz/../..//x?y=%00#\u{e9}",
            "http://example.com.evil/a",
            "http://example.com:99999/a",
            "http://example.com:80/a",
            "http://example.co/a",
            "HTTP://example.com/a",
            "https://example.com/a",
            "http://user@example.com/a",
            "http://[::1]/a",
            "http://[::1/a",
            "http:///a",
            "http://",
            "/relative",
            "ftp://example.com/a",
            "http://ex ample.com/a",
        ];
        let long = format!("http://example.com/{}", "a".repeat(MAX_URI_LEN));
        for uri in uris.iter().copied().chain([long.as_str()]) {
            let alone = check_uri_fully(uri);
            for before in uris {
                let _ = check_uri(before);
                assert_eq!(check_uri(uri), alone, "{uri} after {before}");
            }
        }
        // The shortcut is taken: the authority accepted is the last one.
        check_uri("https://example.org/x").unwrap();
        ACCEPTED_AUTHORITY.with_borrow(|a| assert_eq!(a, "https://example.org"));
    }

    #[test]
    fn validation_rules() {
        assert!(new("http://example.com/a").validate().is_ok());
        assert!(new("https://user@example.com:8443/a?b#c")
            .validate()
            .is_ok());
        assert!(new("/relative").validate().is_err());
        for hostless in [
            "http:///a",
            "http://",
            "https:///",
            "http://user@/a",
            "http://:80/a",
        ] {
            assert!(new(hostless).validate().is_err(), "{hostless}");
        }
        assert!(new("ftp://example.com/a").validate().is_err());
        assert!(
            new(&format!("http://example.com/{}", "a".repeat(MAX_URI_LEN)))
                .validate()
                .is_err()
        );
        let mut c = new("http://example.com/a");
        c.hash = Some("md5:1e0d5cb8ef6ba40c99b14c0237be735e sha-256:854f61290e2e1".into());
        assert!(c.validate().is_ok());
        c.hash = Some("md5".into());
        assert!(c.validate().is_err());
        c.hash = None;
        c.links = vec![Link {
            rel: "alternate".into(),
            href: "relative".into(),
            attrs: BTreeMap::new(),
        }];
        assert!(matches!(
            c.validate(),
            Err(ValidationError::Link { index: 0, .. })
        ));
    }

    #[test]
    fn source_time_kept_as_lastmod_when_moved() {
        let mut n = new("http://example.com/a");
        let given = parse_w3c_datetime("2020-01-01T00:00:00Z").unwrap();
        let later = parse_w3c_datetime("2021-01-01T00:00:00Z").unwrap();
        n.datetime = Some(given);
        let c = Change::from_new(7, n.clone(), later);
        assert_eq!(c.lastmod, Some(given));
        let c = Change::from_new(7, n, given);
        assert_eq!(c.lastmod, None);
    }
}
