//! `X-Hub-Signature`: an HMAC of the exact request body, keyed with the subscriber's
//! `hub.secret`, written as `<alg>=<lowercase hex>`. The hub signs with [`signature`] when it
//! delivers (`fanout::delivery`); receivers — `changehub subscribe`, the tests — check with
//! [`verify`]. Plain computation, kept apart from delivery and from the HTTP client.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The HMAC algorithms WebSub recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    Sha1,
    #[default]
    Sha256,
    Sha384,
    Sha512,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Sha1 => "sha1",
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha384 => "sha384",
            Algorithm::Sha512 => "sha512",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sha1" => Ok(Algorithm::Sha1),
            "sha256" => Ok(Algorithm::Sha256),
            "sha384" => Ok(Algorithm::Sha384),
            "sha512" => Ok(Algorithm::Sha512),
            _ => Err(format!(
                "unknown signature algorithm {s:?} (sha1, sha256, sha384 or sha512)"
            )),
        }
    }
}

/// Appends the lowercase hex of `body`'s HMAC under `secret` to `out`.
fn mac_hex<M: Mac + hmac::digest::KeyInit>(secret: &[u8], body: &[u8], out: &mut Vec<u8>) {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = <M as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let start = out.len();
    out.resize(start + 2 * digest.len(), 0);
    // The room is exactly twice the digest, so this cannot fail.
    let _ = hex::encode_to_slice(&digest[..], &mut out[start..]);
}

/// The value of `X-Hub-Signature` for `body` (`sha256=…`), appended to `out`: a delivery
/// writes it straight into its request head.
pub fn write_signature(alg: Algorithm, secret: &[u8], body: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(alg.as_str().as_bytes());
    out.push(b'=');
    match alg {
        Algorithm::Sha1 => mac_hex::<Hmac<sha1::Sha1>>(secret, body, out),
        Algorithm::Sha256 => mac_hex::<Hmac<sha2::Sha256>>(secret, body, out),
        Algorithm::Sha384 => mac_hex::<Hmac<sha2::Sha384>>(secret, body, out),
        Algorithm::Sha512 => mac_hex::<Hmac<sha2::Sha512>>(secret, body, out),
    }
}

/// The value of `X-Hub-Signature` for `body`: `sha256=…`.
pub fn signature(alg: Algorithm, secret: &[u8], body: &[u8]) -> String {
    let mut out = Vec::with_capacity(140);
    write_signature(alg, secret, body, &mut out);
    // Only ASCII was written.
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks an `X-Hub-Signature` header value against `body`, in constant time.
pub fn verify(header: &str, secret: &[u8], body: &[u8]) -> bool {
    let Some((alg, _)) = header.split_once('=') else {
        return false;
    };
    let Ok(alg) = alg.parse::<Algorithm>() else {
        return false;
    };
    let expected = signature(alg, secret, body);
    // The length is the algorithm's, not a secret; the bytes are compared in constant time.
    use subtle::ConstantTimeEq;
    expected.len() == header.len() && bool::from(expected.as_bytes().ct_eq(header.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // RFC 4231 test case 2.
        let key = b"Jefe";
        let data = b"what do ya want for nothing?";
        assert_eq!(
            signature(Algorithm::Sha256, key, data),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            signature(Algorithm::Sha1, key, data),
            "sha1=effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        for alg in [
            Algorithm::Sha1,
            Algorithm::Sha256,
            Algorithm::Sha384,
            Algorithm::Sha512,
        ] {
            let sig = signature(alg, key, data);
            assert!(verify(&sig, key, data));
            assert!(!verify(&sig, b"other", data));
            assert!(!verify(&sig, key, b"tampered"));
            assert_eq!(sig, sig.to_lowercase());
        }
        assert!(!verify("md5=abc", key, data));
        assert!(!verify("garbage", key, data));
    }
}
