//! HTTP as a protocol, without a server: the pieces that the web layer, the fan-out, external
//! topics and the client commands all need, written once.
//!
//! - [`client`]: the outbound HTTP client (pooled, no redirects, no private addresses unless
//!   allowed) and the address check of callback and topic URLs.
//! - [`callback`]: a delivery worker's own connection to its callback, under the same rules;
//!   [`http1`]: the one HTTP/1.1 exchange it needs, written and read on the worker's task.
//! - [`link`]: `Link` headers (RFC 8288), parsed in every spelling publishers use, and the
//!   hub's own `rel=hub` / `rel=self` value.
//! - [`media`]: media types (`Content-Type`) reduced to their essence.
//! - [`urls`]: every URL the hub publishes, built from its public URL.
//!
//! Nothing here knows axum, the store or any other room of the hub.

pub mod callback;
pub mod client;
pub mod http1;
pub mod link;
pub mod media;
pub mod urls;

pub use client::{check_target, outbound_client, TargetError};
pub use link::{hub_links, parse_links, LinkValue};
pub use urls::{shown, Urls};
