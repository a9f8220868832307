//! The state file of `changehub subscribe`: where the destination stands, kept crash-safe.
//!
//! It holds the cursor (the last seq applied, and the epoch of the log it belongs to), the
//! subscription's callback URL and secret (so that a restarted subscriber renews the same
//! subscription and still checks deliveries signed before it stopped), whether the mirror's
//! baseline is done, and the mirror's fetches that have not succeeded yet.
//!
//! [`State::save`] writes it with [`write_atomically`] (a temporary file beside it, synced,
//! renamed over the old one, the folder synced): after a crash — even SIGKILL or a power cut — the file is either the old
//! state or the new one, never a mix. The cursor is saved only after what it covers has been
//! printed and flushed (and, with a mirror, written to disk), so a restart resumes exactly
//! after the last change applied.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

use crate::client::files::write_atomically;
use crate::model::Change;

/// The version of the file's layout.
const VERSION: u32 = 1;

/// What the state file holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct State {
    pub version: u32,
    /// The topic followed; a state file belongs to one topic.
    pub topic: String,
    /// The last seq applied (0: nothing yet).
    pub seq: u64,
    /// The epoch of the log `seq` belongs to, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    /// True once the cursor means something: set by the first catch-up or baseline.
    #[serde(default)]
    pub started: bool,
    /// The `hub.secret` of the subscription (callbacks only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The callback URL the subscription was made with (callbacks only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<String>,
    /// Changes the mirror has not managed to apply yet (fetch failed, hash did not match):
    /// loc → the newest change of it. Retried until they succeed or a newer change replaces
    /// them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pending: BTreeMap<String, Change>,
}

impl State {
    /// A state for `topic` that has seen nothing.
    pub fn new(topic: &str) -> State {
        State {
            version: VERSION,
            topic: topic.to_string(),
            ..State::default()
        }
    }

    /// Reads the state file at `path`, or a new state when there is none. A file of another
    /// topic is an error: one state file follows one topic.
    pub fn load(path: &Path, topic: &str) -> anyhow::Result<State> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::new(topic)),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let state: State = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{} is not a state file of changehub subscribe",
                path.display()
            )
        })?;
        anyhow::ensure!(
            state.version == VERSION,
            "{}: state file version {} (this changehub reads version {VERSION})",
            path.display(),
            state.version
        );
        anyhow::ensure!(
            state.topic == topic,
            "{} follows another topic ({}); give a new --state file for {topic}",
            path.display(),
            state.topic
        );
        Ok(state)
    }

    /// Writes the state to `path` atomically and durably.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).context("encoding the state")?;
        write_atomically(path, &bytes).with_context(|| format!("saving {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_and_loaded_and_bound_to_one_topic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let topic = "http://hub/channels/news/changelist.xml";
        let fresh = State::load(&path, topic).unwrap();
        assert_eq!(fresh, State::new(topic));
        let mut state = fresh;
        state.seq = 42;
        state.epoch = Some("0123456789abcdef".into());
        state.started = true;
        state.save(&path).unwrap();
        assert_eq!(State::load(&path, topic).unwrap(), state);
        let other = State::load(&path, "http://hub/channels/other/changelist.xml");
        assert!(other.unwrap_err().to_string().contains("another topic"));
        std::fs::write(&path, b"not json").unwrap();
        assert!(State::load(&path, topic).is_err());
    }
}
