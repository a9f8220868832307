//! The ResourceSync `hash` attribute of a resource's bytes: `md5:HEX sha-256:HEX`, several
//! algorithms separated by spaces (ResourceSync names them as IANA's hash function textual
//! names: `md5`, `sha-1`, `sha-256`, `sha-512`).

use md5::Md5;
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

/// The `hash` value a source gives for `bytes`: `md5:… sha-256:…`.
pub fn of(bytes: &[u8]) -> String {
    let mut hasher = Hasher::default();
    hasher.update(bytes);
    hasher.finish()
}

/// [`of`] for bytes that come in pieces (a file read in chunks).
#[derive(Default)]
pub struct Hasher {
    md5: Md5,
    sha256: Sha256,
}

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.md5.update(bytes);
        self.sha256.update(bytes);
    }

    /// `md5:… sha-256:…`.
    pub fn finish(self) -> String {
        format!(
            "md5:{} sha-256:{}",
            hex::encode(self.md5.finalize()),
            hex::encode(self.sha256.finalize())
        )
    }
}

/// Checks `bytes` against a `hash` value: every algorithm it names that is known here must
/// match (unknown ones are skipped). The reason names the first that does not.
pub fn check(expected: &str, bytes: &[u8]) -> Result<(), String> {
    for item in expected.split_whitespace() {
        let Some((alg, want)) = item.split_once(':') else {
            continue;
        };
        let got = match alg.to_ascii_lowercase().as_str() {
            "md5" => hex::encode(Md5::digest(bytes)),
            "sha-1" | "sha1" => hex::encode(Sha1::digest(bytes)),
            "sha-256" | "sha256" => hex::encode(Sha256::digest(bytes)),
            "sha-512" | "sha512" => hex::encode(Sha512::digest(bytes)),
            _ => continue,
        };
        if !got.eq_ignore_ascii_case(want) {
            return Err(format!("{alg} is {got}, not {want}"));
        }
    }
    Ok(())
}

/// Checks fetched `bytes` against what `change` says of them: its `length`, then its `hash`
/// (either may be absent). The reason when they differ.
pub fn check_change(change: &crate::model::Change, bytes: &[u8]) -> Result<(), String> {
    if let Some(length) = change.length {
        if bytes.len() as u64 != length {
            return Err(format!(
                "{} bytes, not the {length} the change says",
                bytes.len()
            ));
        }
    }
    match &change.hash {
        Some(expected) => check(expected, bytes).map_err(|why| format!("hash: {why}")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_checked_by_length_then_hash() {
        use crate::model::{Change, ChangeType, NewChange};
        let at = time::OffsetDateTime::UNIX_EPOCH;
        let mut change = Change::from_new(1, NewChange::new("http://e/x", ChangeType::Created), at);
        assert!(check_change(&change, b"abc").is_ok(), "nothing to check");
        change.length = Some(4);
        let why = check_change(&change, b"abc").unwrap_err();
        assert_eq!(why, "3 bytes, not the 4 the change says");
        change.length = Some(3);
        change.hash = Some(of(b"abd"));
        assert!(check_change(&change, b"abc")
            .unwrap_err()
            .starts_with("hash: md5 is"));
        change.hash = Some(of(b"abc"));
        assert!(check_change(&change, b"abc").is_ok());
    }

    #[test]
    fn known_digests_and_checks() {
        assert_eq!(
            of(b"abc"),
            "md5:900150983cd24fb0d6963f7d28e17f72 \
             sha-256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(check(&of(b"abc"), b"abc").is_ok());
        assert!(check(&of(b"abc"), b"abd").unwrap_err().starts_with("md5"));
        assert!(check("sha-1:A9993E364706816ABA3E25717850C26C9CD0D89D", b"abc").is_ok());
        assert!(check("crc32:00 nonsense", b"abc").is_ok());
        assert!(check("sha-256:00", b"abc").is_err());
    }
}
