//! A private `redis-server` per test: no TCP port, only a unix socket in its own temporary
//! folder (so no test can reach another's server, or any other Redis); killed when dropped.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub aof: bool,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server; with `aof`, every write is in the append-only file (fsync always)
    /// before Redis answers.
    pub fn start(aof: bool) -> RedisServer {
        let mut server = RedisServer {
            aof,
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        server.launch();
        server
    }

    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn launch(&mut self) {
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(bin)
            .args([
                "--port",
                "0",
                "--unixsocket",
                self.socket().to_str().unwrap(),
                "--save",
                "",
                "--appendonly",
                if self.aof { "yes" } else { "no" },
                "--appendfsync",
                "always",
                "--dir",
                self.dir.path().to_str().unwrap(),
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server must be installed (see .ci/run)");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Waits until the server answers PING.
    fn wait_ready(&self) {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if self.ping() {
                return;
            }
            assert!(Instant::now() < end, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn ping(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(self.socket()) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same socket and folder (the AOF, if any, is replayed).
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
