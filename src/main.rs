//! The `changehub` binary: parses the command line, starts logging, and dispatches to the
//! library: `serve` to [`changehub::run`], the client commands to [`changehub::client`].

use anyhow::Context;
use clap::{Parser, Subcommand};

use changehub::client::{healthcheck, publish, subscribe, tail};
use changehub::logging::{self, LogFormat};

#[derive(Parser)]
#[command(
    name = "changehub",
    version,
    about = "A ResourceSync change-notification hub"
)]
struct Cli {
    /// Log lines on stderr: text, or one JSON object per line. Colours only on a terminal
    /// (never with NO_COLOR); RUST_LOG chooses what is logged (default changehub=info,warn).
    #[arg(
        long,
        global = true,
        env = "CHANGEHUB_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the hub.
    Serve(Box<changehub::config::ServeArgs>),
    /// Exit 0 when the hub at URL is ready (GET URL/readyz answers 200).
    Healthcheck(healthcheck::HealthcheckArgs),
    /// Follow a channel over the websocket, from a --since cursor.
    ///
    /// Prints one line per change on stdout (seq, change, datetime, loc; tab-separated) and the
    /// protocol's events on stderr; reconnects with backoff and resumes after the last seq
    /// printed.
    Tail(tail::TailArgs),
    /// Push changes to a channel from files (JSON, NDJSON, a ResourceSync Change List) or
    /// stdin, split into requests, each with an Idempotency-Key, retried until accepted; or,
    /// with --scan DIR, what changed in a folder since the last scan.
    Publish(publish::PublishArgs),
    /// Follow a topic as a destination: WebSub callbacks (or --via ws), signatures checked,
    /// gaps filled from the hub's log, a crash-safe cursor in --state; prints each change as a
    /// JSON line, or keeps a mirror of the resources with --mirror DIR (--audit checks it).
    Subscribe(subscribe::SubscribeArgs),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let result = match cli.command {
        Command::Serve(args) => serve(*args).await,
        Command::Healthcheck(args) => healthcheck::run(args).await,
        Command::Tail(args) => tail::run(args, shutdown_signal()).await,
        Command::Publish(args) => publish::run(args).await.map_err(Into::into),
        Command::Subscribe(args) => subscribe::run(args, shutdown_signal())
            .await
            .map_err(Into::into),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, without a backtrace.
            eprintln!("changehub: {e:#}");
            // A command with exit statuses of its own says which; anything else is 1.
            let code = if let Some(e) = e.downcast_ref::<publish::PublishError>() {
                e.exit_code()
            } else if let Some(e) = e.downcast_ref::<subscribe::SubscribeError>() {
                e.exit_code()
            } else {
                1
            };
            std::process::ExitCode::from(code)
        }
    }
}

async fn serve(args: changehub::config::ServeArgs) -> anyhow::Result<()> {
    changehub::server::tune_malloc();
    let config = args.resolve()?;
    if config.channels.is_empty() {
        tracing::warn!("no channels declared; add --channel NAME=TOKEN, or create channels with PUT /api/channels/NAME (needs --admin-token)");
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    changehub::server::trim_freed_memory(changehub::server::TRIM_EVERY);
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
