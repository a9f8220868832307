//! The JSON form of a collection: `{"sharing": {"since", "until"}, "items": [...]}`, each
//! item with its resource's fields and `sync` as in the specification's JSON example.

use serde_json::{json, Map, Value};

use super::{
    check_item, format_when, parse_bool, parse_count, parse_when, sharing_value, Collection,
    ParseError,
};
use crate::model::feedsync::{History, Item, ItemData, SyncState};
use crate::model::{format_datetime, parse_w3c_datetime};

/// Renders `collection` as JSON.
pub fn write_json(collection: &Collection) -> Value {
    let items: Vec<Value> = collection
        .items
        .iter()
        .map(|e| write_item(&e.item, Some(e.seq)))
        .collect();
    json!({
        "sharing": {
            "since": sharing_value(collection.since),
            "until": sharing_value(collection.until),
        },
        "items": items,
    })
}

fn write_item(item: &Item, seq: Option<u64>) -> Value {
    let mut out = Map::new();
    if let Some(seq) = seq {
        out.insert("seq".into(), seq.into());
    }
    let data = &item.data;
    out.insert("loc".into(), data.loc.clone().into());
    if let Some(lastmod) = data.lastmod {
        out.insert("lastmod".into(), format_datetime(lastmod).into());
    }
    if let Some(hash) = &data.hash {
        out.insert("hash".into(), hash.clone().into());
    }
    if let Some(length) = data.length {
        out.insert("length".into(), length.into());
    }
    if let Some(t) = &data.media_type {
        out.insert("type".into(), t.clone().into());
    }
    let s = &item.sync;
    let mut sync = Map::new();
    sync.insert("id".into(), s.id.clone().into());
    sync.insert("updates".into(), s.updates.to_string().into());
    if s.deleted {
        sync.insert("deleted".into(), "true".into());
    }
    if s.noconflicts {
        sync.insert("noconflicts".into(), "true".into());
    }
    let history: Vec<Value> = s
        .history
        .iter()
        .map(|h| {
            let mut o = Map::new();
            o.insert("sequence".into(), h.sequence.to_string().into());
            if let Some(when) = h.when {
                o.insert("when".into(), format_when(when).into());
            }
            if let Some(by) = &h.by {
                o.insert("by".into(), by.clone().into());
            }
            Value::Object(o)
        })
        .collect();
    sync.insert("history".into(), history.into());
    if !s.conflicts.is_empty() {
        let conflicts: Vec<Value> = s.conflicts.iter().map(|c| write_item(c, None)).collect();
        sync.insert("conflicts".into(), conflicts.into());
    }
    out.insert("sync".into(), Value::Object(sync));
    Value::Object(out)
}

/// Parses a JSON collection into its items (at most `max_items`), each checked. The body is
/// the collection object, or an array of items.
pub fn parse_json(body: &[u8], max_items: usize) -> Result<Vec<Item>, ParseError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ParseError::Malformed(format!("malformed JSON: {e}")))?;
    let items = match value {
        Value::Array(items) => items,
        Value::Object(mut o) => match o.remove("items") {
            Some(Value::Array(items)) => items,
            _ => return Err(ParseError::Malformed("no \"items\" array".into())),
        },
        _ => return Err(ParseError::Malformed("not a collection object".into())),
    };
    if items.len() > max_items {
        return Err(ParseError::TooMany { limit: max_items });
    }
    items
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let item = read_item(v, true).map_err(|r| ParseError::item(index, r))?;
            check_item(&item).map_err(|r| ParseError::item(index, r))?;
            Ok(item)
        })
        .collect()
}

/// A string field (numbers are read as their decimal text).
fn text(o: &Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(_) => Err(format!("{name} must be a string")),
    }
}

fn read_item(v: &Value, top: bool) -> Result<Item, String> {
    let o = v.as_object().ok_or("an item must be an object")?;
    let sync = o
        .get("sync")
        .and_then(Value::as_object)
        .ok_or("the item has no sync object")?;
    let mut state = SyncState {
        id: text(sync, "id")?.ok_or("sync has no id")?,
        updates: parse_count("updates", &text(sync, "updates")?.ok_or("no updates")?)?,
        deleted: text(sync, "deleted")?
            .map(|v| parse_bool("deleted", &v))
            .transpose()?
            .unwrap_or(false),
        noconflicts: text(sync, "noconflicts")?
            .map(|v| parse_bool("noconflicts", &v))
            .transpose()?
            .unwrap_or(false),
        history: Vec::new(),
        conflicts: Vec::new(),
    };
    let history = sync
        .get("history")
        .and_then(Value::as_array)
        .ok_or("sync has no history array")?;
    for h in history {
        let h = h.as_object().ok_or("a history must be an object")?;
        state.history.push(History {
            sequence: parse_count("sequence", &text(h, "sequence")?.ok_or("no sequence")?)?,
            when: text(h, "when")?.map(|w| parse_when(&w)).transpose()?,
            by: text(h, "by")?,
        });
    }
    if let Some(conflicts) = sync.get("conflicts") {
        let conflicts = conflicts.as_array().ok_or("conflicts must be an array")?;
        if !top && !conflicts.is_empty() {
            return Err("a conflict item may not have conflicts of its own".into());
        }
        for c in conflicts {
            state.conflicts.push(read_item(c, false)?);
        }
    }
    let data = ItemData {
        loc: text(o, "loc")?.ok_or("the item has no loc")?,
        lastmod: text(o, "lastmod")?
            .map(|t| parse_w3c_datetime(&t))
            .transpose()
            .map_err(|e| format!("lastmod: {e}"))?,
        hash: text(o, "hash")?,
        length: match o.get("length") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or("length must be a non-negative integer")?),
        },
        media_type: text(o, "type")?,
    };
    Ok(Item { sync: state, data })
}
