//! Which changes of a topic were seen already, so that a topic fetched again (or a fat ping
//! repeated) adds only what is new to the log.
//!
//! A change's key is (`loc`, `change`, `datetime`). A change is new when its key was never
//! seen and it is not older than the newest change recorded (the high-water mark). The set is
//! rebuilt from the newest part of the log the first time it is needed after a start.

use std::collections::HashSet;
use time::OffsetDateTime;

use crate::model::{format_datetime, NewChange};
use crate::store::{Store, StoreError};

/// Most remembered keys per topic (beyond, only the high-water mark protects).
const MAX_SEEN: usize = 200_000;

type Key = (String, &'static str, String);

#[derive(Default)]
pub(super) struct Seen {
    loaded: bool,
    keys: HashSet<Key>,
    newest: Option<OffsetDateTime>,
}

/// The new changes of a batch, with what to remember once they are recorded.
pub(super) struct Fresh {
    pub(super) changes: Vec<NewChange>,
    keys: HashSet<Key>,
    newest: Option<OffsetDateTime>,
}

impl Seen {
    /// Loads the set from `channel`'s log, once.
    pub(super) async fn load(
        &mut self,
        store: &dyn Store,
        channel: &str,
    ) -> Result<(), StoreError> {
        if self.loaded {
            return Ok(());
        }
        let logged = store.read_newest(channel, crate::catchup::MAX_LIST).await?;
        for c in &logged {
            self.keys.insert((
                c.loc.clone(),
                c.change.as_str(),
                format_datetime(c.datetime),
            ));
            if let Some(lm) = c.lastmod {
                // A change dated before the log's newest was stored with a later datetime and
                // its own time as lastmod: remember that key too.
                self.keys
                    .insert((c.loc.clone(), c.change.as_str(), format_datetime(lm)));
            }
        }
        self.newest = logged.last().map(|c| c.datetime);
        self.loaded = true;
        Ok(())
    }

    /// The newest datetime recorded.
    pub(super) fn newest(&self) -> Option<OffsetDateTime> {
        self.newest
    }

    /// The changes of `changes` not seen before (duplicates within the batch counted once).
    pub(super) fn fresh(&self, changes: Vec<NewChange>) -> Fresh {
        let mut fresh = Fresh {
            changes: Vec::new(),
            keys: HashSet::new(),
            newest: self.newest,
        };
        for c in changes {
            let key = (
                c.loc.clone(),
                c.change.as_str(),
                c.datetime.map(format_datetime).unwrap_or_default(),
            );
            let old = match (c.datetime, self.newest) {
                (Some(dt), Some(newest)) => dt < newest,
                _ => false,
            };
            if old || self.keys.contains(&key) || !fresh.keys.insert(key) {
                continue;
            }
            if let Some(dt) = c.datetime {
                fresh.newest = Some(fresh.newest.map_or(dt, |n| n.max(dt)));
            }
            fresh.changes.push(c);
        }
        fresh
    }

    /// Remembers a batch once it is in the log.
    pub(super) fn remember(&mut self, fresh: Fresh) {
        if self.keys.len() + fresh.keys.len() > MAX_SEEN {
            self.keys.clear();
        }
        self.keys.extend(fresh.keys);
        self.newest = fresh.newest;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{parse_w3c_datetime, ChangeType};

    fn change(loc: &str, at: &str) -> NewChange {
        NewChange {
            datetime: Some(parse_w3c_datetime(at).unwrap()),
            ..NewChange::new(loc, ChangeType::Updated)
        }
    }

    #[test]
    fn only_unseen_and_not_older_changes_are_fresh() {
        let mut seen = Seen::default();
        let first = seen.fresh(vec![
            change("http://a/1", "2024-01-01T00:00:00Z"),
            change("http://a/1", "2024-01-01T00:00:00Z"),
            change("http://a/2", "2024-01-02T00:00:00Z"),
        ]);
        assert_eq!(
            first.changes.len(),
            2,
            "a duplicate in the batch counts once"
        );
        seen.remember(first);
        let again = seen.fresh(vec![
            change("http://a/2", "2024-01-02T00:00:00Z"),
            change("http://a/3", "2024-01-01T12:00:00Z"),
            change("http://a/4", "2024-01-03T00:00:00Z"),
        ]);
        let locs: Vec<_> = again.changes.iter().map(|c| c.loc.as_str()).collect();
        assert_eq!(
            locs,
            ["http://a/4"],
            "seen and older-than-newest are skipped"
        );
        assert_eq!(
            again.newest,
            Some(parse_w3c_datetime("2024-01-03T00:00:00Z").unwrap())
        );
    }
}
