//! HMAC-SHA256 of one body under eight keys at once: the fan-out signs every notification
//! for each subscriber with that subscriber's secret, so the same bytes are hashed once per
//! subscriber. On a CPU without SHA extensions that hashing was about a third of a delivery's
//! CPU (docs/performance.md, twenty-sixth pass).
//!
//! The eight inner hashes start from eight different states (each key's padded block) and
//! then compress the *same* blocks, so each block's message schedule is computed once for all
//! eight; only the final outer block, which holds each lane's own inner digest, is compressed
//! one key at a time. The result is the HMAC of RFC 2104 bit for bit (the tests compare it
//! with [`super::signature`]). Two kernels ([`Kernel`]) run the rounds:
//! - with the SHA extensions, each key's rounds on the SHA-256 instructions, four keys
//!   interleaved so that one key's instructions run while another's wait for their result
//!   (1.55 µs per tag of a 2.4 KB body against 2.3–2.5 µs for one-key HMAC on the same Xeon;
//!   docs/performance.md, twenty-seventh pass);
//! - without them, the rounds on eight 32-bit lanes of AVX2 registers (2.44 µs per tag
//!   against 7.45 µs on a Xeon without SHA extensions).
//!
//! Only on x86-64 ([`available`]); elsewhere callers sign one key at a time.

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

/// How this CPU hashes eight keys at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// The SHA extensions: each key's rounds run on the CPU's SHA-256 instructions, the eight
    /// keys interleaved so that their rounds overlap instead of waiting on each other.
    ShaNi,
    /// Eight 32-bit lanes of AVX2 registers, the rounds computed with ordinary vector
    /// arithmetic (for CPUs without SHA extensions).
    Avx2,
}

impl Kernel {
    /// Whether this CPU has every feature the kernel is compiled for.
    pub fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Kernel::ShaNi => {
                    std::is_x86_feature_detected!("sha")
                        && std::is_x86_feature_detected!("ssse3")
                        && std::is_x86_feature_detected!("sse4.1")
                }
                Kernel::Avx2 => std::is_x86_feature_detected!("avx2"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = self;
            false
        }
    }

    /// Every kernel this CPU can run, the fastest first.
    pub fn all() -> Vec<Kernel> {
        [Kernel::ShaNi, Kernel::Avx2]
            .into_iter()
            .filter(|kernel| kernel.runs_here())
            .collect()
    }

    /// The fastest kernel this CPU runs, if any (detected once).
    pub fn best() -> Option<Kernel> {
        static BEST: std::sync::OnceLock<Option<Kernel>> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Kernel::all().first().copied())
    }
}

/// True when this CPU can sign with eight keys at once.
pub fn available() -> bool {
    Kernel::best().is_some()
}

/// The HMAC-SHA256 tags of `body` under each of `keys`, in order; `None` when the CPU cannot
/// ([`available`]).
pub fn sign8(keys: &[Sha256Key; LANES], body: &[u8]) -> Option<[[u8; 32]; LANES]> {
    // `best` is one of the kernels this CPU runs.
    Kernel::best().map(|kernel| run(kernel, keys, body))
}

/// [`sign8`] with a given kernel, which this CPU must run ([`Kernel::runs_here`]).
pub fn sign8_with(kernel: Kernel, keys: &[Sha256Key; LANES], body: &[u8]) -> [[u8; 32]; LANES] {
    assert!(
        kernel.runs_here(),
        "this CPU cannot run the {kernel:?} kernel"
    );
    run(kernel, keys, body)
}

/// Signs with `kernel`, which the caller has made sure this CPU runs.
fn run(kernel: Kernel, keys: &[Sha256Key; LANES], body: &[u8]) -> [[u8; 32]; LANES] {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the CPU has the features each kernel is compiled for (the callers' check).
        let inner = unsafe {
            match kernel {
                Kernel::ShaNi => sha_ni::inner(keys, body),
                Kernel::Avx2 => avx2::inner(keys, body),
            }
        };
        std::array::from_fn(|lane| outer(&keys[lane], &inner[lane]))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, keys, body);
        unreachable!("no kernel runs on this CPU")
    }
}

/// Calls `f` with each 64-byte block of the inner hash's message after the key's block:
/// `body`'s whole blocks, then the last bytes with SHA-256's padding (the message is
/// 64 + `body.len()` bytes long), in one block or two.
#[cfg(target_arch = "x86_64")]
fn for_each_block(body: &[u8], mut f: impl FnMut(&[u8; 64])) {
    let mut blocks = body.chunks_exact(64);
    for block in blocks.by_ref() {
        f(block.try_into().expect("chunks of 64"));
    }
    let rest = blocks.remainder();
    let mut tail = [0u8; 128];
    tail[..rest.len()].copy_from_slice(rest);
    tail[rest.len()] = 0x80;
    let end = if rest.len() + 9 <= 64 { 64 } else { 128 };
    let bits = (64 + body.len() as u64) * 8;
    tail[end - 8..end].copy_from_slice(&bits.to_be_bytes());
    for block in tail[..end].chunks_exact(64) {
        f(block.try_into().expect("chunks of 64"));
    }
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
    use super::{for_each_block, schedule, Sha256Key, LANES};
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
        for_each_block(body, |block| compress(&mut state, &schedule(block)));
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

#[cfg(target_arch = "x86_64")]
mod sha_ni {
    use super::{for_each_block, Sha256Key, K, LANES};
    use std::arch::x86_64::*;

    /// The inner hashes, as [`super::avx2::inner`] computes them, with the SHA instructions.
    /// A state is kept as the instructions want it: words A, B, E, F in one register and
    /// C, D, G, H in another.
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    pub(super) fn inner(keys: &[Sha256Key; LANES], body: &[u8]) -> [[u32; 8]; LANES] {
        let mut abef = [_mm_setzero_si128(); LANES];
        let mut cdgh = [_mm_setzero_si128(); LANES];
        for lane in 0..LANES {
            (abef[lane], cdgh[lane]) = load(&keys[lane].inner);
        }
        for_each_block(body, |block| {
            compress(&mut abef, &mut cdgh, &schedule_ni(block))
        });
        std::array::from_fn(|lane| store(abef[lane], cdgh[lane]))
    }

    /// [`super::schedule`] with the SHA message instructions.
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn schedule_ni(block: &[u8; 64]) -> [u32; 64] {
        // Big-endian words: reverse the bytes of each.
        let swap = _mm_set_epi64x(0x0c0d_0e0f_0809_0a0b, 0x0405_0607_0001_0203);
        let mut w = [_mm_setzero_si128(); 16];
        for (i, chunk) in block.chunks_exact(16).enumerate() {
            // SAFETY: `chunk` is 16 bytes: one unaligned load.
            w[i] = _mm_shuffle_epi8(unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) }, swap);
        }
        for i in 4..16 {
            // W[t] = σ1(W[t-2]) + W[t-7] + σ0(W[t-15]) + W[t-16], four words at a time.
            let w7 = _mm_alignr_epi8::<4>(w[i - 1], w[i - 2]);
            let sum = _mm_add_epi32(_mm_sha256msg1_epu32(w[i - 4], w[i - 3]), w7);
            w[i] = _mm_sha256msg2_epu32(sum, w[i - 1]);
        }
        let mut wk = [0u32; 64];
        for (i, four) in wk.chunks_exact_mut(4).enumerate() {
            // SAFETY: `K[4 * i..]` holds at least 16 bytes, `four` is 16 bytes.
            unsafe {
                let k = _mm_loadu_si128(K[4 * i..].as_ptr().cast());
                _mm_storeu_si128(four.as_mut_ptr().cast(), _mm_add_epi32(w[i], k));
            }
        }
        wk
    }

    /// Words A…H as the pair (ABEF, CDGH).
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn load(state: &[u32; 8]) -> (__m128i, __m128i) {
        // SAFETY: `state` is 32 bytes: two unaligned loads of 16.
        let (dcba, hgfe) = unsafe {
            (
                _mm_loadu_si128(state.as_ptr().cast()),
                _mm_loadu_si128(state[4..].as_ptr().cast()),
            )
        };
        let cdab = _mm_shuffle_epi32::<0xB1>(dcba);
        let efgh = _mm_shuffle_epi32::<0x1B>(hgfe);
        (
            _mm_alignr_epi8::<8>(cdab, efgh),
            _mm_blend_epi16::<0xF0>(efgh, cdab),
        )
    }

    /// The pair (ABEF, CDGH) back as words A…H.
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn store(abef: __m128i, cdgh: __m128i) -> [u32; 8] {
        let feba = _mm_shuffle_epi32::<0x1B>(abef);
        let dchg = _mm_shuffle_epi32::<0xB1>(cdgh);
        let dcba = _mm_blend_epi16::<0xF0>(feba, dchg);
        let hgfe = _mm_alignr_epi8::<8>(dchg, feba);
        let mut state = [0u32; 8];
        // SAFETY: `state` is 32 bytes: two unaligned stores of 16.
        unsafe {
            _mm_storeu_si128(state.as_mut_ptr().cast(), dcba);
            _mm_storeu_si128(state[4..].as_mut_ptr().cast(), hgfe);
        }
        state
    }

    /// One block for every key: four rounds at a time (two instructions of two rounds), each
    /// step for four keys before the next, so that their instructions overlap (eight keys'
    /// states would not fit in the sixteen registers).
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn compress(abef: &mut [__m128i; LANES], cdgh: &mut [__m128i; LANES], wk: &[u32; 64]) {
        for (abef, cdgh) in abef.chunks_exact_mut(4).zip(cdgh.chunks_exact_mut(4)) {
            let mut s0: [__m128i; 4] = abef.try_into().expect("four");
            let mut s1: [__m128i; 4] = cdgh.try_into().expect("four");
            for four in wk.chunks_exact(4) {
                // SAFETY: `four` is 16 bytes: one unaligned load.
                let low = unsafe { _mm_loadu_si128(four.as_ptr().cast()) };
                let high = _mm_shuffle_epi32::<0x0E>(low);
                for lane in 0..4 {
                    s1[lane] = _mm_sha256rnds2_epu32(s1[lane], s0[lane], low);
                }
                for lane in 0..4 {
                    s0[lane] = _mm_sha256rnds2_epu32(s0[lane], s1[lane], high);
                }
            }
            for lane in 0..4 {
                abef[lane] = _mm_add_epi32(abef[lane], s0[lane]);
                cdgh[lane] = _mm_add_epi32(cdgh[lane], s1[lane]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::signature::{signature, Algorithm};

    /// Eight keys of every kind (empty, short, a block long, longer than a block) over bodies
    /// whose padding takes one block or two, against the one-key HMAC, with every kernel this
    /// CPU runs.
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
        for kernel in Kernel::all() {
            for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 2400, 3000] {
                let tags = sign8_with(kernel, &keys, &body[..len]);
                assert_eq!(Some(tags), sign8(&keys, &body[..len]));
                for (lane, tag) in tags.iter().enumerate() {
                    assert_eq!(
                        format!("sha256={}", hex::encode(tag)),
                        signature(Algorithm::Sha256, &secrets[lane], &body[..len]),
                        "{kernel:?}: lane {lane}, body of {len} bytes"
                    );
                }
            }
        }
    }

    /// The SHA extensions, where the CPU has them, are chosen over AVX2.
    #[test]
    fn the_sha_instructions_come_first() {
        let all = Kernel::all();
        assert_eq!(Kernel::best(), all.first().copied());
        if Kernel::ShaNi.runs_here() {
            assert_eq!(Kernel::best(), Some(Kernel::ShaNi));
        }
    }
}
