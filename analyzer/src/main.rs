//! mslprof: gprof-compatible reports over multi-module profiles.
//!
//! `mslprof [gprof options] [executable [profile-files...]]` reports like GNU gprof;
//! `mslprof run`, `mslprof demo` and `mslprof export` are the subcommands.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use mslprof_format::{FileFormat, GnuTarget, InputFormat};

use mslprof_analyzer::output::Out;
use mslprof_analyzer::report::{self, Failure, Input, Options};
use mslprof_analyzer::symbols::Demangle;
use mslprof_analyzer::symspec::Table;

mod commands;

/// gprof's options, spelled long (short gprof letters are translated to these first).
#[derive(Parser, Debug)]
#[command(
    name = "mslprof",
    version,
    args_override_self = true,
    about = "gprof-compatible reports over multi-module profiles",
    after_help = "Short options are GNU gprof's: -a -b -c -D -i -l -L -r -s -T -v -x -y -z, -d[num], -p/-P/-q/-Q/-A/-J/-C/-Z[symspec] (argument attached), \
-e/-E/-f/-F name, -I dirs, -t num, -R map_file, -O format, -k from/to, -m num, -n/-N symspec, -w width, -S file.\n\
Symspecs: func, file.c, file.c:func, file.c:line; func@module names one module's function and \
module: (e.g. libfoo.so:) all functions of a module.\n\
Subcommands: mslprof run PROGRAM [ARGS] | mslprof demo | mslprof export PROFILE [OUTDIR]"
)]
struct Cli {
    #[arg(long = "no-static")]
    no_static: bool,
    #[arg(long)]
    brief: bool,
    #[arg(long = "ignore-non-functions")]
    ignore_non_functions: bool,
    #[arg(long = "file-info")]
    file_info: bool,
    #[arg(long = "print-path")]
    print_path: bool,
    #[arg(long = "inline-file-names")]
    inline_file_names: bool,
    #[arg(long)]
    sum: bool,
    #[arg(long)]
    traditional: bool,
    #[arg(long = "display-unused-functions")]
    display_unused: bool,
    #[arg(long = "flat-profile", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    flat_profile: Vec<String>,
    #[arg(long = "no-flat-profile", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    no_flat_profile: Vec<String>,
    #[arg(long = "graph", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    graph: Vec<String>,
    #[arg(long = "no-graph", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    no_graph: Vec<String>,
    #[arg(long = "exclude-graph")]
    exclude_graph: Vec<String>,
    #[arg(long = "exclude-graph-and-time")]
    exclude_graph_time: Vec<String>,
    #[arg(long = "only-graph")]
    only_graph: Vec<String>,
    #[arg(long = "only-graph-and-time")]
    only_graph_time: Vec<String>,
    #[arg(long = "exclude-arc")]
    exclude_arc: Vec<String>,
    #[arg(long = "min-count")]
    min_count: Option<u64>,
    #[arg(long = "time")]
    time: Vec<String>,
    #[arg(long = "no-time")]
    no_time: Vec<String>,
    #[arg(long)]
    width: Option<usize>,
    #[arg(long = "external-symbol-table")]
    external_symbol_table: Option<PathBuf>,
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "auto")]
    demangle: Option<String>,
    #[arg(long = "no-demangle")]
    no_demangle: bool,
    #[arg(long = "file-format")]
    file_format: Option<String>,
    /// Annotated source: -x carries counts onto every line of a block, -y writes one NAME-ann file per source.
    #[arg(long = "all-lines")]
    all_lines: bool,
    #[arg(long = "separate-files")]
    separate_files: bool,
    /// Execution counts (-C[symspec]): the call count of every function, by source file and line.
    #[arg(long = "exec-counts", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    exec_counts: Vec<String>,
    /// No execution counts (-Z), or leave out the functions of a symspec (-Zsymspec).
    #[arg(long = "no-exec-counts", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    no_exec_counts: Vec<String>,
    /// Annotated source (-A[symspec]): each source line with its execution count.
    #[arg(long = "annotated-source", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    annotated_source: Vec<String>,
    /// No annotated source (-J), or leave out the functions of a symspec (-Jsymspec).
    #[arg(long = "no-annotated-source", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    no_annotated_source: Vec<String>,
    /// Directories to search for source files (-I dirs, colon-separated; GPROF_PATH is searched after).
    #[arg(long = "directory-path")]
    directory_path: Vec<String>,
    /// Length of the most-executed-lines table of annotated source (-t num).
    #[arg(long = "table-length")]
    table_length: Option<usize>,
    /// Print a suggested function order (-r); one list per module for mslprof profiles.
    #[arg(long = "function-ordering")]
    function_ordering: bool,
    /// Print a suggested link order of object files (-R map_file), from an nm -A style map.
    #[arg(long = "file-ordering")]
    file_ordering: Option<PathBuf>,
    /// Line-by-line profile: charge samples to source lines (from DWARF) instead of functions.
    #[arg(long)]
    line: bool,
    /// Show each load instance of a library separately instead of merging them.
    #[arg(long = "separate-instances")]
    separate_instances: bool,
    /// Static call graph (-c): add the calls found in the machine code that never ran, with count 0.
    #[arg(long = "static-call-graph")]
    static_call_graph: bool,
    /// Debugging output on stderr (-d[num], gprof's bits; 128 symbols, 256 -c; none = all).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    debug: Option<String>,
    /// Executable, then profile files (default gmon.out).
    files: Vec<PathBuf>,
}

/// Translate gprof-style short options (grouped, with attached optional arguments) to long ones.
fn normalize(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "--" {
            out.extend(args[i - 1..].iter().cloned());
            break;
        }
        if a.starts_with("--") || !a.starts_with('-') || a == "-" {
            out.push(a.clone());
            continue;
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
                'h' => out.push("--help".into()),
                'p' => {
                    optional("flat-profile", &mut out);
                    break;
                }
                'P' => {
                    optional("no-flat-profile", &mut out);
                    break;
                }
                'q' => {
                    optional("graph", &mut out);
                    break;
                }
                'Q' => {
                    optional("no-graph", &mut out);
                    break;
                }
                'A' => {
                    optional("annotated-source", &mut out);
                    break;
                }
                'J' => {
                    optional("no-annotated-source", &mut out);
                    break;
                }
                'C' => {
                    optional("exec-counts", &mut out);
                    break;
                }
                'Z' => {
                    optional("no-exec-counts", &mut out);
                    break;
                }
                'e' | 'E' | 'f' | 'F' | 'k' | 'm' | 'n' | 'N' | 'w' | 'S' | 'O' | 'I' | 't'
                | 'R' => {
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
                    required(long, &mut out, &mut i);
                    break;
                }
                'c' => out.push("--static-call-graph".into()),
                'd' => {
                    optional("debug", &mut out);
                    break;
                }
                other => out.push(format!("-{other}")),
            }
        }
    }
    out
}

fn options_from(cli: &Cli) -> Result<Options, String> {
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
        separate_instances: cli.separate_instances,
        line: cli.line,
        function_order: cli.function_ordering,
        file_order: cli.file_ordering.clone(),
        static_calls: cli.static_call_graph,
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
            .ok_or_else(|| format!("unknown demangling style `{style}'"))?;
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
        return Err("-r and -R cannot be combined; run them separately".into());
    }
    if let Some(f) = &cli.file_format {
        o.file_format = match f.as_str() {
            "auto" => InputFormat::Auto,
            "magic" => InputFormat::Magic,
            "bsd" => InputFormat::Bsd,
            "4.4bsd" => InputFormat::Bsd44,
            "prof" => return Err("sorry, file format `prof' is not yet supported".into()),
            other => return Err(format!("unknown file format `{other}'")),
        };
    }
    Ok(o)
}

fn fail(f: &Failure) -> ExitCode {
    eprintln!("mslprof: {}: {}", f.file, f.problem);
    ExitCode::from(1)
}

pub(crate) fn report_main(args: &[String]) -> ExitCode {
    let norm = normalize(args);
    let cli = match Cli::try_parse_from(std::iter::once("mslprof".to_string()).chain(norm)) {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            eprintln!("mslprof: {}", first.trim_start_matches("error: "));
            return ExitCode::from(1);
        }
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
    // For mslprof profiles the executable is optional: a first file that is itself an mslprof
    // profile starts the list of profiles.
    if let Some(first) = &exe
        && is_mslprof_file(first)
    {
        exe = None;
        skip = 0;
    }
    let mut profiles: Vec<PathBuf> = cli.files.iter().skip(skip).cloned().collect();
    if profiles.is_empty() {
        profiles.push(PathBuf::from("gmon.out"));
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
                    return fail(&Failure {
                        file: "gmon.sum".into(),
                        problem: e.to_string(),
                    });
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

fn is_mslprof_file(p: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && is_mslprof(&magic)
}

/// Whether `bytes` start with the whole mslprof magic (a shorter prefix of it is read as GNU/BSD input and
/// refused by the reader).
pub(crate) fn is_mslprof(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && mslprof_format::detect(bytes) == Some(FileFormat::Mslprof)
}

/// Map a profile file read-only.
fn map_file(p: &Path) -> Result<memmap2::Mmap, Failure> {
    mslprof_analyzer::sys::map_file(p).map_err(|e| Failure {
        file: p.display().to_string(),
        problem: e.to_string(),
    })
}

/// Read the profiles and run the right analysis.
pub fn analyse(
    opts: &Options,
    exe: Option<&Path>,
    profiles: &[PathBuf],
    out: &mut Out,
) -> Result<report::Outcome, Failure> {
    let mut maps = Vec::new();
    for p in profiles {
        maps.push((p.clone(), map_file(p)?));
    }
    let any_mslprof = maps.iter().any(|(_, b)| is_mslprof(b));
    let exe_for_gnu = exe.unwrap_or(Path::new("a.out"));
    let target = if any_mslprof {
        GnuTarget::default()
    } else {
        commands::elf_target(exe_for_gnu).unwrap_or_default()
    };
    let file_info = opts.file_info;
    let file_format = opts.file_format;
    if any_mslprof && file_format != InputFormat::Auto {
        return Err(Failure {
            file: profiles
                .first()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            problem: "--file-format applies to GNU/BSD gmon.out, not to mslprof profiles".into(),
        });
    }
    let read_all = move || -> Result<Vec<Input>, Failure> {
        let mut inputs = Vec::new();
        for (p, b) in maps {
            if any_mslprof && !is_mslprof(&b) {
                return Err(Failure {
                    file: p.display().to_string(),
                    problem: "not an mslprof profile (GNU and mslprof profiles cannot be mixed)"
                        .into(),
                });
            }
            // gprof's `-i` counts the records as the file holds them (before same-range records are summed).
            let records = if file_info {
                mslprof_format::record_counts_as(&b, target, file_format).map_err(|e| Failure {
                    file: p.display().to_string(),
                    problem: e.to_string(),
                })?
            } else {
                None
            };
            let mut release = |upto: usize| mslprof_analyzer::sys::release_prefix(&b, upto);
            let profile =
                mslprof_format::read_as(&b, target, file_format, &mut release).map_err(|e| {
                    Failure {
                        file: p.display().to_string(),
                        problem: e.to_string(),
                    }
                })?;
            drop(b);
            inputs.push(Input {
                path: p,
                profile,
                records,
            });
        }
        Ok(inputs)
    };
    if any_mslprof {
        let inputs = read_all()?;
        report::run_mslprof(opts, exe, &inputs, out)
    } else {
        report::run_gnu(opts, exe_for_gnu, read_all, out)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => commands::run(&args[1..]),
        Some("demo") => commands::demo(&args[1..]),
        Some("export") => commands::export(&args[1..]),
        _ => report_main(&args),
    }
}
