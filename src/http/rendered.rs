//! Rendered documents kept for the next request: a channel's topic (until its entity tag
//! changes) and recently read closed Change Lists (they never change). Each is rendered once
//! and, when a client asks for gzip, compressed once; later requests copy bytes.
//!
//! Bound: one topic per channel at most, and topics and closed lists together up to a bound
//! of bytes, gzip forms included (an eighth of `--cache-size`); the document read least
//! recently goes first. A closed list not kept makes room before it is rendered, by the size
//! of its channel's last list kept, so that it is not rendered beside a full bound.

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
    /// Keeps `body`. `Bytes` made from a `Vec` keeps the whole allocation while the bound of
    /// the closed lists counts only the length, so renderers hand over a buffer of the exact
    /// size (`catchup::joined`).
    pub fn new(body: Bytes) -> Arc<Rendered> {
        Arc::new(Rendered {
            body,
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

/// Which document a [`RenderedDocs`] entry is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Doc {
    /// A channel's topic (one per channel: a newer rendering replaces the one before).
    Topic { channel: String },
    /// A closed list of a channel; `list` names its epoch and range.
    Closed { channel: String, list: String },
}

impl Doc {
    fn channel(&self) -> &str {
        match self {
            Doc::Topic { channel } | Doc::Closed { channel, .. } => channel,
        }
    }
}

/// A document kept.
struct Entry {
    doc: Arc<Rendered>,
    /// For a topic: the key it was rendered for (its entity tag and epoch).
    tag: String,
    /// The bytes counted for it: its body, and its gzip form once made.
    counted: usize,
    /// Its latest place in [`Kept::order`].
    stamp: u64,
}

/// The documents kept, within one bound of bytes.
struct Kept {
    by_doc: HashMap<Doc, Entry>,
    /// Documents as they were kept or last read, least recently first, with the stamp each
    /// had then: an entry read, replaced or forgotten since leaves its old place here,
    /// skipped when it comes up.
    order: VecDeque<(Doc, u64)>,
    next_stamp: u64,
    bytes: usize,
    bound: usize,
    /// Per channel, the size of the closed list kept last: the guess of the next one's.
    closed_sizes: HashMap<String, usize>,
}

impl Kept {
    /// The document kept as `doc`, if `tag` is what it was kept for; it becomes the newest
    /// (the least recently read goes first).
    fn get(&mut self, doc: &Doc, tag: &str) -> Option<Arc<Rendered>> {
        let stamp = self.next_stamp;
        let entry = self.by_doc.get_mut(doc).filter(|e| e.tag == tag)?;
        entry.stamp = stamp;
        let rendered = entry.doc.clone();
        self.next_stamp += 1;
        self.order.push_back((doc.clone(), stamp));
        self.compact();
        Some(rendered)
    }

    /// Drops the places left by entries read, replaced or forgotten since, once they
    /// outnumber the entries kept.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.by_doc.len() + 16 {
            let by_doc = &self.by_doc;
            self.order
                .retain(|(doc, stamp)| by_doc.get(doc).is_some_and(|e| e.stamp == *stamp));
        }
    }

    fn remove(&mut self, doc: &Doc) {
        if let Some(old) = self.by_doc.remove(doc) {
            self.bytes -= old.counted;
        }
    }

    /// Keeps `rendered` as `doc` (in place of what `doc` held), newest of all.
    fn keep(&mut self, doc: Doc, tag: String, rendered: Arc<Rendered>) {
        self.remove(&doc);
        let counted = rendered.size();
        if counted > self.bound {
            return;
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.bytes += counted;
        self.order.push_back((doc.clone(), stamp));
        let entry = Entry {
            doc: rendered,
            tag,
            counted,
            stamp,
        };
        self.by_doc.insert(doc, entry);
        self.shrink();
        self.compact();
    }

    /// Drops the documents read least recently until the rest fit the bound.
    fn shrink(&mut self) {
        self.shrink_to(self.bound);
    }

    /// Drops the documents read least recently until the rest fit in `bytes`.
    fn shrink_to(&mut self, bytes: usize) {
        while self.bytes > bytes {
            let Some((oldest, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.by_doc.get(&oldest).is_some_and(|e| e.stamp == stamp) {
                self.remove(&oldest);
            }
        }
    }

    /// `doc` now holds `size` bytes (its gzip form was made), if `rendered` is still what
    /// is kept as `doc`.
    fn recount(&mut self, doc: &Doc, rendered: &Arc<Rendered>, size: usize) {
        let Some(entry) = self.by_doc.get_mut(doc) else {
            return;
        };
        if Arc::ptr_eq(&entry.doc, rendered) && size != entry.counted {
            self.bytes = self.bytes - entry.counted + size;
            entry.counted = size;
            self.shrink();
        }
    }
}

/// The rendered documents of every channel (see the module docs): topics and closed lists,
/// within one bound of bytes for all of them, gzip forms included.
pub struct RenderedDocs {
    kept: Mutex<Kept>,
}

impl RenderedDocs {
    /// Keeps topics and closed lists up to `bytes` in all, their gzip forms included.
    pub fn new(bytes: usize) -> RenderedDocs {
        RenderedDocs {
            kept: Mutex::new(Kept {
                by_doc: HashMap::new(),
                order: VecDeque::new(),
                next_stamp: 0,
                bytes: 0,
                bound: bytes,
                closed_sizes: HashMap::new(),
            }),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `channel`'s topic if it was rendered for `key` (its entity tag and epoch).
    pub fn topic(&self, channel: &str, key: &str) -> Option<Arc<Rendered>> {
        let doc = Doc::Topic {
            channel: channel.to_string(),
        };
        self.kept().get(&doc, key)
    }

    /// Keeps `doc` as `channel`'s topic for `key`, in place of the one before.
    pub fn keep_topic(&self, channel: &str, key: String, doc: Arc<Rendered>) {
        let slot = Doc::Topic {
            channel: channel.to_string(),
        };
        self.kept().keep(slot, key, doc);
    }

    /// The response of `channel`'s topic `doc` (see [`Rendered::response`]); when it made
    /// the topic's gzip form, the bound counts that from then on.
    pub fn topic_response(
        &self,
        channel: &str,
        doc: &Arc<Rendered>,
        request: &HeaderMap,
    ) -> Response {
        let slot = Doc::Topic {
            channel: channel.to_string(),
        };
        self.response(&slot, doc, request)
    }

    /// Closed list `list` (its epoch and range) of `channel`, if rendered before.
    pub fn closed(&self, channel: &str, list: &str) -> Option<Arc<Rendered>> {
        self.kept().get(&closed_doc(channel, list), "")
    }

    /// Makes room for a closed list of `channel` about to be rendered (it was a miss): the
    /// documents read least recently go now, as many as the last list kept for `channel`
    /// needed, so that the new list is not rendered beside a full bound and made room for
    /// only when kept. Nothing goes for a channel with no list kept yet.
    pub fn make_room_for_closed(&self, channel: &str) {
        let mut kept = self.kept();
        if let Some(&size) = kept.closed_sizes.get(channel) {
            let room = kept.bound.saturating_sub(size);
            kept.shrink_to(room);
        }
    }

    pub fn keep_closed(&self, channel: &str, list: &str, doc: Arc<Rendered>) {
        let slot = closed_doc(channel, list);
        let mut kept = self.kept();
        kept.closed_sizes.insert(channel.to_string(), doc.size());
        // A closed list never changes: a second rendering (two requests at once) is the same.
        if !kept.by_doc.contains_key(&slot) {
            kept.keep(slot, String::new(), doc);
        }
    }

    /// The response of closed list `doc` (see [`Rendered::response`]); when it made the
    /// list's gzip form, the bound counts that from then on.
    pub fn closed_response(
        &self,
        channel: &str,
        list: &str,
        doc: &Arc<Rendered>,
        request: &HeaderMap,
    ) -> Response {
        self.response(&closed_doc(channel, list), doc, request)
    }

    fn response(&self, slot: &Doc, doc: &Arc<Rendered>, request: &HeaderMap) -> Response {
        let before = doc.size();
        let response = doc.response(request);
        let size = doc.size();
        // Only the response that made the gzip form sees the size change (it was absent
        // before that response began), so only it takes the lock again.
        if size != before {
            self.kept().recount(slot, doc, size);
        }
        response
    }

    /// Forgets a channel's documents (it was deleted; a new channel of that name starts anew).
    pub fn forget(&self, channel: &str) {
        let mut kept = self.kept();
        kept.closed_sizes.remove(channel);
        let Kept { by_doc, bytes, .. } = &mut *kept;
        by_doc.retain(|doc, entry| {
            let gone = doc.channel() == channel;
            if gone {
                *bytes -= entry.counted;
            }
            !gone
        });
    }

    /// The bytes counted for the documents kept.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.kept().bytes
    }
}

fn closed_doc(channel: &str, list: &str) -> Doc {
    Doc::Closed {
        channel: channel.to_string(),
        list: list.to_string(),
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
        let doc = Rendered::new(Bytes::from(body.clone()));
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
    fn closed_lists_stay_within_their_bound_least_recently_read_dropped_first() {
        let bound = 64 << 20;
        let docs = RenderedDocs::new(bound);
        let size = bound / 3;
        for k in 0..3 {
            docs.keep_closed(
                "c",
                &k.to_string(),
                Rendered::new(Bytes::from(vec![b'x'; size])),
            );
        }
        assert!(docs.closed("c", "0").is_some(), "read: now the newest");
        docs.keep_closed("c", "3", Rendered::new(Bytes::from(vec![b'x'; size])));
        assert!(
            docs.closed("c", "1").is_none(),
            "the least recently read went"
        );
        assert!(["0", "2", "3"]
            .iter()
            .all(|k| docs.closed("c", k).is_some()));
        assert_eq!(docs.bytes(), 3 * size);
        docs.keep_topic("c", "k1".into(), Rendered::new(Bytes::from(vec![])));
        assert!(docs.topic("c", "k1").is_some());
        assert!(docs.topic("c", "k2").is_none(), "another key is a miss");
        assert!(
            docs.closed("d", "3").is_none(),
            "another channel's list is a miss"
        );
        docs.forget("c");
        assert!(docs.closed("c", "3").is_none() && docs.topic("c", "k1").is_none());
        assert_eq!(docs.bytes(), 0);
    }

    /// A topic counts toward the same bound as the closed lists, replaces the channel's topic
    /// before it (whose bytes no longer count), and its gzip form counts once made.
    #[test]
    fn topics_count_toward_the_bound_one_per_channel() {
        let docs = RenderedDocs::new(3000);
        docs.keep_closed("c", "a", Rendered::new(Bytes::from(vec![b'x'; 1000])));
        docs.keep_closed("c", "b", Rendered::new(Bytes::from(vec![b'x'; 1000])));
        docs.keep_topic(
            "c",
            "t1".into(),
            Rendered::new(Bytes::from(vec![b'x'; 900])),
        );
        assert_eq!(docs.bytes(), 2900);
        docs.keep_topic(
            "c",
            "t2".into(),
            Rendered::new(Bytes::from(vec![b'x'; 950])),
        );
        assert_eq!(docs.bytes(), 2950, "the topic before no longer counts");
        assert!(docs.topic("c", "t1").is_none() && docs.topic("c", "t2").is_some());
        assert!(docs.closed("c", "a").is_some(), "all still fit");
        docs.keep_topic("d", "t".into(), Rendered::new(Bytes::from(vec![b'x'; 900])));
        assert!(
            docs.closed("c", "b").is_none(),
            "another channel's topic took the room of the list read least recently"
        );
        assert_eq!(docs.bytes(), 2850);
        // A topic's gzip form counts too (noise that gzip cannot shrink).
        let topic = Rendered::new(Bytes::from(noise(1200)));
        docs.keep_topic("c", "t3".into(), topic.clone());
        assert!(
            docs.closed("c", "a").is_none(),
            "the larger topic took a's room"
        );
        assert_eq!(docs.bytes(), 900 + 1200);
        let zipped = docs.topic_response("c", &topic, &accepting("gzip"));
        assert_eq!(zipped.headers()[header::CONTENT_ENCODING], "gzip");
        assert!(docs.topic("c", "t3").is_some());
        assert!(
            docs.topic("d", "t").is_none(),
            "the gzip form took d's topic's room"
        );
        assert_eq!(docs.bytes(), topic.size());
        assert!(topic.size() > 2 * 1200 && topic.size() <= 3000);
        // A document larger than the bound is not kept, and leaves nothing counted.
        docs.keep_topic(
            "c",
            "big".into(),
            Rendered::new(Bytes::from(vec![b'x'; 4000])),
        );
        assert!(docs.topic("c", "big").is_none() && docs.topic("c", "t3").is_none());
        assert_eq!(docs.bytes(), 0);
    }

    /// Reads and replacements leave places in the order behind; they are dropped, so the
    /// order stays within a few times the entries kept.
    #[test]
    fn the_order_stays_near_the_entries_kept() {
        let docs = RenderedDocs::new(1 << 20);
        for k in 0..10_000 {
            docs.keep_topic(
                "c",
                k.to_string(),
                Rendered::new(Bytes::from(vec![b'x'; 10])),
            );
            assert!(docs.topic("c", &k.to_string()).is_some());
        }
        let kept = docs.kept();
        assert_eq!(kept.by_doc.len(), 1);
        assert!(
            kept.order.len() <= 2 * kept.by_doc.len() + 17,
            "{}",
            kept.order.len()
        );
        assert_eq!(kept.bytes, 10);
    }

    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn a_closed_lists_gzip_form_counts_toward_the_bound_from_when_it_is_made() {
        // Bytes gzip cannot shrink, so each form is about as long as the body.
        let noise = noise(1200);
        let docs = RenderedDocs::new(3000);
        let (a, b) = (
            Rendered::new(Bytes::from(noise.clone())),
            Rendered::new(Bytes::from(noise)),
        );
        docs.keep_closed("c", "a", a.clone());
        docs.keep_closed("c", "b", b.clone());
        let plain = docs.closed_response("c", "b", &b, &HeaderMap::new());
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        assert_eq!(docs.bytes(), 2400, "2,400 bytes fit in 3,000");
        let zipped = docs.closed_response("c", "b", &b, &accepting("gzip"));
        assert_eq!(zipped.headers()[header::CONTENT_ENCODING], "gzip");
        assert!(
            docs.closed("c", "a").is_none() && docs.closed("c", "b").is_some(),
            "b's gzip form took the room: the oldest went"
        );
        let counted = docs.bytes();
        assert_eq!(counted, b.size());
        assert!(counted > 2 * 1200, "{counted}");
        docs.forget("c");
        assert_eq!(docs.bytes(), 0);
    }

    /// A miss makes room before the list is rendered, by the size of the channel's last
    /// list kept; a channel with none kept yet makes none.
    #[test]
    fn a_miss_makes_room_for_a_list_as_large_as_the_last() {
        let docs = RenderedDocs::new(3000);
        docs.make_room_for_closed("c");
        docs.keep_closed("c", "a", Rendered::new(Bytes::from(vec![b'x'; 1000])));
        docs.keep_closed("c", "b", Rendered::new(Bytes::from(vec![b'x'; 1000])));
        docs.keep_closed("d", "a", Rendered::new(Bytes::from(vec![b'x'; 500])));
        docs.make_room_for_closed("e");
        assert_eq!(
            docs.bytes(),
            2500,
            "no list of e kept: no guess, nothing goes"
        );
        docs.make_room_for_closed("d");
        assert_eq!(docs.bytes(), 2500, "500 more fit");
        docs.make_room_for_closed("c");
        assert!(
            docs.closed("c", "a").is_none(),
            "the least recently read went"
        );
        assert_eq!(docs.bytes(), 1500, "room for 1,000 more");
        docs.keep_closed("c", "c", Rendered::new(Bytes::from(vec![b'x'; 1000])));
        assert_eq!(docs.bytes(), 2500, "it fit without anything else going");
        docs.forget("c");
        docs.make_room_for_closed("c");
        assert_eq!(docs.bytes(), 500, "forgotten: no guess for c any more");
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
