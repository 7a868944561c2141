//! What the multi-module report says is true (issue 31): summed profiles sampled at different periods add
//! up in seconds, a function whose calls were counted only at the PLT gets no per-call figures, and
//! warnings go to stderr, never into the report. The profiles are the real run of
//! `tests/golden/mslprof` (copied into a scratch folder) and real runs of the PLT fixtures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mslprof_format::GnuTarget;
use mslprof_tests::analyzer::mslprof_ok;
use mslprof_tests::callcounts::run_ok;
use mslprof_tests::{Workspace, audit_library, fixtures_dir};

/// The recorded profile of `tests/golden/mslprof` and the binaries it names.
const GOLDEN_FILES: &[&str] = &["gmon.out", "app", "libcore.so", "libplugin.so"];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/mslprof")
}

/// A scratch folder with the golden profile and its binaries.
fn golden_copy() -> Workspace {
    let workspace = Workspace::new();
    for name in GOLDEN_FILES {
        std::fs::copy(golden_dir().join(name), workspace.join(name)).expect("copy golden file");
    }
    workspace
}

/// The flat profile's rows of `mslprof -b -p PROFILES`: name to self seconds.
fn self_seconds(dir: &Path, profiles: &[&str]) -> BTreeMap<String, f64> {
    let mut args = vec!["-b", "-p"];
    args.extend(profiles);
    let out = mslprof_ok(dir, &args);
    let text = String::from_utf8(out.stdout).expect("UTF-8 report");
    let rows: BTreeMap<String, f64> = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("time "))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let seconds = fields[2].parse().expect("self seconds");
            (fields.last().expect("name").to_string(), seconds)
        })
        .collect();
    assert!(!rows.is_empty(), "no flat profile rows:\n{text}");
    rows
}

/// Defect 2: the sum of a profile and a copy sampled three times as slowly (the same samples, each
/// standing for three periods) has, for every function, the seconds of the two reports added up, and
/// the report says that the periods differed. Before the fix the sum counted every sample at the first
/// file's period: the slow copy's time read a third of what it was.
#[test]
fn summed_profiles_sampled_at_different_periods_add_up_in_seconds() {
    let workspace = golden_copy();
    let bytes = std::fs::read(workspace.join("gmon.out")).expect("read gmon.out");
    let mut slow = mslprof_format::read(&bytes, GnuTarget::default()).expect("decode gmon.out");
    assert!(
        slow.header.sample_period_ns > 0,
        "the profile records its period"
    );
    slow.header.sample_period_ns *= 3;
    let mut written = Vec::new();
    mslprof_format::write(&slow, &mut written).expect("encode");
    std::fs::write(workspace.join("gmon.slow.out"), written).expect("write gmon.slow.out");

    let fast = self_seconds(workspace.path(), &["gmon.out"]);
    let slow = self_seconds(workspace.path(), &["gmon.slow.out"]);
    let sum = self_seconds(workspace.path(), &["gmon.out", "gmon.slow.out"]);
    assert_eq!(
        fast.keys().collect::<Vec<_>>(),
        sum.keys().collect::<Vec<_>>()
    );
    for (name, seconds) in &sum {
        let parts = fast[name] + slow[name];
        // Each figure is rounded to 0.01 s.
        assert!(
            (seconds - parts).abs() <= 0.0151,
            "{name}: the sum says {seconds:.2} s, its parts {:.2} s + {:.2} s",
            fast[name],
            slow[name]
        );
    }
    let total = |rows: &BTreeMap<String, f64>| rows.values().sum::<f64>();
    assert!(
        total(&slow) > 2.5 * total(&fast),
        "{slow:?} against {fast:?}"
    );

    let report = mslprof_ok(workspace.path(), &["-b", "-p", "gmon.out", "gmon.slow.out"]);
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.contains("The profiles summed were sampled at different periods"),
        "{text}"
    );
}

/// Defect 3: a function of a module without `-pg` whose calls were counted at the PLT (all of its
/// samples, only the calls from other modules) shows its calls but no self/call or total/call, and the
/// note under the table says why. Before the fix every (PLT) row divided its time by those calls.
#[test]
fn functions_counted_at_the_plt_get_no_per_call_figures() {
    let workspace = Workspace::new();
    let source = |name: &str| fixtures_dir("plt").join(name);
    workspace.shared_library("libleaf.so", &[source("leaf.c")], &[]);
    let program = workspace.program(
        "plt_main",
        &[source("plt_main.c")],
        &["-L.", "-lleaf", "-ldl"],
    );
    let mut command = workspace.command_with_runtime(&program);
    command.env("LD_AUDIT", audit_library());
    run_ok(&mut command);

    let out = mslprof_ok(workspace.path(), &["-b", "-p", "gmon.out"]);
    let text = String::from_utf8(out.stdout).expect("UTF-8 report");
    let plt_rows: Vec<&str> = text.lines().filter(|l| l.ends_with(" (PLT)")).collect();
    let leaf = plt_rows
        .iter()
        .find(|l| l.ends_with(" plt_leaf (PLT)"))
        .unwrap_or_else(|| panic!("no plt_leaf (PLT) row:\n{text}"));
    assert!(
        leaf.split_whitespace().any(|f| f == "1000000"),
        "plt_leaf's million calls: {leaf}"
    );
    for row in &plt_rows {
        // % time, cumulative and self seconds, calls, then (the per-call columns left blank) the module
        // index, the name and the mark.
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            fields.len(),
            7,
            "a (PLT) row with per-call figures: {row}\n{text}"
        );
    }
    assert!(text.contains("so no per-call figures are given"), "{text}");
    // No function with all its calls counted has time: the unit is plain seconds, not gprof's `Ts/call`.
    assert!(
        text.contains("  s/call  ") && !text.contains("Ts/call"),
        "{text}"
    );
    // Every module is profiled (LD_PROFILE unset).
    assert!(!text.contains("Modules loaded but not profiled"), "{text}");
}

/// Defect 4: the warnings about module files (one missing, one whose build-id differs from the profiled
/// one) are printed on stderr; the report on stdout holds none of them. Before the fix they opened the
/// report on stdout.
#[test]
fn warnings_about_module_files_go_to_stderr_not_into_the_report() {
    let workspace = golden_copy();
    std::fs::remove_file(workspace.join("libplugin.so")).expect("remove libplugin.so");
    // Another file in libcore.so's place: same name, another build-id.
    std::fs::copy(golden_dir().join("app"), workspace.join("libcore.so")).expect("copy");

    for args in [&["-b", "-p", "gmon.out"][..], &["gmon.out"][..]] {
        let out = mslprof_ok(workspace.path(), args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stdout.contains("warning"),
            "{args:?}: stdout has a warning:\n{stdout}"
        );
        assert!(
            !stdout.contains("build-id") && !stdout.contains("No such file"),
            "{args:?}: {stdout}"
        );
        assert!(
            stderr.contains("mslprof: warning: libplugin.so: No such file or directory")
                && stderr.contains("mslprof: warning: libcore.so: build-id differs"),
            "{args:?}: stderr:\n{stderr}"
        );
        assert!(stdout.contains("Flat profile:"), "{stdout}");
    }
}

/// Issue 35: samples in the audit module's PLT-counting stubs are the profiler's own cost, counted in
/// libmslprof.so (the `[mslprof_overhead]` row), never outside every module. Before, the stubs' anonymous
/// memory was in no module: every sample there was `<outside any module>`.
#[test]
fn samples_in_the_plt_stubs_are_counted_as_the_profilers_own() {
    let workspace = Workspace::new();
    let source = |name: &str| fixtures_dir("plt").join(name);
    workspace.shared_library("libleaf.so", &[source("leaf.c")], &[]);
    let program = workspace.program("plt_hot", &[source("plt_hot.c")], &["-L.", "-lleaf"]);
    let mut command = workspace.command_with_runtime(&program);
    command
        .arg("300")
        .env("LD_AUDIT", audit_library())
        .env("MSLPROF_HZ", "2000");
    run_ok(&mut command);

    let profile = workspace.profile("gmon.out");
    let runtime = profile
        .modules
        .iter()
        .find(|m| m.name == b"libmslprof.so")
        .expect("libmslprof.so in the profile");
    assert!(
        runtime.samples > 0,
        "{} samples, none in the runtime",
        profile.header.total_samples
    );
    assert_eq!(
        profile.header.unknown_samples, 0,
        "samples outside every module ({} of {})",
        profile.header.unknown_samples, profile.header.total_samples
    );
}
