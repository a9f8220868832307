//! Logging for the binary: one line per event on stderr, as text or as JSON.
//!
//! - Colours only when stderr is a terminal and `NO_COLOR` is unset (a log file gets no
//!   escape codes).
//! - No input can forge a log line: inside an event, line breaks and other control
//!   characters are written escaped (`\n`, `\r`, `\u{1b}` …); only the newline that ends the
//!   event is written as such. JSON lines are escaped by JSON already.
//! - `RUST_LOG` chooses what is logged (default `changehub=info,warn`).

use std::io::{IsTerminal, Write};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The directive that silences the XMPP client's stream dumps (see [`init`]).
const NO_XMPP_STREAM_DUMPS: &str = "tokio_xmpp::xmlstream=off";

/// Starts logging to stderr in `format`. Call once, first thing.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("changehub=info,warn"));
    // The XMPP client library traces every byte it sends, the login's credentials included:
    // never shown, whatever RUST_LOG asks for.
    let filter = filter.add_directive(NO_XMPP_STREAM_DUMPS.parse().expect("a valid directive"));
    let colours = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let writer = SafeStderr { colours };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.with_ansi(colours).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// Stderr, through [`escape_controls`] (the formatter writes each event in one piece).
#[derive(Clone, Copy)]
struct SafeStderr {
    colours: bool,
}

impl<'a> MakeWriter<'a> for SafeStderr {
    type Writer = SafeWriter;

    fn make_writer(&'a self) -> SafeWriter {
        SafeWriter {
            colours: self.colours,
        }
    }
}

struct SafeWriter {
    colours: bool,
}

impl Write for SafeWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let escaped = escape_controls(buf, self.colours);
        std::io::stderr().lock().write_all(&escaped)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// `event` with every control character escaped but a final newline and tabs; `ESC` is kept
/// when colours are on (the formatter's own colour codes start with it).
pub fn escape_controls(event: &[u8], keep_esc: bool) -> Vec<u8> {
    let (body, end) = match event.strip_suffix(b"\n") {
        Some(body) => (body, &b"\n"[..]),
        None => (event, &b""[..]),
    };
    let mut out = Vec::with_capacity(event.len() + 8);
    for &b in body {
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.push(b),
            0x1b if keep_esc => out.push(b),
            0x00..=0x1f | 0x7f => {
                out.extend_from_slice(format!("\\u{{{b:x}}}").as_bytes());
            }
            _ => out.push(b),
        }
    }
    out.extend_from_slice(end);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_final_newline_stays() {
        let forged = b"INFO topic=http://a/\r\n2026-01-01 INFO admin logged in\n";
        assert_eq!(
            escape_controls(forged, false),
            b"INFO topic=http://a/\\r\\n2026-01-01 INFO admin logged in\n"
        );
        assert_eq!(
            escape_controls(b"a\tb\x07c\x1b[31m", false),
            b"a\tb\\u{7}c\\u{1b}[31m"
        );
        assert_eq!(
            escape_controls(b"\x1b[31mred\x1b[0m\n", true),
            b"\x1b[31mred\x1b[0m\n"
        );
        assert_eq!(escape_controls(b"no newline", false), b"no newline");
    }
}
