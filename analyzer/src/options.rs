//! What the command line decides about a report: the options every stage of the analysis reads, and
//! gprof's rule for which sections a report prints.

use std::path::PathBuf;

use crate::elf::symbols::Demangle;
use crate::gprof::symspec::Table;

/// Everything the command line decides about the report.
#[derive(Clone, Debug)]
pub struct Options {
    pub specs: Vec<(Table, String)>,
    /// Flat profile / call graph requested or suppressed (gprof's output_style and user_specified).
    pub flat: Option<bool>,
    pub graph: Option<bool>,
    pub brief: bool,
    pub ignore_zeros: bool,
    pub no_static: bool,
    pub ignore_non_functions: bool,
    pub bsd: bool,
    pub width: usize,
    pub print_path: bool,
    pub inline_file_names: bool,
    pub demangle: Demangle,
    pub sum: bool,
    pub file_info: bool,
    pub external_symbols: Option<PathBuf>,
    /// Show load instances of one file separately instead of merging them.
    pub separate_instances: bool,
    /// gprof's `--file-format`: the layout GNU/BSD input is read in and `gmon.sum` is written in.
    pub file_format: mslprof_format::InputFormat,
    /// `-l`: charge samples to source lines instead of functions.
    pub line: bool,
    /// `-C`/`-Z`: the execution-count tally requested or suppressed.
    pub exec: Option<bool>,
    /// `-A`/`-J`: annotated source requested or suppressed, and how it is printed.
    pub anno: Option<bool>,
    pub annotate: crate::gprof::annotate::AnnotateOptions,
    /// `-r`: the suggested function order.
    pub function_order: bool,
    /// `-R map_file`: the suggested object-file order, from an nm-style map.
    pub file_order: Option<PathBuf>,
    /// mslprof input: no row for the profiler's own time.
    pub hide_overhead: bool,
    /// mslprof input: percentages of all samples of the process instead of the selected modules'.
    pub share_of_process: bool,
    /// mslprof input: list modules under 0.05 % one by one.
    pub all_modules: bool,
    /// `-c`: add the arcs of call instructions the run never took, with a zero count.
    pub static_calls: bool,
    /// `-d[num]`: gprof's debugging bits; mslprof prints 128 (symbols) and 256 (`-c`) to stderr.
    pub debug: u32,
    /// mslprof input: folders searched for modules whose recorded file is missing or was rebuilt
    /// (`--binary-path`, then `MSLPROF_BINARY_PATH`; `binpath`).
    pub binary_path: Vec<PathBuf>,
    /// `--estimate`: gprof's estimated call-graph times even when the profile has sampled stacks.
    pub estimate: bool,
    /// Every function gets its source file and line from the line tables, printed or not (the exports name
    /// every function's); a report reads only those it prints (`stages::symbols`).
    pub every_source: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            specs: Vec::new(),
            flat: None,
            graph: None,
            brief: false,
            ignore_zeros: true,
            no_static: false,
            ignore_non_functions: false,
            bsd: false,
            width: 80,
            print_path: false,
            inline_file_names: false,
            demangle: Demangle::Auto,
            sum: false,
            file_info: false,
            external_symbols: None,
            separate_instances: false,
            file_format: mslprof_format::InputFormat::Auto,
            line: false,
            exec: None,
            anno: None,
            annotate: crate::gprof::annotate::AnnotateOptions::default(),
            function_order: false,
            file_order: None,
            hide_overhead: false,
            share_of_process: false,
            all_modules: false,
            static_calls: false,
            debug: 0,
            binary_path: Vec::new(),
            estimate: false,
            every_source: false,
        }
    }
}

impl Options {
    /// Which of the flat profile and the call graph to print, by gprof's rule: sections the user did not
    /// mention are printed only when nothing at all was requested.
    pub fn sections(&self) -> (bool, bool) {
        let requested = self.flat == Some(true)
            || self.graph == Some(true)
            || self.exec == Some(true)
            || self.anno == Some(true)
            || self.function_order
            || self.file_order.is_some()
            || self.sum
            || self.file_info;
        if requested {
            (self.flat == Some(true), self.graph == Some(true))
        } else {
            (self.flat.is_none(), self.graph.is_none())
        }
    }
}

/// A command line whose options cannot make a report (printed as `mslprof: PROBLEM`, exit status 1).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OptionsError {
    #[error("unknown demangling style `{0}'")]
    DemanglingStyle(String),
    #[error("-r and -R cannot be combined; run them separately")]
    FunctionAndFileOrder,
    #[error("sorry, file format `prof' is not yet supported")]
    ProfFormat,
    #[error("unknown file format `{0}'")]
    FileFormat(String),
}

/// gprof's `AOUTDEBUG` bit of `-d`: the symbol table.
pub const DEBUG_SYMBOLS: u32 = 128;
/// gprof's `CALLDEBUG` bit of `-d`: the static call graph (`-c`).
pub const DEBUG_STATIC_CALLS: u32 = 256;
