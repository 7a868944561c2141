//! The runtime's stack walker and framehop (samply's unwinder) agree on a real stack: `unwind_compare --check`
//! (tests/src/bin) recurses until its stack is 30 frames deep, then walks it twice from the same registers with
//! the `test-hooks` runtime's walk (`mslprof_test_walk_here`) and with framehop, each with a cold rule cache and
//! with a warm one, and fails unless every walk gives the same frames, the runtime's reaching the outermost one.
//! The runtime's warm walks must take most of their rules from its cache, its cold walks none.

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
    // Two walks of 30 lookups each: cold, all misses; warm, the second walk's rules cached but where two of
    // the addresses share an entry of the direct-mapped cache (rare among 30 in 1024 entries).
    let cache_line = lines.next().unwrap_or_default();
    let counts: Vec<u64> = cache_line
        .strip_prefix("runtime cache: cold ")
        .map(|rest| {
            rest.split([' ', ','])
                .filter(|word| word.parse::<u64>().is_ok())
                .map(|word| word.parse().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    let [cold_hits, cold_misses, warm_hits, warm_misses] = counts[..] else {
        panic!("no cache counts in\n{stdout}");
    };
    assert_eq!((cold_hits, cold_misses), (0, 60), "{cache_line}");
    assert_eq!(warm_hits + warm_misses, 60, "{cache_line}");
    assert!(warm_hits >= 25, "{cache_line}");
    let mut distinct = frames.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        30,
        "every level is its own function: {frames:x?}"
    );
}
