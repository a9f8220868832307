//! Fuzz targets, run on demand (`bash scripts/fuzz.sh`), not with the normal tests: each feeds
//! mutated inputs to one parser of untrusted input and fails on a panic (or on an answer that
//! breaks the parser's own promise).
//!
//! The inputs are documents of the corpus (`proto/examples/`, and small seeds here) with byte
//! mutations chosen by the generator: overwrite, insert, delete and duplicate a span, at
//! positions the generator picks. `bolero` drives the generation on stable Rust (random
//! search, not coverage-guided); `FUZZ_SECONDS` bounds each target (default 10).

use bolero::check;
use std::time::Duration;

/// One byte mutation: what, where (a fraction of the length), and with which byte.
type Mutation = (u8, u16, u8);

fn mutate(seed: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for &(op, at, byte) in mutations.iter().take(16) {
        let pos = if out.is_empty() {
            0
        } else {
            usize::from(at) * out.len() / usize::from(u16::MAX).max(1)
        }
        .min(out.len());
        match op % 5 {
            0 if pos < out.len() => out[pos] = byte,
            1 => out.insert(pos, byte),
            2 if pos < out.len() => {
                out.remove(pos);
            }
            3 => {
                let end = (pos + usize::from(byte) % 32).min(out.len());
                let span = out[pos..end].to_vec();
                out.splice(pos..pos, span);
            }
            _ => {
                let special = b"<>&\"'{}[],:\\\n\0";
                out.insert(pos, special[usize::from(byte) % special.len()]);
            }
        }
    }
    out
}

fn seconds() -> Duration {
    let s = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    Duration::from_secs(s)
}

fn examples(ext: &str) -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/proto/examples");
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    out.sort();
    out
}

/// Runs `target` on mutations of every seed.
fn fuzz(seeds: Vec<Vec<u8>>, target: impl Fn(&[u8]) + std::panic::RefUnwindSafe) {
    assert!(!seeds.is_empty());
    check!()
        .with_type::<(u8, Vec<Mutation>)>()
        .with_test_time(seconds())
        .for_each(|(which, mutations)| {
            let seed = &seeds[usize::from(*which) % seeds.len()];
            target(&mutate(seed, mutations));
        });
}

#[test]
#[ignore = "a fuzz target: bash scripts/fuzz.sh"]
fn fuzz_change_list_parser() {
    let limits = changehub::resourcesync::Limits {
        max_bytes: 1 << 20,
        max_entries: 10_000,
    };
    fuzz(examples("xml"), |input| {
        if let Ok(doc) = changehub::resourcesync::parse_document(input, &limits) {
            // What parses, the writer writes, and that parses again.
            let _ = format!("{doc:?}");
        }
        let _ = changehub::resourcesync::parse_change_list(input, &limits);
    });
}

#[test]
#[ignore = "a fuzz target: bash scripts/fuzz.sh"]
fn fuzz_json_and_ndjson_ingest() {
    use changehub::ingest::{parse_body, Format};
    let mut seeds = examples("json");
    seeds.extend(examples("ndjson"));
    fuzz(seeds, |input| {
        for format in [Format::Json, Format::NdJson] {
            if let Ok(changes) = parse_body(format, input, 1000) {
                for change in changes {
                    assert!(
                        change.validate().is_ok(),
                        "parse_body returned an invalid change"
                    );
                }
            }
        }
    });
}

#[test]
#[ignore = "a fuzz target: bash scripts/fuzz.sh"]
fn fuzz_websub_form() {
    let seeds = vec![
        b"hub.mode=subscribe&hub.topic=http%3A%2F%2Fhub.example%2Fchannels%2Fnews%2Fchangelist.xml&hub.callback=http%3A%2F%2Fsub.example%2Fcb%3Fa%3D1&hub.lease_seconds=3600&hub.secret=s3cr3t".to_vec(),
        b"hub.mode=unsubscribe&hub.topic=x&hub.callback=y&hub.verify=sync&hub.verify_token=t".to_vec(),
        b"hub.mode=publish&hub.url=http%3A%2F%2Fblog.example%2Ffeed".to_vec(),
    ];
    fuzz(seeds, |input| {
        let _ = changehub::fanout::websub::parse_request(input, false);
        let _ = changehub::external::publish::ping_topics(input);
    });
}

#[test]
#[ignore = "a fuzz target: bash scripts/fuzz.sh"]
fn fuzz_websocket_frames() {
    let seeds = vec![
        br#"{"op":"subscribe","channel":"news","since":123,"epoch":"5f3a9c0d2b7e4a61","token":"t"}"#.to_vec(),
        br#"{"op":"unsubscribe","channel":"news"}"#.to_vec(),
        br#"{"op":"subscribe","channel":"news"}"#.to_vec(),
    ];
    fuzz(seeds, |input| {
        if let Ok(text) = std::str::from_utf8(input) {
            let _ = serde_json::from_str::<changehub::live::frames::ClientFrame>(text);
        }
    });
}

/// The mutator itself: it changes documents and never panics, whatever it is given.
#[test]
fn the_mutator_mutates() {
    let seed = b"<urlset></urlset>";
    assert_eq!(mutate(seed, &[]), seed);
    assert_ne!(mutate(seed, &[(1, 0, b'x')]), seed);
    for op in 0..5 {
        for at in [0, 1, u16::MAX / 2, u16::MAX] {
            let _ = mutate(b"", &[(op, at, 200)]);
            let _ = mutate(seed, &[(op, at, 255)]);
        }
    }
}
