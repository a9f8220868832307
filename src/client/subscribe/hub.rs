//! What `changehub subscribe` reads from the hub over plain HTTP: the topic's discovery
//! (`Link` headers), the changes after a cursor (`changes?after=`), a closed range of the
//! archive (`changelist/FIRST-LAST.xml`) and the Resource List (with its index pages).
//!
//! Every document comes back as [`Change`]s with their seqs, whatever its kind, so the
//! follower applies a page, a range and a notification the same way.

use anyhow::{bail, Context};
use std::time::Duration;

use crate::model::Change;
use crate::net::link::parse_links;
use crate::resourcesync::{self, Document, Limits, ParsedEntry, ResourceListHeader};

/// Changes asked for per `changes?after=` page.
pub const PAGE: u64 = 5_000;
/// The longest closed range the hub serves as one document.
pub const MAX_RANGE: u64 = 50_000;

/// How much of a document the subscriber accepts: a 50,000-change page with long locs.
pub fn limits() -> Limits {
    Limits {
        max_bytes: 128 << 20,
        max_entries: 60_000,
    }
}

/// The topic as discovered: its hub, and where the channel's catch-up documents are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    /// The topic URL the hub knows (`rel="self"`).
    pub url: String,
    /// The hub's WebSub endpoint (`rel="hub"`).
    pub hub: String,
    /// `{public_url}/channels/{name}`: the channel's documents are under it.
    pub base: String,
    /// The channel's name.
    pub channel: String,
}

impl Topic {
    /// Reads a topic's `Link` values: the hub (required) and the topic's own URL (`self`,
    /// else `asked`), which must be a changehub channel topic
    /// (`…/channels/{name}/changelist.xml`).
    pub fn from_links<'a>(
        asked: &str,
        links: impl IntoIterator<Item = &'a str>,
    ) -> anyhow::Result<Topic> {
        let (mut hub, mut own) = (None, None);
        for value in links {
            for link in parse_links(value) {
                if link.has_rel("hub") && hub.is_none() {
                    hub = Some(link.target.clone());
                }
                if link.has_rel("self") && own.is_none() {
                    own = Some(link.target.clone());
                }
            }
        }
        let Some(hub) = hub else {
            bail!(
                "{asked} names no hub (no Link header with rel=\"hub\"): it is not a WebSub \
                 topic. Give the topic of a changehub channel, {{hub}}/channels/NAME/changelist.xml"
            );
        };
        let url = own.unwrap_or_else(|| asked.to_string());
        let Some(base) = url.strip_suffix("/changelist.xml") else {
            bail!("{url} is not the topic of a changehub channel ({{hub}}/channels/NAME/changelist.xml)");
        };
        let channel = base.rsplit('/').next().unwrap_or_default().to_string();
        anyhow::ensure!(
            base.ends_with(&format!("/channels/{channel}"))
                && crate::model::valid_channel_name(&channel),
            "{url} is not the topic of a changehub channel ({{hub}}/channels/NAME/changelist.xml)"
        );
        Ok(Topic {
            url: url.clone(),
            hub,
            base: base.to_string(),
            channel,
        })
    }
}

/// Why a read of the log came back without changes.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Retention dropped changes the reader asked for; `oldest` is the oldest still kept.
    #[error("the hub no longer keeps these changes (the oldest it keeps is {oldest})")]
    Gone { oldest: u64 },
    /// The cursor is not of this log (the hub's data was wiped, or the cursor is from
    /// elsewhere): the log's newest seq and epoch.
    #[error("the cursor is not of the hub's log (its newest seq is {last}, epoch {epoch})")]
    OtherLog { last: u64, epoch: String },
    /// Anything else: network, status, a document that does not parse. Retried.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Changes read back from the hub, in seq order.
#[derive(Debug, Default)]
pub struct Page {
    pub epoch: Option<String>,
    pub changes: Vec<Change>,
    /// More after these (`rel="next"`).
    pub more: bool,
}

/// Reads the hub's documents of one topic.
#[derive(Clone)]
pub struct HubReader {
    client: reqwest::Client,
    pub topic: Topic,
    token: Option<String>,
}

impl HubReader {
    /// Discovers `topic_url`: GETs it and reads its `Link` headers.
    pub async fn discover(
        client: reqwest::Client,
        topic_url: &str,
        token: Option<String>,
    ) -> anyhow::Result<HubReader> {
        let response = get(&client, topic_url, token.as_deref())
            .await
            .with_context(|| format!("cannot read the topic {topic_url}"))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!("{topic_url} answered {status}: {}", body.trim());
        }
        let links: Vec<String> = response
            .headers()
            .get_all(http::header::LINK)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        let topic = Topic::from_links(topic_url, links.iter().map(String::as_str))?;
        Ok(HubReader {
            client,
            topic,
            token,
        })
    }

    /// The HTTP client it reads with.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The changes after `after` (one page of at most [`PAGE`]); `epoch` asks the hub to
    /// check that the cursor is of its log.
    pub async fn changes_after(&self, after: u64, epoch: Option<&str>) -> Result<Page, ReadError> {
        let mut url = format!("{}/changes?after={after}&limit={PAGE}", self.topic.base);
        if let Some(epoch) = epoch {
            url.push_str("&epoch=");
            url.push_str(epoch);
        }
        self.change_list(&url).await
    }

    /// The closed range `first..=last` from the archive (at most [`MAX_RANGE`] seqs, all at or
    /// before the newest). `Ok(None)` when the hub does not serve it as a closed range.
    pub async fn range(&self, first: u64, last: u64) -> Result<Option<Page>, ReadError> {
        let url = format!("{}/changelist/{first}-{last}.xml", self.topic.base);
        match self.change_list(&url).await {
            Err(ReadError::Other(e)) if is_not_found(&e) => Ok(None),
            other => other.map(Some),
        }
    }

    async fn change_list(&self, url: &str) -> Result<Page, ReadError> {
        let body = self.document(url).await?;
        let (header, entries) = resourcesync::parse_change_list(&body, &limits())
            .with_context(|| format!("{url}: not a Change List"))?;
        let more = header.links.iter().any(|l| l.rel == "next");
        Ok(Page {
            epoch: header.epoch,
            changes: to_changes(url, entries)?,
            more,
        })
    }

    /// The Resource List, every page of it: its header (the seq and epoch it reflects) and
    /// every resource as a `created` change.
    pub async fn resource_list(&self) -> anyhow::Result<(ResourceListHeader, Vec<Change>)> {
        let url = format!("{}/resourcelist.xml", self.topic.base);
        match self.parse(&url).await? {
            Document::ResourceList { header, entries } => Ok((header, to_changes(&url, entries)?)),
            Document::ResourceListIndex { header, pages } => {
                let mut all = Vec::new();
                for page in pages {
                    match self.parse(&page).await? {
                        Document::ResourceList { entries, .. } => {
                            all.extend(to_changes(&page, entries)?)
                        }
                        _ => bail!(
                            "{page}: a page of the Resource List index is not a Resource List"
                        ),
                    }
                }
                Ok((header, all))
            }
            _ => bail!("{url}: not a Resource List"),
        }
    }

    async fn parse(&self, url: &str) -> anyhow::Result<Document> {
        let body = self.document(url).await?;
        resourcesync::parse_document(&body, &limits())
            .with_context(|| format!("{url}: not readable"))
    }

    /// GETs a document; 410 and 409 become their [`ReadError`]s.
    async fn document(&self, url: &str) -> Result<bytes::Bytes, ReadError> {
        let response = get(&self.client, url, self.token.as_deref())
            .await
            .with_context(|| format!("GET {url}"))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response
                .bytes()
                .await
                .with_context(|| format!("GET {url}"))?);
        }
        let text = response.text().await.unwrap_or_default();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        match status.as_u16() {
            410 => {
                if let Some(oldest) = json["oldest"].as_u64() {
                    return Err(ReadError::Gone { oldest });
                }
            }
            409 => {
                if let (Some(last), Some(epoch)) = (json["last"].as_u64(), json["epoch"].as_str()) {
                    return Err(ReadError::OtherLog {
                        last,
                        epoch: epoch.to_string(),
                    });
                }
            }
            _ => {}
        }
        Err(ReadError::Other(anyhow::Error::new(Status {
            url: url.to_string(),
            status,
            body: text.trim().chars().take(300).collect(),
        })))
    }
}

/// An answer that is not 2xx.
#[derive(Debug, thiserror::Error)]
#[error("GET {url} answered {status}: {body}")]
pub struct Status {
    pub url: String,
    pub status: http::StatusCode,
    pub body: String,
}

fn is_not_found(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Status>()
        .is_some_and(|s| s.status == http::StatusCode::NOT_FOUND)
}

async fn get(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
) -> reqwest::Result<reqwest::Response> {
    let mut request = client.get(url).timeout(Duration::from_secs(120));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await
}

/// Entries of the hub's documents carry their seq and datetime; anything else is not from
/// a changehub hub.
fn to_changes(url: &str, entries: Vec<ParsedEntry>) -> anyhow::Result<Vec<Change>> {
    entries
        .into_iter()
        .map(|e| {
            let (Some(seq), Some(datetime)) = (e.seq, e.change.datetime) else {
                bail!(
                    "{url}: an entry without ch:seq or datetime ({})",
                    e.change.loc
                );
            };
            Ok(Change::from_new(seq, e.change, datetime))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_discovered_from_links() {
        let t = Topic::from_links(
            "http://x/channels/news/changelist.xml",
            [r#"<http://hub.example/hub>; rel="hub", <http://hub.example/channels/news/changelist.xml>; rel="self""#],
        )
        .unwrap();
        assert_eq!(t.hub, "http://hub.example/hub");
        assert_eq!(t.url, "http://hub.example/channels/news/changelist.xml");
        assert_eq!(t.base, "http://hub.example/channels/news");
        assert_eq!(t.channel, "news");
        // Two headers, rel unquoted, no self: the asked URL is the topic.
        let t = Topic::from_links(
            "http://x/channels/a.b/changelist.xml",
            ["<http://x/other>; rel=alternate", "<http://x/hub>; rel=hub"],
        )
        .unwrap();
        assert_eq!(
            (t.hub.as_str(), t.channel.as_str()),
            ("http://x/hub", "a.b")
        );
        let none = Topic::from_links("http://x/feed.xml", ["<http://x/y>; rel=alternate"]);
        assert!(none.unwrap_err().to_string().contains("no hub"));
        let foreign = Topic::from_links("http://x/feed.xml", ["<http://x/hub>; rel=hub"]);
        assert!(foreign.unwrap_err().to_string().contains("not the topic"));
    }
}
