//! Every URL the hub publishes, built in one place from its public URL (with `url::Url`, so
//! that a public URL with a path prefix works the same as a bare host).

use url::Url;

/// The hub's published URLs. Channel names need no escaping (`[a-z0-9._-]`, or an external
/// topic's internal `_ext-…` name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Urls {
    base: Url,
}

impl Urls {
    /// From the public URL (`http(s)://host[:port][/prefix]`, no query).
    pub fn new(public_url: &str) -> Result<Urls, url::ParseError> {
        let mut base = Url::parse(public_url)?;
        base.set_fragment(None);
        Ok(Urls { base })
    }

    /// The public URL, without a trailing slash.
    pub fn public(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    fn at(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// The hub's home page (`GET /`, the dashboard), with a trailing slash: the page that
    /// describes this source, linked from the Source Description as `rel="describedby"`.
    pub fn home(&self) -> String {
        self.at(&[""]).into()
    }

    /// `POST` here to subscribe, unsubscribe and publish.
    pub fn hub(&self) -> String {
        self.at(&["hub"]).into()
    }

    /// The topic URL of a channel, which is also its catch-up Change List.
    pub fn topic(&self, channel: &str) -> String {
        self.at(&["channels", channel, "changelist.xml"]).into()
    }

    pub fn capability_list(&self, channel: &str) -> String {
        self.at(&["channels", channel, "capabilitylist.xml"]).into()
    }

    pub fn source_description(&self) -> String {
        self.at(&[".well-known", "resourcesync"]).into()
    }

    /// A page of `changes?after=`.
    pub fn changes_after(&self, channel: &str, after: u64, limit: usize) -> String {
        let mut url = self.at(&["channels", channel, "changes"]);
        url.query_pairs_mut()
            .append_pair("after", &after.to_string())
            .append_pair("limit", &limit.to_string());
        url.into()
    }

    /// The Change List Archive of `channel` (an archive index when it has many lists).
    pub fn archive(&self, channel: &str) -> String {
        self.at(&["channels", channel, "changelist-archive.xml"])
            .into()
    }

    /// Page `page` (from 1) of the Change List Archive Index of `channel`.
    pub fn archive_page(&self, channel: &str, page: u64) -> String {
        let mut url = self.at(&["channels", channel, "changelist-archive.xml"]);
        url.query_pairs_mut().append_pair("page", &page.to_string());
        url.into()
    }

    /// The closed Change List of `channel` that holds the seqs `first..=last`.
    pub fn closed_list(&self, channel: &str, first: u64, last: u64) -> String {
        self.at(&[
            "channels",
            channel,
            "changelist",
            &format!("{first}-{last}.xml"),
        ])
        .into()
    }

    /// The Resource List of `channel` (a Resource List Index when it has many resources).
    pub fn resource_list(&self, channel: &str) -> String {
        self.at(&["channels", channel, "resourcelist.xml"]).into()
    }

    /// One page of a Resource List Index: the resources whose latest change has a seq after
    /// `after`, up to `upto` (the last page has no upper bound).
    pub fn resource_list_page(&self, channel: &str, after: u64, upto: Option<u64>) -> String {
        let mut url = self.at(&["channels", channel, "resourcelist.xml"]);
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("after", &after.to_string());
            if let Some(upto) = upto {
                query.append_pair("upto", &upto.to_string());
            }
        }
        url.into()
    }

    /// The Change Dump of `channel` (a Change Dump Index when it lists many dumps); also the
    /// topic whose notifications announce new dumps.
    pub fn change_dump(&self, channel: &str) -> String {
        self.at(&["channels", channel, "changedump.xml"]).into()
    }

    /// Page `page` (from 1) of the Change Dump Index of `channel`.
    pub fn change_dump_page(&self, channel: &str, page: u64) -> String {
        let mut url = self.at(&["channels", channel, "changedump.xml"]);
        url.query_pairs_mut().append_pair("page", &page.to_string());
        url.into()
    }

    /// The ZIP package of a channel's Change Dump of the seqs `first..=last`.
    pub fn dump_package(&self, channel: &str, first: u64, last: u64) -> String {
        self.at(&[
            "channels",
            channel,
            "changedump",
            &format!("{first}-{last}.zip"),
        ])
        .into()
    }

    /// The copy of that package's `manifest.xml`.
    pub fn dump_manifest(&self, channel: &str, first: u64, last: u64) -> String {
        self.at(&[
            "channels",
            channel,
            "changedump",
            &format!("{first}-{last}.manifest.xml"),
        ])
        .into()
    }

    /// The channel whose Change Dump is `topic`, if it is one of this hub's.
    pub fn channel_of_dump_topic<'a>(&self, topic: &'a str) -> Option<&'a str> {
        topic
            .strip_prefix(self.public())?
            .strip_prefix("/channels/")?
            .strip_suffix("/changedump.xml")
            .filter(|name| !name.contains('/'))
    }

    /// The channel name in a topic URL of this hub, if `topic` is one.
    pub fn channel_of_topic<'a>(&self, topic: &'a str) -> Option<&'a str> {
        topic
            .strip_prefix(self.public())?
            .strip_prefix("/channels/")?
            .strip_suffix("/changelist.xml")
            .filter(|name| !name.contains('/'))
    }
}

/// `url` as it may be shown (logs, the admin API): a user name and password in it
/// (`https://user:pass@host/…`) become `***`.
pub fn shown(url: &str) -> std::borrow::Cow<'_, str> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.into();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]).into(),
        None => url.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_urls_are_not_shown() {
        assert_eq!(
            shown("https://u:p@h.example/cb?x=1"),
            "https://***@h.example/cb?x=1"
        );
        assert_eq!(shown("http://h.example/a@b"), "http://h.example/a@b");
        assert_eq!(shown("http://h.example/"), "http://h.example/");
        assert_eq!(shown("not a url"), "not a url");
    }

    #[test]
    fn bare_host_and_path_prefix() {
        let u = Urls::new("http://127.0.0.1:8080").unwrap();
        assert_eq!(u.public(), "http://127.0.0.1:8080");
        assert_eq!(u.home(), "http://127.0.0.1:8080/");
        assert_eq!(u.hub(), "http://127.0.0.1:8080/hub");
        assert_eq!(
            u.topic("a"),
            "http://127.0.0.1:8080/channels/a/changelist.xml"
        );
        assert_eq!(
            u.changes_after("a", 5, 10),
            "http://127.0.0.1:8080/channels/a/changes?after=5&limit=10"
        );
        assert_eq!(
            u.source_description(),
            "http://127.0.0.1:8080/.well-known/resourcesync"
        );
        let p = Urls::new("https://example.org/sync").unwrap();
        assert_eq!(p.public(), "https://example.org/sync");
        assert_eq!(p.home(), "https://example.org/sync/");
        assert_eq!(
            p.capability_list("news"),
            "https://example.org/sync/channels/news/capabilitylist.xml"
        );
        assert_eq!(
            p.channel_of_topic("https://example.org/sync/channels/news/changelist.xml"),
            Some("news")
        );
        assert_eq!(
            p.channel_of_topic("https://example.org/channels/news/changelist.xml"),
            None
        );
        assert_eq!(
            p.channel_of_topic("https://example.org/sync/channels/a/b/changelist.xml"),
            None
        );
    }
}
