//! The runtime's stack walker and framehop (samply's unwinder) agree on a real stack: `unwind_compare --check`
//! (tests/src/bin) recurses until its stack is 30 frames deep, then walks it from the same registers with the
//! `test-hooks` runtime's walk (`mslprof_test_walk_here`) and with framehop, cold cache and warm, and fails
//! unless every walk gives the same frames, the runtime's reaching the outermost one.

use std::path::Path;

use mslprof_tests::{Workspace, assert_success, run};

#[test]
fn the_runtime_and_framehop_find_the_same_30_frames_on_one_stack() {
    let workspace = Workspace::new();
    let program = Path::new(env!("CARGO_BIN_EXE_unwind_compare"));
    let output = run(workspace
        .command_with_test_hooks_runtime(program)
        .args(["--check", "30"]));
    assert_success(&output, "unwind_compare --check 30");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("agree 30 30"), "stdout:\n{stdout}");
    let frames: Vec<u64> = lines
        .next()
        .and_then(|line| line.strip_prefix("30 frames ["))
        .and_then(|line| line.strip_suffix(']'))
        .unwrap_or_else(|| panic!("no frame list in\n{stdout}"))
        .split(' ')
        .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).expect("a hex address"))
        .collect();
    assert_eq!(frames.len(), 30, "{frames:x?}");
    assert!(
        frames.iter().all(|&a| a != 0),
        "a frame outside every module: {frames:x?}"
    );
    let mut distinct = frames.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        30,
        "every level is its own function: {frames:x?}"
    );
}
