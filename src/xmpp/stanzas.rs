//! The XEP-0060 payloads the bridge sends, built as XML text and parsed into elements: create
//! and configure a node, publish an item. No connection here, so each is testable on its own.

use std::str::FromStr;
use tokio_xmpp::minidom::Element;

/// `http://jabber.org/protocol/pubsub`
pub const NS_PUBSUB: &str = "http://jabber.org/protocol/pubsub";
/// `http://jabber.org/protocol/pubsub#owner`
pub const NS_PUBSUB_OWNER: &str = "http://jabber.org/protocol/pubsub#owner";
/// `http://jabber.org/protocol/pubsub#event`
pub const NS_PUBSUB_EVENT: &str = "http://jabber.org/protocol/pubsub#event";

/// A payload that could not be built: the document is not well-formed XML.
#[derive(Debug, thiserror::Error)]
#[error("not an XML element: {0}")]
pub struct BuildError(String);

fn parse(xml: &str) -> Result<Element, BuildError> {
    Element::from_str(xml).map_err(|e| BuildError(e.to_string()))
}

fn attr(value: &str) -> std::borrow::Cow<'_, str> {
    quick_xml::escape::escape(value)
}

/// The node's configuration form: items persisted, at most `max_items` of them (a number or
/// `max`, the most the service allows), payloads delivered, open to anyone.
fn config_form(title: &str, max_items: &str) -> String {
    let field = |var: &str, value: &str| {
        format!(
            "<field var='{}'><value>{}</value></field>",
            attr(var),
            attr(value)
        )
    };
    [
        "<x xmlns='jabber:x:data' type='submit'>".to_string(),
        "<field var='FORM_TYPE' type='hidden'><value>http://jabber.org/protocol/pubsub#node_config</value></field>".to_string(),
        field("pubsub#title", title),
        field("pubsub#persist_items", "1"),
        field("pubsub#max_items", max_items),
        field("pubsub#deliver_payloads", "1"),
        field("pubsub#access_model", "open"),
        "</x>".to_string(),
    ]
    .concat()
}

/// `<pubsub><create node/><configure>FORM</configure></pubsub>`: creates a leaf node with
/// its configuration.
pub fn create(node: &str, title: &str, max_items: &str) -> Result<Element, BuildError> {
    parse(&format!(
        "<pubsub xmlns='{NS_PUBSUB}'><create node='{}'/><configure>{}</configure></pubsub>",
        attr(node),
        config_form(title, max_items)
    ))
}

/// `<pubsub xmlns='…#owner'><configure node>FORM</configure></pubsub>`: sets the
/// configuration of a node that exists.
pub fn configure(node: &str, title: &str, max_items: &str) -> Result<Element, BuildError> {
    parse(&format!(
        "<pubsub xmlns='{NS_PUBSUB_OWNER}'><configure node='{}'>{}</configure></pubsub>",
        attr(node),
        config_form(title, max_items)
    ))
}

/// `<pubsub><publish node><item id>DOCUMENT</item></publish></pubsub>`: publishes `document`
/// (an XML document; its declaration is left out) as item `id`.
pub fn publish(node: &str, id: &str, document: &[u8]) -> Result<Element, BuildError> {
    let text = std::str::from_utf8(document).map_err(|e| BuildError(e.to_string()))?;
    let root = strip_declaration(text);
    parse(&format!(
        "<pubsub xmlns='{NS_PUBSUB}'><publish node='{}'><item id='{}'>{root}</item></publish></pubsub>",
        attr(node),
        attr(id)
    ))
}

/// `text` without its leading `<?xml …?>` declaration.
fn strip_declaration(text: &str) -> &str {
    let trimmed = text.trim_start();
    match trimmed.strip_prefix("<?xml") {
        Some(rest) => rest.find("?>").map_or(trimmed, |end| &rest[end + 2..]),
        None => trimmed,
    }
}

/// The id of the item holding seqs `first..=last`: `FIRST-LAST`.
pub fn item_id(first: u64, last: u64) -> String {
    format!("{first}-{last}")
}

/// The seq range an item id names, if it is one.
pub fn parse_item_id(id: &str) -> Option<(u64, u64)> {
    let (first, last) = id.split_once('-')?;
    Some((first.parse().ok()?, last.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_item_carries_the_document_without_its_declaration() {
        let doc = br#"<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://e.org/a?x=1&amp;y=2</loc></url></urlset>"#;
        let el = publish("changehub/c'\"", &item_id(3, 5), doc).unwrap();
        assert!(el.is("pubsub", NS_PUBSUB));
        let publish = el.get_child("publish", NS_PUBSUB).unwrap();
        assert_eq!(publish.attr("node"), Some("changehub/c'\""));
        let item = publish.get_child("item", NS_PUBSUB).unwrap();
        assert_eq!(item.attr("id"), Some("3-5"));
        let urlset = item
            .get_child("urlset", "http://www.sitemaps.org/schemas/sitemap/0.9")
            .unwrap();
        assert_eq!(urlset.children().count(), 1);
        assert!(String::from(&el).contains("x=1&amp;y=2"));
    }

    #[test]
    fn node_configuration_asks_for_persistent_payloads() {
        let el = create("changehub/c", "changehub: c", "100").unwrap();
        let text = String::from(&el);
        for field in [
            "pubsub#persist_items",
            "pubsub#max_items",
            "pubsub#deliver_payloads",
        ] {
            assert!(text.contains(field), "{text}");
        }
        assert!(configure("n", "t", "max")
            .unwrap()
            .is("pubsub", NS_PUBSUB_OWNER));
    }

    #[test]
    fn item_ids_are_seq_ranges() {
        assert_eq!(parse_item_id(&item_id(1, 10)), Some((1, 10)));
        assert_eq!(parse_item_id("current"), None);
        assert_eq!(parse_item_id("1-x"), None);
    }

    #[test]
    fn broken_documents_are_refused() {
        assert!(publish("n", "1-1", b"<urlset>").is_err());
        assert!(publish("n", "1-1", &[0xff, 0xfe]).is_err());
    }
}
