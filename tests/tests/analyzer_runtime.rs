//! The analyzer with the real runtime: `mslprof demo` (three modules built here, run under
//! libmslprof.so) reports exact call counts in every module, `mslprof run` profiles a program, and
//! `mslprof export` writes per-module GNU gmon.out files that GNU gprof reads.

use std::process::{Command, Output};

use mslprof_tests::Workspace;
use mslprof_tests::analyzer::{graph_entry, graph_line, have, mslprof};

fn flat_line<'a>(report: &'a str, name: &str) -> &'a str {
    report
        .lines()
        .take_while(|l| !l.contains("Call graph"))
        .find(|l| l.ends_with(&format!("  {name}")))
        .unwrap_or_else(|| panic!("{name} not in the flat profile:\n{report}"))
}

/// The calls column of a flat-profile line.
fn calls(line: &str) -> u64 {
    line.split_whitespace()
        .nth(3)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn demo_reports_exact_calls_in_every_module() {
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return;
    }
    let dir = std::env::temp_dir();
    let out = mslprof(&dir, &["demo"]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 200 rounds: one call per round into each library; 12*200 passes over 24 words per round.
    assert_eq!(calls(flat_line(&report, "shapes_total_area")), 200);
    assert_eq!(calls(flat_line(&report, "text_count_words")), 200);
    assert_eq!(
        calls(flat_line(&report, "demo_score_word")),
        200 * 12 * 200 * 24
    );
    assert_eq!(calls(flat_line(&report, "text_even")), 11);
    // libm is not built with -pg: its sin (the variant IFUNC chose for this CPU) is counted through the PLT,
    // 12 000 000 calls from shapes_total_area (the figure issue 10 measured with a wrapper around sin).
    let sin = report
        .lines()
        .take_while(|l| !l.contains("Call graph"))
        .find(|l| {
            // Marked as counted at the PLT.
            l.strip_suffix(" (PLT)")
                .and_then(|l| l.rsplit(' ').next())
                .is_some_and(|n| n == "sin" || n.starts_with("__sin"))
        })
        .unwrap_or_else(|| panic!("no sin in the flat profile:\n{report}"));
    assert_eq!(calls(sin), 12_000_000, "{report}");
    assert!(
        report.contains("\n (PLT) calls counted at the PLT: "),
        "{report}"
    );
    assert!(
        report
            .lines()
            .any(|l| l.contains(" 12000000/12000000     shapes_total_area [")),
        "{report}"
    );
    assert!(report.contains("<cycle 1 as a whole>"), "{report}");
    // The demo samples at 1 kHz unless MSLPROF_HZ says otherwise.
    let asked = std::env::var("MSLPROF_HZ").unwrap_or_else(|_| "1000".into());
    assert!(
        report.contains(&format!(" ({asked} asked for; ")),
        "{report}"
    );
    assert!(report.contains("\u{c}\nModules\n"), "{report}");
    for m in ["libshapes.so", "libtext.so", "demo"] {
        assert!(
            report.lines().any(|l| l.contains(&format!("  {m} "))),
            "{m} missing from the module table"
        );
    }
}

#[test]
fn run_and_export_feed_gnu_gprof() {
    if !have("cc") || !have("gprof") {
        eprintln!("SKIPPED: no `cc` or `gprof`");
        return;
    }
    let ws = Workspace::new();
    let dir = ws.path();
    mslprof_tests::analyzer::build_demo(&ws);
    let out = mslprof(dir, &["run", "-b", "-p", "./demo"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The program's stdout is its own; the report goes to stderr.
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("Flat profile"),
        "no report on the program's stdout"
    );
    assert_eq!(calls(flat_line(&report, "text_count_words")), 200);
    assert!(
        dir.join("gmon.out").exists(),
        "run leaves the profile in the working directory"
    );

    let out = mslprof(dir, &["export", "gmon.out", "gnu"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gnu = dir.join("gnu/gmon.libtext.so.out");
    assert!(gnu.exists(), "{}", String::from_utf8_lossy(&out.stdout));
    let g = Command::new("gprof")
        .current_dir(dir)
        .args(["-b", "-p", "libtext.so", gnu.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        g.status.success(),
        "gprof: {}",
        String::from_utf8_lossy(&g.stderr)
    );
    let flat = String::from_utf8_lossy(&g.stdout);
    // Calls inside libtext.so keep their counts in GNU gprof, and so do calls from the program (from `_init`).
    assert_eq!(calls(flat_line(&flat, "text_count_words")), 200, "{flat}");
    assert_eq!(calls(flat_line(&flat, "text_even")), 11, "{flat}");
    assert_eq!(calls(flat_line(&flat, "text_odd")), 10, "{flat}");
}

/// Binaries that moved: with the library gone from its recorded path, `--binary-path DIR` finds it in DIR by
/// its build-id (under another name), and `MSLPROF_BINARY_PATH` finds it in a `.build-id/xx/rest.debug` tree;
/// without either, its functions are not named.
#[test]
fn moved_binaries_are_found_by_build_id() {
    let ws = Workspace::new();
    let dir = ws.path();
    mslprof_tests::analyzer::build_bounds_pg(dir);
    let ran = mslprof(dir, &["run", "--no-report", "--", "./prog", "1000"]);
    assert!(ran.status.success(), "{ran:?}");
    let id = {
        let out = Command::new("readelf")
            .args(["-n", "libbounds.so"])
            .current_dir(dir)
            .output()
            .expect("readelf");
        let notes = String::from_utf8_lossy(&out.stdout).into_owned();
        notes
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
            .unwrap_or_else(|| panic!("libbounds.so has a build-id: {notes}"))
    };
    let moved = dir.join("moved");
    std::fs::create_dir(&moved).unwrap();
    std::fs::rename(dir.join("libbounds.so"), moved.join("renamed.so")).unwrap();
    let tiny_calls = |out: &Output| {
        let report = String::from_utf8_lossy(&out.stdout).into_owned();
        report
            .lines()
            .take_while(|l| !l.contains("Call graph"))
            .find(|l| l.ends_with(" bounds_tiny"))
            .map(calls)
    };
    let lost = mslprof(dir, &["-b", "-p", "gmon.out"]);
    assert_eq!(tiny_calls(&lost), None, "{lost:?}");
    let found = mslprof(dir, &["--binary-path", "moved", "-b", "-p", "gmon.out"]);
    assert_eq!(tiny_calls(&found), Some(1000), "{found:?}");
    assert!(
        !String::from_utf8_lossy(&found.stderr).contains("libbounds"),
        "{found:?}"
    );

    let cache = dir.join("cache/.build-id").join(&id[..2]);
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::rename(
        moved.join("renamed.so"),
        cache.join(format!("{}.debug", &id[2..])),
    )
    .unwrap();
    let found = Command::new(mslprof_tests::analyzer_binary())
        .current_dir(dir)
        .env("MSLPROF_BINARY_PATH", "no-such-folder:cache")
        .args(["-b", "-p", "gmon.out"])
        .output()
        .expect("run mslprof");
    assert_eq!(tiny_calls(&found), Some(1000), "{found:?}");
}

/// Issue 32 end to end: the gprof manual's counter-example (`a` calls `foo(0)` a million times, `b` calls
/// `foo(1)` 20 times and spends all of foo's time) built with -pg, run under the real runtime, which
/// records the stacks; the report charges foo's time to b's line and none to a's, with the exact counts,
/// and `--estimate` gives gprof's split by counts (almost all to a).
#[test]
fn measured_call_graph_of_a_real_run_charges_foo_to_the_caller_that_spent_it() {
    let ws = Workspace::new();
    let source = mslprof_tests::fixtures_dir("stacks").join("gprof_counter.c");
    let program = ws.program("counter", &[source], &["-pg"]);
    let output = mslprof_tests::run(ws.command_with_runtime(&program).env("MSLPROF_HZ", "1000"));
    assert_eq!(output.status.code(), Some(3));
    let seconds = |fields: &[&str], at: usize| -> f64 { fields[at].parse().unwrap() };

    let report = mslprof(ws.path(), &["-b", "-q"]);
    assert!(report.status.success(), "{report:?}");
    let text = String::from_utf8_lossy(&report.stdout);
    let under_a = graph_line(&graph_entry(&text, "foo"), "a");
    let under_b = graph_line(&graph_entry(&text, "foo"), "b");
    assert_eq!(under_a[2], "1000000/1000020", "{text}");
    assert_eq!(under_b[2], "20/1000020", "{text}");
    let (time_a, time_b) = (seconds(&under_a, 0), seconds(&under_b, 0));
    assert!(
        time_b >= 0.1 && time_a <= 0.2 * (time_a + time_b),
        "foo's self time under a {time_a} s, under b {time_b} s:\n{text}"
    );

    let estimate = mslprof(ws.path(), &["-b", "-q", "--estimate"]);
    let text = String::from_utf8_lossy(&estimate.stdout);
    let (time_a, time_b) = (
        seconds(&graph_line(&graph_entry(&text, "foo"), "a"), 0),
        seconds(&graph_line(&graph_entry(&text, "foo"), "b"), 0),
    );
    assert!(
        time_a > 10.0 * time_b,
        "gprof's estimate: a {time_a} s, b {time_b} s:\n{text}"
    );
}
