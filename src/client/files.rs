//! Files the client commands keep: written atomically and durably, so that a crash — even
//! SIGKILL or a power cut — leaves the old file or the new one, never a mix. Used by the state
//! files of `publish --scan` and `subscribe`, and by the mirror's resources.

use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The folder a file is in (`.` for a bare name).
pub fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The temporary file written before the rename: hidden, beside the target, named after it.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    folder_of(path).join(format!(".{name}.changehub-tmp"))
}

/// Writes `bytes` to a temporary file beside `path`, syncs it, renames it to `path` and syncs
/// the folder. Only the owner may read it (a state file may hold a secret).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temp = temp_path(path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temp, path)?;
    sync_folder(&folder_of(path))
}

/// Makes renames and removals in `dir` durable.
pub fn sync_folder(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Fails unless a file can be written at `path` (checked before anything is done that the
/// file would have to record).
pub fn check_writable(path: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        path.file_name().is_some(),
        "{} does not name a file",
        path.display()
    );
    let folder = folder_of(path);
    let probe = temp_path(path);
    std::fs::write(&probe, b"")
        .and_then(|()| std::fs::remove_file(&probe))
        .with_context(|| format!("cannot write {} (in {})", path.display(), folder.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_whole_and_only_for_the_owner() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert!(!temp_path(&path).exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{mode:o}");
        }
        assert!(check_writable(&path).is_ok());
        assert!(check_writable(&dir.path().join("missing/state.json")).is_err());
        assert_eq!(folder_of(Path::new("state.json")), PathBuf::from("."));
    }
}
