//! `changehub healthcheck URL`: exits 0 when the hub at URL is ready (`GET URL/readyz`
//! answers 2xx), non-zero otherwise. Used by container health checks.

use anyhow::Context;
use std::time::Duration;

use super::conn::http_client;

/// Flags of `changehub healthcheck`.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthcheckArgs {
    /// Base URL of the hub, e.g. http://127.0.0.1:8080
    pub url: String,
}

pub async fn run(args: HealthcheckArgs) -> anyhow::Result<()> {
    let client = http_client(Duration::from_secs(5))?;
    let url = format!("{}/readyz", args.url.trim_end_matches('/'));
    let resp = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    anyhow::ensure!(
        resp.status().is_success(),
        "{url} answered {}",
        resp.status()
    );
    Ok(())
}
