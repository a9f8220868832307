//! `GET /ws`: channels followed over a websocket.
//!
//! One task per connection owns the socket: it reads client frames, writes queued frames and
//! pings. One task per channel subscription runs a [`Follower`] and queues its frames on the
//! connection's bounded queue, each frame taking its size from the connection's byte budget
//! (`--ws-queue-bytes`) until it is written. Replay waits for room (the log is the buffer), up
//! to `--ws-stall`; live frames never wait. A live frame that finds no room, or a replay that
//! waited too long, means the client is too slow: the connection is closed with code 4008 and
//! a reason naming the last seq written to the socket for that channel — where the client
//! resumes (frames still queued are dropped, never half-sent). So a connection holds at most
//! its budget of frames, whatever it asks for.
//!
//! Limits, each answered clearly: connections per IP (429 before the upgrade), subscriptions
//! per connection (`error` frame), frame size (close 1009), unknown or private channels
//! (`error` frames).

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::AppState;
use crate::auth;
use crate::config::LiveLimits;
use crate::live::follow::{Event, Follower};
use crate::live::frames;
use crate::model::Notification;

/// Close code for a client that cannot keep up.
pub const CLOSE_SLOW: u16 = 4008;
/// How long a slow client gets to read what was already written before it is dropped.
const SLOW_PATIENCE: Duration = Duration::from_secs(10);
/// Close code when the hub shuts down.
pub const CLOSE_GOING_AWAY: u16 = 1001;

/// Websocket connections per client address, counters for the admin API, and the frames of
/// recent live notifications, rendered once and shared by every connection.
#[derive(Default)]
pub struct Connections {
    /// Every connection's task: on shutdown the server waits for them (each sends its close
    /// frame) before the process may exit.
    pub tasks: tokio_util::task::TaskTracker,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    /// Connections closed because the client could not keep up.
    pub slow_closes: std::sync::atomic::AtomicU64,
    /// Open server-sent event streams (see [`SseGuard`]).
    pub sse: std::sync::atomic::AtomicUsize,
    frames: Mutex<HashMap<String, VecDeque<SharedFrame>>>,
}

/// How many recent live frames are kept per channel.
const SHARED_FRAMES: usize = 16;

/// A rendered live notification frame: seqs `first..=last` of a channel always render the
/// same bytes, so the range identifies it.
struct SharedFrame {
    first: u64,
    last: u64,
    frame: Utf8Bytes,
}

impl Connections {
    /// The `notification` frame of a whole live notification, rendered by the first
    /// connection that needs it and shared by the others.
    fn live_frame(&self, n: &Notification) -> Utf8Bytes {
        let mut frames = self.frames.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(recent) = frames.get(&n.channel) {
            if let Some(f) = recent
                .iter()
                .find(|f| f.first == n.first && f.last == n.last)
            {
                return f.frame.clone();
            }
        }
        let frame = Utf8Bytes::from(frames::whole_notification(n));
        let recent = frames.entry(n.channel.clone()).or_default();
        if recent.len() == SHARED_FRAMES {
            recent.pop_front();
        }
        recent.push_back(SharedFrame {
            first: n.first,
            last: n.last,
            frame: frame.clone(),
        });
        frame
    }
}

impl Connections {
    /// Open connections, all addresses together.
    pub fn open(&self) -> usize {
        self.per_ip
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }
}

/// Counts one server-sent event stream until dropped.
pub struct SseGuard(Arc<Connections>);

impl SseGuard {
    pub fn new(connections: &Arc<Connections>) -> SseGuard {
        connections
            .sse
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        SseGuard(connections.clone())
    }
}

impl Drop for SseGuard {
    fn drop(&mut self) {
        self.0
            .sse
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Counts one connection until dropped.
pub struct ConnectionGuard {
    connections: Arc<Connections>,
    ip: IpAddr,
}

impl Connections {
    fn acquire(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<ConnectionGuard> {
        let mut per_ip = self.per_ip.lock().unwrap_or_else(|e| e.into_inner());
        let n = per_ip.entry(ip).or_default();
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(ConnectionGuard {
            connections: self.clone(),
            ip,
        })
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let mut per_ip = self
            .connections
            .per_ip
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                per_ip.remove(&self.ip);
            }
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct WsQuery {
    token: Option<String>,
}

/// `GET /ws`
pub async fn upgrade(
    ws: WebSocketUpgrade,
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(query): Query<WsQuery>,
) -> Response {
    let limits = state.config.live;
    let Some(guard) = state
        .connections
        .acquire(peer.ip(), limits.max_connections_per_ip)
    else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many websocket connections from {} (at most {})",
                peer.ip(),
                limits.max_connections_per_ip
            ),
        )
            .into_response();
    };
    // Small buffers keep idle connections cheap: client frames are small (a subscribe frame
    // is well under READ_BUFFER bytes; a larger one grows the read buffer as needed), and
    // writes go straight to the socket.
    ws.read_buffer_size(READ_BUFFER)
        .write_buffer_size(0)
        .max_message_size(limits.max_frame)
        .max_frame_size(limits.max_frame)
        .on_upgrade(move |socket| {
            // Split here, not inside the connection's future: that future is the connection's
            // task, kept as long as the connection is open, and a socket taken as its argument
            // would keep a dead copy of the socket's state in it.
            let (sink, stream) = socket.split();
            let tasks = state.connections.tasks.clone();
            tasks.track_future(connection(sink, stream, state, query.token, guard))
        })
}

/// The websocket read buffer's initial size, bytes. Every open connection holds one, so it is
/// sized for the client frames the hub expects (subscribe and unsubscribe, a few hundred bytes
/// with a token and an epoch), not for the largest allowed.
const READ_BUFFER: usize = 256;

/// What subscription tasks hand to the connection task: a frame, for frames carrying
/// changes their channel and last seq (so that a slow client is told where to resume), and
/// the frame's share of the connection's byte budget, given back once it is written.
///
/// The queue carries them boxed: a tokio channel allocates its slots 32 at a time when it is
/// made, so an idle connection would hold 32 unboxed `Out`s (2.3 KiB); boxed, 256 bytes.
struct Out(
    Utf8Bytes,
    Option<(Arc<str>, u64)>,
    Option<OwnedSemaphorePermit>,
);

struct Connection {
    state: AppState,
    query_token: Option<String>,
    queue: mpsc::Sender<Box<Out>>,
    /// Set when a live frame found the queue full; `slow_channel` names its channel.
    slow: CancellationToken,
    slow_channel: Arc<Mutex<Option<Arc<str>>>>,
    subscriptions: HashMap<String, JoinHandle<()>>,
    /// Per channel, the last seq written to the socket (the subscription's start before any).
    written: HashMap<String, u64>,
    slow_counted: bool,
    /// Bytes of change frames queued and not yet written (`--ws-queue-bytes`).
    budget: Arc<Semaphore>,
}

/// Serves one connection until it closes; `guard` counts it until then.
async fn connection(
    mut sink: SplitSink<WebSocket, Message>,
    mut stream: SplitStream<WebSocket>,
    state: AppState,
    query_token: Option<String>,
    guard: ConnectionGuard,
) {
    let _guard = guard;
    let limits = state.config.live;
    let shutdown = state.shutdown.clone();
    let (tx, mut rx) = mpsc::channel::<Box<Out>>(limits.queue);
    let budget = Arc::new(Semaphore::new(limits.queue_bytes));
    let mut conn = Connection {
        state,
        query_token,
        queue: tx,
        slow: CancellationToken::new(),
        slow_channel: Arc::default(),
        subscriptions: HashMap::new(),
        written: HashMap::new(),
        slow_counted: false,
        budget,
    };
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + limits.ping, limits.ping);
    let close = |code: u16, mut reason: String| {
        // A close reason holds at most 123 bytes.
        while reason.len() > 123 {
            reason.pop();
        }
        Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }))
    };
    let closing = loop {
        tokio::select! {
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Text(text))) => conn.on_frame(text.as_str()),
                Some(Ok(Message::Binary(_))) => conn.reply(frames::error(
                    "bad_frame", None, "frames are JSON text")),
                Some(Ok(Message::Close(_))) | None => break None,
                Some(Ok(_)) => {} // ping / pong: handled by the library
                Some(Err(e)) => {
                    let text = e.to_string().to_ascii_lowercase();
                    let reason = if text.contains("too long") || text.contains("too big") || text.contains("limit") {
                        (1009, format!("frame larger than {} bytes", limits.max_frame))
                    } else {
                        (1002, format!("protocol error: {e}"))
                    };
                    break Some(reason);
                }
            },
            out = rx.recv() => match out {
                Some(out) => {
                    let Out(frame, changes, _permit) = *out;
                    let send = sink.send(Message::Text(frame));
                    tokio::pin!(send);
                    let sent = tokio::select! {
                        sent = &mut send => sent,
                        _ = conn.slow.cancelled() => {
                            // Finish the frame being written (a slow client may still read it),
                            // so that the close reason's seq is exactly what the client got.
                            conn.count_slow();
                            match tokio::time::timeout(SLOW_PATIENCE, &mut send).await {
                                Ok(sent) => sent,
                                Err(_) => break None, // not reading at all: just drop it
                            }
                        }
                    };
                    if sent.is_err() {
                        break None;
                    }
                    if let Some((channel, last)) = changes {
                        if let Some(seq) = conn.written.get_mut(&*channel) {
                            *seq = last;
                        }
                    }
                }
                None => break None,
            },
            _ = conn.slow.cancelled() => {
                conn.count_slow();
                break Some((CLOSE_SLOW, conn.slow_message()));
            }
            _ = ping.tick() => {
                if sink.send(Message::Ping(Default::default())).await.is_err() {
                    break None;
                }
            }
            _ = shutdown.cancelled() => break Some((CLOSE_GOING_AWAY, "the hub is shutting down; reconnect with your cursor".into())),
        }
    };
    for task in conn.subscriptions.values() {
        task.abort();
    }
    if let Some((code, reason)) = closing {
        tracing::debug!(code, %reason, "closing websocket");
        // A slow client gets time to read what is in the socket before the close frame.
        let patience = if code == CLOSE_SLOW {
            SLOW_PATIENCE
        } else {
            Duration::from_secs(1)
        };
        if let Ok(Ok(())) = tokio::time::timeout(patience, sink.send(close(code, reason))).await {
            // Complete the closing handshake: wait (briefly) for the client's close frame.
            // Dropping the socket while the client's frames are still arriving would reset
            // the connection, and a client can lose the close frame it had not read yet.
            let _ = tokio::time::timeout(CLOSE_HANDSHAKE, async {
                while let Some(Ok(message)) = stream.next().await {
                    if matches!(message, Message::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
    }
}

/// How long a closing connection waits for the client's close frame.
const CLOSE_HANDSHAKE: Duration = Duration::from_secs(2);

impl Connection {
    /// Counts this connection as closed for slowness (once).
    fn count_slow(&mut self) {
        if !self.slow_counted {
            self.slow_counted = true;
            self.state
                .connections
                .slow_closes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The close reason for a slow client: where to resume the channel that overflowed.
    fn slow_message(&self) -> String {
        let channel = self
            .slow_channel
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let queued = self.state.config.live.queue;
        match channel.and_then(|c| self.written.get(&*c).map(|seq| (c, *seq))) {
            Some((channel, seq)) => {
                format!("slow consumer ({queued} frames queued); resume {channel} since={seq}")
            }
            None => format!("slow consumer ({queued} frames queued)"),
        }
    }

    /// Queues a control frame; a full queue means the client is too slow.
    fn reply(&self, frame: String) {
        if self
            .queue
            .try_send(Box::new(Out(frame.into(), None, None)))
            .is_err()
        {
            self.slow.cancel();
        }
    }

    fn on_frame(&mut self, text: &str) {
        let frame: frames::ClientFrame = match serde_json::from_str(text) {
            Ok(f) => f,
            Err(e) => {
                return self.reply(frames::error(
                    "bad_frame",
                    None,
                    &format!("not a client frame: {e}"),
                ))
            }
        };
        match frame {
            frames::ClientFrame::Subscribe {
                channel,
                since,
                token,
                epoch,
            } => self.subscribe(channel, since, token, epoch),
            frames::ClientFrame::Unsubscribe { channel } => {
                match self.subscriptions.remove(&channel) {
                    Some(task) => {
                        task.abort();
                        self.reply(frames::unsubscribed(&channel));
                    }
                    None => self.reply(frames::error(
                        "not_subscribed",
                        Some(&channel),
                        "not subscribed to this channel",
                    )),
                }
            }
        }
    }

    fn subscribe(
        &mut self,
        channel: String,
        since: Option<u64>,
        token: Option<String>,
        epoch: Option<String>,
    ) {
        let state = &self.state;
        let Some(hosted) = state.feeds.get(&channel) else {
            return self.reply(frames::error(
                "unknown_channel",
                Some(&channel),
                "no such channel",
            ));
        };
        let token = token.as_deref().or(self.query_token.as_deref());
        if !auth::can_read(&hosted.spec, token) {
            return self.reply(frames::error(
                "unauthorized",
                Some(&channel),
                "this channel is private: give its read token (?token= or \"token\" in subscribe)",
            ));
        }
        let limit = state.config.live.max_subscriptions;
        if !self.subscriptions.contains_key(&channel) && self.subscriptions.len() >= limit {
            return self.reply(frames::error(
                "too_many_subscriptions",
                Some(&channel),
                &format!("at most {limit} subscriptions per connection"),
            ));
        }
        let feed = hosted.feed;
        if let Some(old) = self.subscriptions.remove(&channel) {
            old.abort();
        }
        let known = feed.known_origin().map(|o| o.epoch.clone());
        let follower = Follower::new(feed, state.store.clone(), since, epoch);
        self.reply(frames::subscribed(
            &channel,
            since,
            follower.cursor(),
            known.as_deref(),
        ));
        self.written.insert(channel.clone(), follower.cursor());
        let outlet = Outlet {
            queue: self.queue.clone(),
            slow: self.slow.clone(),
            slow_channel: self.slow_channel.clone(),
            connections: state.connections.clone(),
            budget: self.budget.clone(),
            limits: state.config.live,
        };
        let task = tokio::spawn(follow(follower, Arc::from(channel.as_str()), outlet));
        self.subscriptions.insert(channel, task);
    }
}

/// Where a subscription puts its frames: the connection's queue and byte budget, and how it
/// says that the client is too slow.
struct Outlet {
    queue: mpsc::Sender<Box<Out>>,
    slow: CancellationToken,
    slow_channel: Arc<Mutex<Option<Arc<str>>>>,
    connections: Arc<Connections>,
    budget: Arc<Semaphore>,
    limits: LiveLimits,
}

/// Runs one subscription: queues the follower's frames on the connection.
async fn follow(mut follower: Follower, channel: Arc<str>, outlet: Outlet) {
    // The outlet's fields are used in place: destructured into locals, they would be stored
    // twice in this future, which every subscription keeps for as long as it runs.
    loop {
        let event = match follower.next().await {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(e) => {
                if !e.logged_by_store() {
                    tracing::warn!(%channel, error = %e, "websocket follower cannot read the log");
                }
                let frame = frames::error(
                    "unavailable",
                    Some(&channel),
                    "the store is unavailable; resubscribe with your cursor",
                );
                let _ = outlet
                    .queue
                    .send(Box::new(Out(frame.into(), None, None)))
                    .await;
                return;
            }
        };
        let last = event.changes().last().map(|c| (channel.clone(), c.seq));
        let frame = match &event {
            Event::Live(n, 0) => outlet.connections.live_frame(n),
            _ => frames::event(&channel, &event, follower.epoch()).into(),
        };
        // Every frame takes its size from the byte budget (at most all of it), given back
        // when it is written: a live frame that finds no room means the client is too slow; a
        // replay waits for room, up to `stall` (that wait boxed: its timer would otherwise
        // take room in this future for the whole life of the subscription).
        let cost = frame.len().clamp(1, outlet.limits.queue_bytes) as u32;
        let permit = if matches!(event, Event::Live(..)) {
            outlet.budget.clone().try_acquire_many_owned(cost).ok()
        } else {
            let room = outlet.budget.clone().acquire_many_owned(cost);
            match Box::pin(tokio::time::timeout(outlet.limits.stall, room)).await {
                Ok(permit) => permit.ok(),
                Err(_) => None,
            }
        };
        let Some(permit) = permit else {
            *outlet
                .slow_channel
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(channel);
            outlet.slow.cancel();
            return;
        };
        let frame = Box::new(Out(frame, last, Some(permit)));
        if matches!(event, Event::Live(..)) {
            match outlet.queue.try_send(frame) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    *outlet
                        .slow_channel
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(channel);
                    outlet.slow.cancel();
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        } else if outlet.queue.send(frame).await.is_err() {
            return;
        }
    }
}
