//! The documentation matches the code: every flag of every command is in `docs/cli.md`,
//! every route of the web layer is in `docs/http.md`, every relative link of the Markdown
//! files leads to a file of the repository, and no path in them leads outside it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The long flags `changehub ARGS --help` prints.
fn flags(args: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_changehub"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("-h, ").unwrap_or(line);
            let flag: String = line
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                .collect();
            (!flag.is_empty()).then(|| format!("--{flag}"))
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

#[test]
fn every_flag_is_documented() {
    let cli = read("docs/cli.md");
    for command in [
        &[][..],
        &["serve"],
        &["tail"],
        &["healthcheck"],
        &["publish"],
    ] {
        let found = flags(command);
        assert!(!found.is_empty(), "{command:?}");
        for flag in found {
            assert!(
                cli.contains(&format!("`{flag}")),
                "docs/cli.md does not describe {flag} of `changehub {}`",
                command.join(" ")
            );
        }
    }
}

#[test]
fn every_route_is_documented() {
    let source = read("src/http/mod.rs");
    // The routes of the hub, not those of the file's unit tests.
    let router = source.split("#[cfg(test)]").next().unwrap_or_default();
    let http = read("docs/http.md");
    let routes: Vec<&str> = router
        .split(".route(")
        .skip(1)
        .filter_map(|r| r.trim_start().strip_prefix('"')?.split('"').next())
        .collect();
    assert!(routes.len() > 20, "{routes:?}");
    for route in routes {
        assert!(
            http.contains(&format!("{route}`"))
                || http.contains(&format!("{route}?"))
                || http.contains(&format!("{route} ")),
            "docs/http.md does not describe {route}"
        );
    }
}

fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("ARCHITECTURE.md"),
        root().join("CONTRIBUTING.md"),
        root().join("SECURITY.md"),
    ];
    for dir in ["docs", "proto"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.retain(|f| f.exists());
    files
}

#[test]
fn relative_links_lead_to_files_of_the_repository() {
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for piece in text.split("](").skip(1) {
            let target = piece.split(')').next().unwrap_or("");
            if target.starts_with("http") || target.starts_with('#') || target.is_empty() {
                continue;
            }
            let path = target.split('#').next().unwrap();
            let resolved = file.parent().unwrap().join(path);
            assert!(
                resolved.exists(),
                "{}: link to {target} leads nowhere",
                file.display()
            );
            let canonical = resolved.canonicalize().unwrap();
            assert!(
                canonical.starts_with(root().canonicalize().unwrap()),
                "{}: link to {target} leaves the repository",
                file.display()
            );
        }
    }
}

#[test]
fn nothing_points_outside_the_repository() {
    let root = root().canonicalize().unwrap();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        // Every relative path written in the text (in a link or not) that climbs with `../`
        // must stay inside the repository.
        for word in text.split(|c: char| c.is_whitespace() || "()[]`'\"<>,;".contains(c)) {
            let Some(start) = word.find("../") else {
                continue;
            };
            let path = word[start..].split('#').next().unwrap_or("");
            let mut resolved = file.parent().unwrap().to_path_buf();
            for part in path.split('/') {
                match part {
                    ".." => {
                        resolved.pop();
                    }
                    "" | "." => {}
                    name => resolved.push(name),
                }
            }
            assert!(
                resolved.starts_with(&root),
                "{}: {path} leads outside the repository",
                file.display()
            );
        }
    }
}
