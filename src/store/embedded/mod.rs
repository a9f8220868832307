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
//! The resource index (`index.rs`) is written by the same transaction as the log.

use async_trait::async_trait;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot, watch};

use super::{
    new_epoch, Appended, ChannelHead, IdempotencyKey, Origin, ResourcePage, Store, StoreError,
    IDEMPOTENCY_TTL,
};
use crate::model::{Change, ChannelSpec, DeliveryState, NewChange, Retention, Subscription};

const CHANGES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("changes");
const CHANNELS: TableDefinition<&str, &[u8]> = TableDefinition::new("channels");
const IDEMPOTENCY: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("idempotency");
const SUBSCRIPTIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("subscriptions");
const DELIVERY: TableDefinition<&str, &[u8]> = TableDefinition::new("delivery");
/// Channels created at runtime: name → their settings (JSON).
const CHANNEL_SPECS: TableDefinition<&str, &[u8]> = TableDefinition::new("channel-specs");

mod index;
use index::IndexWriter;

/// Most appends committed in one transaction.
const MAX_GROUP: usize = 256;

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

/// A delivery-state update: frequent (one per delivery), so it is grouped like appends.
struct DeliveryJob {
    id: String,
    bytes: Vec<u8>,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

/// What the writer thread commits.
enum WriteJob {
    Append(AppendJob),
    Delivery(DeliveryJob),
}

pub struct EmbeddedStore {
    db: Arc<Database>,
    /// `None` only while dropping.
    writes: Option<mpsc::UnboundedSender<WriteJob>>,
    writer: Option<std::thread::JoinHandle<()>>,
    heads: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
}

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

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    metrics::counter!("changehub_store_errors_total").increment(1);
    StoreError::Unavailable(e.to_string())
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<EmbeddedStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(unavailable)?;
        let path = dir.join("changehub.redb");
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable(format!(
                "{} is in use by another process (another changehub serving the same \
                 --data-dir?); one hub at a time per data folder",
                path.display()
            )),
            other => StoreError::Unavailable(format!("{}: {other}", path.display())),
        })?;
        let txn = db.begin_write().map_err(unavailable)?;
        {
            // Create every table so that readers never meet a missing one.
            txn.open_table(CHANGES).map_err(unavailable)?;
            txn.open_table(CHANNELS).map_err(unavailable)?;
            txn.open_table(IDEMPOTENCY).map_err(unavailable)?;
            txn.open_table(SUBSCRIPTIONS).map_err(unavailable)?;
            txn.open_table(DELIVERY).map_err(unavailable)?;
            txn.open_table(CHANNEL_SPECS).map_err(unavailable)?;
            txn.open_table(index::RESOURCES).map_err(unavailable)?;
            txn.open_table(index::RESOURCE_ORDER).map_err(unavailable)?;
        }
        txn.commit().map_err(unavailable)?;
        index::backfill(&db)?;

        let db = Arc::new(db);
        let heads: Arc<Mutex<HashMap<String, watch::Sender<u64>>>> = Arc::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let writer_db = db.clone();
        let writer_heads = heads.clone();
        let writer = std::thread::Builder::new()
            .name("changehub-writer".into())
            .spawn(move || writer_loop(writer_db, rx, writer_heads))
            .map_err(unavailable)?;
        Ok(EmbeddedStore {
            db,
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

    /// Runs `f` on a blocking thread with the database.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(unavailable)?
    }
}

/// Stores `bytes` under `key` in a table of records keyed by name, in a transaction of its own.
fn put_record(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(unavailable)?;
    txn.open_table(table)
        .map_err(unavailable)?
        .insert(key, bytes)
        .map_err(unavailable)?;
    txn.commit().map_err(unavailable)
}

/// Every record of a table keyed by name, decoded.
fn all_records<T: for<'de> Deserialize<'de>>(
    db: &Database,
    table: TableDefinition<&str, &[u8]>,
) -> Result<Vec<T>, StoreError> {
    let txn = db.begin_read().map_err(unavailable)?;
    let table = txn.open_table(table).map_err(unavailable)?;
    let mut out = Vec::new();
    for entry in table.iter().map_err(unavailable)? {
        let (_, v) = entry.map_err(unavailable)?;
        out.push(decode(v.value())?);
    }
    Ok(out)
}

fn channel_meta(db: &Database, channel: &str) -> Result<ChannelMeta, StoreError> {
    let txn = db.begin_read().map_err(unavailable)?;
    let table = txn.open_table(CHANNELS).map_err(unavailable)?;
    match table.get(channel).map_err(unavailable)? {
        Some(v) => decode(v.value()),
        None => Ok(ChannelMeta::default()),
    }
}

/// The writer thread: takes every waiting write, commits them in one transaction, answers
/// each. The commit is fsynced when it holds an append; delivery state alone is not.
fn writer_loop(
    db: Arc<Database>,
    mut rx: mpsc::UnboundedReceiver<WriteJob>,
    heads: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
) {
    while let Some(first) = rx.blocking_recv() {
        let mut jobs = vec![first];
        while jobs.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let durable = jobs.iter().any(|j| matches!(j, WriteJob::Append(_)));
        let mut results = Vec::with_capacity(jobs.len());
        let outcome = (|| -> Result<HashMap<String, u64>, StoreError> {
            let mut txn = db.begin_write().map_err(unavailable)?;
            if !durable {
                txn.set_durability(Durability::None).map_err(unavailable)?;
            }
            let mut new_heads = HashMap::new();
            for job in &mut jobs {
                match job {
                    WriteJob::Append(job) => {
                        let changes = std::mem::take(&mut job.changes);
                        let result = append_in(&txn, job, changes);
                        match &result {
                            Ok(a) if !a.replayed => {
                                new_heads.insert(job.channel.clone(), a.last);
                            }
                            Err(StoreError::IdempotencyConflict) | Ok(_) => {}
                            Err(e) => return Err(unavailable(e)),
                        }
                        results.push(result);
                    }
                    WriteJob::Delivery(job) => {
                        txn.open_table(DELIVERY)
                            .map_err(unavailable)?
                            .insert(job.id.as_str(), job.bytes.as_slice())
                            .map_err(unavailable)?;
                        results.push(Ok(Appended::default()));
                    }
                }
            }
            txn.commit().map_err(unavailable)?;
            Ok(new_heads)
        })();
        match outcome {
            Ok(new_heads) => {
                {
                    let heads = heads.lock().unwrap_or_else(|e| e.into_inner());
                    for (channel, last) in new_heads {
                        if let Some(tx) = heads.get(&channel) {
                            tx.send_replace(last);
                        }
                    }
                }
                for (job, result) in jobs.into_iter().zip(results) {
                    match job {
                        WriteJob::Append(job) => {
                            let _ = job.reply.send(result);
                        }
                        WriteJob::Delivery(job) => {
                            let _ = job.reply.send(result.map(|_| ()));
                        }
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "write transaction failed");
                for job in jobs {
                    match job {
                        WriteJob::Append(job) => {
                            let _ = job.reply.send(Err(unavailable(&e)));
                        }
                        WriteJob::Delivery(job) => {
                            let _ = job.reply.send(Err(unavailable(&e)));
                        }
                    }
                }
            }
        }
    }
}

fn append_in(
    txn: &WriteTransaction,
    job: &AppendJob,
    changes: Vec<NewChange>,
) -> Result<Appended, StoreError> {
    let channel = job.channel.as_str();
    let mut idem = txn.open_table(IDEMPOTENCY).map_err(unavailable)?;
    if let Some(key) = &job.idempotency {
        if let Some(v) = idem.get((channel, key.key.as_str())).map_err(unavailable)? {
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
    let mut meta_table = txn.open_table(CHANNELS).map_err(unavailable)?;
    let mut meta = match meta_table.get(channel).map_err(unavailable)? {
        Some(v) => decode::<ChannelMeta>(v.value())?,
        None => ChannelMeta::default(),
    };
    let mut log = txn.open_table(CHANGES).map_err(unavailable)?;
    let mut index = IndexWriter::open(txn)?;
    let first = meta.last + 1;
    let accepted = changes.len();
    for new in changes {
        let seq = meta.last + 1;
        let wanted = new.datetime.unwrap_or(job.now);
        let datetime = match meta.last_datetime {
            Some(latest) if latest > wanted => latest,
            _ => wanted,
        };
        let change = Change::from_new(seq, new, datetime);
        let json = encode(&change)?;
        log.insert((channel, seq), json.as_slice())
            .map_err(unavailable)?;
        if index.record(channel, &change, &json)? {
            meta.resources += 1;
        }
        meta.last = seq;
        meta.last_datetime = Some(datetime);
    }
    meta_table
        .insert(channel, encode(&meta)?.as_slice())
        .map_err(unavailable)?;
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
            .map_err(unavailable)?;
    }
    Ok(appended)
}

fn read_range(
    db: &Database,
    channel: &str,
    from: u64,
    limit: usize,
) -> Result<Vec<Change>, StoreError> {
    let txn = db.begin_read().map_err(unavailable)?;
    let table = txn.open_table(CHANGES).map_err(unavailable)?;
    let mut out = Vec::with_capacity(limit.min(50_000));
    for entry in table
        .range((channel, from)..=(channel, u64::MAX))
        .map_err(unavailable)?
        .take(limit)
    {
        let (_, v) = entry.map_err(unavailable)?;
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
        self.blocking(move |db| read_range(db, &channel, after.saturating_add(1), limit))
            .await
    }

    async fn read_newest(&self, channel: &str, limit: usize) -> Result<Vec<Change>, StoreError> {
        let channel = channel.to_string();
        self.blocking(move |db| {
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
        let channel = channel.to_string();
        self.blocking(move |db| {
            let meta = channel_meta(db, &channel)?;
            Ok(ChannelHead {
                oldest: meta.oldest,
                last: meta.last,
            })
        })
        .await
    }

    fn watch_head(&self, channel: &str) -> watch::Receiver<u64> {
        let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = heads.get(channel) {
            return tx.subscribe();
        }
        // Created under the lock, so the writer cannot publish a head we then miss.
        let last = channel_meta(&self.db, channel).map(|m| m.last).unwrap_or(0);
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
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(unavailable)?;
            let removed;
            {
                let mut meta_table = txn.open_table(CHANNELS).map_err(unavailable)?;
                let mut meta = match meta_table.get(channel.as_str()).map_err(unavailable)? {
                    Some(v) => decode::<ChannelMeta>(v.value())?,
                    None => ChannelMeta::default(),
                };
                let mut log = txn.open_table(CHANGES).map_err(unavailable)?;
                let retained = (meta.last + 1).saturating_sub(meta.oldest);
                let mut new_oldest = meta.oldest + retained.saturating_sub(retention.max_changes);
                if let Some(age) = retention.max_age {
                    let cutoff = now - age;
                    // Walk forward past changes older than the cutoff; keep the newest.
                    for entry in log
                        .range((channel.as_str(), new_oldest)..(channel.as_str(), meta.last))
                        .map_err(unavailable)?
                    {
                        let (k, v) = entry.map_err(unavailable)?;
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
                    log.remove((channel.as_str(), seq)).map_err(unavailable)?;
                }
                if removed > 0 {
                    meta.oldest = new_oldest;
                    meta_table
                        .insert(channel.as_str(), encode(&meta)?.as_slice())
                        .map_err(unavailable)?;
                }

                let mut idem = txn.open_table(IDEMPOTENCY).map_err(unavailable)?;
                let mut expired = Vec::new();
                for entry in idem.range((channel.as_str(), "")..).map_err(unavailable)? {
                    let (k, v) = entry.map_err(unavailable)?;
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
                        .map_err(unavailable)?;
                }
            }
            txn.commit().map_err(unavailable)?;
            Ok(removed)
        })
        .await
    }

    async fn origin(&self, channel: &str, now: OffsetDateTime) -> Result<Origin, StoreError> {
        if let ChannelMeta {
            created: Some(created),
            epoch: Some(epoch),
            ..
        } = channel_meta(&self.db, channel)?
        {
            return Ok(Origin { created, epoch });
        }
        let channel = channel.to_string();
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(unavailable)?;
            let origin;
            {
                let mut table = txn.open_table(CHANNELS).map_err(unavailable)?;
                let mut meta = match table.get(channel.as_str()).map_err(unavailable)? {
                    Some(v) => decode::<ChannelMeta>(v.value())?,
                    None => ChannelMeta::default(),
                };
                let created = *meta.created.get_or_insert(now);
                let epoch = meta.epoch.get_or_insert_with(new_epoch).clone();
                origin = Origin { created, epoch };
                table
                    .insert(channel.as_str(), encode(&meta)?.as_slice())
                    .map_err(unavailable)?;
            }
            txn.commit().map_err(unavailable)?;
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
        self.blocking(move |db| index::read_page(db, &channel, after, limit))
            .await
    }

    async fn resource(&self, channel: &str, loc: &str) -> Result<Option<Change>, StoreError> {
        let (channel, loc) = (channel.to_string(), loc.to_string());
        self.blocking(move |db| index::read_one(db, &channel, &loc))
            .await
    }

    async fn resource_count(&self, channel: &str) -> Result<u64, StoreError> {
        let channel = channel.to_string();
        self.blocking(move |db| Ok(channel_meta(db, &channel)?.resources))
            .await
    }

    async fn resource_marks(&self, channel: &str, every: usize) -> Result<Vec<u64>, StoreError> {
        let channel = channel.to_string();
        self.blocking(move |db| index::marks(db, &channel, every))
            .await
    }

    async fn put_channel(&self, spec: &ChannelSpec) -> Result<(), StoreError> {
        let (name, bytes) = (spec.name.clone(), encode(spec)?);
        self.blocking(move |db| put_record(db, CHANNEL_SPECS, &name, &bytes))
            .await
    }

    async fn delete_channel(&self, name: &str) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(unavailable)?;
            let existed = txn
                .open_table(CHANNEL_SPECS)
                .map_err(unavailable)?
                .remove(name.as_str())
                .map_err(unavailable)?
                .is_some();
            txn.commit().map_err(unavailable)?;
            Ok(existed)
        })
        .await
    }

    async fn stored_channel(&self, name: &str) -> Result<Option<ChannelSpec>, StoreError> {
        let name = name.to_string();
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(unavailable)?;
            let table = txn.open_table(CHANNEL_SPECS).map_err(unavailable)?;
            let found = table.get(name.as_str()).map_err(unavailable)?;
            found.map(|v| decode(v.value())).transpose()
        })
        .await
    }

    async fn stored_channels(&self) -> Result<Vec<ChannelSpec>, StoreError> {
        self.blocking(|db| all_records(db, CHANNEL_SPECS)).await
    }

    async fn put_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        let (id, bytes) = (sub.id.clone(), encode(sub)?);
        self.blocking(move |db| put_record(db, SUBSCRIPTIONS, &id, &bytes))
            .await
    }

    async fn delete_subscription(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(unavailable)?;
            let existed = txn
                .open_table(SUBSCRIPTIONS)
                .map_err(unavailable)?
                .remove(id.as_str())
                .map_err(unavailable)?
                .is_some();
            txn.open_table(DELIVERY)
                .map_err(unavailable)?
                .remove(id.as_str())
                .map_err(unavailable)?;
            txn.commit().map_err(unavailable)?;
            Ok(existed)
        })
        .await
    }

    async fn subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        self.blocking(|db| all_records(db, SUBSCRIPTIONS)).await
    }

    async fn put_delivery(&self, sub_id: &str, state: &DeliveryState) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.write(WriteJob::Delivery(DeliveryJob {
            id: sub_id.to_string(),
            bytes: encode(state)?,
            reply,
        }))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("writer stopped".into()))?
    }

    async fn delivery(&self, sub_id: &str) -> Result<Option<DeliveryState>, StoreError> {
        let id = sub_id.to_string();
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(unavailable)?;
            let table = txn.open_table(DELIVERY).map_err(unavailable)?;
            match table.get(id.as_str()).map_err(unavailable)? {
                Some(v) => decode(v.value()).map(Some),
                None => Ok(None),
            }
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.blocking(|db| {
            db.begin_read().map_err(unavailable)?;
            Ok(())
        })
        .await
    }
}
