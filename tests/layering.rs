//! Keeps the layering of `src/` true (see ARCHITECTURE.md, "Rules"): a small scan of every
//! source file's code lines (comments are skipped) for the paths each room may not use.
//!
//! - Only the web layer (`http/`), the wiring (`server.rs`) and the binary know axum.
//! - No domain room imports the web layer.
//! - The store imports the model and nothing else of the hub (never the fan-out).
//! - The model imports nothing of the hub.
//! - The document models (`resourcesync/`, `feedsync/`) know neither HTTP nor the store.
//! - The client commands use only the model, the retry helper, the ResourceSync documents,
//!   `net` (HTTP as a protocol) and each other.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every source file as (path relative to `src/`, code lines without comments).
fn sources() -> Vec<(String, Vec<String>)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let rel = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            // Unit tests (at the end of a file, after `#[cfg(test)]`) may use anything.
            let code = std::fs::read_to_string(&path)
                .unwrap()
                .lines()
                .map(str::trim)
                .take_while(|l| *l != "#[cfg(test)]")
                .filter(|l| !l.starts_with("//"))
                .map(str::to_string)
                .collect();
            (rel, code)
        })
        .collect()
}

/// The hub's own modules a line refers to (`crate::x`), and whether it uses axum.
fn uses(line: &str) -> (Vec<String>, bool) {
    let mut modules = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            // `use crate::{a, b}`: every name in the braces.
            if let Some(group) = after.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or("");
                for part in group.split(',') {
                    let name: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        modules.push(name);
                    }
                }
            }
        } else {
            modules.push(name);
        }
        rest = after;
    }
    let axum = line.contains("axum::") || line.contains("axum ") || line.starts_with("use axum");
    (modules, axum)
}

/// The room of a file: its first path segment (`store/redis.rs` → `store`), or the file's
/// stem at the top (`catchup.rs` → `catchup`).
fn room(rel: &str) -> &str {
    rel.split('/').next().unwrap_or(rel).trim_end_matches(".rs")
}

fn violations(sources: Vec<(String, Vec<String>)>) -> Vec<String> {
    let mut found = Vec::new();
    for (rel, code) in sources {
        let room = room(&rel);
        for line in &code {
            let (modules, axum) = uses(line);
            let web = matches!(room, "http" | "server" | "main");
            if axum && !web {
                found.push(format!("{rel}: uses axum outside the web layer: {line}"));
            }
            for m in &modules {
                let allowed: Option<&[&str]> = match room {
                    "http" | "server" | "main" | "lib" => None,
                    "model" => Some(&["model"]),
                    "store" => Some(&["store", "model", "retry"]),
                    "resourcesync" => Some(&["resourcesync", "model"]),
                    "feedsync" => Some(&["feedsync", "model"]),
                    "client" => Some(&["client", "model", "retry", "resourcesync", "net"]),
                    _ => Some(&[]),
                };
                match allowed {
                    Some(list) if !list.is_empty() && !list.contains(&m.as_str()) => {
                        found.push(format!("{rel}: {room} may not use crate::{m}: {line}"))
                    }
                    _ if m == "http" && !web && room != "lib" => found.push(format!(
                        "{rel}: a domain room imports the web layer: {line}"
                    )),
                    _ => {}
                }
            }
        }
    }
    found
}

#[test]
fn the_layers_hold() {
    let found = violations(sources());
    assert!(found.is_empty(), "layering broken:\n{}", found.join("\n"));
}

/// The scan itself finds what it must: a check that cannot fail proves nothing.
#[test]
fn the_scan_sees_imports() {
    assert_eq!(uses("use crate::http::AppState;").0, ["http"]);
    assert_eq!(
        uses("use crate::{fanout, store::Store};").0,
        ["fanout", "store"]
    );
    assert!(uses("use axum::extract::State;").1);
    assert!(!uses("let x = 1;").1);
    assert_eq!(room("store/redis.rs"), "store");
    assert_eq!(room("catchup.rs"), "catchup");
    let sources = sources();
    assert!(sources.iter().any(|(rel, _)| rel == "store/mod.rs"));
    assert!(sources.iter().any(|(rel, _)| rel.starts_with("http/")));
    // The rules find a store that imports the fan-out, a domain room that imports the web
    // layer or axum, and a model that imports the store.
    let file = |rel: &str, line: &str| (rel.to_string(), vec![line.to_string()]);
    let broken = violations(vec![
        file("store/mod.rs", "use crate::fanout::Fanout;"),
        file("catchup.rs", "use crate::http::{ApiError, AppState};"),
        file("live/follow.rs", "use axum::extract::ws::Utf8Bytes;"),
        file("model/change.rs", "use crate::store::StoreError;"),
        file("http/ingest.rs", "use crate::ingest::accept;"),
        file("store/redis.rs", "use crate::model::Change;"),
    ]);
    assert_eq!(broken.len(), 4, "{broken:#?}");
}
