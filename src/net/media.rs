//! Media types.

use std::borrow::Cow;

/// The essence of a media type (`type/subtype`, lowercased, parameters dropped):
/// `"Application/XML; charset=utf-8"` → `"application/xml"`.
/// Borrowed when already lowercase, as it nearly always is.
pub fn essence(content_type: &str) -> Cow<'_, str> {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if essence.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(essence.to_ascii_lowercase())
    } else {
        Cow::Borrowed(essence)
    }
}

/// True for the XML media types a Change List comes as (`application/xml`, `text/xml`).
pub fn is_xml(content_type: &str) -> bool {
    matches!(
        essence(content_type).as_ref(),
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
        // The common case takes no copy.
        assert!(matches!(
            essence("application/json"),
            Cow::Borrowed("application/json")
        ));
        assert!(is_xml("application/xml; charset=utf-8"));
        assert!(is_xml("Text/XML"));
        assert!(!is_xml("application/x-www-form-urlencoded"));
    }
}
