//! The ingest body formats: JSON (one change, an array, or `{"changes": […]}`), NDJSON and
//! ResourceSync Change Lists, parsed and validated all or nothing.

use serde::Deserialize;

use crate::model::{parse_w3c_datetime, ChangeType, Link, NewChange};
use crate::resourcesync;

/// A change on the wire (JSON and NDJSON). Unknown fields are refused so that typos surface.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireChange<'a> {
    loc: String,
    /// Borrowed from the body where it needs no unescaping (always, for a good body).
    #[serde(borrow)]
    change: std::borrow::Cow<'a, str>,
    #[serde(default)]
    datetime: Option<String>,
    #[serde(default)]
    lastmod: Option<String>,
    #[serde(default)]
    hash: Option<String>,
    #[serde(default)]
    length: Option<u64>,
    /// Borrowed like `change`: [`Types`] makes the change's shared string.
    #[serde(default, rename = "type", borrow)]
    media_type: Option<Text<'a>>,
    #[serde(default)]
    links: Vec<Link>,
}

/// A string borrowed from the body where it needs no unescaping. (In an `Option`, a bare
/// `Cow` is always read into a `String`: serde borrows only a field that is a `Cow` itself.)
#[derive(Debug, Deserialize)]
#[serde(transparent)]
struct Text<'a>(#[serde(borrow)] std::borrow::Cow<'a, str>);

/// The media types of one body's changes, each made into a shared string once for a run of
/// changes that name it (a body nearly always names one or a few): one reference more per
/// change instead of an allocation and a copy, and one less to free.
#[derive(Default)]
struct Types {
    last: Option<std::sync::Arc<str>>,
}

impl Types {
    fn of(&mut self, name: &str) -> std::sync::Arc<str> {
        match &self.last {
            Some(last) if **last == *name => last.clone(),
            _ => self.last.insert(name.into()).clone(),
        }
    }
}

/// A refused body: the reason, and the index of the bad change when one is to blame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    pub reason: String,
    pub index: Option<usize>,
}

impl BodyError {
    fn whole(reason: impl Into<String>) -> BodyError {
        BodyError {
            reason: reason.into(),
            index: None,
        }
    }
    fn at(index: usize, reason: impl Into<String>) -> BodyError {
        BodyError {
            reason: format!("change {index}: {}", reason.into()),
            index: Some(index),
        }
    }
}

/// The body formats ingest understands, chosen by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    NdJson,
    Xml,
}

impl Format {
    /// `None` for an unsupported media type. A missing `Content-Type` means JSON.
    pub fn from_content_type(value: Option<&str>) -> Option<Format> {
        let Some(value) = value else {
            return Some(Format::Json);
        };
        match crate::net::media::essence(value).as_ref() {
            "application/json" => Some(Format::Json),
            "application/x-ndjson"
            | "application/ndjson"
            | "application/jsonl"
            | "application/x-jsonlines"
            | "application/jsonlines" => Some(Format::NdJson),
            "application/xml" | "text/xml" => Some(Format::Xml),
            e if e.ends_with("+json") => Some(Format::Json),
            e if e.ends_with("+xml") => Some(Format::Xml),
            _ => None,
        }
    }
}

/// A JSON document walked only to refuse an object that names a key twice (a plain parse
/// would keep the last one silently).
struct NoDuplicateKeys;

impl<'de> Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeysVisitor)
    }
}

struct NoDuplicateKeysVisitor;

impl<'de> serde::de::Visitor<'de> for NoDuplicateKeysVisitor {
    type Value = NoDuplicateKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<NoDuplicateKeys, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<NoDuplicateKeys, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<NoDuplicateKeys, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<NoDuplicateKeys, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<NoDuplicateKeys, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_unit<E>(self) -> Result<NoDuplicateKeys, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<NoDuplicateKeys, A::Error> {
        while seq.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(NoDuplicateKeys)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<NoDuplicateKeys, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!(
                    "the key {key:?} appears twice"
                )));
            }
            map.next_value::<NoDuplicateKeys>()?;
        }
        Ok(NoDuplicateKeys)
    }
}

/// Parses JSON text, refusing objects with a key twice.
fn parse_json(text: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::from_slice::<NoDuplicateKeys>(text)?;
    serde_json::from_slice(text)
}

fn convert(
    index: usize,
    value: serde_json::Value,
    types: &mut Types,
) -> Result<NewChange, BodyError> {
    let wire = WireChange::deserialize(&value).map_err(|e| BodyError::at(index, e.to_string()))?;
    from_wire(index, wire, types)
}

fn from_wire(
    index: usize,
    wire: WireChange<'_>,
    types: &mut Types,
) -> Result<NewChange, BodyError> {
    let change = ChangeType::parse(&wire.change).ok_or_else(|| {
        BodyError::at(
            index,
            format!(
                "unknown change type {:?} (created, updated or deleted)",
                wire.change
            ),
        )
    })?;
    let datetime = |field: &str, v: Option<String>| -> Result<_, BodyError> {
        v.map(|s| parse_w3c_datetime(&s))
            .transpose()
            .map_err(|e| BodyError::at(index, format!("{field}: {e}")))
    };
    let new = NewChange {
        loc: wire.loc,
        change,
        datetime: datetime("datetime", wire.datetime)?,
        lastmod: datetime("lastmod", wire.lastmod)?,
        hash: wire.hash,
        length: wire.length,
        media_type: wire.media_type.map(|t| types.of(&t.0)),
        links: wire.links,
        source: None,
    };
    new.validate()
        .map_err(|e| BodyError::at(index, e.to_string()))?;
    Ok(new)
}

/// The changes of a JSON array, each turned into a [`NewChange`] as soon as it is read (no
/// vector of wire forms in between): the fast way's reader of `[...]` and of the array in
/// `{"changes": [...]}`. It stops at the first change [`from_wire`] refuses, and past `max`.
#[derive(Clone, Copy)]
struct ChangesSeed {
    max: usize,
    /// How many changes the array likely holds ([`likely_changes`]): the vector's room.
    likely: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for ChangesSeed {
    type Value = Vec<NewChange>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ChangesSeed {
    type Value = Vec<NewChange>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of changes")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let mut out = Vec::with_capacity(self.likely.min(self.max));
        let mut types = Types::default();
        while let Some(wire) = seq.next_element::<WireChange<'de>>()? {
            if out.len() == self.max {
                return Err(A::Error::custom("too many changes"));
            }
            let change =
                from_wire(out.len(), wire, &mut types).map_err(|e| A::Error::custom(e.reason))?;
            out.push(change);
        }
        Ok(out)
    }
}

/// `{"changes": [...]}`, the third shape of a JSON body, the fast way: exactly one key,
/// `changes`, whose array [`ChangesSeed`] reads.
struct WrappedSeed(ChangesSeed);

impl<'de> serde::de::DeserializeSeed<'de> for WrappedSeed {
    type Value = Vec<NewChange>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for WrappedSeed {
    type Value = Vec<NewChange>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("{\"changes\": [...]}")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let mut changes = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key != "changes" || changes.is_some() {
                return Err(A::Error::custom("not the wrapped shape"));
            }
            changes = Some(map.next_value_seed(self.0)?);
        }
        changes.ok_or_else(|| A::Error::custom("not the wrapped shape"))
    }
}

/// The changes of a good JSON body, each parsed straight into its wire form and checked as it
/// is read; `None` for anything else, which [`parse_body`] then parses again the thorough way,
/// for the error it gives.
///
/// The thorough way reads every change into a `serde_json::Value` first (to tell the shapes
/// apart and to name the change at fault); that costs more than the rest of ingest for large
/// bodies. Both ways accept the same bodies: this one takes each shape with the same
/// `WireChange` rules and gives up at the first thing wrong. A key given twice is wrong here
/// too, without a walk of its own: every object of a good body is a `WireChange`, a `Link` or
/// the `{"changes": …}` wrapper, and each refuses a key it is given twice (serde refuses a
/// field twice, and a link's other attributes refuse a name twice).
///
/// A good body is UTF-8 throughout: checked once for the whole body, serde then reads each
/// string without checking it again (about 800 instructions a change less).
fn parse_json_fast(text: &[u8], max_entries: usize) -> Option<Vec<NewChange>> {
    use serde::de::DeserializeSeed;
    let text = std::str::from_utf8(text).ok()?;
    let first = text.bytes().find(|b| !b.is_ascii_whitespace())?;
    let seed = ChangesSeed {
        max: max_entries,
        likely: likely_changes(text.as_bytes()),
    };
    match first {
        b'[' => whole(text, |d| seed.deserialize(d)),
        b'{' => whole(text, |d| WrappedSeed(seed).deserialize(d)).or_else(|| {
            let wire = serde_json::from_str::<WireChange>(text).ok()?;
            Some(vec![from_wire(0, wire, &mut Types::default()).ok()?])
        }),
        _ => None,
    }
}

/// How many changes a JSON body likely holds: how often `"loc"` appears in it, which is once
/// per change (a loc or other string that holds those five characters has its quotes
/// escaped), and more only where a link has an attribute of that name; never more than the
/// body could hold ([`SMALLEST_CHANGE`]). Counted many bytes at a time, it lets the vector of
/// a large body's changes be allocated once: grown by doubling, 1,000 changes of about 200
/// bytes each were copied about twice over.
fn likely_changes(text: &[u8]) -> usize {
    let keys = memchr::memmem::find_iter(text, br#""loc""#).count();
    keys.min(text.len() / SMALLEST_CHANGE)
}

/// Fewer bytes than any change takes in JSON: `{"loc":"http://a","change":"created"}` is 37.
const SMALLEST_CHANGE: usize = 32;

/// What `read` reads from `text`, when it reads it all (nothing but whitespace after it).
fn whole<'a, T>(
    text: &'a str,
    read: impl FnOnce(
        &mut serde_json::Deserializer<serde_json::de::StrRead<'a>>,
    ) -> serde_json::Result<T>,
) -> Option<T> {
    let mut d = serde_json::Deserializer::from_str(text);
    let value = read(&mut d).ok()?;
    d.end().ok()?;
    Some(value)
}

/// One change object (an NDJSON line) the fast way (see [`parse_json_fast`]): `None` when
/// anything is wrong with it.
fn change_fast(index: usize, text: &str, types: &mut Types) -> Option<NewChange> {
    from_wire(index, serde_json::from_str(text).ok()?, types).ok()
}

/// The changes of a JSON body, or the error that names what is wrong with it (the change at
/// fault by its index).
fn parse_json_thorough(body: &[u8], max_entries: usize) -> Result<Vec<NewChange>, BodyError> {
    let value = parse_json(body).map_err(|e| BodyError::whole(format!("malformed JSON: {e}")))?;
    let items = match value {
        serde_json::Value::Array(items) => items,
        serde_json::Value::Object(mut map) if map.contains_key("changes") => {
            if map.len() > 1 {
                return Err(BodyError::whole(
                    "an object with \"changes\" may have no other fields",
                ));
            }
            match map.remove("changes") {
                Some(serde_json::Value::Array(items)) => items,
                _ => return Err(BodyError::whole("\"changes\" must be an array")),
            }
        }
        obj @ serde_json::Value::Object(_) => vec![obj],
        _ => {
            return Err(BodyError::whole(
                "expected a change object, an array of changes or {\"changes\": [...]}",
            ))
        }
    };
    if items.len() > max_entries {
        return Err(BodyError::whole(format!("more than {max_entries} changes")));
    }
    let mut types = Types::default();
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| convert(i, v, &mut types))
        .collect()
}

/// Parses and validates an ingest body. Either every change is good, or nothing is returned.
pub fn parse_body(
    format: Format,
    body: &[u8],
    max_entries: usize,
) -> Result<Vec<NewChange>, BodyError> {
    if body.starts_with(&[0x1f, 0x8b]) {
        return Err(BodyError::whole(
            "the body is gzip-compressed: send it with Content-Encoding: gzip",
        ));
    }
    let changes = match format {
        Format::Json => match parse_json_fast(body, max_entries) {
            Some(changes) => changes,
            None => parse_json_thorough(body, max_entries)?,
        },
        Format::NdJson => {
            let text = std::str::from_utf8(body)
                .map_err(|_| BodyError::whole("NDJSON body is not UTF-8"))?;
            let mut out = Vec::new();
            let mut types = Types::default();
            for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                let index = out.len();
                if index >= max_entries {
                    return Err(BodyError::whole(format!("more than {max_entries} changes")));
                }
                if let Some(change) = change_fast(index, line, &mut types) {
                    out.push(change);
                    continue;
                }
                let value = parse_json(line.as_bytes())
                    .map_err(|e| BodyError::at(index, format!("malformed JSON: {e}")))?;
                out.push(convert(index, value, &mut types)?);
            }
            out
        }
        Format::Xml => {
            let limits = resourcesync::Limits {
                max_bytes: body.len().max(1),
                max_entries,
            };
            let (_, entries) =
                resourcesync::parse_change_list(body, &limits).map_err(|e| match e {
                    resourcesync::ParseError::Entry { index, reason } => {
                        BodyError::at(index, reason)
                    }
                    other => BodyError::whole(format!("invalid Change List: {other}")),
                })?;
            let mut out = Vec::with_capacity(entries.len());
            for (index, entry) in entries.into_iter().enumerate() {
                entry
                    .change
                    .validate()
                    .map_err(|e| BodyError::at(index, e.to_string()))?;
                out.push(entry.change);
            }
            out
        }
    };
    nonempty(changes)
}

fn nonempty(changes: Vec<NewChange>) -> Result<Vec<NewChange>, BodyError> {
    if changes.is_empty() {
        return Err(BodyError::whole("the body holds no changes"));
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_likely_count_of_changes_is_one_per_loc_key() {
        let body = br#"[{"loc":"http://e.com/\"loc\"","change":"created"},
            {"loc":"http://e.com/b","change":"updated","links":[{"rel":"x","href":"http://e.com/c","loc":"y"}]},
            {"change":"deleted","loc":"http://e.com/d"}]"#;
        // Three changes; the link's attribute named loc counts too (a hint, never less).
        assert_eq!(likely_changes(body), 4);
        assert_eq!(likely_changes(b"[]"), 0);
        // Never more than a body of its size could hold, whatever it is made of.
        let crafted = format!("[{}\"loc\"]", r#""loc","#.repeat(1000));
        assert_eq!(
            likely_changes(crafted.as_bytes()),
            crafted.len() / SMALLEST_CHANGE
        );
        assert!(crafted.len() / SMALLEST_CHANGE < 1001);
    }

    #[test]
    fn the_changes_of_a_body_share_each_run_of_one_media_type() {
        let body = br#"[{"loc":"http://e.com/a","change":"created","type":"text/plain"},
            {"loc":"http://e.com/b","change":"created","type":"text\/plain"},
            {"loc":"http://e.com/c","change":"created","type":"image/png"},
            {"loc":"http://e.com/d","change":"created"}]"#;
        for format in [Format::Json, Format::NdJson] {
            let text = std::str::from_utf8(body).unwrap();
            let body = match format {
                Format::NdJson => text
                    .trim_matches(['[', ']'])
                    .split(",\n")
                    .map(str::trim)
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => text.to_string(),
            };
            let changes = parse_body(format, body.as_bytes(), 10).unwrap();
            let types: Vec<_> = changes.iter().map(|c| c.media_type.clone()).collect();
            assert_eq!(types[0].as_deref(), Some("text/plain"), "{format:?}");
            assert_eq!(
                types[1].as_deref(),
                Some("text/plain"),
                "unescaped, {format:?}"
            );
            let (a, b) = (types[0].as_ref().unwrap(), types[1].as_ref().unwrap());
            assert!(std::sync::Arc::ptr_eq(a, b), "one string, {format:?}");
            assert_eq!(types[2].as_deref(), Some("image/png"));
            assert_eq!(types[3], None);
        }
    }

    #[test]
    fn json_shapes() {
        let one = br#"{"loc":"http://e.com/a","change":"created"}"#;
        let arr = br#"[{"loc":"http://e.com/a","change":"created"},{"loc":"http://e.com/b","change":"deleted","datetime":"2024-01-01"}]"#;
        let env = br#"{"changes":[{"loc":"http://e.com/a","change":"updated","hash":"md5:00ff","length":3,"type":"text/plain","links":[{"rel":"alternate","href":"http://e.com/a.html","type":"text/html"}]}]}"#;
        assert_eq!(parse_body(Format::Json, one, 10).unwrap().len(), 1);
        assert_eq!(parse_body(Format::Json, arr, 10).unwrap().len(), 2);
        let c = parse_body(Format::Json, env, 10).unwrap();
        assert_eq!(c[0].links[0].attrs["type"], "text/html");
    }

    #[test]
    fn a_compressed_body_without_its_encoding_is_named_as_such() {
        // What `gzip` makes of one NDJSON line: the magic bytes 1f 8b come first.
        let gzipped = [0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03];
        for format in [Format::Json, Format::NdJson, Format::Xml] {
            let e = parse_body(format, &gzipped, 10).unwrap_err();
            assert!(e.reason.contains("Content-Encoding: gzip"), "{}", e.reason);
        }
    }

    #[test]
    fn a_key_given_twice_is_refused_not_overwritten() {
        for (format, body) in [
            (Format::Json, &br#"{"loc":"http://e.com/a","change":"created","loc":"http://e.com/b"}"#[..]),
            (Format::Json, br#"[{"loc":"http://e.com/a","change":"created","change":"deleted"}]"#),
            (Format::Json, br#"{"changes":[],"changes":[{"loc":"http://e.com/a","change":"created"}]}"#),
            (
                Format::Json,
                br#"{"loc":"http://e.com/a","change":"created","links":[{"rel":"a","href":"http://e.com/x","rel":"b"}]}"#,
            ),
            (Format::NdJson, br#"{"loc":"http://e.com/a","change":"created","change":"updated"}"#),
        ] {
            let e = parse_body(format, body, 10).unwrap_err();
            assert!(e.reason.contains("appears twice"), "{}: {}", String::from_utf8_lossy(body), e.reason);
        }
        // The same key in different objects is fine.
        let two = br#"[{"loc":"http://e.com/a","change":"created"},{"loc":"http://e.com/b","change":"created"}]"#;
        assert_eq!(parse_body(Format::Json, two, 10).unwrap().len(), 2);
    }

    #[test]
    fn bad_change_is_named_by_index() {
        let arr = br#"[{"loc":"http://e.com/a","change":"created"},{"loc":"http://e.com/b","change":"moved"}]"#;
        let e = parse_body(Format::Json, arr, 10).unwrap_err();
        assert_eq!(e.index, Some(1));
        assert!(e.reason.contains("moved"), "{}", e.reason);
        let nd = b"{\"loc\":\"http://e.com/a\",\"change\":\"created\"}\n\n{\"loc\":\"rel\",\"change\":\"created\"}\n";
        assert_eq!(
            parse_body(Format::NdJson, nd, 10).unwrap_err().index,
            Some(1)
        );
        let unknown = br#"{"loc":"http://e.com/a","change":"created","colour":"red"}"#;
        assert_eq!(
            parse_body(Format::Json, unknown, 10).unwrap_err().index,
            Some(0)
        );
        assert!(parse_body(Format::Json, b"[]", 10).is_err());
        assert!(parse_body(Format::Json, b"{", 10)
            .unwrap_err()
            .index
            .is_none());
        assert!(parse_body(Format::Json, b"42", 10).is_err());
    }

    #[test]
    fn the_fast_json_path_takes_good_bodies_as_the_thorough_one_does_and_no_other() {
        let good: &[&[u8]] = &[
            br#"{"loc":"http://e.com/a","change":"created"}"#,
            br#" [{"loc":"http://e.com/a","change":"created"},{"loc":"http://e.com/b","change":"deleted","datetime":"2024-01-01","lastmod":null}]"#,
            br#"{"changes":[{"loc":"http://e.com/a","change":"updated","hash":"md5:00ff","length":3,"type":"text/plain","links":[{"rel":"alternate","href":"http://e.com/a.html","type":"text/html"}]}]}"#,
            br#"{"change":"updated","loc":"http://e.com/\u0061"}"#,
            // An escaped kind (not borrowed from the body), a loc that is not ASCII.
            br#"[{"loc":"http://e.com/a","change":"upd\u0061ted"}]"#,
            "[{\"loc\":\"http://e.com/caf\u{e9}\",\"change\":\"created\"}]".as_bytes(),
            // The wrapper's key escaped.
            br#"{"ch\u0061nges":[{"loc":"http://e.com/a","change":"created"}]}"#,
        ];
        for body in good {
            let fast = parse_json_fast(body, 10);
            assert!(fast.is_some(), "{}", String::from_utf8_lossy(body));
            assert_eq!(fast.unwrap(), parse_json_thorough(body, 10).unwrap());
        }
        // Everything the thorough path refuses, the fast one gives up on (and the body is
        // then parsed the thorough way, for its error).
        let bad: &[&[u8]] = &[
            br#"{"loc":"http://e.com/a","change":"created","loc":"http://e.com/b"}"#,
            br#"{"loc":"http://e.com/a","change":"created","links":[{"rel":"a","href":"http://e.com/x","rel":"b"}]}"#,
            br#"{"loc":"http://e.com/a","change":"created","links":[{"rel":"a","href":"http://e.com/x","type":"a","type":"b"}]}"#,
            br#"{"loc":"http://e.com/a","change":"created","links":[{"rel":"a","href":"http://e.com/x","type":"a","t\u0079pe":"b"}]}"#,
            br#"{"loc":"http://e.com/a","change":"created","l\u006fc":"http://e.com/b"}"#,
            br#"{"changes":[],"changes":[{"loc":"http://e.com/a","change":"created"}]}"#,
            br#"{"changes":[{"loc":"http://e.com/a","change":"created"}],"other":1}"#,
            br#"{"changes":{"loc":"http://e.com/a","change":"created"}}"#,
            br#"{"changes":[]}"#,
            br#"[]"#,
            br#"[{"loc":"http://e.com/a","change":"moved"}]"#,
            br#"[{"loc":"rel","change":"created"}]"#,
            br#"[{"loc":"http://e.com/a","change":"created","length":1.0}]"#,
            br#"[{"loc":"http://e.com/a","change":"created","datetime":"yesterday"}]"#,
            br#"[{"loc":"http://e.com/a","change":"created","colour":"red"}]"#,
            br#"[{"loc":"http://e.com/a","change":"created"}] x"#,
            br#""a string""#,
            b"42",
            b"{",
            // Not UTF-8, inside a string and outside one.
            b"[{\"loc\":\"http://e.com/\xff\",\"change\":\"created\"}]",
            b"[{\"loc\":\"http://e.com/a\",\"change\":\"created\"}]\xc3",
        ];
        for body in bad {
            let thorough = parse_json_thorough(body, 10).and_then(nonempty);
            assert!(thorough.is_err(), "{}", String::from_utf8_lossy(body));
            let fast = parse_json_fast(body, 10).map(nonempty);
            assert!(
                matches!(fast, None | Some(Err(_))),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        // Too many changes: given up on too, so that the error says so.
        let three = br#"[{"loc":"http://e.com/a","change":"created"},{"loc":"http://e.com/b","change":"created"},{"loc":"http://e.com/c","change":"created"}]"#;
        let wrapped = [&br#"{"changes":"#[..], three, b"}"].concat();
        for body in [&three[..], &wrapped] {
            assert!(parse_json_fast(body, 2).is_none());
            assert!(parse_json_fast(body, 3).is_some());
            assert!(parse_body(Format::Json, body, 2)
                .unwrap_err()
                .reason
                .contains("more than 2"));
        }
    }

    #[test]
    fn proto_examples_are_accepted() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/proto/examples/");
        let json = std::fs::read(format!("{dir}changes.json")).unwrap();
        let ndjson = std::fs::read(format!("{dir}changes.ndjson")).unwrap();
        let from_json = parse_body(Format::Json, &json, 100).unwrap();
        let from_ndjson = parse_body(Format::NdJson, &ndjson, 100).unwrap();
        assert_eq!(from_json, from_ndjson);
        let xml = std::fs::read(format!("{dir}changelist.xml")).unwrap();
        assert!(!parse_body(Format::Xml, &xml, 100).unwrap().is_empty());
    }

    #[test]
    fn content_types() {
        assert_eq!(Format::from_content_type(None), Some(Format::Json));
        assert_eq!(
            Format::from_content_type(Some("application/json; charset=utf-8")),
            Some(Format::Json)
        );
        assert_eq!(
            Format::from_content_type(Some("application/x-ndjson")),
            Some(Format::NdJson)
        );
        assert_eq!(
            Format::from_content_type(Some("text/xml")),
            Some(Format::Xml)
        );
        assert_eq!(Format::from_content_type(Some("text/plain")), None);
    }
}
