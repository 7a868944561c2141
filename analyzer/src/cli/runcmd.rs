//! `mslprof run`: run a program (and whatever it starts) under libmslprof.so, sum the profiles of the
//! whole process tree, and report on stderr (or into `--report FILE`), never on the program's stdout.
//!
//! Every process of the run writes into a private, freshly made folder (`GPROFDIR`): each file there was
//! written by the runtime in this run, so success is judged by the files the runtime wrote, not by
//! timestamps. One file is moved to the output (`-o`, default `gmon.out`); several are summed into it and
//! kept in `<output>.parts/`. The program's stdin, stdout, stderr and exit status are its own (a program
//! killed by a signal gives 128 + the signal's number, as a shell does).

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

const USAGE: &str = "usage: mslprof run [--profile LIST] [--bucket-size 16|32] [--hz N] [--stack-depth N] \
[-o FILE] [--plt|--no-plt] [--report FILE] [--no-report] [report options] [--] PROGRAM [ARGS...]";

/// What `mslprof run` was asked to do.
#[derive(Default)]
struct RunArgs {
    profile: Option<String>,
    bucket_size: Option<String>,
    hz: Option<String>,
    stack_depth: Option<String>,
    output: Option<PathBuf>,
    report: Option<PathBuf>,
    no_report: bool,
    /// `--plt` / `--no-plt`; `None` follows `MSLPROF_PLT`.
    plt: Option<bool>,
    report_opts: Vec<String>,
    command: Vec<String>,
}

fn parse(args: &[String]) -> Result<RunArgs, String> {
    let mut r = RunArgs::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "--" {
            r.command = args[i..].to_vec();
            break;
        }
        if !a.starts_with('-') || a == "-" {
            r.command = args[i - 1..].to_vec();
            break;
        }
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = |what: &str| -> Result<String, String> {
            if let Some(v) = &inline {
                return Ok(v.clone());
            }
            let v = args
                .get(i)
                .cloned()
                .ok_or_else(|| format!("{what} needs a value"))?;
            i += 1;
            Ok(v)
        };
        match name {
            "--profile" => r.profile = Some(value("--profile")?),
            "--bucket-size" => {
                let v = value("--bucket-size")?;
                if v != "16" && v != "32" {
                    return Err(format!("--bucket-size {v}: must be 16 or 32"));
                }
                r.bucket_size = Some(v);
            }
            "--hz" => {
                let v = value("--hz")?;
                if v.parse::<u32>().map_or(true, |n| n == 0) {
                    return Err(format!("--hz {v}: must be a positive whole number"));
                }
                r.hz = Some(v);
            }
            "--stack-depth" => {
                let v = value("--stack-depth")?;
                if v.parse::<u32>().map_or(true, |n| n > 4096) {
                    return Err(format!(
                        "--stack-depth {v}: must be a whole number from 0 to 4096"
                    ));
                }
                r.stack_depth = Some(v);
            }
            "-o" | "--output" => r.output = Some(PathBuf::from(value("-o")?)),
            "--report" => r.report = Some(PathBuf::from(value("--report")?)),
            "--no-report" => r.no_report = true,
            "--plt" => r.plt = Some(true),
            "--no-plt" => r.plt = Some(false),
            _ => {
                let len = crate::report_cli::option_len(&args[i - 1..]);
                r.report_opts.extend_from_slice(&args[i - 1..i - 1 + len]);
                i += len - 1;
            }
        }
    }
    if r.command.is_empty() {
        return Err(USAGE.into());
    }
    Ok(r)
}

/// Checks that the runtime `lib` is a shared object before the program runs: ld.so would only warn that it
/// cannot preload it and run the program unprofiled.
fn loadable_library(lib: &Path) -> Result<(), String> {
    use object::Object;
    // Mapped, not read: parsing the headers touches a page or two of the library, not its megabytes.
    let data =
        mslprof_analyzer::sys::map_file(lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    match object::File::parse(&*data) {
        Ok(f) if f.kind() == object::ObjectKind::Dynamic => Ok(()),
        _ => Err(format!(
            "{}: not a loadable shared library, so the runtime cannot be preloaded (check MSLPROF_LIBRARY)",
            lib.display()
        )),
    }
}

/// The file `program` names as `Command` runs it: a path when it has a `/`, else the first executable file
/// of that name in a `PATH` folder.
fn program_file(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether `path` is an ELF executable that no library can be preloaded into: statically linked, with no
/// program interpreter and no dynamic section that needs a library or names one (static-pie has one, ld.so
/// run as a program names itself). Anything else (a script, a dynamic program, an unreadable file) is
/// left to the run.
fn statically_linked(path: &Path) -> bool {
    use object::elf::{DT_NEEDED, DT_SONAME, FileHeader64, PT_INTERP};
    use object::read::elf::{Dyn, FileHeader, ProgramHeader};
    let Ok(data) = mslprof_analyzer::sys::map_file(path) else {
        return false;
    };
    let data = &*data;
    let Ok(header) = FileHeader64::<object::Endianness>::parse(data) else {
        return false;
    };
    let Ok(endian) = header.endian() else {
        return false;
    };
    let Ok(segments) = header.program_headers(endian, data) else {
        return false;
    };
    if header.e_type(endian) != object::elf::ET_EXEC && header.e_type(endian) != object::elf::ET_DYN
    {
        return false;
    }
    let linked_dynamically = segments.iter().any(|segment| {
        segment.p_type(endian) == PT_INTERP
            || segment
                .dynamic(endian, data)
                .ok()
                .flatten()
                .is_some_and(|entries| {
                    entries
                        .iter()
                        .any(|e| matches!(e.d_tag(endian) as u32, DT_NEEDED | DT_SONAME))
                })
    });
    !linked_dynamically
}

/// The name of signal `signal` (`SIGSEGV`), or its number where Linux gives it no name.
fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match usize::try_from(signal - 1).ok().and_then(|i| NAMES.get(i)) {
        Some(name) => (*name).to_string(),
        None => format!("signal {signal}"),
    }
}

/// How the program ended, for a message: `exited with status 3`, `was killed by SIGSEGV`.
fn how_it_ended(status: std::process::ExitStatus) -> String {
    match status.signal() {
        Some(signal) => format!(
            "was killed by {}{}",
            signal_name(signal),
            if status.core_dumped() {
                " (core dumped)"
            } else {
                ""
            }
        ),
        None => format!("exited with status {}", status_code(status)),
    }
}

/// The program's exit status as a shell gives it.
fn status_code(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => (c & 0xff) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => 1,
    }
}

/// Runs this binary again (for `--sum` and the report) with stdout going to `stdout`; with `quiet`, its
/// stderr is shown only when it fails.
fn self_run(args: &[OsString], stdout: Stdio, cwd: &Path, quiet: bool) -> Result<bool, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    let mut cmd = Command::new(me);
    cmd.args(args).current_dir(cwd).stdout(stdout);
    if quiet {
        let out = cmd
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot run own binary: {e}"))?;
        if !out.status.success() {
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
        }
        return Ok(out.status.success());
    }
    cmd.status()
        .map(|s| s.success())
        .map_err(|e| format!("cannot run own binary: {e}"))
}

/// `mslprof run ...`.
const RUN_USAGE: &str = "\
Usage: mslprof run [--profile LIST] [--bucket-size 16|32] [--hz N] [--stack-depth N] [-o FILE]
                   [--plt|--no-plt] [--report FILE] [--no-report] [REPORT OPTIONS] [--] PROGRAM [ARGS...]

Runs PROGRAM under libmslprof.so (and PLT call counting unless --no-plt or MSLPROF_PLT=0), sums the profiles of every
process of the run into FILE (default gmon.out; the parts are kept in FILE.parts/ when there are several),
and prints the report on stderr (or into --report FILE; none with --no-report). The program's stdin, stdout
and stderr are its own, and the exit status is the program's.

  --profile LIST       modules to profile (MSLPROF_PROFILE; LD_PROFILE's syntax)
  --bucket-size 16|32  histogram bucket width (LD_PROFILEBUCKET_SIZE)
  --hz N               samples per CPU-second (MSLPROF_HZ, 1 to 10000, default 100; the kernel's tick caps it where perf events are refused)
  --stack-depth N      call-stack frames recorded per sample (MSLPROF_STACK_DEPTH, default 128); 0: no stacks,
                       and samples above 200 per second cost about half as much
  -o FILE              where the (summed) profile goes
  --plt, --no-plt      count calls through the PLT into code built without -pg, or not (default: MSLPROF_PLT)
  --report FILE        write the report to FILE instead of stderr
  --no-report          print no report
REPORT OPTIONS are mslprof's (see mslprof --help).";

pub fn run(args: &[String]) -> ExitCode {
    if let Some(code) = crate::commands::usage_requested(args, RUN_USAGE) {
        return code;
    }
    // Every option is checked before the program runs (the report's too).
    let r = match parse(args) {
        Ok(r) => r,
        Err(msg) => {
            eprintln!("mslprof: run: {msg}");
            return ExitCode::from(1);
        }
    };
    if let Err(code) = crate::report_cli::check_report_options(&r.report_opts, "mslprof: run: ") {
        return code;
    }
    match run_inner(r) {
        Ok(code) => ExitCode::from(code),
        Err((msg, code)) => {
            eprintln!("mslprof: run: {msg}");
            ExitCode::from(code)
        }
    }
}

fn run_inner(r: RunArgs) -> Result<u8, (String, u8)> {
    let fail = |m: String| (m, 1u8);
    let lib = crate::commands::runtime_library().map_err(fail)?;
    loadable_library(&lib).map_err(fail)?;
    let output = r
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from("gmon.out"));
    let out_dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !out_dir.is_dir() {
        return Err(fail(format!("{}: no such folder", out_dir.display())));
    }
    if let Some(report) = &r.report
        && let Some(folder) = report.parent().filter(|p| !p.as_os_str().is_empty())
        && !folder.is_dir()
    {
        return Err(fail(format!(
            "--report {}: no such folder {}",
            report.display(),
            folder.display()
        )));
    }
    let parts = tempfile::Builder::new()
        .prefix(".mslprof-run-")
        .tempdir_in(&out_dir)
        .map_err(|e| fail(format!("{}: {e}", out_dir.display())))?;
    let program = &r.command[0];
    if let Some(file) = program_file(program)
        && statically_linked(&file)
    {
        return Err(fail(format!(
            "{program}: statically linked, so libmslprof.so cannot be loaded into it; nothing was run \
             (link it dynamically; a -pg program run on its own writes glibc's gmon.out, which mslprof reads)"
        )));
    }
    let mut cmd = Command::new(program);
    cmd.args(&r.command[1..]);
    let plt = r.plt.unwrap_or_else(crate::commands::plt_by_default);
    crate::commands::profiling_environment(&mut cmd, &lib, plt);
    // Set only where it changes what the program inherits (on is the default): one variable fewer in its
    // environment.
    if plt != crate::commands::plt_by_default() {
        cmd.env("MSLPROF_PLT", if plt { "1" } else { "0" });
    }
    cmd.env("GPROFDIR", parts.path())
        .env_remove("GMON_OUT_PREFIX")
        .env_remove("MSLPROF_ROOT_PID");
    if let Some(p) = &r.profile {
        // The runtime's warnings name the option; its constructor hides the variable from the program.
        cmd.env("MSLPROF_PROFILE", p)
            .env("MSLPROF_PROFILE_OPTION", "--profile");
    } else {
        cmd.env_remove("MSLPROF_PROFILE_OPTION");
    }
    if let Some(b) = &r.bucket_size {
        cmd.env("LD_PROFILEBUCKET_SIZE", b);
    }
    if let Some(h) = &r.hz {
        cmd.env("MSLPROF_HZ", h);
    }
    if let Some(d) = &r.stack_depth {
        cmd.env("MSLPROF_STACK_DEPTH", d);
    }
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Err((format!("{program}: {e}"), code));
        }
    };
    let code = status_code(status);
    if code != 0 {
        eprintln!("mslprof: {program} {}", how_it_ended(status));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(parts.path())
        .map_err(|e| fail(format!("{}: {e}", parts.path().display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let no_profile = |m: String| (m, if code == 0 { 1 } else { code });
    if files.is_empty() {
        let why = if status.signal() == Some(libc::SIGKILL) {
            "SIGKILL ends a process before it can write one".to_string()
        } else {
            format!("was {} loaded?", lib.display())
        };
        let stale = if output.exists() {
            format!(
                "; {} is left from an earlier run, not this one",
                output.display()
            )
        } else {
            String::new()
        };
        return Err(no_profile(format!(
            "{program} wrote no profile ({why}){stale}"
        )));
    }
    let mut kept = output.clone().into_os_string();
    kept.push(".parts");
    let kept = PathBuf::from(kept);
    // The parts of an earlier run would not belong to this profile.
    let _ = std::fs::remove_dir_all(&kept);
    if files.len() == 1 {
        std::fs::rename(&files[0], &output)
            .map_err(|e| no_profile(format!("{}: {e}", output.display())))?;
        eprintln!("mslprof: profile written to {}", output.display());
    } else {
        let mut sum_args: Vec<OsString> = vec!["--sum".into()];
        sum_args.extend(files.iter().map(|f| f.clone().into_os_string()));
        if !self_run(&sum_args, Stdio::null(), parts.path(), true).map_err(no_profile)? {
            return Err(no_profile(format!(
                "the {} profiles in {} could not be summed",
                files.len(),
                parts.path().display()
            )));
        }
        std::fs::rename(parts.path().join("gmon.sum"), &output)
            .map_err(|e| no_profile(format!("{}: {e}", output.display())))?;
        let dir = parts.keep();
        std::fs::rename(&dir, &kept).map_err(|e| no_profile(format!("{}: {e}", kept.display())))?;
        eprintln!(
            "mslprof: {} processes wrote profiles (kept in {}); their sum is {}",
            files.len(),
            kept.display(),
            output.display()
        );
    }
    if !r.no_report {
        let sink = match &r.report {
            Some(f) => std::fs::File::create(f)
                .map(Stdio::from)
                .map_err(|e| no_profile(format!("{}: {e}", f.display())))?,
            None => std::io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .map(Stdio::from)
                .map_err(|e| no_profile(format!("stderr: {e}")))?,
        };
        let mut report_args: Vec<OsString> = r.report_opts.iter().map(OsString::from).collect();
        report_args.push(output.clone().into_os_string());
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        if !self_run(&report_args, sink, &cwd, false).map_err(no_profile)? && code == 0 {
            return Ok(1);
        }
    }
    Ok(code)
}
