//! `--mirror DIR`: a local copy of the channel's resources, and `--audit` of it.
//!
//! - **Where a resource goes.** With `--base-url URL`, a `loc` under URL goes to DIR + the rest
//!   of its path, percent-decoded (`URL/a/b%20c.txt` → `DIR/a/b c.txt`); without it, to
//!   `DIR/HOST[_PORT]/PATH`. A `loc` that maps to no safe file name (outside the base URL, a
//!   query, an empty, `.` or `..` segment, a trailing `/`) is skipped with a warning.
//! - **Created and updated** resources are fetched, `--concurrency` at a time, each retried a
//!   few times with backoff. The bytes must have the change's `length` and `hash` when it
//!   gives them. They are written to a hidden temporary file beside the target, synced, and
//!   renamed over it: a reader (or a crash) sees the old file or the new one.
//! - **Deleted** resources are removed.
//! - A resource that still fails is *pending*: the follower keeps it in the state file and
//!   tries it again every few seconds until it succeeds or a newer change of it replaces it.
//!   The cursor moves on meanwhile.
//! - Before the cursor is saved, the folders that got a rename or a removal are synced, so
//!   what the saved cursor covers is on disk.
//! - DIR holds a hidden `.changehub-mirror` file. A folder without it is taken only when it
//!   is empty: the baseline removes every file that the Resource List does not list, which
//!   must never be someone's other files.

use futures_util::stream::{self, StreamExt};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::client::{hash, scan};
use crate::model::{Change, ChangeType};
use crate::retry::backoff;

/// Attempts of one fetch before the resource becomes pending.
const ATTEMPTS: u32 = 4;
/// Prefix of the mirror's temporary files (skipped by the audit).
const TEMP_PREFIX: &str = ".changehub-tmp-";
/// The file that makes a folder a mirror: only a folder that has it (or an empty one) is
/// taken, since the mirror removes what the Resource List does not list.
const MARKER: &str = ".changehub-mirror";
/// Longest one resource's fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(300);

/// The local copy.
pub struct Mirror {
    dir: PathBuf,
    base: Option<url::Url>,
    client: reqwest::Client,
    concurrency: usize,
    /// The state file, when it lies inside DIR (the audit ignores it).
    state_file: Option<PathBuf>,
}

/// What applying changes did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub fetched: usize,
    pub removed: usize,
    pub failed: usize,
    pub skipped: usize,
}

/// One difference the audit found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    Missing {
        path: String,
        loc: String,
    },
    Differs {
        path: String,
        loc: String,
        why: String,
    },
    Extra {
        path: String,
    },
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Difference::Missing { path, loc } => write!(f, "missing\t{path}\t{loc}"),
            Difference::Differs { path, loc, why } => write!(f, "differs\t{path}\t{loc}\t{why}"),
            Difference::Extra { path } => write!(f, "extra\t{path}"),
        }
    }
}

impl Mirror {
    /// A mirror in `dir` (created when missing; it must be writable).
    pub fn open(
        dir: &Path,
        base: Option<&str>,
        client: reqwest::Client,
        concurrency: usize,
        state_file: &Path,
    ) -> anyhow::Result<Mirror> {
        use anyhow::Context;
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the mirror folder {}", dir.display()))?;
        let marker = dir.join(MARKER);
        if !marker.exists() {
            let occupied = std::fs::read_dir(dir)
                .with_context(|| format!("cannot read the mirror folder {}", dir.display()))?
                .next()
                .is_some();
            anyhow::ensure!(
                !occupied,
                "{} is not empty and is not a mirror of changehub subscribe; give a new or \
                 empty folder (a mirror removes what the hub's Resource List does not list)",
                dir.display()
            );
        }
        std::fs::write(
            &marker,
            b"This folder is a mirror kept by changehub subscribe.\n",
        )
        .with_context(|| format!("the mirror folder {} is not writable", dir.display()))?;
        let base = base.map(scan::parse_base).transpose()?;
        let dir = std::fs::canonicalize(dir)?;
        let state_file = std::fs::canonicalize(crate::client::files::folder_of(state_file))
            .ok()
            .and_then(|folder| Some(folder.join(state_file.file_name()?)))
            .filter(|p| p.starts_with(&dir));
        Ok(Mirror {
            dir,
            base,
            client,
            concurrency: concurrency.max(1),
            state_file,
        })
    }

    /// The path of `loc` under DIR, relative, or why it has none: what `publish --scan`
    /// does, backwards ([`scan::relative_path`]), under `--base-url` or else under
    /// `HOST[_PORT]/`.
    pub fn relative_path(&self, loc: &str) -> Result<PathBuf, String> {
        let (base, folder) = match &self.base {
            Some(base) => (base.clone(), PathBuf::new()),
            None => {
                let mut url = url::Url::parse(loc).map_err(|e| format!("not a URL: {e}"))?;
                let host = url.host_str().ok_or("no host")?.replace(':', "_");
                let folder = match url.port() {
                    Some(port) => format!("{host}_{port}"),
                    None => host,
                };
                url.set_path("/");
                url.set_query(None);
                url.set_fragment(None);
                (url, PathBuf::from(folder))
            }
        };
        let relative = scan::relative_path(&base, loc).ok_or_else(|| {
            format!("no file name under {base} (a query, an empty, . or .. segment, a trailing /)")
        })?;
        if relative
            .split('/')
            .any(|name| name.starts_with(TEMP_PREFIX))
        {
            return Err("the name of a temporary file of the mirror".into());
        }
        Ok(folder.join(relative))
    }

    /// Applies changes (the newest per `loc` wins; they come in seq order): fetches, writes,
    /// removes. Changes that still fail go to `pending`, which also loses the resources that a
    /// change here supersedes. Syncs the folders touched before it returns.
    pub async fn apply(
        &self,
        changes: &[Change],
        pending: &mut BTreeMap<String, Change>,
    ) -> Applied {
        let mut newest: HashMap<&str, &Change> = HashMap::new();
        for change in changes {
            newest.insert(change.loc.as_str(), change);
        }
        let mut todo: Vec<&Change> = newest.into_values().collect();
        todo.sort_by_key(|c| c.seq);
        let mut applied = Applied::default();
        let mut touched = BTreeSet::new();
        let mut fetches = Vec::new();
        for change in todo {
            pending.remove(&change.loc);
            let relative = match self.relative_path(&change.loc) {
                Ok(relative) => relative,
                Err(why) => {
                    eprintln!("mirror: skipping {}: {why}", change.loc);
                    applied.skipped += 1;
                    continue;
                }
            };
            let path = self.dir.join(&relative);
            if change.change == ChangeType::Deleted {
                match std::fs::remove_file(&path) {
                    Ok(()) => {
                        applied.removed += 1;
                        touched.insert(crate::client::files::folder_of(&path));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        eprintln!("mirror: cannot remove {}: {e}", path.display());
                        pending.insert(change.loc.clone(), change.clone());
                        applied.failed += 1;
                    }
                }
            } else {
                fetches.push((change, path));
            }
        }
        let results: Vec<_> = stream::iter(fetches)
            .map(|(change, path)| async move {
                let result = self.fetch_and_write(change, &path, ATTEMPTS).await;
                (change, path, result)
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        for (change, path, result) in results {
            match result {
                Ok(()) => {
                    applied.fetched += 1;
                    touched.insert(crate::client::files::folder_of(&path));
                }
                Err(why) => {
                    eprintln!(
                        "mirror: {} (seq {}) is pending: {why}",
                        change.loc, change.seq
                    );
                    pending.insert(change.loc.clone(), change.clone());
                    applied.failed += 1;
                }
            }
        }
        for folder in touched {
            if let Err(e) = crate::client::files::sync_folder(&folder) {
                eprintln!("mirror: cannot sync {}: {e}", folder.display());
            }
        }
        applied
    }

    /// Tries every pending change once more (one attempt each).
    pub async fn retry_pending(&self, pending: &mut BTreeMap<String, Change>) -> Applied {
        let changes: Vec<Change> = pending.values().cloned().collect();
        let mut still = BTreeMap::new();
        let mut applied = self.apply(&changes, &mut still).await;
        applied.failed = still.len();
        *pending = still;
        applied
    }

    /// GETs the resource and writes it, retrying `attempts` times.
    async fn fetch_and_write(
        &self,
        change: &Change,
        path: &Path,
        attempts: u32,
    ) -> Result<(), String> {
        let mut last = String::new();
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(backoff(
                    attempt - 1,
                    Duration::from_millis(250),
                    Duration::from_secs(4),
                ))
                .await;
            }
            match self.fetch(change).await {
                Ok(bytes) => {
                    // Writing and syncing block: on their own thread, so that the writes of
                    // concurrent fetches overlap instead of queueing on the follower's task.
                    let target = path.to_path_buf();
                    let written =
                        tokio::task::spawn_blocking(move || write_file(&target, &bytes)).await;
                    return match written {
                        Ok(result) => result,
                        Err(e) => Err(std::io::Error::other(e)),
                    }
                    .map_err(|e| format!("cannot write {}: {e}", path.display()));
                }
                Err(why) => last = why,
            }
        }
        Err(last)
    }

    /// GETs `change.loc` and checks its length and hash.
    async fn fetch(&self, change: &Change) -> Result<bytes::Bytes, String> {
        let response = self
            .client
            .get(&change.loc)
            .timeout(FETCH_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("GET failed: {e}"))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("GET answered {status}"));
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("reading the body: {e}"))?;
        hash::check_change(change, &bytes)?;
        Ok(bytes)
    }

    /// Removes every file under DIR that is not the path of one of `resources` (the
    /// baseline's reconciliation). Returns how many it removed.
    pub fn remove_others(&self, resources: &[Change]) -> usize {
        let keep: BTreeSet<PathBuf> = resources
            .iter()
            .filter_map(|r| self.relative_path(&r.loc).ok())
            .collect();
        let mut removed = 0;
        for relative in self.files() {
            if !keep.contains(&relative) {
                let path = self.dir.join(&relative);
                match std::fs::remove_file(&path) {
                    Ok(()) => removed += 1,
                    Err(e) => eprintln!("mirror: cannot remove {}: {e}", path.display()),
                }
            }
        }
        removed
    }

    /// Compares DIR with `resources` (a Resource List): each must be there with its hash
    /// (else its length) when the list gives one; nothing else may be there.
    pub fn audit(&self, resources: &[Change]) -> Vec<Difference> {
        let mut differences = Vec::new();
        let mut expected = BTreeSet::new();
        for resource in resources {
            let Ok(relative) = self.relative_path(&resource.loc) else {
                continue;
            };
            let shown = relative.display().to_string();
            expected.insert(relative.clone());
            let path = self.dir.join(&relative);
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(_) => {
                    differences.push(Difference::Missing {
                        path: shown,
                        loc: resource.loc.clone(),
                    });
                    continue;
                }
            };
            let why = match (&resource.hash, resource.length) {
                (Some(h), _) => hash::check(h, &bytes).err(),
                (None, Some(length)) if bytes.len() as u64 != length => {
                    Some(format!("{} bytes, not {length}", bytes.len()))
                }
                _ => None,
            };
            if let Some(why) = why {
                differences.push(Difference::Differs {
                    path: shown,
                    loc: resource.loc.clone(),
                    why,
                });
            }
        }
        for relative in self.files() {
            if !expected.contains(&relative) {
                differences.push(Difference::Extra {
                    path: relative.display().to_string(),
                });
            }
        }
        differences
    }

    /// Every file under DIR, relative, but the mirror's temporary files and the state file.
    fn files(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut folders = vec![self.dir.clone()];
        while let Some(folder) = folders.pop() {
            let Ok(entries) = std::fs::read_dir(&folder) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                if kind.is_dir() {
                    folders.push(path);
                    continue;
                }
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with(TEMP_PREFIX)
                    || (name == MARKER && folder == self.dir)
                    || (name.starts_with('.') && name.ends_with(".changehub-tmp"))
                    || self.state_file.as_deref() == Some(path.as_path())
                {
                    continue;
                }
                if let Ok(relative) = path.strip_prefix(&self.dir) {
                    found.push(relative.to_path_buf());
                }
            }
        }
        found.sort();
        found
    }
}

/// Writes `bytes` at `path` through a synced temporary file and a rename.
fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let folder = crate::client::files::folder_of(path);
    if !folder.is_dir() {
        std::fs::create_dir_all(&folder)?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = folder.join(format!("{TEMP_PREFIX}{name}"));
    let mut file = std::fs::File::create(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temp, path)
}

/// Progress of the baseline: a bar on a terminal, a line every few seconds otherwise.
pub struct Progress {
    bar: indicatif::ProgressBar,
    terminal: bool,
    started: Instant,
    shown: Instant,
    total: u64,
}

impl Progress {
    pub fn new(total: u64) -> Progress {
        use std::io::IsTerminal;
        let terminal = std::io::stderr().is_terminal();
        let bar = if terminal {
            let bar = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "baseline {bar:40} {pos}/{len} resources ({per_sec}, ETA {eta})",
            ) {
                bar.set_style(style);
            }
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        Progress {
            bar,
            terminal,
            started: Instant::now(),
            shown: Instant::now(),
            total,
        }
    }

    pub fn add(&mut self, n: u64) {
        self.bar.inc(n);
        if !self.terminal && self.shown.elapsed() >= Duration::from_secs(5) {
            self.shown = Instant::now();
            eprintln!("baseline: {}/{} resources", self.bar.position(), self.total);
        }
    }

    /// Ends the bar; the rate, for the summary line.
    pub fn finish(self) -> f64 {
        self.bar.finish_and_clear();
        self.bar.position() as f64 / self.started.elapsed().as_secs_f64().max(0.001)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mirror(base: Option<&str>) -> (tempfile::TempDir, Mirror) {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        let m = Mirror::open(
            &dir.path().join("m"),
            base,
            reqwest::Client::new(),
            2,
            &state,
        )
        .unwrap();
        (dir, m)
    }

    #[test]
    fn only_an_empty_folder_or_a_mirror_is_taken() {
        let (dir, m) = mirror(None);
        write_file(&m.dir.join("kept.txt"), b"x").unwrap();
        let state = dir.path().join("state.json");
        let open = |d: &Path| Mirror::open(d, None, reqwest::Client::new(), 1, &state);
        assert!(open(&m.dir).is_ok(), "a mirror is taken again");
        let others = dir.path().join("home");
        write_file(&others.join("notes.txt"), b"mine").unwrap();
        let refused = open(&others).err().unwrap().to_string();
        assert!(refused.contains("is not empty"), "{refused}");
        assert!(others.join("notes.txt").exists());
        assert_eq!(m.files(), vec![PathBuf::from("kept.txt")]);
    }

    #[test]
    fn locs_map_to_safe_paths() {
        let (_d, m) = mirror(Some("http://src.example/files"));
        let p = |loc: &str| m.relative_path(loc).map(|p| p.display().to_string());
        assert_eq!(
            p("http://src.example/files/a/b%20c.txt").unwrap(),
            "a/b c.txt"
        );
        assert!(p("http://other.example/files/a").is_err());
        assert!(p("http://src.example/files/a/../../etc/passwd").is_err());
        assert!(p("http://src.example/files/a/%2e%2e/x").is_err());
        assert!(p("http://src.example/files/a%2Fb").is_err());
        assert!(p("http://src.example/files/dir/").is_err());
        assert!(p("http://src.example/files/a?x=1").is_err());
        assert!(p("http://src.example/files/.changehub-tmp-x").is_err());
        let (_d, m) = mirror(None);
        assert_eq!(
            m.relative_path("http://src.example:8080/x/y.html")
                .unwrap()
                .display()
                .to_string(),
            "src.example_8080/x/y.html"
        );
    }

    #[test]
    fn the_audit_finds_missing_different_and_extra_files() {
        let (_d, m) = mirror(Some("http://s/"));
        let dt = time::OffsetDateTime::UNIX_EPOCH;
        let resource = |seq: u64, loc: &str, body: Option<&[u8]>| {
            let mut c = Change::from_new(
                seq,
                crate::model::NewChange {
                    datetime: Some(dt),
                    hash: body.map(hash::of),
                    ..crate::model::NewChange::new(loc, ChangeType::Created)
                },
                dt,
            );
            c.length = body.map(|b| b.len() as u64);
            c
        };
        write_file(&m.dir.join("same.txt"), b"same").unwrap();
        write_file(&m.dir.join("sub/changed.txt"), b"old").unwrap();
        write_file(&m.dir.join("extra.txt"), b"x").unwrap();
        let list = vec![
            resource(1, "http://s/same.txt", Some(b"same")),
            resource(2, "http://s/sub/changed.txt", Some(b"new")),
            resource(3, "http://s/gone.txt", Some(b"g")),
        ];
        let found: Vec<String> = m.audit(&list).iter().map(|d| d.to_string()).collect();
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(
            found[0].starts_with("differs\tsub/changed.txt"),
            "{found:?}"
        );
        assert!(found[1].starts_with("missing\tgone.txt"), "{found:?}");
        assert_eq!(found[2], "extra\textra.txt");
        assert_eq!(m.remove_others(&list), 1);
        assert!(!m.dir.join("extra.txt").exists());
    }
}
