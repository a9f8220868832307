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

    /// SIGSTOP: the server stops answering (requests wait in its socket), as a hung Redis.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`RedisServer::pause`]: it answers what waited.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args([which, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
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

/// A private Redis Cluster: three primaries, no replicas, each `redis-server` in its own
/// temporary folder on free loopback TCP ports (a cluster needs TCP: clients are redirected to
/// each node's port, and nodes talk over their bus port), formed with
/// `redis-cli --cluster create`; killed when dropped. Its ports come from the kernel's ephemeral
/// range, never 6379.
pub struct RedisCluster {
    dir: tempfile::TempDir,
    ports: Vec<u16>,
    bus_ports: Vec<u16>,
    children: Vec<Child>,
}

/// Nodes of a test cluster.
const CLUSTER_NODES: usize = 3;

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let mut cluster = RedisCluster {
            dir: tempfile::tempdir().unwrap(),
            ports: Vec::new(),
            bus_ports: Vec::new(),
            children: Vec::new(),
        };
        // A port chosen free can be taken by another test before redis-server binds it: then
        // that server exits, and the whole cluster is started again on other ports.
        for _ in 0..5 {
            if cluster.launch() {
                cluster.create();
                return cluster;
            }
            cluster.kill();
        }
        panic!("could not start a Redis Cluster");
    }

    /// The store URL: every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// A plain connection to node `i`.
    pub fn node(&self, i: usize) -> redis::Connection {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.ports[i])).unwrap();
        client
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap()
    }

    /// The node (index into [`RedisCluster::ports`]) whose slots hold `key`.
    pub fn node_of(&self, key: &str) -> usize {
        let mut conn = self.node(0);
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .unwrap();
        // CLUSTER SLOTS: [[start, end, [host, port, id], …], …]
        let ranges: Vec<(u16, u16, (String, u16))> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query::<Vec<redis::Value>>(&mut conn)
            .unwrap()
            .into_iter()
            .map(|range| {
                let redis::Value::Array(items) = range else {
                    panic!("CLUSTER SLOTS: {range:?}")
                };
                let start: u16 = redis::from_redis_value_ref(&items[0]).unwrap();
                let end: u16 = redis::from_redis_value_ref(&items[1]).unwrap();
                let redis::Value::Array(primary) = &items[2] else {
                    panic!("CLUSTER SLOTS: {items:?}")
                };
                let host: String = redis::from_redis_value_ref(&primary[0]).unwrap();
                let port: u16 = redis::from_redis_value_ref(&primary[1]).unwrap();
                (start, end, (host, port))
            })
            .collect();
        let (_, _, (_, port)) = ranges
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .expect("every slot is served");
        self.ports.iter().position(|p| p == port).unwrap()
    }

    /// SIGKILLs node `i` (its slots are not served any more; the rest of the cluster goes on
    /// until the node timeout, 15 s, marks the cluster down).
    pub fn kill_node(&mut self, i: usize) {
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
    }

    /// Starts the nodes; false when one of them could not start (its port was taken).
    fn launch(&mut self) -> bool {
        // Client and bus ports, all distinct: held together while chosen.
        let listeners: Vec<std::net::TcpListener> = (0..2 * CLUSTER_NODES)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        drop(listeners);
        assert!(!ports.contains(&6379) && !ports.contains(&16379));
        self.ports = ports[..CLUSTER_NODES].to_vec();
        self.bus_ports = ports[CLUSTER_NODES..].to_vec();
        for i in 0..CLUSTER_NODES {
            let dir = self.dir.path().join(format!("node-{i}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let child = self.spawn_node(i);
            self.children.push(child);
        }
        (0..CLUSTER_NODES).all(|i| self.wait_node(i))
    }

    /// Starts node `i` on its ports and folder (its `nodes.conf` there, if any, makes it
    /// rejoin the cluster it was part of).
    fn spawn_node(&self, i: usize) -> Child {
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let dir = self.dir.path().join(format!("node-{i}"));
        Command::new(&bin)
            .args([
                "--port",
                &self.ports[i].to_string(),
                "--cluster-port",
                &self.bus_ports[i].to_string(),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--dir",
                dir.to_str().unwrap(),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server must be installed (see scripts/test.sh)")
    }

    /// Waits until node `i` answers PING; false if it exited.
    fn wait_node(&mut self, i: usize) -> bool {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if self.children[i].try_wait().unwrap().is_some() {
                return false;
            }
            if self.query(i, &["PING"]).is_some() {
                return true;
            }
            assert!(Instant::now() < end, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILLs every node, then starts them again on the same ports and folders: they form
    /// the same cluster again (slots as before), with no data (no persistence).
    pub fn restart(&mut self) {
        self.kill();
        for i in 0..CLUSTER_NODES {
            let child = self.spawn_node(i);
            self.children.push(child);
        }
        for i in 0..CLUSTER_NODES {
            assert!(self.wait_node(i), "node {i} did not start again");
        }
        self.wait_ok();
    }

    /// Forms the cluster and waits until every node says it is ok.
    fn create(&self) {
        let cli = std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into());
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(self.ports.iter().map(|p| format!("127.0.0.1:{p}")));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = Command::new(cli)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed (see scripts/test.sh)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_ok();
    }

    /// Waits until every node says `cluster_state:ok`.
    fn wait_ok(&self) {
        let end = Instant::now() + Duration::from_secs(30);
        for i in 0..CLUSTER_NODES {
            loop {
                let info = self.query(i, &["CLUSTER", "INFO"]).unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < end, "cluster never ok: {info}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// One command to node `i` (its reply as text), or None if the node does not answer.
    fn query(&self, i: usize, args: &[&str]) -> Option<String> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.ports[i])).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let value: redis::Value = cmd.query(&mut conn).ok()?;
        Some(match value {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::VerbatimString { text, .. } => text,
            other => format!("{other:?}"),
        })
    }

    /// SIGKILLs every node.
    pub fn kill(&mut self) {
        for mut child in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.kill();
    }
}
