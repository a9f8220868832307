//! One dump package: the resources fetched, the ZIP and its manifest written.
//!
//! Fetching goes through the hub's outbound client (no redirects; unless
//! `--allow-private-callbacks`, no loopback, private or link-local address, checked for IP
//! literals here and for names by the client's resolver), at most `concurrency` at a time,
//! in the order of the manifest. A resource is left out of the package (and counted as
//! skipped) when its fetch fails after [`ATTEMPTS`] tries (transport errors, 5xx and 429 are
//! retried; other statuses are not), when it is larger than `max_resource_bytes`, when the
//! package would pass `max_dump_bytes`, or when the change carries a `hash` or `length` the
//! bytes do not match. The package is written by a blocking thread into a temporary file,
//! synced, and renamed into place; so is the copy of the manifest.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;

use super::{manifest_file, package_file, DumpError};
use crate::config::Config;
use crate::model::{hash, Change, ChangeType, DumpSettings};
use crate::resourcesync::{self, ChangeListHeader, DocLink, ManifestEntry};

/// Tries per resource.
pub const ATTEMPTS: usize = 3;

/// What a package came to.
#[derive(Debug, Clone)]
pub struct Made {
    /// The channel's seqs it covers.
    pub range: (u64, u64),
    /// Bytes of the ZIP, and its `hash` (`md5:… sha-256:…`).
    pub length: u64,
    pub hash: String,
    /// Bitstreams in it, and changes whose bitstream was left out.
    pub resources: usize,
    pub skipped: u64,
}

/// The last change of each `loc` among `changes`, in seq order.
pub fn latest_per_loc(changes: &[Change]) -> Vec<&Change> {
    let mut last: HashMap<&str, u64> = HashMap::new();
    for c in changes {
        last.insert(&c.loc, c.seq);
    }
    changes
        .iter()
        .filter(|c| last.get(c.loc.as_str()) == Some(&c.seq))
        .collect()
}

/// The path of a change's bitstream in the package: `/changes/SEQ-NAME`, NAME the last
/// segment of the `loc`'s path with anything but `[A-Za-z0-9._-]` replaced by `_` and no
/// leading dot (so never `..`, never absolute, never a folder of its own).
pub fn path_for(change: &Change) -> String {
    let last_segment = url::Url::parse(&change.loc)
        .ok()
        .and_then(|u| {
            u.path_segments()
                .and_then(|mut s| s.next_back().map(str::to_string))
        })
        .unwrap_or_default();
    let decoded = percent_encoding::percent_decode_str(&last_segment)
        .decode_utf8_lossy()
        .to_string();
    let mut name: String = decoded
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    while name.starts_with('.') {
        name.replace_range(..1, "_");
    }
    if name.is_empty() {
        name.push_str("resource");
    }
    format!("/changes/{}-{name}", change.seq)
}

/// Why a resource was left out.
type Skip = String;

/// Fetches one resource: 2xx only, at most `max` bytes, `hash`/`length` checked.
async fn fetch(
    client: &reqwest::Client,
    allow_private: bool,
    change: &Change,
    max: u64,
) -> Result<(Bytes, Option<String>), Skip> {
    let url = url::Url::parse(&change.loc).map_err(|e| format!("loc: {e}"))?;
    crate::net::check_target(&url, allow_private).map_err(|e| e.to_string())?;
    let mut delay = Duration::from_millis(200);
    let mut attempt = 1;
    loop {
        match fetch_once(client, &url, max).await {
            Ok((bytes, media_type)) => {
                hash::check_change(change, &bytes)?;
                return Ok((bytes, media_type));
            }
            Err((why, transient)) if transient && attempt < ATTEMPTS => {
                tracing::debug!(loc = %change.loc, attempt, error = %why, "fetch for a Change Dump failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 4;
                attempt += 1;
            }
            Err((why, _)) => return Err(why),
        }
    }
}

/// [`fetch`] of a deletion (nothing to fetch: `None`) or of a resource, owning its inputs.
async fn fetch_owned(
    client: reqwest::Client,
    allow_private: bool,
    change: Change,
    max: u64,
) -> Option<Result<(Bytes, Option<String>), Skip>> {
    match change.change {
        ChangeType::Deleted => None,
        _ => Some(fetch(&client, allow_private, &change, max).await),
    }
}

/// One GET; the error says whether trying again may help.
async fn fetch_once(
    client: &reqwest::Client,
    url: &url::Url,
    max: u64,
) -> Result<(Bytes, Option<String>), (String, bool)> {
    let mut response = client
        .get(url.clone())
        .send()
        .await
        .map_err(|e| (format!("request: {e}"), true))?;
    let status = response.status();
    if !status.is_success() {
        let transient = status.is_server_error() || status.as_u16() == 429;
        return Err((format!("status {status}"), transient));
    }
    if response.content_length().is_some_and(|n| n > max) {
        return Err((format!("larger than {max} bytes"), false));
    }
    let media_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|t| crate::net::media::essence(t).into_owned())
        .filter(|t| !t.is_empty());
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| (format!("body: {e}"), true))?
    {
        if body.len() as u64 + chunk.len() as u64 > max {
            return Err((format!("larger than {max} bytes"), false));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((Bytes::from(body), media_type))
}

/// What the writer thread is given, in manifest order.
enum Piece {
    Bitstream { path: String, bytes: Bytes },
    Manifest(Vec<u8>),
}

/// Fetches the resources of `changes` and writes the package of `range` into `folder`.
pub async fn make(
    client: &reqwest::Client,
    config: &Config,
    channel: &str,
    settings: &DumpSettings,
    folder: &Path,
    range: (u64, u64),
    changes: &[Change],
) -> Result<Made, DumpError> {
    std::fs::create_dir_all(folder)?;
    let name = package_file(range.0, range.1);
    let tmp = folder.join(format!(".{name}.tmp"));
    let (tx, rx) = tokio::sync::mpsc::channel::<Piece>(2);
    let writer = {
        let tmp = tmp.clone();
        tokio::task::spawn_blocking(move || write_zip(&tmp, rx))
    };

    let latest: Vec<Change> = latest_per_loc(changes).into_iter().cloned().collect();
    let allow_private = config.allow_private_callbacks;
    let max = settings.max_resource_bytes;
    let jobs: Vec<(reqwest::Client, Change)> =
        latest.iter().map(|c| (client.clone(), c.clone())).collect();
    let mut fetched = futures_util::stream::iter(jobs)
        .map(move |(client, c)| fetch_owned(client, allow_private, c, max))
        .buffered(settings.concurrency.max(1));

    let mut entries = Vec::with_capacity(latest.len());
    let mut total: u64 = 0;
    let mut skipped = 0u64;
    let mut resources = 0usize;
    let mut i = 0;
    while let Some(result) = fetched.next().await {
        let c = &latest[i];
        i += 1;
        let mut entry = ManifestEntry {
            loc: c.loc.clone(),
            lastmod: c.lastmod.unwrap_or(c.datetime),
            change: c.change,
            datetime: Some(c.datetime),
            hash: None,
            length: None,
            media_type: None,
            path: None,
            seq: Some(c.seq),
        };
        match result {
            None => {}
            Some(Ok((bytes, media_type))) => {
                if total + bytes.len() as u64 > settings.max_dump_bytes {
                    tracing::warn!(%channel, loc = %c.loc, "left out of a Change Dump: the dump would pass its size limit");
                    skipped += 1;
                    continue;
                }
                total += bytes.len() as u64;
                let path = path_for(c);
                entry.hash = Some(hash::of(&bytes));
                entry.length = Some(bytes.len() as u64);
                entry.media_type = c.media_type.as_deref().map(String::from).or(media_type);
                entry.path = Some(path.clone());
                resources += 1;
                if tx.send(Piece::Bitstream { path, bytes }).await.is_err() {
                    break;
                }
            }
            Some(Err(why)) => {
                tracing::warn!(%channel, loc = %c.loc, seq = c.seq, reason = %why, "left out of a Change Dump");
                skipped += 1;
                continue;
            }
        }
        entries.push(entry);
    }
    drop(fetched);
    let header = ChangeListHeader {
        from: changes.first().map(|c| c.datetime),
        until: changes.last().map(|c| c.datetime),
        links: vec![DocLink::new("up", config.urls.capability_list(channel))],
        seq_range: Some(range),
        epoch: None,
    };
    let manifest = resourcesync::write_change_dump_manifest(&header, &entries);
    let _ = tx.send(Piece::Manifest(manifest.clone())).await;
    drop(tx);
    let (length, zip_hash) = writer.await.map_err(|e| DumpError::Zip(e.to_string()))??;
    let folder_owned = folder.to_path_buf();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        write_atomically(&folder_owned, &manifest_file(range.0, range.1), &manifest)?;
        std::fs::rename(&tmp, folder_owned.join(&name))?;
        File::open(&folder_owned)?.sync_all()
    })
    .await
    .map_err(|e| DumpError::Io(std::io::Error::other(e.to_string())))??;
    Ok(Made {
        range,
        length,
        hash: zip_hash,
        resources,
        skipped,
    })
}

/// The writer thread: every piece into the ZIP at `tmp`, then synced; returns its length and
/// hash. The manifest must come (it is the last piece); without it nothing is made.
fn write_zip(
    tmp: &Path,
    mut rx: tokio::sync::mpsc::Receiver<Piece>,
) -> Result<(u64, String), DumpError> {
    use zip::write::SimpleFileOptions;
    let zip_err = |e: zip::result::ZipError| DumpError::Zip(e.to_string());
    let file = File::create(tmp)?;
    let mut zip = zip::ZipWriter::new(file);
    let deflated = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    let mut manifest_seen = false;
    while let Some(piece) = rx.blocking_recv() {
        match piece {
            Piece::Bitstream { path, bytes } => {
                zip.start_file(path.trim_start_matches('/'), deflated)
                    .map_err(zip_err)?;
                zip.write_all(&bytes)?;
            }
            Piece::Manifest(bytes) => {
                zip.start_file("manifest.xml", deflated).map_err(zip_err)?;
                zip.write_all(&bytes)?;
                manifest_seen = true;
            }
        }
    }
    if !manifest_seen {
        drop(zip);
        let _ = std::fs::remove_file(tmp);
        return Err(DumpError::Zip("the dump was abandoned".into()));
    }
    let file = zip.finish().map_err(zip_err)?;
    file.sync_all()?;
    drop(file);
    let mut hasher = hash::Hasher::default();
    let mut length = 0u64;
    let mut file = File::open(tmp)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        length += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((length, hasher.finish()))
}

/// Writes `name` in `folder` through a synced temporary file and a rename.
fn write_atomically(folder: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = folder.join(format!(".{name}.tmp"));
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, folder.join(name))
}

/// Deletes the dump files in `folder` whose names `keep` does not hold (temporary files
/// included); returns how many.
pub fn remove_unlisted(folder: &Path, keep: &HashSet<String>) -> std::io::Result<usize> {
    let entries = match std::fs::read_dir(folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        let ours =
            name.ends_with(".zip") || name.ends_with(".manifest.xml") || name.ends_with(".tmp");
        if ours && !keep.contains(&name) && entry.file_type()?.is_file() {
            std::fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::parse_w3c_datetime;

    fn change(seq: u64, loc: &str, kind: ChangeType) -> Change {
        Change {
            seq,
            loc: loc.into(),
            change: kind,
            datetime: parse_w3c_datetime("2026-01-01T00:00:00Z").unwrap(),
            lastmod: None,
            hash: None,
            length: None,
            media_type: None,
            links: vec![],
            source: None,
            conflicts: 0,
        }
    }

    #[test]
    fn paths_are_safe_and_unique() {
        for (loc, path) in [
            ("http://e/a/b.txt", "/changes/7-b.txt"),
            ("http://e/a/..", "/changes/7-resource"),
            ("http://e/%2e%2e", "/changes/7-resource"),
            ("http://e/..%2F", "/changes/7-_._"),
            ("http://e/", "/changes/7-resource"),
            ("http://e/x%2F..%2Fy", "/changes/7-x_.._y"),
            ("http://e/.hidden", "/changes/7-_hidden"),
            ("http://e/caf%C3%A9 1.html?q=1", "/changes/7-caf__1.html"),
        ] {
            assert_eq!(
                path_for(&change(7, loc, ChangeType::Created)),
                path,
                "{loc}"
            );
        }
    }

    #[test]
    fn only_the_last_change_of_a_loc_counts() {
        let changes = [
            change(1, "http://e/a", ChangeType::Created),
            change(2, "http://e/b", ChangeType::Created),
            change(3, "http://e/a", ChangeType::Updated),
            change(4, "http://e/b", ChangeType::Deleted),
        ];
        let seqs: Vec<u64> = latest_per_loc(&changes).iter().map(|c| c.seq).collect();
        assert_eq!(seqs, vec![3, 4]);
    }
}
