//! changehub: a ResourceSync change-notification hub.
//!
//! Data flows one way, and the rooms follow it:
//!
//! ```text
//! source ──POST──▶ ingest ──┐                                       ┌──▶ fanout ──POST──▶ callbacks
//!                           ├─append─▶ store (the log) ─head─▶ batcher ─notification─┤
//! publisher ─ping─▶ external┘                 ▲                     └──▶ live ──▶ websockets, SSE
//!                                             └──── catchup (changelist.xml, changes?after=) ◀── anyone
//! ```
//!
//! Domain rooms (no axum, no [`http`] in them):
//! - [`model`]: the shared data types; imports nothing of the project.
//! - [`ingest`]: the first way in: parse, validate, append.
//! - [`external`]: the second way in: external WebSub topics, fetched or fat-pinged.
//! - [`store`]: the [`store::Store`] trait and its engines (embedded redb, Redis).
//! - [`batcher`]: cuts each channel's log into notifications, published on its feed.
//! - [`fanout`]: WebSub subscriptions, verification, signed delivery with retries.
//! - [`live`]: following a channel from a cursor (websockets and SSE share it).
//! - [`catchup`]: the documents subscribers pull to catch up, and discovery.
//! - [`cluster`] and [`ownership`]: several instances on one Redis, one owner per channel.
//! - [`resourcesync`]: ResourceSync documents, written and parsed.
//! - [`feedsync`]: FeedSync collections, written and parsed (the sync algorithms are
//!   [`model::feedsync`]).
//! - [`dumps`]: Change Dumps: ZIP packages of the resources a channel's changes name,
//!   fetched by the hub, listed and announced through an internal channel per channel.
//! - [`xmpp`]: the XMPP PubSub bridge: each channel's notifications as items of a XEP-0060
//!   node on an existing XMPP server.
//!
//! Around them: [`http`] (the web layer, the only room that knows axum), [`client`] (the
//! client commands), [`net`] (outbound HTTP, Link headers, URLs), [`auth`] (tokens and
//! secrets), [`retry`] (backoff), [`work`] (task trackers and stop tokens), [`config`],
//! [`logging`] (the binary's log lines), [`telemetry`] (Prometheus metrics), and [`server`],
//! which wires everything together.
//!
//! [`run`] is the one entry point, shared by the binary and the tests: it serves on a listener
//! until the `shutdown` future completes, then flushes the batchers and stops every task.

pub mod auth;
pub mod batcher;
pub mod catchup;
pub mod client;
pub mod cluster;
pub mod config;
pub mod dumps;
pub mod external;
pub mod fanout;
pub mod feedsync;
pub mod hosted;
pub mod http;
pub mod ingest;
pub mod live;
pub mod logging;
pub mod model;
pub mod net;
pub mod ownership;
pub mod resourcesync;
pub mod retry;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod work;
pub mod xmpp;

pub use server::{open_store, run, Error, Hub};
