//! Golden files for mslprof's own multi-module report (the tool's output, not the GNU-compatible one):
//! `tests/golden/mslprof/gmon.out` is a profile libmslprof.so wrote for a real run of the program there
//! (`app`, linked to the `-pg` library `libcore.so`, which calls back into it, loading and closing the
//! `-pg` plugin `libplugin.so` twice), committed with the three binaries it names so that the report is
//! the same on every machine. Each `*.txt` is `mslprof`'s report of it with the options in [`CASES`]:
//! the notes above the flat profile, the module-index column, module-qualified names, the call graph across
//! modules, the two load instances, the index and the module table.
//!
//! Regenerating (then read `git diff tests/golden/mslprof` before committing):
//! - `MSLPROF_REGENERATE_GOLDEN=1 cargo test -p mslprof-tests --test mslprof_golden` rewrites the `*.txt`
//!   from the current `mslprof`, for a deliberate change of the report;
//! - `MSLPROF_REGENERATE_GOLDEN=record cargo test -p mslprof-tests --test mslprof_golden` first rebuilds
//!   the binaries from the sources there with `cc`, runs `app` under the current runtime, and commits its
//!   profile as `gmon.out` (module paths made relative to the folder, see [`record`]), then rewrites the
//!   `*.txt`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mslprof_format::model::Profile;
use mslprof_tests::Workspace;
use mslprof_tests::analyzer::first_difference;
use mslprof_tests::loader::{instances, is_unloaded};

/// Golden file, then the options given before `gmon.out`.
const CASES: &[(&str, &str)] = &[
    ("default.txt", ""),
    ("b.txt", "-b"),
    ("b_p.txt", "-b -p"),
    ("b_q.txt", "-b -q"),
    ("b_all_modules.txt", "-b --all-modules"),
    ("b_separate_instances.txt", "-b --separate-instances"),
    ("b_p_share_of_process.txt", "-b -p --share-of=process"),
    ("b_p_q_libcore.txt", "-b -plibcore.so: -qwork@libplugin.so"),
    ("i.txt", "-i"),
];

/// The modules the recorded run profiles (the runtime too: the module table marks it as profiling
/// overhead).
const PROFILED: &str = "a.out:libcore.so:libplugin.so:libmslprof.so";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/mslprof")
}

fn mslprof(args: &[&str]) -> Output {
    Command::new(mslprof_tests::analyzer_binary())
        .current_dir(golden_dir())
        .args(args)
        .output()
        .expect("run mslprof")
}

#[test]
fn mslprof_reports_match_golden_files() {
    let mode = std::env::var("MSLPROF_REGENERATE_GOLDEN").ok();
    if mode.as_deref() == Some("record") {
        record(&golden_dir());
    }
    for (file, opts) in CASES {
        let mut args: Vec<&str> = opts.split_whitespace().collect();
        args.push("gmon.out");
        let out = mslprof(&args);
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "mslprof {opts}: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let path = golden_dir().join(file);
        if mode.is_some() {
            std::fs::write(&path, &out.stdout).unwrap();
            continue;
        }
        let want = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Some((line, got, want)) = first_difference(&out.stdout, &want) {
            panic!(
                "mslprof {opts} differs from {file} at line {line}:\n  got:  {got:?}\n  want: {want:?}"
            );
        }
    }
    // Naming the program on the command line, as with gprof, gives the report of the recorded program.
    let named = mslprof(&["-b", "app", "gmon.out"]);
    assert!(named.status.success(), "{named:?}");
    assert_eq!(
        first_difference(&named.stdout, &mslprof(&["-b", "gmon.out"]).stdout),
        None,
        "`mslprof -b app gmon.out` differs from `mslprof -b gmon.out`"
    );
}

/// Builds the golden program from the sources in `golden` in a scratch folder, runs it under the runtime
/// and writes its profile and the three binaries into `golden`. The paths the profile records for the
/// fixture's modules and the runtime become bare file names (relative to `golden`, where the report
/// runs), so that it names no folder of the machine that recorded it.
fn record(golden: &Path) {
    let ws = Workspace::new();
    for source in ["start.c", "app.c", "core.c", "plugin.c"] {
        std::fs::copy(golden.join(source), ws.join(source)).unwrap();
    }
    // Sources by relative name, so that the symbol tables' file symbols name no scratch folder.
    for command in [
        "-O1 -c start.c",
        "-pg -O1 -fPIC -shared -o libcore.so core.c",
        "-pg -O1 -fPIC -shared -o libplugin.so plugin.c",
        "-pg -O1 -o app start.o app.c -L. -lcore -Wl,-rpath,$ORIGIN",
    ] {
        ws.cc(command.split(' '));
    }
    let out = mslprof_tests::run(
        ws.command_with_runtime(&ws.join("app"))
            .env("MSLPROF_PROFILE", PROFILED)
            .env("MSLPROF_HZ", "1000"),
    );
    mslprof_tests::assert_success(&out, "the golden program");
    let mut profile = ws.profile("gmon.out");
    let plugins = instances(&profile, "libplugin.so");
    assert!(
        plugins.len() == 2 && plugins.iter().all(|m| is_unloaded(m)),
        "libplugin.so is loaded and closed twice"
    );
    relative_paths(&mut profile, ws.path());
    let mut bytes = Vec::new();
    mslprof_format::write(&profile, &mut bytes).unwrap();
    std::fs::write(golden.join("gmon.out"), bytes).unwrap();
    for binary in ["app", "libcore.so", "libplugin.so"] {
        std::fs::copy(ws.join(binary), golden.join(binary)).unwrap();
    }
}

/// Replaces the recorded paths of the modules built in `scratch` (absolute, or relative as `dlopen` was
/// given them) and of the runtime by their file names; system libraries keep theirs.
fn relative_paths(profile: &mut Profile, scratch: &Path) {
    let local = |path: &[u8]| {
        let path = Path::new(std::str::from_utf8(path).unwrap_or(""));
        path.starts_with(scratch)
            || path.is_relative()
            || path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libmslprof.so"))
    };
    for m in &mut profile.modules {
        if !m.path.is_empty() && local(&m.path) {
            m.path = m.name.clone();
        }
    }
    if local(&profile.header.program_path) {
        profile.header.program_path = profile.header.program_name.clone();
    }
}
