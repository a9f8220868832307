//! What the benchmarks share (each includes this file with `#[path]`).
#![allow(dead_code)]

use changehub::model::{ChangeType, NewChange};

/// `n` times `BENCH_SCALE` (default 1), at least 1.
pub fn scale(n: usize) -> usize {
    let s: f64 = std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    ((n as f64 * s) as usize).max(1)
}

/// An `updated` change of resource number `loc`, with a hash, a length and a type.
pub fn change(loc: usize) -> NewChange {
    NewChange {
        loc: format!("http://example.com/resource/{loc}"),
        change: ChangeType::Updated,
        datetime: None,
        lastmod: None,
        hash: Some("md5:1e0d5cb8ef6ba40c99b14c0237be735e".into()),
        length: Some(1234),
        media_type: Some("text/plain".into()),
        links: vec![],
        source: None,
    }
}

pub mod procs;
pub mod report;
