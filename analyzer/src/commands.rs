//! The subcommands: `run` (a program under libmslprof.so, then its report), `demo` (build and profile
//! the bundled three-module demo) and `export` (per-module GNU gmon.out files for GNU gprof).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::SystemTime;

use mslprof_format::GnuTarget;

const DEMO_MAIN: &str = include_str!("../demo/demo.c");
const DEMO_SHAPES: &str = include_str!("../demo/shapes.c");
const DEMO_TEXT: &str = include_str!("../demo/text.c");

/// Byte order and address width of an ELF file (for GNU gmon.out decoding).
pub fn elf_target(path: &Path) -> Option<GnuTarget> {
    use std::io::Read;
    let mut ident = [0u8; 16];
    std::fs::File::open(path)
        .ok()?
        .read_exact(&mut ident)
        .ok()?;
    if &ident[..4] != b"\x7fELF" {
        return None;
    }
    Some(GnuTarget {
        big_endian: ident[5] == 2,
        address_size: if ident[4] == 1 { 4 } else { 8 },
    })
}

/// `libmslprof.so`: `$MSLPROF_LIBRARY`, else next to this binary (or in its `deps/` or `../lib/`).
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
    Err(format!(
        "libmslprof.so not found next to {} (build the workspace, or set MSLPROF_LIBRARY)",
        exe.display()
    ))
}

fn preload_value(lib: &Path) -> OsString {
    let mut v = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD")
        && !old.is_empty()
    {
        v.push(":");
        v.push(old);
    }
    v
}

/// Where the runtime writes the profile of process `pid` started in `cwd`.
fn profile_path(cwd: &Path, pid: u32, program: &str) -> PathBuf {
    match std::env::var_os("GPROFDIR") {
        Some(d) if !d.is_empty() => {
            let name = Path::new(program)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            PathBuf::from(d).join(format!("{pid}.{name}"))
        }
        _ => match std::env::var_os("GMON_OUT_PREFIX") {
            Some(p) if !p.is_empty() => {
                let mut s = p;
                s.push(format!(".{pid}"));
                cwd.join(s)
            }
            _ => cwd.join("gmon.out"),
        },
    }
}

/// Run `program args` under the runtime in `cwd`; returns the profile written and the exit status.
fn run_profiled(
    cwd: &Path,
    program: &Path,
    args: &[String],
    quiet: bool,
) -> Result<(PathBuf, i32), String> {
    let lib = runtime_library()?;
    let started = SystemTime::now();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .env("LD_PRELOAD", preload_value(&lib));
    // glibc's ld.so must not see LD_PROFILE (its own profiler); under this name the runtime's constructor
    // gives the variable back to the program before main, so the program sees the same environment and the
    // runtime needs no restart (runtime/README.md).
    if let Some(value) = std::env::var_os("LD_PROFILE").filter(|v| !v.is_empty()) {
        cmd.env_remove("LD_PROFILE")
            .env("MSLPROF_LD_PROFILE", value);
    }
    // Calls through the PLT into code built without -pg are counted by the audit module next to the runtime
    // (runtime/README.md, "Calls through the PLT"); MSLPROF_PLT=0 leaves it out.
    let audit = lib.with_file_name("libmslprof_audit.so");
    if audit.exists() && std::env::var_os("MSLPROF_PLT").is_none_or(|v| v != "0") {
        let mut value = OsString::from(audit.as_os_str());
        if let Some(old) = std::env::var_os("LD_AUDIT").filter(|v| !v.is_empty()) {
            value.push(":");
            value.push(old);
        }
        cmd.env("LD_AUDIT", value);
    }
    if quiet {
        cmd.stdout(std::process::Stdio::null());
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    let pid = child.id();
    let status = child
        .wait()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    let code = status.code().unwrap_or(1);
    let path = profile_path(cwd, pid, &program.to_string_lossy());
    let fresh = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= started);
    if !fresh {
        return Err(format!(
            "{}: the program wrote no profile (is GPROFDIR empty, or did it not start?)",
            path.display()
        ));
    }
    Ok((path, code))
}

/// `mslprof run [report options] [--] PROGRAM [ARGS...]`.
pub fn run(args: &[String]) -> ExitCode {
    let (report_opts, command): (Vec<String>, Vec<String>) =
        match args.iter().position(|a| a == "--") {
            Some(i) => (args[..i].to_vec(), args[i + 1..].to_vec()),
            None => {
                let first = args
                    .iter()
                    .position(|a| !a.starts_with('-'))
                    .unwrap_or(args.len());
                (args[..first].to_vec(), args[first..].to_vec())
            }
        };
    let Some(program) = command.first() else {
        eprintln!("mslprof: run: usage: mslprof run [report options] [--] PROGRAM [ARGS...]");
        return ExitCode::from(1);
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let (profile, code) = match run_profiled(&cwd, Path::new(program), &command[1..], false) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mslprof: {e}");
            return ExitCode::from(1);
        }
    };
    let mut report_args = report_opts;
    report_args.push(program.clone());
    report_args.push(profile.display().to_string());
    let rc = crate::report_main(&report_args);
    if code != 0 {
        eprintln!("mslprof: {program} exited with status {code}");
        return ExitCode::from(code.clamp(1, 255) as u8);
    }
    rc
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
    let (profile, code) = run_profiled(d, &d.join("demo"), &[], true)?;
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
    Ok(crate::report_main(&report_args))
}

/// `mslprof export PROFILE [OUTDIR]`: one GNU gmon.out per profiled module, for GNU gprof.
pub fn export(args: &[String]) -> ExitCode {
    let Some(input) = args.first() else {
        eprintln!("mslprof: export: usage: mslprof export PROFILE [OUTDIR]");
        return ExitCode::from(1);
    };
    let outdir = PathBuf::from(args.get(1).map(String::as_str).unwrap_or("."));
    match export_inner(Path::new(input), &outdir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mslprof: {e}");
            ExitCode::from(1)
        }
    }
}

fn export_inner(input: &Path, outdir: &Path) -> Result<(), String> {
    use mslprof_format::model::{Profile, module_flags};
    let bytes = std::fs::read(input).map_err(|e| format!("{}: {e}", input.display()))?;
    if !crate::is_mslprof(&bytes) {
        return Err(format!("{}: not an mslprof profile", input.display()));
    }
    let profile = mslprof_format::read(&bytes, GnuTarget::default())
        .map_err(|e| format!("{}: {}", input.display(), e.kind))?;
    let merged = mslprof_analyzer::merge::merge(
        &[mslprof_analyzer::report::Input {
            path: input.to_path_buf(),
            profile,
            records: None,
        }],
        false,
    )
    .map_err(|f| format!("{}: {}", f.file, f.problem))?
    .profile;
    std::fs::create_dir_all(outdir).map_err(|e| format!("{}: {e}", outdir.display()))?;
    let mut written = 0;
    for m in &merged.modules {
        if m.flags & module_flags::PROFILED == 0 || m.histogram.is_none() || m.path.is_empty() {
            continue;
        }
        let mut module = m.clone();
        // Arcs from other modules have no address in this one: GNU gprof shows them as spontaneous.
        let key = module.key;
        module.key = 0;
        module.flags |= module_flags::MAIN_PROGRAM;
        for a in &mut module.arcs {
            if a.caller_key == key {
                a.caller_key = 0;
            }
        }
        let single = Profile {
            format: merged.format,
            header: merged.header.clone(),
            modules: vec![module],
        };
        let name = String::from_utf8_lossy(&m.name).into_owned();
        let out = outdir.join(format!("gmon.{name}.out"));
        let mut buf = Vec::new();
        mslprof_format::write_gnu(&single, GnuTarget::default(), &mut buf)
            .map_err(|e| format!("{}: {e}", out.display()))?;
        std::fs::write(&out, buf).map_err(|e| format!("{}: {e}", out.display()))?;
        println!(
            "gprof {} {}",
            String::from_utf8_lossy(&m.path),
            out.display()
        );
        written += 1;
    }
    if written == 0 {
        return Err(format!(
            "{}: no profiled module with a histogram",
            input.display()
        ));
    }
    Ok(())
}
