//! `GET /ws`: channels followed over a websocket.
//!
//! One task per connection does everything: it reads client frames, polls the followers of
//! its channel subscriptions (each a [`Follower`] owned by a boxed future, no task of its own),
//! queues their frames and writes them, and pings. The queue holds at most `--ws-queue`
//! frames and `--ws-queue-bytes` of them, each frame taking its size from that budget until
//! it is written. Replay waits for room (the log is the buffer), up to `--ws-stall`; live
//! frames never wait. A live frame that finds no room, or a replay that waited too long, means
//! the client is too slow: the connection is closed with code 4008 and a reason naming the
//! last seq written to the socket for that channel — where the client resumes (frames still
//! queued are dropped, never half-sent). So a connection holds at most its budget of frames,
//! whatever it asks for.
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
use std::future::{poll_fn, Future};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

use super::AppState;
use crate::auth;
use crate::config::LiveLimits;
use crate::live::follow::{Event, Follower};
use crate::live::frames;
use crate::model::Notification;
use crate::store::StoreError;

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
pub(crate) fn trim_heap() {
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

type Sink = SplitSink<WebSocket, Message>;

/// A frame for the socket. A frame carrying changes names their channel and last seq (so that
/// a slow client is told where to resume); `cost` is its share of the connection's byte budget
/// (`--ws-queue-bytes`; 0 for control frames), given back once it is written.
struct Out {
    frame: Utf8Bytes,
    changes: Option<(Arc<str>, u64)>,
    cost: usize,
}

impl Out {
    /// A control frame (`subscribed`, `error`, …): a place in the queue, no budget.
    fn control(frame: String) -> Out {
        Out {
            frame: frame.into(),
            changes: None,
            cost: 0,
        }
    }
}

/// A connection's outgoing frames: queued in order, written one at a time, a due ping first.
///
/// At most `--ws-queue` frames are queued, and the frames queued or being written take at most
/// `--ws-queue-bytes` of budget. A plain `VecDeque`: only the connection's task queues and
/// writes, and an empty one holds no memory.
#[derive(Default)]
struct Outgoing {
    queue: VecDeque<Out>,
    /// The frame handed to the socket and not flushed yet (its bytes already given to it).
    writing: Option<Out>,
    /// Budget taken by the frames queued and the one being written.
    bytes: usize,
    /// A ping is due.
    ping: bool,
}

impl Outgoing {
    /// Whether a frame taking `cost` of the budget fits now.
    fn has_room(&self, limits: &LiveLimits, cost: usize) -> bool {
        self.queue.len() < limits.queue && self.bytes + cost <= limits.queue_bytes
    }

    fn push(&mut self, out: Out) {
        self.bytes += out.cost;
        self.queue.push_back(out);
    }

    /// Writes the next frame (a due ping first); ready with the frame once the socket took
    /// all of it. Cancel-safe: what is being written is kept in `writing`.
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        sink: &mut Sink,
    ) -> Poll<Result<Out, axum::Error>> {
        if self.writing.is_none() {
            if !self.ping && self.queue.is_empty() {
                return Poll::Pending;
            }
            ready!(sink.poll_ready_unpin(cx))?;
            let message = if std::mem::take(&mut self.ping) {
                self.writing = Some(Out::control(String::new()));
                Message::Ping(Default::default())
            } else if let Some(mut out) = self.queue.pop_front() {
                if self.queue.is_empty() {
                    // An idle connection keeps no room for frames it no longer has.
                    self.queue.shrink_to_fit();
                }
                let frame = std::mem::take(&mut out.frame);
                self.writing = Some(out);
                Message::Text(frame)
            } else {
                return Poll::Pending; // not reached: checked above
            };
            sink.start_send_unpin(message)?;
        }
        ready!(sink.poll_flush_unpin(cx))?;
        let Some(out) = self.writing.take() else {
            return Poll::Pending; // not reached: set above
        };
        self.bytes -= out.cost;
        Poll::Ready(Ok(out))
    }
}

/// A follower's next event. The future owns the follower and hands it back with the event:
/// it is polled by the connection's task, not a task of its own.
type NextEvent =
    Pin<Box<dyn Future<Output = (Follower, Result<Option<Event>, StoreError>)> + Send>>;

fn next_event(mut follower: Follower) -> NextEvent {
    Box::pin(async move {
        let event = follower.next().await;
        (follower, event)
    })
}

/// A channel the connection follows.
struct Subscription {
    channel: Arc<str>,
    /// The channel's last seq written to the socket (the subscription's start before any).
    written: u64,
    step: Step,
}

/// What a subscription waits for.
enum Step {
    /// Its follower's next event.
    Next(NextEvent),
    /// Room in the queue for a frame that waits (a replay frame, or the last `error`).
    Room(Box<Waiting>),
    /// Nothing more: the channel's feed is gone (shutdown), or the store failed and the
    /// client was told.
    Ended,
}

/// A frame waiting for room in the queue until `until`, when the client counts as slow.
struct Waiting {
    out: Out,
    /// Follows on once the frame is queued (`None`: the frame was the last).
    follower: Option<Follower>,
    until: Instant,
}

impl Subscription {
    fn waiting(&self) -> Option<&Waiting> {
        match &self.step {
            Step::Room(waiting) => Some(waiting),
            _ => None,
        }
    }
}

/// A connection's subscriptions, polled by its task.
#[derive(Default)]
struct Subscriptions {
    list: Vec<Subscription>,
    /// Where the next poll starts (after the last one that had an event), so that a
    /// subscription whose events are always ready does not starve the others.
    turn: usize,
    /// Wakes the task at the earliest `until` of a waiting frame (boxed: most connections
    /// never wait).
    stall: Option<Pin<Box<Sleep>>>,
}

/// What polling the subscriptions gives.
enum Polled {
    /// The follower of `list[i]` has an event (that subscription is `Ended` until it is handled).
    Event(usize, Follower, Result<Option<Event>, StoreError>),
    /// A waiting frame may have waited too long.
    Stall,
}

impl Subscriptions {
    fn find(&self, channel: &str) -> Option<usize> {
        self.list.iter().position(|s| *s.channel == *channel)
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Polled> {
        let n = self.list.len();
        for k in 0..n {
            let i = (self.turn + k) % n;
            let sub = &mut self.list[i];
            if let Step::Next(next) = &mut sub.step {
                if let Poll::Ready((follower, event)) = next.as_mut().poll(cx) {
                    sub.step = Step::Ended;
                    self.turn = i + 1;
                    return Poll::Ready(Polled::Event(i, follower, event));
                }
            }
        }
        match &mut self.stall {
            Some(stall) => stall.as_mut().poll(cx).map(|()| Polled::Stall),
            None => Poll::Pending,
        }
    }

    /// The subscription whose frame has waited longest.
    fn first_waiting(&self) -> Option<usize> {
        let waiting = self.list.iter().enumerate();
        let waiting = waiting.filter_map(|(i, s)| s.waiting().map(|w| (w.until, i)));
        waiting.min().map(|(_, i)| i)
    }

    /// Sets the stall timer to the earliest `until`, or drops it when nothing waits.
    fn set_stall(&mut self) {
        let earliest = self
            .list
            .iter()
            .filter_map(|s| s.waiting())
            .map(|w| w.until)
            .min();
        match (earliest, &mut self.stall) {
            (None, stall) => *stall = None,
            (Some(until), Some(stall)) => {
                if stall.deadline() != until {
                    stall.as_mut().reset(until);
                }
            }
            (Some(until), stall) => *stall = Some(Box::pin(tokio::time::sleep_until(until))),
        }
    }
}

/// The client is too slow: a frame found no room (`Some`: a frame of that channel).
struct Slow(Option<Arc<str>>);

struct Connection {
    state: AppState,
    query_token: Option<String>,
    subs: Subscriptions,
    out: Outgoing,
    /// Counts the connection until it is dropped, when the connection ends.
    _guard: ConnectionGuard,
}

impl Connection {
    /// A connection's state. Made before the connection's future, and moved into it whole:
    /// every part of the state is then stored once in that future, which lives as long as the
    /// connection.
    fn new(state: AppState, query_token: Option<String>, guard: ConnectionGuard) -> Connection {
        Connection {
            state,
            query_token,
            subs: Subscriptions::default(),
            out: Outgoing::default(),
            _guard: guard,
        }
    }
}

/// Serves one connection until it closes: reads client frames, polls its subscriptions'
/// followers, writes queued frames and pings.
///
/// This future is the connection's task for as long as the connection is open, so it keeps
/// little: what is needed only on the way out (the slow client's grace, the closing
/// handshake) is boxed when it happens.
async fn connection(mut sink: Sink, mut stream: SplitStream<WebSocket>, mut conn: Connection) {
    let shutdown = conn.state.shutdown.clone();
    let every = conn.state.config.live.ping;
    let mut ping = tokio::time::interval_at(Instant::now() + every, every);
    let closing = loop {
        let step = tokio::select! {
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Text(text))) => conn.on_frame(text.as_str()),
                Some(Ok(Message::Binary(_))) => conn.reply(frames::error(
                    "bad_frame", None, "frames are JSON text")),
                Some(Ok(Message::Close(_))) | None => break None,
                Some(Ok(_)) => Ok(()), // ping / pong: handled by the library
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
            written = poll_fn(|cx| conn.out.poll_write(cx, &mut sink)) => match written {
                Ok(out) => {
                    conn.note_written(out);
                    Ok(())
                }
                Err(_) => break None,
            },
            polled = poll_fn(|cx| conn.subs.poll_next(cx)) => match polled {
                Polled::Event(i, follower, event) => conn.on_event(i, follower, event),
                Polled::Stall => conn.stalled(),
            },
            _ = ping.tick() => {
                conn.out.ping = true;
                Ok(())
            }
            _ = shutdown.cancelled() => break Some((CLOSE_GOING_AWAY, "the hub is shutting down; reconnect with your cursor".into())),
        };
        match step {
            Ok(()) => conn.queue_waiting(),
            Err(Slow(channel)) => break Box::pin(conn.slow(&mut sink, channel)).await,
        }
    };
    // The subscriptions stop here; frames still queued are dropped.
    drop(std::mem::take(&mut conn.subs));
    if let Some((code, reason)) = closing {
        Box::pin(close(sink, stream, code, reason)).await;
    }
}

/// Sends the close frame `code` with `reason` and completes the closing handshake.
async fn close(mut sink: Sink, mut stream: SplitStream<WebSocket>, code: u16, mut reason: String) {
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
    /// A slow client's close: the frame being written is finished first (a slow client may
    /// still read it), so that the close reason's seq is exactly what the client got. `None`:
    /// it does not read at all, and is just dropped.
    async fn slow(&mut self, sink: &mut Sink, channel: Option<Arc<str>>) -> Option<(u16, String)> {
        self.state
            .connections
            .slow_closes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.out.writing.is_some() {
            let finish = poll_fn(|cx| self.out.poll_write(cx, sink));
            match tokio::time::timeout(SLOW_PATIENCE, finish).await {
                Ok(Ok(out)) => self.note_written(out),
                _ => return None,
            }
        }
        let queued = self.state.config.live.queue;
        let resume = channel.and_then(|c| {
            let i = self.subs.find(&c)?;
            Some((c, self.subs.list[i].written))
        });
        let reason = match resume {
            Some((channel, seq)) => {
                format!("slow consumer ({queued} frames queued); resume {channel} since={seq}")
            }
            None => format!("slow consumer ({queued} frames queued)"),
        };
        Some((CLOSE_SLOW, reason))
    }

    /// A frame is on the socket: its channel's written seq moves.
    fn note_written(&mut self, out: Out) {
        if let Some((channel, last)) = out.changes {
            if let Some(i) = self.subs.find(&channel) {
                self.subs.list[i].written = last;
            }
        }
    }

    /// Queues a control frame; a full queue means the client is too slow.
    fn reply(&mut self, frame: String) -> Result<(), Slow> {
        if !self.out.has_room(&self.state.config.live, 0) {
            return Err(Slow(None));
        }
        self.out.push(Out::control(frame));
        Ok(())
    }

    /// Queues the frame of subscription `i`, which then follows on (`None`: it ends).
    fn enqueue(&mut self, i: usize, out: Out, follower: Option<Follower>) {
        self.out.push(out);
        self.subs.list[i].step = match follower {
            Some(follower) => Step::Next(next_event(follower)),
            None => Step::Ended,
        };
    }

    /// Handles the event of subscription `i`. Every frame takes its size from the byte budget
    /// (at most all of it), given back when it is written. A live frame never waits: one that
    /// finds no room means the client is too slow. Any other frame waits for room (the log is
    /// the buffer), behind the frames already waiting, up to `--ws-stall`.
    fn on_event(
        &mut self,
        i: usize,
        follower: Follower,
        event: Result<Option<Event>, StoreError>,
    ) -> Result<(), Slow> {
        let channel = self.subs.list[i].channel.clone();
        let event = match event {
            Ok(Some(event)) => event,
            Ok(None) => return Ok(()), // the feed is gone: the hub is shutting down
            Err(e) => {
                if !e.logged_by_store() {
                    tracing::warn!(%channel, error = %e, "websocket follower cannot read the log");
                }
                let frame = frames::error(
                    "unavailable",
                    Some(&channel),
                    "the store is unavailable; resubscribe with your cursor",
                );
                self.enqueue_or_wait(i, Out::control(frame), None);
                return Ok(());
            }
        };
        let limits = self.state.config.live;
        let frame = match &event {
            Event::Live(n, 0) => self.state.connections.live_frame(n),
            _ => frames::event(&channel, &event, follower.epoch()).into(),
        };
        let out = Out {
            cost: frame.len().clamp(1, limits.queue_bytes),
            changes: event.changes().last().map(|c| (channel.clone(), c.seq)),
            frame,
        };
        if !matches!(event, Event::Live(..)) {
            self.enqueue_or_wait(i, out, Some(follower));
        } else if self.out.has_room(&limits, out.cost) {
            self.enqueue(i, out, Some(follower));
        } else {
            return Err(Slow(Some(channel)));
        }
        Ok(())
    }

    /// Queues the frame of subscription `i` if it fits and no frame waits before it;
    /// otherwise it waits, up to `--ws-stall`.
    fn enqueue_or_wait(&mut self, i: usize, out: Out, follower: Option<Follower>) {
        let limits = &self.state.config.live;
        if self.subs.first_waiting().is_none() && self.out.has_room(limits, out.cost) {
            return self.enqueue(i, out, follower);
        }
        let until = Instant::now() + limits.stall;
        self.subs.list[i].step = Step::Room(Box::new(Waiting {
            out,
            follower,
            until,
        }));
        self.subs.set_stall();
    }

    /// Queues the waiting frames that fit now, longest waiting first.
    fn queue_waiting(&mut self) {
        while let Some(i) = self.subs.first_waiting() {
            let fits = self.subs.list[i]
                .waiting()
                .is_some_and(|w| self.out.has_room(&self.state.config.live, w.out.cost));
            if !fits {
                break;
            }
            if let Step::Room(waiting) = std::mem::replace(&mut self.subs.list[i].step, Step::Ended)
            {
                let Waiting { out, follower, .. } = *waiting;
                self.enqueue(i, out, follower);
            }
        }
        self.subs.set_stall();
    }

    /// The stall timer fired: a frame that waited `--ws-stall` for room means the client
    /// reads nothing.
    fn stalled(&mut self) -> Result<(), Slow> {
        let now = Instant::now();
        match self.subs.first_waiting() {
            Some(i) if self.subs.list[i].waiting().is_some_and(|w| w.until <= now) => {
                Err(Slow(Some(self.subs.list[i].channel.clone())))
            }
            _ => Ok(()),
        }
    }

    fn on_frame(&mut self, text: &str) -> Result<(), Slow> {
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
            frames::ClientFrame::Unsubscribe { channel } => match self.subs.find(&channel) {
                Some(i) => {
                    self.subs.list.remove(i);
                    self.reply(frames::unsubscribed(&channel))
                }
                None => self.reply(frames::error(
                    "not_subscribed",
                    Some(&channel),
                    "not subscribed to this channel",
                )),
            },
        }
    }

    fn subscribe(
        &mut self,
        channel: String,
        since: Option<u64>,
        token: Option<String>,
        epoch: Option<String>,
    ) -> Result<(), Slow> {
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
        let existing = self.subs.find(&channel);
        if existing.is_none() && self.subs.list.len() >= limit {
            return self.reply(frames::error(
                "too_many_subscriptions",
                Some(&channel),
                &format!("at most {limit} subscriptions per connection"),
            ));
        }
        let feed = hosted.feed;
        let known = feed.known_origin().map(|o| o.epoch.clone());
        let follower = Follower::new(feed, state.store.clone(), since, epoch);
        let reply = self.reply(frames::subscribed(
            &channel,
            since,
            follower.cursor(),
            known.as_deref(),
        ));
        let sub = Subscription {
            channel: Arc::from(channel),
            written: follower.cursor(),
            step: Step::Next(next_event(follower)),
        };
        match existing {
            Some(i) => self.subs.list[i] = sub,
            None => {
                // One subscription is the common case: no room kept for more.
                self.subs.list.reserve_exact(1);
                self.subs.list.push(sub);
            }
        }
        reply
    }
}
