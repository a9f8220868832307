//! Media types.

/// The essence of a media type (`type/subtype`, lowercased, parameters dropped):
/// `"Application/XML; charset=utf-8"` → `"application/xml"`.
pub fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// True for the XML media types a Change List comes as (`application/xml`, `text/xml`).
pub fn is_xml(content_type: &str) -> bool {
    matches!(
        essence(content_type).as_str(),
        "application/xml" | "text/xml"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn essences() {
        assert_eq!(
            essence("Application/JSON; charset=utf-8"),
            "application/json"
        );
        assert_eq!(essence(" text/plain "), "text/plain");
        assert_eq!(essence(""), "");
        assert!(is_xml("application/xml; charset=utf-8"));
        assert!(is_xml("Text/XML"));
        assert!(!is_xml("application/x-www-form-urlencoded"));
    }
}
