//! `changehub subscribe`: a destination from the shell. It follows one channel's topic and
//! keeps a cursor that survives anything: every change is applied once, in seq order.
//!
//! The parts, in the order a change passes through them:
//! - [`hub`]: discovery (the topic's `Link` headers give the hub and the channel) and the
//!   documents read back from the hub: `changes?after=`, closed ranges of the archive, the
//!   Resource List.
//! - [`callback`] (default) or [`ws`] (`--via ws`): where changes are pushed to us. Both hand
//!   them to the follower as [`Event`]s over one bounded queue.
//! - `Follower` (this file): the only owner of the cursor. A batch that does not start right
//!   after the cursor shows a gap, which it fills from the hub before it applies the batch;
//!   changes at or before the cursor are skipped. It also polls the log every `--poll`, in
//!   case the last notification before a quiet spell was lost.
//! - Applying a batch: NDJSON lines on stdout (one change each, flushed), and with
//!   [`mirror`] the resources fetched and written or removed; then the cursor is saved in the
//!   [`state`] file. A crash before the save applies the batch again after the restart (each
//!   line carries its seq; the mirror's writes are idempotent); nothing is skipped.
//! - When the hub cannot give what is missing — retention dropped it (410), or the log is
//!   another one (its data was wiped; 409, a `reset` frame) — a mirror starts again from the
//!   Resource List (and removes what it no longer lists); without a mirror the follower says
//!   so on stderr and goes on from the oldest change the hub has.

use anyhow::{bail, Context};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::model::Change;

pub mod callback;
pub mod hub;
pub mod mirror;
pub mod state;
pub mod ws;

use hub::{HubReader, ReadError};
use mirror::Mirror;
use state::State;

/// How the changes reach this subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Via {
    /// WebSub callbacks: the hub POSTs each notification to --callback-url.
    Callback,
    /// The hub's websocket: for destinations the hub cannot reach.
    Ws,
}

/// Flags of `changehub subscribe`.
#[derive(Debug, Clone, clap::Args)]
pub struct SubscribeArgs {
    /// The topic: a channel's Change List, {hub}/channels/NAME/changelist.xml.
    pub topic: String,
    /// The state file: the cursor, the subscription's secret, the mirror's pending fetches.
    /// Made when missing; keep it to resume exactly where a previous run stopped.
    #[arg(long, env = "CHANGEHUB_SUBSCRIBE_STATE")]
    pub state: PathBuf,
    /// Address the callback server listens on, e.g. 127.0.0.1:9000 or 0.0.0.0:9000 (needed
    /// with --via callback).
    #[arg(long, env = "CHANGEHUB_SUBSCRIBE_LISTEN")]
    pub listen: Option<String>,
    /// The URL the hub calls (default http://LISTEN/changehub-callback). Give it when the hub
    /// reaches this machine under another name, or LISTEN is a wildcard address.
    #[arg(long, env = "CHANGEHUB_SUBSCRIBE_CALLBACK_URL")]
    pub callback_url: Option<String>,
    /// How changes arrive: WebSub callbacks, or the websocket.
    #[arg(long, value_enum, default_value_t = Via::Callback)]
    pub via: Via,
    /// Keep a copy of the resources in DIR: a baseline from the Resource List when the state
    /// file is new, then every change.
    #[arg(long, env = "CHANGEHUB_SUBSCRIBE_MIRROR")]
    pub mirror: Option<PathBuf>,
    /// With --mirror: resources under URL go to DIR + the rest of their path (default:
    /// DIR/HOST/PATH, or DIR/HOST_PORT/PATH when the URL has a port).
    #[arg(long, env = "CHANGEHUB_SUBSCRIBE_BASE_URL")]
    pub base_url: Option<String>,
    /// With --mirror: compare DIR with the Resource List (presence and hashes), print the
    /// differences, exit 0 when there are none and 1 otherwise. Nothing is subscribed.
    #[arg(long)]
    pub audit: bool,
    /// With --mirror: resources fetched at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Without a state file (and without --mirror): start after this seq (default 0:
    /// everything the hub retains).
    #[arg(long)]
    pub since: Option<u64>,
    /// Read token of a private channel (websocket and catch-up reads).
    #[arg(long, env = "CHANGEHUB_SUBSCRIBE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Lease to ask the hub for (default: the hub's); renewed at 3/4 of what it grants.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub lease: Option<Duration>,
    /// How often the hub's log is checked for changes no notification brought.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub poll: Duration,
    /// How often the mirror tries its pending resources again.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub retry_every: Duration,
    /// Print nothing on stdout (by default every change applied, as one JSON line).
    #[arg(long, short)]
    pub quiet: bool,
}

/// What the push side hands to the follower.
#[derive(Debug)]
pub enum Event {
    /// Changes pushed to us, in seq order, with the epoch of their log when known.
    Changes {
        epoch: Option<String>,
        changes: Vec<Change>,
    },
    /// The hub could not replay from our cursor (websocket `reset`): `reason` is `retention`,
    /// `ahead` or `epoch`; the replay goes on from `oldest`.
    Reset {
        oldest: u64,
        epoch: Option<String>,
        reason: String,
    },
    /// Following cannot go on.
    Fatal(String),
}

/// How `changehub subscribe` failed; [`SubscribeError::exit_code`] is the process's exit
/// status (as `diff`'s: 1 for differences, 2 for trouble).
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// The audit found differences (listed on stdout): exit status 1.
    #[error("the mirror differs from the Resource List in {0} place(s)")]
    Differences(usize),
    /// Anything else — bad flags or input, a topic that is not a changehub channel, the hub
    /// unreachable or refusing, a state file or mirror folder that cannot be written: exit
    /// status 2.
    #[error("{0:#}")]
    Failed(#[from] anyhow::Error),
}

impl SubscribeError {
    /// The process's exit status for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            SubscribeError::Differences(_) => 1,
            SubscribeError::Failed(_) => 2,
        }
    }
}

/// Follows the topic until `stop` completes (then it unsubscribes) or something cannot be
/// recovered from; with `--audit`, compares the mirror once and returns.
pub async fn run(
    args: SubscribeArgs,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), SubscribeError> {
    if args.audit {
        let (reader, mirror) = open(&args).await?;
        let Some(mirror) = mirror else {
            return Err(anyhow::anyhow!("--audit needs --mirror DIR").into());
        };
        return audit(&reader, &mirror).await;
    }
    Ok(follow(args, stop).await?)
}

/// Discovers the topic and opens the mirror.
async fn open(args: &SubscribeArgs) -> anyhow::Result<(HubReader, Option<Mirror>)> {
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(
        args.mirror.is_some() || (!args.audit && args.base_url.is_none()),
        "--audit and --base-url go with --mirror DIR"
    );
    let client = super::conn::http_client(Duration::from_secs(60))?;
    let reader = HubReader::discover(client.clone(), &args.topic, args.token.clone()).await?;
    let mirror = match &args.mirror {
        Some(dir) => Some(Mirror::open(
            dir,
            args.base_url.as_deref(),
            client,
            args.concurrency,
            &args.state,
        )?),
        None => None,
    };
    Ok((reader, mirror))
}

async fn follow(
    args: SubscribeArgs,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    // What the command line alone decides, before anything is read or written.
    let callback_url = match (&args.via, &args.listen, &args.callback_url) {
        (Via::Ws, _, _) => None,
        (Via::Callback, None, _) => {
            bail!("--listen ADDR is needed for callbacks (or follow with --via ws)")
        }
        (Via::Callback, Some(_), Some(url)) => Some(url.clone()),
        (Via::Callback, Some(listen), None) => Some(default_callback_url(listen)?),
    };
    let (reader, mirror) = open(&args).await?;
    let client = reader.client().clone();
    super::files::check_writable(&args.state)?;
    let state = State::load(&args.state, &reader.topic.url)?;
    eprintln!(
        "topic {} (hub {}), cursor {}",
        reader.topic.url,
        reader.topic.hub,
        if state.started {
            format!("{}", state.seq)
        } else {
            "new".into()
        }
    );
    let (events_tx, mut events) = mpsc::channel(256);
    let (cursor_tx, cursor_rx) = watch::channel((state.seq, state.epoch.clone()));
    let mut follower = Follower {
        reader: reader.clone(),
        state,
        path: args.state.clone(),
        mirror,
        quiet: args.quiet,
        since: args.since,
        cursor: cursor_tx,
        renew_now: false,
    };

    let mut subscription = None;
    if let (Some(listen), Some(callback_url)) = (&args.listen, callback_url) {
        // The same secret and callback across restarts: the hub's retries of deliveries
        // signed before a crash still verify, and the subscription is renewed, not doubled.
        let secret = match (&follower.state.secret, &follower.state.callback) {
            (Some(secret), Some(cb)) if *cb == callback_url => secret.clone(),
            _ => random_secret(),
        };
        follower.state.secret = Some(secret.clone());
        follower.state.callback = Some(callback_url.clone());
        follower.save()?;
        let mut sub = callback::Subscription::start(
            listen,
            &callback_url,
            &reader.topic,
            &secret,
            args.lease,
            client.clone(),
            events_tx.clone(),
        )
        .await?;
        let lease = sub.subscribe().await?;
        eprintln!(
            "subscribed at {callback_url} (listening on {}) for {}",
            sub.address,
            humantime::format_duration(lease)
        );
        subscription = Some((sub, lease));
    }

    let stopped = async {
        stop.await;
        Ok(())
    };
    let following = async {
        let mut retry =
            crate::retry::Reconnect::new(Duration::from_secs(1), Duration::from_secs(30));
        while let Err(e) = follower.start().await {
            let delay = retry.delay();
            eprintln!(
                "cannot catch up yet ({e:#}); again in {}",
                humantime::format_duration(delay)
            );
            tokio::time::sleep(delay).await;
        }
        if args.via == Via::Ws {
            let endpoint = super::conn::ws_endpoint(hub_base(&reader.topic.base))?;
            tokio::spawn(ws::follow(
                endpoint,
                reader.topic.channel.clone(),
                args.token.clone(),
                cursor_rx,
                events_tx.clone(),
            ));
        }
        // Renewed at 3/4 of the lease, and at once when the hub's log turned out to be another
        // one (a hub that lost its data lost this subscription too).
        let mut renew_at = match &subscription {
            Some((_, lease)) => Instant::now() + *lease * 3 / 4,
            None => Instant::now() + Duration::from_secs(86_400 * 365),
        };
        let mut renew_retry =
            crate::retry::Reconnect::new(Duration::from_secs(1), Duration::from_secs(60));
        let mut poll = tokio::time::interval(args.poll);
        poll.tick().await;
        let mut retry = tokio::time::interval(args.retry_every);
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(event) => follower.on_event(event).await?,
                    None => bail!("the push side stopped"),
                },
                _ = poll.tick() => tolerate(follower.catch_up().await, "polling the hub")?,
                _ = retry.tick(), if !follower.state.pending.is_empty() => {
                    follower.retry_pending().await?;
                }
                () = tokio::time::sleep_until(renew_at), if subscription.is_some() => {
                    follower.renew_now = true;
                }
            }
            if let (true, Some((sub, _))) = (follower.renew_now, &mut subscription) {
                follower.renew_now = false;
                match sub.renew().await? {
                    Some(lease) => {
                        renew_at = Instant::now() + lease * 3 / 4;
                        renew_retry.reset();
                    }
                    None => renew_at = Instant::now() + renew_retry.delay(),
                }
            }
        }
    };
    let result = tokio::select! {
        r = following => r,
        r = stopped => r,
    };
    drop(follower);
    if let Some((mut sub, _)) = subscription {
        if result.is_ok() {
            sub.unsubscribe().await;
        }
    }
    result
}

/// `--audit`: the differences on stdout, a summary on stderr.
async fn audit(reader: &HubReader, mirror: &Mirror) -> Result<(), SubscribeError> {
    let (header, resources) = reader.resource_list().await?;
    let differences = mirror.audit(&resources);
    for d in &differences {
        println!("{d}");
    }
    eprintln!(
        "audit: {} resources listed at seq {}, {} difference(s)",
        resources.len(),
        header.seq.unwrap_or(0),
        differences.len()
    );
    if differences.is_empty() {
        Ok(())
    } else {
        Err(SubscribeError::Differences(differences.len()))
    }
}

/// `http://{listen}/changehub-callback`, for an address the hub can call.
fn default_callback_url(listen: &str) -> anyhow::Result<String> {
    let addr: std::net::SocketAddr = listen
        .parse()
        .with_context(|| format!("--listen {listen:?} is not an address (IP:PORT)"))?;
    anyhow::ensure!(
        !addr.ip().is_unspecified() && addr.port() != 0,
        "the hub cannot call {listen}: give --callback-url with the address it can reach"
    );
    Ok(format!("http://{addr}/changehub-callback"))
}

/// `{public_url}` of a channel base `{public_url}/channels/{name}`.
fn hub_base(channel_base: &str) -> &str {
    channel_base
        .rsplit_once("/channels/")
        .map(|(base, _)| base)
        .unwrap_or(channel_base)
}

fn random_secret() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Output or the state file cannot be written: the follower cannot go on.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct CannotRecord(anyhow::Error);

/// A failed read of the hub is logged and left to the next notification or poll; a failure
/// to record ([`CannotRecord`]) ends the follower.
fn tolerate(result: anyhow::Result<()>, what: &str) -> anyhow::Result<()> {
    match result {
        Err(e) if !e.is::<CannotRecord>() => {
            eprintln!("{what} failed, will try again: {e:#}");
            Ok(())
        }
        other => other,
    }
}

/// The owner of the cursor: applies batches in seq order, fills gaps, saves the state.
struct Follower {
    reader: HubReader,
    state: State,
    path: PathBuf,
    mirror: Option<Mirror>,
    quiet: bool,
    since: Option<u64>,
    /// Tells the websocket side where to resume.
    cursor: watch::Sender<(u64, Option<String>)>,
    /// Set when the hub's log was found to be another one (or the lease is due): the
    /// subscription is renewed.
    renew_now: bool,
}

impl Follower {
    /// The first catch-up: a mirror's baseline when the state is new, then the changes since.
    async fn start(&mut self) -> anyhow::Result<()> {
        if !self.state.started {
            if self.mirror.is_some() {
                self.baseline().await?;
            } else {
                self.state.seq = self.since.unwrap_or(0);
                self.state.started = true;
                self.save()?;
            }
        }
        self.catch_up().await
    }

    /// Reads the log after the cursor to its end, applying page by page.
    async fn catch_up(&mut self) -> anyhow::Result<()> {
        loop {
            let page = match self
                .reader
                .changes_after(self.state.seq, self.state.epoch.as_deref())
                .await
            {
                Ok(page) => page,
                Err(ReadError::Gone { oldest }) => {
                    self.lost(
                        &format!(
                            "retention dropped seqs {}..{}",
                            self.state.seq + 1,
                            oldest - 1
                        ),
                        oldest,
                        None,
                    )
                    .await?;
                    continue;
                }
                Err(ReadError::OtherLog { epoch, .. }) => {
                    self.lost(
                        "the hub's log is another one (its data was wiped?)",
                        1,
                        Some(epoch),
                    )
                    .await?;
                    continue;
                }
                Err(ReadError::Other(e)) => return Err(e),
            };
            let more = page.more && !page.changes.is_empty();
            self.apply(page.epoch, page.changes).await?;
            if !more {
                return Ok(());
            }
        }
    }

    async fn on_event(&mut self, event: Event) -> anyhow::Result<()> {
        match event {
            Event::Changes { epoch, changes } => self.on_changes(epoch, changes).await,
            Event::Reset {
                oldest,
                epoch,
                reason,
            } => {
                let other_log = epoch.is_some() && epoch != self.state.epoch;
                if oldest > self.state.seq + 1 || other_log || reason != "retention" {
                    self.lost(
                        &format!("the hub reset the replay ({reason})"),
                        oldest,
                        epoch,
                    )
                    .await?;
                }
                Ok(())
            }
            Event::Fatal(why) => bail!("{why}"),
        }
    }

    /// Pushed changes: skip what is applied, fill a gap before them, apply the rest.
    async fn on_changes(
        &mut self,
        epoch: Option<String>,
        changes: Vec<Change>,
    ) -> anyhow::Result<()> {
        if epoch.is_some() && self.state.epoch.is_some() && epoch != self.state.epoch {
            // Another log: the cursor means nothing there. Read it from the hub.
            let read = self.catch_up().await;
            return tolerate(read, "reading the hub's new log");
        }
        let Some(first) = changes.iter().map(|c| c.seq).find(|&s| s > self.state.seq) else {
            return Ok(());
        };
        if first > self.state.seq + 1 {
            let filled = self.fill(first - 1).await;
            tolerate(filled, &format!("filling the gap before seq {first}"))?;
            if self.state.seq + 1 < first {
                // Not filled (the hub unreachable, retention, another log): the log decides,
                // now or at the next poll.
                let read = self.catch_up().await;
                return tolerate(read, "reading the hub's log");
            }
        }
        self.apply(epoch, changes).await
    }

    /// Fills the gap (cursor, upto] from the archive's closed ranges, or `changes?after=`.
    async fn fill(&mut self, upto: u64) -> anyhow::Result<()> {
        while self.state.seq < upto {
            let first = self.state.seq + 1;
            let last = upto.min(self.state.seq + hub::MAX_RANGE);
            let page = match self.reader.range(first, last).await {
                Ok(Some(page)) => page,
                Ok(None) => match self
                    .reader
                    .changes_after(self.state.seq, self.state.epoch.as_deref())
                    .await
                {
                    Ok(page) => page,
                    Err(ReadError::Other(e)) => return Err(e),
                    Err(_) => return Ok(()),
                },
                Err(ReadError::Other(e)) => return Err(e),
                Err(_) => return Ok(()),
            };
            eprintln!(
                "filled a gap: seqs {first}..{} read back from the hub",
                page.changes.last().map_or(first, |c| c.seq)
            );
            let empty = page.changes.is_empty();
            self.apply(page.epoch, page.changes).await?;
            if empty {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Applies changes after the cursor (in seq order), then saves the cursor. Its errors are
    /// [`CannotRecord`]: the follower cannot go on.
    async fn apply(&mut self, epoch: Option<String>, changes: Vec<Change>) -> anyhow::Result<()> {
        let fresh: Vec<Change> = changes
            .into_iter()
            .filter(|c| c.seq > self.state.seq)
            .collect();
        if epoch.is_some() {
            self.state.epoch = epoch;
        }
        let Some(last) = fresh.last().map(|c| c.seq) else {
            return Ok(());
        };
        if !self.quiet {
            use std::io::Write;
            let mut lines = Vec::new();
            for change in &fresh {
                serde_json::to_writer(&mut lines, change)?;
                lines.push(b'\n');
            }
            let mut out = std::io::stdout().lock();
            out.write_all(&lines)
                .and_then(|()| out.flush())
                .context("writing to stdout")
                .map_err(CannotRecord)?;
        }
        if let Some(mirror) = &self.mirror {
            let applied = mirror.apply(&fresh, &mut self.state.pending).await;
            if applied.failed > 0 {
                eprintln!("mirror: {} resource(s) pending", self.state.pending.len());
            }
        }
        self.state.seq = last;
        self.save().map_err(|e| CannotRecord(e).into())
    }

    /// The changes after the cursor cannot all be had. A mirror starts again from the
    /// Resource List; otherwise the follower goes on after `oldest` − 1 of the log.
    async fn lost(&mut self, why: &str, oldest: u64, epoch: Option<String>) -> anyhow::Result<()> {
        if epoch.is_some() {
            self.renew_now = true;
        }
        if self.mirror.is_some() {
            eprintln!("{why}: the mirror starts again from the Resource List");
            return self.baseline().await;
        }
        // A subscriber that starts from the beginning expects retention to have cut it.
        if self.state.seq > 0 || epoch.is_some() {
            eprintln!("{why}: going on from seq {oldest}; the changes before it are lost to this subscriber");
        }
        self.state.seq = oldest.saturating_sub(1);
        self.state.epoch = epoch;
        self.state.started = true;
        self.save()
    }

    /// A mirror's baseline: every resource of the Resource List, then nothing else in DIR.
    async fn baseline(&mut self) -> anyhow::Result<()> {
        let Some(mirror) = &self.mirror else {
            return Ok(());
        };
        let (header, resources) = self.reader.resource_list().await?;
        let started = std::time::Instant::now();
        let mut progress = mirror::Progress::new(resources.len() as u64);
        self.state.pending.clear();
        for chunk in resources.chunks(256) {
            mirror.apply(chunk, &mut self.state.pending).await;
            progress.add(chunk.len() as u64);
        }
        let rate = progress.finish();
        let removed = mirror.remove_others(&resources);
        eprintln!(
            "baseline: {} resources at seq {} in {:.1} s ({rate:.0}/s), {} pending, {removed} removed",
            resources.len(),
            header.seq.unwrap_or(0),
            started.elapsed().as_secs_f64(),
            self.state.pending.len()
        );
        self.state.seq = header.seq.unwrap_or(0);
        self.state.epoch = header.epoch;
        self.state.started = true;
        self.save()
    }

    async fn retry_pending(&mut self) -> anyhow::Result<()> {
        let Some(mirror) = &self.mirror else {
            return Ok(());
        };
        let before = self.state.pending.len();
        let applied = mirror.retry_pending(&mut self.state.pending).await;
        if applied.fetched + applied.removed > 0 {
            eprintln!(
                "mirror: {} of {before} pending resource(s) done",
                applied.fetched + applied.removed
            );
            self.save()?;
        }
        Ok(())
    }

    fn save(&mut self) -> anyhow::Result<()> {
        self.state.save(&self.path)?;
        self.cursor
            .send_replace((self.state.seq, self.state.epoch.clone()));
        Ok(())
    }
}
