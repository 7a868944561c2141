//! Helpers of the analyzer tests (`tests/tests/analyzer*.rs`): building the `-pg` fixtures, running
//! `mslprof` and GNU gprof side by side, and saying where two reports first differ.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `mslprof ARGS` run in `dir`.
pub fn mslprof(dir: &Path, args: &[&str]) -> Output {
    crate::run(
        Command::new(crate::analyzer_binary())
            .current_dir(dir)
            .args(args),
    )
}

/// As [`mslprof`], and panics unless it succeeded.
pub fn mslprof_ok(dir: &Path, args: &[&str]) -> Output {
    let out = mslprof(dir, args);
    crate::assert_success(&out, &format!("mslprof {args:?}"));
    out
}

/// The columns of a call-graph line, and the name it shows (the column before the index).
pub fn graph_columns(line: &str) -> (Vec<&str>, &str) {
    let cols: Vec<&str> = line.split_whitespace().collect();
    let name = cols.len().checked_sub(2).map_or("", |i| cols[i]);
    (cols, name)
}

/// The call graph's entry of `name` in `report`: its lines from the first caller to the dashes.
pub fn graph_entry<'r>(report: &'r str, name: &str) -> Vec<&'r str> {
    let graph = &report[report.find("Call graph").expect("a call graph")..];
    let mut lines = Vec::new();
    for line in graph.lines() {
        if !line.starts_with("---") {
            lines.push(line);
            continue;
        }
        if lines
            .iter()
            .any(|l| l.starts_with('[') && graph_columns(l).1 == name)
        {
            return lines;
        }
        lines.clear();
    }
    panic!("no call-graph entry for {name} in:\n{report}");
}

/// The columns of the caller or callee line of `entry` naming `name`.
pub fn graph_line<'r>(entry: &[&'r str], name: &str) -> Vec<&'r str> {
    entry
        .iter()
        .map(|l| graph_columns(l))
        .find(|(cols, shown)| cols.first().is_some_and(|c| !c.starts_with('[')) && *shown == name)
        .map(|(cols, _)| cols)
        .unwrap_or_else(|| panic!("no line naming {name} in {entry:#?}"))
}

/// `tests/fixtures/analyzer/`.
pub fn fixtures() -> PathBuf {
    crate::fixtures_dir("analyzer")
}

/// `tests/golden/analyzer/lua/`: the Lua binary, its gmon.out and gprof's reports of it.
pub fn lua_golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/analyzer/lua")
}

/// `tests/golden/analyzer/lua-g`: the same Lua built with `-g`, for the line-level options.
pub fn lua_debug_golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/analyzer/lua-g")
}

/// Whether `tool` is installed: `tool --version` can be started. Its exit status is not asked for:
/// valgrind 3.19's `callgrind_annotate --version` prints its version and exits with 255.
pub fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Whether gprof and the compilers are there; prints `SKIPPED: ...` naming the first one missing.
pub fn tools_present() -> bool {
    for t in ["gprof", "gcc", "g++"] {
        if !have(t) {
            eprintln!("SKIPPED: `{t}` is not installed");
            return false;
        }
    }
    true
}

/// A fresh scratch directory for one test (left in place afterwards, for a look at a failure).
pub fn scratch(name: &str) -> Scratch {
    let dir =
        std::env::temp_dir().join(format!("mslprof-analyzer-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    Scratch(dir)
}

/// A test's own folder under the system temp dir: removed when the test passes, kept (and named in the
/// failure output) when it fails, so the files gprof and mslprof disagreed on can be looked at.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for inspection", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Compile `sources` (fixture file names) with `flags` into `dir/prog`, run it there, return the
/// gmon.out path (renamed to `gmon_name`).
pub fn build_and_run(
    dir: &Path,
    compiler: &str,
    flags: &[&str],
    sources: &[&str],
    prog: &str,
    gmon_name: &str,
) -> PathBuf {
    let mut args: Vec<OsString> = flags.iter().chain(&["-o", prog]).map(Into::into).collect();
    args.extend(sources.iter().map(|s| fixtures().join(s).into_os_string()));
    crate::compile(compiler, dir, args);
    let run = Command::new(dir.join(prog))
        .current_dir(dir)
        .stdout(Stdio::null())
        .status()
        .expect("run fixture");
    assert!(run.success(), "{prog} failed");
    let gmon = dir.join(gmon_name);
    std::fs::rename(dir.join("gmon.out"), &gmon).expect("fixture wrote gmon.out");
    gmon
}

/// `recursion.c` built with `gcc -pg -O0` as `dir/rec` and run once; its profile is `dir/<gmon_name>`.
pub fn build_and_run_recursion(dir: &Path, gmon_name: &str) -> PathBuf {
    build_and_run(
        dir,
        "gcc",
        &["-pg", "-O0"],
        &["recursion.c"],
        "rec",
        gmon_name,
    )
}

/// Run `program args` in `dir`.
pub fn run_in(dir: &Path, program: &Path, args: &[String]) -> Output {
    Command::new(program)
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run")
}

/// Command-line options written as one string.
pub fn split(opts: &str) -> Vec<String> {
    opts.split_whitespace().map(String::from).collect()
}

/// Where `ours` first differs from `want`, line by line: (1-based line number, our line, wanted line),
/// `<end>` standing for a missing line; `None` when they are equal.
pub fn first_difference(ours: &[u8], want: &[u8]) -> Option<(usize, String, String)> {
    if ours == want {
        return None;
    }
    let (a, b) = (String::from_utf8_lossy(ours), String::from_utf8_lossy(want));
    let line = a
        .lines()
        .zip(b.lines())
        .position(|(x, y)| x != y)
        .unwrap_or(0);
    let nth = |text: &str| text.lines().nth(line).unwrap_or("<end>").to_string();
    Some((line + 1, nth(&a), nth(&b)))
}

/// Assert mslprof and gprof print the same bytes and exit the same way for each option set.
pub fn assert_same(dir: &Path, option_sets: &[&str], files: &[&str]) {
    let m = crate::analyzer_binary();
    for opts in option_sets {
        let mut args = split(opts);
        args.extend(files.iter().map(|s| s.to_string()));
        let ours = run_in(dir, &m, &args);
        let theirs = run_in(dir, Path::new("gprof"), &args);
        if let Some((line, got, want)) = first_difference(&ours.stdout, &theirs.stdout) {
            panic!(
                "`mslprof {}` differs from gprof at line {line}:\n  mslprof: {got:?}\n  gprof:   {want:?}\nstderr: {}",
                args.join(" "),
                String::from_utf8_lossy(&ours.stderr)
            );
        }
        assert!(
            !ours.stdout.is_empty() || theirs.stdout.is_empty(),
            "empty report for {opts}"
        );
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "exit status for {opts}"
        );
    }
}

/// Builds the bundled demo (`analyzer/demo/`: the program `demo` and its two `-pg` libraries
/// libshapes.so and libtext.so) in `ws`; returns the program.
pub fn build_demo(ws: &crate::Workspace) -> PathBuf {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../analyzer/demo");
    ws.shared_library("libtext.so", &[demo.join("text.c")], &["-pg"]);
    ws.shared_library("libshapes.so", &[demo.join("shapes.c")], &["-pg"]);
    // libshapes.so needs libm; shared_library() puts flags before the sources, so link it here.
    ws.program(
        "demo",
        &[demo.join("demo.c")],
        &["-pg", "-L.", "-lshapes", "-ltext", "-lm"],
    )
}

/// Builds `libbounds.so` and `prog` linked to it (RUNPATH `$ORIGIN`), both `-pg -O1`, from
/// `tests/fixtures/bounds/` in `dir`.
pub fn build_bounds_pg(dir: &Path) {
    let src = crate::fixtures_dir("bounds");
    let (library, main) = (src.join("libbounds.c"), src.join("bounds_main.c"));
    let (library, main) = (library.to_str().unwrap(), main.to_str().unwrap());
    crate::cc(
        dir,
        [
            "-pg",
            "-O1",
            "-fPIC",
            "-shared",
            "-o",
            "libbounds.so",
            library,
        ],
    );
    crate::cc(
        dir,
        [
            "-pg",
            "-O1",
            "-o",
            "prog",
            "-Wl,-rpath,$ORIGIN",
            main,
            "-L.",
            "-lbounds",
        ],
    );
}
