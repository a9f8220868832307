//! The client side: commands that talk to a running hub over HTTP and websockets, as a
//! source or a destination would. Each command is a module with its flags (`clap::Args`) and
//! a `run`; `main.rs` only dispatches to them. They share [`conn`].
//!
//! - [`tail`]: `changehub tail`, follows a channel over the websocket from a cursor.
//! - [`publish`]: `changehub publish`, pushes changes from files or stdin, split into
//!   requests with idempotency keys, retried until accepted; [`scan`] makes a folder a
//!   source (`publish --scan DIR`: what changed since the last scan, and the state file).
//! - [`subscribe`]: `changehub subscribe`, a destination: follows a topic over WebSub
//!   callbacks or the websocket, fills gaps from the hub's log, keeps a crash-safe cursor,
//!   prints changes as NDJSON or keeps a mirror of the resources (and audits it).
//! - [`hash`]: the ResourceSync `hash` of a resource's bytes, computed and checked (it lives
//!   in the model, [`crate::model::hash`], since the hub's Change Dumps use it too);
//!   [`files`]: files written atomically and durably (the state files, the mirror).
//! - [`healthcheck`]: `changehub healthcheck`, exit status from the hub's `/readyz`.
//!
//! Nothing here is used by the server, and nothing here uses the server's modules beyond the
//! shared model ([`crate::model`]), the retry helper ([`crate::retry`]), the ResourceSync
//! documents ([`crate::resourcesync`]) and HTTP as a protocol ([`crate::net`]).

pub mod conn;
pub mod files;
pub use crate::model::hash;
pub mod healthcheck;
pub mod publish;
pub mod scan;
pub mod subscribe;
pub mod tail;
