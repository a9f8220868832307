//! Integration tests: the real hub over real sockets, with real callback receivers.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod catchup;
mod conformance;
mod crash;
mod end_to_end;
mod external;
mod live;
mod shutdown;
mod topics;
mod websub;
