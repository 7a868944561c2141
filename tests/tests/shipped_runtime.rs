//! The `libmslprof.so` that `cargo build` ships, in whichever profile the tests were built (CI runs them in
//! debug and in release): preloaded into a trivial program it loads, leaves the program's behaviour alone and
//! writes a profile; and it carries no test scaffolding.

use mslprof_tests::{Workspace, fixtures_dir, histogram_total, module, run, runtime_library};
use object::{Object, ObjectSymbol};

#[test]
fn shipped_runtime_preloads_into_a_trivial_program_and_writes_a_profile() {
    let ws = Workspace::new();
    let program = ws.program("trivial", &[fixtures_dir("shipped").join("trivial.c")], &[]);
    let output = run(&mut ws.command_with_runtime(&program));
    assert_eq!(
        output.status.code(),
        Some(3),
        "the program's own exit status; stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.stdout, b"hello from trivial\n");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "",
        "the runtime prints nothing on a normal run"
    );
    let profile = ws.profile("gmon.out");
    let main = module(&profile, "trivial");
    assert!(
        histogram_total(main) > 0,
        "300 ms of CPU in the program took no sample"
    );
    module(&profile, "libmslprof.so");
}

#[test]
fn shipped_runtime_exports_no_test_hooks() {
    let bytes = std::fs::read(runtime_library()).expect("reading libmslprof.so");
    let file = object::File::parse(&*bytes).expect("libmslprof.so is an ELF file");
    let exported: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect();
    assert!(
        exported.iter().any(|name| name == "mcount"),
        "the dynamic symbol table was read: {exported:?}"
    );
    let hooks: Vec<&String> = exported
        .iter()
        .filter(|name| name.starts_with("mslprof_test"))
        .collect();
    assert!(hooks.is_empty(), "test hooks exported: {hooks:?}");
}

/// What `path` is now: its size and modification time, or nothing.
fn file_state(path: &std::path::Path) -> Option<(u64, std::time::SystemTime)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.len(), metadata.modified().ok()?))
}

#[test]
fn ld_profile_naming_one_library_writes_nothing_outside_the_scratch_folder() {
    // glibc's ld.so starts its own profiler when LD_PROFILE names exactly one library and writes
    // `$LD_PROFILE_OUTPUT/NAME.profile`, `/var/tmp` by default; the test helpers point it into the scratch
    // folder (and the runtime may keep ld.so from profiling at all).
    let ws = Workspace::new();
    let program = ws.program("trivial", &[fixtures_dir("shipped").join("trivial.c")], &[]);
    let system_file = std::path::Path::new("/var/tmp/libc.so.6.profile");
    let before = file_state(system_file);
    let output = run(ws
        .command_with_runtime(&program)
        .env("LD_PROFILE", "libc.so.6"));
    assert_eq!(output.status.code(), Some(3));
    assert_eq!(output.stdout, b"hello from trivial\n");
    assert_eq!(
        file_state(system_file),
        before,
        "{} changed",
        system_file.display()
    );
    module(&ws.profile("gmon.out"), "libc.so.6");
}
