//! The module lists of an mslprof report (modules loaded but not profiled, and the closing module table):
//! sorted by share of the samples, rows under 0.05 % folded into one line unless every row is asked for (or
//! the module has functions in the report, whose index must stay findable),
//! and a name column as wide as the longest name so that long names do not push the columns apart. When the
//! profiler's own time is in the table, a second share column gives each other row's share of the program's
//! own samples (all but the profiler's), which the profiler's own time does not shift.

use std::fmt::Write as _;

use crate::output::Out;

/// Shares below this (in percent) are folded into one line.
const FOLD_BELOW: f64 = 0.05;

/// One row of a module list.
pub struct Row {
    /// Module index (`None`: no index column, as in the list of modules not profiled).
    pub index: Option<usize>,
    pub samples: u64,
    pub name: String,
    pub path: String,
    /// Printed after the path (load instances), may be empty.
    pub note: String,
    /// Never folded: a profiled module with samples or calls, whose index the flat profile and the call
    /// graph may name, keeps its row however small its share.
    pub keep: bool,
    /// The profiler's own time (libmslprof.so): no share of the program's samples.
    pub overhead: bool,
}

/// Print `rows` with shares of `total` samples; `all`: no folding. When rows marked `overhead` have samples,
/// also each other row's share of the samples that are not the profiler's own.
pub fn print(out: &mut Out, mut rows: Vec<Row>, total: f64, all: bool) {
    let share = |r: &Row| 100.0 * r.samples as f64 / total.max(1.0);
    let overhead: u64 = rows.iter().filter(|r| r.overhead).map(|r| r.samples).sum();
    let program_total = (overhead > 0).then(|| (total - overhead as f64).max(1.0));
    let program_share = |samples: u64, is_overhead: bool| match program_total {
        Some(_) if is_overhead => format!("{:>8}  ", ""),
        Some(t) => format!("{:>7.2}%  ", 100.0 * samples as f64 / t),
        None => String::new(),
    };
    rows.sort_by(|a, b| {
        b.samples
            .cmp(&a.samples)
            .then_with(|| a.index.cmp(&b.index))
    });
    let width = rows
        .iter()
        .filter(|r| all || r.keep || share(r) >= FOLD_BELOW)
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(6);
    let with_index = rows.iter().any(|r| r.index.is_some());
    if with_index {
        let program = if program_total.is_some() {
            "program  "
        } else {
            ""
        };
        let _ = writeln!(out, " index  samples  {program}{:<width$}  path", "module");
    }
    let mut folded: Vec<String> = Vec::new();
    let mut folded_samples = 0u64;
    let mut folded_program_samples = 0u64;
    for r in &rows {
        if !all && !r.keep && share(r) < FOLD_BELOW {
            folded.push(r.name.clone());
            folded_samples += r.samples;
            if !r.overhead {
                folded_program_samples += r.samples;
            }
            continue;
        }
        let mut line = String::new();
        match r.index {
            Some(i) => {
                let _ = write!(line, "{i:>6} ");
            }
            None if with_index => line.push_str("       "),
            None => {}
        }
        let _ = write!(
            line,
            "{:>7.2}%  {}{:<width$}  {}{}",
            share(r),
            program_share(r.samples, r.overhead),
            r.name,
            r.path,
            r.note
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if !folded.is_empty() {
        if with_index {
            out.push_str("       ");
        }
        let _ = writeln!(
            out,
            "{:>7.2}%  {}{} more under {FOLD_BELOW}% each (--all-modules lists them): {}",
            100.0 * folded_samples as f64 / total.max(1.0),
            program_share(folded_program_samples, false),
            folded.len(),
            folded.join(", ")
        );
    }
    if program_total.is_some() {
        out.push_str(
            "\n program: the share of the program's own samples, all but the profiling overhead's. It can\n \
             differ by a few points from a run without the profiler: the profiler's stubs also draw samples\n \
             of the code that ran just before them.\n",
        );
    }
}
