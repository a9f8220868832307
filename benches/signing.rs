//! Signing benchmark: the cost of one `X-Hub-Signature` tag (HMAC-SHA256) of a notification
//! body, made one key at a time (`model::signature::Signer`, aws-lc) against eight keys at once
//! with each kernel of `model::signature_lanes` this CPU runs. The one-key figure is the
//! baseline: the ratio says what the fan-out saves per tag when a group signs for eight.
//!
//! Run: `cargo bench --bench signing` (`BENCH_SIGNING_BYTES`, default 2400: the size of the
//! fan-out benchmark's notification). Prints three rounds; no network, no files.

use changehub::model::signature::Signer;
use changehub::model::signature_lanes::{sign8_with, Kernel, Sha256Key, LANES};
use changehub::model::Algorithm;
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let bytes: usize = std::env::var("BENCH_SIGNING_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2400);
    let body: Vec<u8> = (0..bytes).map(|i| (i * 7 % 251) as u8).collect();
    let secrets: Vec<String> = (0..LANES)
        .map(|i| format!("secret-of-subscriber-{i}"))
        .collect();
    let keys: [Sha256Key; LANES] = std::array::from_fn(|i| Sha256Key::new(secrets[i].as_bytes()));
    let signers: Vec<Signer> = secrets
        .iter()
        .map(|s| Signer::new(Algorithm::Sha256, s.as_bytes()))
        .collect();
    let calls = 20_000;
    println!("HMAC-SHA256 of {bytes} bytes, µs per tag ({calls} × {LANES} tags a round)");
    for round in 1..=3 {
        let mut out = Vec::with_capacity(128);
        let start = Instant::now();
        for _ in 0..calls {
            for signer in &signers {
                out.clear();
                signer.write(black_box(&body), &mut out);
            }
            black_box(&out);
        }
        let one = per_tag(start, calls);
        print!("round {round}: one key at a time {one:.2}");
        for kernel in Kernel::all() {
            let start = Instant::now();
            for _ in 0..calls {
                black_box(sign8_with(kernel, &keys, black_box(&body)));
            }
            let eight = per_tag(start, calls);
            print!(
                "; eight at once, {kernel:?} {eight:.2} ({:.2} of one)",
                eight / one
            );
        }
        println!();
    }
}

fn per_tag(start: Instant, calls: usize) -> f64 {
    start.elapsed().as_secs_f64() * 1e6 / (calls * LANES) as f64
}
