//! Mirror benchmark: how fast `changehub subscribe --mirror` copies a channel's resources,
//! against the same GETs done by `curl` in parallel in the same run, on the same machine.
//!
//! Set-up, all on 127.0.0.1: a folder of N resources (default 5,000 files of 1–8 KiB, in 20
//! sub-folders) served by a minimal axum file server; a hub (the library's `run`, embedded
//! store) with one channel; the folder published with `changehub publish --scan` (the release
//! binary). Then, for each concurrency C (8 and 32) and each run:
//!
//! - **curl, N**: `curl --parallel --parallel-max C` GETs the N resources into a fresh folder
//!   (one process, a config file of `url`/`output` pairs); from spawn to exit.
//! - **mirror baseline**: `changehub subscribe TOPIC --via ws --mirror DIR --concurrency C
//!   --quiet` with a new state file; from spawn until its state file says the baseline is done
//!   (it is saved after every resource is written and synced). Its own `baseline:` line
//!   (the fetch loop alone) is shown too.
//! - **mirror incremental**: M resources (default 1,000) are rewritten and their `updated`
//!   changes (hash, length) POSTed to the hub as NDJSON; from the POST until the subscriber's
//!   state file holds the last seq of that POST (saved after the changes are written).
//! - **curl, M**: the same M GETs by curl, as above, over its copy of the N.
//! - **disk floor**: the N files written from memory the way the mirror writes them
//!   (temporary file, `fsync`, rename; C threads; then each folder synced): what the
//!   durability costs on this disk, without any network; and the same with one thread.
//!
//! Every copy is checked byte for byte against the source after it is timed. Figures are
//! resources/s, median (min–max) of the runs; ratios are taken per run, mirror / curl.
//!
//! Run: `cargo bench --bench mirror` (`BENCH_SCALE=0.2` for a quicker, rougher run; `BENCH_RUNS`
//! runs per concurrency, default 3). Diagnosis: `MIRROR_STRACE='-f -c -w -o /tmp/trace-{}'` runs
//! each subscriber under `strace` with these options (`{}` becomes `C-RUN`); the figures of
//! such a run mean nothing. Needs `curl` on the PATH; without it the curl figures
//! are skipped (nothing is installed). Every loop is bounded in count or by a deadline; every
//! child process is killed when dropped.

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[path = "support/mod.rs"]
mod support;
use support::scale;

const CHANNEL: &str = "files";
const TOKEN: &str = "bench-token";
const FOLDERS: usize = 20;
/// Longest any one step may take before the bench gives up.
const DEADLINE: Duration = Duration::from_secs(600);

fn rel(i: usize) -> String {
    format!("d{:02}/r{i:05}.txt", i % FOLDERS)
}

/// Resource `i` at `version`: 1–8 KiB of text.
fn content(i: usize, version: usize) -> Vec<u8> {
    let size = 1024 + (i.wrapping_mul(2_654_435_761) + version * 977) % (7 * 1024);
    let line = format!("resource {i}, version {version}: lorem ipsum dolor sit amet\n");
    line.repeat(size / line.len() + 1).into_bytes()[..size].to_vec()
}

fn write_source(src: &Path, i: usize, version: usize) -> Vec<u8> {
    let bytes = content(i, version);
    let path = src.join(rel(i));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    bytes
}

/// Panics unless each of `indices` in `copy` has the bytes of `src`.
fn check_copy(src: &Path, copy: &Path, indices: impl Iterator<Item = usize>, what: &str) {
    for i in indices {
        let expected = std::fs::read(src.join(rel(i))).unwrap();
        let got = std::fs::read(copy.join(rel(i)))
            .unwrap_or_else(|e| panic!("{what}: {} missing: {e}", rel(i)));
        assert!(
            got == expected,
            "{what}: {} differs from the source",
            rel(i)
        );
    }
}

/// The file server: DIR under `/files/`, read from disk on each GET.
async fn serve_file(
    State(dir): State<PathBuf>,
    UrlPath(path): UrlPath<String>,
) -> axum::response::Response {
    if path.split('/').any(|s| s == ".." || s.is_empty()) {
        return StatusCode::BAD_REQUEST.into_response();
    }
    match tokio::fs::read(dir.join(&path)).await {
        Ok(bytes) => ([("content-type", "text/plain")], bytes).into_response(),
        Err(_) => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn start_file_server(dir: &Path) -> (String, tokio::sync::oneshot::Sender<()>) {
    let app = Router::new()
        .route("/files/{*path}", get(serve_file))
        .with_state(dir.to_path_buf());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/files/", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap()
    });
    (base, stop)
}

/// The release binary, with no `CHANGEHUB_*` variable of the caller's environment.
fn changehub(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_changehub"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (var, _) in std::env::vars() {
        if var.starts_with("CHANGEHUB_") {
            cmd.env_remove(var);
        }
    }
    cmd
}

/// `curl --parallel --parallel-max C` GETting `indices` into `out`; the time from spawn to
/// exit.
async fn curl(base: &str, indices: &[usize], out: &Path, concurrency: usize) -> Duration {
    let config = out.with_extension("curlrc");
    let mut lines = String::new();
    for &i in indices {
        lines.push_str(&format!(
            "url = \"{base}{}\"\noutput = \"{}\"\n",
            rel(i),
            out.join(rel(i)).display()
        ));
    }
    std::fs::write(&config, lines).unwrap();
    let parallel_max = concurrency.to_string();
    let config_arg = config.display().to_string();
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args([
        "--silent",
        "--show-error",
        "--fail",
        "--create-dirs",
        "--parallel",
        "--parallel-max",
        &parallel_max,
        "--config",
        &config_arg,
    ])
    .stdin(Stdio::null())
    .kill_on_drop(true);
    let started = Instant::now();
    let output = tokio::time::timeout(DEADLINE, cmd.output())
        .await
        .expect("curl did not end")
        .unwrap();
    let took = started.elapsed();
    assert!(
        output.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    took
}

/// The state file of a subscriber: (baseline done, cursor).
fn cursor(state: &Path) -> Option<(bool, u64)> {
    let bytes = std::fs::read(state).ok()?;
    let json: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    Some((json["started"].as_bool()?, json["seq"].as_u64()?))
}

/// Waits (bounded) until the state file at `state` is started at `seq` or later.
async fn wait_cursor(state: &Path, seq: u64, child: &mut tokio::process::Child, log: &Path) {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some((true, at)) = cursor(state) {
            if at >= seq {
                return;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the subscriber ended ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < end,
            "the subscriber did not reach seq {seq} in {DEADLINE:?}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The subscriber process (or strace running it): killed when dropped, the traced
/// subscriber first (killing strace alone would leave it running, detached).
struct Subscriber(tokio::process::Child);

impl Subscriber {
    fn kill_tracees(&self) {
        let Some(pid) = self.0.id() else {
            return;
        };
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for tracee in children.split_whitespace().filter_map(|p| p.parse().ok()) {
            // SAFETY: kill(2) on a child process of ours; no memory is involved.
            unsafe { libc::kill(tracee, libc::SIGKILL) };
        }
    }

    /// Kills it; under strace, lets strace write its summary first (bounded).
    async fn stop(mut self) {
        self.kill_tracees();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.0.wait()).await;
        let _ = self.0.kill().await;
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.kill_tracees();
        let _ = self.0.start_kill();
    }
}

/// Writes the files of `src` the way the mirror does (temporary file, fsync, rename), with
/// `concurrency` threads, then syncs each folder; the time it takes.
fn disk_floor(src: &Path, n: usize, out: &Path, concurrency: usize) -> Duration {
    let files: Vec<(PathBuf, Vec<u8>)> = (0..n)
        .map(|i| (out.join(rel(i)), std::fs::read(src.join(rel(i))).unwrap()))
        .collect();
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..concurrency {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some((path, bytes)) = files.get(k) else {
                    return;
                };
                let folder = path.parent().unwrap();
                std::fs::create_dir_all(folder).unwrap();
                let temp = folder.join(format!(
                    ".tmp-{}",
                    path.file_name().unwrap().to_string_lossy()
                ));
                let mut file = std::fs::File::create(&temp).unwrap();
                file.write_all(bytes).unwrap();
                file.sync_all().unwrap();
                drop(file);
                std::fs::rename(&temp, path).unwrap();
            });
        }
    });
    for f in 0..FOLDERS.min(n) {
        std::fs::File::open(out.join(format!("d{f:02}")))
            .unwrap()
            .sync_all()
            .unwrap();
    }
    started.elapsed()
}

/// Figures of one run at one concurrency, resources/s.
#[derive(Default, Clone, Copy)]
struct Run {
    curl_n: Option<f64>,
    mirror_baseline: f64,
    /// From the subscriber's own `baseline:` line.
    mirror_baseline_own: f64,
    curl_m: Option<f64>,
    mirror_incremental: f64,
    floor: f64,
    /// The same with one thread.
    floor_serial: f64,
}

fn rate(count: usize, took: Duration) -> f64 {
    count as f64 / took.as_secs_f64()
}

/// `median (min–max)` of `values`.
fn spread(mut values: Vec<f64>, digits: usize) -> String {
    if values.is_empty() {
        return "skipped".into();
    }
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let median = values[values.len() / 2];
    if values.len() == 1 {
        return format!("{median:.digits$}");
    }
    format!(
        "{median:.digits$} ({:.digits$}–{:.digits$})",
        values[0],
        values[values.len() - 1]
    )
}

struct Setup {
    dir: PathBuf,
    src: PathBuf,
    base: String,
    hub: String,
    topic: String,
    client: reqwest::Client,
    n: usize,
    m: usize,
    has_curl: bool,
    version: usize,
}

impl Setup {
    async fn one_run(&mut self, run: usize, concurrency: usize) -> Run {
        let (n, m) = (self.n, self.m);
        let mut figures = Run::default();
        let scratch = self.dir.join(format!("run-{concurrency}-{run}"));
        std::fs::create_dir_all(&scratch).unwrap();
        let all: Vec<usize> = (0..n).collect();

        if self.has_curl {
            let out = scratch.join("curl-n");
            let took = curl(&self.base, &all, &out, concurrency).await;
            check_copy(&self.src, &out, 0..n, "curl");
            figures.curl_n = Some(rate(n, took));
        }

        // The baseline: a new state file.
        let mirror = scratch.join("mirror");
        let state = scratch.join("subscriber.json");
        let log = scratch.join("subscriber.log");
        let (mirror_arg, state_arg) = (mirror.display().to_string(), state.display().to_string());
        let concurrency_arg = concurrency.to_string();
        let mut cmd = changehub(&[]);
        if let Ok(options) = std::env::var("MIRROR_STRACE") {
            // Diagnosis only (the figures of such a run mean nothing): the subscriber under
            // strace with these options, `{}` in them replaced by `C-RUN`.
            cmd = tokio::process::Command::new("strace");
            cmd.args(
                options
                    .replace("{}", &format!("{concurrency}-{run}"))
                    .split_whitespace(),
            )
            .arg(env!("CARGO_BIN_EXE_changehub"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
            for (var, _) in std::env::vars() {
                if var.starts_with("CHANGEHUB_") {
                    cmd.env_remove(var);
                }
            }
        }
        cmd.args([
            "subscribe",
            &self.topic,
            "--via",
            "ws",
            "--mirror",
            &mirror_arg,
            "--base-url",
            &self.base,
            "--state",
            &state_arg,
            "--concurrency",
            &concurrency_arg,
            "--quiet",
        ]);
        cmd.stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
        let started = Instant::now();
        let mut child = Subscriber(cmd.spawn().unwrap());
        wait_cursor(&state, 1, &mut child.0, &log).await;
        let took = started.elapsed();
        figures.mirror_baseline = rate(n, took);
        let text = std::fs::read_to_string(&log).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("baseline: ") && l.contains(" resources at seq "))
            .unwrap_or_else(|| panic!("no baseline line: {text}"));
        assert!(
            line.starts_with(&format!("baseline: {n} resources")) && line.contains(", 0 pending"),
            "{line}"
        );
        figures.mirror_baseline_own = line
            .split_once(" s (")
            .and_then(|(_, rest)| rest.split_once("/s)"))
            .and_then(|(r, _)| r.parse().ok())
            .unwrap_or(0.0);
        check_copy(&self.src, &mirror, 0..n, "mirror baseline");
        // Wait for its websocket: the incremental figure is of a subscriber following live.
        let end = Instant::now() + DEADLINE;
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("websocket: following")
        {
            assert!(Instant::now() < end, "no websocket in {DEADLINE:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // Incremental: M resources rewritten, their changes POSTed at once.
        self.version += 1;
        let updated: Vec<usize> = (0..m).map(|k| (k * n / m + run) % n).collect();
        let mut body = String::new();
        for &i in &updated {
            let bytes = write_source(&self.src, i, self.version);
            body.push_str(
                &serde_json::json!({
                    "loc": format!("{}{}", self.base, rel(i)),
                    "change": "updated",
                    "hash": changehub::client::hash::of(&bytes),
                    "length": bytes.len(),
                })
                .to_string(),
            );
            body.push('\n');
        }
        let started = Instant::now();
        let response = self
            .client
            .post(format!("{}/channels/{CHANNEL}/changes", self.hub))
            .bearer_auth(TOKEN)
            .header("content-type", "application/x-ndjson")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        let answer: serde_json::Value = response.json().await.unwrap();
        let last = answer["last"].as_u64().expect("the hub's last seq");
        wait_cursor(&state, last, &mut child.0, &log).await;
        figures.mirror_incremental = rate(m, started.elapsed());
        child.stop().await;
        check_copy(
            &self.src,
            &mirror,
            updated.iter().copied(),
            "mirror incremental",
        );

        if self.has_curl {
            // Over curl's own copy of the N, as the mirror replaces its files.
            let out = scratch.join("curl-n");
            let took = curl(&self.base, &updated, &out, concurrency).await;
            check_copy(&self.src, &out, updated.iter().copied(), "curl");
            figures.curl_m = Some(rate(m, took));
        }

        let out = scratch.join("floor");
        let src = self.src.clone();
        let took = tokio::task::spawn_blocking(move || disk_floor(&src, n, &out, concurrency))
            .await
            .unwrap();
        figures.floor = rate(n, took);
        let out = scratch.join("floor-serial");
        let src = self.src.clone();
        let took = tokio::task::spawn_blocking(move || disk_floor(&src, n, &out, 1))
            .await
            .unwrap();
        figures.floor_serial = rate(n, took);
        std::fs::remove_dir_all(&scratch).unwrap();
        figures
    }
}

fn print_table(n: usize, m: usize, concurrency: usize, runs: &[Run]) {
    let col = |f: fn(&Run) -> Option<f64>| runs.iter().filter_map(f).collect::<Vec<_>>();
    let row = |what: &str, rates: Vec<f64>, ratios: Vec<f64>| {
        let ratio = if ratios.is_empty() {
            String::new()
        } else {
            format!("{} of curl", spread(ratios, 2))
        };
        println!("  {what:<44} {:>24} /s  {ratio}", spread(rates, 0));
    };
    println!("concurrency {concurrency}, {} run(s):", runs.len());
    row(
        &format!("curl --parallel-max {concurrency}, {n} GETs"),
        col(|r| r.curl_n),
        vec![],
    );
    row(
        &format!("mirror baseline, {n} resources"),
        col(|r| Some(r.mirror_baseline)),
        col(|r| Some(r.mirror_baseline / r.curl_n?)),
    );
    row(
        "  (its own `baseline:` line, fetch loop only)",
        col(|r| Some(r.mirror_baseline_own)),
        col(|r| Some(r.mirror_baseline_own / r.curl_n?)),
    );
    row(
        &format!("curl --parallel-max {concurrency}, {m} GETs"),
        col(|r| r.curl_m),
        vec![],
    );
    row(
        &format!("mirror incremental, {m} updated"),
        col(|r| Some(r.mirror_incremental)),
        col(|r| Some(r.mirror_incremental / r.curl_m?)),
    );
    row(
        &format!("disk floor: {n} temp+fsync+rename, {concurrency} threads"),
        col(|r| Some(r.floor)),
        col(|r| Some(r.floor / r.curl_n?)),
    );
    row(
        &format!("disk floor: {n} temp+fsync+rename, 1 thread"),
        col(|r| Some(r.floor_serial)),
        col(|r| Some(r.floor_serial / r.curl_n?)),
    );
}

async fn run() {
    let n = scale(5_000);
    let m = scale(1_000).min(n);
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let has_curl = std::process::Command::new("curl")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_curl {
        println!("curl is not on the PATH: the curl figures are skipped (nothing installed)");
    }

    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let mut bytes = 0;
    for i in 0..n {
        bytes += write_source(&src, i, 0).len();
    }
    let (base, stop_files) = start_file_server(&src).await;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config =
        changehub::config::Config::new(addr, dir.path().join("data")).with_channel(CHANNEL, TOKEN);
    let (stop_hub, hub_stopped) = tokio::sync::oneshot::channel::<()>();
    let hub_task = tokio::spawn(changehub::run(listener, config, async {
        let _ = hub_stopped.await;
    }));
    let hub = format!("http://{addr}");

    let published = Instant::now();
    let (src_arg, scan_state) = (
        src.display().to_string(),
        dir.path().join("scan.json").display().to_string(),
    );
    let output = tokio::time::timeout(
        DEADLINE,
        changehub(&[
            "publish",
            "--hub",
            &hub,
            "--channel",
            CHANNEL,
            "--token",
            TOKEN,
            "--scan",
            &src_arg,
            "--base-url",
            &base,
            "--state",
            &scan_state,
        ])
        .output(),
    )
    .await
    .expect("publish did not end")
    .unwrap();
    assert!(
        output.status.success(),
        "publish: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    println!(
        "{n} resources ({:.1} MiB, {:.1} KiB each on average) in {FOLDERS} folders published in {:.1} s; \
         {m} updated per incremental run; resources/s, median (min–max) of {runs} run(s)",
        bytes as f64 / 1_048_576.0,
        bytes as f64 / 1024.0 / n as f64,
        published.elapsed().as_secs_f64()
    );

    let mut setup = Setup {
        dir: dir.path().to_path_buf(),
        src,
        base,
        topic: format!("{hub}/channels/{CHANNEL}/changelist.xml"),
        hub,
        client: reqwest::Client::new(),
        n,
        m,
        has_curl,
        version: 0,
    };
    for concurrency in [8, 32] {
        let mut results = Vec::new();
        for r in 0..runs {
            results.push(setup.one_run(r, concurrency).await);
        }
        print_table(n, m, concurrency, &results);
    }
    let _ = stop_hub.send(());
    let _ = hub_task.await;
    let _ = stop_files.send(());
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}
