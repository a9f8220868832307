//! The `changehub` binary: parses the command line, starts logging, and hands over to the
//! library ([`changehub::run`]). The only client code that lives here is `changehub tail`
//! ([`tail`]), a websocket client of the hub that the library does not need.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::time::Duration;

mod tail;

#[derive(Parser)]
#[command(
    name = "changehub",
    version,
    about = "A ResourceSync change-notification hub"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the hub.
    Serve(Box<changehub::config::ServeArgs>),
    /// Exit 0 when the hub at URL is ready (GET URL/readyz answers 200).
    Healthcheck {
        /// Base URL of the hub, e.g. http://127.0.0.1:8080
        url: String,
    },
    /// Follow a channel over the websocket, from a --since cursor.
    ///
    /// Prints one line per change on stdout (seq, change, datetime, loc; tab-separated) and the
    /// protocol's events on stderr; reconnects with backoff and resumes after the last seq
    /// printed.
    Tail(tail::TailArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "changehub=info,warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve(args) => serve(*args).await,
        Command::Healthcheck { url } => healthcheck(&url).await,
        Command::Tail(args) => tail::run(args, shutdown_signal()).await,
    }
}

async fn serve(args: changehub::config::ServeArgs) -> anyhow::Result<()> {
    let config = args.resolve()?;
    if config.channels.is_empty() {
        tracing::warn!("no channels declared; add --channel NAME=TOKEN");
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    changehub::run(listener, config, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

async fn healthcheck(url: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let url = format!("{}/readyz", url.trim_end_matches('/'));
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
