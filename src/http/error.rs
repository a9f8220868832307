//! The error every handler answers with: a status and a short reason, as JSON. Store failures
//! become 503 without internals (and are logged), a full disk 507 (logged by the store, once);
//! refused credentials become 401 or 403.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::auth::{self, AuthError};
use crate::config::ChannelConfig;
use crate::store::StoreError;

/// An error answer: a status and a short reason, as JSON `{"error": …}` (with the index of the
/// bad change, or the oldest retained seq, when that is the point) or as plain text.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub reason: String,
    pub index: Option<usize>,
    pub oldest: Option<u64>,
    /// A log's newest seq and epoch (409 for a cursor that is not of this log).
    pub position: Option<(u64, String)>,
}

impl ApiError {
    pub fn new(status: StatusCode, reason: impl Into<String>) -> ApiError {
        ApiError {
            status,
            reason: reason.into(),
            index: None,
            oldest: None,
            position: None,
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
        match e {
            // The store logs these itself, at a bounded rate: not once per request.
            StoreError::Full(_) => ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "the hub's disk is full: nothing can be stored until space is freed, and this \
                 request stored nothing; retry later",
            ),
            StoreError::Io(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the store is closed after an I/O error (such as a full disk) and reopens on its \
                 own; try again",
            ),
            e => ApiError::logged(e),
        }
    }
}

impl ApiError {
    /// A store error that the store does not log itself: logged here, once per request.
    fn logged(e: StoreError) -> ApiError {
        tracing::error!(error = %e, "store error");
        match e {
            StoreError::OutcomeUnknown(_) => ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "the store did not confirm the write in time: it may have happened. Retry with \
                 the same Idempotency-Key, and it counts once",
            ),
            _ => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the store is unavailable; try again",
            ),
        }
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
        if let Some((last, epoch)) = &self.position {
            body["last"] = (*last).into();
            body["epoch"] = epoch.as_str().into();
        }
        let mut response = (self.status, Json(body)).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
        }
        // A body refused before it was all read is not drained: the connection cannot carry
        // another request, and the client must know not to reuse it.
        if matches!(
            self.status,
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
        ) {
            headers.insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
        }
        // A full disk takes a person to free space: no point in retrying every second.
        if self.status == StatusCode::INSUFFICIENT_STORAGE {
            headers.insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("10"),
            );
        }
        if let Some(oldest) = self.oldest {
            if let Ok(v) = http::HeaderValue::from_str(&oldest.to_string()) {
                headers.insert("x-changehub-oldest", v);
            }
        }
        if let Some((last, epoch)) = &self.position {
            if let Ok(v) = http::HeaderValue::from_str(&last.to_string()) {
                headers.insert("x-changehub-last", v);
            }
            if let Ok(v) = http::HeaderValue::from_str(epoch) {
                headers.insert("x-changehub-epoch", v);
            }
        }
        response
    }
}

impl ApiError {
    /// Checks `Authorization: Bearer <token>` (`what` names the token in a refusal).
    /// The name of the publisher of `channel` whose token the request carries.
    pub fn check_publisher(
        headers: &HeaderMap,
        channel: &ChannelConfig,
    ) -> Result<String, ApiError> {
        auth::check_publisher(headers, channel)
            .map(str::to_string)
            .map_err(|e| match e {
                AuthError::Missing | AuthError::NotBearer => ApiError::unauthorized(e.to_string()),
                AuthError::Wrong => {
                    ApiError::new(StatusCode::FORBIDDEN, "wrong token for this channel")
                }
            })
    }

    pub fn check_bearer(headers: &HeaderMap, token: &str, what: &str) -> Result<(), ApiError> {
        auth::check_bearer(headers, token).map_err(|e| match e {
            AuthError::Missing | AuthError::NotBearer => ApiError::unauthorized(e.to_string()),
            AuthError::Wrong => {
                ApiError::new(StatusCode::FORBIDDEN, format!("wrong token for {what}"))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full disk is 507 with a reason, in the error format of every other answer.
    #[tokio::test]
    async fn a_full_disk_is_507_with_a_reason() {
        let response = ApiError::from(StoreError::Full("ENOSPC".into())).into_response();
        assert_eq!(response.status(), StatusCode::INSUFFICIENT_STORAGE);
        assert!(response.headers().contains_key(http::header::RETRY_AFTER));
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let reason = body["error"].as_str().unwrap();
        assert!(reason.contains("disk is full"), "{reason}");
        assert!(!reason.contains("ENOSPC"), "no internals: {reason}");
    }
}
