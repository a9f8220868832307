//! Fetching a topic and deciding what it is: a ResourceSync Change List (or Change List
//! Index), whose new entries go to the log, or generic content, which becomes the topic's
//! latest [`Content`](super::Content).

use bytes::Bytes;

use super::topic::{Kind, Topic};
use super::{is_allowed, External};
use crate::model::NewChange;
use crate::net;
use crate::resourcesync::{self, Document, Limits, ParseError};

/// Largest topic body fetched.
pub const MAX_FETCH_BYTES: usize = 8 << 20;
/// Most Change Lists read from one Change List Index per fetch.
pub const MAX_INDEX_LISTS: usize = 16;

impl External {
    /// Fetches the topic once, distributes what it found, and notes the result.
    pub(super) async fn fetch_and_distribute(&self, topic: &Topic) {
        let result = self.fetch_once(topic).await;
        topic.fetched(result);
    }

    async fn fetch_once(&self, topic: &Topic) -> Result<(), String> {
        let fetched = fetch(
            &self.client,
            &topic.url,
            self.config.allow_private_callbacks,
        )
        .await?;
        let limits = Limits {
            max_bytes: MAX_FETCH_BYTES,
            ..Limits::default()
        };
        // Parsing up to 8 MiB is CPU work: keep it off the async workers.
        let parsed = if looks_like_resourcesync(&fetched.body) {
            let body = fetched.body.clone();
            let parsed =
                tokio::task::spawn_blocking(move || resourcesync::parse_document(&body, &limits))
                    .await
                    .map_err(|e| format!("parsing the topic failed: {e}"))?;
            Some(parsed)
        } else {
            None
        };
        match parsed {
            Some(Ok(Document::ChangeList { entries, .. })) => {
                topic.set_kind(Kind::ChangeList);
                let changes = valid_changes(
                    &topic.url,
                    entries.into_iter().map(|e| e.change),
                    self.config.max_future,
                );
                let n = self
                    .record(topic, changes)
                    .await
                    .map_err(|e| e.to_string())?;
                tracing::debug!(topic = %topic.url, new = n, "external Change List fetched");
                Ok(())
            }
            Some(Ok(Document::ChangeListIndex { entries, .. })) => {
                topic.set_kind(Kind::ChangeList);
                self.read_index(topic, entries).await
            }
            Some(Err(e)) if is_broken_change_list(&e) => {
                Err(format!("the topic is an invalid Change List: {e}"))
            }
            _ => {
                topic.set_kind(Kind::Content);
                topic.set_content(fetched);
                Ok(())
            }
        }
    }

    /// Reads the Change Lists of an index that may hold new changes (open ones, and closed
    /// ones that end after the newest change recorded), oldest first.
    async fn read_index(
        &self,
        topic: &Topic,
        mut lists: Vec<resourcesync::IndexEntry>,
    ) -> Result<(), String> {
        let newest = self.newest(topic).await.map_err(|e| e.to_string())?;
        lists.retain(|l| match (l.until, newest) {
            (Some(until), Some(newest)) => until >= newest,
            _ => true,
        });
        lists.sort_by_key(|l| l.from);
        if lists.len() > MAX_INDEX_LISTS {
            lists.drain(..lists.len() - MAX_INDEX_LISTS);
        }
        let limits = Limits {
            max_bytes: MAX_FETCH_BYTES,
            ..Limits::default()
        };
        for list in lists {
            if !is_allowed(&self.config, &list.loc) {
                tracing::warn!(topic = %topic.url, list = %list.loc, "Change List outside the allowed prefixes; skipped");
                continue;
            }
            let fetched = fetch(&self.client, &list.loc, self.config.allow_private_callbacks)
                .await
                .map_err(|e| format!("{}: {e}", list.loc))?;
            let (_, entries) = resourcesync::parse_change_list(&fetched.body, &limits)
                .map_err(|e| format!("{}: {e}", list.loc))?;
            let changes = valid_changes(
                &list.loc,
                entries.into_iter().map(|e| e.change),
                self.config.max_future,
            );
            self.record(topic, changes)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Validated changes of a fetched document; invalid entries are skipped with a warning (the
/// document is not ours to refuse).
/// The entries of a fetched Change List that the log may take: valid, and dated at most
/// `max_future` ahead (`--max-future`; one far-future entry would pin every later change of
/// the topic to its date). The others are skipped with a warning.
fn valid_changes(
    url: &str,
    changes: impl Iterator<Item = NewChange>,
    max_future: std::time::Duration,
) -> Vec<NewChange> {
    let latest = time::Duration::try_from(max_future)
        .ok()
        .and_then(|margin| time::OffsetDateTime::now_utc().checked_add(margin));
    changes
        .enumerate()
        .filter_map(|(i, c)| {
            let checked = c.validate().map_err(|e| e.to_string()).and_then(|()| {
                match (c.datetime, latest) {
                    (Some(dt), Some(latest)) if dt > latest => Err(format!(
                        "datetime {} is more than {} in the future (--max-future)",
                        crate::model::format_datetime(dt),
                        humantime::format_duration(max_future)
                    )),
                    _ => Ok(()),
                }
            });
            match checked {
                Ok(()) => Some(c),
                Err(e) => {
                    tracing::warn!(topic = url, entry = i, error = %e, "invalid Change List entry skipped");
                    None
                }
            }
        })
        .collect()
}

/// Errors that mean "a Change List, but a broken one", as opposed to "not a ResourceSync
/// document at all" (which is distributed as generic content).
fn is_broken_change_list(e: &ParseError) -> bool {
    matches!(
        e,
        ParseError::Entry { .. } | ParseError::Header(_) | ParseError::TooManyEntries { .. }
    )
}

/// A cheap test before parsing: XML whose root is a sitemap `urlset` or `sitemapindex`.
fn looks_like_resourcesync(body: &[u8]) -> bool {
    let head = &body[..body.len().min(4096)];
    let text = String::from_utf8_lossy(head);
    text.trim_start_matches('\u{feff}')
        .trim_start()
        .starts_with('<')
        && (text.contains("urlset") || text.contains("sitemapindex"))
}

/// A fetched topic.
#[derive(Debug)]
pub struct Fetched {
    pub body: Bytes,
    pub content_type: Option<String>,
    /// Every `Link` header value.
    pub links: Vec<String>,
}

/// GETs `url`: 2xx only, no redirects, at most [`MAX_FETCH_BYTES`], within the client's
/// timeout.
pub async fn fetch(
    client: &reqwest::Client,
    url: &str,
    allow_private: bool,
) -> Result<Fetched, String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("bad topic URL: {e}"))?;
    net::check_target(&parsed, allow_private).map_err(|e| format!("topic refused: {e}"))?;
    let mut resp = client
        .get(parsed)
        .send()
        .await
        .map_err(|e| format!("fetch failed: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("topic answered {}", resp.status()));
    }
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_FETCH_BYTES as u64)
    {
        return Err(format!("topic is larger than {MAX_FETCH_BYTES} bytes"));
    }
    let content_type = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let links = resp
        .headers()
        .get_all(http::header::LINK)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect();
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("reading the topic failed: {e}"))?
    {
        if body.len() + chunk.len() > MAX_FETCH_BYTES {
            return Err(format!("topic is larger than {MAX_FETCH_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Fetched {
        body: Bytes::from(body),
        content_type,
        links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_future_and_invalid_entries_are_skipped() {
        let now = time::OffsetDateTime::now_utc();
        let change = |loc: &str, ahead: time::Duration| NewChange {
            datetime: Some(now + ahead),
            ..NewChange::new(loc, crate::model::ChangeType::Created)
        };
        let kept = valid_changes(
            "http://topic.example/",
            [
                change("http://a.example/now", time::Duration::ZERO),
                change("http://a.example/soon", time::Duration::hours(1)),
                change("http://a.example/far", time::Duration::days(3)),
                change("not a url", time::Duration::ZERO),
            ]
            .into_iter(),
            std::time::Duration::from_secs(86_400),
        );
        let locs: Vec<&str> = kept.iter().map(|c| c.loc.as_str()).collect();
        assert_eq!(locs, ["http://a.example/now", "http://a.example/soon"]);
    }

    #[test]
    fn sniffing() {
        assert!(looks_like_resourcesync(
            b"\xef\xbb\xbf<?xml version=\"1.0\"?><urlset>"
        ));
        assert!(!looks_like_resourcesync(b"hello urlset"));
        assert!(!looks_like_resourcesync(b"<html><body>hi</body></html>"));
    }
}
