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
mod embedded;
mod runcmd;

/// gprof's options, spelled long (short gprof letters are translated to these first).
#[derive(Parser, Debug)]
#[command(
    name = "mslprof",
    version,
    args_override_self = true,
    about = "gprof-compatible reports over multi-module profiles",
    after_help = "Short options are GNU gprof's: -a -b -D -i -L -s -T -v -z, -p/-P/-q/-Q[symspec] (argument attached), \
-e/-E/-f/-F name, -O format, -k from/to, -m num, -n/-N symspec, -w width, -S file.\n\
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
    /// Accepted for gprof compatibility; they only concern annotated source, which mslprof does not print.
    #[arg(long = "all-lines")]
    all_lines: bool,
    #[arg(long = "separate-files")]
    separate_files: bool,
    #[arg(long, hide = true)]
    unsupported: Option<String>,
    /// Show each load instance of a library separately instead of merging them.
    #[arg(long = "separate-instances")]
    separate_instances: bool,
    /// Also read the profiles the process's descendants left beside the profile (gmon.out.PID) and sum them.
    #[arg(long)]
    family: bool,
    /// Leave out the row of the profiler's own time (libmslprof.so, shown as overhead).
    #[arg(long = "no-overhead")]
    no_overhead: bool,
    /// What 100 % is: the samples in the selected modules (default) or all samples of the process.
    #[arg(long = "share-of", value_parser = ["selected", "process"])]
    share_of: Option<String>,
    /// List every module in the module tables, also those under 0.05 % of the samples.
    #[arg(long = "all-modules")]
    all_modules: bool,
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
                'e' | 'E' | 'f' | 'F' | 'k' | 'm' | 'n' | 'N' | 'w' | 'S' | 'O' => {
                    let long = match c {
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
                'A' | 'C' | 'J' | 'Z' | 'l' | 'c' | 'I' | 't' | 'r' | 'R' | 'd' => {
                    let what = match c {
                        'A' => "annotated source (-A)",
                        'C' | 'Z' => "execution counts (-C/-Z)",
                        'J' => "annotated source (-J)",
                        'l' => "line-by-line profiling (-l)",
                        'c' => "the static call graph (-c)",
                        'I' | 't' => "annotated source options (-I/-t)",
                        'r' | 'R' => "function/file ordering (-r/-R)",
                        _ => "debugging output (-d)",
                    };
                    out.push(format!("--unsupported={what}"));
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
        hide_overhead: cli.no_overhead,
        share_of_process: cli.share_of.as_deref() == Some("process"),
        all_modules: cli.all_modules,
        ..Options::default()
    };
    let _ = cli.min_count;
    if let Some(what) = &cli.unsupported {
        return Err(format!("{what} is not supported by mslprof"));
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
    if opts.file_format == InputFormat::Auto {
        for (p, b) in &maps {
            mslprof_analyzer::inputcheck::check_profile(p, b)?;
        }
    }
    if any_mslprof && let Some(e) = exe {
        mslprof_analyzer::inputcheck::check_executable(e)?;
    }
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
        Some("run") => runcmd::run(&args[1..]),
        Some("demo") => commands::demo(&args[1..]),
        Some("export") => commands::export(&args[1..]),
        _ => report_main(&args),
    }
}
