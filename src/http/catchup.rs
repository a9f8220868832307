//! The catch-up and discovery documents: `changelist.xml` (with `Link` rel=hub/self, `ETag`,
//! 304 on `If-None-Match`), the closed lists `changelist/FIRST-LAST.xml` (immutable) and
//! `changelist-archive.xml`, `changes?after=SEQ&limit=N` (410 with the oldest retained seq),
//! `capabilitylist.xml` and `/.well-known/resourcesync`. Rendering is [`crate::catchup`]'s.
//!
//! Channels are hosted ones or the internal channels of external topics (whose `Link`
//! rel=self is the external topic). Private channels need their read token.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::sync::Arc;

use super::rendered::{self, Rendered};
use super::{read_token, ApiError, AppState};
use crate::auth;
use crate::batcher::ChannelFeed;
use crate::catchup::{self, CatchupError, Log, DEFAULT_PAGE, MAX_LIST};
use crate::external;
use crate::model::Lists;
use crate::net;
use crate::store::Origin;

/// A channel a request may read: a hosted channel, or the internal channel of an external
/// topic (private channels need their read token).
struct Readable {
    /// Its topic URL (for an external topic, the external URL).
    topic: String,
    /// How its log is cut into Change Lists.
    lists: Lists,
    feed: Arc<ChannelFeed>,
    /// The `xmpp:` URI of its PubSub node, when the XMPP bridge publishes it (a public hosted
    /// channel).
    xmpp_node: Option<String>,
}

impl Readable {
    fn new(
        state: &AppState,
        name: &str,
        headers: &HeaderMap,
        token: Option<&str>,
    ) -> Result<Readable, ApiError> {
        let no_channel = || ApiError::not_found(format!("no channel {name:?}"));
        if let Some(channel) = state.feeds.get(name) {
            if !auth::can_read(&channel.spec, read_token(headers, token)) {
                return Err(ApiError::unauthorized(
                    "this channel is private: give its read token",
                ));
            }
            return Ok(Readable {
                topic: state.config.urls.topic(name),
                lists: Lists {
                    size: channel.spec.retention.list_size,
                },
                feed: channel.feed,
                xmpp_node: match (&state.config.xmpp, &channel.spec.read_token) {
                    (Some(x), None) => Some(x.node_uri(name)),
                    _ => None,
                },
            });
        }
        let topic = state.external.by_channel(name).ok_or_else(no_channel)?;
        Ok(Readable {
            topic: topic.url.clone(),
            lists: external::LISTS,
            feed: topic.feed.clone(),
            xmpp_node: None,
        })
    }

    /// The origin of the channel's log (its epoch).
    async fn origin<'a>(&'a self, state: &AppState) -> Result<&'a Origin, ApiError> {
        Ok(self.feed.origin(state.store.as_ref()).await?)
    }

    /// What the documents of the channel are rendered from.
    fn log<'a>(&'a self, state: &'a AppState, origin: &'a Origin) -> Log<'a> {
        Log {
            store: state.store.as_ref(),
            urls: &state.config.urls,
            channel: &self.feed.name,
            lists: self.lists,
            origin,
            pages: &state.pages,
        }
    }
}

impl From<CatchupError> for ApiError {
    fn from(e: CatchupError) -> ApiError {
        match e {
            e @ CatchupError::Gone { oldest, .. } => ApiError {
                oldest: Some(oldest),
                ..ApiError::new(StatusCode::GONE, e.to_string())
            },
            CatchupError::BadPage(reason) => ApiError::bad_request(reason),
            CatchupError::NotFound(reason) => ApiError::not_found(reason),
            CatchupError::NotThisLog {
                reason,
                last,
                epoch,
            } => ApiError {
                position: Some((last, epoch)),
                ..ApiError::new(StatusCode::CONFLICT, reason)
            },
            CatchupError::Store(e) => ApiError::from(e),
        }
    }
}

/// True when `If-None-Match` names `etag`.
fn matches(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get(http::header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().trim_start_matches("W/") == etag)
        })
}

fn xml(body: impl Into<axum::body::Body>) -> Response {
    (
        [(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/xml"),
        )],
        body.into(),
    )
        .into_response()
}

fn set_header(response: &mut Response, name: http::HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, v);
    }
}

#[derive(Debug, Deserialize)]
pub struct TokenQuery {
    token: Option<String>,
}

/// `GET /channels/{name}/changelist.xml`
pub async fn changelist(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let channel = Readable::new(&state, &name, &headers, q.token.as_deref())?;
    let origin = channel.origin(&state).await?;
    let log = channel.log(&state, origin);
    let etag = catchup::etag(log).await?;
    let mut response = if matches(&headers, &etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        // Rendered once per state of the open list (and epoch), then served from memory.
        let key = format!("{etag} {}", log.origin.epoch);
        let doc = match state.rendered.topic(&name, &key) {
            Some(doc) => doc,
            None => {
                let doc = Rendered::new(catchup::changelist(log).await?);
                state.rendered.keep_topic(&name, key, doc.clone());
                doc
            }
        };
        state.rendered.topic_response(&name, &doc, &headers)
    };
    let mut links = net::hub_links(&state.config.urls.hub(), &channel.topic);
    if let Some(uri) = &channel.xmpp_node {
        links.push_str(&format!(", <{uri}>; rel=\"{}\"", catchup::XMPP_REL));
    }
    set_header(&mut response, http::header::LINK, &links);
    set_header(&mut response, http::header::ETAG, &etag);
    set_header(&mut response, http::header::CACHE_CONTROL, "no-cache");
    Ok(response)
}

/// `GET /channels/{name}/changelist/{FIRST}-{LAST}.xml`: a closed Change List. Immutable:
/// `Cache-Control: immutable`, an `ETag`, 304 on `If-None-Match`.
pub async fn closed_list(
    State(state): State<AppState>,
    Path((name, range)): Path<(String, String)>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let channel = Readable::new(&state, &name, &headers, q.token.as_deref())?;
    let origin = channel.origin(&state).await?;
    let (first, last) = range
        .strip_suffix(".xml")
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "{range:?} is not a closed Change List: they are named FIRST-LAST.xml"
            ))
        })?;
    let etag = format!("\"{}-{first}-{last}\"", origin.epoch);
    // Immutable once closed: rendered once, kept while there is room (`http::rendered`).
    let list = format!("{}-{first}-{last}", origin.epoch);
    let doc = match state.rendered.closed(&name, &list) {
        Some(doc) => doc,
        None => {
            let log = channel.log(&state, origin);
            let make_room = || state.rendered.make_room_for_closed(&name);
            let body = catchup::closed_list(log, first, last, make_room).await?;
            let doc = Rendered::new(body);
            state.rendered.keep_closed(&name, &list, doc.clone());
            doc
        }
    };
    let mut response = if matches(&headers, &etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        state.rendered.closed_response(&name, &list, &doc, &headers)
    };
    set_header(&mut response, http::header::ETAG, &etag);
    set_header(
        &mut response,
        http::header::CACHE_CONTROL,
        "public, max-age=31536000, immutable",
    );
    Ok(response)
}

#[derive(Debug, Deserialize)]
pub struct ArchiveQuery {
    page: Option<String>,
    token: Option<String>,
}

/// `GET /channels/{name}/changelist-archive.xml[?page=P]`: the Change List Archive, or (when
/// it has many lists) its index and the index's pages.
pub async fn archive(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<ArchiveQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let channel = Readable::new(&state, &name, &headers, q.token.as_deref())?;
    let origin = channel.origin(&state).await?;
    let page = match q.page.as_deref() {
        None => None,
        Some(p) => Some(
            p.parse::<u64>()
                .ok()
                .filter(|&p| p >= 1)
                .ok_or_else(|| ApiError::bad_request("page must be a number from 1"))?,
        ),
    };
    let body = catchup::archive(channel.log(&state, origin), page).await?;
    let mut response = xml(body);
    set_header(&mut response, http::header::CACHE_CONTROL, "no-cache");
    Ok(response)
}

#[derive(Debug, Deserialize)]
pub struct AfterQuery {
    after: Option<String>,
    /// The epoch the cursor belongs to (409 when it is not this log's).
    epoch: Option<String>,
    limit: Option<String>,
    token: Option<String>,
}

/// `GET /channels/{name}/changes?after=SEQ&limit=N`
pub async fn changes_after(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<AfterQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let channel = Readable::new(&state, &name, &headers, q.token.as_deref())?;
    let origin = channel.origin(&state).await?;
    let after = match q.after.as_deref() {
        None => 0,
        Some(s) => s
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request("after must be a seq (a non-negative integer)"))?,
    };
    let limit = match q.limit.as_deref() {
        None => DEFAULT_PAGE,
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=MAX_LIST).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "limit must be between 1 and {MAX_LIST}"
                )))
            }
        },
    };
    let log = channel.log(&state, origin);
    let page = catchup::changes_after(log, after, limit, q.epoch.as_deref()).await?;
    let mut links = net::hub_links(&state.config.urls.hub(), &channel.topic);
    if let Some(next) = &page.next {
        links.push_str(&format!(", <{next}>; rel=\"next\""));
    }
    let mut response = xml(axum::body::Body::new(rendered::Pieces::new(page.body)));
    set_header(&mut response, http::header::LINK, &links);
    Ok(response)
}

#[derive(Debug, Deserialize)]
pub struct PageQuery {
    after: Option<String>,
    upto: Option<String>,
    token: Option<String>,
}

fn seq_param(name: &str, value: Option<&str>) -> Result<Option<u64>, ApiError> {
    value
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("{name} must be a seq (a non-negative integer)"))
            })
        })
        .transpose()
}

/// `GET /channels/{name}/resourcelist.xml`, and its pages `?after=SEQ[&upto=SEQ]`. The seq the
/// document reflects is also in `X-Changehub-Seq`.
pub async fn resource_list(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let channel = Readable::new(&state, &name, &headers, q.token.as_deref())?;
    let origin = channel.origin(&state).await?;
    let log = channel.log(&state, origin);
    let after = seq_param("after", q.after.as_deref())?;
    let upto = seq_param("upto", q.upto.as_deref())?;
    let snapshot = match (after, upto) {
        (None, None) => catchup::resource_list(log).await?,
        (None, Some(_)) => return Err(ApiError::bad_request("upto needs after")),
        (Some(after), upto) => catchup::resource_list_page(log, after, upto).await?,
    };
    let mut response = xml(snapshot.body);
    set_header(
        &mut response,
        http::HeaderName::from_static("x-changehub-seq"),
        &snapshot.seq.to_string(),
    );
    set_header(&mut response, http::header::CACHE_CONTROL, "no-cache");
    Ok(response)
}

/// `GET /channels/{name}/capabilitylist.xml`
pub async fn capability_list(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let channel = Readable::new(&state, &name, &headers, q.token.as_deref())?;
    let dumps = state
        .feeds
        .spec(&name)
        .is_some_and(|spec| spec.dumps.is_some());
    Ok(xml(catchup::capability_list(
        &state.config.urls,
        &name,
        channel.xmpp_node.as_deref(),
        dumps,
    )))
}

/// `GET /.well-known/resourcesync`
pub async fn source_description(State(state): State<AppState>) -> Response {
    // Private channels are not listed: their names are theirs to give.
    let names: Vec<String> = state
        .feeds
        .all()
        .into_iter()
        .filter(|c| c.spec.read_token.is_none())
        .map(|c| c.spec.name.to_string())
        .collect();
    xml(catchup::source_description(
        &state.config.urls,
        names.iter().map(String::as_str),
    ))
}
