//! `mslprof run` (issues 12 and 15): success judged by the profiles the runtime wrote, the report on
//! stderr (or `--report FILE`) and never on the program's stdout, the process tree summed, the exit
//! status passed through.

use std::path::Path;
use std::process::{Command, Stdio};

use mslprof_tests::analyzer::{build_bounds_pg, scratch};
use mslprof_tests::{analyzer_binary, assert_success, run};

fn mslprof_run(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(analyzer_binary());
    cmd.current_dir(dir)
        .arg("run")
        .args(args)
        .env_remove("MSLPROF_PROFILE")
        .env_remove("LD_PROFILE")
        .env_remove("GPROFDIR")
        .env_remove("GMON_OUT_PREFIX");
    cmd
}

#[test]
fn true_succeeds_every_time_with_stdout_to_dev_null() {
    let dir = scratch("run-true");
    for i in 0..20 {
        let status = mslprof_run(&dir, &["/bin/true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "run {i}: {status}");
    }
}

#[test]
fn gzip_output_is_the_programs_own() {
    let dir = scratch("run-gzip");
    let original: Vec<u8> = (0..200_000u32)
        .flat_map(|i| (i % 251).to_le_bytes())
        .collect();
    std::fs::write(dir.join("f"), &original).unwrap();
    let out =
        run(mslprof_run(&dir, &["gzip", "-c"]).stdin(std::fs::File::open(dir.join("f")).unwrap()));
    assert_success(&out, "mslprof run gzip -c");
    std::fs::write(dir.join("f.gz"), &out.stdout).unwrap();
    let back = run(Command::new("gunzip").arg("-c").arg(dir.join("f.gz")));
    assert_success(&back, "gunzip");
    assert!(back.stdout == original, "gunzip restores f byte for byte");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("profile written to gmon.out"), "{err}");
    assert!(
        err.contains("Flat profile"),
        "the report is on stderr: {err}"
    );
}

#[test]
fn helper_processes_stay_quiet_and_write_nothing() {
    let dir = scratch("run-quiet");
    build_bounds_pg(&dir);
    // A wrapper running helpers before the real program: only the program has the selected library.
    let out = run(Command::new("sh")
        .args(["-c", "/bin/true; /bin/true; /bin/true; ./prog 1000"])
        .current_dir(&*dir)
        .env("LD_PRELOAD", mslprof_tests::runtime_library())
        .env("MSLPROF_PROFILE", "libbounds.so")
        .env_remove("LD_PROFILE")
        .env_remove("MSLPROF_ROOT_PID")
        .env_remove("GPROFDIR")
        .env_remove("GMON_OUT_PREFIX"));
    assert_success(&out, "sh");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.matches("matched no module").count() <= 1,
        "only the root may say so: {err}"
    );
    let mut files: Vec<String> = std::fs::read_dir(&*dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("gmon.out"))
        .collect();
    files.sort();
    // The root shell's gmon.out, and one file: the program's. The helpers recorded nothing selected.
    assert_eq!(files.len(), 2, "{files:?}");
    let child = mslprof_tests::read_profile(&dir.join(&files[1]));
    assert!(
        String::from_utf8_lossy(&child.header.program_name).contains("prog"),
        "{files:?}"
    );

    // Reading the root's gmon.out says the descendants' file is there; --family sums it in.
    let plain = run(Command::new(analyzer_binary())
        .current_dir(&*dir)
        .args(["-b", "-p", "gmon.out"]));
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(
        err.contains("profile(s) of descendant processes") && err.contains("--family"),
        "{err}"
    );
    let family = run(Command::new(analyzer_binary())
        .current_dir(&*dir)
        .args(["-b", "-p", "--family", "gmon.out"]));
    assert_success(&family, "mslprof --family");
    let report = String::from_utf8_lossy(&family.stdout);
    assert!(
        report
            .lines()
            .any(|l| l.ends_with(" bounds_tiny") && l.split_whitespace().nth(3) == Some("1000")),
        "{report}"
    );
}

#[test]
fn shell_children_are_summed_and_statuses_pass_through() {
    let dir = scratch("run-tree");
    build_bounds_pg(&dir);
    let out = run(&mut mslprof_run(
        &dir,
        &[
            "--report",
            "report.txt",
            "-b",
            "-p",
            "--",
            "sh",
            "-c",
            "./prog 1000; ./prog 1000; exit 7",
        ],
    ));
    assert_eq!(out.status.code(), Some(7), "the shell's exit status");
    assert!(out.stdout.is_empty(), "nothing on stdout: {:?}", out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("3 processes wrote profiles"), "{err}");
    let report = std::fs::read_to_string(dir.join("report.txt")).unwrap();
    let calls = report
        .lines()
        .find(|l| l.ends_with(" bounds_tiny"))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap_or_else(|| panic!("bounds_tiny row in {report}"));
    assert_eq!(calls, "2000", "both children's calls: {report}");
    assert_eq!(
        std::fs::read_dir(dir.join("gmon.out.parts"))
            .unwrap()
            .count(),
        3
    );

    let missing = run(&mut mslprof_run(
        &dir,
        &["--no-report", "no-such-command-here"],
    ));
    assert_eq!(missing.status.code(), Some(127));
    // A runtime that cannot be loaded: said so, naming the file, before the program runs unprofiled.
    std::fs::write(dir.join("not-a-library.so"), "just text\n").unwrap();
    let unloadable = run(mslprof_run(&dir, &["--no-report", "/bin/true"])
        .env("MSLPROF_LIBRARY", dir.join("not-a-library.so")));
    assert_eq!(unloadable.status.code(), Some(1));
    let err = String::from_utf8_lossy(&unloadable.stderr);
    assert_eq!(
        err,
        format!(
            "mslprof: run: {}: not a loadable shared library, so the runtime cannot be preloaded \
             (check MSLPROF_LIBRARY)\n",
            dir.join("not-a-library.so").display()
        )
    );
    let bad = run(&mut mslprof_run(&dir, &["--hz", "0", "/bin/true"]));
    assert_eq!(bad.status.code(), Some(1));
}

/// Under any LD_AUDIT module glibc reserves little surplus static TLS, so a program whose library has much
/// initial-exec TLS fails to start ("cannot allocate memory in static TLS block"). `mslprof run` loads
/// the audit module and makes room: the program runs, and its PLT calls into the library are counted.
#[test]
fn a_library_with_much_initial_exec_tls_starts_under_the_audit_module() {
    let dir = scratch("run-static-tls");
    std::fs::write(
        dir.join("bigtls.c"),
        "static __thread char big[40000] __attribute__((tls_model(\"initial-exec\")));\n\
         int bigtls_touch(int i) { big[i % 40000] += 1; return big[i % 40000]; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("main.c"),
        "#include <stdio.h>\nint bigtls_touch(int);\n\
         int main(void) { int s = 0; for (int i = 0; i < 1000; i++) s += bigtls_touch(i); printf(\"%d\\n\", s); return 0; }\n",
    )
    .unwrap();
    mslprof_tests::cc(
        &dir,
        ["-shared", "-fPIC", "-O1", "-o", "libbigtls.so", "bigtls.c"],
    );
    mslprof_tests::cc(
        &dir,
        [
            "-O1",
            "-o",
            "app",
            "main.c",
            "-L.",
            "-lbigtls",
            "-Wl,-rpath,$ORIGIN",
        ],
    );
    // glibc's own limit, without mslprof: the library cannot be loaded under an audit module. (The audit
    // module here is mslprof's, but any module would do: the failure is in ld.so before it runs.)
    let audit = mslprof_tests::analyzer_binary().with_file_name("libmslprof_audit.so");
    assert!(audit.exists(), "{} is built", audit.display());
    let bare = run(Command::new(dir.join("app"))
        .current_dir(&dir)
        .env("LD_AUDIT", &audit)
        .env_remove("GLIBC_TUNABLES"));
    assert!(
        !bare.status.success() && String::from_utf8_lossy(&bare.stderr).contains("static TLS"),
        "expected glibc's static TLS failure without the tunable: {bare:?}"
    );
    let out = run(mslprof_run(&dir, &["--no-report", "./app"]).env_remove("GLIBC_TUNABLES"));
    assert_success(&out, "mslprof run ./app");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1000");
}

/// rustc (dynamically linked against librustc_driver and libLLVM) under `mslprof run -o F`: the profile goes
/// to F and the run succeeds. Under the PLT-counting audit module, calls that ld.so makes while it relocates
/// (IFUNC resolvers) reach the runtime before libc has set up `environ`; a runtime started then read no
/// `GPROFDIR` and wrote `./gmon.out` instead, and `run` found nothing in its private folder.
#[test]
fn rustc_writes_the_named_profile() {
    let Some(rustc) = mslprof_tests::real_rustc() else {
        eprintln!("skipped: no rustc found through `rustc --print sysroot`");
        return;
    };
    let dir = scratch("run-rustc");
    let out = run(mslprof_run(&dir, &["--no-report", "-o", "mine.out", "--"])
        .arg(&rustc)
        .arg("--version"));
    assert_success(&out, "mslprof run -o mine.out -- rustc --version");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("rustc "),
        "{out:?}"
    );
    assert!(
        !dir.join("gmon.out").exists(),
        "no profile outside the run's own folder"
    );
    let profile = mslprof_tests::read_profile(&dir.join("mine.out"));
    let names = mslprof_tests::module_names(&profile);
    assert!(
        names.iter().any(|n| n.starts_with("librustc_driver")),
        "{names:?}"
    );
    assert!(
        String::from_utf8_lossy(&profile.header.program_name).contains("rustc"),
        "{names:?}"
    );
}

/// Every option, the report's too, is checked before the program runs: a bad one leaves the program unrun and
/// an earlier `gmon.out` untouched. A report option's separate value (`-e main`) is not taken for the program.
#[test]
fn options_are_checked_before_the_program_runs() {
    let dir = scratch("run-options-first");
    std::fs::write(dir.join("prog.sh"), "#!/bin/sh\necho ran >> ran.txt\n").unwrap();
    let chmod = run(Command::new("chmod").arg("+x").arg(dir.join("prog.sh")));
    assert_success(&chmod, "chmod");
    std::fs::write(dir.join("gmon.out"), "an earlier run's profile").unwrap();
    for (args, want) in [
        (
            &["--bogus", "--", "./prog.sh"][..],
            "mslprof: run: unexpected argument '--bogus' found\n",
        ),
        (
            &["--width", "wide", "./prog.sh"][..],
            "mslprof: run: invalid value 'wide' for '--width <WIDTH>': invalid digit found in string\n",
        ),
        (
            &["-Oprof", "./prog.sh"][..],
            "mslprof: run: sorry, file format `prof' is not yet supported\n",
        ),
        (
            &["--report", "no-such-folder/report.txt", "./prog.sh"][..],
            "mslprof: run: --report no-such-folder/report.txt: no such folder no-such-folder\n",
        ),
    ] {
        let out = run(&mut mslprof_run(&dir, args));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), want, "{args:?}");
        assert!(!dir.join("ran.txt").exists(), "{args:?} ran the program");
        assert_eq!(
            std::fs::read(dir.join("gmon.out")).unwrap(),
            b"an earlier run's profile",
            "{args:?}"
        );
    }
    let out = run(&mut mslprof_run(
        &dir,
        &["-e", "main", "--width", "100", "--no-report", "./prog.sh"],
    ));
    assert_success(&out, "mslprof run -e main --width 100 ./prog.sh");
    assert_eq!(
        std::fs::read_to_string(dir.join("ran.txt")).unwrap(),
        "ran\n"
    );
}

/// `--profile` names that match no module are reported under the option's name (not as `LD_PROFILE`, which
/// the user never set), and the variable that tells the runtime so is not in the program's environment; nor
/// is `MSLPROF_PLT` when it would only say the default.
#[test]
fn unmatched_profile_names_are_reported_as_the_option() {
    let dir = scratch("run-profile-option");
    std::fs::write(
        dir.join("main.c"),
        "#include <stdio.h>\n#include <stdlib.h>\n\
         static const char *seen(const char *v) { return getenv(v) ? \"seen\" : \"hidden\"; }\n\
         int main(void) { printf(\"%s %s\\n\", seen(\"MSLPROF_PROFILE_OPTION\"), seen(\"MSLPROF_PLT\")); return 0; }\n",
    )
    .unwrap();
    mslprof_tests::cc(&dir, ["-O1", "-o", "prog", "main.c"]);
    let out = run(mslprof_run(
        &dir,
        &["--profile", "nosuchlib.so", "--no-report", "./prog"],
    )
    .env_remove("MSLPROF_PLT"));
    assert_success(&out, "mslprof run --profile nosuchlib.so ./prog");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hidden hidden\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l == "mslprof: --profile name 'nosuchlib.so' matched no module"),
        "{err}"
    );
    assert!(!err.contains("LD_PROFILE"), "{err}");
}

/// A statically linked program is refused before it runs (nothing can be preloaded into it, and glibc's own
/// `gmon.out` of a `-pg` build would replace the user's).
#[test]
fn a_static_program_is_refused_before_it_runs() {
    let dir = scratch("run-static");
    std::fs::write(
        dir.join("main.c"),
        "int twice(int x) { return 2 * x; }\nint main(void) { return twice(0); }\n",
    )
    .unwrap();
    let built = run(Command::new("cc").current_dir(&*dir).args([
        "-static",
        "-pg",
        "-o",
        "static_pg",
        "main.c",
    ]));
    if !built.status.success() {
        eprintln!(
            "skipped: cc -static failed (no static libc?): {}",
            String::from_utf8_lossy(&built.stderr)
        );
        return;
    }
    std::fs::write(dir.join("gmon.out"), "the user's profile").unwrap();
    let out = run(&mut mslprof_run(&dir, &["--", "./static_pg"]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "mslprof: run: ./static_pg: statically linked, so libmslprof.so cannot be loaded into it; nothing \
         was run (link it dynamically; a -pg program run on its own writes glibc's gmon.out, which mslprof \
         reads)\n"
    );
    assert_eq!(
        std::fs::read(dir.join("gmon.out")).unwrap(),
        b"the user's profile"
    );
}

/// A program killed by a signal is said to be, by the signal's name; when no profile was written, an earlier
/// run's `gmon.out` is said to be that.
#[test]
fn deaths_by_signal_and_stale_profiles_are_named() {
    let dir = scratch("run-signals");
    std::fs::write(
        dir.join("main.c"),
        "#include <signal.h>\nint main(void) { raise(SIGSEGV); return 0; }\n",
    )
    .unwrap();
    mslprof_tests::cc(&dir, ["-O1", "-o", "segv", "main.c"]);
    let out = run(&mut mslprof_run(&dir, &["--no-report", "./segv"]));
    assert_eq!(out.status.code(), Some(139), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.starts_with("mslprof: ./segv was killed by SIGSEGV")),
        "{err}"
    );
    std::fs::write(dir.join("gmon.out"), "an earlier run's profile").unwrap();
    let out = run(&mut mslprof_run(
        &dir,
        &["--no-report", "sh", "-c", "kill -KILL $$"],
    ));
    assert_eq!(out.status.code(), Some(137), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "mslprof: sh was killed by SIGKILL\n\
         mslprof: run: sh wrote no profile (SIGKILL ends a process before it can write one); gmon.out is \
         left from an earlier run, not this one\n"
    );
}

/// `--stack-depth` sets `MSLPROF_STACK_DEPTH` for the program: 0 records no stacks (and, above 200 Hz,
/// samples through rings), the default records them; a depth above 4096 is refused before anything runs.
#[test]
fn stack_depth_sets_the_frames_recorded_per_sample() {
    let dir = scratch("run-stack-depth");
    std::fs::write(
        dir.join("spin.c"),
        "#include <time.h>\n\
         static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); \
         return t.tv_sec + t.tv_nsec / 1e9; }\n\
         volatile double sink;\n\
         int main(void) { double end = cpu() + 0.1; while (cpu() < end) \
         for (int i = 0; i < 10000; i++) sink += i; return 0; }\n",
    )
    .unwrap();
    mslprof_tests::cc(&dir, ["-O1", "-o", "spin", "spin.c"]);
    for (depth, stacks) in [(None, true), (Some("0"), false)] {
        let mut args = vec!["--no-report", "--hz", "1000"];
        if let Some(depth) = depth {
            args.extend(["--stack-depth", depth]);
        }
        args.push("./spin");
        let output = run(&mut mslprof_run(&dir, &args));
        assert_success(&output, "mslprof run ./spin");
        let bytes = std::fs::read(dir.join("gmon.out")).unwrap();
        let profile = mslprof_format::read(&bytes, Default::default()).unwrap();
        assert!(profile.header.total_samples >= 50, "{depth:?}");
        assert_eq!(profile.stacks.is_some(), stacks, "--stack-depth {depth:?}");
    }
    let bad = run(&mut mslprof_run(&dir, &["--stack-depth", "5000", "./spin"]));
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--stack-depth 5000: must be a whole number"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
