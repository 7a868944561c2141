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

/// The CPU and its cores, as each section names the machine it ran on.
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
    format!("{cpu}, {cores} cores")
}

/// The whole of BENCHMARKS.md: the header, then `sections`. Sections of `kept` (the previous file, when only
/// some suites ran) whose titles are not among `sections` stay, in their old place.
pub fn render(env: &Env, sections: &[Section], kept: &str) -> String {
    let mut s = String::new();
    s.push_str("# Benchmarks\n\n");
    s.push_str("Written by `cargo run --release -p mslprof-tests --bin bench` (the one benchmark command; see README.md). ");
    s.push_str("Every figure is a median over interleaved runs or trials, with the range where a table gives one. Do not edit by hand.\n\n");
    s.push_str("- Machines are shared and noisy: compare medians and ratios, not absolute times. Each section names the machine and scale of the run that wrote it; sections that name none are from runs before sections did.\n");
    s.push_str("- Peak RSS is the child's `ru_maxrss`, which includes the harness's own few MB at spawn time (a child inherits its parent's high-water mark through fork and exec): small figures are a floor, not the program's own.\n");
    s.push('\n');
    let run = format!(
        "Run on {}; scale {:?}, {} runs or trials per configuration unless the table says otherwise.",
        machine(),
        env.scale,
        env.runs
    );
    let fresh: Vec<(String, String)> = sections
        .iter()
        .map(|sec| (sec.title.clone(), render_section(sec, &run)))
        .collect();
    let old = old_sections(kept);
    let mut written = vec![false; fresh.len()];
    for (title, old_text) in &old {
        match fresh.iter().position(|(t, _)| t == title) {
            Some(i) => {
                // This section, then the new ones that follow it in this run and had no place yet.
                for j in i..fresh.len() {
                    let placed = old.iter().any(|(t, _)| *t == fresh[j].0);
                    if j > i && placed {
                        break;
                    }
                    if !written[j] {
                        s.push_str(&fresh[j].1);
                        written[j] = true;
                    }
                }
            }
            None => s.push_str(old_text),
        }
    }
    for (i, (_, text)) in fresh.iter().enumerate() {
        if !written[i] {
            s.push_str(text);
        }
    }
    s
}

fn render_section(sec: &Section, run: &str) -> String {
    let mut s = format!("## {}\n\n{run}\n\n{}\n\n", sec.title, sec.intro);
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
    s
}

/// The `## ` sections of an existing BENCHMARKS.md, each with its full text (heading included).
fn old_sections(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.split_inclusive('\n') {
        if let Some(title) = line.strip_prefix("## ") {
            out.push((title.trim_end().to_string(), String::new()));
        }
        if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
        }
    }
    out
}
