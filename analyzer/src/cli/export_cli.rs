//! The command line of `mslprof export --format FMT [-o PATH] [PROFILE...]`, and the older spelling
//! `mslprof export PROFILE [OUTDIR]` (per-module GNU gmon.out files).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use clap::{Parser, ValueEnum};

use mslprof_analyzer::export::{self, Prepared};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Callgrind,
    Json,
    Dot,
    Svg,
    Png,
    Pprof,
    Gmon,
    Folded,
    Flamegraph,
}

/// `mslprof export`'s options.
#[derive(Parser, Debug)]
#[command(
    name = "mslprof export",
    about = "Write mslprof profiles in other tools' formats",
    after_help = "Defaults for -o: callgrind.out.PID (callgrind), profile.pb.gz (pprof), callgraph.svg / callgraph.png, \
flamegraph.svg (flamegraph), the current folder (gmon), standard output (json, dot, folded).\n\
Profiles with sampled call stacks: pprof writes the stacks, callgrind and json the measured inclusive times; \
folded and flamegraph need them.\n\
The older spelling `mslprof export PROFILE [OUTDIR]` (no --format) writes the per-module GNU files."
)]
struct ExportCli {
    /// Output format: callgrind, json, dot, svg, png (svg/png run Graphviz's dot), pprof, gmon, folded
    /// (`root;...;leaf COUNT` per distinct stack) or flamegraph (an SVG of the stacks).
    #[arg(long, value_enum)]
    format: Format,
    /// Where to write (a folder for gmon; `-` for standard output with every format but gmon and png).
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// dot/svg/png: leave out functions whose total share is under this percentage.
    #[arg(long = "node-threshold", default_value_t = 0.5)]
    node_threshold: f64,
    /// dot/svg/png: leave out calls whose share of the time is under this percentage.
    #[arg(long = "edge-threshold", default_value_t = 0.1)]
    edge_threshold: f64,
    /// dot/svg/png: draw at most this many functions (those with the largest total shares).
    #[arg(long = "max-nodes", default_value_t = 60)]
    max_nodes: usize,
    /// gmon: also write files for the profiler's own modules (libmslprof.so, its audit module).
    #[arg(long = "profiler-modules")]
    profiler_modules: bool,
    /// mslprof profiles, summed as the report sums them (default ./gmon.out).
    profiles: Vec<PathBuf>,
}

/// `mslprof export ...`.
pub fn export(args: &[String]) -> ExitCode {
    let legacy = !args.is_empty()
        && !args
            .iter()
            .any(|a| a.starts_with("--format") || a == "-h" || a == "--help");
    let result = if legacy {
        let input = PathBuf::from(&args[0]);
        let outdir = PathBuf::from(args.get(1).map(String::as_str).unwrap_or("."));
        if args.len() > 2 {
            Err("export: usage: mslprof export --format FMT [-o PATH] [PROFILE...]".to_string())
        } else {
            gmon(&[input], &outdir, false)
        }
    } else {
        let cli: ExportCli = match crate::arguments::parse(
            "mslprof export",
            args.iter().cloned(),
            "mslprof: export: ",
        ) {
            Ok(c) => c,
            Err(code) => return code,
        };
        run(&cli)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mslprof: {e}");
            ExitCode::from(1)
        }
    }
}

fn load(profiles: &[PathBuf]) -> Result<Prepared, String> {
    let p = Prepared::load(profiles).map_err(|e| e.to_string())?;
    for w in &p.warnings {
        eprintln!("mslprof: warning: {w}");
    }
    Ok(p)
}

fn gmon(profiles: &[PathBuf], outdir: &Path, profiler_modules: bool) -> Result<(), String> {
    let p = load(profiles)?;
    let written = export::gmon::write(&p, outdir, profiler_modules).map_err(|e| e.to_string())?;
    let mut files = 0;
    for w in &written {
        match w {
            export::gmon::Written::File(module, file) => {
                println!("gprof {module} {}", file.display());
                files += 1;
            }
            export::gmon::Written::Unreadable(module, why) => {
                eprintln!(
                    "mslprof: note: {module}: no gmon file written: {why}; mslprof's report covers it"
                );
            }
        }
    }
    if files == 0 {
        return Err(format!(
            "{}: no profiled module with a histogram that gprof can read",
            profiles[0].display()
        ));
    }
    Ok(())
}

fn run(cli: &ExportCli) -> Result<(), String> {
    let profiles = if cli.profiles.is_empty() {
        vec![PathBuf::from("gmon.out")]
    } else {
        cli.profiles.clone()
    };
    if matches!(cli.format, Format::Gmon | Format::Png)
        && cli.output.as_deref() == Some(Path::new("-"))
    {
        return Err(format!(
            "export: --format {} cannot be written to standard output ({}); give -o a {}",
            if cli.format == Format::Gmon {
                "gmon"
            } else {
                "png"
            },
            if cli.format == Format::Gmon {
                "it is one file per module"
            } else {
                "it is binary image data"
            },
            if cli.format == Format::Gmon {
                "folder"
            } else {
                "file name"
            }
        ));
    }
    if cli.format == Format::Gmon {
        return gmon(
            &profiles,
            cli.output.as_deref().unwrap_or(Path::new(".")),
            cli.profiler_modules,
        );
    }
    if matches!(cli.format, Format::Svg | Format::Png) && !have_dot() {
        return Err(
            "export: `dot` (Graphviz) is not installed; install graphviz (e.g. `apt-get install graphviz`), \
             or write --format dot and render it elsewhere"
                .into(),
        );
    }
    let p = load(&profiles)?;
    if matches!(cli.format, Format::Folded | Format::Flamegraph) && p.stacks().is_none() {
        let names: Vec<String> = profiles.iter().map(|f| f.display().to_string()).collect();
        return Err(format!(
            "{}: no sampled call stacks (no STACKS section), which --format {} draws; \
             profile with a runtime that records them",
            names.join(", "),
            if cli.format == Format::Folded {
                "folded"
            } else {
                "flamegraph"
            }
        ));
    }
    let thresholds = export::dot::Thresholds {
        node: cli.node_threshold,
        edge: cli.edge_threshold,
        max_nodes: cli.max_nodes,
    };
    let mut bytes = Vec::new();
    let written = match cli.format {
        Format::Callgrind => export::callgrind::write(&p, &mut bytes),
        Format::Json => export::json::write(&p, &mut bytes),
        Format::Dot | Format::Svg | Format::Png => export::dot::write(&p, thresholds, &mut bytes),
        Format::Pprof => export::pprof::write(&p, &mut bytes),
        Format::Folded => export::folded::write(&p, &mut bytes),
        Format::Flamegraph => export::flamegraph::write(&p, &mut bytes),
        Format::Gmon => Ok(()),
    };
    written.map_err(|e| format!("export: {e}"))?;
    let default = match cli.format {
        Format::Callgrind => Some(format!("callgrind.out.{}", p.profile.header.pid)),
        Format::Pprof => Some("profile.pb.gz".into()),
        Format::Svg => Some("callgraph.svg".into()),
        Format::Png => Some("callgraph.png".into()),
        Format::Flamegraph => Some("flamegraph.svg".into()),
        _ => None,
    };
    let target = cli.output.clone().or(default.map(PathBuf::from));
    match cli.format {
        Format::Svg | Format::Png => {
            let out = target.unwrap_or_default();
            render(&bytes, cli.format, &out)?;
            if out != Path::new("-") {
                eprintln!("mslprof: wrote {}", out.display());
            }
        }
        _ => match target {
            Some(out) if out != Path::new("-") => {
                std::fs::write(&out, &bytes).map_err(|e| format!("{}: {e}", out.display()))?;
                eprintln!("mslprof: wrote {}", out.display());
            }
            _ => {
                let mut stdout = std::io::stdout().lock();
                match stdout.write_all(&bytes).and_then(|()| stdout.flush()) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                    Err(e) => return Err(format!("stdout: {e}")),
                }
            }
        },
    }
    Ok(())
}

fn have_dot() -> bool {
    Command::new("dot")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Render DOT text to `out` with Graphviz's `dot`.
fn render(dot: &[u8], format: Format, out: &Path) -> Result<(), String> {
    let kind = if format == Format::Png {
        "-Tpng"
    } else {
        "-Tsvg"
    };
    let mut dot_command = Command::new("dot");
    dot_command.arg(kind);
    // `-o -` (svg): dot writes to our standard output.
    if out != Path::new("-") {
        dot_command.arg("-o").arg(out);
    }
    let mut child = dot_command
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("export: dot: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(dot)
            .map_err(|e| format!("export: dot: {e}"))?;
    }
    let done = child
        .wait_with_output()
        .map_err(|e| format!("export: dot: {e}"))?;
    if !done.status.success() {
        return Err(format!(
            "export: dot {kind} failed: {}",
            String::from_utf8_lossy(&done.stderr).trim()
        ));
    }
    Ok(())
}
