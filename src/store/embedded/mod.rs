//! The embedded store: one redb file in the data folder, crash-safe (copy-on-write B-trees,
//! fsync on commit), no server to install.
//!
//! Appends and delivery-state updates go through one writer thread that takes every write
//! waiting in its queue and commits them in one write transaction (group commit): concurrent
//! sources share an fsync, and a thousand workers reporting deliveries share one transaction.
//! A commit holding only delivery state is not fsynced ([`Durability::None`]): it becomes
//! durable with the next durable commit, and losing it in a crash only means a notification is
//! delivered again — which at-least-once delivery allows. Rare writes (subscriptions,
//! trimming) use their own short transactions.
//!
//! The resource index (`index.rs`) and the FeedSync items (`feedsync.rs`) are written by the
//! same transaction as the log.
//!
//! The database sits behind a `Handle` (`handle.rs`): the first I/O error closes it (a full
//! disk makes writes [`StoreError::Full`]), and the writer thread opens it again once the disk
//! takes writes again. `file.rs` is the file backend, with the switch tests use to fill the disk.

use async_trait::async_trait;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, Table, TableDefinition, WriteTransaction,
};
use serde::{Deserialize, Serialize};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use time::OffsetDateTime;
use tokio::sync::{oneshot, watch};

use super::{
    new_epoch, Appended, ChannelHead, IdempotencyKey, Origin, ResourcePage, Store, StoreError,
    SyncPage, IDEMPOTENCY_TTL,
};
use crate::model::feedsync::{MergedChange, Synced};
use crate::model::{Change, ChannelSpec, DeliveryState, NewChange, Retention, Subscription};

const CHANGES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("changes");
const CHANNELS: TableDefinition<&str, &[u8]> = TableDefinition::new("channels");
const IDEMPOTENCY: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("idempotency");
const SUBSCRIPTIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("subscriptions");
const DELIVERY: TableDefinition<&str, &[u8]> = TableDefinition::new("delivery");
/// Channels created at runtime: name → their settings (JSON).
const CHANNEL_SPECS: TableDefinition<&str, &[u8]> = TableDefinition::new("channel-specs");

mod bridges;
mod feedsync;
mod file;
mod handle;
mod index;
use file::DiskFull;
use handle::Handle;
use index::IndexWriter;

/// Bytes of the database file cached in memory by [`EmbeddedStore::open`]; `changehub serve`
/// gives the store half of `--cache-size` instead (128 MiB by default).
pub const DEFAULT_CACHE: usize = 128 << 20;

/// Most appends committed in one transaction.
const MAX_GROUP: usize = 256;
/// Most delivery states in one transaction (see [`commit_deliveries`]).
const STATE_CHUNK: usize = 128;

/// Per-channel bookkeeping kept beside the log.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChannelMeta {
    oldest: u64,
    last: u64,
    #[serde(default, with = "time::serde::rfc3339::option")]
    last_datetime: Option<OffsetDateTime>,
    /// How many resources the index describes.
    #[serde(default)]
    resources: u64,
    /// False for a channel written before the resource index existed (built at open).
    #[serde(default)]
    indexed: bool,
    /// When the channel began (see `Store::origin`).
    #[serde(default, with = "time::serde::rfc3339::option")]
    created: Option<OffsetDateTime>,
    /// The epoch of the log (see `Store::origin`).
    #[serde(default)]
    epoch: Option<String>,
}

impl Default for ChannelMeta {
    fn default() -> Self {
        ChannelMeta {
            oldest: 1,
            last: 0,
            last_datetime: None,
            resources: 0,
            indexed: true,
            created: None,
            epoch: None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct IdempotencyRecord {
    fingerprint: String,
    appended: Appended,
    #[serde(with = "time::serde::rfc3339")]
    at: OffsetDateTime,
}

struct AppendJob {
    channel: String,
    changes: Vec<NewChange>,
    idempotency: Option<IdempotencyKey>,
    now: OffsetDateTime,
    reply: oneshot::Sender<Result<Appended, StoreError>>,
}

/// Delivery-state updates (subscription id, encoded state): frequent, so they come in
/// batches (see `fanout::progress`) and are committed after the appends waiting with them.
struct DeliveryJob {
    states: Vec<(String, Vec<u8>)>,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

/// What the writer thread commits.
enum WriteJob {
    Append(AppendJob),
    Delivery(DeliveryJob),
}

pub struct EmbeddedStore {
    handle: Arc<Handle>,
    /// `None` only while dropping.
    writes: Option<std_mpsc::Sender<WriteJob>>,
    writer: Option<std::thread::JoinHandle<()>>,
    heads: Heads,
}

/// The head of every watched channel (see `Store::watch_head`).
type Heads = Arc<Mutex<HashMap<String, watch::Sender<u64>>>>;

impl Drop for EmbeddedStore {
    /// Stops the writer thread and waits for it, so that the database file is closed when the
    /// store is dropped and can be opened again at once.
    fn drop(&mut self) {
        self.writes.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// A redb error (or an I/O error of the data folder) as a store error: a full disk is
/// [`StoreError::Full`], another I/O error [`StoreError::Io`] — both break the store until it
/// is reopened (`handle.rs`) — and anything else [`StoreError::Unavailable`].
fn failed(e: impl Into<redb::Error>) -> StoreError {
    metrics::counter!("changehub_store_errors_total").increment(1);
    match e.into() {
        redb::Error::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ) =>
        {
            StoreError::Full(e.to_string())
        }
        redb::Error::Io(e) => StoreError::Io(e.to_string()),
        redb::Error::PreviousIo => StoreError::Io("previous I/O error".into()),
        e => StoreError::Unavailable(e.to_string()),
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir`, with the default cache.
    pub fn open(dir: &Path) -> Result<EmbeddedStore, StoreError> {
        EmbeddedStore::open_with(dir, Arc::default(), DEFAULT_CACHE)
    }

    /// Opens (or creates) the store in `dir`, keeping at most `cache` bytes of its file in
    /// memory (half of `--cache-size`): what bounds the hub's memory as the log grows.
    pub fn open_with_cache(dir: &Path, cache: usize) -> Result<EmbeddedStore, StoreError> {
        EmbeddedStore::open_with(dir, Arc::default(), cache)
    }

    /// Opens the store with a switch that makes its disk look full (tests).
    fn open_with(
        dir: &Path,
        full: Arc<DiskFull>,
        cache: usize,
    ) -> Result<EmbeddedStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(failed)?;
        let handle = Arc::new(Handle::open(dir, full, cache)?);
        let heads: Heads = Arc::default();
        let (tx, rx) = std_mpsc::channel();
        let writer_handle = handle.clone();
        let writer_heads = heads.clone();
        let writer = std::thread::Builder::new()
            .name("changehub-writer".into())
            .spawn(move || writer_loop(&writer_handle, rx, &writer_heads))
            .map_err(failed)?;
        Ok(EmbeddedStore {
            handle,
            writes: Some(tx),
            writer: Some(writer),
            heads,
        })
    }

    /// Hands a write to the writer thread.
    fn write(&self, job: WriteJob) -> Result<(), StoreError> {
        self.writes
            .as_ref()
            .and_then(|w| w.send(job).ok())
            .ok_or_else(|| StoreError::Unavailable("store closed".into()))
    }

    /// Runs `f` on a blocking thread with the database (`write`: `f` writes).
    async fn blocking<T: Send + 'static>(
        &self,
        write: bool,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let handle = self.handle.clone();
        tokio::task::spawn_blocking(move || {
            let db = handle.db(write)?;
            handle.check(f(&db), write)
        })
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))?
    }

    /// Reads on the caller's thread (for the few short reads of sync methods).
    fn read_now<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let db = self.handle.db(false)?;
        self.handle.check(f(&db), false)
    }
}

/// Stores `bytes` under `key` in a table of records keyed by name, in a transaction of its own.
fn put_record(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(failed)?;
    txn.open_table(table)
        .map_err(failed)?
        .insert(key, bytes)
        .map_err(failed)?;
    txn.commit().map_err(failed)
}

/// Every record of a table keyed by name, decoded.
fn all_records<T: for<'de> Deserialize<'de>>(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
) -> Result<Vec<T>, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let table = txn.open_table(table).map_err(failed)?;
    let mut out = Vec::new();
    for entry in table.iter().map_err(failed)? {
        let (_, v) = entry.map_err(failed)?;
        out.push(decode(v.value())?);
    }
    Ok(out)
}

fn channel_meta(db: &Database, channel: &str) -> Result<ChannelMeta, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let table = txn.open_table(CHANNELS).map_err(failed)?;
    match table.get(channel).map_err(failed)? {
        Some(v) => decode(v.value()),
        None => Ok(ChannelMeta::default()),
    }
}

/// The writer thread: takes every waiting write and commits the appends among them in one
/// fsynced transaction (group commit), then the delivery states in a second one that is not
/// fsynced, so that delivery bookkeeping never delays an append's answer. While the store is
/// broken it answers every write with the error at once, and tries to reopen the store every
/// [`handle::RETRY`]; once reopened, it tells every watched head where its log stands.
fn writer_loop(handle: &Handle, rx: std_mpsc::Receiver<WriteJob>, heads: &Heads) {
    loop {
        let first = match rx.recv_timeout(handle::RETRY) {
            Ok(job) => Some(job),
            Err(std_mpsc::RecvTimeoutError::Timeout) => None,
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        };
        if let Some(db) = handle.recover() {
            refresh_heads(&db, heads);
        }
        let Some(first) = first else { continue };
        let mut appends = Vec::new();
        let mut deliveries = Vec::new();
        let mut sort = |job| match job {
            WriteJob::Append(job) => appends.push(job),
            WriteJob::Delivery(job) => deliveries.push(job),
        };
        sort(first);
        for _ in 1..MAX_GROUP {
            match rx.try_recv() {
                Ok(job) => sort(job),
                Err(_) => break,
            }
        }
        if !appends.is_empty() {
            commit_appends(handle, heads, appends);
        }
        if !deliveries.is_empty() {
            commit_deliveries(handle, heads, &rx, deliveries);
        }
    }
}

/// Commits `jobs` in one durable transaction, moves the heads, answers each job.
fn commit_appends(handle: &Handle, heads: &Heads, mut jobs: Vec<AppendJob>) {
    let outcome = handle
        .db_for(true, jobs.len())
        .and_then(|db| handle.check(append_all(&db, &mut jobs), true));
    match outcome {
        Ok((new_heads, results)) => {
            {
                let heads = heads.lock().unwrap_or_else(|e| e.into_inner());
                for (channel, last) in new_heads {
                    if let Some(tx) = heads.get(&channel) {
                        tx.send_replace(last);
                    }
                }
            }
            for (job, result) in jobs.into_iter().zip(results) {
                let _ = job.reply.send(result);
            }
        }
        Err(e) => {
            log_failed_write(&e);
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}

/// Commits the states of `jobs` in transactions that are not fsynced, [`STATE_CHUNK`] states
/// each; a state whose subscription was deleted meanwhile is dropped. Between two chunks the
/// appends that came meanwhile are committed first (delivery states that came are written
/// after the rest), so an append waits for at most one chunk, not for a whole batch of states
/// (a batch holds one state per subscription served in the last [`crate::fanout::progress::EVERY`]).
fn commit_deliveries(
    handle: &Handle,
    heads: &Heads,
    rx: &std_mpsc::Receiver<WriteJob>,
    mut jobs: Vec<DeliveryJob>,
) {
    let mut outcome = Ok(());
    let mut next = 0;
    while next < jobs.len() {
        let states = std::mem::take(&mut jobs[next].states);
        for chunk in states.chunks(STATE_CHUNK) {
            if outcome.is_ok() {
                outcome = write_states(handle, chunk);
            }
            let mut appends = Vec::new();
            while let Ok(job) = rx.try_recv() {
                match job {
                    WriteJob::Append(job) => appends.push(job),
                    WriteJob::Delivery(job) => jobs.push(job),
                }
            }
            if !appends.is_empty() {
                commit_appends(handle, heads, appends);
            }
        }
        next += 1;
    }
    if let Err(e) = &outcome {
        log_failed_write(e);
    }
    for job in jobs {
        let _ = job.reply.send(outcome.clone());
    }
}

/// One transaction of delivery states (see [`commit_deliveries`]).
fn write_states(handle: &Handle, states: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
    let db = handle.db_for(true, 1)?;
    let write = || {
        let mut txn = db.begin_write().map_err(failed)?;
        txn.set_durability(Durability::None).map_err(failed)?;
        {
            let subs = txn.open_table(SUBSCRIPTIONS).map_err(failed)?;
            let mut table = txn.open_table(DELIVERY).map_err(failed)?;
            for (id, bytes) in states {
                if subs.get(id.as_str()).map_err(failed)?.is_some() {
                    table
                        .insert(id.as_str(), bytes.as_slice())
                        .map_err(failed)?;
                }
            }
        }
        txn.commit().map_err(failed)
    };
    handle.check(write(), true)
}

/// Logged by the handle when the store broke; any other error here is rare.
fn log_failed_write(e: &StoreError) {
    if !matches!(e, StoreError::Full(_) | StoreError::Io(_)) {
        tracing::error!(error = %e, "write transaction failed");
    }
}

/// The new heads, and one result per job.
type Committed = (HashMap<String, u64>, Vec<Result<Appended, StoreError>>);

/// Appends every job's changes in one durable write transaction (see [`writer_loop`]).
fn append_all(db: &Database, jobs: &mut [AppendJob]) -> Result<Committed, StoreError> {
    let txn = db.begin_write().map_err(failed)?;
    let mut new_heads = HashMap::new();
    let mut results = Vec::with_capacity(jobs.len());
    {
        let mut tables = AppendTables::open(&txn)?;
        for job in jobs.iter_mut() {
            let changes = std::mem::take(&mut job.changes);
            let result = append_in(&mut tables, job, changes);
            match &result {
                Ok(a) if !a.replayed => {
                    new_heads.insert(job.channel.clone(), a.last);
                }
                Err(StoreError::IdempotencyConflict) | Ok(_) => {}
                Err(e) => return Err(e.clone()),
            }
            results.push(result);
        }
        tables.finish()?;
    }
    txn.commit().map_err(failed)?;
    Ok((new_heads, results))
}

/// After a reopen: moves every watched head to the last seq of its log (a write answered with
/// an error may still have reached the file when the error came after the commit).
fn refresh_heads(db: &Database, heads: &Heads) {
    let heads = heads.lock().unwrap_or_else(|e| e.into_inner());
    for (channel, tx) in heads.iter() {
        if let Ok(meta) = channel_meta(db, channel) {
            tx.send_if_modified(|last| {
                let moved = meta.last > *last;
                *last = (*last).max(meta.last);
                moved
            });
        }
    }
}

/// The tables an append writes, opened once per write transaction (opening a table and
/// closing it again costs more than appending one change), and the meta of every channel
/// appended to, decoded once and written once per transaction: call [`AppendTables::finish`]
/// before committing.
pub(super) struct AppendTables<'txn> {
    idem: Table<'txn, (&'static str, &'static str), &'static [u8]>,
    meta: Table<'txn, &'static str, &'static [u8]>,
    log: Table<'txn, (&'static str, u64), &'static [u8]>,
    index: IndexWriter<'txn>,
    items: feedsync::SyncWriter<'txn>,
    metas: HashMap<String, ChannelMeta>,
}

impl<'txn> AppendTables<'txn> {
    pub(super) fn open(txn: &'txn WriteTransaction) -> Result<AppendTables<'txn>, StoreError> {
        Ok(AppendTables {
            idem: txn.open_table(IDEMPOTENCY).map_err(failed)?,
            meta: txn.open_table(CHANNELS).map_err(failed)?,
            log: txn.open_table(CHANGES).map_err(failed)?,
            index: IndexWriter::open(txn)?,
            items: feedsync::SyncWriter::open(txn)?,
            metas: HashMap::new(),
        })
    }

    /// Writes the meta of every channel appended to.
    pub(super) fn finish(mut self) -> Result<(), StoreError> {
        for (channel, meta) in &self.metas {
            self.meta
                .insert(channel.as_str(), encode(meta)?.as_slice())
                .map_err(failed)?;
        }
        Ok(())
    }
}

/// The meta of `channel` as this transaction has it so far: from `metas`, or read from
/// `table` into it.
fn meta_in<'m>(
    metas: &'m mut HashMap<String, ChannelMeta>,
    table: &Table<'_, &'static str, &'static [u8]>,
    channel: &str,
) -> Result<&'m mut ChannelMeta, StoreError> {
    Ok(match metas.entry(channel.to_string()) {
        Entry::Occupied(known) => known.into_mut(),
        Entry::Vacant(new) => new.insert(match table.get(channel).map_err(failed)? {
            Some(v) => decode::<ChannelMeta>(v.value())?,
            None => ChannelMeta::default(),
        }),
    })
}

/// Appends `changes` as `job` asks, in the transaction `tables` belong to. Nothing is written
/// when the answer is a replay or an idempotency conflict.
fn append_in(
    tables: &mut AppendTables<'_>,
    job: &AppendJob,
    changes: Vec<NewChange>,
) -> Result<Appended, StoreError> {
    let channel = job.channel.as_str();
    let AppendTables {
        idem,
        meta: meta_table,
        log,
        index,
        items,
        metas,
    } = tables;
    if let Some(key) = &job.idempotency {
        if let Some(v) = idem.get((channel, key.key.as_str())).map_err(failed)? {
            let record: IdempotencyRecord = decode(v.value())?;
            if record.at + IDEMPOTENCY_TTL > job.now {
                if record.fingerprint != key.fingerprint {
                    return Err(StoreError::IdempotencyConflict);
                }
                return Ok(Appended {
                    replayed: true,
                    ..record.appended
                });
            }
        }
    }
    let meta = meta_in(metas, meta_table, channel)?;
    let first = meta.last + 1;
    let accepted = changes.len();
    for new in changes {
        let seq = meta.last + 1;
        let wanted = new.datetime.unwrap_or(job.now);
        let datetime = match meta.last_datetime {
            Some(latest) if latest > wanted => latest,
            _ => wanted,
        };
        let mut change = Change::from_new(seq, new, datetime);
        change.conflicts = items.record(channel, &change)?;
        let json = encode(&change)?;
        log.insert((channel, seq), json.as_slice())
            .map_err(failed)?;
        if index.record(channel, &change, &json)? {
            meta.resources += 1;
        }
        meta.last = seq;
        meta.last_datetime = Some(datetime);
    }
    let appended = Appended {
        accepted,
        first,
        last: meta.last,
        replayed: false,
    };
    if let Some(key) = &job.idempotency {
        let record = IdempotencyRecord {
            fingerprint: key.fingerprint.clone(),
            appended,
            at: job.now,
        };
        idem.insert((channel, key.key.as_str()), encode(&record)?.as_slice())
            .map_err(failed)?;
    }
    Ok(appended)
}

fn read_range(
    db: &Database,
    channel: &str,
    from: u64,
    limit: usize,
) -> Result<Vec<Change>, StoreError> {
    let txn = db.begin_read().map_err(failed)?;
    let table = txn.open_table(CHANGES).map_err(failed)?;
    let mut out = Vec::with_capacity(limit.min(50_000));
    for entry in table
        .range((channel, from)..=(channel, u64::MAX))
        .map_err(failed)?
        .take(limit)
    {
        let (_, v) = entry.map_err(failed)?;
        out.push(decode(v.value())?);
    }
    Ok(out)
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn append(
        &self,
        channel: &str,
        changes: Vec<NewChange>,
        idempotency: Option<IdempotencyKey>,
        now: OffsetDateTime,
    ) -> Result<Appended, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.write(WriteJob::Append(AppendJob {
            channel: channel.to_string(),
            changes,
            idempotency,
            now,
            reply,
        }))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("writer stopped".into()))?
    }

    async fn read(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Change>, StoreError> {
        let channel = channel.to_string();
        self.blocking(false, move |db| {
            read_range(db, &channel, after.saturating_add(1), limit)
        })
        .await
    }

    async fn read_newest(&self, channel: &str, limit: usize) -> Result<Vec<Change>, StoreError> {
        let channel = channel.to_string();
        self.blocking(false, move |db| {
            let meta = channel_meta(db, &channel)?;
            let from = meta
                .last
                .saturating_sub(limit as u64)
                .saturating_add(1)
                .max(meta.oldest);
            read_range(db, &channel, from, limit)
        })
        .await
    }

    async fn head(&self, channel: &str) -> Result<ChannelHead, StoreError> {
        // One small record, read on the caller's thread: a trip through the blocking pool
        // would cost more than the read (every topic request asks for the head).
        let meta = self.read_now(|db| channel_meta(db, channel))?;
        Ok(ChannelHead {
            oldest: meta.oldest,
            last: meta.last,
        })
    }

    fn watch_head(&self, channel: &str) -> watch::Receiver<u64> {
        let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = heads.get(channel) {
            return tx.subscribe();
        }
        // Created under the lock, so the writer cannot publish a head we then miss. While the
        // store is broken it starts at 0, and moves when the store is reopened.
        let last = self
            .read_now(|db| channel_meta(db, channel))
            .map(|m| m.last)
            .unwrap_or(0);
        let (tx, rx) = watch::channel(last);
        heads.insert(channel.to_string(), tx);
        rx
    }

    async fn trim(
        &self,
        channel: &str,
        retention: Retention,
        now: OffsetDateTime,
    ) -> Result<u64, StoreError> {
        let channel = channel.to_string();
        self.blocking(true, move |db| {
            let txn = db.begin_write().map_err(failed)?;
            let removed;
            {
                let mut meta_table = txn.open_table(CHANNELS).map_err(failed)?;
                let mut meta = match meta_table.get(channel.as_str()).map_err(failed)? {
                    Some(v) => decode::<ChannelMeta>(v.value())?,
                    None => ChannelMeta::default(),
                };
                let mut log = txn.open_table(CHANGES).map_err(failed)?;
                let retained = (meta.last + 1).saturating_sub(meta.oldest);
                let mut new_oldest = meta.oldest + retained.saturating_sub(retention.max_changes);
                if let Some(age) = retention.max_age {
                    let cutoff = now - age;
                    // Walk forward past changes older than the cutoff; keep the newest.
                    for entry in log
                        .range((channel.as_str(), new_oldest)..(channel.as_str(), meta.last))
                        .map_err(failed)?
                    {
                        let (k, v) = entry.map_err(failed)?;
                        let change: Change = decode(v.value())?;
                        if change.datetime >= cutoff {
                            break;
                        }
                        new_oldest = k.value().1 + 1;
                    }
                }
                let new_oldest = retention.cut(new_oldest).max(meta.oldest);
                removed = new_oldest - meta.oldest;
                for seq in meta.oldest..new_oldest {
                    log.remove((channel.as_str(), seq)).map_err(failed)?;
                }
                if removed > 0 {
                    meta.oldest = new_oldest;
                    meta_table
                        .insert(channel.as_str(), encode(&meta)?.as_slice())
                        .map_err(failed)?;
                }

                let mut idem = txn.open_table(IDEMPOTENCY).map_err(failed)?;
                let mut expired = Vec::new();
                for entry in idem.range((channel.as_str(), "")..).map_err(failed)? {
                    let (k, v) = entry.map_err(failed)?;
                    let (ch, key) = k.value();
                    if ch != channel {
                        break;
                    }
                    let record: IdempotencyRecord = decode(v.value())?;
                    if record.at + IDEMPOTENCY_TTL <= now {
                        expired.push(key.to_string());
                    }
                }
                for key in expired {
                    idem.remove((channel.as_str(), key.as_str()))
                        .map_err(failed)?;
                }
            }
            txn.commit().map_err(failed)?;
            Ok(removed)
        })
        .await
    }

    async fn origin(&self, channel: &str, now: OffsetDateTime) -> Result<Origin, StoreError> {
        if let ChannelMeta {
            created: Some(created),
            epoch: Some(epoch),
            ..
        } = self.read_now(|db| channel_meta(db, channel))?
        {
            return Ok(Origin { created, epoch });
        }
        let channel = channel.to_string();
        self.blocking(true, move |db| {
            let txn = db.begin_write().map_err(failed)?;
            let origin;
            {
                let mut table = txn.open_table(CHANNELS).map_err(failed)?;
                let mut meta = match table.get(channel.as_str()).map_err(failed)? {
                    Some(v) => decode::<ChannelMeta>(v.value())?,
                    None => ChannelMeta::default(),
                };
                let created = *meta.created.get_or_insert(now);
                let epoch = meta.epoch.get_or_insert_with(new_epoch).clone();
                origin = Origin { created, epoch };
                table
                    .insert(channel.as_str(), encode(&meta)?.as_slice())
                    .map_err(failed)?;
            }
            txn.commit().map_err(failed)?;
            Ok(origin)
        })
        .await
    }

    async fn resources(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<ResourcePage, StoreError> {
        let channel = channel.to_string();
        self.blocking(false, move |db| {
            index::read_page(db, &channel, after, limit)
        })
        .await
    }

    async fn resource(&self, channel: &str, loc: &str) -> Result<Option<Change>, StoreError> {
        let (channel, loc) = (channel.to_string(), loc.to_string());
        self.blocking(false, move |db| index::read_one(db, &channel, &loc))
            .await
    }

    async fn resource_count(&self, channel: &str) -> Result<u64, StoreError> {
        let channel = channel.to_string();
        self.blocking(false, move |db| Ok(channel_meta(db, &channel)?.resources))
            .await
    }

    async fn resource_marks(&self, channel: &str, every: usize) -> Result<Vec<u64>, StoreError> {
        let channel = channel.to_string();
        self.blocking(false, move |db| index::marks(db, &channel, every))
            .await
    }

    async fn sync_items(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<SyncPage, StoreError> {
        let channel = channel.to_string();
        self.blocking(false, move |db| feedsync::page(db, &channel, after, limit))
            .await
    }

    async fn sync_item(&self, channel: &str, loc: &str) -> Result<Option<Synced>, StoreError> {
        let (channel, loc) = (channel.to_string(), loc.to_string());
        self.blocking(false, move |db| feedsync::one(db, &channel, &loc))
            .await
    }

    async fn sync_conflicts(&self, channel: &str, limit: usize) -> Result<Vec<Synced>, StoreError> {
        let channel = channel.to_string();
        self.blocking(false, move |db| feedsync::conflicted(db, &channel, limit))
            .await
    }

    async fn append_merged(
        &self,
        channel: &str,
        changes: Vec<MergedChange>,
        now: OffsetDateTime,
    ) -> Result<Option<Appended>, StoreError> {
        feedsync::append_merged(self, channel, changes, now).await
    }

    async fn put_channel(&self, spec: &ChannelSpec) -> Result<(), StoreError> {
        let (name, bytes) = (spec.name.clone(), encode(spec)?);
        self.blocking(true, move |db| put_record(db, CHANNEL_SPECS, &name, &bytes))
            .await
    }

    async fn delete_channel(&self, name: &str) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.blocking(true, move |db| {
            let txn = db.begin_write().map_err(failed)?;
            let existed = txn
                .open_table(CHANNEL_SPECS)
                .map_err(failed)?
                .remove(name.as_str())
                .map_err(failed)?
                .is_some();
            txn.commit().map_err(failed)?;
            Ok(existed)
        })
        .await
    }

    async fn stored_channel(&self, name: &str) -> Result<Option<ChannelSpec>, StoreError> {
        let name = name.to_string();
        self.blocking(false, move |db| {
            let txn = db.begin_read().map_err(failed)?;
            let table = txn.open_table(CHANNEL_SPECS).map_err(failed)?;
            let found = table.get(name.as_str()).map_err(failed)?;
            found.map(|v| decode(v.value())).transpose()
        })
        .await
    }

    async fn stored_channels(&self) -> Result<Vec<ChannelSpec>, StoreError> {
        self.blocking(false, |db| all_records(db, CHANNEL_SPECS))
            .await
    }

    async fn put_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        let (id, bytes) = (sub.id.clone(), encode(sub)?);
        self.blocking(true, move |db| put_record(db, SUBSCRIPTIONS, &id, &bytes))
            .await
    }

    async fn delete_subscription(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.blocking(true, move |db| {
            let txn = db.begin_write().map_err(failed)?;
            let existed = txn
                .open_table(SUBSCRIPTIONS)
                .map_err(failed)?
                .remove(id.as_str())
                .map_err(failed)?
                .is_some();
            txn.open_table(DELIVERY)
                .map_err(failed)?
                .remove(id.as_str())
                .map_err(failed)?;
            txn.commit().map_err(failed)?;
            Ok(existed)
        })
        .await
    }

    async fn subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        self.blocking(false, |db| all_records(db, SUBSCRIPTIONS))
            .await
    }

    async fn put_delivery(&self, sub_id: &str, state: &DeliveryState) -> Result<(), StoreError> {
        self.put_deliveries(&[(sub_id.to_string(), state.clone())])
            .await
    }

    async fn put_deliveries(&self, states: &[(String, DeliveryState)]) -> Result<(), StoreError> {
        let states = states
            .iter()
            .map(|(id, state)| Ok((id.clone(), encode(state)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let (reply, answer) = oneshot::channel();
        self.write(WriteJob::Delivery(DeliveryJob { states, reply }))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("writer stopped".into()))?
    }

    async fn put_bridge_cursor(
        &self,
        channel: &str,
        bridge: &str,
        seq: u64,
    ) -> Result<(), StoreError> {
        let (channel, bridge) = (channel.to_string(), bridge.to_string());
        self.blocking(true, move |db| bridges::put(db, &channel, &bridge, seq))
            .await
    }

    async fn bridge_cursor(&self, channel: &str, bridge: &str) -> Result<Option<u64>, StoreError> {
        let (channel, bridge) = (channel.to_string(), bridge.to_string());
        self.blocking(false, move |db| bridges::get(db, &channel, &bridge))
            .await
    }

    async fn delivery(&self, sub_id: &str) -> Result<Option<DeliveryState>, StoreError> {
        let id = sub_id.to_string();
        self.blocking(false, move |db| {
            let txn = db.begin_read().map_err(failed)?;
            let table = txn.open_table(DELIVERY).map_err(failed)?;
            match table.get(id.as_str()).map_err(failed)? {
                Some(v) => decode(v.value()).map(Some),
                None => Ok(None),
            }
        })
        .await
    }

    async fn deliveries(
        &self,
        _channel: &str,
        ids: &[String],
    ) -> Result<HashMap<String, DeliveryState>, StoreError> {
        let ids = ids.to_vec();
        self.blocking(false, move |db| {
            let txn = db.begin_read().map_err(failed)?;
            let table = txn.open_table(DELIVERY).map_err(failed)?;
            let mut states = HashMap::with_capacity(ids.len());
            for id in ids {
                if let Some(v) = table.get(id.as_str()).map_err(failed)? {
                    let state = decode(v.value())?;
                    states.insert(id, state);
                }
            }
            Ok(states)
        })
        .await
    }

    /// Fails while the store is broken (see `handle.rs`).
    async fn ping(&self) -> Result<(), StoreError> {
        self.blocking(false, |db| {
            db.begin_read().map_err(failed)?;
            Ok(())
        })
        .await
    }
}
