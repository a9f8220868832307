//! Tokens and secrets: bearer tokens read from requests, and comparisons that take the same
//! time whatever the input, so that a token cannot be guessed byte by byte.
//!
//! Every comparison of a secret value goes through [`same_secret`]: both sides are hashed
//! (SHA-256) first, and the fixed-size digests are compared in constant time, so neither the
//! content nor the length of the expected value leaks.

use http::HeaderMap;

use crate::config::ChannelConfig;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Why a request's credentials were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing Authorization: Bearer token")]
    Missing,
    #[error("Authorization must be a Bearer token")]
    NotBearer,
    #[error("wrong token")]
    Wrong,
}

/// True when `given` equals `expected`, compared in constant time.
pub fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let given = Sha256::digest(given);
    let expected = Sha256::digest(expected);
    given.ct_eq(&expected).into()
}

/// The token of `Authorization: Bearer <token>` (the scheme in any case), if the header is
/// there; `Err(NotBearer)` for another scheme or an unreadable value.
pub fn bearer(headers: &HeaderMap) -> Result<Option<&str>, AuthError> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value.to_str().map_err(|_| AuthError::NotBearer)?.trim();
    let (scheme, token) = value.split_once(' ').ok_or(AuthError::NotBearer)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::NotBearer);
    }
    Ok(Some(token.trim()))
}

/// Checks that the request carries `Authorization: Bearer <expected>`.
pub fn check_bearer(headers: &HeaderMap, expected: &str) -> Result<(), AuthError> {
    let token = bearer(headers)?.ok_or(AuthError::Missing)?;
    if same_secret(token.as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(AuthError::Wrong)
    }
}

/// The name of the publisher of `channel` whose token the request's bearer token is. Every
/// token is compared, in constant time each.
pub fn check_publisher<'a>(
    headers: &HeaderMap,
    channel: &'a ChannelConfig,
) -> Result<&'a str, AuthError> {
    let token = bearer(headers)?.ok_or(AuthError::Missing)?;
    let mut found = None;
    for p in &channel.publishers {
        if same_secret(token.as_bytes(), p.token.as_bytes()) {
            found = Some(p.name.as_str());
        }
    }
    found.ok_or(AuthError::Wrong)
}

/// True when `token` may read `channel` (public channels need none; private ones their read
/// token).
pub fn can_read(channel: &ChannelConfig, token: Option<&str>) -> bool {
    match &channel.read_token {
        None => true,
        Some(expected) => token.is_some_and(|t| same_secret(t.as_bytes(), expected.as_bytes())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[test]
    fn bearer_in_any_case() {
        for v in ["Bearer t0k", "bearer t0k", "BEARER  t0k "] {
            assert_eq!(check_bearer(&headers(v), "t0k"), Ok(()), "{v}");
        }
        assert_eq!(
            check_bearer(&headers("Bearer nope"), "t0k"),
            Err(AuthError::Wrong)
        );
        assert_eq!(
            check_bearer(&headers("Basic dTpw"), "t0k"),
            Err(AuthError::NotBearer)
        );
        assert_eq!(
            check_bearer(&headers("Bearer"), "t0k"),
            Err(AuthError::NotBearer)
        );
        assert_eq!(
            check_bearer(&HeaderMap::new(), "t0k"),
            Err(AuthError::Missing)
        );
        assert_eq!(bearer(&HeaderMap::new()), Ok(None));
    }

    #[test]
    fn secrets() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"x"));
    }
}
