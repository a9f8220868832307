//! The specification's conflict example, written by the hub, element for element; both forms
//! read back what they write; hostile input is refused.

use super::*;
use crate::model::feedsync::{merge, History, ItemData, SyncState};
use crate::model::parse_w3c_datetime;

const ID: &str = "item_1_myapp_2005-05-21T11:43:33Z";

fn h(sequence: u32, by: &str, when: &str) -> History {
    History {
        sequence,
        by: Some(by.into()),
        when: Some(
            parse_w3c_datetime(&format!("2005-05-21T{when}Z"))
                .unwrap()
                .unix_timestamp(),
        ),
    }
}

fn data(hash: &str) -> ItemData {
    ItemData {
        loc: "http://example.com/groceries".into(),
        lastmod: None,
        hash: Some(hash.into()),
        length: Some(12),
        media_type: Some("text/plain".into()),
    }
}

fn version(top: History, hash: &str) -> Item {
    Item {
        sync: SyncState {
            id: ID.into(),
            updates: 4,
            deleted: false,
            noconflicts: false,
            history: vec![
                top,
                h(3, "JEO2000", "11:43:33"),
                h(2, "REO1750", "10:43:33"),
                h(1, "REO1750", "09:43:33"),
            ],
            conflicts: vec![],
        },
        data: data(hash),
    }
}

/// Removes the whitespace between elements.
fn squeeze(s: &str) -> String {
    s.lines().map(str::trim).collect::<Vec<_>>().join("")
}

/// §3.3's conflict example: the `sx:sync` the hub writes is the specification's.
#[test]
fn the_conflict_example_is_written_as_the_spec_shows_it() {
    let gpm = version(h(4, "GPM7383", "12:43:33"), "md5:d0e");
    let jeo = version(h(4, "JEO2000", "12:03:33"), "md5:a11");
    let merged = merge(Some(&gpm), &jeo);
    let xml = write_pox(&Collection {
        since: 0,
        until: 7,
        items: vec![Entry {
            seq: 7,
            item: merged,
        }],
    });
    let spec = r#"<sx:sync id="item_1_myapp_2005-05-21T11:43:33Z" updates="4">
 <sx:history sequence="4" when="2005-05-21T12:43:33Z" by="GPM7383"/>
 <sx:history sequence="3" when="2005-05-21T11:43:33Z" by="JEO2000"/>
 <sx:history sequence="2" when="2005-05-21T10:43:33Z" by="REO1750"/>
 <sx:history sequence="1" when="2005-05-21T09:43:33Z" by="REO1750"/>
 <sx:conflicts>
 <item>
 <sx:sync id="item_1_myapp_2005-05-21T11:43:33Z" updates="4">
 <sx:history sequence="4" when="2005-05-21T12:03:33Z" by="JEO2000"/>
 <sx:history sequence="3" when="2005-05-21T11:43:33Z" by="JEO2000"/>
 <sx:history sequence="2" when="2005-05-21T10:43:33Z" by="REO1750"/>
 <sx:history sequence="1" when="2005-05-21T09:43:33Z" by="REO1750"/>
 </sx:sync>"#;
    assert!(squeeze(&xml).contains(&squeeze(spec)), "{xml}");
    assert!(
        xml.contains(r#"<sx:sharing since="00000000000000000000" until="00000000000000000007"/>"#)
    );
    assert!(xml.contains(r#"<item ch:seq="7">"#));
}

fn sample() -> Collection {
    let gpm = version(h(4, "GPM7383", "12:43:33"), "md5:d0e");
    let mut jeo = version(h(4, "JEO2000", "12:03:33"), "md5:a11");
    jeo.data.lastmod = Some(parse_w3c_datetime("2005-05-21T12:03:33Z").unwrap());
    let mut deleted = version(h(5, "a.b", "13:00:00"), "md5:0");
    deleted.sync.deleted = true;
    deleted.sync.id = "other".into();
    deleted.data.loc = "http://example.com/x?a=1&b=<2>".into();
    Collection {
        since: 3,
        until: 9,
        items: vec![
            Entry {
                seq: 8,
                item: merge(Some(&gpm), &jeo),
            },
            Entry {
                seq: 9,
                item: deleted,
            },
        ],
    }
}

#[test]
fn both_forms_read_back_what_they_write() {
    let collection = sample();
    let items: Vec<Item> = collection.items.iter().map(|e| e.item.clone()).collect();
    let xml = write_pox(&collection);
    assert_eq!(parse_pox(xml.as_bytes(), 100).unwrap(), items, "{xml}");
    let json = write_json(&collection).to_string();
    assert_eq!(parse_json(json.as_bytes(), 100).unwrap(), items, "{json}");
    assert_eq!(
        write_json(&collection)["sharing"]["until"],
        "00000000000000000009"
    );
}

#[test]
fn the_spec_json_example_is_read() {
    let body = r#"[{"loc": "http://example.com/g", "title": "Buy groceries",
        "sync": {"id": "item_1_myapp_2005-05-21T11:43:33Z", "updates": "1",
        "history": [{"sequence": "1", "when": "2005-05-21T09:43:33Z", "by": "REO1750"}]}}]"#;
    let items = parse_json(body.as_bytes(), 10).unwrap();
    assert_eq!(items[0].sync.history, vec![h(1, "REO1750", "09:43:33")]);
}

#[test]
fn hostile_or_broken_collections_are_refused() {
    let ok = write_pox(&sample());
    for (bad, why) in [
        (ok.replace("updates=\"4\"", "updates=\"0\""), "updates"),
        (ok.replace("sequence=\"4\"", "sequence=\"x\""), "sequence"),
        (ok.replace("12:43:33Z", "12:43:33.5Z"), "fractional"),
        (
            ok.replace("<loc>http://example.com/groceries</loc>", ""),
            "loc",
        ),
        (ok.replace("deleted=\"true\"", "deleted=\"yes\""), "deleted"),
        (ok.replace("</collection>", ""), "not closed"),
        (
            ok.replace(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>",
                "<!DOCTYPE x []>",
            ),
            "DOCTYPE",
        ),
        (ok.replace("by=\"GPM7383\"", "by=\"not nss\""), "by"),
        ("<collection><item/></collection>".to_string(), "sync"),
        ("not xml at all".to_string(), "root"),
    ] {
        let err = parse_pox(bad.as_bytes(), 100).expect_err(why);
        assert!(!err.to_string().is_empty());
    }
    assert!(matches!(
        parse_pox(ok.as_bytes(), 1),
        Err(ParseError::TooMany { limit: 1 })
    ));
    let deep = format!("<collection>{}", "<a>".repeat(40));
    assert!(parse_pox(deep.as_bytes(), 10).is_err());
    for bad in [
        "{",
        "{}",
        "[1]",
        r#"[{"loc":"http://e.org/a","sync":{"id":"x","updates":"1","history":[]}}]"#,
    ] {
        assert!(parse_json(bad.as_bytes(), 10).is_err(), "{bad}");
    }
}
