//! The web layer: the only room that knows axum. It holds [`AppState`], the [`router`], the
//! error every handler answers with ([`ApiError`]) and one file per endpoint family. A handler
//! parses the request, authenticates, calls one domain function and renders the answer;
//! nothing else.
//!
//! | file | endpoints | domain it calls |
//! |---|---|---|
//! | `ingest.rs` | `POST /channels/{name}/changes` | [`crate::ingest`] |
//! | `websub.rs` | `POST /hub`, `POST /publish` | [`crate::fanout::websub`], [`crate::external::publish`] |
//! | `catchup.rs` | `changelist.xml`, the archive and closed lists, `changes?after=`, `resourcelist.xml`, `capabilitylist.xml`, `/.well-known/resourcesync` | [`crate::catchup`] |
//! | `dumps.rs` | `changedump.xml` (and its index pages), `changedump/{FIRST-LAST}.zip`, `.manifest.xml` | [`crate::dumps`] |
//! | `ws.rs` | `GET /ws` (the websocket session: queue, slow consumers, pings) | [`crate::live`] |
//! | `sse.rs` | `GET /channels/{name}/events` | [`crate::live`] |
//! | `feedsync.rs` | `feedsync.xml`, `feedsync.json`, `POST /channels/{name}/feedsync` | [`crate::catchup`], [`crate::ingest::feedsync`] |
//! | `admin.rs` | `/api/…` | [`crate::fanout`], [`crate::external`], the store |
//! | `dashboard.rs` | `GET /`, its assets, `GET /channels` | the store |
//! | `health.rs` | `/healthz`, `/readyz` | the store |
//! | `metrics.rs` | `/metrics` | [`crate::telemetry`] |
//! | `listen.rs` | accepting connections: timeouts and caps | — |

mod admin;
mod catchup;
mod dashboard;
mod dumps;
mod error;
mod feedsync;
mod health;
mod ingest;
mod listen;
mod metrics;
pub(crate) mod rendered;
mod sse;
mod websub;
pub mod ws;

pub use error::ApiError;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::{delete, get, post};
use axum::Router;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::compression::predicate::{DefaultPredicate, Predicate, SizeAbove};
use tower_http::compression::CompressionLayer;

use crate::batcher::Feeds;
use crate::config::Config;
use crate::external::External;
use crate::fanout::Fanout;
use crate::store::Store;

/// What every handler can reach: one allocation shared by every request, so that handing it
/// to a handler is one reference count, not one per part.
pub type AppState = Arc<Shared>;

/// The parts of [`AppState`].
pub struct Shared {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    /// The feeds of the hosted channels.
    pub feeds: Feeds,
    pub fanout: Arc<Fanout>,
    pub external: Arc<External>,
    /// Background work started by handlers (verifications) runs here.
    pub tasks: TaskTracker,
    /// Cancelled when shutdown begins: long-lived responses (websockets, event streams) end.
    pub shutdown: CancellationToken,
    /// Websocket connections per client address, and their shared frames.
    pub connections: Arc<ws::Connections>,
    /// Starts and stops the channels of the admin API.
    pub control: Arc<crate::server::Control>,
    /// The Prometheus recorder's handle (`None`: another recorder was installed first).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Topics and closed Change Lists as last rendered.
    pub rendered: Arc<rendered::RenderedDocs>,
    /// The entries of `changes?after=` pages, rendered in blocks.
    pub pages: Arc<crate::catchup::pages::PageCache>,
    /// The XMPP PubSub bridge, when configured (its status and its node's address).
    pub xmpp: Option<Arc<crate::xmpp::Bridge>>,
}

/// Every route of the hub.
pub fn router(state: AppState) -> Router {
    let documents = Router::new()
        .route("/channels/{name}/changelist.xml", get(catchup::changelist))
        .route(
            "/channels/{name}/changelist-archive.xml",
            get(catchup::archive),
        )
        .route(
            "/channels/{name}/changelist/{range}",
            get(catchup::closed_list),
        )
        .route("/channels/{name}/changes", get(catchup::changes_after))
        .route(
            "/channels/{name}/capabilitylist.xml",
            get(catchup::capability_list),
        )
        .route(
            "/channels/{name}/resourcelist.xml",
            get(catchup::resource_list),
        )
        .route(
            "/channels/{name}/feedsync.xml",
            get(feedsync::collection_xml),
        )
        .route(
            "/channels/{name}/feedsync.json",
            get(feedsync::collection_json),
        )
        .route(
            "/.well-known/resourcesync",
            get(catchup::source_description),
        )
        .route("/channels/{name}/changedump.xml", get(dumps::change_dump))
        // Rendered documents carry their own gzip form (`rendered`); anything else under
        // `rendered::GZIP_FROM` bytes goes as it is (a compressor's state costs more to set up
        // than a small body saves).
        .layer(CompressionLayer::new().compress_when(
            DefaultPredicate::new().and(SizeAbove::new(rendered::GZIP_FROM as u16)),
        ));
    let routes = Router::new()
        // ZIPs are compressed already, and served as they are.
        .route("/channels/{name}/changedump/{file}", get(dumps::dump_file))
        // Beside its GET in `documents`, without the compression layer: a 202's few bytes
        // are never compressed, and the layer costs every publish its allocations.
        .route("/channels/{name}/changes", post(ingest::post_changes))
        .route("/hub", post(websub::hub))
        .route("/publish", post(websub::hub))
        .route("/", get(dashboard::index))
        .route("/assets/app.js", get(dashboard::app_js))
        .route("/assets/style.css", get(dashboard::style_css))
        .route("/ws", get(ws::upgrade))
        .route("/channels", get(dashboard::channels))
        .route("/channels/{name}/events", get(sse::events))
        .route("/healthz", get(health::healthz))
        .route("/metrics", get(metrics::metrics))
        .route("/readyz", get(health::readyz))
        .route("/api/channels", get(admin::channels))
        .route(
            "/api/channels/{name}",
            axum::routing::put(admin::put_channel).delete(admin::delete_channel),
        )
        .route("/channels/{name}/feedsync", post(feedsync::post_collection))
        .route("/api/channels/{name}/resources", get(admin::resource))
        .route("/api/channels/{name}/conflicts", get(admin::conflicts))
        .route("/api/subscriptions", get(admin::subscriptions))
        .route("/api/live", get(admin::live))
        .route(
            "/api/subscriptions/{id}",
            delete(admin::delete_subscription),
        )
        .route("/api/subscriptions/{id}/redeliver", post(admin::redeliver))
        .merge(documents)
        .fallback(no_such_endpoint);
    let max_body = state.config.max_body;
    guarded(routes.with_state(state), max_body)
}

/// The layers around every route: the body limit; `Content-Encoding: gzip` bodies decoded
/// (the limit applies to what comes out) and any other encoding refused with 415 instead of
/// being taken as plain; a reason for the refusals those layers give; and a panicking
/// handler answered 500 (and logged once) instead of a dropped connection.
///
/// They wrap the routes once, from outside (as the router's one fallback), not each route
/// (`Router::layer`): each route is a boxed service that a request clones, and each layer
/// added that way boxes every route once more, so a request cloned a box per layer.
fn guarded(routes: Router, max_body: usize) -> Router {
    let layers = tower::ServiceBuilder::new()
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
        .map_response(explain)
        .layer(tower_http::decompression::RequestDecompressionLayer::new())
        .layer(axum::extract::DefaultBodyLimit::max(max_body));
    Router::new().fallback_service(layers.service(routes))
}

/// Any path the hub does not serve.
async fn no_such_endpoint() -> ApiError {
    ApiError::not_found("no such endpoint (the endpoints: docs/http.md)")
}

/// Gives a reason to the refusals that the layers around the handlers answer without one
/// (an unsupported `Content-Encoding`, a method a path does not take).
fn explain<B>(response: http::Response<B>) -> axum::response::Response
where
    B: axum::body::HttpBody<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    use axum::body::HttpBody as _;
    let response = response.map(axum::body::Body::new);
    let status = response.status();
    if !status.is_client_error() || response.body().size_hint().exact() != Some(0) {
        return response;
    }
    let reason = match status {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            "unsupported Content-Encoding: send the body plain or with gzip"
        }
        StatusCode::METHOD_NOT_ALLOWED => "this path does not take that method",
        _ => return response,
    };
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(http::header::CONTENT_LENGTH);
    parts.headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let body = serde_json::json!({ "error": reason }).to_string();
    axum::response::Response::from_parts(parts, axum::body::Body::from(body))
}

/// A handler that panicked: 500 and one log line, instead of a dropped connection.
fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown".into());
    tracing::error!(panic = %what, "a request handler panicked");
    axum::response::IntoResponse::into_response((
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal error: the hub could not handle this request",
    ))
}

/// What every connection serves: the [`router`], and one way around it. A push that
/// [`ingest::direct`] lets through goes straight to its handler, the hub's most frequent
/// request spared the router and its layers; any other request goes through them.
#[derive(Clone)]
pub(crate) struct App {
    router: Router,
    state: AppState,
}

/// The answer to a request, from either way.
pub(crate) type AppFuture = futures_util::future::Either<
    futures_util::future::BoxFuture<'static, Result<axum::response::Response, Infallible>>,
    tower::util::Oneshot<Router, http::Request<hyper::body::Incoming>>,
>;

impl App {
    pub(crate) fn new(state: AppState) -> App {
        App {
            router: router(state.clone()),
            state,
        }
    }

    /// Answers `request`, from the client at `peer`.
    pub(crate) fn call(
        &self,
        mut request: http::Request<hyper::body::Incoming>,
        peer: std::net::SocketAddr,
    ) -> AppFuture {
        use futures_util::FutureExt;
        use tower::ServiceExt;
        if ingest::direct(&request) {
            let pushed = ingest::post_direct(self.state.clone(), request);
            // A panic answered 500 (and logged), as the router's layers answer it.
            let answered = std::panic::AssertUnwindSafe(pushed)
                .catch_unwind()
                .map(|outcome| Ok(outcome.unwrap_or_else(panicked)));
            return futures_util::future::Either::Left(answered.boxed());
        }
        // The client's address goes into the request's extensions, where `ConnectInfo` looks
        // for it. (`Router::layer` would rebuild every route for each connection: time and
        // memory per connection, kept as long as the connection is.)
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        futures_util::future::Either::Right(self.router.clone().oneshot(request))
    }
}

/// Serves the hub's `App` (the router and the way around it) on `listener` until `stop`
/// completes, then finishes the requests in flight and lets every websocket send its close
/// frame.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let websockets = state.connections.clone();
    let limits = state.config.http;
    let served = listen::serve(listener, App::new(state), limits, stop).await;
    // Upgraded connections are not requests in flight: wait for them to send their close
    // frame (1001) before the hub goes on stopping, and the process exits.
    websockets.tasks.close();
    if tokio::time::timeout(WEBSOCKET_GRACE, websockets.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("websockets did not close in time");
    }
    served
}

/// How long shutdown waits for websockets to send their close frames.
const WEBSOCKET_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads a request body of at most `limit` bytes within `within` (`--body-timeout`): 413
/// when larger, 408 when too slow.
pub async fn read_body<B>(
    body: B,
    limit: usize,
    within: std::time::Duration,
) -> Result<bytes::Bytes, ApiError>
where
    B: http_body::Body<Data = bytes::Bytes>,
    B::Error: Into<axum::BoxError>,
{
    use http_body_util::BodyExt;
    let read = http_body_util::Limited::new(body, limit).collect();
    match tokio::time::timeout(within, read).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(_)) => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {limit} bytes, or was cut off"),
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the body did not arrive within {}",
                humantime::format_duration(within)
            ),
        )),
    }
}

/// The read token of a request: `Authorization: Bearer …` or `?token=`.
fn read_token<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> Option<&'a str> {
    crate::auth::bearer(headers).ok().flatten().or(query)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    async fn a_bug() -> &'static str {
        panic!("a bug")
    }

    #[tokio::test]
    async fn a_panicking_handler_is_answered_500_and_the_hub_goes_on() {
        let app = guarded(
            Router::new()
                .route("/boom", get(a_bug))
                .route("/fine", get(|| async { "fine" })),
            1024,
        );
        let get = |path: &str| {
            axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let answer = app.clone().oneshot(get("/boom")).await.unwrap();
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(answer.into_body(), 1024)
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&body).contains("internal error"));
        let answer = app.oneshot(get("/fine")).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
    }
}
