//! The subcommands `run` (a program under libmslprof.so, then its report) and `demo` (build and profile
//! the bundled three-module demo); `export` is in `export_cli`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const DEMO_MAIN: &str = include_str!("../../demo/demo.c");
const DEMO_SHAPES: &str = include_str!("../../demo/shapes.c");
const DEMO_TEXT: &str = include_str!("../../demo/text.c");

/// `libmslprof.so`: `$MSLPROF_LIBRARY`, else next to this binary (or in its `deps/` or `../lib/`), else the
/// copy embedded in a release build, written to a private folder.
pub fn runtime_library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MSLPROF_LIBRARY") {
        let p = PathBuf::from(p);
        return if p.exists() {
            Ok(p)
        } else {
            Err(format!("{}: MSLPROF_LIBRARY names no file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for cand in [
        dir.join("libmslprof.so"),
        dir.join("deps/libmslprof.so"),
        dir.join("../lib/libmslprof.so"),
        dir.join("../lib/mslprof/libmslprof.so"),
    ] {
        if cand.exists() {
            return Ok(cand);
        }
    }
    if let Some(written) = crate::embedded::runtime_file() {
        return written;
    }
    Err(format!(
        "libmslprof.so not found next to {} (build the workspace, or set MSLPROF_LIBRARY)",
        exe.display()
    ))
}

/// `LD_PRELOAD` with `lib` first, then whatever the environment preloads already.
pub(crate) fn preload_value(lib: &Path) -> OsString {
    let mut v = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD")
        && !old.is_empty()
    {
        v.push(":");
        v.push(old);
    }
    v
}

/// Sets up `cmd` to run under the runtime `lib`: `LD_PRELOAD`, `LD_PROFILE` moved aside from glibc's ld.so,
/// and, with `plt`, the PLT-counting audit module next to the runtime in `LD_AUDIT`. Shared by `mslprof run`
/// and `mslprof demo`.
pub(crate) fn profiling_environment(cmd: &mut Command, lib: &Path, plt: bool) {
    cmd.env("LD_PRELOAD", preload_value(lib));
    // glibc's ld.so must not see LD_PROFILE (its own profiler); under this name the runtime's constructor
    // gives the variable back to the program before main, so the program sees the same environment and the
    // runtime needs no restart (runtime/README.md).
    if let Some(value) = std::env::var_os("LD_PROFILE").filter(|v| !v.is_empty()) {
        cmd.env_remove("LD_PROFILE")
            .env("MSLPROF_LD_PROFILE", value);
    }
    // Calls through the PLT into code built without -pg are counted by the audit module next to the runtime
    // (runtime/README.md, "Calls through the PLT"); without `plt` LD_AUDIT is left as it is.
    let audit = lib.with_file_name("libmslprof_audit.so");
    if plt && audit.exists() {
        let mut value = OsString::from(audit.as_os_str());
        if let Some(old) = std::env::var_os("LD_AUDIT").filter(|v| !v.is_empty()) {
            value.push(":");
            value.push(old);
        }
        cmd.env("LD_AUDIT", value);
        // Under any LD_AUDIT module glibc reserves little surplus static TLS (BZ #31991): programs whose
        // libraries use much initial-exec TLS (rustc, jemalloc) would fail to start. Make room, unless the
        // user chose a size.
        let tunables = std::env::var_os("GLIBC_TUNABLES").unwrap_or_default();
        if !tunables
            .to_string_lossy()
            .contains("glibc.rtld.optional_static_tls")
        {
            let mut value = tunables;
            if !value.is_empty() {
                value.push(":");
            }
            value.push(STATIC_TLS_TUNABLE);
            cmd.env("GLIBC_TUNABLES", value);
        }
    }
}

/// The surplus static TLS that `mslprof run` asks glibc for when it loads the audit module: enough for
/// librustc_driver's 23 KiB of initial-exec TLS, with room to spare.
const STATIC_TLS_TUNABLE: &str = "glibc.rtld.optional_static_tls=65536";

/// Whether PLT calls are counted unless asked otherwise: yes, except with `MSLPROF_PLT=0`.
pub(crate) fn plt_by_default() -> bool {
    std::env::var_os("MSLPROF_PLT").is_none_or(|v| v != "0")
}

/// Run `program args` under the runtime in `cwd`, a folder made fresh for this run; returns the profile
/// written and the exit status. The output-naming variables are cleared, so the runtime writes `gmon.out`
/// there, and any `gmon.out` in the fresh folder is this run's: no timestamps are compared (`mslprof run`
/// uses a private folder the same way).
fn run_profiled(
    cwd: &Path,
    program: &Path,
    args: &[String],
    quiet: bool,
    defaults: &[(&str, &str)],
) -> Result<(PathBuf, i32), String> {
    let lib = runtime_library()?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("GPROFDIR")
        .env_remove("GMON_OUT_PREFIX")
        .env_remove("MSLPROF_ROOT_PID");
    // Variables the program gets unless the environment sets them.
    for &(name, value) in defaults {
        if std::env::var_os(name).is_none() {
            cmd.env(name, value);
        }
    }
    profiling_environment(&mut cmd, &lib, plt_by_default());
    if quiet {
        cmd.stdout(std::process::Stdio::null());
    }
    let status = cmd
        .status()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    let code = status.code().unwrap_or(1);
    let path = cwd.join("gmon.out");
    if !path.is_file() {
        return Err(format!(
            "{}: the program wrote no profile (did it start, and did {} load?)",
            path.display(),
            lib.display()
        ));
    }
    Ok((path, code))
}

/// The demo's sampling rate (`MSLPROF_HZ`) when the environment sets none.
const DEMO_HZ: &str = "1000";

const DEMO_USAGE: &str = "\
Usage: mslprof demo [REPORT OPTIONS]

Builds the bundled demo (a program and two -pg shared libraries, with cc) in a temporary folder, runs it
under libmslprof.so at 1000 samples per CPU-second (MSLPROF_HZ, if set, instead) and prints its
multi-module report (with -b unless REPORT OPTIONS are given; see mslprof --help).";

/// Prints `usage` and returns success when the subcommand's arguments ask for help (`-h` or `--help` before
/// any other argument).
pub(crate) fn usage_requested(args: &[String], usage: &str) -> Option<ExitCode> {
    match args.first().map(String::as_str) {
        Some("-h" | "--help") => {
            println!("{usage}");
            Some(ExitCode::SUCCESS)
        }
        _ => None,
    }
}

fn compile(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new("cc")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cc: {e} (a C compiler is needed for the demo)"))?;
    if !out.status.success() {
        return Err(format!(
            "cc {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("failed")
        ));
    }
    Ok(())
}

/// `mslprof demo [report options]`: build the demo program and its two -pg libraries, run it under the
/// runtime, print the multi-module report.
pub fn demo(args: &[String]) -> ExitCode {
    if let Some(code) = usage_requested(args, DEMO_USAGE) {
        return code;
    }
    match demo_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mslprof: demo: {e}");
            ExitCode::from(1)
        }
    }
}

fn demo_inner(args: &[String]) -> Result<ExitCode, String> {
    let dir = tempfile::Builder::new()
        .prefix("mslprof-demo-")
        .tempdir()
        .map_err(|e| format!("temporary directory: {e}"))?;
    let d = dir.path();
    for (name, text) in [
        ("demo.c", DEMO_MAIN),
        ("shapes.c", DEMO_SHAPES),
        ("text.c", DEMO_TEXT),
    ] {
        std::fs::write(d.join(name), text).map_err(|e| format!("{name}: {e}"))?;
    }
    for (library, source, libs) in [
        ("libshapes.so", "shapes.c", &["-lm"][..]),
        ("libtext.so", "text.c", &[]),
    ] {
        let mut args = vec!["-pg", "-O1", "-fPIC", "-shared", "-o", library, source];
        args.extend_from_slice(libs);
        compile(d, &args)?;
    }
    compile(
        d,
        &[
            "-pg",
            "-O1",
            "-o",
            "demo",
            "demo.c",
            "-L.",
            "-lshapes",
            "-ltext",
            "-Wl,-rpath,$ORIGIN",
        ],
    )?;
    // A 0.4 s run at the default 100 Hz has about 40 samples: too few to show every module's share (the
    // runtime's own, a few percent, is sometimes missed). The demo samples at DEMO_HZ unless told otherwise.
    let (profile, code) = run_profiled(d, &d.join("demo"), &[], true, &[("MSLPROF_HZ", DEMO_HZ)])?;
    if code != 0 {
        return Err(format!("the demo program exited with status {code}"));
    }
    println!(
        "mslprof demo: a program and two -pg shared libraries (libshapes.so, libtext.so) built in {},\n\
         run under {}; the report follows.\n",
        d.display(),
        runtime_library()?.display()
    );
    let mut report_args: Vec<String> = if args.is_empty() {
        vec!["-b".into()]
    } else {
        args.to_vec()
    };
    report_args.push(d.join("demo").display().to_string());
    report_args.push(profile.display().to_string());
    Ok(crate::report_cli::report_main(&report_args))
}
