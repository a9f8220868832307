//! One HTTP/1.1 exchange on a connection the caller owns: a request written from its parts,
//! the answer's head parsed (with `httparse`, the parser hyper uses) and its body read and
//! dropped. This is all a delivery needs: one request at a time, no pipelining, no upgrade,
//! an answer whose body nobody looks at.
//!
//! Why not hyper's client: with it, each connection is driven by a task of its own, and
//! every request crosses from the worker to that task and its answer back. Measured with the
//! fan-out floor of `benches/suite.rs` (figure 1b: one thread, keep-alive connections to
//! nginx POSTing the same 2.4 KB body with a delivery's headers), a task that writes and reads
//! its own connection took 10–14 µs of CPU per request against 14–25 µs through hyper, the
//! gap widening with the number of connections (docs/performance.md, seventh pass).
//!
//! What it speaks: `Content-Length`, chunked and close-delimited answer bodies; interim
//! (1xx) answers skipped; `Connection: close` and HTTP/1.0 answers honoured. Whether the
//! connection can carry the next request is part of the outcome.

use std::io::Write;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Most bytes of an answer's head (status line and headers).
const HEAD_LIMIT: usize = 64 << 10;
/// Most headers an answer may have.
const MAX_HEADERS: usize = 64;
/// The read buffer grows by [`READ_ROOM`] whenever it has less than this spare.
const READ_MIN: usize = 512;
/// See [`READ_MIN`].
const READ_ROOM: usize = 2048;
/// A connection's buffers are given back down to this once an exchange made them larger (a
/// long answer, a big request head): thousands of subscribers each keep a pair.
const KEPT_CAPACITY: usize = 16 << 10;

/// An answer as a delivery sees it.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub retry_after: Option<HeaderValue>,
    /// Whether the connection may carry another request.
    pub keep_alive: bool,
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The connection ended (or failed) before any byte of an answer came: on a connection
    /// that carried earlier requests, usually one the server had closed while it was idle.
    #[error("the connection closed before an answer: {0}")]
    NoAnswer(std::io::Error),
    #[error("connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad answer: {0}")]
    Malformed(String),
}

/// Reusable buffers of one connection: the request's head, and what was read of the answer.
#[derive(Default)]
pub struct Buffers {
    head: Vec<u8>,
    read: Vec<u8>,
}

/// A request's header lines (`name: value` and CR LF each), written straight into bytes: a
/// delivery's head is made of a part prebuilt for its subscription and a few lines of its
/// own, with no header map built and dropped per request.
///
/// A value is checked as `HeaderValue` checks one (no control bytes but tab): nothing a
/// subscriber or a publisher chose can add a header or end the head early. A value that
/// fails the check (never expected: the hub makes or checks every value) is sent empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderLines(Vec<u8>);

impl HeaderLines {
    pub fn with_capacity(bytes: usize) -> HeaderLines {
        HeaderLines(Vec::with_capacity(bytes))
    }

    /// Adds `name: value`. `name` is the hub's own, lowercase.
    pub fn push(&mut self, name: &str, value: impl AsRef<[u8]>) {
        self.push_with(name, |out| out.extend_from_slice(value.as_ref()));
    }

    /// Adds `name: n`, the number in decimal.
    pub fn push_u64(&mut self, name: &str, n: u64) {
        self.push(name, itoa::Buffer::new().format(n));
    }

    /// Adds `first: value` and `second: value`, the value written once by `write` (as
    /// [`push_with`](Self::push_with) does) and copied.
    pub fn push_twice(&mut self, first: &str, second: &str, write: impl FnOnce(&mut Vec<u8>)) {
        let start = self.0.len() + first.len() + 2;
        self.push_with(first, write);
        let end = self.0.len() - 2;
        let out = &mut self.0;
        out.extend_from_slice(second.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_within(start..end);
        out.extend_from_slice(b"\r\n");
    }

    /// Adds `name:` and a value `write` appends to the buffer.
    pub fn push_with(&mut self, name: &str, write: impl FnOnce(&mut Vec<u8>)) {
        let out = &mut self.0;
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        let start = out.len();
        write(out);
        if !out[start..]
            .iter()
            .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
        {
            out.truncate(start);
        }
        out.extend_from_slice(b"\r\n");
    }

    /// Adds every line of `other`.
    pub fn extend(&mut self, other: &HeaderLines) {
        self.0.extend_from_slice(&other.0);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Writes `POST target` with the header lines of `headers` in order (then `Content-Length`)
/// and `body`, and reads the answer, dropping at most `drain_limit` bytes of its body: a
/// longer body leaves the connection unfit for another request (`keep_alive` false) rather
/// than being read.
pub async fn post<S>(
    stream: &mut S,
    buffers: &mut Buffers,
    target: &str,
    headers: &[&HeaderLines],
    body: &Bytes,
    drain_limit: usize,
) -> Result<Response, ExchangeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    write_head(&mut buffers.head, target, headers, body.len());
    let mut out = bytes::Buf::chain(&buffers.head[..], &body[..]);
    // A write that fails got no answer either (a server that closed an idle connection
    // makes the write fail or the read end).
    stream
        .write_all_buf(&mut out)
        .await
        .map_err(ExchangeError::NoAnswer)?;
    stream.flush().await.map_err(ExchangeError::NoAnswer)?;
    let answer = read_answer(stream, &mut buffers.read, drain_limit).await;
    for buf in [&mut buffers.head, &mut buffers.read] {
        if buf.capacity() > KEPT_CAPACITY {
            buf.clear();
            buf.shrink_to(KEPT_CAPACITY);
        }
    }
    answer
}

/// The request line and headers ([`HeaderLines`] holds only checked values).
fn write_head(out: &mut Vec<u8>, target: &str, headers: &[&HeaderLines], length: usize) {
    out.clear();
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for lines in headers {
        out.extend_from_slice(lines.as_bytes());
    }
    // Writing to a Vec cannot fail.
    let _ = write!(out, "content-length: {length}\r\n\r\n");
}

/// What the head of an answer says about its body.
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// Reads one final answer (skipping interim ones) and its body.
async fn read_answer<S>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    drain_limit: usize,
) -> Result<Response, ExchangeError>
where
    S: AsyncRead + Unpin,
{
    buf.clear();
    let mut got_any = false;
    loop {
        // The head: read until it parses.
        let Head {
            used,
            status,
            retry_after,
            framing,
            mut keep_alive,
        } = loop {
            if !buf.is_empty() {
                if let Some(head) = parse_head(buf)? {
                    break head;
                }
            }
            if buf.len() >= HEAD_LIMIT {
                return Err(ExchangeError::Malformed(format!(
                    "a head longer than {HEAD_LIMIT} bytes"
                )));
            }
            match read_more(stream, buf).await {
                Ok(0) if !got_any => {
                    return Err(ExchangeError::NoAnswer(
                        std::io::ErrorKind::UnexpectedEof.into(),
                    ))
                }
                Ok(0) => {
                    return Err(ExchangeError::Malformed(
                        "the answer's head was cut short".into(),
                    ))
                }
                Ok(_) => got_any = true,
                Err(e) if !got_any => return Err(ExchangeError::NoAnswer(e)),
                Err(e) => return Err(e.into()),
            }
        };
        buf.drain(..used);
        if status.is_informational() {
            if status == StatusCode::SWITCHING_PROTOCOLS {
                return Err(ExchangeError::Malformed("101 Switching Protocols".into()));
            }
            continue;
        }
        let complete = match framing {
            Framing::None => true,
            Framing::Length(n) => drain_length(stream, buf, n, drain_limit).await?,
            Framing::Chunked => drain_chunked(stream, buf, drain_limit).await?,
            Framing::UntilClose => {
                drain_until_close(stream, buf, drain_limit).await?;
                keep_alive = false;
                true
            }
        };
        // Anything after the answer was never asked for: the connection is not trusted with
        // another request.
        keep_alive = keep_alive && complete && buf.is_empty();
        return Ok(Response {
            status,
            retry_after,
            keep_alive,
        });
    }
}

/// An answer's head as parsed: how many bytes of the buffer it took, and what it says.
struct Head {
    used: usize,
    status: StatusCode,
    retry_after: Option<HeaderValue>,
    framing: Framing,
    keep_alive: bool,
}

/// The answer's head at the start of `buf`, when all of it is there.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, ExchangeError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut answer = httparse::Response::new(&mut headers);
    let used = match answer.parse(buf) {
        Ok(httparse::Status::Complete(used)) => used,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(ExchangeError::Malformed(e.to_string())),
    };
    let code = answer.code.unwrap_or(0);
    let status = StatusCode::from_u16(code)
        .map_err(|_| ExchangeError::Malformed(format!("status {code}")))?;
    let http10 = answer.version == Some(0);
    let mut keep_alive = !http10;
    let mut retry_after = None;
    let mut length = None;
    let mut chunked = false;
    for h in answer.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| ExchangeError::Malformed("a bad Content-Length".into()))?;
            if length.is_some_and(|m| m != n) {
                return Err(ExchangeError::Malformed("two Content-Lengths".into()));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked must be the last coding; any other framing is read until close.
            let last = h.value.rsplit(|&b| b == b',').next().unwrap_or_default();
            chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
            if !chunked {
                keep_alive = false;
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && http10 {
                    keep_alive = true;
                }
            }
        } else if h.name.eq_ignore_ascii_case("retry-after") {
            retry_after = HeaderValue::from_bytes(h.value).ok();
        }
    }
    let framing = if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        if n == 0 {
            Framing::None
        } else {
            Framing::Length(n)
        }
    } else {
        Framing::UntilClose
    };
    Ok(Some(Head {
        used,
        status,
        retry_after,
        framing,
        keep_alive,
    }))
}

/// Reads what the stream has into the spare room of `buf` (making room for an answer's head,
/// which is short from most callbacks); 0 at its end.
async fn read_more<S>(stream: &mut S, buf: &mut Vec<u8>) -> std::io::Result<usize>
where
    S: AsyncRead + Unpin,
{
    if buf.capacity() - buf.len() < READ_MIN {
        buf.reserve(READ_ROOM);
    }
    stream.read_buf(buf).await
}

/// Drops a body of `n` bytes as it comes; `false` (nothing read) when it is over the limit.
async fn drain_length<S>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    n: u64,
    limit: usize,
) -> Result<bool, ExchangeError>
where
    S: AsyncRead + Unpin,
{
    if n > limit as u64 {
        return Ok(false);
    }
    let mut left = n as usize;
    loop {
        let take = left.min(buf.len());
        buf.drain(..take);
        left -= take;
        if left == 0 {
            return Ok(true);
        }
        fill(stream, buf, "the answer's body").await?;
    }
}

/// Reads more of `what` into `buf`; the connection ending first is a malformed answer.
async fn fill<S>(stream: &mut S, buf: &mut Vec<u8>, what: &str) -> Result<(), ExchangeError>
where
    S: AsyncRead + Unpin,
{
    match read_more(stream, buf).await? {
        0 => Err(ExchangeError::Malformed(format!("{what} was cut short"))),
        _ => Ok(()),
    }
}

/// Drops a chunked body (and its trailers), its framing parsed by `httparse`; `false` once it
/// would take more than `limit` bytes, leaving the rest unread.
async fn drain_chunked<S>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    limit: usize,
) -> Result<bool, ExchangeError>
where
    S: AsyncRead + Unpin,
{
    let mut read = 0usize;
    loop {
        // The chunk's size line.
        let (used, size) = loop {
            match httparse::parse_chunk_size(buf) {
                Ok(httparse::Status::Complete(sized)) => break sized,
                Ok(httparse::Status::Partial) => {}
                Err(_) => return Err(ExchangeError::Malformed("a bad chunk size".into())),
            }
            if read + buf.len() > limit {
                return Ok(false);
            }
            fill(stream, buf, "a chunked body").await?;
        };
        buf.drain(..used);
        read += used;
        if size == 0 {
            return drain_trailers(stream, buf, read, limit).await;
        }
        // The chunk and its CRLF.
        let size = match usize::try_from(size) {
            Ok(size) if read.saturating_add(size) <= limit => size,
            _ => return Ok(false),
        };
        while buf.len() < size + 2 {
            fill(stream, buf, "a chunk").await?;
        }
        if &buf[size..size + 2] != b"\r\n" {
            return Err(ExchangeError::Malformed("a chunk without its CRLF".into()));
        }
        buf.drain(..size + 2);
        read += size + 2;
    }
}

/// Drops the trailer fields after a chunked body's last chunk, up to the empty line that
/// ends them; `false` when they would take `limit` bytes in all (`read` so far).
async fn drain_trailers<S>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    read: usize,
    limit: usize,
) -> Result<bool, ExchangeError>
where
    S: AsyncRead + Unpin,
{
    loop {
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        match httparse::parse_headers(buf, &mut fields) {
            Ok(httparse::Status::Complete((used, _))) => {
                buf.drain(..used);
                return Ok(true);
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(ExchangeError::Malformed(format!("bad trailers: {e}"))),
        }
        if read + buf.len() > limit {
            return Ok(false);
        }
        fill(stream, buf, "a chunked body's trailers").await?;
    }
}

/// Drops a body that ends when the connection does, up to `limit` bytes.
async fn drain_until_close<S>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    limit: usize,
) -> Result<(), ExchangeError>
where
    S: AsyncRead + Unpin,
{
    let mut read = 0;
    loop {
        read += buf.len();
        buf.clear();
        if read > limit || read_more(stream, buf).await? == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One POST to a server that answers it with the bytes `answer`, then closes: what `post`
    /// made of the answer, and the request as the server read it.
    async fn exchange(answer: &'static [u8]) -> (Result<Response, ExchangeError>, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        let mut host = HeaderLines::default();
        host.push("host", "example.com");
        let mut headers = HeaderLines::default();
        headers.push("x-hub-signature", "sha256=00");
        let body = Bytes::from_static(b"<urlset/>");
        let mut buffers = Buffers::default();
        let server = tokio::spawn(async move {
            let mut got = vec![0u8; 4096];
            let mut n = 0;
            while !got[..n].ends_with(b"<urlset/>") {
                n += server.read(&mut got[n..]).await.unwrap();
            }
            server.write_all(answer).await.unwrap();
            drop(server);
            got.truncate(n);
            got
        });
        let result = post(
            &mut client,
            &mut buffers,
            "/cb?x=1",
            &[&host, &headers],
            &body,
            1024,
        )
        .await;
        (result, server.await.unwrap())
    }

    #[tokio::test]
    async fn the_request_is_written_with_its_headers_and_length() {
        let (answer, request) =
            exchange(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n").await;
        let answer = answer.unwrap();
        assert_eq!(answer.status, 202);
        assert!(answer.keep_alive);
        assert_eq!(
            String::from_utf8(request).unwrap(),
            "POST /cb?x=1 HTTP/1.1\r\nhost: example.com\r\nx-hub-signature: sha256=00\r\n\
             content-length: 9\r\n\r\n<urlset/>"
        );
    }

    #[test]
    fn a_value_with_a_control_byte_is_sent_empty_and_adds_no_line() {
        let mut lines = HeaderLines::default();
        lines.push("link", "<x>\r\nevil: 1");
        lines.push_u64("x-changehub-first", 7);
        lines.push_with("x-hub-signature", |out| out.extend_from_slice(b"a\nb"));
        lines.push("x-tab", "a\tb");
        assert_eq!(
            std::str::from_utf8(lines.as_bytes()).unwrap(),
            "link: \r\nx-changehub-first: 7\r\nx-hub-signature: \r\nx-tab: a\tb\r\n"
        );
    }

    #[test]
    fn numbers_and_a_value_sent_twice_are_written_as_formatted() {
        let mut lines = HeaderLines::default();
        lines.push_u64("x-changehub-first", 0);
        lines.push_u64("x-changehub-last", u64::MAX);
        lines.push_twice("x-changehub-delivery", "webhook-id", |out| {
            out.extend_from_slice(b"s1-e-1-10")
        });
        // A value refused by the check is refused for both names.
        lines.push_twice("a", "b", |out| out.extend_from_slice(b"x\ry"));
        assert_eq!(
            std::str::from_utf8(lines.as_bytes()).unwrap(),
            format!(
                "x-changehub-first: 0\r\nx-changehub-last: {}\r\n\
                 x-changehub-delivery: s1-e-1-10\r\nwebhook-id: s1-e-1-10\r\na: \r\nb: \r\n",
                u64::MAX
            )
        );
    }

    #[tokio::test]
    async fn a_chunked_body_is_read_to_its_end_and_the_connection_kept() {
        let (answer, _) = exchange(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
              5;ext=1\r\nhello\r\n3\r\nabc\r\n0\r\ntrailer: x\r\n\r\n",
        )
        .await;
        let answer = answer.unwrap();
        assert_eq!(answer.status, 200);
        assert!(answer.keep_alive);
    }

    #[tokio::test]
    async fn interim_answers_are_skipped() {
        let (answer, _) = exchange(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nretry-after: 3\r\n\r\n",
        )
        .await;
        let answer = answer.unwrap();
        assert_eq!(answer.status, 204);
        assert_eq!(answer.retry_after.unwrap(), "3");
        assert!(answer.keep_alive);
    }

    #[tokio::test]
    async fn http_1_0_and_connection_close_end_the_connection() {
        let (answer, _) = exchange(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        assert!(!answer.unwrap().keep_alive);
        let (answer, _) =
            exchange(b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok")
                .await;
        assert!(answer.unwrap().keep_alive);
        let (answer, _) =
            exchange(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok").await;
        assert!(!answer.unwrap().keep_alive);
    }

    #[tokio::test]
    async fn a_body_without_length_is_read_until_the_connection_closes() {
        let (answer, _) = exchange(b"HTTP/1.1 500 Oops\r\n\r\nsomething broke").await;
        let answer = answer.unwrap();
        assert_eq!(answer.status, 500);
        assert!(!answer.keep_alive);
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_read_and_the_connection_kept() {
        let answer = format!(
            "HTTP/1.1 503 Busy\r\nretry-after: 9\r\ncontent-length: 1000\r\n\r\n{}",
            "x".repeat(1000)
        );
        let (answer, _) = exchange(Box::leak(answer.into_bytes().into_boxed_slice())).await;
        let answer = answer.unwrap();
        assert_eq!(answer.status, 503);
        assert_eq!(answer.retry_after.unwrap(), "9");
        assert!(answer.keep_alive);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_left_unread_and_the_connection_not_kept() {
        let (answer, _) = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 5000\r\n\r\n").await;
        assert!(!answer.unwrap().keep_alive);
        let (answer, _) =
            exchange(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1000\r\n").await;
        assert!(!answer.unwrap().keep_alive);
    }

    #[tokio::test]
    async fn a_connection_closed_before_any_answer_says_so() {
        let (answer, _) = exchange(b"").await;
        assert!(
            matches!(answer, Err(ExchangeError::NoAnswer(_))),
            "{answer:?}"
        );
        let (answer, _) = exchange(b"HTTP/1.1 200").await;
        assert!(
            matches!(answer, Err(ExchangeError::Malformed(_))),
            "{answer:?}"
        );
        let (answer, _) = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc").await;
        assert!(
            matches!(answer, Err(ExchangeError::Malformed(_))),
            "{answer:?}"
        );
        let (answer, _) = exchange(b"garbage\r\n\r\n").await;
        assert!(
            matches!(answer, Err(ExchangeError::Malformed(_))),
            "{answer:?}"
        );
    }
}
