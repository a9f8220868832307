//! One XMPP client session of the bridge: the account logged in (STARTTLS, or plain TCP to a
//! loopback server when asked), IQ requests with a deadline, and the stream's own events
//! drained while waiting (so that the client's queues never fill up).
//!
//! The client (`tokio_xmpp::Client`) re-establishes a lost stream by itself; a request sent
//! meanwhile fails or times out, and the bridge tries it again. Dropping the session stops
//! the client.

use futures_util::StreamExt;
use std::time::Duration;
use tokio_xmpp::connect::DnsConfig;
use tokio_xmpp::jid::{BareJid, Jid};
use tokio_xmpp::minidom::Element;
use tokio_xmpp::parsers::stanza_error::DefinedCondition;
use tokio_xmpp::xmlstream::Timeouts;
use tokio_xmpp::{Client, Event, IqRequest, IqResponse};

use crate::config::XmppConfig;

/// Why a request did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the XMPP service refused the request: {condition:?}{text}")]
    Refused {
        condition: DefinedCondition,
        /// The service's explanation, with a leading ": ", or empty.
        text: String,
    },
    #[error("no answer from the XMPP server within {0:?}")]
    Timeout(Duration),
    #[error("the XMPP connection failed: {0}")]
    Connection(String),
    #[error("invalid XMPP settings: {0}")]
    Settings(String),
}

impl SessionError {
    /// The service answered with this condition.
    pub fn is(&self, wanted: DefinedCondition) -> bool {
        matches!(self, SessionError::Refused { condition, .. } if *condition == wanted)
    }
}

/// A logged-in client and the service it talks to.
pub struct Session {
    client: Client,
    service: Jid,
    timeout: Duration,
    /// Bumped at every (re)established stream: nodes are set up again after each.
    pub streams: u64,
}

impl Session {
    /// Starts the client; it connects in the background (see [`Session::request`]).
    pub fn open(config: &XmppConfig, timeout: Duration) -> Result<Session, SessionError> {
        let settings = |e: &dyn std::fmt::Display| SessionError::Settings(e.to_string());
        let jid = BareJid::new(&config.jid).map_err(|e| settings(&e))?;
        let service = Jid::new(&config.service).map_err(|e| settings(&e))?;
        let password = config.password.clone();
        let timeouts = Timeouts::default();
        let client = match (&config.server, config.plaintext) {
            (Some(server), true) => {
                Client::new_plaintext(jid, password, DnsConfig::addr(server), timeouts)
            }
            (Some(server), false) => {
                Client::new_starttls(jid, password, DnsConfig::addr(server), timeouts)
            }
            (None, _) => Client::new(jid, password),
        };
        Ok(Session {
            client,
            service,
            timeout,
            streams: 0,
        })
    }

    /// Sends an IQ `set` to the service and waits for its answer: the result's payload, or
    /// the service's error, or a timeout. Events of the stream are handled meanwhile.
    pub async fn request(&mut self, payload: Element) -> Result<Option<Element>, SessionError> {
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.exchange(payload))
            .await
            .unwrap_or(Err(SessionError::Timeout(timeout)))
    }

    async fn exchange(&mut self, payload: Element) -> Result<Option<Element>, SessionError> {
        let mut token = self
            .client
            .send_iq(Some(self.service.clone()), IqRequest::Set(payload))
            .await;
        loop {
            tokio::select! {
                answer = &mut token => {
                    return match answer {
                        Ok(IqResponse::Result(payload)) => Ok(payload),
                        Ok(IqResponse::Error(e)) => Err(SessionError::Refused {
                            condition: e.defined_condition,
                            text: e
                                .texts
                                .values()
                                .next()
                                .map(|t| format!(": {t}"))
                                .unwrap_or_default(),
                        }),
                        Err(e) => Err(SessionError::Connection(e.to_string())),
                    };
                }
                event = self.client.next() => self.handle(event)?,
            }
        }
    }

    /// Handles the stream's events until `wait` ends (the bridge waits for news this way).
    pub async fn idle(&mut self, wait: impl std::future::Future<Output = ()>) {
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => return,
                event = self.client.next() => {
                    if self.handle(event).is_err() {
                        // The client is gone for good: nothing to handle any more.
                        wait.await;
                        return;
                    }
                }
            }
        }
    }

    fn handle(&mut self, event: Option<Event>) -> Result<(), SessionError> {
        match event {
            Some(Event::Online { .. }) => {
                self.streams += 1;
                tracing::debug!("XMPP stream established");
                Ok(())
            }
            Some(Event::Disconnected(e)) => {
                tracing::debug!(error = %e, "XMPP stream lost");
                Ok(())
            }
            // Nothing else is addressed to the hub's account that it needs to read.
            Some(Event::Stanza(_)) => Ok(()),
            None => Err(SessionError::Connection("the XMPP client stopped".into())),
        }
    }
}
