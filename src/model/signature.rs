//! `X-Hub-Signature`: an HMAC of the exact request body, keyed with the subscriber's
//! `hub.secret`, written as `<alg>=<lowercase hex>`. The hub signs with [`signature`] when it
//! delivers (`fanout::delivery`); receivers — `changehub subscribe`, the tests — check with
//! [`verify`]. Plain computation, kept apart from delivery and from the HTTP client.

use aws_lc_rs::hmac;
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

/// The HMAC of each algorithm, as the crypto library rustls links (aws-lc) computes it: in
/// assembly, with the CPU's SHA extensions when it has them and vector code when it has not.
fn hmac_algorithm(alg: Algorithm) -> hmac::Algorithm {
    match alg {
        Algorithm::Sha1 => hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        Algorithm::Sha256 => hmac::HMAC_SHA256,
        Algorithm::Sha384 => hmac::HMAC_SHA384,
        Algorithm::Sha512 => hmac::HMAC_SHA512,
    }
}

/// A subscriber's signing key, made once per subscription (not per delivery): the HMAC's
/// inner and outer states after the key are kept, so that each signature hashes only the body.
#[derive(Clone)]
pub struct Signer {
    alg: Algorithm,
    key: hmac::Key,
}

impl Signer {
    pub fn new(alg: Algorithm, secret: &[u8]) -> Signer {
        Signer {
            alg,
            key: hmac::Key::new(hmac_algorithm(alg), secret),
        }
    }

    /// The value of `X-Hub-Signature` for `body` (`sha256=…`), appended to `out`: a delivery
    /// writes it straight into its request head.
    pub fn write(&self, body: &[u8], out: &mut Vec<u8>) {
        write_value(self.alg, hmac::sign(&self.key, body).as_ref(), out);
    }
}

/// The value of `X-Hub-Signature` for an HMAC `tag` made with `alg` (`sha256=…`), appended to
/// `out`.
pub fn write_value(alg: Algorithm, tag: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(alg.as_str().as_bytes());
    out.push(b'=');
    let start = out.len();
    out.resize(start + 2 * tag.len(), 0);
    // The room is exactly twice the tag, so this cannot fail.
    let _ = hex::encode_to_slice(tag, &mut out[start..]);
}

/// The value of `X-Hub-Signature` for `body`: `sha256=…`.
pub fn signature(alg: Algorithm, secret: &[u8], body: &[u8]) -> String {
    let mut out = Vec::with_capacity(140);
    Signer::new(alg, secret).write(body, &mut out);
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
        assert_eq!(
            signature(Algorithm::Sha384, key, data),
            "sha384=af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47\
             e42ec3736322445e8e2240ca5e69e2c78b3239ecfab21649"
        );
        assert_eq!(
            signature(Algorithm::Sha512, key, data),
            "sha512=164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea250554\
             9758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
        );
        // RFC 4231 test case 6: a key longer than the block is hashed first.
        assert_eq!(
            signature(
                Algorithm::Sha256,
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            ),
            "sha256=60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
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
