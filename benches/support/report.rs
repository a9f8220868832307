//! The suite's table: rows printed as they are measured, then `BENCHMARKS.md` with the machine,
//! the command, the commit, the table, the cost-growth tables and what each figure ran.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// How a figure's value reads.
#[derive(Clone, Copy, Debug)]
pub enum Unit {
    /// Per second, of the named thing ("deliveries", "changes", "req").
    Rate(&'static str),
    Ms,
    Us,
    KiB,
    MiB,
    /// A number of things (changes, deliveries).
    Count,
}

impl Unit {
    pub fn show(self, v: f64) -> String {
        match self {
            Unit::Rate(what) => format!("{} {what}/s", si(v)),
            Unit::Ms if v < 10.0 => format!("{v:.2} ms"),
            Unit::Ms => format!("{v:.1} ms"),
            Unit::Us => format!("{v:.1} µs"),
            Unit::KiB => format!("{v:.1} KiB"),
            Unit::MiB => format!("{v:.0} MiB"),
            Unit::Count => format!("{v:.0}"),
        }
    }
}

/// 1234567 → "1.23M", 24900 → "24.9k", 290 → "290".
pub fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.2}k", v / 1e3)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The goal for a figure.
#[derive(Clone, Copy, Debug)]
pub enum Goal {
    /// value / baseline at least this.
    Ratio(f64),
    /// value / baseline at most this (a growth).
    RatioAtMost(f64),
    /// The value at most this (in the row's unit).
    AtMost(f64),
    /// Informational.
    None,
}

/// One line of the table.
#[derive(Clone, Debug)]
pub struct Row {
    pub figure: String,
    pub unit: Unit,
    pub value: f64,
    pub baseline: Option<f64>,
    pub goal: Goal,
    /// The value measured for `BENCH_BEFORE_BIN`, and its own baseline when it has one
    /// (otherwise `baseline`'s).
    pub before: Option<(f64, Option<f64>)>,
}

impl Row {
    fn ratio_of(value: f64, baseline: Option<f64>) -> Option<f64> {
        baseline.filter(|b| *b > 0.0).map(|b| value / b)
    }

    pub fn ratio(&self) -> Option<f64> {
        Self::ratio_of(self.value, self.baseline)
    }

    fn met(&self, value: f64, ratio: Option<f64>) -> &'static str {
        let ok = match self.goal {
            Goal::Ratio(r) => ratio.map(|x| x >= r),
            Goal::RatioAtMost(r) => ratio.map(|x| x <= r),
            Goal::AtMost(x) => Some(value <= x),
            Goal::None => None,
        };
        match ok {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        }
    }

    fn goal_text(&self) -> String {
        match self.goal {
            Goal::Ratio(r) => format!("ratio ≥ {r}"),
            Goal::RatioAtMost(r) => format!("ratio ≤ {r:.2}"),
            Goal::AtMost(x) => format!("≤ {}", self.unit.show(x)),
            Goal::None => "—".into(),
        }
    }

    fn markdown(&self, with_before: bool) -> String {
        let ratio = self.ratio();
        let show_ratio = |r: Option<f64>| r.map_or("—".into(), |r| format!("{r:.2}"));
        let mut line = format!(
            "| {} | {} | {} | {} | {} | {} |",
            self.figure,
            self.unit.show(self.value),
            self.baseline.map_or("—".into(), |b| self.unit.show(b)),
            show_ratio(ratio),
            self.goal_text(),
            self.met(self.value, ratio),
        );
        if with_before {
            match self.before {
                Some((v, b)) => {
                    let r = Self::ratio_of(v, b.or(self.baseline));
                    let _ = write!(
                        line,
                        " {} | {} | {} |",
                        self.unit.show(v),
                        show_ratio(r),
                        self.met(v, r)
                    );
                }
                None => line += " — | — | |",
            }
        }
        line
    }
}

/// Everything the run found, in order.
pub struct Report {
    with_before: bool,
    rows: Vec<Row>,
    tables: Vec<String>,
    notes: Vec<String>,
    started: Instant,
    load_at_start: String,
}

impl Report {
    pub fn new(with_before: bool) -> Report {
        let report = Report {
            with_before,
            rows: Vec::new(),
            tables: Vec::new(),
            notes: Vec::new(),
            started: Instant::now(),
            load_at_start: load_average(),
        };
        println!("{}", report.header());
        report
    }

    fn header(&self) -> String {
        let mut h = "| figure | value | baseline | ratio | goal | met |".to_string();
        let mut rule = "|---|---|---|---|---|---|".to_string();
        if self.with_before {
            h += " before | ratio before | met before |";
            rule += "---|---|---|";
        }
        format!("{h}\n{rule}")
    }

    /// Adds a row and prints it.
    pub fn row(&mut self, row: Row) {
        println!("{}", row.markdown(self.with_before));
        self.rows.push(row);
    }

    /// Adds a markdown table (a cost-growth table) and prints it.
    pub fn table(&mut self, title: &str, header: &[&str], rows: &[Vec<String>]) {
        let mut t = format!("### {title}\n\n| {} |\n|", header.join(" | "));
        t += &"---|".repeat(header.len());
        t.push('\n');
        for r in rows {
            let _ = writeln!(t, "| {} |", r.join(" | "));
        }
        println!("\n{t}");
        self.tables.push(t);
    }

    /// What a figure ran (a paragraph of `BENCHMARKS.md`), also printed.
    pub fn note(&mut self, text: String) {
        println!("  note: {text}");
        self.notes.push(text);
    }

    /// Writes the report as markdown to `path`.
    pub fn write(&self, path: &Path, command: &str, bins: &[(String, String)]) {
        let mut md = String::from("# Benchmarks\n\n");
        md += "Written by `cargo bench --bench suite` ([benches/suite.rs](benches/suite.rs)); \
               run it with `bash scripts/bench.sh`. Each figure is measured against a baseline \
               in the same run on the same machine: on a shared machine the ratios mean more \
               than the values. Do not edit by hand.\n\n";
        let _ = writeln!(md, "- command: `{command}`");
        let _ = writeln!(md, "- commit: {}", commit());
        for (name, path) in bins {
            let _ = writeln!(md, "- {name}: `{path}`");
        }
        let _ = writeln!(md, "- machine: {}", machine());
        let _ = writeln!(md, "- tools: {}", tools());
        let _ = writeln!(
            md,
            "- date: {}; the run took {:.0} s; load average {} at the start, {} at the end",
            time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            self.started.elapsed().as_secs_f64(),
            self.load_at_start,
            load_average()
        );
        md += "\n## Figures\n\n";
        md += &self.header();
        md.push('\n');
        for row in &self.rows {
            md += &row.markdown(self.with_before);
            md.push('\n');
        }
        md += "\nratio = value ÷ baseline (for latencies and memory, lower is better; their goals \
               are on the value, but for a growth: `ratio ≤`).\n\n## Cost growth\n\n";
        for t in &self.tables {
            md += t;
            md.push('\n');
        }
        md += "## What was run\n\n";
        for n in &self.notes {
            let _ = writeln!(md, "- {n}");
        }
        std::fs::write(path, md).unwrap();
        println!("\nwrote {}", path.display());
    }
}

fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).to_string();
            s += &String::from_utf8_lossy(&o.stderr);
            s.trim().to_string()
        })
        .unwrap_or_default()
}

fn commit() -> String {
    let head = output("git", &["rev-parse", "--short", "HEAD"]);
    if head.is_empty() || head.contains(' ') {
        return "unknown (no git)".into();
    }
    let dirty = output(
        "git",
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            "src",
            "Cargo.toml",
            "Cargo.lock",
        ],
    );
    if dirty.is_empty() {
        format!("`{head}`")
    } else {
        format!("`{head}` with uncommitted changes in src/ or Cargo.*")
    }
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU".into(), |(_, m)| m.trim().to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    format!(
        "{} CPUs (nproc), {model}, {:.0} GiB RAM, Linux {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem_kib as f64 / 1_048_576.0,
        kernel.trim()
    )
}

fn tools() -> String {
    let first_line = |s: String| s.lines().next().unwrap_or("").to_string();
    format!(
        "{}; {}; {}",
        first_line(output("nginx", &["-v"])),
        first_line(output("wrk", &["-v"])),
        first_line(output("redis-server", &["--version"]))
    )
}

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split(' ')
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
