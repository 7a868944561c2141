//! Issue 15: the profiler's own time is a row of the flat profile, marked as overhead, with the same share
//! as in the module table; percentages say what 100 % is.

use std::path::Path;
use std::process::Command;

use mslprof_tests::analyzer::{Scratch, build_bounds_pg, scratch};
use mslprof_tests::{analyzer_binary, assert_success, run, runtime_library};

fn report(dir: &Path, args: &[&str]) -> String {
    let out = run(Command::new(analyzer_binary()).current_dir(dir).args(args));
    assert_success(&out, "mslprof");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The share on the first line containing `what`: its field ending in `%` (module table), else its first
/// field (flat profile).
fn share_on_line(text: &str, what: &str) -> Option<String> {
    let line = text.lines().find(|l| l.contains(what))?;
    let mut fields = line.split_whitespace();
    let share = line
        .split_whitespace()
        .find(|w| w.ends_with('%'))
        .or_else(|| fields.next())?;
    Some(share.trim_end_matches('%').to_string())
}

/// The bounds fixture (`-pg`) run under the runtime with every module selected, so that the runtime's
/// `mcount` is sampled too: its scratch folder and the `-b -p --all-modules` report.
fn profiled_with_overhead(name: &str) -> (Scratch, String) {
    let dir = scratch(name);
    build_bounds_pg(&dir);
    let out = run(Command::new(dir.join("prog"))
        .arg("30000000")
        .current_dir(&*dir)
        .env("LD_LIBRARY_PATH", &*dir)
        .env("LD_PRELOAD", runtime_library())
        .env("MSLPROF_HZ", "1000")
        .env_remove("MSLPROF_PROFILE")
        .env_remove("LD_PROFILE"));
    assert_success(&out, "prog");
    let text = report(&dir, &["-b", "-p", "--all-modules", "prog", "gmon.out"]);
    (dir, text)
}

#[test]
fn overhead_row_matches_module_table_and_shares_say_what_they_are() {
    let (dir, text) = profiled_with_overhead("report-shares");
    let flat =
        share_on_line(&text, "[mslprof_overhead]").expect("overhead row in the flat profile");
    let table =
        share_on_line(&text, "libmslprof.so (profiling overhead)").expect("module table row");
    assert_eq!(flat, table, "{text}");
    assert!(flat.parse::<f64>().unwrap() > 0.0, "{text}");
    assert!(text.contains("Percentages are of the "), "{text}");

    let hidden = report(&dir, &["-b", "-p", "--no-overhead", "prog", "gmon.out"]);
    assert!(!hidden.contains("[mslprof_overhead]"), "{hidden}");

    // Over the whole process, the shares of the rows are those of the module table.
    let process = report(
        &dir,
        &["-b", "-p", "--share-of=process", "prog", "gmon.out"],
    );
    assert!(process.contains("Percentages are of all "), "{process}");
    assert_eq!(
        share_on_line(&process, "[mslprof_overhead]"),
        share_on_line(&process, "libmslprof.so (profiling overhead)"),
        "{process}"
    );
}

/// The shares in one module-table row: (of all samples, of the program's own samples), the second `None`
/// where the row has none (the overhead row).
fn table_shares(text: &str, module: &str) -> Option<(f64, Option<f64>)> {
    let table = text.split_once("\nModules\n")?.1;
    let line = table
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == module))?;
    let mut shares = line
        .split_whitespace()
        .filter_map(|w| w.strip_suffix('%'))
        .map(|w| w.parse::<f64>().ok());
    Some((shares.next()??, shares.next().flatten()))
}

#[test]
fn the_module_table_gives_shares_of_the_programs_own_samples_beside_the_overhead() {
    let (_dir, text) = profiled_with_overhead("report-program-shares");
    assert!(text.contains(" index  samples  program  module"), "{text}");
    let (overhead, none) = table_shares(&text, "libmslprof.so").expect("overhead row");
    assert!(overhead > 0.0 && none.is_none(), "{text}");
    // Every other row: its share of all samples, scaled to the samples that are not the overhead's.
    let (share, program) = table_shares(&text, "prog").expect("program row");
    let program = program.expect("program share");
    let expected = share * 100.0 / (100.0 - overhead);
    assert!(
        (program - expected).abs() < 0.02,
        "{program} against {expected}: {text}"
    );
    assert!(
        text.contains("\n program: the share of the program's own samples"),
        "{text}"
    );
}
