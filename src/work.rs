//! Where background work runs, and the tokens that stop it. Shutdown happens in steps, each
//! with its own token (see `ARCHITECTURE.md`, "Shutdown"):
//! 1. `batcher_stop`: batchers publish what is pending and stop (after the server stopped
//!    taking changes, before the store closes);
//! 2. `drain`: delivery workers deliver what is published, then stop when idle;
//! 3. `cancel`: whatever still runs after the grace period stops.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Task trackers and stop tokens, shared by every room that starts background work. Cheap to
/// clone.
#[derive(Clone, Default)]
pub struct Work {
    /// Batchers (hosted channels and external topics).
    pub batchers: TaskTracker,
    pub batcher_stop: CancellationToken,
    /// Delivery workers, verifications, fetches, retention.
    pub tasks: TaskTracker,
    /// Set on shutdown: workers stop once they have nothing left to deliver now.
    pub drain: CancellationToken,
    /// The hard stop.
    pub cancel: CancellationToken,
}

impl Work {
    pub fn new() -> Work {
        Work::default()
    }
}
