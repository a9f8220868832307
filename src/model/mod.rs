//! The shared data types: what every other room of the hub passes around. This module imports
//! nothing of the project; everything else imports from here.
//!
//! - [`change`]: a change as a source sends it ([`NewChange`]) and as the log holds it
//!   ([`Change`]), the validation every ingest path shares, W3C datetimes.
//! - [`notification`]: a batch of consecutive changes of one channel, rendered once.
//! - [`subscription`]: a verified WebSub subscription and how far it has been served.
//! - [`signature`]: `X-Hub-Signature`: the algorithms, signing and checking.
//! - [`channel`]: channel names and retention.
//! - [`feedsync`]: FeedSync sync metadata of every resource: update, merge, conflicts.
//! - [`hash`]: the ResourceSync `hash` of a resource's bytes, computed and checked (the
//!   `subscribe` mirror and the hub's Change Dumps share it).

pub mod change;
pub mod channel;
pub mod feedsync;
pub mod hash;
pub mod notification;
pub mod signature;
pub mod signature_lanes;
pub mod subscription;

pub use change::{
    format_datetime, parse_w3c_datetime, write_datetime, Change, ChangeType, Link, NewChange,
    ValidationError, MAX_ATTR_LEN, MAX_LINKS, MAX_URI_LEN,
};
pub use channel::{
    valid_channel_name, ChannelSpec, DumpSettings, Lists, Publisher, Retention, DEFAULT_LIST_SIZE,
    DEFAULT_PUBLISHER, MAX_LIST_SIZE,
};
pub use notification::Notification;
pub use signature::Algorithm;
pub use subscription::{subscription_id, DeliveryState, PendingDelivery, Subscription};
