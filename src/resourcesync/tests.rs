//! Golden files (`proto/examples/`), round trips, other producers' documents, hostile input.

use std::collections::BTreeMap;

use bytes::Bytes;
use quick_xml::events::Event;
use quick_xml::Reader;
use time::OffsetDateTime;

use super::*;
use crate::model::{parse_w3c_datetime, Change, ChangeType, Link, NewChange, MAX_URI_LEN};

fn example(name: &str) -> Vec<u8> {
    let path = format!("{}/proto/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn dt(s: &str) -> OffsetDateTime {
    parse_w3c_datetime(s).unwrap()
}

fn change(seq: u64, loc: &str, kind: ChangeType, datetime: &str) -> Change {
    Change {
        seq,
        loc: loc.into(),
        change: kind,
        datetime: dt(datetime),
        lastmod: None,
        hash: None,
        length: None,
        media_type: None,
        links: vec![],
        source: None,
        conflicts: 0,
    }
}

fn link(rel: &str, href: &str, attrs: &[(&str, &str)]) -> Link {
    Link {
        rel: rel.into(),
        href: href.into(),
        attrs: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// What parsing a written change gives back.
fn parsed(c: &Change) -> ParsedEntry {
    ParsedEntry {
        seq: Some(c.seq),
        change: NewChange {
            loc: c.loc.clone(),
            change: c.change,
            datetime: Some(c.datetime),
            lastmod: c.lastmod.filter(|lm| *lm != c.datetime),
            hash: c.hash.clone(),
            length: c.length,
            media_type: c.media_type.clone(),
            links: c.links.clone(),
            source: None,
        },
    }
}

/// What the writer needs from parsed entries (entries without a seq are numbered 1, 2, …).
fn to_changes(entries: &[ParsedEntry]) -> Vec<Change> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let datetime = e.change.datetime.expect("entry has a datetime");
            Change::from_new(e.seq.unwrap_or(i as u64 + 1), e.change.clone(), datetime)
        })
        .collect()
}

fn changelist_model() -> (ChangeListHeader, Vec<Change>) {
    let header = ChangeListHeader {
        from: Some(dt("2013-01-03T11:00:00Z")),
        until: None,
        links: vec![
            DocLink::new(
                "up",
                "http://hub.example.com/channels/dataset1/capabilitylist.xml",
            ),
            DocLink::new(
                "archives",
                "http://hub.example.com/channels/dataset1/changelist-archive.xml",
            ),
        ],
        seq_range: Some((1, 4)),
        epoch: Some("5f3a9c0d2b7e4a61".into()),
    };
    let changes = vec![
        Change {
            hash: Some("md5:1584abdf8ebdc9802ac0c6a7402c03b6".into()),
            length: Some(8876),
            media_type: Some("text/html".into()),
            ..change(
                1,
                "http://example.com/res1.html",
                ChangeType::Created,
                "2013-01-03T11:00:00Z",
            )
        },
        Change {
            lastmod: Some(dt("2013-01-03T12:58:30Z")),
            hash: Some(
                "md5:1e0d5cb8ef6ba40c99b14c0237be735e \
                 sha-256:854f61290e2e197a11bc91063afce22e43f8ccc655237050ace766adc68dc784"
                    .into(),
            ),
            length: Some(14599),
            media_type: Some("application/pdf".into()),
            links: vec![link(
                "duplicate",
                "http://mirror.example.com/res2.pdf",
                &[("modified", "2013-01-03T12:58:30Z"), ("pri", "1")],
            )],
            ..change(
                2,
                "http://example.com/res2.pdf",
                ChangeType::Updated,
                "2013-01-03T13:00:00Z",
            )
        },
        change(
            3,
            "http://example.com/search?q=res3&format=tiff",
            ChangeType::Deleted,
            "2013-01-03T18:00:00Z",
        ),
        Change {
            length: Some(14612),
            media_type: Some("application/pdf".into()),
            links: vec![link(
                "http://www.openarchives.org/rs/terms/patch",
                "http://example.com/res2-diff.json",
                &[("type", "application/json-patch+json")],
            )],
            ..change(
                4,
                "http://example.com/res2.pdf",
                ChangeType::Updated,
                "2013-01-03T21:00:00.5Z",
            )
        },
    ];
    (header, changes)
}

fn notification_model() -> (ChangeListHeader, Vec<Change>) {
    let header = ChangeListHeader {
        from: Some(dt("2024-05-01T10:15:00Z")),
        until: Some(dt("2024-05-01T10:15:02.25Z")),
        links: vec![
            DocLink::new(
                "up",
                "http://hub.example.com/channels/dataset1/capabilitylist.xml",
            ),
            DocLink::new(
                "archives",
                "http://hub.example.com/channels/dataset1/changelist-archive.xml",
            ),
        ],
        seq_range: Some((41, 43)),
        epoch: Some("5f3a9c0d2b7e4a61".into()),
    };
    let changes = vec![
        Change {
            media_type: Some("text/html".into()),
            ..change(
                41,
                "http://example.com/articles/42",
                ChangeType::Created,
                "2024-05-01T10:15:00Z",
            )
        },
        Change {
            lastmod: Some(dt("2024-04-30T23:59:59Z")),
            hash: Some(
                "sha-256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
            ),
            length: Some(2048),
            media_type: Some("text/html".into()),
            ..change(
                42,
                "http://example.com/articles/17",
                ChangeType::Updated,
                "2024-05-01T10:15:01Z",
            )
        },
        change(
            43,
            "http://example.com/articles/3",
            ChangeType::Deleted,
            "2024-05-01T10:15:02.25Z",
        ),
    ];
    (header, changes)
}

fn index_model() -> (ChangeListHeader, Vec<IndexEntry>) {
    let header = ChangeListHeader {
        from: Some(dt("2013-01-01T00:00:00Z")),
        until: None,
        links: vec![DocLink::new(
            "up",
            "http://example.com/dataset1/capabilitylist.xml",
        )],
        seq_range: None,
        epoch: None,
    };
    let entry = |loc: &str, from: &str, until: Option<&str>| IndexEntry {
        loc: loc.into(),
        from: Some(dt(from)),
        until: until.map(dt),
    };
    let entries = vec![
        entry(
            "http://example.com/dataset1/changelist-archive/1.xml",
            "2013-01-01T00:00:00Z",
            Some("2013-01-02T00:00:00Z"),
        ),
        entry(
            "http://example.com/dataset1/changelist-archive/2.xml",
            "2013-01-02T00:00:00Z",
            Some("2013-01-03T00:00:00Z"),
        ),
        entry(
            "http://example.com/dataset1/changelist.xml",
            "2013-01-03T00:00:00Z",
            None,
        ),
    ];
    (header, entries)
}

fn capabilitylist_model() -> (Vec<DocLink>, Vec<Capability>) {
    (
        vec![
            DocLink::new("up", "http://hub.example.com/.well-known/resourcesync"),
            DocLink::new("hub", "http://hub.example.com/hub"),
        ],
        vec![
            Capability {
                loc: "http://hub.example.com/channels/dataset1/changelist.xml".into(),
                capability: "changelist".into(),
            },
            Capability {
                loc: "http://hub.example.com/channels/dataset1/changelist-archive.xml".into(),
                capability: "changelist-archive".into(),
            },
            Capability {
                loc: "http://hub.example.com/channels/dataset1/resourcelist.xml".into(),
                capability: "resourcelist".into(),
            },
        ],
    )
}

fn source_description_model() -> (Vec<DocLink>, Vec<String>) {
    (
        vec![DocLink::new("describedby", "http://hub.example.com/")],
        vec![
            "http://hub.example.com/channels/dataset1/capabilitylist.xml".into(),
            "http://hub.example.com/channels/photos/capabilitylist.xml".into(),
        ],
    )
}

fn assert_same_bytes(written: &[u8], file: &str) {
    let expected = example(file);
    assert_eq!(
        String::from_utf8_lossy(written),
        String::from_utf8_lossy(&expected),
        "writing the model of {file} does not reproduce it"
    );
    assert_eq!(written, &expected[..]);
}

fn parse(xml: &[u8]) -> Result<Document, ParseError> {
    parse_document(xml, &Limits::default())
}

/// Reads the whole document with a plain (non-validating) reader: it must be well-formed.
fn assert_well_formed(xml: &[u8]) {
    let text = std::str::from_utf8(xml).expect("UTF-8");
    let mut reader = Reader::from_str(text);
    let mut depth = 0i64;
    loop {
        match reader.read_event().expect("well-formed") {
            Event::Start(_) => depth += 1,
            Event::End(_) => depth -= 1,
            Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(depth, 0);
}

// ---------------------------------------------------------------------------------------------
// Golden files

#[test]
fn golden_changelist() {
    let (header, changes) = changelist_model();
    assert_same_bytes(&write_change_list(&header, &changes), "changelist.xml");
}

/// A Change List put together from entries rendered before, sliced anywhere, is the one
/// rendered in one go.
#[test]
fn change_lists_from_rendered_entries_are_the_same_bytes() {
    let (mut header, changes) = changelist_model();
    let entries = super::write_change_entries(&changes);
    assert_eq!(entries.ends.len(), changes.len());
    for cut in 0..=changes.len() {
        let parts = [entries.slice(0..cut), entries.slice(cut..changes.len())];
        header.from = header.from.or(Some(changes[0].datetime));
        let pieces: Vec<u8> = super::write_change_list_pieces(
            &header,
            parts.iter().map(|p| Bytes::copy_from_slice(p)).collect(),
        )
        .concat();
        assert_eq!(pieces, write_change_list(&header, &changes), "cut at {cut}");
    }
    let one = super::write_change_entries(&changes[1..2]);
    assert_eq!(entries.slice(1..2), &one.bytes[..]);
    // The same document with the bounds of its entries: each the rendered entry.
    let (document, bounds) = super::write_change_list_bounded(&header, &changes);
    assert_eq!(document, write_change_list(&header, &changes));
    assert_eq!(bounds.len(), changes.len() + 1);
    for i in 0..changes.len() {
        let (start, end) = (bounds[i] as usize, bounds[i + 1] as usize);
        assert_eq!(&document[start..end], entries.slice(i..i + 1), "entry {i}");
    }
}

/// Entries are rendered the same whether the datetime is formatted or copied from the entry
/// before (same instant, even given in another offset; another datetime; a lastmod).
#[test]
fn entries_sharing_a_datetime_are_rendered_as_each_alone() {
    let datetimes = [
        "2026-01-01T00:00:00Z",
        "2026-01-01T01:00:00+01:00",
        "2026-01-01T00:00:00.5Z",
        "2026-01-01T00:00:00.5Z",
        "2026-01-01T00:00:00.5Z",
        "2026-01-01T00:00:00Z",
    ];
    let mut changes: Vec<Change> = (1..)
        .zip(datetimes)
        .map(|(seq, at)| {
            let loc = format!("http://example.com/{seq}");
            change(seq, &loc, ChangeType::Updated, at)
        })
        .collect();
    changes[4].lastmod = Some(dt("2025-12-31T00:00:00Z"));
    let entries = super::write_change_entries(&changes);
    for (i, c) in changes.iter().enumerate() {
        let alone = super::write_change_entries(std::slice::from_ref(c));
        assert_eq!(entries.slice(i..i + 1), &alone.bytes[..], "entry {i}");
    }
}

#[test]
fn golden_notification() {
    let (header, changes) = notification_model();
    assert_same_bytes(&write_change_list(&header, &changes), "notification.xml");
}

#[test]
fn golden_changelist_index() {
    let (header, entries) = index_model();
    assert_same_bytes(
        &write_change_list_index(&header, &entries),
        "changelist-index.xml",
    );
}

#[test]
fn golden_capabilitylist() {
    let (links, caps) = capabilitylist_model();
    assert_same_bytes(&write_capability_list(&links, &caps), "capabilitylist.xml");
}

#[test]
fn golden_source_description() {
    let (links, lists) = source_description_model();
    assert_same_bytes(
        &write_source_description(&links, &lists),
        "source-description.xml",
    );
}

// ---------------------------------------------------------------------------------------------
// Parsing the golden files gives their models back

#[test]
fn parse_golden_change_lists() {
    for (file, (header, changes)) in [
        ("changelist.xml", changelist_model()),
        ("notification.xml", notification_model()),
    ] {
        let (got_header, entries) = parse_change_list(&example(file), &Limits::default()).unwrap();
        assert_eq!(got_header, header, "{file}");
        let want: Vec<ParsedEntry> = changes.iter().map(parsed).collect();
        assert_eq!(entries, want, "{file}");
        for entry in &entries {
            entry.change.validate().unwrap();
        }
        // And the parsed entries render to the same bytes again.
        assert_eq!(
            write_change_list(&got_header, &to_changes(&entries)),
            example(file)
        );
    }
}

#[test]
fn parse_golden_other_documents() {
    let (header, entries) = index_model();
    assert_eq!(
        parse(&example("changelist-index.xml")).unwrap(),
        Document::ChangeListIndex { header, entries }
    );
    let (links, caps) = capabilitylist_model();
    assert_eq!(
        parse(&example("capabilitylist.xml")).unwrap(),
        Document::CapabilityList { links, caps }
    );
    let (links, capability_lists) = source_description_model();
    assert_eq!(
        parse(&example("source-description.xml")).unwrap(),
        Document::SourceDescription {
            links,
            capability_lists
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Round trips: parse -> write -> parse

fn write_document(doc: &Document) -> Vec<u8> {
    match doc {
        Document::ChangeList { header, entries } => write_change_list(header, &to_changes(entries)),
        Document::ChangeListIndex { header, entries } => write_change_list_index(header, entries),
        Document::CapabilityList { links, caps } => write_capability_list(links, caps),
        Document::SourceDescription {
            links,
            capability_lists,
        } => write_source_description(links, capability_lists),
        Document::ResourceList { header, entries } => {
            write_resource_list(header, &to_changes(entries))
        }
        Document::ResourceListIndex { header, pages } => write_resource_list_index(header, pages),
        Document::ChangeDump { header, entries } => write_change_dump(header, entries),
        Document::ChangeDumpIndex { header, entries } => write_change_dump_index(header, entries),
        Document::ChangeDumpManifest { header, entries } => {
            write_change_dump_manifest(header, entries)
        }
    }
}

/// Entries without a seq get one when written; give them the same numbers here.
fn numbered(doc: Document) -> Document {
    match doc {
        Document::ChangeList { header, entries } => Document::ChangeList {
            header,
            entries: entries
                .into_iter()
                .enumerate()
                .map(|(i, e)| ParsedEntry {
                    seq: Some(e.seq.unwrap_or(i as u64 + 1)),
                    change: e.change,
                })
                .collect(),
        },
        other => other,
    }
}

#[test]
fn round_trip_every_example() {
    for file in [
        "changelist.xml",
        "notification.xml",
        "changelist-closed.xml",
        "changelist-index.xml",
        "capabilitylist.xml",
        "source-description.xml",
        "changelist-1.0-prefixes.xml",
        "changelist-1.1-spec.xml",
        "resourcelist.xml",
    ] {
        let first = parse(&example(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let written = write_document(&first);
        assert_well_formed(&written);
        let second = parse(&written).unwrap_or_else(|e| panic!("{file} rewritten: {e}"));
        assert_eq!(second, numbered(first), "{file}");
        // Writing is a fixed point from there on.
        assert_eq!(write_document(&second), written, "{file}");
    }
}

#[test]
fn other_producer_1_0_with_prefixes() {
    let (header, entries) =
        parse_change_list(&example("changelist-1.0-prefixes.xml"), &Limits::default()).unwrap();
    assert_eq!(
        header,
        ChangeListHeader {
            from: Some(dt("2013-01-03T00:00:00Z")),
            until: None,
            links: vec![DocLink::new(
                "up",
                "http://example.org/dataset1/capabilitylist.xml"
            )],
            seq_range: None,
            epoch: None,
        }
    );
    let new = |loc: &str, change: ChangeType, datetime: &str| NewChange {
        loc: loc.into(),
        change,
        datetime: Some(dt(datetime)),
        lastmod: None,
        hash: None,
        length: None,
        media_type: None,
        links: vec![],
        source: None,
    };
    let want = vec![
        ParsedEntry {
            seq: None,
            change: NewChange {
                hash: Some("md5:1584abdf8ebdc9802ac0c6a7402c03b6".into()),
                length: Some(8876),
                media_type: Some("text/html".into()),
                ..new(
                    "http://example.org/res1.html",
                    ChangeType::Created,
                    "2013-01-03T11:00:00Z",
                )
            },
        },
        ParsedEntry {
            seq: None,
            change: NewChange {
                links: vec![link(
                    "alternate",
                    "http://example.org/res2.html",
                    &[("type", "text/html")],
                )],
                ..new(
                    "http://example.org/res2.pdf?a=1&b=2",
                    ChangeType::Updated,
                    "2013-01-03T13:00:00Z",
                )
            },
        },
        ParsedEntry {
            seq: None,
            change: new(
                "http://example.org/res3.tiff?x=<1>",
                ChangeType::Deleted,
                "2013-01-04T00:00:00Z",
            ),
        },
    ];
    assert_eq!(entries, want);
}

#[test]
fn spec_1_1_example_datetime_and_lastmod() {
    let (header, entries) =
        parse_change_list(&example("changelist-1.1-spec.xml"), &Limits::default()).unwrap();
    assert_eq!(header.from, Some(dt("2013-01-02T00:00:00Z")));
    assert_eq!(header.until, Some(dt("2013-01-03T00:00:00Z")));
    let times: Vec<_> = entries
        .iter()
        .map(|e| (e.change.datetime, e.change.lastmod))
        .collect();
    assert_eq!(
        times,
        vec![
            // <lastmod> equal to datetime says nothing more.
            (Some(dt("2013-01-02T13:00:00Z")), None),
            (Some(dt("2013-01-02T14:00:00Z")), None),
            (
                Some(dt("2013-01-02T15:00:00Z")),
                Some(dt("2011-01-01T00:00:00Z"))
            ),
        ]
    );
}

#[test]
fn entry_without_any_time_is_left_to_the_hub() {
    let xml = br#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
<rs:md capability="changelist"/><url><loc>http://example.com/a</loc><rs:md change="created"/></url></urlset>"#;
    let (header, entries) = parse_change_list(xml, &Limits::default()).unwrap();
    assert_eq!(header, ChangeListHeader::default());
    assert_eq!(entries[0].change.datetime, None);
    assert_eq!(entries[0].change.lastmod, None);
}

// ---------------------------------------------------------------------------------------------
// Writer details

#[test]
fn escaping_survives_write_and_parse() {
    let loc = r#"http://example.com/a?x=1&y=<2>&z="3"&w='4'"#;
    let mut c = change(7, loc, ChangeType::Updated, "2020-02-02T02:02:02Z");
    c.hash = Some("md5:00\"/><evil/>".into());
    c.media_type = Some("text/html; charset='x' & <y>".into());
    c.links = vec![link(
        "alternate",
        "http://example.com/b?<&>\"'",
        &[("title", "a \"quoted\" <title> & 'more'\t\n\r")],
    )];
    let header = ChangeListHeader {
        links: vec![DocLink::new("self", "http://example.com/?a=<b>&c=\"d\"")],
        ..Default::default()
    };
    let xml = write_change_list(&header, std::slice::from_ref(&c));
    assert_well_formed(&xml);
    let text = String::from_utf8(xml.clone()).unwrap();
    assert!(!text.contains("<evil/>"));
    assert!(!text.contains("<2>"));
    let (got_header, entries) = parse_change_list(&xml, &Limits::default()).unwrap();
    assert_eq!(got_header.links, header.links);
    assert_eq!(entries, vec![parsed(&c)]);
    assert_eq!(entries[0].change.loc, loc);
}

#[test]
fn characters_xml_cannot_carry_are_replaced() {
    let c = change(
        1,
        "http://example.com/\u{1}\u{FFFE}x",
        ChangeType::Created,
        "2020-01-01T00:00:00Z",
    );
    let xml = write_change_list(&ChangeListHeader::default(), &[c]);
    assert_well_formed(&xml);
    let (_, entries) = parse_change_list(&xml, &Limits::default()).unwrap();
    assert_eq!(
        entries[0].change.loc,
        "http://example.com/\u{FFFD}\u{FFFD}x"
    );
}

#[test]
fn unsafe_link_attribute_names_are_not_written() {
    let mut c = change(
        1,
        "http://example.com/a",
        ChangeType::Created,
        "2020-01-01T00:00:00Z",
    );
    let mut attrs = BTreeMap::new();
    for name in [
        "rel", "href", "xmlns", "xml:lang", "a b", "x=\"1\"", "", "ok",
    ] {
        attrs.insert(name.to_string(), "v".to_string());
    }
    c.links = vec![Link {
        rel: "alternate".into(),
        href: "http://example.com/b".into(),
        attrs,
    }];
    let xml = write_change_list(&ChangeListHeader::default(), &[c]);
    assert_well_formed(&xml);
    let (_, entries) = parse_change_list(&xml, &Limits::default()).unwrap();
    let link = &entries[0].change.links[0];
    assert_eq!(link.rel, "alternate");
    assert_eq!(link.href, "http://example.com/b");
    assert_eq!(
        link.attrs,
        BTreeMap::from([("ok".to_string(), "v".to_string())])
    );
}

#[test]
fn from_defaults_to_the_first_entry() {
    let c = change(
        5,
        "http://example.com/a",
        ChangeType::Created,
        "2020-01-01T00:00:00Z",
    );
    let (header, _) = parse_change_list(
        &write_change_list(&ChangeListHeader::default(), &[c]),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(header.from, Some(dt("2020-01-01T00:00:00Z")));
    let empty = write_change_list(&ChangeListHeader::default(), &[]);
    let (header, entries) = parse_change_list(&empty, &Limits::default()).unwrap();
    assert_eq!((header.from, entries.len()), (None, 0));
}

#[test]
fn renders_fifty_thousand_entries() {
    let base = dt("2024-01-01T00:00:00Z");
    let changes: Vec<Change> = (1..=50_000u64)
        .map(|seq| Change {
            hash: Some("md5:1e0d5cb8ef6ba40c99b14c0237be735e".into()),
            length: Some(seq * 10),
            media_type: Some("text/html".into()),
            ..change(
                seq,
                &format!("http://example.com/items/{seq}?view=full&lang=en"),
                ChangeType::Updated,
                "2024-01-01T00:00:00Z",
            )
        })
        .map(|mut c| {
            c.datetime = base + time::Duration::milliseconds(c.seq as i64);
            c
        })
        .collect();
    let header = ChangeListHeader {
        seq_range: Some((1, 50_000)),
        ..Default::default()
    };
    let xml = write_change_list(&header, &changes);
    assert!(xml.starts_with(b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<urlset "));
    assert!(xml.ends_with(b"</urlset>\n"));
    let limits = Limits {
        max_bytes: 64 * 1024 * 1024,
        max_entries: 50_000,
    };
    let (got, entries) = parse_change_list(&xml, &limits).unwrap();
    assert_eq!(got.seq_range, Some((1, 50_000)));
    assert_eq!(entries.len(), 50_000);
    assert_eq!(entries[49_999], parsed(&changes[49_999]));
}

// ---------------------------------------------------------------------------------------------
// Hostile and broken input: typed errors, never a panic

const HEAD: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:md capability="changelist" from="2013-01-03T00:00:00Z"/>
"#;

fn with_entries(entries: &str) -> Vec<u8> {
    format!("{HEAD}{entries}</urlset>\n").into_bytes()
}

fn entry_error(xml: &[u8]) -> (usize, String) {
    match parse(xml) {
        Err(ParseError::Entry { index, reason }) => (index, reason),
        other => panic!("expected an entry error, got {other:?}"),
    }
}

#[test]
fn truncated_xml() {
    let full = example("changelist.xml");
    for cut in [full.len() / 2, full.len() - 3, 60, 1] {
        match parse(&full[..cut]) {
            Err(ParseError::Malformed(_)) => {}
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
    // Every prefix fails cleanly.
    for cut in 0..full.len() - 1 {
        assert!(parse(&full[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn wrong_root() {
    let atom = br#"<?xml version="1.0"?><feed xmlns="http://www.w3.org/2005/Atom"><title>x</title></feed>"#;
    assert!(matches!(parse(atom), Err(ParseError::WrongRoot(_))));
    let no_ns = br#"<urlset><rs:md xmlns:rs="http://www.openarchives.org/rs/terms/" capability="changelist"/></urlset>"#;
    assert!(matches!(parse(no_ns), Err(ParseError::WrongRoot(_))));
    let other = br#"<url xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"/>"#;
    let err = parse(other).unwrap_err();
    assert_eq!(err, ParseError::WrongRoot("<url>".into()));
    assert!(err.to_string().contains("<url>"));
}

#[test]
fn missing_capability() {
    let no_md = br#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://example.com/a</loc></url></urlset>"#;
    assert_eq!(parse(no_md), Err(ParseError::MissingCapability));
    let empty = br#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"/>"#;
    assert_eq!(parse(empty), Err(ParseError::MissingCapability));
    let no_attr = br#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md from="2013-01-01"/></urlset>"#;
    assert_eq!(parse(no_attr), Err(ParseError::MissingCapability));
    // The capability must be known before the first entry.
    let late = br#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><url><loc>http://example.com/a</loc></url><rs:md capability="changelist"/></urlset>"#;
    assert_eq!(parse(late), Err(ParseError::MissingCapability));
}

#[test]
fn resource_lists_and_their_index() {
    let Document::ResourceList { header, entries } = parse(&example("resourcelist.xml")).unwrap()
    else {
        panic!("not a Resource List");
    };
    assert_eq!(header.seq, Some(4));
    assert_eq!(header.epoch.as_deref(), Some("5f3a9c0d2b7e4a61"));
    assert_eq!(header.at, dt("2013-01-03T22:00:00Z"));
    assert_eq!(header.completed, Some(dt("2013-01-03T22:00:01Z")));
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].seq, Some(1));
    assert_eq!(entries[0].change.change, ChangeType::Created);
    assert_eq!(
        entries[0].change.hash.as_deref(),
        Some("md5:1584abdf8ebdc9802ac0c6a7402c03b6")
    );
    assert_eq!(entries[1].change.length, Some(14612));
    let index = write_resource_list_index(
        &header,
        &["http://hub.example.com/channels/dataset1/resourcelist.xml?after=0&upto=4".into()],
    );
    assert_eq!(
        parse(&index).unwrap(),
        Document::ResourceListIndex {
            header: header.clone(),
            pages: vec![
                "http://hub.example.com/channels/dataset1/resourcelist.xml?after=0&upto=4".into()
            ],
        }
    );
    // `at` is what makes it a snapshot: a Resource List without it is refused.
    let no_at = br#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="resourcelist"/></urlset>"#;
    assert!(matches!(parse(no_at), Err(ParseError::Header(_))));
    // A Change List parser still refuses it.
    assert!(matches!(
        parse_change_list(&example("resourcelist.xml"), &Limits::default()),
        Err(ParseError::UnexpectedCapability { found, .. }) if found == "resourcelist"
    ));
}

#[test]
fn unexpected_capability() {
    let archive = br#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="changelist-archive"/></urlset>"#;
    assert!(matches!(
        parse(archive),
        Err(ParseError::UnexpectedCapability { found, .. }) if found == "changelist-archive"
    ));
    let limits = Limits::default();
    assert_eq!(
        parse_change_list(&example("changelist-index.xml"), &limits),
        Err(ParseError::ChangeListIndex)
    );
    assert!(matches!(
        parse_change_list(&example("capabilitylist.xml"), &limits),
        Err(ParseError::UnexpectedCapability { found, .. }) if found == "capabilitylist"
    ));
}

#[test]
fn unknown_or_missing_change_type() {
    let xml = with_entries(
        r#"<url><loc>http://example.com/a</loc><rs:md change="created"/></url>
<url><loc>http://example.com/b</loc><rs:md change="moved"/></url>"#,
    );
    let (index, reason) = entry_error(&xml);
    assert_eq!(index, 1);
    assert!(reason.contains("\"moved\""), "{reason}");
    let xml = with_entries(r#"<url><loc>http://example.com/a</loc><rs:md hash="md5:00"/></url>"#);
    assert_eq!(entry_error(&xml).0, 0);
    let xml =
        with_entries(r#"<url><loc>http://example.com/a</loc><lastmod>2013-01-03</lastmod></url>"#);
    assert_eq!(entry_error(&xml).0, 0);
}

#[test]
fn bad_datetimes_and_numbers() {
    for md in [
        r#"<rs:md change="created" datetime="yesterday"/>"#,
        r#"<rs:md change="created" datetime="2013-02-30T00:00:00Z"/>"#,
        r#"<rs:md change="created" length="-1"/>"#,
        r#"<rs:md change="created" length="99999999999999999999999"/>"#,
        r#"<rs:md change="created" length="12kB"/>"#,
        r#"<rs:md xmlns:ch="https://changehub.dev/ns/1.0" change="created" ch:seq="x"/>"#,
    ] {
        let xml = with_entries(&format!(
            "<url><loc>http://example.com/ok</loc><rs:md change=\"updated\"/></url>\
             <url><loc>http://example.com/a</loc>{md}</url>"
        ));
        assert_eq!(entry_error(&xml).0, 1, "{md}");
    }
    let xml = with_entries(
        r#"<url><loc>http://example.com/a</loc><lastmod>2013-01-03T09:00:00</lastmod><rs:md change="created"/></url>"#,
    );
    let (index, reason) = entry_error(&xml);
    assert_eq!(index, 0);
    assert!(reason.starts_with("lastmod"), "{reason}");
    let bad_from = HEAD.replace("2013-01-03T00:00:00Z", "soon");
    assert!(matches!(
        parse(format!("{bad_from}</urlset>").as_bytes()),
        Err(ParseError::Header(_))
    ));
}

#[test]
fn doctype_is_refused() {
    let billion_laughs = br#"<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol9 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
]>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
<rs:md capability="changelist"/><url><loc>&lol9;</loc><rs:md change="created"/></url></urlset>"#;
    assert_eq!(parse(billion_laughs), Err(ParseError::Doctype));
    let external = br#"<!DOCTYPE urlset SYSTEM "file:///etc/passwd"><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"/>"#;
    assert_eq!(parse(external), Err(ParseError::Doctype));
    // Without a DOCTYPE, an entity is simply undefined.
    let undefined = with_entries(r#"<url><loc>&lol9;</loc><rs:md change="created"/></url>"#);
    assert!(matches!(parse(&undefined), Err(ParseError::Malformed(_))));
}

#[test]
fn too_deep() {
    let open = "<x:a xmlns:x=\"http://example.org/x\">".repeat(100);
    let close = "</x:a>".repeat(100);
    let xml = with_entries(&format!("{open}{close}"));
    assert_eq!(parse(&xml), Err(ParseError::TooDeep { limit: MAX_DEPTH }));
    let inside = with_entries(&format!(
        "<url><loc>http://example.com/a</loc><rs:md change=\"created\"/>{open}{close}</url>"
    ));
    assert_eq!(
        parse(&inside),
        Err(ParseError::TooDeep { limit: MAX_DEPTH })
    );
    // Shallow extension elements are fine.
    let ok = with_entries(&format!(
        "<url><loc>http://example.com/a</loc><rs:md change=\"created\"/>{}{}</url>",
        &open[..open.len() / 100 * 5],
        &close[..close.len() / 100 * 5]
    ));
    assert!(parse(&ok).is_ok());
}

#[test]
fn too_many_entries() {
    let one = r#"<url><loc>http://example.com/a</loc><rs:md change="created"/></url>"#;
    let xml = with_entries(&one.repeat(11));
    let limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 10,
    };
    assert_eq!(
        parse_document(&xml, &limits),
        Err(ParseError::TooManyEntries { limit: 10 })
    );
    let xml = with_entries(&one.repeat(10));
    assert!(parse_document(&xml, &limits).is_ok());
}

#[test]
fn too_large() {
    let xml = example("changelist.xml");
    let limits = Limits {
        max_bytes: xml.len() - 1,
        max_entries: 10,
    };
    assert_eq!(
        parse_document(&xml, &limits),
        Err(ParseError::TooLarge {
            limit: xml.len() - 1
        })
    );
    // Checked before parsing: garbage of the wrong size says "too large", not "malformed".
    let garbage = vec![0xFFu8; 100];
    let limits = Limits {
        max_bytes: 99,
        max_entries: 10,
    };
    assert_eq!(
        parse_document(&garbage, &limits),
        Err(ParseError::TooLarge { limit: 99 })
    );
}

#[test]
fn loc_too_long() {
    let long = format!("http://example.com/{}", "a".repeat(MAX_URI_LEN));
    let xml = with_entries(&format!(
        "<url><loc>http://example.com/ok</loc><rs:md change=\"created\"/></url>\
         <url><loc>{long}</loc><rs:md change=\"created\"/></url>"
    ));
    let (index, reason) = entry_error(&xml);
    assert_eq!(index, 1);
    assert!(reason.contains("<loc>"), "{reason}");
    // Exactly at the limit, with indentation around it, is accepted.
    let max = format!("http://example.com/{}", "a".repeat(MAX_URI_LEN - 19));
    assert_eq!(max.len(), MAX_URI_LEN);
    let xml = with_entries(&format!(
        "<url><loc>\n      {max}\n    </loc><rs:md change=\"created\"/></url>"
    ));
    assert!(parse(&xml).is_ok());
    let long_href = with_entries(&format!(
        "<url><loc>http://example.com/a</loc><rs:md change=\"created\"/><rs:ln rel=\"alternate\" href=\"{long}\"/></url>"
    ));
    assert_eq!(entry_error(&long_href).0, 0);
}

#[test]
fn not_utf8() {
    let mut xml = with_entries(r#"<url><loc>http://example.com/caf"#);
    let at = xml.len();
    xml.extend_from_slice(b"\xE9</loc><rs:md change=\"created\"/></url></urlset>");
    assert_eq!(parse(&xml), Err(ParseError::NotUtf8 { offset: at }));
    // UTF-16 with its byte order mark.
    let utf16: Vec<u8> = "\u{FEFF}<urlset/>"
        .encode_utf16()
        .flat_map(|u| u.to_le_bytes())
        .collect();
    assert!(matches!(parse(&utf16), Err(ParseError::NotUtf8 { .. })));
    // A declared non-UTF-8 encoding with non-ASCII content.
    let latin1 = "<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?>\n<urlset xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\"><!-- é --></urlset>";
    assert!(matches!(
        parse(latin1.as_bytes()),
        Err(ParseError::Malformed(_))
    ));
    // A UTF-8 byte order mark is fine.
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend_from_slice(&example("capabilitylist.xml"));
    assert!(parse(&bom).is_ok());
}

#[test]
fn other_structural_errors() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("two roots", format!("{HEAD}</urlset><urlset/>").into_bytes()),
        ("text after root", format!("{HEAD}</urlset>junk").into_bytes()),
        ("text in root", with_entries("junk")),
        ("mismatched end", with_entries("<url></loc>")),
        ("undeclared prefix", with_entries("<url><loc>http://example.com/a</loc><zz:md change=\"created\"/></url>")),
        ("duplicate attribute", with_entries("<url><loc>http://example.com/a</loc><rs:md change=\"created\" change=\"deleted\"/></url>")),
        ("bad char ref", with_entries("<url><loc>http://example.com/&#0;</loc><rs:md change=\"created\"/></url>")),
        ("empty", Vec::new()),
        ("only a declaration", b"<?xml version=\"1.0\"?>".to_vec()),
    ];
    for (what, xml) in cases {
        assert!(
            matches!(parse(&xml), Err(ParseError::Malformed(_))),
            "{what}: {:?}",
            parse(&xml)
        );
    }
    let entry_cases = [
        ("no loc", "<url><rs:md change=\"created\"/></url>"),
        ("empty loc", "<url><loc> </loc><rs:md change=\"created\"/></url>"),
        ("two locs", "<url><loc>http://example.com/a</loc><loc>http://example.com/b</loc><rs:md change=\"created\"/></url>"),
        ("no rs:md", "<url><loc>http://example.com/a</loc></url>"),
        ("element in loc", "<url><loc>http://example.com/<b>a</b></loc><rs:md change=\"created\"/></url>"),
        ("link without href", "<url><loc>http://example.com/a</loc><rs:md change=\"created\"/><rs:ln rel=\"alternate\"/></url>"),
        ("sitemap in urlset", "<sitemap><loc>http://example.com/a</loc></sitemap>"),
    ];
    for (what, entry) in entry_cases {
        assert_eq!(entry_error(&with_entries(entry)).0, 0, "{what}");
    }
    let half_range = HEAD.replace(
        "from=",
        "xmlns:ch=\"https://changehub.dev/ns/1.0\" ch:first=\"3\" from=",
    );
    assert!(matches!(
        parse(format!("{half_range}</urlset>").as_bytes()),
        Err(ParseError::Header(_))
    ));
}

#[test]
fn errors_display_short_reasons() {
    let (index, reason) = entry_error(&with_entries(
        r#"<url><loc>http://example.com/a</loc><rs:md change="moved"/></url>"#,
    ));
    let err = ParseError::Entry { index, reason };
    assert_eq!(
        err.to_string(),
        "entry 0: unknown change type \"moved\" (expected created, updated or deleted)"
    );
    assert_eq!(
        ParseError::Doctype.to_string(),
        "DOCTYPE declarations are not allowed"
    );
    assert_eq!(
        ParseError::TooLarge { limit: 10 }.to_string(),
        "document is larger than 10 bytes"
    );
}

#[test]
fn mangled_input_never_panics() {
    // Deterministic pseudo-random byte edits of every example.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let bytes: &[u8] = b"<>&;\"'/=:x \n\xC3\xA9\xFF!?[]-#";
    for file in [
        "changelist.xml",
        "notification.xml",
        "changelist-index.xml",
        "capabilitylist.xml",
        "source-description.xml",
        "changelist-1.0-prefixes.xml",
    ] {
        let original = example(file);
        for _ in 0..300 {
            let mut xml = original.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % xml.len() as u64) as usize;
                match next() % 3 {
                    0 => xml[at] = bytes[(next() % bytes.len() as u64) as usize],
                    1 => {
                        xml.remove(at);
                    }
                    _ => xml.insert(at, bytes[(next() % bytes.len() as u64) as usize]),
                }
            }
            let _ = parse(&xml);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Change Dumps

fn changedump_model() -> (ChangeListHeader, Vec<DumpEntry>) {
    let header = ChangeListHeader {
        from: Some(dt("2026-03-01T10:00:00Z")),
        until: None,
        links: vec![
            DocLink::new(
                "up",
                "https://hub.example.org/channels/news/capabilitylist.xml",
            ),
            DocLink::new("hub", "https://hub.example.org/hub"),
            DocLink::new(
                "self",
                "https://hub.example.org/channels/news/changedump.xml",
            ),
        ],
        seq_range: None,
        epoch: None,
    };
    let entries = vec![
        DumpEntry {
            loc: "https://hub.example.org/channels/news/changedump/1-3.zip".into(),
            lastmod: Some(dt("2026-03-01T10:05:00Z")),
            media_type: Some("application/zip".into()),
            length: Some(4821),
            hash: Some("md5:0cc175b9c0f1b6a831c399e269772661 sha-256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb".into()),
            from: Some(dt("2026-03-01T10:00:00Z")),
            until: Some(dt("2026-03-01T10:04:30Z")),
            contents: Some(
                "https://hub.example.org/channels/news/changedump/1-3.manifest.xml".into(),
            ),
            seq_range: Some((1, 3)),
            skipped: None,
        },
        DumpEntry {
            loc: "https://hub.example.org/channels/news/changedump/4-6.zip".into(),
            lastmod: Some(dt("2026-03-01T11:00:00Z")),
            media_type: Some("application/zip".into()),
            length: Some(1290),
            hash: None,
            from: Some(dt("2026-03-01T10:30:00Z")),
            until: Some(dt("2026-03-01T10:59:59.5Z")),
            contents: Some(
                "https://hub.example.org/channels/news/changedump/4-6.manifest.xml".into(),
            ),
            seq_range: Some((4, 6)),
            skipped: Some(1),
        },
    ];
    (header, entries)
}

fn manifest_model() -> (ChangeListHeader, Vec<ManifestEntry>) {
    let header = ChangeListHeader {
        from: Some(dt("2026-03-01T10:00:00Z")),
        until: Some(dt("2026-03-01T10:04:30Z")),
        links: vec![DocLink::new(
            "up",
            "https://hub.example.org/channels/news/capabilitylist.xml",
        )],
        seq_range: Some((1, 3)),
        epoch: None,
    };
    let entries = vec![
        ManifestEntry {
            loc: "https://example.org/res1.html".into(),
            lastmod: dt("2026-03-01T09:59:00Z"),
            change: ChangeType::Created,
            datetime: Some(dt("2026-03-01T10:00:00Z")),
            hash: Some("md5:1c1b0e264fa9b7e1e9aa6f9db8d6362b".into()),
            length: Some(4339),
            media_type: Some("text/html".into()),
            path: Some("/changes/1-res1.html".into()),
            seq: Some(1),
        },
        ManifestEntry {
            loc: "https://example.org/gone.pdf".into(),
            lastmod: dt("2026-03-01T10:02:00Z"),
            change: ChangeType::Deleted,
            datetime: Some(dt("2026-03-01T10:02:00Z")),
            hash: None,
            length: None,
            media_type: None,
            path: None,
            seq: Some(2),
        },
        ManifestEntry {
            loc: "https://example.org/img/a b.png?v=2&x=<1>".into(),
            lastmod: dt("2026-03-01T10:04:30Z"),
            change: ChangeType::Updated,
            datetime: Some(dt("2026-03-01T10:04:30Z")),
            hash: Some("md5:f906610c3d4aa745cb2b986f25b37c5a".into()),
            length: Some(38297),
            media_type: Some("image/png".into()),
            path: Some("/changes/3-a_b.png".into()),
            seq: Some(3),
        },
    ];
    (header, entries)
}

fn changedump_index_model() -> (ChangeListHeader, Vec<IndexEntry>) {
    let header = ChangeListHeader {
        from: Some(dt("2026-03-01T10:00:00Z")),
        until: None,
        links: vec![DocLink::new(
            "up",
            "https://hub.example.org/channels/news/capabilitylist.xml",
        )],
        seq_range: None,
        epoch: None,
    };
    let entries = vec![
        IndexEntry {
            loc: "https://hub.example.org/channels/news/changedump.xml?page=1".into(),
            from: Some(dt("2026-03-01T10:00:00Z")),
            until: Some(dt("2026-03-02T10:00:00Z")),
        },
        IndexEntry {
            loc: "https://hub.example.org/channels/news/changedump.xml?page=2".into(),
            from: Some(dt("2026-03-02T10:00:01Z")),
            until: None,
        },
    ];
    (header, entries)
}

#[test]
fn golden_changedump() {
    let (header, entries) = changedump_model();
    assert_same_bytes(&write_change_dump(&header, &entries), "changedump.xml");
    assert_eq!(
        parse(&example("changedump.xml")).unwrap(),
        Document::ChangeDump { header, entries }
    );
}

#[test]
fn golden_changedump_manifest() {
    let (header, entries) = manifest_model();
    assert_same_bytes(
        &write_change_dump_manifest(&header, &entries),
        "changedump-manifest.xml",
    );
    assert_eq!(
        parse(&example("changedump-manifest.xml")).unwrap(),
        Document::ChangeDumpManifest { header, entries }
    );
}

#[test]
fn golden_changedump_index() {
    let (header, entries) = changedump_index_model();
    assert_same_bytes(
        &write_change_dump_index(&header, &entries),
        "changedump-index.xml",
    );
    assert_eq!(
        parse(&example("changedump-index.xml")).unwrap(),
        Document::ChangeDumpIndex { header, entries }
    );
}

#[test]
fn the_spec_examples_of_change_dumps_parse() {
    // Example 22 and 23 of ResourceSync 1.0 (the links before rs:md, as the spec has them).
    let dump = br#"<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
<rs:ln rel="up" href="http://example.com/dataset1/capabilitylist.xml"/>
<rs:md capability="changedump" from="2013-01-01T00:00:00Z"/>
<url><loc>http://example.com/20130101-changedump.zip</loc><lastmod>2013-01-01T23:59:59Z</lastmod>
<rs:md type="application/zip" length="3109" from="2013-01-01T00:00:00Z" until="2013-01-02T00:00:00Z"/>
<rs:ln rel="contents" href="http://example.com/20130101-changedump-manifest.xml" type="application/xml"/></url>
</urlset>"#;
    let Document::ChangeDump { header, entries } = parse(dump).unwrap() else {
        panic!("not a Change Dump");
    };
    assert_eq!(header.links[0].rel, "up");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].length, Some(3109));
    assert_eq!(entries[0].until, Some(dt("2013-01-02T00:00:00Z")));
    assert_eq!(
        entries[0].contents.as_deref(),
        Some("http://example.com/20130101-changedump-manifest.xml")
    );
    let manifest = br#"<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
<rs:ln rel="up" href="http://example.com/dataset1/capabilitylist.xml"/>
<rs:md capability="changedump-manifest" from="2013-01-02T00:00:00Z" until="2013-01-03T00:00:00Z"/>
<url><loc>http://example.com/res7.html</loc><lastmod>2013-01-02T12:00:00Z</lastmod>
<rs:md change="created" hash="md5:1c1b0e264fa9b7e1e9aa6f9db8d6362b" length="4339" type="text/html" path="/changes/res7.html"/></url>
<url><loc>http://example.com/res5.tiff</loc><lastmod>2013-01-02T19:00:00Z</lastmod><rs:md change="deleted"/></url>
</urlset>"#;
    let Document::ChangeDumpManifest { entries, .. } = parse(manifest).unwrap() else {
        panic!("not a manifest");
    };
    assert_eq!(entries[0].path.as_deref(), Some("/changes/res7.html"));
    assert_eq!(entries[1].change, ChangeType::Deleted);
    assert_eq!(entries[1].path, None);
    // A Change Dump is not a Change List.
    assert!(matches!(
        parse_change_list(dump, &Limits::default()),
        Err(ParseError::UnexpectedCapability { .. })
    ));
}

#[test]
fn manifest_entries_need_a_path_and_a_lastmod() {
    let doc = |md: &str, lastmod: &str| {
        format!(
            r#"<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="changedump-manifest" from="2013-01-02T00:00:00Z"/><url><loc>http://e/x</loc>{lastmod}<rs:md {md}/></url></urlset>"#
        )
    };
    let lastmod = "<lastmod>2013-01-02T12:00:00Z</lastmod>";
    for (md, lm) in [
        (r#"change="created""#, lastmod),
        (r#"change="updated" path="changes/x""#, lastmod),
        (r#"change="created" path="/x""#, ""),
    ] {
        assert!(
            matches!(
                parse(doc(md, lm).as_bytes()),
                Err(ParseError::Entry { index: 0, .. })
            ),
            "{md} {lm}"
        );
    }
    assert!(parse(doc(r#"change="deleted""#, lastmod).as_bytes()).is_ok());
}
