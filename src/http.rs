//! The HTTP surface: [`AppState`], the router, the error type every handler answers with, and
//! the health endpoints. The handlers themselves live with their part of the data flow
//! ([`crate::ingest`], [`crate::fanout::websub`], [`crate::catchup`]).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::compression::CompressionLayer;

use crate::batcher::ChannelFeed;
use crate::config::Config;
use crate::fanout::Fanout;
use crate::store::{Store, StoreError};

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub feeds: Arc<BTreeMap<String, Arc<ChannelFeed>>>,
    pub fanout: Arc<Fanout>,
    /// Background work started by handlers (verifications) runs here.
    pub tasks: TaskTracker,
    /// Cancelled when shutdown begins: long-lived responses (websockets, event streams) end.
    pub shutdown: CancellationToken,
    /// Websocket connections per client address.
    pub connections: Arc<crate::live::ws::Connections>,
}

/// An error answer: a status and a short reason, as JSON `{"error": …}` (with the index of the
/// bad change, or the oldest retained seq, when that is the point) or as plain text.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub reason: String,
    pub index: Option<usize>,
    pub oldest: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, reason: impl Into<String>) -> ApiError {
        ApiError {
            status,
            reason: reason.into(),
            index: None,
            oldest: None,
        }
    }

    pub fn bad_request(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, reason)
    }

    pub fn unauthorized(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, reason)
    }

    pub fn not_found(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, reason)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        tracing::error!(error = %e, "store error");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the store is unavailable; try again",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({ "error": self.reason });
        if let Some(index) = self.index {
            body["index"] = index.into();
        }
        if let Some(oldest) = self.oldest {
            body["oldest"] = oldest.into();
        }
        let mut response = (self.status, Json(body)).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
        }
        if let Some(oldest) = self.oldest {
            if let Ok(v) = http::HeaderValue::from_str(&oldest.to_string()) {
                headers.insert("x-changehub-oldest", v);
            }
        }
        response
    }
}

/// Every route of the hub.
pub fn router(state: AppState) -> Router {
    use crate::live::{dashboard, sse, ws};
    use crate::{api, catchup, fanout::websub, ingest, live};
    let documents = Router::new()
        .route("/channels/{name}/changelist.xml", get(catchup::changelist))
        .route(
            "/channels/{name}/changes",
            get(catchup::changes_after).post(ingest::post_changes),
        )
        .route(
            "/channels/{name}/capabilitylist.xml",
            get(catchup::capability_list),
        )
        .route(
            "/.well-known/resourcesync",
            get(catchup::source_description),
        )
        .layer(CompressionLayer::new());
    Router::new()
        .route("/hub", post(websub::hub))
        .route("/publish", post(websub::hub))
        .route("/", get(dashboard::index))
        .route("/assets/app.js", get(dashboard::app_js))
        .route("/assets/style.css", get(dashboard::style_css))
        .route("/ws", get(ws::upgrade))
        .route("/channels", get(live::channels))
        .route("/channels/{name}/events", get(sse::events))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/channels", get(api::channels))
        .route("/api/subscriptions", get(api::subscriptions))
        .route("/api/live", get(api::live))
        .route(
            "/api/subscriptions/{id}",
            axum::routing::delete(api::delete_subscription),
        )
        .route("/api/subscriptions/{id}/redeliver", post(api::redeliver))
        .merge(documents)
        .layer(axum::extract::DefaultBodyLimit::max(state.config.max_body))
        .with_state(state)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> Response {
    match state.store.ping().await {
        Ok(()) => "ready\n".into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store unavailable: {e}\n"),
        )
            .into_response(),
    }
}
