//! Which channels this instance batches and delivers. Kept in one place: the cluster writes it
//! (it takes and gives up leases), the fan-out and external topics read it.
//!
//! On a store of one instance, the instance owns every channel ([`Ownership::everything`]).
//! On a shared store it owns the channels whose lease it holds ([`Ownership::leased`]; see
//! `crate::cluster`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
pub struct Ownership {
    /// `None`: every channel.
    owned: Mutex<Option<HashSet<String>>>,
}

impl Ownership {
    /// Owns every channel (one instance on its own store).
    pub fn everything() -> Arc<Ownership> {
        Arc::new(Ownership {
            owned: Mutex::new(None),
        })
    }

    /// Owns the channels taken with [`Ownership::take`] (none at first).
    pub fn leased() -> Arc<Ownership> {
        Arc::new(Ownership {
            owned: Mutex::new(Some(HashSet::new())),
        })
    }

    pub fn owns(&self, channel: &str) -> bool {
        match &*self.owned.lock().unwrap_or_else(|e| e.into_inner()) {
            None => true,
            Some(set) => set.contains(channel),
        }
    }

    /// This instance now owns `channel`.
    pub fn take(&self, channel: &str) {
        if let Some(set) = &mut *self.owned.lock().unwrap_or_else(|e| e.into_inner()) {
            set.insert(channel.to_string());
        }
    }

    /// This instance no longer owns `channel`.
    pub fn release(&self, channel: &str) {
        if let Some(set) = &mut *self.owned.lock().unwrap_or_else(|e| e.into_inner()) {
            set.remove(channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_or_what_was_taken() {
        let all = Ownership::everything();
        assert!(all.owns("a"));
        all.release("a");
        assert!(all.owns("a"));
        let leased = Ownership::leased();
        assert!(!leased.owns("a"));
        leased.take("a");
        assert!(leased.owns("a") && !leased.owns("b"));
        leased.release("a");
        assert!(!leased.owns("a"));
    }
}
