//! Rendering the benchmark sections into BENCHMARKS.md.

use crate::Env;
use std::time::Duration;

/// One benchmark's part of the report: a title, what was run, and a table.
pub struct Section {
    pub title: String,
    pub intro: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

pub fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

pub fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 {
        "n/a".into()
    } else {
        format!("{:.2}×", a / b)
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!(
        "{cpu}, {cores} cores (shared and noisy: compare medians and ratios, not absolute times)"
    )
}

pub fn render(env: &Env, sections: &[Section]) -> String {
    let mut s = String::new();
    s.push_str("# Benchmarks\n\n");
    s.push_str("Written by `cargo run --release -p mslprof-tests --bin bench` (the one benchmark command; see README.md). ");
    s.push_str("Every figure is a median over interleaved runs. Do not edit by hand.\n\n");
    s.push_str(&format!("- Machine: {}\n", machine()));
    s.push_str("- Peak RSS is the child's `ru_maxrss`, which includes the harness's own few MB at spawn time (a child inherits its parent's high-water mark through fork and exec): small figures are a floor, not the program's own.\n");
    s.push_str(&format!(
        "- Scale: {:?}, {} runs per configuration unless a table says otherwise\n\n",
        env.scale, env.runs
    ));
    for sec in sections {
        s.push_str(&format!("## {}\n\n{}\n\n", sec.title, sec.intro));
        s.push_str(&format!("| {} |\n", sec.header.join(" | ")));
        s.push_str(&format!("|{}\n", "---|".repeat(sec.header.len())));
        for r in &sec.rows {
            s.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        s.push('\n');
        for n in &sec.notes {
            s.push_str(&format!("- {n}\n"));
        }
        if !sec.notes.is_empty() {
            s.push('\n');
        }
    }
    s
}
