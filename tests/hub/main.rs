//! Integration tests: the real hub over real sockets, with real callback receivers.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/redis_server.rs"]
mod redis_server;

mod archive;
mod bad_input;
mod catalogue;
mod catchup;
mod channels;
mod cluster;
mod conformance;
mod crash;
mod disk_full;
mod dumps;
mod end_to_end;
mod external;
mod feedsync;
mod golden;
mod limits;
mod live;
mod logs;
mod metrics;
mod publish;
mod reference_client;
mod resources;
mod shutdown;
mod subscribe;
mod topics;
mod websub;
mod xmpp;
