//! HMAC-SHA256 of one body under eight keys at once: the fan-out signs every notification
//! for each subscriber with that subscriber's secret, so the same bytes are hashed once per
//! subscriber. On a CPU without SHA extensions that hashing was about a third of a delivery's
//! CPU (docs/performance.md, twenty-sixth pass).
//!
//! The eight inner hashes start from eight different states (each key's padded block) and
//! then compress the *same* blocks, so each block's message schedule is computed once and
//! the rounds run on eight lanes of 32-bit words (AVX2); only the final outer block, which
//! holds each lane's own inner digest, is compressed one key at a time. The result is the
//! HMAC of RFC 2104 bit for bit (the tests compare it with [`super::signature`]).
//!
//! Only on x86-64 with AVX2 ([`available`]); elsewhere callers sign one key at a time.

use sha2::digest::generic_array::GenericArray;
use sha2::Digest;

/// How many keys one call signs with.
pub const LANES: usize = 8;

/// A SHA-256 HMAC key as the two states its padded blocks leave (the same for every body).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sha256Key {
    inner: [u32; 8],
    outer: [u32; 8],
}

const H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

impl Sha256Key {
    pub fn new(secret: &[u8]) -> Sha256Key {
        // A key longer than the block is hashed first; a shorter one is padded with zeros.
        let mut key = [0u8; 64];
        if secret.len() > 64 {
            key[..32].copy_from_slice(&sha2::Sha256::digest(secret));
        } else {
            key[..secret.len()].copy_from_slice(secret);
        }
        let state_after = |pad: u8| {
            let block: [u8; 64] = std::array::from_fn(|i| key[i] ^ pad);
            let mut state = H0;
            sha2::compress256(&mut state, &[GenericArray::from(block)]);
            state
        };
        Sha256Key {
            inner: state_after(0x36),
            outer: state_after(0x5c),
        }
    }
}

/// True when this CPU can sign with eight keys at once.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The HMAC-SHA256 tags of `body` under each of `keys`, in order; `None` when the CPU cannot
/// ([`available`]).
pub fn sign8(keys: &[Sha256Key; LANES], body: &[u8]) -> Option<[[u8; 32]; LANES]> {
    #[cfg(target_arch = "x86_64")]
    {
        if available() {
            // SAFETY: the CPU has AVX2, the only feature `avx2::inner` is compiled for.
            let inner = unsafe { avx2::inner(keys, body) };
            return Some(std::array::from_fn(|lane| outer(&keys[lane], &inner[lane])));
        }
    }
    let _ = (keys, body);
    None
}

/// The outer hash of one lane: its key's outer state, then the block that holds the inner
/// digest, padded (the message is 64 + 32 bytes long).
fn outer(key: &Sha256Key, inner: &[u32; 8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    for (i, word) in inner.iter().enumerate() {
        block[4 * i..4 * i + 4].copy_from_slice(&word.to_be_bytes());
    }
    block[32] = 0x80;
    block[56..].copy_from_slice(&((64u64 + 32) * 8).to_be_bytes());
    let mut state = key.outer;
    sha2::compress256(&mut state, &[GenericArray::from(block)]);
    let mut tag = [0u8; 32];
    for (i, word) in state.iter().enumerate() {
        tag[4 * i..4 * i + 4].copy_from_slice(&word.to_be_bytes());
    }
    tag
}

/// The message schedule of one block with the round constants added: the same for every
/// lane, since every lane hashes the same body.
#[cfg(target_arch = "x86_64")]
fn schedule(block: &[u8; 64]) -> [u32; 64] {
    let mut w = [0u32; 64];
    for (t, word) in block.chunks_exact(4).enumerate() {
        w[t] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
    }
    for t in 16..64 {
        let s0 = w[t - 15].rotate_right(7) ^ w[t - 15].rotate_right(18) ^ (w[t - 15] >> 3);
        let s1 = w[t - 2].rotate_right(17) ^ w[t - 2].rotate_right(19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16]
            .wrapping_add(s0)
            .wrapping_add(w[t - 7])
            .wrapping_add(s1);
    }
    for (w, k) in w.iter_mut().zip(K) {
        *w = w.wrapping_add(k);
    }
    w
}

#[cfg(target_arch = "x86_64")]
const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{schedule, Sha256Key, LANES};
    use std::arch::x86_64::*;

    /// The inner hashes: each key's inner state, then `body` and its padding (the message is
    /// 64 + `body.len()` bytes long).
    #[target_feature(enable = "avx2")]
    pub(super) fn inner(keys: &[Sha256Key; LANES], body: &[u8]) -> [[u32; 8]; LANES] {
        // state[i] holds word i of every lane's state.
        let mut state: [__m256i; 8] = std::array::from_fn(|i| {
            let words: [u32; LANES] = std::array::from_fn(|lane| keys[lane].inner[i]);
            // SAFETY: `words` is 32 bytes, the size of the unaligned load.
            unsafe { _mm256_loadu_si256(words.as_ptr().cast()) }
        });
        let mut blocks = body.chunks_exact(64);
        for block in blocks.by_ref() {
            let block: &[u8; 64] = block.try_into().expect("chunks of 64");
            compress(&mut state, &schedule(block));
        }
        let rest = blocks.remainder();
        let mut tail = [0u8; 128];
        tail[..rest.len()].copy_from_slice(rest);
        tail[rest.len()] = 0x80;
        let end = if rest.len() + 9 <= 64 { 64 } else { 128 };
        let bits = (64 + body.len() as u64) * 8;
        tail[end - 8..end].copy_from_slice(&bits.to_be_bytes());
        for block in tail[..end].chunks_exact(64) {
            let block: &[u8; 64] = block.try_into().expect("chunks of 64");
            compress(&mut state, &schedule(block));
        }
        let mut out = [[0u32; 8]; LANES];
        for (i, word) in state.iter().enumerate() {
            let mut lanes = [0u32; LANES];
            // SAFETY: `lanes` is 32 bytes, the size of the unaligned store.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), *word) };
            for (lane, value) in lanes.into_iter().enumerate() {
                out[lane][i] = value;
            }
        }
        out
    }

    #[target_feature(enable = "avx2")]
    fn rotr<const R: i32, const L: i32>(x: __m256i) -> __m256i {
        _mm256_or_si256(_mm256_srli_epi32::<R>(x), _mm256_slli_epi32::<L>(x))
    }

    /// One block on every lane: SHA-256's 64 rounds with the shared schedule `wk`.
    #[target_feature(enable = "avx2")]
    fn compress(state: &mut [__m256i; 8], wk: &[u32; 64]) {
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *state;
        for &w in wk {
            let s1 = _mm256_xor_si256(
                _mm256_xor_si256(rotr::<6, 26>(e), rotr::<11, 21>(e)),
                rotr::<25, 7>(e),
            );
            let ch = _mm256_xor_si256(_mm256_and_si256(e, f), _mm256_andnot_si256(e, g));
            let t1 = _mm256_add_epi32(
                _mm256_add_epi32(h, s1),
                _mm256_add_epi32(ch, _mm256_set1_epi32(w as i32)),
            );
            let s0 = _mm256_xor_si256(
                _mm256_xor_si256(rotr::<2, 30>(a), rotr::<13, 19>(a)),
                rotr::<22, 10>(a),
            );
            let maj = _mm256_or_si256(
                _mm256_and_si256(a, b),
                _mm256_and_si256(c, _mm256_or_si256(a, b)),
            );
            let t2 = _mm256_add_epi32(s0, maj);
            h = g;
            g = f;
            f = e;
            e = _mm256_add_epi32(d, t1);
            d = c;
            c = b;
            b = a;
            a = _mm256_add_epi32(t1, t2);
        }
        for (word, new) in state.iter_mut().zip([a, b, c, d, e, f, g, h]) {
            *word = _mm256_add_epi32(*word, new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::signature::{signature, Algorithm};

    /// Eight keys of every kind (empty, short, a block long, longer than a block) over bodies
    /// whose padding takes one block or two, against the one-key HMAC.
    #[test]
    fn eight_lanes_give_each_key_its_own_hmac() {
        if !available() {
            assert!(sign8(&[Sha256Key::new(b"k"); LANES], b"body").is_none());
            return;
        }
        let secrets: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"Jefe".to_vec(),
            b"secret-of-subscriber-7".to_vec(),
            vec![0x0b; 20],
            vec![0xaa; 64],
            vec![0xaa; 65],
            vec![0xaa; 131],
            (0..=255).collect(),
        ];
        let keys: [Sha256Key; LANES] = std::array::from_fn(|i| Sha256Key::new(&secrets[i]));
        let body: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
        for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 2400, 3000] {
            let tags = sign8(&keys, &body[..len]).expect("available");
            for (lane, tag) in tags.iter().enumerate() {
                assert_eq!(
                    format!("sha256={}", hex::encode(tag)),
                    signature(Algorithm::Sha256, &secrets[lane], &body[..len]),
                    "lane {lane}, body of {len} bytes"
                );
            }
        }
    }
}
