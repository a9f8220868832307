//! What every client command shares: the hub's URLs as a client sees them, one way to build
//! the HTTP client, and one way to open the websocket.

use anyhow::{bail, Context};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Error as WsError;

/// How long a websocket handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An open websocket to the hub.
pub type WsStream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The HTTP client of the client commands: a user agent that names changehub, and `timeout`
/// per request.
pub fn http_client(timeout: Duration) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(timeout)
        .user_agent(concat!("changehub/", env!("CARGO_PKG_VERSION")))
        .build()
        .context("cannot build the HTTP client")
}

/// Why a websocket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum WsConnectError {
    #[error("no websocket handshake with {0} within {secs}s", secs = CONNECT_TIMEOUT.as_secs())]
    Timeout(url::Url),
    /// The hub answered the upgrade with an HTTP status instead.
    #[error("{endpoint} answered {status}: {body}")]
    Refused {
        endpoint: url::Url,
        status: http::StatusCode,
        body: String,
    },
    #[error("cannot connect to {0}: {1}")]
    Io(url::Url, WsError),
}

impl WsConnectError {
    /// True when trying again cannot help: the hub refused the upgrade with a status other
    /// than 429 (too many connections) or a server error.
    pub fn is_final(&self) -> bool {
        matches!(self, WsConnectError::Refused { status, .. }
            if !(status.as_u16() == 429 || status.is_server_error()))
    }
}

/// Opens the websocket at `endpoint` (see [`ws_endpoint`]) within [`CONNECT_TIMEOUT`].
pub async fn connect_ws(endpoint: &url::Url) -> Result<WsStream, WsConnectError> {
    let connect = tokio_tungstenite::connect_async(endpoint.as_str());
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Err(_) => Err(WsConnectError::Timeout(endpoint.clone())),
        Ok(Err(WsError::Http(response))) => Err(WsConnectError::Refused {
            endpoint: endpoint.clone(),
            status: response.status(),
            body: response
                .body()
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default()
                .trim()
                .to_string(),
        }),
        Ok(Err(e)) => Err(WsConnectError::Io(endpoint.clone(), e)),
        Ok(Ok((ws, _response))) => Ok(ws),
    }
}

/// The websocket endpoint of the hub at `base` (`http://host:port/prefix` →
/// `ws://host:port/prefix/ws`).
pub fn ws_endpoint(base: &str) -> anyhow::Result<url::Url> {
    let mut url = url::Url::parse(base.trim()).with_context(|| format!("hub URL {base:?}"))?;
    match url.scheme() {
        "http" | "ws" => {}
        "https" | "wss" => bail!(
            "{base}: this build of changehub speaks plain ws:// only (no TLS); \
             reach the hub over http:// (for example through a local tunnel or TLS terminator)"
        ),
        other => bail!("{base}: unsupported scheme {other:?} (use http://host:port)"),
    }
    anyhow::ensure!(url.host_str().is_some(), "{base}: no host");
    url.set_scheme("ws")
        .map_err(|()| anyhow::anyhow!("{base}: cannot use as a websocket URL"))?;
    let path = format!("{}/ws", url.path().trim_end_matches('/'));
    url.set_path(&path);
    url.set_query(None);
    url.set_fragment(None);
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let ws = |s: &str| ws_endpoint(s).map(|u| u.to_string());
        assert_eq!(
            ws("http://127.0.0.1:8080").unwrap(),
            "ws://127.0.0.1:8080/ws"
        );
        assert_eq!(
            ws("http://hub.example.org/changehub/?x=1").unwrap(),
            "ws://hub.example.org/changehub/ws"
        );
        assert_eq!(ws("ws://[::1]:9000/").unwrap(), "ws://[::1]:9000/ws");
        let tls = ws("https://hub.example.org").unwrap_err().to_string();
        assert!(tls.contains("TLS"), "{tls}");
        assert!(ws("ftp://hub.example.org").is_err());
        assert!(ws("127.0.0.1:8080").is_err());
    }
}
