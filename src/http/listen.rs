//! Accepting connections, with the limits that keep the hub answering whatever clients do:
//!
//! - at most `max_connections` connections at once, and `max_connections_per_ip` from one
//!   address; a connection past either cap gets a short 503 or 429 and is closed at once;
//! - a request's headers must arrive within `header_read_timeout` (which also ends idle
//!   keep-alive connections: the wait for the next request's headers is the same timer), so a
//!   client that trickles bytes (slowloris) or sits idle does not hold a connection;
//! - `accept` errors (out of file descriptors) are logged at a bounded rate and retried,
//!   never ending the server.
//!
//! Upgraded connections (websockets) leave hyper's timers; their own limits apply (see
//! `ws.rs`). Shutdown: stop accepting, let requests in flight finish (bounded by the caller).

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use super::App;
use crate::config::HttpLimits;

/// How long shutdown waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(10);

/// Connections open now, in all and per client address.
struct Admission {
    limits: HttpLimits,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One admitted connection; counted until dropped.
struct Admitted {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Admission {
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admitted, &'static [u8]> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.0 >= self.limits.max_connections {
            return Err(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\
                retry-after: 1\r\ncontent-length: 35\r\nconnection: close\r\n\r\n\
                too many connections; try again\r\n\r\n",
            );
        }
        let from_ip = open.1.entry(ip).or_default();
        if *from_ip >= self.limits.max_connections_per_ip {
            return Err(
                b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain\r\n\
                retry-after: 1\r\ncontent-length: 38\r\nconnection: close\r\n\r\n\
                too many connections from your address\r\n",
            );
        }
        *from_ip += 1;
        open.0 += 1;
        Ok(Admitted {
            admission: self.clone(),
            ip,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self
            .admission
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(n) = open.1.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.ip);
            }
        }
    }
}

/// Serves `app` on `listener` until `stop` completes, then lets requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    app: App,
    limits: HttpLimits,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let admission = Arc::new(Admission {
        limits,
        open: Mutex::default(),
    });
    let graceful = GracefulShutdown::new();
    let mut last_accept_error: Option<tokio::time::Instant> = None;
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, usually: log it once in a while, wait a little.
                    let now = tokio::time::Instant::now();
                    if last_accept_error.is_none_or(|at| now - at > Duration::from_secs(10)) {
                        tracing::error!(error = %e, "cannot accept connections (is the file descriptor limit too low?)");
                        last_accept_error = Some(now);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let admitted = match admission.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(answer) => {
                tokio::spawn(refuse(stream, answer));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        serve_connection(&graceful, stream, peer, app.clone(), limits, admitted);
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests in flight did not finish in time");
    }
    Ok(())
}

/// Answers a connection past a cap and closes it (bounded: the answer is tiny and the write
/// has a deadline).
async fn refuse(mut stream: TcpStream, answer: &'static [u8]) {
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer)).await;
}

fn serve_connection(
    graceful: &GracefulShutdown,
    stream: TcpStream,
    peer: SocketAddr,
    app: App,
    limits: HttpLimits,
    admitted: Admitted,
) {
    let service = hyper::service::service_fn(move |request| app.call(request, peer));
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)));
    let connection = builder
        .serve_connection_with_upgrades(TokioIo::new(stream), service)
        .into_owned();
    let connection = graceful.watch(connection);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::trace!(error = %e, "connection ended");
        }
        drop(admitted);
    });
}
