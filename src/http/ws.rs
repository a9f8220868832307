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
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::AppState;
use crate::auth;
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
    /// Websocket connections closed so far (see [`TRIM_EVERY`]).
    closed: std::sync::atomic::AtomicUsize,
}

/// After this many websockets have closed, the memory they freed is handed back to the
/// system (`malloc_trim`): glibc's malloc keeps freed memory that sits between live
/// allocations, so a hub that once held many connections would keep their memory resident.
const TRIM_EVERY: usize = 1024;

/// Hands memory freed inside the heap back to the system (glibc only).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the allocator's own locks; it only releases free pages.
    unsafe {
        libc::malloc_trim(0);
    }
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
        drop(per_ip);
        let closed = self
            .connections
            .closed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if (closed + 1).is_multiple_of(TRIM_EVERY) {
            trim_heap();
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
            let conn = Connection::new(state, query.token, guard);
            tasks.track_future(connection(sink, stream, conn))
        })
}

/// The websocket read buffer's initial size, bytes. Every open connection holds one, so it is
/// sized for the client frames the hub expects (subscribe and unsubscribe, a few hundred bytes
/// with a token and an epoch), not for the largest allowed.
const READ_BUFFER: usize = 256;

/// What subscription tasks hand to the connection task: a frame, for frames carrying
/// changes their channel and last seq (so that a slow client is told where to resume), and
/// the frame's share of the connection's byte budget, given back once it is written.
struct Out(
    Utf8Bytes,
    Option<(Arc<str>, u64)>,
    Option<OwnedSemaphorePermit>,
);

/// A connection's outgoing frames, in order: at most `--ws-queue` of them, queued by its
/// subscriptions (and the connection itself, for control frames), written by its task.
///
/// Not a tokio channel: one allocates 32 slots (2.3 KiB for `Out`) and 512 bytes of
/// cache-padded state when it is made, which every idle connection would keep. This one holds
/// a few words until a frame is queued.
struct Queue {
    frames: Mutex<VecDeque<Out>>,
    /// Free places: a queued frame takes one, given back when the frame is taken.
    room: Semaphore,
    /// Wakes the connection's task when a frame is queued.
    queued: Notify,
}

impl Queue {
    fn new(capacity: usize) -> Queue {
        Queue {
            frames: Mutex::default(),
            room: Semaphore::new(capacity),
            queued: Notify::new(),
        }
    }

    /// Queues `out` if there is room.
    fn try_push(&self, out: Out) -> Result<(), TryAcquireError> {
        self.room.try_acquire()?.forget();
        self.append(out);
        Ok(())
    }

    /// Queues `out` once there is room; `false` when the queue was closed.
    async fn push(&self, out: Out) -> bool {
        match self.room.acquire().await {
            Ok(place) => place.forget(),
            Err(_) => return false,
        }
        self.append(out);
        true
    }

    fn append(&self, out: Out) {
        let mut frames = self.frames.lock().unwrap_or_else(|e| e.into_inner());
        frames.push_back(out);
        drop(frames);
        // Stores a wake-up when the task is not waiting yet: none is lost.
        self.queued.notify_one();
    }

    /// The oldest queued frame, once there is one.
    async fn pop(&self) -> Out {
        loop {
            let next = {
                let mut frames = self.frames.lock().unwrap_or_else(|e| e.into_inner());
                let next = frames.pop_front();
                if frames.is_empty() {
                    // An idle connection keeps no room for frames it no longer has.
                    frames.shrink_to_fit();
                }
                next
            };
            if let Some(out) = next {
                self.room.add_permits(1);
                return out;
            }
            self.queued.notified().await;
        }
    }

    /// Ends waits for room: the connection is gone.
    fn close(&self) {
        self.room.close();
    }
}

struct Connection {
    state: AppState,
    query_token: Option<String>,
    queue: Arc<Queue>,
    /// Set when a live frame found the queue full; `slow_channel` names its channel.
    slow: CancellationToken,
    slow_channel: Arc<Mutex<Option<Arc<str>>>>,
    subscriptions: HashMap<String, JoinHandle<()>>,
    /// Per channel, the last seq written to the socket (the subscription's start before any).
    written: HashMap<String, u64>,
    slow_counted: bool,
    /// Bytes of change frames queued and not yet written (`--ws-queue-bytes`).
    budget: Arc<Semaphore>,
    /// Counts the connection until it is dropped, when the connection ends.
    _guard: ConnectionGuard,
}

impl Connection {
    /// A connection's state. Made before the connection's future, and moved into it whole:
    /// every part of the state is then stored once in that future, which lives as long as the
    /// connection.
    fn new(state: AppState, query_token: Option<String>, guard: ConnectionGuard) -> Connection {
        let limits = state.config.live;
        Connection {
            state,
            query_token,
            queue: Arc::new(Queue::new(limits.queue)),
            slow: CancellationToken::new(),
            slow_channel: Arc::default(),
            subscriptions: HashMap::new(),
            written: HashMap::new(),
            slow_counted: false,
            budget: Arc::new(Semaphore::new(limits.queue_bytes)),
            _guard: guard,
        }
    }
}

/// Serves one connection until it closes.
///
/// This future is the connection's task for as long as the connection is open, so it keeps
/// little: what is needed only on the way out (the slow client's grace, the closing
/// handshake) is boxed when it happens.
async fn connection(
    mut sink: SplitSink<WebSocket, Message>,
    mut stream: SplitStream<WebSocket>,
    mut conn: Connection,
) {
    let shutdown = conn.state.shutdown.clone();
    let every = conn.state.config.live.ping;
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
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
                        (1009, format!("frame larger than {} bytes", conn.state.config.live.max_frame))
                    } else {
                        (1002, format!("protocol error: {e}"))
                    };
                    break Some(reason);
                }
            },
            out = conn.queue.pop() => {
                let Out(frame, changes, _permit) = out;
                let send = sink.send(Message::Text(frame));
                tokio::pin!(send);
                let sent = tokio::select! {
                    sent = &mut send => sent,
                    _ = conn.slow.cancelled() => {
                        // Finish the frame being written (a slow client may still read it),
                        // so that the close reason's seq is exactly what the client got.
                        conn.count_slow();
                        match Box::pin(tokio::time::timeout(SLOW_PATIENCE, &mut send)).await {
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
    conn.queue.close();
    for task in conn.subscriptions.values() {
        task.abort();
    }
    if let Some((code, reason)) = closing {
        Box::pin(close(sink, stream, code, reason)).await;
    }
}

/// Sends the close frame `code` with `reason` and completes the closing handshake.
async fn close(
    mut sink: SplitSink<WebSocket, Message>,
    mut stream: SplitStream<WebSocket>,
    code: u16,
    mut reason: String,
) {
    tracing::debug!(code, %reason, "closing websocket");
    // A close reason holds at most 123 bytes.
    while reason.len() > 123 {
        reason.pop();
    }
    let frame = Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }));
    // A slow client gets time to read what is in the socket before the close frame.
    let patience = if code == CLOSE_SLOW {
        SLOW_PATIENCE
    } else {
        Duration::from_secs(1)
    };
    if let Ok(Ok(())) = tokio::time::timeout(patience, sink.send(frame)).await {
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
        if self.queue.try_push(Out(frame.into(), None, None)).is_err() {
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
            queue_bytes: state.config.live.queue_bytes,
            stall: state.config.live.stall,
        };
        let task = tokio::spawn(follow(follower, Arc::from(channel.as_str()), outlet));
        self.subscriptions.insert(channel, task);
    }
}

/// Where a subscription puts its frames: the connection's queue and byte budget, and how it
/// says that the client is too slow.
struct Outlet {
    queue: Arc<Queue>,
    slow: CancellationToken,
    slow_channel: Arc<Mutex<Option<Arc<str>>>>,
    connections: Arc<Connections>,
    budget: Arc<Semaphore>,
    /// `--ws-queue-bytes` and `--ws-stall` (not all of `LiveLimits`: this is kept in every
    /// subscription's future).
    queue_bytes: usize,
    stall: Duration,
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
                outlet.queue.push(Out(frame.into(), None, None)).await;
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
        let cost = frame.len().clamp(1, outlet.queue_bytes) as u32;
        let permit = if matches!(event, Event::Live(..)) {
            outlet.budget.clone().try_acquire_many_owned(cost).ok()
        } else {
            let room = outlet.budget.clone().acquire_many_owned(cost);
            match Box::pin(tokio::time::timeout(outlet.stall, room)).await {
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
        let frame = Out(frame, last, Some(permit));
        if matches!(event, Event::Live(..)) {
            match outlet.queue.try_push(frame) {
                Ok(()) => {}
                Err(TryAcquireError::NoPermits) => {
                    *outlet
                        .slow_channel
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(channel);
                    outlet.slow.cancel();
                    return;
                }
                Err(TryAcquireError::Closed) => return,
            }
        } else if !outlet.queue.push(frame).await {
            return;
        }
    }
}
