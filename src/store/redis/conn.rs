//! Where the store connects: the `--redis` URL read as one server or a Redis Cluster
//! ([`Target`]), and the command connections ([`Conn`]) that hide which of the two it is.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use std::time::Duration;

use super::{unavailable, OP_TIMEOUT};
use crate::store::StoreError;

/// The URL scheme of a Redis Cluster: `redis+cluster://[user:password@]host:port[,host:port…][/]`
/// names seed nodes (any few of the cluster's nodes; the rest is discovered).
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// Where the store's data lives, as given by `--redis`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One server: any URL the redis crate opens (`redis://host:port/db`, `redis+unix://…`).
    Single(String),
    /// A Redis Cluster: its seed nodes, as `redis://` URLs (credentials repeated on each).
    Cluster(Vec<String>),
}

impl Target {
    /// Reads a `--redis` URL: [`CLUSTER_SCHEME`] for a cluster, anything else for one server.
    pub fn parse(url: &str) -> Result<Target, String> {
        let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) else {
            return Ok(Target::Single(url.to_string()));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (format!("{auth}@"), hosts),
            None => (String::new(), rest),
        };
        let usage = || {
            format!(
                "{url:?}: a cluster URL names seed nodes only, \
                 {CLUSTER_SCHEME}[user:password@]host:port[,host:port…] (no database, no query)"
            )
        };
        if hosts.contains(['/', '?', '#', '@']) {
            return Err(usage());
        }
        let seeds: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{auth}{h}/"))
            .collect();
        if seeds.is_empty() {
            return Err(usage());
        }
        for seed in &seeds {
            redis::Client::open(seed.as_str()).map_err(|e| format!("{}: {e}", usage()))?;
        }
        Ok(Target::Cluster(seeds))
    }

    /// Opens two command connections (lazily: nothing is dialled until the first command)
    /// and the clients the pub/sub listener connects with — one server, or a cluster's seed
    /// nodes: classic pub/sub reaches every node's subscribers whichever node a message was
    /// published on.
    pub(super) fn connect(&self) -> Result<([Conn; 2], Vec<redis::Client>), StoreError> {
        match self {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str()).map_err(unavailable)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(Some(OP_TIMEOUT))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                let open = || {
                    ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                        .map(Conn::Single)
                        .map_err(unavailable)
                };
                Ok(([open()?, open()?], vec![client]))
            }
            Target::Cluster(seeds) => {
                let client = ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(Duration::from_secs(2))
                    .response_timeout(OP_TIMEOUT)
                    .retries(3)
                    .max_retry_wait(500)
                    .build()
                    .map_err(unavailable)?;
                let config = ClusterConfig::new()
                    .set_connection_timeout(Duration::from_secs(2))
                    .set_response_timeout(OP_TIMEOUT);
                let open = || {
                    Conn::Cluster(client.get_pending_async_connection_with_config(config.clone()))
                };
                let conns = [open(), open()];
                let subscribers = seeds
                    .iter()
                    .map(|s| redis::Client::open(s.as_str()))
                    .collect::<RedisResult<Vec<_>>>()
                    .map_err(unavailable)?;
                Ok((conns, subscribers))
            }
        }
    }
}

/// The store's command connection: one server or a cluster. Both reconnect by themselves;
/// both run the same commands, pipelines and scripts (on a cluster each goes to the primary
/// of its keys' slot — hence the slot rule in the module documentation).
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_seed_nodes() {
        assert_eq!(
            Target::parse("redis://127.0.0.1:6379/2").unwrap(),
            Target::Single("redis://127.0.0.1:6379/2".into())
        );
        assert_eq!(
            Target::parse("redis+unix:///tmp/r.sock").unwrap(),
            Target::Single("redis+unix:///tmp/r.sock".into())
        );
        assert_eq!(
            Target::parse("redis+cluster://10.0.0.1:7000,10.0.0.2:7001/").unwrap(),
            Target::Cluster(vec![
                "redis://10.0.0.1:7000/".into(),
                "redis://10.0.0.2:7001/".into()
            ])
        );
        assert_eq!(
            Target::parse("redis+cluster://u:p%40ss@h1:7000,h2:7000").unwrap(),
            Target::Cluster(vec![
                "redis://u:p%40ss@h1:7000/".into(),
                "redis://u:p%40ss@h2:7000/".into()
            ])
        );
        for bad in [
            "redis+cluster://",
            "redis+cluster://,",
            "redis+cluster://h1:7000/1",
            "redis+cluster://h1:7000?protocol=3",
            "redis+cluster://h1:notaport",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
