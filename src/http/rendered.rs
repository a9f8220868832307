//! Rendered documents kept for the next request: a channel's topic (until its entity tag
//! changes) and recently read closed Change Lists (they never change). Each is rendered once
//! and, when a client asks for gzip, compressed once; later requests copy bytes.
//!
//! Bounds: one topic per channel, and closed lists up to a bound of bytes in all, gzip forms
//! included (an eighth of `--cache-size`; the oldest dropped first).

use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

/// Smaller documents are sent as they are (gzip saves little there).
pub const GZIP_FROM: usize = 1024;

/// One rendered document, and its gzip form once a client asked for it.
pub struct Rendered {
    body: Bytes,
    gzip: OnceLock<Option<Bytes>>,
}

impl Rendered {
    /// Keeps `body`. Its spare capacity is given back first: renderers allocate for a
    /// generous guess of the size, and `Bytes` would keep the whole allocation while the
    /// bound of the closed lists counts only the length (a closed list of 10,000 changes of the
    /// benchmark: about 3.5 MB allocated for 2.8 MB written).
    pub fn new(mut body: Vec<u8>) -> Arc<Rendered> {
        body.shrink_to_fit();
        Arc::new(Rendered {
            body: Bytes::from(body),
            gzip: OnceLock::new(),
        })
    }

    /// The bytes this document holds: its body, and its gzip form once made.
    fn size(&self) -> usize {
        self.body.len()
            + self
                .gzip
                .get()
                .and_then(Option::as_ref)
                .map_or(0, Bytes::len)
    }

    /// An `application/xml` response: gzip when the request accepts it and the document is
    /// not tiny, else the bytes as rendered.
    pub fn response(&self, request: &HeaderMap) -> Response {
        let xml = HeaderValue::from_static("application/xml");
        let vary = HeaderValue::from_static("accept-encoding");
        if self.body.len() >= GZIP_FROM && accepts_gzip(request) {
            if let Some(gz) = self.gzip.get_or_init(|| gzip(&self.body)) {
                let gzip = HeaderValue::from_static("gzip");
                let headers = [
                    (header::CONTENT_TYPE, xml),
                    (header::CONTENT_ENCODING, gzip),
                    (header::VARY, vary),
                ];
                return (headers, gz.clone()).into_response();
            }
        }
        let headers = [(header::CONTENT_TYPE, xml), (header::VARY, vary)];
        (headers, self.body.clone()).into_response()
    }
}

/// True when `Accept-Encoding` lists gzip with a non-zero quality.
fn accepts_gzip(request: &HeaderMap) -> bool {
    request
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

fn gzip(body: &[u8]) -> Option<Bytes> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    encoder.write_all(body).ok()?;
    // Allocated for a quarter of the body; XML compresses to less, and the rest is freed.
    let mut gz = encoder.finish().ok()?;
    gz.shrink_to_fit();
    Some(Bytes::from(gz))
}

/// The rendered documents of every channel (see the module docs).
pub struct RenderedDocs {
    /// Channel → (the key it was rendered for, the document).
    topics: Mutex<HashMap<String, (String, Arc<Rendered>)>>,
    closed: Mutex<ClosedLists>,
}

struct ClosedLists {
    /// Key → (the document, the bytes counted for it: its body, and its gzip form once made).
    by_key: HashMap<String, (Arc<Rendered>, usize)>,
    /// Keys, oldest first.
    order: VecDeque<String>,
    bytes: usize,
    bound: usize,
}

impl ClosedLists {
    /// Drops the oldest lists until the rest fit the bound.
    fn shrink(&mut self) {
        while self.bytes > self.bound {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, counted)) = self.by_key.remove(&oldest) {
                self.bytes -= counted;
            }
        }
    }
}

impl RenderedDocs {
    /// Keeps closed lists up to `closed_bytes` in all, their gzip forms included.
    pub fn new(closed_bytes: usize) -> RenderedDocs {
        RenderedDocs {
            topics: Mutex::default(),
            closed: Mutex::new(ClosedLists {
                by_key: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
                bound: closed_bytes,
            }),
        }
    }

    /// `channel`'s topic if it was rendered for `key` (its entity tag and epoch).
    pub fn topic(&self, channel: &str, key: &str) -> Option<Arc<Rendered>> {
        let topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        topics
            .get(channel)
            .filter(|(k, _)| k == key)
            .map(|(_, doc)| doc.clone())
    }

    pub fn keep_topic(&self, channel: &str, key: String, doc: Arc<Rendered>) {
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        topics.insert(channel.to_string(), (key, doc));
    }

    /// A closed list rendered before (`key` names its channel, epoch and range).
    pub fn closed(&self, key: &str) -> Option<Arc<Rendered>> {
        let closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        closed.by_key.get(key).map(|(doc, _)| doc.clone())
    }

    pub fn keep_closed(&self, key: String, doc: Arc<Rendered>) {
        let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        let size = doc.size();
        if closed.by_key.contains_key(&key) || size > closed.bound {
            return;
        }
        closed.bytes += size;
        closed.order.push_back(key.clone());
        closed.by_key.insert(key, (doc, size));
        closed.shrink();
    }

    /// The response of closed list `doc` kept as `key` (see [`Rendered::response`]). When
    /// the response made the list's gzip form, the bound counts it from then on.
    pub fn closed_response(&self, key: &str, doc: &Arc<Rendered>, request: &HeaderMap) -> Response {
        let before = doc.size();
        let response = doc.response(request);
        let size = doc.size();
        // Only the response that made the gzip form sees the size change (it was absent
        // before that response began), so only it takes the lock again.
        if size != before {
            let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
            let ClosedLists { by_key, bytes, .. } = &mut *closed;
            if let Some((kept, counted)) = by_key.get_mut(key) {
                if Arc::ptr_eq(kept, doc) && size != *counted {
                    *bytes = *bytes - *counted + size;
                    *counted = size;
                    closed.shrink();
                }
            }
        }
        response
    }

    /// Forgets a channel's documents (it was deleted; a new channel of that name starts anew).
    pub fn forget(&self, channel: &str) {
        self.topics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(channel);
        let prefix = format!("{channel}\n");
        let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        let ClosedLists {
            by_key,
            order,
            bytes,
            ..
        } = &mut *closed;
        order.retain(|k| {
            let gone = k.starts_with(&prefix);
            if gone {
                if let Some((_, counted)) = by_key.remove(k) {
                    *bytes -= counted;
                }
            }
            !gone
        });
    }
}

/// A response body sent as the pieces it was put together from (a page's start, its
/// entries as the page cache holds them, its end), none of them copied into one buffer; its
/// length is known up front, so it goes out with a `Content-Length`.
pub struct Pieces(VecDeque<Bytes>);

impl Pieces {
    pub fn new(pieces: Vec<Bytes>) -> Pieces {
        Pieces(pieces.into_iter().filter(|p| !p.is_empty()).collect())
    }
}

impl http_body::Body for Pieces {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let piece = self.0.pop_front();
        std::task::Poll::Ready(piece.map(|p| Ok(http_body::Frame::data(p))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.iter().map(|p| p.len() as u64).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;
    use std::io::Read;

    fn accepting(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    #[tokio::test]
    async fn gzip_only_when_asked_and_decodes_to_the_same_bytes() {
        let body = b"<urlset>".repeat(500);
        let doc = Rendered::new(body.clone());
        let plain = doc.response(&HeaderMap::new());
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        assert_eq!(to_bytes(plain.into_body(), usize::MAX).await.unwrap(), body);
        for refused in ["identity", "gzip;q=0", "br"] {
            let r = doc.response(&accepting(refused));
            assert!(
                r.headers().get(header::CONTENT_ENCODING).is_none(),
                "{refused}"
            );
        }
        let zipped = doc.response(&accepting("br, gzip;q=0.8"));
        assert_eq!(zipped.headers()[header::CONTENT_ENCODING], "gzip");
        let bytes = to_bytes(zipped.into_body(), usize::MAX).await.unwrap();
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, body);
    }

    #[test]
    fn closed_lists_stay_within_their_bound_oldest_dropped_first() {
        let bound = 64 << 20;
        let docs = RenderedDocs::new(bound);
        let size = bound / 3;
        for k in 0..4 {
            docs.keep_closed(format!("c\n{k}"), Rendered::new(vec![b'x'; size]));
        }
        assert!(docs.closed("c\n0").is_none(), "the oldest went");
        assert!(docs.closed("c\n3").is_some());
        docs.keep_topic("c", "k1".into(), Rendered::new(vec![]));
        assert!(docs.topic("c", "k1").is_some());
        assert!(docs.topic("c", "k2").is_none(), "another key is a miss");
        docs.forget("c");
        assert!(docs.closed("c\n3").is_none() && docs.topic("c", "k1").is_none());
    }

    #[test]
    fn a_closed_lists_gzip_form_counts_toward_the_bound_from_when_it_is_made() {
        // Bytes gzip cannot shrink (xorshift), so each form is about as long as the body.
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: Vec<u8> = (0..1200)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let docs = RenderedDocs::new(3000);
        let (a, b) = (Rendered::new(noise.clone()), Rendered::new(noise));
        docs.keep_closed("c\na".into(), a.clone());
        docs.keep_closed("c\nb".into(), b.clone());
        let plain = docs.closed_response("c\nb", &b, &HeaderMap::new());
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        assert!(docs.closed("c\na").is_some(), "2,400 bytes fit in 3,000");
        let zipped = docs.closed_response("c\nb", &b, &accepting("gzip"));
        assert_eq!(zipped.headers()[header::CONTENT_ENCODING], "gzip");
        assert!(
            docs.closed("c\na").is_none() && docs.closed("c\nb").is_some(),
            "b's gzip form took the room: the oldest went"
        );
        let counted = docs.closed.lock().unwrap().bytes;
        assert_eq!(counted, b.size());
        assert!(counted > 2 * 1200, "{counted}");
        docs.forget("c");
        assert_eq!(docs.closed.lock().unwrap().bytes, 0);
    }

    /// A body of pieces gives them back in order, skips empty ones, and knows its length.
    #[tokio::test]
    async fn pieces_are_sent_in_order_with_their_length() {
        use http_body_util::BodyExt;
        let body = Pieces::new(vec![
            Bytes::from_static(b"<urlset>"),
            Bytes::new(),
            Bytes::from_static(b"<url/>"),
            Bytes::from_static(b"</urlset>"),
        ]);
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(23));
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(&collected[..], b"<urlset><url/></urlset>");
    }
}
