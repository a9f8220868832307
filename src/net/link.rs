//! `Link` headers (RFC 8288): the parser accepts every spelling publishers use (quoted and
//! unquoted `rel`, several links per header, several rels per link), and [`hub_links`] writes
//! the one value the hub sends with every topic and delivery.

/// The hub's `Link` value for a topic: `<hub>; rel="hub", <topic>; rel="self"`.
pub fn hub_links(hub: &str, topic: &str) -> String {
    format!("<{hub}>; rel=\"hub\", <{topic}>; rel=\"self\"")
}

/// One link of a `Link` header (RFC 8288): its target, its rel values (lowercased) and the
/// text it was written as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkValue {
    pub target: String,
    pub rels: Vec<String>,
    pub raw: String,
}

impl LinkValue {
    pub fn has_rel(&self, rel: &str) -> bool {
        self.rels.iter().any(|r| r.eq_ignore_ascii_case(rel))
    }
}

/// Splits `s` on `sep` outside `<…>` and quoted strings.
fn split_outside(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut in_angle, mut in_quote, mut escaped) = (false, false, false);
    let mut start = 0;
    for (i, ch) in s.char_indices() {
        if in_quote {
            match ch {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_quote = false,
                _ => {}
            }
            continue;
        }
        match ch {
            '"' if !in_angle => in_quote = true,
            '<' => in_angle = true,
            '>' => in_angle = false,
            c if c == sep && !in_angle => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Parses one `Link` header value, which may hold several links. Accepts quoted and unquoted
/// parameter values (`rel=self`, `rel="self"`, `rel="self hub"`); skips what it cannot read.
pub fn parse_links(value: &str) -> Vec<LinkValue> {
    let mut out = Vec::new();
    for link in split_outside(value, ',') {
        let raw = link.trim();
        let mut parts = split_outside(raw, ';').into_iter();
        let Some(target) = parts
            .next()
            .map(str::trim)
            .and_then(|t| t.strip_prefix('<'))
            .and_then(|t| t.strip_suffix('>'))
        else {
            continue;
        };
        let mut rels = Vec::new();
        for param in parts {
            let Some((name, value)) = param.split_once('=') else {
                continue;
            };
            if !name.trim().eq_ignore_ascii_case("rel") {
                continue;
            }
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            rels.extend(value.split_ascii_whitespace().map(str::to_ascii_lowercase));
        }
        out.push(LinkValue {
            target: target.trim().to_string(),
            rels,
            raw: raw.to_string(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_headers_in_every_spelling() {
        let l = parse_links("<http://t/x.xml>;rel=self, <http://h/hub>;rel=hub");
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].target, "http://t/x.xml");
        assert!(l[0].has_rel("self") && l[1].has_rel("hub"));
        let l = parse_links(r#"<http://t/a,b>; rel="self hub"; title="x, y; z""#);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].target, "http://t/a,b");
        assert!(l[0].has_rel("self") && l[0].has_rel("hub"));
        let l = parse_links(r#"<http://t/p>; type="text/html"; REL="Alternate""#);
        assert!(l[0].has_rel("alternate"));
        assert!(parse_links("garbage, <>").iter().all(|l| l.rels.is_empty()));
    }

    #[test]
    fn the_hub_links_parse_back() {
        let v = hub_links("http://h/hub", "http://h/channels/a/changelist.xml");
        let l = parse_links(&v);
        assert_eq!(l.len(), 2);
        assert!(l[0].has_rel("hub") && l[1].has_rel("self"));
        assert_eq!(l[1].target, "http://h/channels/a/changelist.xml");
    }
}
