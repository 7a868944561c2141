//! The analyzer with the real runtime: `mslprof demo` (three modules built here, run under
//! libmslprof.so) reports exact call counts in every module, `mslprof run` profiles a program, and
//! `mslprof export` writes per-module GNU gmon.out files that GNU gprof reads.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn target_file(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --all-targets` first",
        path.display()
    );
    path
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn mslprof(dir: &Path, args: &[&str]) -> Output {
    target_file("libmslprof.so");
    Command::new(target_file("mslprof"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run mslprof")
}

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
    assert!(report.contains("<cycle 1 as a whole>"), "{report}");
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
    let dir = std::env::temp_dir().join(format!("mslprof-an-rt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../analyzer/demo");
    let cc = |args: &[&str]| {
        let st = Command::new("cc")
            .args(args)
            .current_dir(&dir)
            .status()
            .unwrap();
        assert!(st.success(), "cc {args:?}");
    };
    let text = demo.join("text.c");
    let shapes = demo.join("shapes.c");
    let main = demo.join("demo.c");
    cc(&[
        "-pg",
        "-O1",
        "-fPIC",
        "-shared",
        "-o",
        "libtext.so",
        text.to_str().unwrap(),
    ]);
    cc(&[
        "-pg",
        "-O1",
        "-fPIC",
        "-shared",
        "-o",
        "libshapes.so",
        shapes.to_str().unwrap(),
        "-lm",
    ]);
    cc(&[
        "-pg",
        "-O1",
        "-o",
        "demo",
        main.to_str().unwrap(),
        "-L.",
        "-lshapes",
        "-ltext",
        "-Wl,-rpath,$ORIGIN",
    ]);
    let out = mslprof(&dir, &["run", "-b", "-p", "./demo"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(calls(flat_line(&report, "text_count_words")), 200);
    assert!(
        dir.join("gmon.out").exists(),
        "run leaves the profile in the working directory"
    );

    let out = mslprof(&dir, &["export", "gmon.out", "gnu"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gnu = dir.join("gnu/gmon.libtext.so.out");
    assert!(gnu.exists(), "{}", String::from_utf8_lossy(&out.stdout));
    let g = Command::new("gprof")
        .current_dir(&dir)
        .args(["-b", "-p", "libtext.so", gnu.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        g.status.success(),
        "gprof: {}",
        String::from_utf8_lossy(&g.stderr)
    );
    let flat = String::from_utf8_lossy(&g.stdout);
    // Calls inside libtext.so keep their counts in GNU gprof; calls from other modules have no caller there.
    assert_eq!(calls(flat_line(&flat, "text_even")), 11, "{flat}");
    assert_eq!(calls(flat_line(&flat, "text_odd")), 10, "{flat}");
}
