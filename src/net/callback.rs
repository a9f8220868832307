//! A connection of its own to one callback: a delivery worker sends one request at a time,
//! so it keeps one HTTP/1.1 connection to its callback's origin and sends every delivery on
//! it — no pool to check a connection out of, no lock shared with other workers, a request
//! built from parts made once, written and answered on the worker's own task
//! ([`super::http1`]).
//!
//! The same rules as the shared client ([`super::client`]): no redirects (a 3xx is an answer
//! like any other), no private addresses unless allowed (checked on the very addresses the
//! connection uses), one deadline for the whole request (connecting, sending, the answer and
//! its body), TLS with the platform's certificate verifier for `https`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{StatusCode, Uri};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::client::is_private;
use super::http1::{self, Buffers, ExchangeError, HeaderLines};

/// Most bytes of an answer's body read (and dropped) to keep the connection; a longer body
/// closes it instead.
const DRAIN_LIMIT: usize = 64 << 10;

/// What every callback connection shares: the rules, and the TLS set-up (made on first use).
pub struct Settings {
    allow_private: bool,
    timeout: Duration,
    tls: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
}

impl Settings {
    pub fn new(allow_private: bool, timeout: Duration) -> Arc<Settings> {
        Arc::new(Settings {
            allow_private,
            timeout,
            tls: OnceLock::new(),
        })
    }

    fn tls(&self) -> Result<Arc<rustls::ClientConfig>, CallbackError> {
        self.tls
            .get_or_init(|| {
                use rustls_platform_verifier::ConfigVerifierExt;
                let mut config = rustls::ClientConfig::with_platform_verifier()
                    .map_err(|e| format!("cannot set up TLS: {e}"))?;
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                Ok(Arc::new(config))
            })
            .clone()
            .map_err(CallbackError::Tls)
    }
}

/// Where requests go, parsed once: the origin to connect to and the request's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callback {
    https: bool,
    host: String,
    port: u16,
    /// `Host` (the URL's authority) and `User-Agent`, the lines every request to it starts with.
    lines: HeaderLines,
    /// The path and query, as sent on the request line (checked to be one).
    target: String,
}

impl Callback {
    /// An `http` or `https` URL with a host; `None` for anything else.
    pub fn of(url: &url::Url) -> Option<Callback> {
        let https = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return None,
        };
        let host = match url.host()? {
            url::Host::Domain(d) => d.to_string(),
            url::Host::Ipv4(ip) => ip.to_string(),
            url::Host::Ipv6(ip) => ip.to_string(),
        };
        let port = url.port_or_known_default()?;
        let authority = match url.port() {
            Some(p) => format!("{}:{p}", url.host_str()?),
            None => url.host_str()?.to_string(),
        };
        let target = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        HeaderValue::try_from(authority.as_str()).ok()?;
        let mut lines = HeaderLines::default();
        lines.push("host", authority);
        lines.push(
            "user-agent",
            concat!("changehub/", env!("CARGO_PKG_VERSION")),
        );
        Some(Callback {
            https,
            host,
            port,
            lines,
            target: Uri::try_from(target.as_str()).ok().map(|_| target)?,
        })
    }
}

/// The answer to a POST: its status and `Retry-After`.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub retry_after: Option<HeaderValue>,
}

#[derive(Debug, thiserror::Error)]
pub enum CallbackError {
    #[error("{0} resolves to no public address")]
    NoPublicAddress(String),
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("{0}")]
    Tls(String),
    #[error("TLS handshake with {0} failed: {1}")]
    Handshake(String, std::io::Error),
    #[error(transparent)]
    Http(#[from] ExchangeError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// `wait` from now, or far ahead when that cannot be told (a wait of centuries).
pub fn deadline_after(wait: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 24 * 3600))
}

/// An open connection to a callback.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// One worker's connection (see the module docs). Opened on first use, opened again when the
/// callback closed it or a request failed.
pub struct CallbackConn {
    settings: Arc<Settings>,
    stream: Option<Stream>,
    buffers: Buffers,
    /// The deadline of the request in flight, one timer for every request: a timer made for
    /// a request and dropped after it takes the runtime's timer lock twice (registered when
    /// the answer is awaited, removed when dropped), where moving a registered timer to a
    /// later deadline is one atomic operation.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl CallbackConn {
    pub fn new(settings: Arc<Settings>) -> CallbackConn {
        CallbackConn {
            settings,
            stream: None,
            buffers: Buffers::default(),
            deadline: None,
        }
    }

    /// POSTs `body` with `headers` (after `Host` and `User-Agent`, then `Content-Length`) to
    /// `to`, within the deadline.
    pub async fn post(
        &mut self,
        to: &Callback,
        headers: &HeaderLines,
        body: Bytes,
    ) -> Result<Answer, CallbackError> {
        // `exchange` holds the connection while it works and keeps it only after a good
        // answer, so one that failed or ran out of time leaves no connection behind.
        let timeout = self.settings.timeout;
        let at = deadline_after(timeout);
        let mut deadline = match self.deadline.take() {
            Some(mut deadline) => {
                deadline.as_mut().reset(at);
                deadline
            }
            None => Box::pin(tokio::time::sleep_until(at)),
        };
        let answer = tokio::select! {
            biased;
            answer = self.exchange(to, headers, &body) => answer,
            () = deadline.as_mut() => Err(CallbackError::Timeout(timeout)),
        };
        self.deadline = Some(deadline);
        answer
    }

    /// One request on the kept connection, or on a new one. A kept connection the callback
    /// closed meanwhile (it ends, or fails, before any byte of an answer) gets the request
    /// again, once, on a new connection: deliveries are at least once, and a receiver tells
    /// a repeat by its `X-Changehub-Delivery`. The connection is kept for the next request
    /// only when the answer allows it.
    async fn exchange(
        &mut self,
        to: &Callback,
        headers: &HeaderLines,
        body: &Bytes,
    ) -> Result<Answer, CallbackError> {
        let kept = self.stream.take();
        let reused = kept.is_some();
        let mut stream = match kept {
            Some(stream) => stream,
            None => self.open(to).await?,
        };
        let mut response = self.send(&mut stream, to, headers, body).await;
        if reused && matches!(response, Err(ExchangeError::NoAnswer(_))) {
            stream = self.open(to).await?;
            response = self.send(&mut stream, to, headers, body).await;
        }
        let response = response?;
        if response.keep_alive {
            self.stream = Some(stream);
        }
        Ok(Answer {
            status: response.status,
            retry_after: response.retry_after,
        })
    }

    async fn send(
        &mut self,
        stream: &mut Stream,
        to: &Callback,
        headers: &HeaderLines,
        body: &Bytes,
    ) -> Result<http1::Response, ExchangeError> {
        let (target, buffers) = (to.target.as_str(), &mut self.buffers);
        let lines = [&to.lines, headers];
        match stream {
            Stream::Plain(s) => http1::post(s, buffers, target, &lines, body, DRAIN_LIMIT).await,
            Stream::Tls(s) => {
                http1::post(s.as_mut(), buffers, target, &lines, body, DRAIN_LIMIT).await
            }
        }
    }

    /// Opens a new connection to `to`.
    async fn open(&self, to: &Callback) -> Result<Stream, CallbackError> {
        let stream = connect(to, self.settings.allow_private).await?;
        if !to.https {
            return Ok(Stream::Plain(stream));
        }
        let config = self.settings.tls()?;
        let name = rustls::pki_types::ServerName::try_from(to.host.clone())
            .map_err(|e| CallbackError::Tls(format!("{}: {e}", to.host)))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, stream)
            .await
            .map_err(|e| CallbackError::Handshake(to.host.clone(), e))?;
        Ok(Stream::Tls(Box::new(tls)))
    }
}

/// Resolves `to` (refusing private addresses unless allowed) and connects to the first
/// address that answers.
async fn connect(to: &Callback, allow_private: bool) -> Result<TcpStream, CallbackError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((to.host.as_str(), to.port))
        .await
        .map_err(|e| CallbackError::Resolve(to.host.clone(), e))?
        .filter(|a| allow_private || !is_private(a.ip()))
        .collect();
    let mut last = None;
    for addr in &addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => CallbackError::Connect(to.host.clone(), e),
        None => CallbackError::NoPublicAddress(to.host.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// How the test receiver answers each request.
    #[derive(Clone, Copy)]
    enum Answering {
        /// 200, connection kept.
        KeepAlive,
        /// 200 with `Connection: close`, then closes.
        Close,
        /// 200 as if the connection stayed open, but closes it right after (as a server
        /// closing an idle connection would, just when the next request comes).
        SilentClose,
        /// 503 with `Retry-After: 7` and a body larger than the drain limit.
        BigBody,
        /// Never answers.
        Silent,
        /// 200, connection kept, each answer 150 ms after its request.
        Slow,
    }

    /// A receiver on 127.0.0.1 that counts connections and requests.
    async fn receiver(answering: Answering) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (conns, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (c, r) = (conns.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let r = r.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        // One request: the head, then Content-Length bytes.
                        let head_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            let mut chunk = [0u8; 4096];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        while buf.len() < head_end + length {
                            let mut chunk = [0u8; 4096];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.drain(..head_end + length);
                        r.fetch_add(1, Ordering::SeqCst);
                        let answer = match answering {
                            Answering::KeepAlive => {
                                "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_string()
                            }
                            Answering::Close => {
                                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
                                    .to_string()
                            }
                            Answering::SilentClose => {
                                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_string()
                            }
                            Answering::BigBody => format!(
                                "HTTP/1.1 503 Service Unavailable\r\nretry-after: 7\r\n\
                                 content-length: {}\r\n\r\n{}",
                                DRAIN_LIMIT * 2,
                                "x".repeat(DRAIN_LIMIT * 2)
                            ),
                            Answering::Silent => {
                                tokio::time::sleep(Duration::from_secs(30)).await;
                                return;
                            }
                            Answering::Slow => {
                                tokio::time::sleep(Duration::from_millis(150)).await;
                                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_string()
                            }
                        };
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        if matches!(answering, Answering::Close | Answering::SilentClose) {
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://127.0.0.1:{port}/cb?x=1"), conns, requests)
    }

    fn callback(url: &str) -> Callback {
        Callback::of(&url::Url::parse(url).unwrap()).unwrap()
    }

    async fn post(conn: &mut CallbackConn, to: &Callback) -> Result<Answer, CallbackError> {
        conn.post(
            to,
            &HeaderLines::default(),
            Bytes::from_static(b"<urlset/>"),
        )
        .await
    }

    #[tokio::test]
    async fn one_connection_carries_every_request_while_the_callback_keeps_it() {
        let (url, conns, requests) = receiver(Answering::KeepAlive).await;
        let to = callback(&url);
        let mut conn = CallbackConn::new(Settings::new(true, Duration::from_secs(5)));
        for _ in 0..20 {
            assert_eq!(post(&mut conn, &to).await.unwrap().status, 200);
        }
        assert_eq!(requests.load(Ordering::SeqCst), 20);
        assert_eq!(conns.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_callback_that_closes_gets_every_request_on_new_connections() {
        let (url, conns, requests) = receiver(Answering::Close).await;
        let to = callback(&url);
        let mut conn = CallbackConn::new(Settings::new(true, Duration::from_secs(5)));
        for _ in 0..10 {
            assert_eq!(post(&mut conn, &to).await.unwrap().status, 200);
        }
        assert_eq!(requests.load(Ordering::SeqCst), 10);
        assert_eq!(conns.load(Ordering::SeqCst), 10);
    }

    /// A kept connection the callback closed meanwhile: the request goes on a new one, and
    /// is not lost or failed.
    #[tokio::test]
    async fn a_kept_connection_closed_by_the_callback_is_replaced() {
        let (url, conns, requests) = receiver(Answering::SilentClose).await;
        let to = callback(&url);
        let mut conn = CallbackConn::new(Settings::new(true, Duration::from_secs(5)));
        for _ in 0..20 {
            assert_eq!(post(&mut conn, &to).await.unwrap().status, 200);
        }
        assert_eq!(requests.load(Ordering::SeqCst), 20);
        assert_eq!(conns.load(Ordering::SeqCst), 20);
    }

    #[tokio::test]
    async fn a_long_answer_is_read_in_part_and_its_connection_dropped() {
        let (url, conns, _) = receiver(Answering::BigBody).await;
        let to = callback(&url);
        let mut conn = CallbackConn::new(Settings::new(true, Duration::from_secs(5)));
        for round in 1..=2 {
            let answer = post(&mut conn, &to).await.unwrap();
            assert_eq!(answer.status, 503);
            assert_eq!(answer.retry_after.unwrap(), "7");
            assert_eq!(conns.load(Ordering::SeqCst), round);
        }
    }

    #[tokio::test]
    async fn a_silent_callback_times_out_and_the_next_request_connects_again() {
        let (url, conns, _) = receiver(Answering::Silent).await;
        let to = callback(&url);
        let mut conn = CallbackConn::new(Settings::new(true, Duration::from_millis(300)));
        for round in 1..=2 {
            let e = post(&mut conn, &to).await.unwrap_err();
            assert!(matches!(e, CallbackError::Timeout(_)), "{e}");
            assert_eq!(conns.load(Ordering::SeqCst), round);
        }
    }

    /// Each request has the whole timeout from its own start: the connection's one timer is
    /// moved forward for every request, so requests that each take under a third of it never
    /// time out however many follow one another.
    #[tokio::test]
    async fn every_request_gets_the_whole_timeout_from_its_own_start() {
        let (url, conns, requests) = receiver(Answering::Slow).await;
        let to = callback(&url);
        let timeout = Duration::from_millis(500);
        let mut conn = CallbackConn::new(Settings::new(true, timeout));
        let started = std::time::Instant::now();
        for _ in 0..5 {
            assert_eq!(post(&mut conn, &to).await.unwrap().status, 200);
        }
        assert!(
            started.elapsed() > timeout,
            "together longer than one timeout"
        );
        assert_eq!(requests.load(Ordering::SeqCst), 5);
        assert_eq!(conns.load(Ordering::SeqCst), 1);
    }

    /// The address check runs on the addresses the connection would use: a name that
    /// resolves to loopback is refused unless private callbacks are allowed.
    #[tokio::test]
    async fn names_resolving_to_private_addresses_are_refused() {
        let (url, conns, _) = receiver(Answering::KeepAlive).await;
        let to = callback(&url.replace("127.0.0.1", "localhost"));
        let mut refused = CallbackConn::new(Settings::new(false, Duration::from_secs(5)));
        let e = post(&mut refused, &to).await.unwrap_err();
        assert!(e.to_string().contains("no public address"), "{e}");
        assert_eq!(conns.load(Ordering::SeqCst), 0);
        let mut allowed = CallbackConn::new(Settings::new(true, Duration::from_secs(5)));
        assert_eq!(post(&mut allowed, &to).await.unwrap().status, 200);
    }

    /// An `https` callback goes through TLS: a server that answers in plain HTTP fails the
    /// handshake (and nothing is taken for an answer).
    #[tokio::test]
    async fn https_callbacks_are_spoken_to_in_tls() {
        let settings = Settings::new(true, Duration::from_secs(5));
        assert!(settings.tls().is_ok(), "the TLS set-up");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let to = callback(&format!("https://127.0.0.1:{port}/cb"));
        let mut conn = CallbackConn::new(settings);
        let e = post(&mut conn, &to).await.unwrap_err();
        assert!(matches!(e, CallbackError::Handshake(..)), "{e}");
    }

    #[test]
    fn callbacks_are_parsed_once_into_origin_and_target() {
        let c = callback("https://example.com/a/b?c=d&e");
        assert!(c.https);
        assert_eq!((c.host.as_str(), c.port), ("example.com", 443));
        assert!(c
            .lines
            .as_bytes()
            .starts_with(b"host: example.com\r\nuser-agent: changehub/"));
        assert_eq!(c.target, "/a/b?c=d&e");
        let c = callback("http://[::1]:8080/");
        assert_eq!((c.host.as_str(), c.port), ("::1", 8080));
        assert!(c.lines.as_bytes().starts_with(b"host: [::1]:8080\r\n"));
        assert!(Callback::of(&url::Url::parse("ftp://example.com/").unwrap()).is_none());
    }
}
