//! Line-by-line profiles (`-l`), execution counts (`-C`/`-Z`) and annotated source (`-A`/`-J` with `-x`,
//! `-y`, `-I`, `GPROF_PATH`, `-t`, `-m`) against GNU gprof 2.40, live: C and C++
//! fixtures built with `-pg -g` (unoptimised, and optimised so that functions are inlined and split), run
//! to produce a GNU gmon.out; mslprof must print byte for byte what gprof prints (the explanatory blurbs
//! aside, hence `-b`). Then `-l` on a multi-module mslprof profile, and the static call graph (`-c`, `-d`).

use std::process::Command;

use mslprof_tests::analyzer::{assert_same, build_and_run, have, scratch, tools_present};
use mslprof_tests::{Workspace, compile};

const LINE_OPTIONS: &[&str] = &[
    "-b -l -p",
    "-b -l -q",
    "-b -l -p -z",
    "-b -l -q -z",
    "-b -l -L",
    "-b -l -T",
    "-b -l -p -e fa -a",
    "-b -l -q -m 2",
];

const EXEC_OPTIONS: &[&str] = &[
    "-b -C",
    "-b -C -z",
    "-b -l -C",
    "-b -l -C -z",
    "-b -p -C",
    "-b -Cfa",
    "-b -Zfa",
    "-b -Z",
    "-b -q -C -L",
    "-b -T -C -p -q",
];

const ANNO_OPTIONS: &[&str] = &[
    "-b -A",
    "-b -A -x",
    "-b -l -A",
    "-b -l -A -x",
    "-b -p -A",
    "-b -Afa",
    "-b -Jfa",
    "-b -A -z",
    "-b -A -t 2",
    "-b -A -m 50000",
    "-b -A -C",
];

#[test]
fn line_profiles_of_c_programs_match_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("lines-c");
    let srcs = ["cycles_main.c", "cycles_other.c"];
    build_and_run(&dir, "gcc", &["-pg", "-g", "-O0"], &srcs, "o0", "gmon.o0");
    build_and_run(&dir, "gcc", &["-pg", "-g", "-O2"], &srcs, "o2", "gmon.o2");
    build_and_run(
        &dir,
        "gcc",
        &["-pg", "-g", "-O0"],
        &["recursion.c"],
        "rec",
        "gmon.rec",
    );
    // Link-time optimised: DWARF 5 line tables whose file entry 0 (`<artificial>`) is not entry 1.
    build_and_run(
        &dir,
        "gcc",
        &["-pg", "-g", "-O2", "-flto"],
        &srcs,
        "lto",
        "gmon.lto",
    );
    for files in [
        ["o0", "gmon.o0"],
        ["o2", "gmon.o2"],
        ["rec", "gmon.rec"],
        ["lto", "gmon.lto"],
    ] {
        assert_same(&dir, LINE_OPTIONS, &files);
        assert_same(&dir, EXEC_OPTIONS, &files);
        assert_same(&dir, ANNO_OPTIONS, &files);
    }
}

#[test]
fn line_profiles_of_cxx_programs_match_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("lines-cxx");
    build_and_run(
        &dir,
        "g++",
        &["-pg", "-g", "-O2"],
        &["templates.cc"],
        "cxx",
        "gmon.cxx",
    );
    assert_same(
        &dir,
        &["-b -l -p", "-b -l -q", "-b -l -z", "-b -l --no-demangle"],
        &["cxx", "gmon.cxx"],
    );
    assert_same(&dir, EXEC_OPTIONS, &["cxx", "gmon.cxx"]);
    assert_same(&dir, ANNO_OPTIONS, &["cxx", "gmon.cxx"]);
}

/// Where DWARF names no function (compiler clones' tails, assembler), gprof's line symbols carry the name
/// BFD finds among the ELF symbols: the nearest below, kept over a smaller symbol nested in it (BFD reuses
/// its last answer), the larger of two at one address. Fixture: assembler with a line table only.
#[test]
fn line_symbols_outside_dwarf_functions_match_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("lines-nested");
    build_and_run(
        &dir,
        "gcc",
        &["-pg"],
        &["nested_symbols.s"],
        "nested",
        "gmon.nested",
    );
    let files = ["nested", "gmon.nested"];
    assert_same(&dir, &["-b -l -p", "-b -l -p -z", "-b -l -C -z"], &files);
    let flat = run_ok(
        Command::new(mslprof_tests::analyzer_binary())
            .current_dir(&dir)
            .args(["-b", "-l", "-p", "-z"])
            .args(files),
        "mslprof -l",
    );
    for row in [
        "main (nested_symbols.c:2 @ ",
        "long_alias (nested_symbols.c:7 @ ",
        "tail (nested_symbols.c:10 @ ",
    ] {
        assert!(flat.contains(row), "{row}: {flat}");
    }
    assert!(!flat.contains("inner ("), "{flat}");
}

/// Annotated source when a source file has moved: searched for with `-I` and `GPROF_PATH`, one warning
/// when it cannot be found, and `-y` files; all as gprof.
#[test]
fn annotated_source_is_searched_for_like_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("lines-anno");
    for f in ["cycles_main.c", "cycles_other.c"] {
        std::fs::copy(mslprof_tests::analyzer::fixtures().join(f), dir.join(f)).unwrap();
    }
    compile(
        "gcc",
        &dir,
        [
            "-pg",
            "-g",
            "-O0",
            "-o",
            "p",
            "cycles_main.c",
            "cycles_other.c",
        ],
    );
    run_for_gmon(&dir, "p");
    std::fs::create_dir(dir.join("src")).unwrap();
    std::fs::rename(dir.join("cycles_main.c"), dir.join("src/cycles_main.c")).unwrap();
    let both = |args: &[&str], gprof_path: Option<&str>, cwd: &std::path::Path| {
        let run = |program: &std::path::Path| {
            let mut c = Command::new(program);
            c.current_dir(cwd).args(args).env_remove("GPROF_PATH");
            if let Some(p) = gprof_path {
                c.env("GPROF_PATH", p);
            }
            c.output().unwrap()
        };
        (
            run(&mslprof_tests::analyzer_binary()),
            run(std::path::Path::new("gprof")),
        )
    };
    for (args, path) in [
        (&["-b", "-A", "p", "gmon.out"][..], None),
        (&["-b", "-A", "-I", "src", "p", "gmon.out"][..], None),
        (
            &["-b", "-A", "-Isrc:/nonexistent", "p", "gmon.out"][..],
            None,
        ),
        (&["-b", "-A", "p", "gmon.out"][..], Some("/nonexistent:src")),
    ] {
        let (ours, theirs) = both(args, path, &dir);
        assert_eq!(
            String::from_utf8_lossy(&ours.stdout),
            String::from_utf8_lossy(&theirs.stdout),
            "{args:?} GPROF_PATH={path:?}"
        );
        assert_eq!(ours.status.code(), theirs.status.code());
        let warned = |o: &std::process::Output| {
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .filter(|l| l.contains("could not locate `") && l.contains("cycles_main.c'"))
                .count()
        };
        assert_eq!(warned(&ours), warned(&theirs), "{args:?}");
    }
    // -y: one NAME-ann file per source, in the working directory.
    for sub in ["ours", "theirs"] {
        std::fs::create_dir(dir.join(sub)).unwrap();
    }
    let args = ["-b", "-A", "-y", "-I", "../src", "../p", "../gmon.out"];
    for (sub, program) in [
        ("ours", mslprof_tests::analyzer_binary()),
        ("theirs", std::path::PathBuf::from("gprof")),
    ] {
        let out = Command::new(program)
            .current_dir(dir.join(sub))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{sub}: {out:?}");
        assert!(
            out.stdout.is_empty(),
            "{sub}: -y writes no listing to stdout"
        );
    }
    for f in ["cycles_main.c-ann", "cycles_other.c-ann"] {
        let a = std::fs::read(dir.join("ours").join(f)).expect("mslprof wrote the -ann file");
        let b = std::fs::read(dir.join("theirs").join(f)).expect("gprof wrote the -ann file");
        assert!(a == b, "{f} differs from gprof's");
    }
}

/// `-R map` (suggested object-file order) with a map from `nm -A --extern-only --defined-only` over the
/// program's objects: the mapped symbols carry their file's name in every table too.
#[test]
fn file_ordering_matches_gprof() {
    if !tools_present() || !have("nm") {
        return;
    }
    let dir = scratch("lines-fileorder");
    let fx = mslprof_tests::analyzer::fixtures();
    let cc = |args: &[&str]| compile("gcc", &dir, args);
    let (main_c, other_c) = (fx.join("cycles_main.c"), fx.join("cycles_other.c"));
    cc(&[
        "-pg",
        "-g",
        "-O0",
        "-c",
        main_c.to_str().unwrap(),
        other_c.to_str().unwrap(),
    ]);
    cc(&["-pg", "-o", "p", "cycles_main.o", "cycles_other.o"]);
    run_for_gmon(&dir, "p");
    let map = Command::new("nm")
        .current_dir(&dir)
        .args([
            "-A",
            "--extern-only",
            "--defined-only",
            "cycles_main.o",
            "cycles_other.o",
        ])
        .output()
        .unwrap();
    std::fs::write(dir.join("map"), &map.stdout).unwrap();
    assert_same(
        &dir,
        &[
            "-R map",
            "-b -R map -p -z",
            "-b -p -q -R map",
            "-b -T -R map",
        ],
        &["p", "gmon.out"],
    );
}

/// Run `dir/program` in `dir`, which leaves its gmon.out there.
fn run_for_gmon(dir: &std::path::Path, program: &str) {
    let ran = Command::new(dir.join(program))
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(ran.success(), "{program} failed");
}

/// The part of `text` after a `separator` whose first line contains `heading`.
fn part_after<'a>(text: &'a str, separator: &str, heading: &str) -> &'a str {
    text.split(separator)
        .find(|part| part.lines().next().is_some_and(|l| l.contains(heading)))
        .unwrap_or_else(|| panic!("no `{separator}…{heading}` part in:\n{text}"))
}

/// The names of the flat-profile rows of `report`, with their module index when `with_module`.
fn flat_names(report: &str, with_module: bool) -> Vec<(Option<usize>, String)> {
    report
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("time"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| {
            // gprof's columns take 54 characters; mslprof's module index follows in 6 and 2 blanks.
            let rest = l.get(54..)?;
            if with_module {
                let (m, name) = (rest.get(..6)?, rest.get(8..)?);
                Some((m.trim().parse().ok(), name.to_string()))
            } else {
                Some((None, rest.to_string()))
            }
        })
        .collect()
}

fn run_ok(command: &mut Command, what: &str) -> String {
    let out = command.output().expect(what);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A program and a library, both `-pg -g`, each with a static `spin`, run under the runtime: `-l` gives
/// line symbols in both modules, qualified by module where the function name is ambiguous; each module's
/// lines with time are those GNU gprof finds in that module's exported gmon.out; and the library's lines
/// are the same when its debug information lives in a separate file found by `.gnu_debuglink`.
#[test]
fn line_profiles_cover_every_module() {
    if !tools_present() || !have("objcopy") {
        eprintln!("SKIPPED: needs gprof, gcc and objcopy");
        return;
    }
    let ws = Workspace::new();
    let dir = ws.path();
    let fx = mslprof_tests::analyzer::fixtures();
    ws.shared_library("liblines.so", &[fx.join("lines_lib.c")], &["-pg", "-O0"]);
    let prog = ws.program(
        "lmain",
        &[fx.join("lines_main.c")],
        &["-pg", "-O0", "-L.", "-llines"],
    );
    let out = ws
        .command_with_runtime(&prog)
        .env("MSLPROF_PROFILE", "a.out:liblines.so")
        .output()
        .expect("run lmain");
    mslprof_tests::assert_success(&out, "lmain under the runtime");
    let mslprof = || {
        let mut c = Command::new(mslprof_tests::analyzer_binary());
        c.current_dir(dir);
        c
    };
    let report = run_ok(mslprof().args(["-b", "-l", "-p", "gmon.out"]), "mslprof -l");
    let timed = flat_names(&report, true);
    assert!(
        timed
            .iter()
            .any(|(_, n)| n.starts_with("spin@liblines.so (lines_lib.c:"))
            && timed
                .iter()
                .any(|(_, n)| n.starts_with("spin@lmain (lines_main.c:")),
        "{report}"
    );
    assert!(report.contains("  lib_work (lines_lib.c:"), "{report}");
    // A report without -l reads source positions only for static functions it prints; its index still names
    // their files, as gprof's does.
    let plain = run_ok(mslprof().args(["-b", "gmon.out"]), "mslprof -b");
    let index = plain
        .split_once("Index by function name")
        .and_then(|(_, rest)| rest.split_once("\nModules"))
        .map_or("", |(index, _)| index);
    assert!(
        index.contains("spin@lmain (lines_main.c)")
            && index.contains("spin@liblines.so (lines_lib.c)")
            && !index.contains("lib_work ("),
        "{plain}"
    );
    // Function order: one list per module, each headed by a `#` line naming it; the called functions
    // first, chained along their arcs inside the module.
    let order = run_ok(mslprof().args(["-r", "gmon.out"]), "mslprof -r");
    let list = |module: &str| -> Vec<&str> {
        part_after(
            &order,
            "# function order for module ",
            &format!(", {module} ("),
        )
        .lines()
        .skip(1)
        .take(2)
        .collect()
    };
    assert_eq!(list("liblines.so"), ["lib_work", "spin"], "{order}");
    assert_eq!(list("lmain"), ["main", "spin"], "{order}");
    // Annotated source over both modules: each file listed once with the call counts of its functions.
    let listing = run_ok(mslprof().args(["-b", "-A", "gmon.out"]), "mslprof -A");
    let counts_in = |file: &str| -> Vec<String> {
        part_after(&listing, "*** File ", &format!("/{file}:"))
            .lines()
            .filter_map(|l| l.split_once(" -> ").map(|(n, _)| n.trim().to_string()))
            .collect()
    };
    assert_eq!(counts_in("lines_lib.c"), ["4", "4"], "{listing}");
    assert_eq!(counts_in("lines_main.c"), ["4", "1"], "{listing}");
    // Execution counts over both modules: exact call counts, by file and line, ambiguous names qualified.
    let counts = run_ok(mslprof().args(["-b", "-C", "gmon.out"]), "mslprof -C");
    let tally: Vec<String> = counts
        .lines()
        .filter(|l| l.ends_with(" executions"))
        .map(|l| {
            let (file, rest) = l.split_once(": (").unwrap_or((l, ""));
            let name = rest.split(":0x").next().unwrap_or("");
            let n = rest.split(") ").nth(1).unwrap_or("");
            let file = file.rsplit('/').next().unwrap_or(file);
            format!("{file} {name} {n}")
        })
        .collect();
    assert_eq!(
        tally,
        [
            "lines_lib.c:6 spin@liblines.so 4 executions",
            "lines_lib.c:14 lib_work 4 executions",
            "lines_main.c:9 spin@lmain 4 executions",
            "lines_main.c:15 main 1 executions",
        ],
        "{counts}"
    );
    // Every symbol, line symbols included (`-z`), module by module, against gprof on the module's export:
    // the same names, files, lines and addresses.
    let all = run_ok(
        mslprof().args(["-b", "-l", "-p", "-z", "gmon.out"]),
        "mslprof -l -z",
    );
    let ours = flat_names(&all, true);
    run_ok(
        mslprof().args(["export", "gmon.out", "gnu"]),
        "mslprof export",
    );
    for (index, module) in [(0, "lmain"), (3, "liblines.so")] {
        let gnu = format!("gnu/gmon.{module}.out");
        let theirs = run_ok(
            Command::new("gprof")
                .current_dir(dir)
                .args(["-b", "-l", "-p", "-z", module, &gnu]),
            "gprof -l",
        );
        let mut want: Vec<String> = flat_names(&theirs, false)
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        let qualifier = format!("@{module}");
        let mut got: Vec<String> = ours
            .iter()
            .filter(|(m, _)| *m == Some(index))
            .map(|(_, n)| match n.strip_suffix(&qualifier) {
                Some(bare) => bare.to_string(),
                None => n.replacen(&format!("{qualifier} "), " ", 1),
            })
            .collect();
        // gprof drops a library's last function when it lies past `.text` (`_fini`, in `.fini`); mslprof
        // lets a module's last function reach the end of its executable sections (analyzer/README.md).
        want.retain(|n| n != "_fini");
        got.retain(|n| n != "_fini");
        // mslprof's own rows for code no symbol covers (analyzer/README.md, function bounds): PLT stubs
        // (`name@plt`), functions known only from unwind tables (`fn_ADDR`) and unknown ranges (`MODULE+0xADDR`).
        got.retain(|n| !(n.contains("@plt") || n.starts_with("fn_") || n.contains("+0x")));
        want.sort();
        got.sort();
        assert!(want.len() > 5, "{theirs}");
        assert_eq!(got, want, "symbols of {module}:\n{all}\ngprof:\n{theirs}");
    }
    // The same report when the library's DWARF moves to a separate debug file.
    let lib = dir.join("liblines.so");
    let debug = dir.join("liblines.so.debug");
    run_ok(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&lib)
            .arg(&debug),
        "objcopy --only-keep-debug",
    );
    run_ok(
        Command::new("objcopy").current_dir(dir).args([
            "--strip-debug",
            "--add-gnu-debuglink=liblines.so.debug",
            "liblines.so",
        ]),
        "objcopy --strip-debug",
    );
    let stripped = run_ok(mslprof().args(["-b", "-l", "-p", "gmon.out"]), "mslprof -l");
    assert_eq!(stripped, report);
}

/// `-c` against gprof: calls found in the machine code and never taken show as `0/0` arcs, and `-d`
/// leaves the report alone.
#[test]
fn static_call_graph_matches_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("static-calls");
    build_and_run(
        &dir,
        "gcc",
        &["-pg", "-g", "-O0"],
        &["static_calls.c"],
        "sc",
        "gmon.out",
    );
    assert_same(
        &dir,
        &["-b -c", "-b -c -q", "-b -q --static-call-graph", "-b -T -c"],
        &["sc", "gmon.out"],
    );
    let m = mslprof_tests::analyzer_binary();
    let report = run_ok(
        Command::new(&m)
            .current_dir(&*dir)
            .args(["-b", "-c", "-q", "sc"]),
        "mslprof -c",
    );
    assert!(
        report.contains("                0.00    0.00       0/0           never_b ["),
        "no static arc work -> never_b:\n{report}"
    );
    // -d prints its debugging lines on stderr only: the report is the same with and without it.
    for d in ["-d", "-d256", "-d384"] {
        let out = Command::new(&m)
            .current_dir(&*dir)
            .args(["-b", "-c", d, "sc"])
            .output()
            .unwrap();
        assert!(out.status.success(), "mslprof {d}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            run_ok(
                Command::new(&m).current_dir(&*dir).args(["-b", "-c", "sc"]),
                "mslprof -c"
            ),
            "{d} changed the report"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("[findcall] ") && err.contains("work calls never_b (static arc, count 0)"),
            "{d}: no -c trace on stderr:\n{err}"
        );
        assert_eq!(
            err.contains("[symbols] sc: ") && err.contains(" work\n"),
            d != "-d256",
            "{d}: symbols on stderr only with bit 128:\n{err}"
        );
    }
}

/// mslprof's `-c` decodes instructions, so it also finds a backward call (gprof 2.40 reads the
/// displacement unsigned and misses it): `work`'s entry lists `backward_target` with `0/0`.
#[test]
fn static_call_graph_finds_backward_calls() {
    if !tools_present() {
        return;
    }
    let dir = scratch("static-calls-back");
    build_and_run(
        &dir,
        "gcc",
        &["-pg", "-g", "-O0", "-DBACKWARD"],
        &["static_calls.c"],
        "sc",
        "gmon.out",
    );
    let m = mslprof_tests::analyzer_binary();
    let report = run_ok(
        Command::new(&m)
            .current_dir(&*dir)
            .args(["-b", "-q", "-c", "sc"]),
        "mslprof -c",
    );
    let entry: Vec<&str> = report
        .split("-----------------------------------------------\n")
        .find(|e| {
            e.lines()
                .any(|l| l.starts_with('[') && l.contains(" work ["))
        })
        .unwrap_or_else(|| panic!("no entry for work:\n{report}"))
        .lines()
        .collect();
    let own = entry.iter().position(|l| l.starts_with('[')).unwrap();
    let children = &entry[own + 1..];
    assert_eq!(children.len(), 2, "{report}");
    for callee in ["backward_target", "never_b"] {
        let line = format!("                0.00    0.00       0/0           {callee} [");
        assert!(
            children.iter().any(|c| c.starts_with(&line)),
            "no static arc work -> {callee}:\n{report}"
        );
    }
    // Without -c the run's arcs alone: work has no children.
    let plain = run_ok(
        Command::new(&m).current_dir(&*dir).args(["-b", "-q", "sc"]),
        "mslprof",
    );
    assert!(!plain.contains("backward_target"), "{plain}");
}

/// `-c` on an mslprof profile: a never-taken call through the PLT resolves to the library function it
/// reaches, which shows as a `0/0` child of the caller; the taken call keeps its exact count.
#[test]
fn static_call_graph_resolves_plt_calls_across_modules() {
    if !tools_present() {
        return;
    }
    let ws = Workspace::new();
    let dir = ws.path();
    let fx = mslprof_tests::analyzer::fixtures();
    ws.shared_library(
        "libsc.so",
        &[fx.join("static_calls_lib.c")],
        &["-pg", "-O0"],
    );
    let prog = ws.program(
        "scmain",
        &[fx.join("static_calls_main.c")],
        &["-pg", "-O0", "-L.", "-lsc"],
    );
    let out = ws
        .command_with_runtime(&prog)
        .env("MSLPROF_PROFILE", "a.out:libsc.so")
        .output()
        .expect("run scmain");
    mslprof_tests::assert_success(&out, "scmain under the runtime");
    let report = |extra: &[&str]| {
        let mut c = Command::new(mslprof_tests::analyzer_binary());
        c.current_dir(dir)
            .args(["-b", "-q"])
            .args(extra)
            .arg("gmon.out");
        run_ok(&mut c, "mslprof")
    };
    let with = report(&["-c"]);
    let main_entry = with
        .split("-----------------------------------------------\n")
        .find(|e| {
            e.lines()
                .any(|l| l.starts_with('[') && l.contains(" main ["))
        })
        .unwrap_or_else(|| panic!("no entry for main:\n{with}"));
    assert!(
        main_entry.contains("       1/1           lib_used [")
            && main_entry.contains("       0/0           lib_unused ["),
        "{with}"
    );
    let without = report(&[]);
    assert!(!without.contains("lib_unused"), "{without}");
}
