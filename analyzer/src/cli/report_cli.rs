//! The report command: gprof's options (grouped short letters translated to long ones), the report's
//! [`Options`] made from them, and the profiles to read (an mslprof profile needs no executable; the
//! profiles of descendant processes beside it are summed with `--family`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use mslprof_format::InputFormat;

use mslprof_analyzer::elf::symbols::Demangle;
use mslprof_analyzer::gprof::symspec::Table;
use mslprof_analyzer::input::{Error, FirstFile, first_file, is_mslprof_file};
use mslprof_analyzer::options::{Options, OptionsError};
use mslprof_analyzer::output::Out;
use mslprof_analyzer::report::analyse;

use crate::arguments;

/// Help headings, in the order of gprof's manual (section 4).
const OUTPUT: &str = "Output styles";
const ANALYSIS: &str = "Analysis options";
const MISC: &str = "Miscellaneous options";
const DEPRECATED: &str = "Deprecated options (use the symspec forms above)";

/// gprof's options. Short gprof letters (grouped, with attached arguments) are translated to the long forms
/// by [`normalize`] before clap sees them; the short letters declared here are for the help text.
#[derive(Parser, Debug)]
#[command(
    name = "mslprof",
    version,
    args_override_self = true,
    disable_version_flag = true,
    about = "gprof-compatible reports over multi-module profiles",
    long_about = "gprof-compatible reports over multi-module profiles.\n\n\
With no files, reads ./gmon.out and finds every module from the paths recorded in it. \
An mslprof profile needs no executable; a GNU or BSD gmon.out is read with its executable (default a.out), \
and the report is GNU gprof 2.40's, byte for byte.",
    override_usage = "mslprof [OPTIONS] [EXECUTABLE [PROFILE...]]\n       \
mslprof run [--] PROGRAM [ARGS...]\n       \
mslprof demo\n       \
mslprof export [--format FMT] [-o PATH] [PROFILE...]",
    after_help = "Symspecs: func, file.c, file.c:func, file.c:line; func@module names one module's function, \
and module: (e.g. libfoo.so:) every function of a module.\n\
Subcommands (each answers --help): run (run a program under the runtime and report), demo (build and \
profile the bundled demo), export (callgrind, pprof, JSON, DOT/SVG/PNG, folded stacks, a flame graph, or one GNU gmon.out per module)."
)]
struct Cli {
    /// Print the flat profile, only for SYMSPEC when given (default: flat profile and call graph)
    #[arg(short = 'p', long = "flat-profile", value_name = "SYMSPEC", num_args = 0..=1, require_equals = true, default_missing_value = "", help_heading = OUTPUT)]
    flat_profile: Vec<String>,
    /// Do not print the flat profile; with SYMSPEC, print it without the matching functions
    #[arg(short = 'P', long = "no-flat-profile", value_name = "SYMSPEC", num_args = 0..=1, require_equals = true, default_missing_value = "", help_heading = OUTPUT)]
    no_flat_profile: Vec<String>,
    /// Print the call graph, only for SYMSPEC and its children when given
    #[arg(short = 'q', long = "graph", value_name = "SYMSPEC", num_args = 0..=1, require_equals = true, default_missing_value = "", help_heading = OUTPUT)]
    graph: Vec<String>,
    /// Do not print the call graph; with SYMSPEC, print it without the matching functions
    #[arg(short = 'Q', long = "no-graph", value_name = "SYMSPEC", num_args = 0..=1, require_equals = true, default_missing_value = "", help_heading = OUTPUT)]
    no_graph: Vec<String>,
    /// Leave out the blurbs that explain each table's fields
    #[arg(short = 'b', long, help_heading = OUTPUT)]
    brief: bool,
    /// Print a summary of the profile files (record counts), then exit
    #[arg(short = 'i', long = "file-info", help_heading = OUTPUT)]
    file_info: bool,
    /// Print source file names with their full path
    #[arg(short = 'L', long = "print-path", help_heading = OUTPUT)]
    print_path: bool,
    /// Print the source file name of each function in the call graph
    #[arg(long = "inline-file-names", help_heading = OUTPUT)]
    inline_file_names: bool,
    /// Print the output in the traditional BSD style
    #[arg(short = 'T', long, help_heading = OUTPUT)]
    traditional: bool,
    /// Width of output lines (used by the function index of the call graph)
    #[arg(short = 'w', long, value_name = "WIDTH", help_heading = OUTPUT)]
    width: Option<usize>,
    /// Demangle C++ and Rust names (the default), in STYLE when given (auto, gnu-v3, rust, none)
    #[arg(long, value_name = "STYLE", num_args = 0..=1, require_equals = true, default_missing_value = "auto", help_heading = OUTPUT)]
    demangle: Option<String>,
    /// Print symbol names as they are in the symbol table
    #[arg(long = "no-demangle", help_heading = OUTPUT)]
    no_demangle: bool,
    /// Annotated source: repeat a block's count on every line of the block
    #[arg(short = 'x', long = "all-lines", help_heading = OUTPUT)]
    all_lines: bool,
    /// Annotated source: write one NAME-ann file per source file instead of standard output
    #[arg(short = 'y', long = "separate-files", help_heading = OUTPUT)]
    separate_files: bool,
    /// mslprof: show each load instance of a library separately instead of merging them
    #[arg(long = "separate-instances", help_heading = OUTPUT)]
    separate_instances: bool,
    /// Leave out static (file-local) functions; their time and calls go to the function before them
    #[arg(short = 'a', long = "no-static", help_heading = ANALYSIS)]
    no_static: bool,
    /// Ignore symbols that are not known to be functions
    #[arg(short = 'D', long = "ignore-non-functions", help_heading = ANALYSIS)]
    ignore_non_functions: bool,
    /// Delete the arcs from functions matching FROM to functions matching TO (FROM/TO symspecs)
    #[arg(short = 'k', long = "exclude-arc", value_name = "FROM/TO", help_heading = ANALYSIS)]
    exclude_arc: Vec<String>,
    /// Execution counts only: leave out symbols executed fewer than NUM times
    #[arg(short = 'm', long = "min-count", value_name = "NUM", help_heading = ANALYSIS)]
    min_count: Option<u64>,
    /// In the call graph, propagate time only for functions matching SYMSPEC
    #[arg(short = 'n', long = "time", value_name = "SYMSPEC", help_heading = ANALYSIS)]
    time: Vec<String>,
    /// In the call graph, do not propagate time for functions matching SYMSPEC
    #[arg(short = 'N', long = "no-time", value_name = "SYMSPEC", help_heading = ANALYSIS)]
    no_time: Vec<String>,
    /// Read symbols from FILE (nm-style, e.g. /proc/kallsyms) instead of the executable
    #[arg(short = 'S', long = "external-symbol-table", value_name = "FILE", help_heading = ANALYSIS)]
    external_symbol_table: Option<PathBuf>,
    /// mslprof input: look in DIRS (colon-separated; repeatable; then MSLPROF_BINARY_PATH) for modules whose recorded file is missing or rebuilt, by build-id and then by file name
    #[arg(long = "binary-path", value_name = "DIRS", help_heading = ANALYSIS)]
    binary_path: Vec<std::ffi::OsString>,
    /// List every function in the flat profile, also those never called and never sampled
    #[arg(short = 'z', long = "display-unused-functions", help_heading = ANALYSIS)]
    display_unused: bool,
    /// Read profile files as FORMAT: auto (default), bsd, 4.4bsd or magic
    #[arg(short = 'O', long = "file-format", value_name = "FORMAT", help_heading = MISC)]
    file_format: Option<String>,
    /// Sum the profile files into gmon.sum (which may be one of the inputs)
    #[arg(short = 's', long, help_heading = MISC)]
    sum: bool,
    /// Print the version and exit
    #[arg(short = 'v', long, action = clap::ArgAction::Version, help_heading = MISC)]
    version: Option<bool>,
    /// Leave FUNCTION (and its children) out of the call graph (as -Q FUNCTION)
    #[arg(short = 'e', long = "exclude-graph", value_name = "FUNCTION", help_heading = DEPRECATED)]
    exclude_graph: Vec<String>,
    /// As -e, and leave its time out of the call graph's percentages
    #[arg(short = 'E', long = "exclude-graph-and-time", value_name = "FUNCTION", help_heading = DEPRECATED)]
    exclude_graph_time: Vec<String>,
    /// Limit the call graph to FUNCTION and its children (as -q FUNCTION)
    #[arg(short = 'f', long = "only-graph", value_name = "FUNCTION", help_heading = DEPRECATED)]
    only_graph: Vec<String>,
    /// As -f, and use only their time for the call graph's percentages
    #[arg(short = 'F', long = "only-graph-and-time", value_name = "FUNCTION", help_heading = DEPRECATED)]
    only_graph_time: Vec<String>,
    /// Print annotated source, only for SYMSPEC when given
    #[arg(short = 'A', long = "annotated-source", value_name = "SYMSPEC", num_args = 0..=1, require_equals = true, default_missing_value = "", help_heading = OUTPUT)]
    annotated_source: Vec<String>,
    /// Do not print annotated source; with SYMSPEC, print it without the matching functions
    #[arg(short = 'J', long = "no-annotated-source", value_name = "SYMSPEC", num_args = 0..=1, require_equals = true, default_missing_value = "", help_heading = OUTPUT)]
    no_annotated_source: Vec<String>,
    /// Print the tally of functions and their call counts (execution counts), only for SYMSPEC when given
    #[arg(short = 'C', long = "exec-counts", value_name = "SYMSPEC", num_args = 0..=1, require_equals = true, default_missing_value = "", help_heading = OUTPUT)]
    exec_counts: Vec<String>,
    /// Do not print execution counts; with SYMSPEC, print them without the matching functions
    #[arg(short = 'Z', long = "no-exec-counts", value_name = "SYMSPEC", num_args = 0..=1, require_equals = true, default_missing_value = "", help_heading = OUTPUT)]
    no_exec_counts: Vec<String>,
    /// Directories to search for source files (colon-separated; GPROF_PATH is searched too)
    #[arg(short = 'I', long = "directory-path", value_name = "DIRS", help_heading = OUTPUT)]
    directory_path: Vec<String>,
    /// Annotated source: list the NUM most executed lines of each file (default 10)
    #[arg(short = 't', long = "table-length", value_name = "NUM", help_heading = OUTPUT)]
    table_length: Option<usize>,
    /// Print a suggested function order (one list per module for mslprof profiles)
    #[arg(short = 'r', long = "function-ordering", help_heading = OUTPUT)]
    function_ordering: bool,
    /// Print a suggested link order of object files, from an nm-style MAP_FILE
    #[arg(short = 'R', long = "file-ordering", value_name = "MAP_FILE", help_heading = OUTPUT)]
    file_ordering: Option<PathBuf>,
    /// Line-by-line profile: charge samples to source lines (from DWARF) instead of functions
    #[arg(short = 'l', long, help_heading = ANALYSIS)]
    line: bool,
    /// mslprof: also read the profiles the process's descendants left beside the profile (gmon.out.PID) and sum them
    #[arg(long, help_heading = ANALYSIS)]
    family: bool,
    /// mslprof: leave out the row of the profiler's own time (libmslprof.so, shown as overhead)
    #[arg(long = "no-overhead", help_heading = OUTPUT)]
    no_overhead: bool,
    /// mslprof: what 100 % is: the samples in the selected modules (default) or all samples of the process
    #[arg(long = "share-of", value_name = "WHAT", value_parser = ["selected", "process"], help_heading = ANALYSIS)]
    share_of: Option<String>,
    /// mslprof: list every module in the module tables, also those under 0.05 % of the samples
    #[arg(long = "all-modules", help_heading = OUTPUT)]
    all_modules: bool,
    /// mslprof: with sampled stacks in the profile, print gprof's estimated call-graph times (from the call counts) instead of the measured ones
    #[arg(long, help_heading = ANALYSIS)]
    estimate: bool,
    /// Add the calls found in the machine code that never ran, with a count of 0 (static call graph)
    #[arg(short = 'c', long = "static-call-graph", help_heading = ANALYSIS)]
    static_call_graph: bool,
    /// Debugging output on stderr: gprof's bits NUM (128 symbols read, 256 calls found by -c; none: all)
    #[arg(short = 'd', long, value_name = "NUM", num_args = 0..=1, require_equals = true, default_missing_value = "", help_heading = MISC)]
    debug: Option<String>,
    /// The executable (a GNU gmon.out needs it; default a.out), then profile files (default gmon.out)
    #[arg(value_name = "FILES")]
    files: Vec<PathBuf>,
}

/// Translate gprof-style short options (grouped, with attached optional arguments) to long ones.
fn normalize(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--" {
            out.extend(args[i..].iter().cloned());
            break;
        }
        normalize_option(args, &mut i, &mut out);
    }
    out
}

/// Translates `args[*i]` (with the value it takes from the next argument, if any) into `out`, and moves `i`
/// past them. A long option is kept as it is; `i` moves past its separate value too (`--width 80`).
fn normalize_option(args: &[String], i: &mut usize, out: &mut Vec<String>) {
    let a = &args[*i];
    *i += 1;
    if a.starts_with("--") || !a.starts_with('-') || a == "-" {
        out.push(a.clone());
        if let Some(long) = a.strip_prefix("--")
            && long_takes_separate_value(long)
            && let Some(value) = args.get(*i)
        {
            out.push(value.clone());
            *i += 1;
        }
        return;
    }
    let chars: Vec<char> = a[1..].chars().collect();
    let mut k = 0;
    while k < chars.len() {
        let c = chars[k];
        k += 1;
        let rest: String = chars[k..].iter().collect();
        let optional = |long: &str, out: &mut Vec<String>| {
            if rest.is_empty() {
                out.push(format!("--{long}"));
            } else {
                out.push(format!("--{long}={rest}"));
            }
        };
        let required = |long: &str, out: &mut Vec<String>, i: &mut usize| {
            if !rest.is_empty() {
                out.push(format!("--{long}={rest}"));
            } else if *i < args.len() {
                out.push(format!("--{long}={}", args[*i]));
                *i += 1;
            } else {
                out.push(format!("--{long}"));
            }
        };
        match c {
            'a' => out.push("--no-static".into()),
            'b' => out.push("--brief".into()),
            'D' => out.push("--ignore-non-functions".into()),
            'i' => out.push("--file-info".into()),
            'L' => out.push("--print-path".into()),
            's' => out.push("--sum".into()),
            'T' => out.push("--traditional".into()),
            'z' => out.push("--display-unused-functions".into()),
            'x' => out.push("--all-lines".into()),
            'y' => out.push("--separate-files".into()),
            'v' => out.push("--version".into()),
            'l' => out.push("--line".into()),
            'r' => out.push("--function-ordering".into()),
            'h' => out.push("-h".into()),
            'p' => {
                optional("flat-profile", out);
                break;
            }
            'P' => {
                optional("no-flat-profile", out);
                break;
            }
            'q' => {
                optional("graph", out);
                break;
            }
            'Q' => {
                optional("no-graph", out);
                break;
            }
            'A' => {
                optional("annotated-source", out);
                break;
            }
            'J' => {
                optional("no-annotated-source", out);
                break;
            }
            'C' => {
                optional("exec-counts", out);
                break;
            }
            'Z' => {
                optional("no-exec-counts", out);
                break;
            }
            'e' | 'E' | 'f' | 'F' | 'k' | 'm' | 'n' | 'N' | 'w' | 'S' | 'O' | 'I' | 't' | 'R' => {
                let long = match c {
                    'R' => "file-ordering",
                    'I' => "directory-path",
                    't' => "table-length",
                    'O' => "file-format",
                    'e' => "exclude-graph",
                    'E' => "exclude-graph-and-time",
                    'f' => "only-graph",
                    'F' => "only-graph-and-time",
                    'k' => "exclude-arc",
                    'm' => "min-count",
                    'n' => "time",
                    'N' => "no-time",
                    'w' => "width",
                    _ => "external-symbol-table",
                };
                required(long, out, i);
                break;
            }
            'c' => out.push("--static-call-graph".into()),
            'd' => {
                optional("debug", out);
                break;
            }
            other => out.push(format!("-{other}")),
        }
    }
}

/// Whether `--NAME` takes a value that may be the next argument (`--width 80`; not `--graph[=SYMSPEC]`).
fn long_takes_separate_value(name: &str) -> bool {
    use clap::CommandFactory;
    !name.contains('=')
        && Cli::command().get_arguments().any(|a| {
            a.get_long() == Some(name)
                && a.get_action().takes_values()
                && !a.is_require_equals_set()
        })
}

/// How many leading `args` one report option takes: itself and the value it reads from the next argument, if
/// any (`-e name`, `--width 80`). `mslprof run` reads its report options before the program this way.
pub(crate) fn option_len(args: &[String]) -> usize {
    let mut i = 0;
    normalize_option(args, &mut i, &mut Vec::new());
    i
}

/// Checks report options (without files) as the report will read them; an error is printed after `prefix`,
/// and `Err` holds the exit status (`--help` and `--version` print and give success).
pub(crate) fn check_report_options(args: &[String], prefix: &str) -> Result<(), ExitCode> {
    let cli: Cli = arguments::parse("mslprof", normalize(args), prefix)?;
    options_from(&cli).map(drop).map_err(|e| {
        eprintln!("{prefix}{e}");
        ExitCode::from(1)
    })
}

fn options_from(cli: &Cli) -> Result<Options, OptionsError> {
    let mut o = Options {
        no_static: cli.no_static,
        brief: cli.brief,
        ignore_non_functions: cli.ignore_non_functions,
        file_info: cli.file_info,
        print_path: cli.print_path,
        inline_file_names: cli.inline_file_names,
        sum: cli.sum,
        bsd: cli.traditional,
        ignore_zeros: !cli.display_unused,
        width: cli.width.unwrap_or(80),
        external_symbols: cli.external_symbol_table.clone(),
        binary_path: cli
            .binary_path
            .iter()
            .flat_map(std::env::split_paths)
            .filter(|p| !p.as_os_str().is_empty())
            .chain(mslprof_analyzer::elf::binpath::from_environment())
            .collect(),
        separate_instances: cli.separate_instances,
        line: cli.line,
        function_order: cli.function_ordering,
        file_order: cli.file_ordering.clone(),
        hide_overhead: cli.no_overhead,
        share_of_process: cli.share_of.as_deref() == Some("process"),
        all_modules: cli.all_modules,
        static_calls: cli.static_call_graph,
        estimate: cli.estimate,
        ..Options::default()
    };
    if let Some(d) = &cli.debug {
        // gprof: -dN ors N in (atoi, so junk reads as 0) plus its "any debugging" bit; -d alone is all.
        o.debug = if d.is_empty() {
            u32::MAX
        } else {
            let digits: String = d.chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse::<u32>().unwrap_or(0) | 1
        };
    }
    if cli.no_demangle {
        o.demangle = Demangle::None;
    } else if let Some(style) = &cli.demangle {
        o.demangle = Demangle::from_style(style)
            .ok_or_else(|| OptionsError::DemanglingStyle(style.clone()))?;
    }
    for s in &cli.flat_profile {
        if !s.is_empty() {
            o.specs.push((Table::InclFlat, s.clone()));
        }
        o.flat = Some(true);
    }
    for s in &cli.no_flat_profile {
        if s.is_empty() {
            o.flat = Some(false);
        } else {
            o.specs.push((Table::ExclFlat, s.clone()));
            o.flat = Some(true);
        }
    }
    for s in &cli.graph {
        if !s.is_empty() {
            let t = if s.contains('/') {
                Table::InclArcs
            } else {
                Table::InclGraph
            };
            o.specs.push((t, s.clone()));
        }
        o.graph = Some(true);
    }
    for s in &cli.no_graph {
        if s.is_empty() {
            o.graph = Some(false);
        } else {
            let t = if s.contains('/') {
                Table::ExclArcs
            } else {
                Table::ExclGraph
            };
            o.specs.push((t, s.clone()));
            o.graph = Some(true);
        }
    }
    for s in &cli.exec_counts {
        if !s.is_empty() {
            o.specs.push((Table::InclExec, s.clone()));
        }
        o.exec = Some(true);
    }
    for s in &cli.no_exec_counts {
        if s.is_empty() {
            o.exec = Some(false);
        } else {
            o.specs.push((Table::ExclExec, s.clone()));
            o.exec = Some(true);
        }
    }
    for s in &cli.annotated_source {
        if !s.is_empty() {
            o.specs.push((Table::InclAnno, s.clone()));
        }
        o.anno = Some(true);
    }
    for s in &cli.no_annotated_source {
        if s.is_empty() {
            o.anno = Some(false);
        } else {
            o.specs.push((Table::ExclAnno, s.clone()));
            o.anno = Some(true);
        }
    }
    o.annotate.all_lines = cli.all_lines;
    o.annotate.separate_files = cli.separate_files;
    for d in &cli.directory_path {
        o.annotate
            .search
            .extend(d.split(':').filter(|p| !p.is_empty()).map(String::from));
    }
    if let Ok(p) = std::env::var("GPROF_PATH") {
        o.annotate
            .search
            .extend(p.split(':').filter(|p| !p.is_empty()).map(String::from));
    }
    if let Some(t) = cli.table_length {
        o.annotate.table_length = t;
    }
    if let Some(m) = cli.min_count {
        o.annotate.min_count = m;
    }
    for s in &cli.exclude_graph {
        o.specs.push((Table::ExclGraph, s.clone()));
    }
    for s in &cli.exclude_graph_time {
        o.specs.push((Table::ExclGraph, s.clone()));
        o.specs.push((Table::ExclTime, s.clone()));
    }
    for s in &cli.only_graph {
        o.specs.push((Table::InclGraph, s.clone()));
    }
    for s in &cli.only_graph_time {
        o.specs.push((Table::InclGraph, s.clone()));
        o.specs.push((Table::InclTime, s.clone()));
    }
    for s in &cli.exclude_arc {
        o.specs.push((Table::ExclArcs, s.clone()));
    }
    for s in &cli.time {
        o.specs.push((Table::InclTime, s.clone()));
    }
    for s in &cli.no_time {
        o.specs.push((Table::ExclTime, s.clone()));
    }
    if cli.function_ordering && cli.file_ordering.is_some() {
        // gprof runs the file order over the state its function order left behind; mslprof does not
        // reproduce that mix.
        return Err(OptionsError::FunctionAndFileOrder);
    }
    if let Some(f) = &cli.file_format {
        o.file_format = match f.as_str() {
            "auto" => InputFormat::Auto,
            "magic" => InputFormat::Magic,
            "bsd" => InputFormat::Bsd,
            "4.4bsd" => InputFormat::Bsd44,
            "prof" => return Err(OptionsError::ProfFormat),
            other => return Err(OptionsError::FileFormat(other.to_string())),
        };
    }
    Ok(o)
}

fn fail(e: &Error) -> ExitCode {
    eprintln!("mslprof: {e}");
    ExitCode::from(1)
}

pub(crate) fn report_main(args: &[String]) -> ExitCode {
    let norm = normalize(args);
    let cli: Cli = match arguments::parse("mslprof", norm, "mslprof: ") {
        Ok(c) => c,
        Err(code) => return code,
    };
    let opts = match options_from(&cli) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("mslprof: {msg}");
            return ExitCode::from(1);
        }
    };
    let mut exe = cli.files.first().cloned();
    let mut skip = 1;
    // The executable is optional: a first file that is itself a profile starts the list of profiles.
    if let Some(first) = &exe {
        match first_file(first) {
            Ok(FirstFile::Executable) => {}
            Ok(FirstFile::Profile) => {
                exe = None;
                skip = 0;
            }
            Err(e) => return fail(&e),
        }
    }
    let mut profiles: Vec<PathBuf> = cli.files.iter().skip(skip).cloned().collect();
    if profiles.is_empty() {
        profiles.push(PathBuf::from("gmon.out"));
    }
    if profiles.len() == 1 && is_mslprof_file(&profiles[0]) {
        let family: Vec<PathBuf> = mslprof_analyzer::family::descendants_of(&profiles[0])
            .into_iter()
            .filter(|p| is_mslprof_file(p))
            .collect();
        if cli.family {
            profiles.extend(family);
        } else if !family.is_empty() {
            eprintln!(
                "mslprof: {} also has {} profile(s) of descendant processes beside it ({}{}); --family sums them",
                profiles[0].display(),
                family.len(),
                family[0].display(),
                if family.len() > 1 { ", ..." } else { "" }
            );
        }
    }
    let mut report = Out::to(Box::new(std::io::stdout()));
    match analyse(&opts, exe.as_deref(), &profiles, &mut report) {
        Ok(out) => {
            for w in &out.warnings {
                eprintln!("mslprof: warning: {w}");
            }
            if let Some(sum) = &out.summary {
                let path = Path::new("gmon.sum");
                if let Err(e) = std::fs::write(path, sum) {
                    return fail(&Error::io(path, e));
                }
            }
            match report.finish() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mslprof: stdout: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Err(f) => fail(&f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options_error(args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let cli =
            Cli::try_parse_from(std::iter::once("mslprof".to_string()).chain(normalize(&args)))
                .expect("the command line parses");
        match options_from(&cli) {
            Ok(_) => panic!("{args:?} made options"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn option_errors_keep_gprof_wording() {
        assert_eq!(
            options_error(&["--demangle=foo"]),
            "unknown demangling style `foo'"
        );
        assert_eq!(
            options_error(&["-r", "-Rmap"]),
            "-r and -R cannot be combined; run them separately"
        );
        assert_eq!(
            options_error(&["-Oprof"]),
            "sorry, file format `prof' is not yet supported"
        );
        assert_eq!(options_error(&["-O", "zzz"]), "unknown file format `zzz'");
    }
}
