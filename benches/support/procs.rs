//! The processes of `cargo bench --bench suite`: the hub under test (a release binary run as
//! its own process), nginx, a private redis-server, wrk and redis-benchmark. Each server
//! listens on a free 127.0.0.1 port, lives in its own temporary folder and is stopped when
//! its guard is dropped (also when the bench panics).

use bytes::Bytes;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The publisher token of channel `bench` (and of `probe`).
pub const TOKEN: &str = "bench-token";
/// The admin token of every hub.
pub const ADMIN: &str = "bench-admin";

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Raises this process's open-file limit to its hard limit (children inherit it); returns it.
pub fn raise_nofile() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

/// Resident memory of a process, bytes (`VmRSS`).
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// CPU time (user + system) a process has used so far, seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) start at `) `: state is
    // field 3, utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / per_second
}

/// Polls `check` every `every` until it returns `Some`, for at most `limit`; panics naming
/// `what` past it.
pub async fn poll<T, F, Fut>(what: &str, limit: Duration, every: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(every).await;
    }
}

/// A child process, stopped (SIGTERM, SIGKILL after 5 s) and reaped when dropped.
pub struct Proc {
    child: Child,
    name: String,
    log: Option<PathBuf>,
}

impl Proc {
    pub fn spawn(name: &str, command: &mut Command, log: Option<PathBuf>) -> Proc {
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({command:?}): {e}"));
        Proc {
            child,
            name: name.to_string(),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics, with the end of its log, when the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = self
                .log
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_default();
            let tail: String = log
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            panic!("{} exited ({status}):\n{tail}", self.name);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling our own child, which has not been reaped.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// How a hub is started.
#[derive(Clone, Debug)]
pub struct HubOpts {
    /// `--redis URL`; the embedded store in a temporary folder otherwise.
    pub redis: Option<String>,
    pub max_batch: usize,
    pub linger_ms: u64,
    /// `--retain-changes` of every channel (default 10⁸: nothing is trimmed in a figure).
    pub retain_changes: u64,
    /// `--cache-size` in MiB (the embedded store's cache); the hub's default when `None`.
    pub cache_mib: Option<usize>,
    /// `--page-files-size` in MiB; the hub's default when `None`.
    pub page_files_mib: Option<u64>,
}

impl Default for HubOpts {
    fn default() -> Self {
        HubOpts {
            redis: None,
            max_batch: 1000,
            linger_ms: 100,
            retain_changes: 100_000_000,
            cache_mib: None,
            page_files_mib: None,
        }
    }
}

/// The hub under test: `changehub serve` as a child process with channels `bench` and `probe`
/// (token [`TOKEN`]), admin token [`ADMIN`], private callbacks allowed and every connection
/// and subscription cap raised above what the suite opens.
pub struct Hub {
    pub base: String,
    pub client: reqwest::Client,
    proc: Proc,
    _dir: tempfile::TempDir,
}

impl Hub {
    pub async fn start(bin: &Path, opts: &HubOpts) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let data = dir.path().join("data");
        let log = dir.path().join("hub.log");
        let mut command = Command::new(bin);
        command.args(["serve", "--listen", &format!("127.0.0.1:{port}")]);
        command.arg("--data-dir").arg(&data);
        for (flag, value) in [
            ("--channel", format!("bench={TOKEN}")),
            ("--channel", format!("probe={TOKEN}")),
            ("--admin-token", ADMIN.to_string()),
            ("--max-batch", opts.max_batch.to_string()),
            ("--linger", format!("{}ms", opts.linger_ms)),
            ("--max-body", (64 << 20).to_string()),
            ("--max-connections", "30000".into()),
            ("--max-connections-per-ip", "30000".into()),
            ("--ws-max-connections-per-ip", "30000".into()),
            ("--ws-ping", "1h".into()),
            ("--max-subscriptions-per-topic", "30000".into()),
            ("--max-subscriptions-per-host", "30000".into()),
            ("--retain-changes", opts.retain_changes.to_string()),
        ] {
            command.args([flag, &value]);
        }
        if let Some(mib) = opts.cache_mib {
            command.args(["--cache-size", &mib.to_string()]);
        }
        if let Some(mib) = opts.page_files_mib {
            command.args(["--page-files-size", &mib.to_string()]);
        }
        command.arg("--allow-private-callbacks");
        if let Some(url) = &opts.redis {
            command.args(["--redis", url]);
        }
        command
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let proc = Proc::spawn("the hub", &mut command, Some(log));
        let mut hub = Hub {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                // Shorter than the hub's 10 s for an idle connection (`--header-read-timeout`):
                // a request must never go out on a connection the hub is closing.
                .pool_idle_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            proc,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            hub.proc.assert_running();
            let ready = hub
                .client
                .get(format!("{}/readyz", hub.base))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return hub;
            }
            assert!(Instant::now() < deadline, "the hub was not ready in 60 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn rss(&self) -> u64 {
        rss(self.pid())
    }

    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.pid())
    }

    /// POSTs a JSON body of changes to `channel`; returns the 202's `(first, last)`.
    pub async fn post_changes(&self, channel: &str, body: Bytes) -> (u64, u64) {
        let resp = self
            .client
            .post(format!("{}/channels/{channel}/changes", self.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("POST changes");
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert_eq!(status, 202, "POST changes: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        (v["first"].as_u64().unwrap(), v["last"].as_u64().unwrap())
    }

    /// GET `path` (with the admin token); panics unless 2xx.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Bytes {
        let mut req = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(ADMIN);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.expect("GET");
        assert!(resp.status().is_success(), "GET {path}: {}", resp.status());
        resp.bytes().await.unwrap()
    }

    /// `changehub_deliveries_total{outcome="delivered"}` from `/metrics`, and the sum of the
    /// other outcomes (failed, gone, given up).
    pub async fn deliveries(&self) -> (u64, u64) {
        let text = String::from_utf8_lossy(&self.get("/metrics", &[]).await).to_string();
        let (mut ok, mut bad) = (0, 0);
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("changehub_deliveries_total{") {
                let n = rest
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0) as u64;
                if rest.contains("outcome=\"delivered\"") {
                    ok += n;
                } else {
                    bad += n;
                }
            }
        }
        (ok, bad)
    }
}

/// nginx: the callback receiver (POST → 202, a WebSub verification GET → its challenge),
/// a 202 for `POST /channels/…` (the ingest baseline) and static files under `/static/`
/// (and `/gz/`, served with `Content-Encoding: gzip`) from a temporary root.
pub struct Nginx {
    pub base: String,
    root: PathBuf,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Nginx {
    pub async fn start(nofile: u64) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let root = dir.path().join("www");
        std::fs::create_dir_all(root.join("static")).unwrap();
        std::fs::create_dir_all(root.join("gz")).unwrap();
        let d = dir.path().display();
        // SAFETY: geteuid has no preconditions.
        let user = if unsafe { libc::geteuid() } == 0 {
            "user root;"
        } else {
            ""
        };
        let connections = nofile.saturating_sub(64).clamp(1024, 65535);
        let conf = format!(
            r#"{user}
worker_processes auto;
worker_rlimit_nofile {nofile};
pid {d}/nginx.pid;
error_log {d}/error.log warn;
daemon off;
events {{ worker_connections {connections}; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_max_body_size 64m;
    client_body_buffer_size 1m;
    sendfile on;
    tcp_nopush on;
    types {{ }}
    default_type application/xml;
    server {{
        listen 127.0.0.1:{port} backlog=16384;
        root {root};
        location = /cb {{
            if ($args ~ "hub\.challenge=([^&]+)") {{ return 200 $1; }}
            return 202;
        }}
        location /channels/ {{ return 202; }}
        location /static/ {{ }}
        location /gz/ {{ add_header Content-Encoding gzip; }}
    }}
}}
"#,
            root = root.display()
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let log = dir.path().join("error.log");
        let mut command = Command::new(nginx_binary());
        command
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(&log)
            .arg("-c")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut proc = Proc::spawn("nginx", &mut command, Some(log));
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let url = format!("{base}/cb?hub.challenge=ready");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            proc.assert_running();
            if let Ok(resp) = client.get(&url).send().await {
                assert_eq!(resp.text().await.unwrap(), "ready", "nginx /cb echo");
                break;
            }
            assert!(Instant::now() < deadline, "nginx did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Nginx {
            base,
            root,
            _proc: proc,
            _dir: dir,
        }
    }

    /// Writes `bytes` as `/static/NAME` (or `/gz/NAME` when `gzip`); returns its URL.
    pub fn put(&self, name: &str, bytes: &[u8], gzip: bool) -> String {
        let folder = if gzip { "gz" } else { "static" };
        std::fs::write(self.root.join(folder).join(name), bytes).unwrap();
        format!("{}/{folder}/{name}", self.base)
    }
}

fn nginx_binary() -> PathBuf {
    [
        "/usr/sbin/nginx",
        "/usr/local/sbin/nginx",
        "/usr/local/nginx/sbin/nginx",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .unwrap_or_else(|| PathBuf::from("nginx"))
}

/// A private redis-server (no persistence) on a free port; never the one on 6379.
pub struct Redis {
    pub port: u16,
    pub url: String,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Redis {
    pub async fn start() -> Redis {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = dir.path().join("redis.log");
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--maxclients", "10000"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdout(Stdio::null());
        let mut proc = Proc::spawn("redis-server", &mut command, Some(log));
        let url = format!("redis://127.0.0.1:{port}/");
        let redis = poll(
            "redis-server to answer",
            Duration::from_secs(20),
            Duration::from_millis(20),
            || {
                proc.assert_running();
                let url = url.clone();
                async move {
                    let client = redis::Client::open(url.as_str()).ok()?;
                    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                    redis::cmd("PING")
                        .query_async::<String>(&mut conn)
                        .await
                        .ok()
                }
            },
        )
        .await;
        drop(redis);
        Redis {
            port,
            url,
            _proc: proc,
            _dir: dir,
        }
    }

    /// Empties the server (between two hubs). Through redis-cli, which waits as long as
    /// FLUSHALL takes (seconds at 10⁶ changes; the client library would time out).
    pub async fn flush(&self) {
        let out = tokio::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "FLUSHALL"])
            .output()
            .await
            .expect("redis-cli");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.trim() == "OK", "redis-cli FLUSHALL: {said}");
    }

    /// ops/s of `redis-benchmark -P 100 -n N XADD bench-stream '*' f v`.
    pub async fn xadd_benchmark(&self, n: usize) -> f64 {
        let out = tokio::process::Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-P", "100", "-n", &n.to_string(), "-q"])
            .args(["XADD", "bench-stream", "*", "f", "v"])
            .output()
            .await
            .expect("redis-benchmark");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        // "XADD bench-stream * f v: 398406.38 requests per second, p50=…" (after \r updates).
        let last = text.rsplit('\r').next().unwrap_or(&text);
        last.split("requests per second")
            .next()
            .and_then(|s| s.trim_end().rsplit(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("cannot read redis-benchmark's output: {text:?}"))
    }
}

/// One wrk run.
#[derive(Clone, Debug, Default)]
pub struct Wrk {
    /// 2xx/3xx responses per second.
    pub rate: f64,
    pub requests: u64,
    pub non_2xx: u64,
    pub socket_errors: u64,
}

/// `wrk -c connections -t min(connections, 2) -d seconds [-s script] url`.
pub async fn wrk(url: &str, connections: usize, seconds: u64, script: Option<&Path>) -> Wrk {
    let mut command = tokio::process::Command::new("wrk");
    command
        .arg("-c")
        .arg(connections.to_string())
        .arg("-t")
        .arg(connections.clamp(1, 2).to_string())
        .arg("-d")
        .arg(format!("{seconds}s"))
        .args(["--timeout", "10s"]);
    if let Some(script) = script {
        command.arg("-s").arg(script);
    }
    let out = command.arg(url).output().await.expect("wrk");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // A script error goes to stderr, and wrk then runs without the script: refuse that.
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && errors.trim().is_empty(),
        "wrk {url}: {text}{errors}"
    );
    let result = parse_wrk(&text).unwrap_or_else(|| panic!("cannot read wrk's output: {text}"));
    if result.non_2xx > 0 || result.socket_errors > 0 {
        eprintln!(
            "  wrk {url}: {} of {} responses not 2xx/3xx, {} socket errors",
            result.non_2xx, result.requests, result.socket_errors
        );
    }
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        eprintln!("{text}");
    }
    result
}

fn parse_wrk(text: &str) -> Option<Wrk> {
    // "  123456 requests in 3.00s, 12.34MB read"
    let line = text.lines().find(|l| l.contains(" requests in "))?;
    let mut words = line.split_whitespace();
    let requests: u64 = words.next()?.parse().ok()?;
    let took = words.nth(2)?.trim_end_matches(',');
    let seconds = if let Some(ms) = took.strip_suffix("ms") {
        ms.parse::<f64>().ok()? / 1e3
    } else if let Some(m) = took.strip_suffix('m') {
        m.parse::<f64>().ok()? * 60.0
    } else {
        took.strip_suffix('s')?.parse::<f64>().ok()?
    };
    let count_after = |prefix: &str| -> u64 {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .map(|rest| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .filter_map(|n| n.parse::<u64>().ok())
                    .sum()
            })
            .unwrap_or(0)
    };
    let non_2xx = count_after("Non-2xx or 3xx responses:");
    let socket_errors = count_after("Socket errors:");
    Some(Wrk {
        rate: requests.saturating_sub(non_2xx) as f64 / seconds.max(1e-9),
        requests,
        non_2xx,
        socket_errors,
    })
}

/// A wrk Lua script: `method` with `body` (kept in a file beside the script) and `headers`;
/// with `random_after`, each request GETs `PATH?after=R&limit=L` for R uniform in the range.
pub struct Script<'a> {
    pub method: &'a str,
    pub body: Option<&'a [u8]>,
    pub headers: &'a [(&'a str, String)],
    pub random_after: Option<(&'a str, u64, u64, usize)>,
}

impl Script<'_> {
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        // Lua long brackets: nothing inside is escaped.
        let quote = |s: &str| format!("[==[{s}]==]");
        let mut lua = format!("wrk.method = {}\n", quote(self.method));
        if let Some(body) = self.body {
            let body_path = dir.join(format!("{name}.body"));
            std::fs::write(&body_path, body).unwrap();
            lua += &format!(
                "local f = assert(io.open({}, \"rb\"))\nwrk.body = f:read(\"*a\")\nf:close()\n",
                quote(&body_path.display().to_string())
            );
        }
        for (k, v) in self.headers {
            lua += &format!("wrk.headers[ {} ] = {}\n", quote(k), quote(v));
        }
        if let Some((path, lo, hi, limit)) = self.random_after {
            lua += &format!(
                "math.randomseed(os.time())\n\
                 request = function()\n  \
                   return wrk.format(nil, {} .. \"?after=\" .. math.random({lo}, {hi}) .. \"&limit={limit}\")\n\
                 end\n",
                quote(path)
            );
        }
        let path = dir.join(format!("{name}.lua"));
        std::fs::write(&path, lua).unwrap();
        path
    }
}
