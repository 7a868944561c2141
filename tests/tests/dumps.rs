//! Dumps on demand: `mslprof_dump()` from C (exact counts in each snapshot), the header from C and C++,
//! and a daemon-like fixture dumped by `MSLPROF_DUMP_SIGNAL` and by `MSLPROF_DUMP_INTERVAL` while it keeps
//! running.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mslprof_format::model::Profile;
use mslprof_tests::analyzer::have;
use mslprof_tests::loader::{calls_into, function};
use mslprof_tests::{
    Workspace, assert_success, module, read_profile, run, runtime_library, wait_until,
};

fn source(name: &str) -> PathBuf {
    mslprof_tests::fixtures_dir("dumps").join(name)
}

fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/include")
}

/// Calls into `work` of the program `name` recorded in `profile`.
fn work_calls(ws: &Workspace, name: &str, profile: &Profile) -> u64 {
    calls_into(module(profile, name), &function(&ws.join(name), "work"))
}

/// The fixture `fixture` built with `-pg` and `extra`, with the header and libmslprof.so linked in.
fn linked_program(ws: &Workspace, name: &str, fixture: &str, extra: &[&str]) -> PathBuf {
    linked_program_with(ws, name, fixture, extra, &runtime_library())
}

/// As [`linked_program`], linked with the runtime `library` (e.g. the copy with test hooks).
fn linked_program_with(
    ws: &Workspace,
    name: &str,
    fixture: &str,
    extra: &[&str],
    library: &Path,
) -> PathBuf {
    let target = library.parent().unwrap().display().to_string();
    let include = format!("-I{}", include_dir().display());
    let (search, rpath) = (format!("-L{target}"), format!("-Wl,-rpath,{target}"));
    let mut options = vec![include.as_str(), "-pg"];
    options.extend_from_slice(extra);
    options.extend([search.as_str(), "-lmslprof", rpath.as_str()]);
    ws.program(name, &[source(fixture)], &options)
}

#[test]
fn mslprof_dump_writes_exact_snapshots_and_counting_goes_on() {
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return;
    }
    let ws = Workspace::new();
    let program = linked_program(&ws, "snapshots", "snapshots.c", &[]);
    // The runtime is linked in: no LD_PRELOAD.
    let out = run(&mut ws.command(&program));
    assert_success(&out, "snapshots");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "missing folder: -1 ENOENT\n"
    );
    let snapshot = ws.profile("snapshot.out");
    assert_eq!(work_calls(&ws, "snapshots", &snapshot), 1000);
    for file in ["gmon.out.1", "gmon.out.2", "gmon.out"] {
        assert_eq!(
            work_calls(&ws, "snapshots", &ws.profile(file)),
            1500,
            "{file}"
        );
    }
    let names = mslprof_tests::loader::profile_files(&ws);
    assert_eq!(names, ["gmon.out", "gmon.out.1", "gmon.out.2"]);
}

#[test]
fn header_compiles_from_c_and_cplusplus() {
    let ws = Workspace::new();
    let text = "#include \"mslprof.h\"\nstatic unsigned short buffer[64];\n\
                int main(void) {\n\
                struct text_region region = {(const void *)&buffer[0], (const void *)&buffer[64]};\n\
                smonitor(&region, 1, buffer, sizeof buffer, 0, PROF_USHORT);\n\
                smonitor(0, 0, 0, 0, 0, PROF_UINT);\n\
                moncontrol(1); return mslprof_dump(0) == 0 ? 0 : 1; }\n";
    std::fs::write(ws.join("use.c"), text).unwrap();
    std::fs::write(ws.join("use.cc"), text).unwrap();
    let include = format!("-I{}", include_dir().display());
    for (compiler, file, standard) in [
        ("cc", "use.c", "-std=c99"),
        ("cc", "use.c", "-std=c11"),
        ("c++", "use.cc", "-std=c++11"),
        ("c++", "use.cc", "-std=c++17"),
    ] {
        if !have(compiler) {
            eprintln!("SKIPPED: no `{compiler}`");
            continue;
        }
        for weak in [None, Some("-DMSLPROF_WEAK")] {
            let mut args = vec!["-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-pedantic"];
            args.extend([standard, &include]);
            args.extend(weak);
            args.push(file);
            mslprof_tests::compile(compiler, ws.path(), args);
        }
    }
}

/// The daemon fixture running under the runtime with `env`, once it has said "ready".
fn start_daemon(ws: &Workspace, threads: &str, env: &[(&str, &str)]) -> Child {
    let program = ws.program("daemon", &[source("daemon.c")], &["-pg", "-lpthread"]);
    let mut cmd = ws.command_with_runtime(&program);
    cmd.arg(threads)
        .envs(env.iter().copied())
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().expect("start the daemon");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    child
}

/// Waits (20 s at most) until `ws` holds `name`; fails if the daemon ended meanwhile.
fn wait_for(ws: &Workspace, name: &str, daemon: &mut Child) {
    wait_until(daemon, &format!("no {name} after 20 s"), |daemon| {
        if let Some(status) = daemon.try_wait().unwrap() {
            panic!("the daemon ended ({status}) before {name} appeared");
        }
        ws.join(name).exists().then_some(())
    });
}

fn send_usr2(pid: u32) {
    assert_success(
        &run(Command::new("kill").args(["-USR2", &pid.to_string()])),
        "kill -USR2",
    );
}

/// Every `gmon.out.N` in `ws` decodes whole; their calls into `work` never decrease with N.
fn check_snapshots(ws: &Workspace) -> Vec<u64> {
    let mut counts = Vec::new();
    for n in 1.. {
        let path = ws.join(&format!("gmon.out.{n}"));
        if !path.exists() {
            break;
        }
        counts.push(work_calls(ws, "daemon", &read_profile(&path)));
    }
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    assert!(counts.first().is_some_and(|&c| c > 0), "{counts:?}");
    counts
}

#[test]
fn daemon_is_dumped_by_signal_while_it_runs() {
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return;
    }
    let ws = Workspace::new();
    let mut daemon = start_daemon(&ws, "4", &[("MSLPROF_DUMP_SIGNAL", "USR2")]);
    for n in 1..=3 {
        send_usr2(daemon.id());
        wait_for(&ws, &format!("gmon.out.{n}"), &mut daemon);
    }
    // A burst: signals that arrive while a snapshot is being written are folded into the next one.
    for _ in 0..20 {
        send_usr2(daemon.id());
    }
    wait_for(&ws, "gmon.out.4", &mut daemon);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        daemon.try_wait().unwrap().is_none(),
        "the daemon keeps running"
    );
    let counts = check_snapshots(&ws);
    assert!(counts.len() >= 4, "{counts:?}");
    // Counting went on between the first and the last snapshot.
    assert!(counts[0] < counts[counts.len() - 1], "{counts:?}");
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

#[test]
fn daemon_is_dumped_every_interval_and_snapshots_survive_sigkill() {
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return;
    }
    let ws = Workspace::new();
    let mut daemon = start_daemon(&ws, "1", &[("MSLPROF_DUMP_INTERVAL", "1")]);
    wait_for(&ws, "gmon.out.2", &mut daemon);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let counts = check_snapshots(&ws);
    assert!(counts.len() >= 2 && counts[0] < counts[1], "{counts:?}");
    assert!(
        !ws.join("gmon.out").exists(),
        "SIGKILL leaves no final dump"
    );
}

#[test]
fn a_bad_dump_signal_is_reported_and_ignored() {
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return;
    }
    let ws = Workspace::new();
    let program = ws.program(
        "snapshots",
        &[source("snapshots.c")],
        &[
            &format!("-I{}", include_dir().display()),
            "-pg",
            &format!("-L{}", runtime_library().parent().unwrap().display()),
            "-lmslprof",
        ],
    );
    let out = run(ws
        .command_with_runtime(&program)
        .env("LD_LIBRARY_PATH", runtime_library().parent().unwrap())
        .env("MSLPROF_DUMP_SIGNAL", "PROF"));
    assert_success(&out, "snapshots");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MSLPROF_DUMP_SIGNAL"), "{err}");
}

#[test]
fn rust_programs_dump_through_mslprof_control() {
    let program = Path::new(env!("CARGO_BIN_EXE_dump_from_rust"));
    let ws = Workspace::new();
    let out = run(&mut ws.command_with_runtime(program));
    assert_success(&out, "dump_from_rust under the runtime");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "runtime true\nnamed Ok(())\npause true\nresume true\nusual Ok(())\n"
    );
    for file in ["rust.out", "gmon.out.1", "gmon.out"] {
        let profile = ws.profile(file);
        assert!(
            profile.modules.iter().any(|m| m.name == b"dump_from_rust"),
            "{file}"
        );
    }
    // Without the runtime the same program runs, and says so.
    let ws = Workspace::new();
    let out = run(&mut ws.command(program));
    assert_success(&out, "dump_from_rust without the runtime");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "runtime false\nnamed Err(Unsupported)\npause false\nresume false\nusual Err(Unsupported)\n"
    );
    assert!(mslprof_tests::loader::profile_files(&ws).is_empty());
}

/// Samples the histogram of module `name` in `profile` holds in the 4-byte buckets that overlap `f`.
fn samples_in(profile: &Profile, name: &str, f: &mslprof_tests::loader::Function) -> u64 {
    let histogram = module(profile, name).histogram.as_ref().expect("histogram");
    histogram
        .ranges
        .iter()
        .flat_map(|r| {
            r.buckets
                .nonzero()
                .map(move |(i, c)| (r.start.0 + 4 * i, c))
        })
        .filter(|&(address, _)| f.start < address + 4 && address < f.end)
        .map(|(_, c)| u64::from(c))
        .sum()
}

#[test]
fn smonitor_fills_the_programs_buffer_and_a_later_call_dumps() {
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return;
    }
    let ws = Workspace::new();
    // Aligned functions: no 4-byte histogram bucket holds code of both idle and burn.
    // The fixture injects samples through the runtime's test hooks.
    let program = linked_program_with(
        &ws,
        "smon",
        "smonitor.c",
        &["-falign-functions=16"],
        &mslprof_tests::test_hooks_runtime_library(),
    );
    let out = run(&mut ws.command(&program));
    assert_success(&out, "smon");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "refused: 1\n\
         ushort: prefill kept 1, idle bucket >= 1007 1, burnt samples >= 20 1\n\
         uint: idle 500, old buffer unchanged 1\n\
         stopped: idle 500, unchanged 1\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "mslprof: smonitor: flags is neither PROF_USHORT nor PROF_UINT; not collecting\n"
    );
    assert_eq!(
        mslprof_tests::loader::profile_files(&ws),
        ["gmon.out", "gmon.out.1", "gmon.out.2"]
    );
    let (idle, burn) = (function(&program, "idle"), function(&program, "burn"));
    // Each dump holds what the runtime counted up to it: all the injected samples exactly (the refused
    // call's 10 too: the runtime counts them whatever smonitor does), and burn's.
    for (file, injected) in [
        ("gmon.out.1", 1010),
        ("gmon.out.2", 1510),
        ("gmon.out", 1810),
    ] {
        let profile = ws.profile(file);
        assert_eq!(samples_in(&profile, "smon", &idle), injected, "{file}");
        assert!(samples_in(&profile, "smon", &burn) > 0, "{file}");
    }
}
