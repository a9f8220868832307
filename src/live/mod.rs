//! Live: channels followed by people and programs as they change.
//!
//! - [`follow`]: replay from the log, then live, without a gap or a duplicate — the one
//!   algorithm behind the websocket and server-sent events (their transport is in
//!   `crate::http::ws` and `crate::http::sse`).
//! - [`frames`]: the JSON frames both speak (`proto/websocket.md`).
//!
//! Everything here only reads: the log through the store, and notifications through each
//! channel's [`crate::batcher::ChannelFeed`].

pub mod follow;
pub mod frames;
