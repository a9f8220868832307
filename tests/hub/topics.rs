//! A plain topic server on loopback for external-topic tests: serves whatever a test puts at a
//! path (body, `Content-Type`, `Link` headers, status, an optional delay), counts GETs, and
//! helpers that write static ResourceSync Change Lists the way other producers do.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

use crate::common::serve_until_stopped;

/// What the server answers at one path.
#[derive(Debug, Clone)]
pub struct Doc {
    pub body: Vec<u8>,
    pub content_type: Option<String>,
    pub links: Vec<String>,
    pub status: StatusCode,
    /// Held this long before answering.
    pub delay: Option<Duration>,
}

impl Doc {
    pub fn new(body: impl Into<Vec<u8>>, content_type: &str) -> Doc {
        Doc {
            body: body.into(),
            content_type: Some(content_type.to_string()),
            links: Vec::new(),
            status: StatusCode::OK,
            delay: None,
        }
    }
}

#[derive(Clone, Default)]
struct ServerState {
    docs: Arc<Mutex<HashMap<String, Doc>>>,
    gets: Arc<Mutex<HashMap<String, usize>>>,
}

pub struct TopicServer {
    pub base: String,
    state: ServerState,
    stop: Option<oneshot::Sender<()>>,
}

impl TopicServer {
    pub async fn start() -> TopicServer {
        let state = ServerState::default();
        let app = Router::new().fallback(serve).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = serve_until_stopped(listener, app);
        TopicServer {
            base: format!("http://{addr}"),
            state,
            stop: Some(stop),
        }
    }

    /// The allowed prefix for this server's topics.
    pub fn prefix(&self) -> String {
        format!("{}/", self.base)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn put(&self, path: &str, doc: Doc) {
        self.state
            .docs
            .lock()
            .unwrap()
            .insert(path.to_string(), doc);
    }

    pub fn gets(&self, path: &str) -> usize {
        self.state
            .gets
            .lock()
            .unwrap()
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for TopicServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn serve(State(state): State<ServerState>, uri: Uri, _headers: HeaderMap) -> Response {
    let path = uri.path().to_string();
    *state.gets.lock().unwrap().entry(path.clone()).or_default() += 1;
    let doc = state.docs.lock().unwrap().get(&path).cloned();
    let Some(doc) = doc else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if let Some(delay) = doc.delay {
        tokio::time::sleep(delay).await;
    }
    let mut response = Response::new(Body::from(doc.body));
    *response.status_mut() = doc.status;
    let h = response.headers_mut();
    if let Some(ct) = &doc.content_type {
        h.insert("content-type", HeaderValue::from_str(ct).unwrap());
    }
    for link in &doc.links {
        h.append("link", HeaderValue::from_str(link).unwrap());
    }
    if doc.status.is_redirection() {
        h.insert("location", HeaderValue::from_static("/elsewhere"));
    }
    response
}

/// One entry of a static Change List.
#[derive(Debug, Clone)]
pub struct Entry {
    pub loc: String,
    pub change: &'static str,
    pub lastmod: String,
}

/// `n` entries `http://example.org/{prefix}/{i}`, one second apart from `start_second`.
pub fn entries(prefix: &str, start_second: u32, n: u32) -> Vec<Entry> {
    (0..n)
        .map(|i| {
            let s = start_second + i;
            Entry {
                loc: format!("http://example.org/{prefix}/{i}"),
                change: if i % 3 == 2 { "deleted" } else { "updated" },
                lastmod: format!("2024-05-01T10:{:02}:{:02}Z", s / 60, s % 60),
            }
        })
        .collect()
}

/// A ResourceSync 1.0 Change List as a static file (only `<lastmod>`, the way resync and
/// sitemap tools write it).
pub fn change_list(entries: &[Entry]) -> String {
    let mut s = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <urlset xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\" xmlns:rs=\"http://www.openarchives.org/rs/terms/\">\n\
         <rs:ln rel=\"up\" href=\"http://example.org/capabilitylist.xml\"/>\n\
         <rs:md capability=\"changelist\" from=\"2024-05-01T00:00:00Z\"/>\n",
    );
    for e in entries {
        s.push_str(&format!(
            "<url><loc>{}</loc><lastmod>{}</lastmod><rs:md change=\"{}\"/></url>\n",
            e.loc, e.lastmod, e.change
        ));
    }
    s.push_str("</urlset>\n");
    s
}

/// A Change List Index pointing at `lists` (`(url, from, until)`).
pub fn change_list_index(lists: &[(String, &str, Option<&str>)]) -> String {
    let mut s = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <sitemapindex xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\" xmlns:rs=\"http://www.openarchives.org/rs/terms/\">\n\
         <rs:md capability=\"changelist\" from=\"2024-05-01T00:00:00Z\"/>\n",
    );
    for (loc, from, until) in lists {
        let until = until.map(|u| format!(" until=\"{u}\"")).unwrap_or_default();
        s.push_str(&format!(
            "<sitemap><loc>{loc}</loc><rs:md from=\"{from}\"{until}/></sitemap>\n"
        ));
    }
    s.push_str("</sitemapindex>\n");
    s
}

/// The `loc`s of a delivered notification, in order.
pub fn locs(body: &[u8]) -> Vec<String> {
    let (_, entries) =
        changehub::resourcesync::parse_change_list(body, &crate::common::big_limits()).unwrap();
    entries.into_iter().map(|e| e.change.loc).collect()
}
