//! `changehub publish --scan DIR`: a folder as a ResourceSync source. Each scan walks DIR,
//! compares it with the last scan recorded in the state file, and yields one change per file
//! that appeared (`created`), changed (`updated`) or went away (`deleted`) since.
//!
//! **Locations.** A file's `loc` is the base URL joined with its path relative to DIR, each
//! segment percent-encoded ([`loc_of`]); [`relative_path`] inverts it, so that a mirror can
//! tell where a `loc` goes.
//!
//! **What is compared.** A file whose size and modification time are those recorded is taken
//! as unchanged without reading it (as `rsync` does); otherwise it is hashed (`md5` and
//! `sha-256`), and only a different hash makes an `updated`. Each change carries `hash`,
//! `length`, `lastmod` (the mtime, to the second) and `type` (from the extension, when known).
//!
//! **What is skipped.** Hidden entries (a name starting with `.`, files and folders alike:
//! editors' swap files, `rsync`'s and our own temporary files, `.git`); symbolic links, which
//! are not followed (they may lead out of DIR or into a loop); anything that is not a regular
//! file or a folder; names that are not UTF-8 (with a warning); the state file itself when it
//! lies inside DIR.
//!
//! **Crash safety.** The state file is rewritten — temporary file, fsync, rename, fsync of the
//! folder — after each request the hub accepted, recording exactly the files of that request.
//! Each request's `Idempotency-Key` is derived from the state it starts from (a chain of
//! digests kept in the state file) and its bytes: a run killed after the hub accepted a
//! request but before it was recorded sends the very same request again when rerun (same
//! state, same files), and the hub answers it without appending it twice.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;
use time::OffsetDateTime;
use url::Url;

use super::files;
use super::hash::Hasher;
use crate::model::{ChangeType, NewChange};

/// The state file: what the last scan saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct State {
    pub version: u32,
    pub channel: String,
    pub base_url: String,
    /// Digest of every request recorded so far, chained: the next request's key derives from it.
    pub chain: String,
    /// Files by relative path (`/`-separated).
    pub files: BTreeMap<String, FileState>,
}

/// What the state records of one file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileState {
    pub size: u64,
    /// Modification time, nanoseconds since 1970.
    pub mtime_ns: i128,
    /// `md5:… sha-256:…`
    pub hash: String,
}

/// One change a scan found, with what to record once the hub has it.
#[derive(Debug, Clone)]
pub struct Pending {
    pub path: String,
    /// The change as one NDJSON line.
    pub line: Vec<u8>,
    /// The file's new record; `None` for a deletion.
    pub record: Option<FileState>,
}

/// The outcome of comparing DIR with the state.
#[derive(Debug)]
pub struct Scan {
    /// Changes to publish, by path.
    pub pending: Vec<Pending>,
    /// Files whose mtime moved but whose bytes did not: recorded without publishing.
    pub touched: Vec<(String, FileState)>,
    /// Regular files seen.
    pub files: usize,
}

/// The base URL as a folder (with its final `/`); refuses what cannot be a source's base.
pub fn parse_base(base: &str) -> anyhow::Result<Url> {
    let mut url = Url::parse(base).with_context(|| format!("--base-url {base:?} is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        bail!("--base-url {base:?} must be an http or https URL with a host");
    }
    if url.query().is_some() || url.fragment().is_some() {
        bail!("--base-url {base:?} must have no query (?…) or fragment (#…)");
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

/// The `loc` of the file at `relative` (`/`-separated) under `base` (from [`parse_base`]):
/// each segment percent-encoded, so `a b/c#1.txt` becomes `…/a%20b/c%231.txt`.
pub fn loc_of(base: &Url, relative: &str) -> String {
    let mut url = base.clone();
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().extend(relative.split('/'));
    }
    url.into()
}

/// The inverse of [`loc_of`]: the relative path a `loc` under `base` stands for, or `None`
/// when it is not under `base` or would not be a plain relative path (empty, `.` or `..`
/// segments, a `/` or NUL inside a segment).
pub fn relative_path(base: &Url, loc: &str) -> Option<String> {
    let rest = loc.strip_prefix(base.as_str())?;
    if rest.is_empty() || rest.contains(['?', '#']) {
        return None;
    }
    let mut out = Vec::new();
    for segment in rest.split('/') {
        let decoded = percent_encoding::percent_decode_str(segment)
            .decode_utf8()
            .ok()?;
        if decoded.is_empty() || decoded == "." || decoded == ".." || decoded.contains(['/', '\0'])
        {
            return None;
        }
        out.push(decoded.into_owned());
    }
    Some(out.join("/"))
}

/// Reads the state file; a missing one is an empty state for `channel` and `base`. A state
/// written for another channel or base URL is refused: its paths would be published as
/// the wrong locations.
pub fn load_state(path: &Path, channel: &str, base: &Url) -> anyhow::Result<State> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(State {
                version: 1,
                channel: channel.into(),
                base_url: base.to_string(),
                chain: String::new(),
                files: BTreeMap::new(),
            })
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let state: State = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a scan state file", path.display()))?;
    if state.version != 1 {
        bail!(
            "{}: state version {} is not known here",
            path.display(),
            state.version
        );
    }
    if state.channel != channel || state.base_url != base.as_str() {
        bail!(
            "{} records channel {:?} and --base-url {}, not {channel:?} and {base}: give another \
             --state file (a new one publishes every file as created)",
            path.display(),
            state.channel,
            state.base_url
        );
    }
    Ok(state)
}

/// Writes the state atomically and durably ([`files::write_atomically`]): a crash leaves
/// either the old state or the new one.
pub fn save_state(path: &Path, state: &State) -> anyhow::Result<()> {
    let mut bytes = serde_json::to_vec(state)?;
    bytes.push(b'\n');
    files::write_atomically(path, &bytes)
        .with_context(|| format!("writing the state file {}", path.display()))
}

/// Fails unless the state file can be written: checked before anything is published, so
/// that a bad `--state` does not publish changes it cannot record.
pub fn check_writable(path: &Path) -> anyhow::Result<()> {
    files::check_writable(path).with_context(|| format!("--state {}", path.display()))
}

/// Compares `dir` with `state`. `skip` is a path never to publish (the state file); `hashed`
/// counts the files read so far (for a progress display).
pub fn scan(
    dir: &Path,
    base: &Url,
    state: &State,
    skip: Option<&Path>,
    hashed: &AtomicU64,
) -> anyhow::Result<Scan> {
    let meta = std::fs::metadata(dir).with_context(|| format!("--scan {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("--scan {} is not a folder", dir.display());
    }
    let skip = skip.and_then(|p| std::fs::canonicalize(p).ok());
    let mut found = BTreeMap::new();
    walk(dir, "", skip.as_deref(), &mut found)?;
    let mut out = Scan {
        pending: Vec::new(),
        touched: Vec::new(),
        files: found.len(),
    };
    for (path, (full, size, mtime)) in &found {
        let before = state.files.get(path);
        if before.is_some_and(|b| b.size == *size && b.mtime_ns == nanos(*mtime)) {
            continue;
        }
        let Some((hash, length)) = hash_file(full)? else {
            continue; // gone since it was listed
        };
        hashed.fetch_add(1, Ordering::Relaxed);
        let record = FileState {
            size: length,
            mtime_ns: nanos(*mtime),
            hash,
        };
        let change = match before {
            Some(b) if b.hash == record.hash => {
                out.touched.push((path.clone(), record));
                continue;
            }
            Some(_) => ChangeType::Updated,
            None => ChangeType::Created,
        };
        let new = NewChange {
            loc: loc_of(base, path),
            change,
            datetime: None,
            lastmod: lastmod(*mtime),
            hash: Some(record.hash.clone()),
            length: Some(record.size),
            media_type: mime_guess::from_path(path).first_raw().map(Into::into),
            links: Vec::new(),
            source: None,
        };
        out.pending.push(pending(path, new, Some(record))?);
    }
    for path in state.files.keys().filter(|p| !found.contains_key(*p)) {
        let new = NewChange {
            loc: loc_of(base, path),
            change: ChangeType::Deleted,
            datetime: None,
            lastmod: None,
            hash: None,
            length: None,
            media_type: None,
            links: Vec::new(),
            source: None,
        };
        out.pending.push(pending(path, new, None)?);
    }
    out.pending.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The key of a request that starts from `chain` with `body`; also the chain once it is
/// recorded.
pub fn chain_key(channel: &str, chain: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(channel.as_bytes());
    h.update([0]);
    h.update(chain.as_bytes());
    h.update([0]);
    h.update(body);
    format!("scan-{}", &hex::encode(h.finalize())[..40])
}

/// Records in `state` the files of `pending` as the hub now has them.
pub fn record(state: &mut State, pending: &[Pending], key: &str) {
    for p in pending {
        match &p.record {
            Some(r) => state.files.insert(p.path.clone(), r.clone()),
            None => state.files.remove(&p.path),
        };
    }
    state.chain = key.to_string();
}

fn pending(path: &str, new: NewChange, record: Option<FileState>) -> anyhow::Result<Pending> {
    new.validate()
        .with_context(|| format!("{path}: cannot be published as {}", new.loc))?;
    Ok(Pending {
        path: path.to_string(),
        line: serde_json::to_vec(&new)?,
        record,
    })
}

type Found = BTreeMap<String, (PathBuf, u64, SystemTime)>;

fn walk(dir: &Path, prefix: &str, skip: Option<&Path>, found: &mut Found) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let full = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            eprintln!("skipping {}: its name is not UTF-8", full.display());
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        // The entry's own type: a symbolic link is not followed.
        let meta = match std::fs::symlink_metadata(&full) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", full.display())),
        };
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if meta.is_dir() {
            walk(&full, &relative, skip, found)?;
        } else if meta.is_file() {
            if skip.is_some_and(|s| std::fs::canonicalize(&full).is_ok_and(|f| f == s)) {
                continue;
            }
            let mtime = meta
                .modified()
                .with_context(|| format!("{}: no modification time", full.display()))?;
            found.insert(relative, (full, meta.len(), mtime));
        }
    }
    Ok(())
}

/// `md5:… sha-256:…` and the length of a file's bytes, read once; `None` when it is gone.
fn hash_file(path: &Path) -> anyhow::Result<Option<(String, u64)>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut hasher = Hasher::default();
    let mut buf = vec![0; 256 << 10];
    let mut length = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        length += n as u64;
    }
    Ok(Some((hasher.finish(), length)))
}

fn nanos(t: SystemTime) -> i128 {
    OffsetDateTime::from(t).unix_timestamp_nanos()
}

/// The mtime as `lastmod`, to the second.
fn lastmod(t: SystemTime) -> Option<OffsetDateTime> {
    OffsetDateTime::from(t).replace_nanosecond(0).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locs_are_encoded_per_segment_and_invert() {
        let base = parse_base("http://example.com/files").unwrap();
        assert_eq!(base.as_str(), "http://example.com/files/");
        for (path, loc) in [
            ("a.txt", "http://example.com/files/a.txt"),
            ("sub/a b.txt", "http://example.com/files/sub/a%20b.txt"),
            (
                "x/50%?#.html",
                "http://example.com/files/x/50%25%3F%23.html",
            ),
            (
                "é/back\\slash",
                "http://example.com/files/%C3%A9/back%5Cslash",
            ),
        ] {
            assert_eq!(loc_of(&base, path), loc, "{path}");
            assert_eq!(relative_path(&base, loc).as_deref(), Some(path), "{loc}");
        }
        assert_eq!(relative_path(&base, "http://example.com/other/a"), None);
        assert_eq!(
            relative_path(&base, "http://example.com/files/a/../b"),
            None
        );
        assert_eq!(relative_path(&base, "http://example.com/files/a%2Fb"), None);
        assert_eq!(relative_path(&base, "http://example.com/files/a//b"), None);
        for bad in [
            "not a url",
            "ftp://example.com/",
            "http://e.com/?q",
            "file:///tmp/",
        ] {
            assert!(parse_base(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scans_find_created_updated_deleted_and_skip_hidden_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), "abc").unwrap();
        std::fs::write(root.join("sub/b.html"), "<p>").unwrap();
        std::fs::write(root.join(".a.txt.swp"), "x").unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/HEAD"), "x").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(root.join("a.txt"), root.join("link.txt")).unwrap();
        let base = parse_base("http://example.com/").unwrap();
        let mut state = load_state(&root.join("none.json"), "news", &base).unwrap();
        let first = scan(root, &base, &state, None, &AtomicU64::new(0)).unwrap();
        let paths: Vec<_> = first.pending.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["a.txt", "sub/b.html"]);
        let line: serde_json::Value = serde_json::from_slice(&first.pending[0].line).unwrap();
        assert_eq!(line["change"], "created");
        assert_eq!(line["length"], 3);
        assert_eq!(line["type"], "text/plain");
        assert_eq!(
            line["hash"],
            "md5:900150983cd24fb0d6963f7d28e17f72 \
             sha-256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let key = chain_key("news", &state.chain, b"body");
        record(&mut state, &first.pending, &key);
        assert!(scan(root, &base, &state, None, &AtomicU64::new(0))
            .unwrap()
            .pending
            .is_empty());

        std::fs::write(root.join("a.txt"), "abcd").unwrap();
        std::fs::remove_file(root.join("sub/b.html")).unwrap();
        std::fs::write(root.join("c.txt"), "c").unwrap();
        let second = scan(root, &base, &state, None, &AtomicU64::new(0)).unwrap();
        let kinds: Vec<_> = second
            .pending
            .iter()
            .map(|p| {
                let v: serde_json::Value = serde_json::from_slice(&p.line).unwrap();
                format!("{} {}", p.path, v["change"].as_str().unwrap())
            })
            .collect();
        assert_eq!(
            kinds,
            ["a.txt updated", "c.txt created", "sub/b.html deleted"]
        );
        assert_ne!(chain_key("news", &key, b"body"), key, "keys move on");
    }
}
