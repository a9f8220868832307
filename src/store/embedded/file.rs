//! The database file as redb sees it: redb's own [`FileBackend`], behind a switch that makes
//! every write fail as on a full disk. The switch ([`DiskFull`]) is off in the hub; tests turn
//! it on to break the store through the same path a real full disk takes, on machines where
//! they cannot fill a real one.

use redb::backends::FileBackend;
use redb::{BackendError, Builder, Database, DatabaseError, StorageBackend};
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A switch that makes the store's disk look full: writes fail with "No space left on device".
#[derive(Debug, Default)]
pub struct DiskFull(AtomicBool);

impl DiskFull {
    #[cfg(test)]
    pub fn set(&self, full: bool) {
        self.0.store(full, Ordering::SeqCst);
    }

    /// Fails as a full disk does while the switch is on.
    pub fn check(&self) -> io::Result<()> {
        if self.0.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(28)); // ENOSPC
        }
        Ok(())
    }
}

/// Opens (or creates) the database file at `path`, caching at most `cache` bytes of it.
pub fn open(path: &Path, full: &Arc<DiskFull>, cache: usize) -> Result<Database, DatabaseError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let backend = Backend {
        file: FileBackend::new(file)?,
        full: full.clone(),
    };
    Builder::new()
        .set_cache_size(cache)
        .create_with_backend(backend)
}

#[derive(Debug)]
struct Backend {
    file: FileBackend,
    full: Arc<DiskFull>,
}

impl StorageBackend for Backend {
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.full.check()?;
        self.file.write(offset, data)
    }

    fn close(&self) -> io::Result<()> {
        self.file.close()
    }

    // The locks (one process per file) are the file's.

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}

/// How much the disk must take before the store is reopened (the probe written and removed).
const ROOM: usize = 1 << 20;

/// Whether the disk of `dir` takes writes again: writes [`ROOM`] bytes to a probe file, syncs
/// and removes it. Cheaper than reopening the database, which reads the whole file to repair it.
pub fn has_room(dir: &Path, full: &DiskFull) -> io::Result<()> {
    full.check()?;
    let probe = dir.join("changehub.space-probe");
    let written = std::fs::File::create(&probe).and_then(|mut f| {
        std::io::Write::write_all(&mut f, &vec![0u8; ROOM])?;
        f.sync_data()
    });
    let _ = std::fs::remove_file(&probe);
    written
}
