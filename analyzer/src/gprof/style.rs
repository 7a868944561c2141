//! The printing parameters every table of a report shares (gprof's output globals): the last stage of the
//! analysis builds one, and the flat profile, call graph, execution counts, annotated source and orderings
//! read it.

use std::cell::Cell;
use std::fmt::Write as _;

use crate::output::Out;

/// Printing parameters shared by the tables.
#[derive(Debug)]
pub struct Style {
    pub bsd: bool,
    pub descriptions: bool,
    pub ignore_zeros: bool,
    pub output_width: usize,
    pub hz: f64,
    pub granularity: i64,
    pub dimension: String,
    pub dimension_abbrev: char,
    pub print_path: bool,
    pub inline_file_names: bool,
    /// `-l`: names carry `(file:line @ address)`.
    pub line_granularity: bool,
    pub multi_module: bool,
    pub first_output: Cell<bool>,
    /// Width of the call graph's index column (gprof's 6; wider for large multi-module graphs).
    pub index_width: Cell<usize>,
    /// mslprof input: what 100 % is, printed above the flat profile.
    pub share_note: Option<String>,
    /// The call graph's times are measured from sampled stacks (its blurb says so); `None` for gprof's
    /// estimate.
    pub measured: Option<crate::gprof::blurbs::StacksNote>,
}

impl Style {
    /// Separate tables with a form feed, as gprof does.
    pub fn begin_section(&self, out: &mut Out) {
        if self.first_output.get() {
            self.first_output.set(false);
        } else {
            out.push_str("\u{c}\n");
        }
    }

    /// gprof's `granularity: each sample hit covers N byte(s)` line, completed when `time` (in samples) is
    /// positive by ` for P% of T <dimension>` and a blank line. Returns whether `time` was positive.
    pub fn write_granularity(&self, out: &mut Out, time: f64, dimension: &str) -> bool {
        let _ = write!(
            out,
            "\ngranularity: each sample hit covers {} byte(s)",
            self.granularity
        );
        if time > 0.0 {
            let _ = write!(
                out,
                " for {:.2}% of {:.2} {}\n\n",
                crate::gprof::cformat::CFloat(100.0 / time),
                crate::gprof::cformat::CFloat(time / self.hz),
                dimension
            );
        }
        time > 0.0
    }
}
