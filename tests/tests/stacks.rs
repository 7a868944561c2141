//! Call stacks captured at samples by the runtime, under real programs (C fixtures in `fixtures/stacks`),
//! read back from the profile's STACKS section and resolved to function names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mslprof_format::model::{Profile, SourceFormat, module_flags, sampling_sources, stack_flags};
use mslprof_tests::callcounts::Symbols;
use mslprof_tests::{Workspace, fixtures_dir, read_profile, run};

fn source(name: &str) -> PathBuf {
    fixtures_dir("stacks").join(name)
}

/// The compiler flag that finds the fixtures' headers (`spin.h`, `perf_rings.h`).
fn include() -> String {
    format!("-I{}", fixtures_dir("stacks").display())
}

/// The fixture program `name` built from `name.c`, which may include the fixtures' headers.
fn stack_program(ws: &Workspace, name: &str) -> PathBuf {
    let include_flag = include();
    ws.program(
        name,
        &[source(&format!("{name}.c"))],
        &[include_flag.as_str()],
    )
}

/// One stack of the profile, its frames resolved to function names (`?` where unknown).
#[derive(Debug)]
struct Resolved {
    count: u64,
    flags: u32,
    functions: Vec<String>,
    keys: Vec<u32>,
}

/// The profile's stacks with function names: frame 0 looked up at its address, the others at `address - 1`.
fn resolved_stacks(profile: &Profile) -> Vec<Resolved> {
    let stacks = profile
        .stacks
        .as_ref()
        .expect("the profile has a STACKS section");
    let mut symbols: HashMap<u32, Symbols> = HashMap::new();
    let mut resolve = |key: u32, address: u64| -> String {
        // The vDSO has no file to read symbols from.
        let Some(module) = profile
            .modules
            .iter()
            .find(|m| m.key == key && !m.path.is_empty())
        else {
            return "?".to_string();
        };
        let symbols = symbols
            .entry(key)
            .or_insert_with(|| Symbols::of(Path::new(std::str::from_utf8(&module.path).unwrap())));
        symbols.function_at(address).unwrap_or("?").to_string()
    };
    stacks
        .records
        .iter()
        .filter(|r| r.count != 0)
        .map(|record| Resolved {
            count: record.count,
            flags: record.flags,
            functions: record
                .frames
                .iter()
                .enumerate()
                .map(|(i, f)| resolve(f.key, f.address.0 - u64::from(i > 0 && f.address.0 > 0)))
                .collect(),
            keys: record.frames.iter().map(|f| f.key).collect(),
        })
        .collect()
}

/// Runs `program args` under the runtime with `env`; checks the program's own exit status and output.
fn run_profiled(
    ws: &Workspace,
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    status: i32,
    stdout: &str,
) -> Profile {
    let output = run(ws
        .command_with_runtime(program)
        .args(args)
        .envs(env.iter().copied()));
    assert_eq!(
        output.status.code(),
        Some(status),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), stdout);
    read_profile(&ws.join("gmon.out"))
}

fn samples_where(stacks: &[Resolved], keep: impl Fn(&Resolved) -> bool) -> u64 {
    stacks.iter().filter(|s| keep(s)).map(|s| s.count).sum()
}

/// The function just outside `function` in a stack (its caller), if `function` is in it.
fn caller_of<'a>(stack: &'a Resolved, function: &str) -> Option<&'a str> {
    let at = stack.functions.iter().position(|f| f == function)?;
    stack.functions.get(at + 1).map(String::as_str)
}

#[test]
fn the_gprof_manuals_counter_example_charges_foo_to_b() {
    let ws = Workspace::new();
    let program = ws.program("counter", &[source("gprof_counter.c")], &[]);
    let profile = run_profiled(&ws, &program, &[], &[("MSLPROF_HZ", "1000")], 3, "done 1\n");
    assert_eq!(profile.format, SourceFormat::Mslprof { major: 1, minor: 5 });
    let stacks = resolved_stacks(&profile);
    let with_foo = samples_where(&stacks, |s| s.functions.iter().any(|f| f == "foo"));
    let under_b = samples_where(&stacks, |s| caller_of(s, "foo") == Some("b"));
    let under_a = samples_where(&stacks, |s| caller_of(s, "foo") == Some("a"));
    assert!(with_foo >= 20, "too few samples in foo: {stacks:#?}");
    assert!(
        under_b * 100 >= with_foo * 80 && under_a * 100 <= with_foo * 20,
        "foo: {with_foo} samples, {under_b} under b, {under_a} under a"
    );
    // And b's caller, main, beyond it.
    let through_main = samples_where(&stacks, |s| {
        caller_of(s, "foo") == Some("b") && caller_of(s, "b") == Some("main")
    });
    assert_eq!(through_main, under_b);
}

#[test]
fn a_library_without_frame_pointers_or_pg_shows_real_callers_up_to_main() {
    let ws = Workspace::new();
    let include_flag = include();
    let flags = ["-O2", "-fomit-frame-pointer", include_flag.as_str()];
    ws.shared_library("libhot.so", &[source("libhot.c")], &flags);
    let mut program_flags = flags.to_vec();
    program_flags.extend(["libhot.so"]);
    let program = ws.program("uses_libhot", &[source("uses_libhot.c")], &program_flags);
    let profile = run_profiled(&ws, &program, &[], &[("MSLPROF_HZ", "1000")], 4, "done 1\n");
    let stacks = resolved_stacks(&profile);
    let in_hot = samples_where(&stacks, |s| s.functions.first().is_some_and(|f| f == "hot"));
    let chain = ["hot", "lib_middle", "lib_entry", "outer", "main"];
    let full = samples_where(&stacks, |s| {
        s.functions.first().is_some_and(|f| f == "hot")
            && s.functions.windows(5).next().is_some_and(|w| w == chain)
    });
    assert!(in_hot >= 30, "too few samples in hot: {stacks:#?}");
    assert!(
        full * 100 >= in_hot * 95,
        "{full} of {in_hot} samples in hot have {chain:?}: {stacks:#?}"
    );
}

#[test]
fn recursion_ten_thousand_deep_is_truncated_at_the_limit_and_flagged() {
    let ws = Workspace::new();
    let program = stack_program(&ws, "recursion");
    for (depth, env) in [
        (128, vec![("MSLPROF_HZ", "1000")]),
        // 100 Hz: a debug-built runtime takes about 2 ms to walk 4096 frames, more than a 1 kHz period, so the
        // next sample would be due as the handler returns and land again where the last one did (a walk that
        // outlasts the period starves the program: runtime/README.md, "Call stacks").
        (
            4096,
            vec![("MSLPROF_HZ", "100"), ("MSLPROF_STACK_DEPTH", "4096")],
        ),
    ] {
        let profile = run_profiled(&ws, &program, &[], &env, 5, "depth 10000\n");
        assert_eq!(profile.stacks.as_ref().unwrap().max_depth, depth);
        let stacks = resolved_stacks(&profile);
        // From the first `recurse` frame (the leaf, or under clock_gettime) on, nothing but `recurse`.
        let deep = samples_where(&stacks, |s| {
            let first = s.functions.iter().position(|f| f == "recurse").unwrap_or(0);
            s.functions.len() == depth as usize
                && s.flags & stack_flags::TRUNCATED_DEPTH != 0
                && first <= 3
                && s.functions[first..].iter().all(|f| f == "recurse")
        });
        let all = samples_where(&stacks, |s| s.functions.iter().any(|f| f == "recurse"));
        assert!(all >= 10, "{stacks:#?}");
        let others: Vec<_> = stacks
            .iter()
            .filter(|s| s.functions.iter().any(|f| f == "recurse"))
            .filter(|s| {
                s.functions.len() != depth as usize || s.flags & stack_flags::TRUNCATED_DEPTH == 0
            })
            .map(|s| (s.count, s.functions.len(), s.flags))
            .collect();
        assert!(
            deep * 100 >= all * 95,
            "{deep} of {all} at depth {depth}; the others (count, depth, flags): {others:?}"
        );
    }
}

/// Samples in the handler's spin that reach the interrupted loop and main through the signal frame, and all
/// samples in the handler's spin.
fn through_signal_frame(stacks: &[Resolved]) -> (u64, u64) {
    let in_handler = |s: &Resolved| s.functions.first().is_some_and(|f| f == "handler_spin");
    let all = samples_where(stacks, in_handler);
    let through = samples_where(stacks, |s| {
        in_handler(s)
            && caller_of(s, "handler_spin") == Some("on_alarm")
            && caller_of(s, "interrupted_loop") == Some("main")
            && s.functions.iter().position(|f| f == "interrupted_loop")
                > s.functions.iter().position(|f| f == "on_alarm")
    });
    (through, all)
}

#[test]
fn a_sample_in_a_signal_handler_continues_into_the_interrupted_code() {
    let ws = Workspace::new();
    let program = stack_program(&ws, "handler");
    for args in [&[][..], &["altstack"][..]] {
        let profile = run_profiled(
            &ws,
            &program,
            args,
            &[("MSLPROF_HZ", "1000")],
            6,
            "handled 1\n",
        );
        let (through, all) = through_signal_frame(&resolved_stacks(&profile));
        assert!(all >= 20, "{args:?}: {all} samples in the handler");
        assert!(
            through * 100 >= all * 95,
            "{args:?}: {through} of {all} handler samples reach interrupted_loop and main"
        );
    }
}

#[test]
fn a_stack_deeper_than_a_rings_copy_is_walked_to_main() {
    // At 1 kHz each sample is a record of the thread's ring with a copy of the top 16 KiB of its stack, once
    // the thread's stacks have been seen to fit (`shallow`). Then it goes 32 KiB deep. A walk of a copy that
    // runs off its end makes the runtime walk that thread's live stack (a signal per sample) again: only the
    // samples taken before (at most a ring's worth) are cut.
    let ws = Workspace::new();
    let program = stack_program(&ws, "deep_frames");
    let (profile, _) = run_deep_frames(&ws, &program, &[]);
    let stacks = resolved_stacks(&profile);
    let in_bottom = |s: &Resolved| {
        s.functions.first().is_some_and(|f| f == "spin")
            && s.functions.get(1).is_some_and(|f| f == "bottom")
    };
    let all = samples_where(&stacks, in_bottom);
    let to_main = samples_where(&stacks, |s| {
        in_bottom(s)
            && s.functions.iter().filter(|f| *f == "descend").count() == 64
            && s.functions.get(66).is_some_and(|f| f == "main")
    });
    assert!(all >= 500, "{all} samples in bottom");
    assert!(
        to_main * 100 >= all * 95,
        "{to_main} of {all} samples in bottom reach main through 64 frames of descend"
    );
}

/// What a run of `deep_frames` printed besides `done`.
struct DeepFrames {
    /// How often the drain thread woke (None: the run had none).
    drain_wakeups: Option<u64>,
    /// The perf rings mapped at the end of `shallow` and at the end of `bottom`.
    rings_shallow: i64,
    rings_deep: i64,
}

/// Runs `deep_frames` with `args` at 1 kHz: its profile, and what it printed.
fn run_deep_frames(ws: &Workspace, program: &Path, args: &[&str]) -> (Profile, DeepFrames) {
    let output = run(ws
        .command_with_runtime(program)
        .args(args)
        .env("MSLPROF_HZ", "1000"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    let printed = || -> Option<DeepFrames> {
        let rest = stdout.strip_prefix("done\ndrain_wakeups=")?;
        let (wakeups, rings) = rest.trim_end().split_once("\nrings=")?;
        let (shallow, deep) = rings.split_once(',')?;
        Some(DeepFrames {
            drain_wakeups: u64::try_from(wakeups.parse::<i64>().ok()?).ok(),
            rings_shallow: shallow.parse().ok()?,
            rings_deep: deep.parse().ok()?,
        })
    };
    let printed = printed().unwrap_or_else(|| panic!("{stdout}"));
    (read_profile(&ws.join("gmon.out")), printed)
}

/// Whether the run had no ring with stack copies (no drain thread, or no ring mapped while shallow), said as a
/// skip: the tests of rings cannot tell anything then.
fn skipped_without_stack_rings(profile: &Profile, printed: &DeepFrames) -> bool {
    let without = printed.drain_wakeups.is_none() || printed.rings_shallow < 1;
    if without {
        eprintln!(
            "SKIPPED: no ring with stack copies in this run (sources {}, {} rings)",
            profile.header.sampling_sources, printed.rings_shallow
        );
    }
    without
}

#[test]
fn a_thread_whose_stacks_outgrow_a_copy_gives_its_ring_back() {
    // Once a walk shows that the thread's stacks are deeper than a copy, its ring is unmapped: the kernel would
    // go on copying 16 KiB of stack into it at each sample, for walks that need the live stack anyway.
    let ws = Workspace::new();
    let program = stack_program(&ws, "deep_frames");
    let (profile, printed) = run_deep_frames(&ws, &program, &[]);
    if skipped_without_stack_rings(&profile, &printed) {
        return;
    }
    assert_eq!(
        printed.rings_deep,
        printed.rings_shallow - 1,
        "perf rings mapped while shallow and after 1 s deep"
    );
}

#[test]
fn a_thread_without_its_ring_that_blocks_sigprof_is_still_sampled() {
    // Deep, the thread has given its ring back, and its samples are signals. Then it spins for 1 s of CPU with
    // SIGPROF blocked: it takes no signal, so after 100 ms without a live walk the drain thread maps its ring
    // again, and the samples go there.
    let ws = Workspace::new();
    let program = stack_program(&ws, "deep_frames");
    let (profile, printed) = run_deep_frames(&ws, &program, &["block"]);
    if skipped_without_stack_rings(&profile, &printed) {
        return;
    }
    let stacks = resolved_stacks(&profile);
    let blocked = samples_where(&stacks, |s| {
        s.functions.first().is_some_and(|f| f == "spin")
            && s.functions.get(1).is_some_and(|f| f == "blocked")
    });
    assert!(
        blocked >= 500,
        "{blocked} samples in 1 s of CPU with SIGPROF blocked, at 1 kHz"
    );
}

#[test]
fn a_thread_walked_live_does_not_wake_the_drain_thread_at_each_sample() {
    // While an event signals each sample (here: for the second of CPU time whose stacks are deeper than a
    // copy), the kernel wakes every poller of the event at each signal. The drain thread leaves such a ring out
    // of its poll and drains it on a timeout of half the ring's span (15 ms at 1 kHz) instead: it wakes a few
    // dozen times a second of the run, not once a sample.
    let ws = Workspace::new();
    let program = stack_program(&ws, "deep_frames");
    let (profile, printed) = run_deep_frames(&ws, &program, &[]);
    let Some(wakeups) = printed.drain_wakeups else {
        eprintln!(
            "SKIPPED: no drain thread in this run (sources {})",
            profile.header.sampling_sources
        );
        return;
    };
    let samples = profile.header.total_samples;
    assert!(samples >= 1000, "{samples} samples");
    assert!(
        wakeups * 3 <= samples,
        "the drain thread woke {wakeups} times for {samples} samples"
    );
}

#[test]
fn coroutines_on_their_own_stacks_are_walked_as_far_as_they_go() {
    let ws = Workspace::new();
    let program = stack_program(&ws, "coroutines");
    let profile = run_profiled(
        &ws,
        &program,
        &[],
        &[("MSLPROF_HZ", "1000")],
        7,
        "rounds done\n",
    );
    let stacks = resolved_stacks(&profile);
    let in_spin = samples_where(&stacks, |s| {
        s.functions.first().is_some_and(|f| f == "coroutine_spin")
    });
    let with_body = samples_where(&stacks, |s| {
        caller_of(s, "coroutine_spin") == Some("coroutine_body")
    });
    assert!(in_spin >= 20, "{stacks:#?}");
    assert!(
        with_body * 100 >= in_spin * 95,
        "{with_body} of {in_spin}: {stacks:#?}"
    );
}

#[test]
fn code_without_unwind_tables_and_a_clobbered_frame_pointer_is_truncated() {
    let ws = Workspace::new();
    ws.cc([
        "-c",
        "-O1",
        "-fno-asynchronous-unwind-tables",
        "-fno-unwind-tables",
        "-mno-red-zone",
        "-o",
        ws.join("clobbered.o").to_str().unwrap(),
        source("clobbered.c").to_str().unwrap(),
    ]);
    let program = ws.program(
        "uses_clobbered",
        &[source("uses_clobbered.c"), ws.join("clobbered.o")],
        &[],
    );
    let profile = run_profiled(
        &ws,
        &program,
        &[],
        &[("MSLPROF_HZ", "1000")],
        8,
        "survived\n",
    );
    let stacks = resolved_stacks(&profile);
    let in_spin = |s: &Resolved| s.functions.first().is_some_and(|f| f == "clobbered_spin");
    let all = samples_where(&stacks, in_spin);
    let truncated = samples_where(&stacks, |s| {
        in_spin(s) && s.flags & stack_flags::TRUNCATED_UNWIND != 0 && s.functions.len() == 1
    });
    assert!(all >= 20, "{stacks:#?}");
    assert_eq!(truncated, all, "{stacks:#?}");
}

#[test]
fn a_stack_through_a_closed_library_keeps_its_load_instance_key() {
    let ws = Workspace::new();
    let include_flag = include();
    let include = [include_flag.as_str()];
    let library = ws.shared_library("libdl_spin.so", &[source("libdl_spin.c")], &include);
    let mut flags = include.to_vec();
    flags.push("-ldl");
    let program = ws.program("dlopen_close", &[source("dlopen_close.c")], &flags);
    let profile = run_profiled(
        &ws,
        &program,
        &[library.to_str().unwrap()],
        &[("MSLPROF_HZ", "1000")],
        9,
        "closed\n",
    );
    let closed = profile
        .modules
        .iter()
        .find(|m| m.name == b"libdl_spin.so")
        .expect("the closed library is in the profile");
    assert_ne!(closed.flags & module_flags::UNLOADED, 0);
    let stacks = resolved_stacks(&profile);
    let in_spin = samples_where(&stacks, |s| {
        s.functions.first().is_some_and(|f| f == "dl_spin") && s.keys[0] == closed.key
    });
    let with_main = samples_where(&stacks, |s| {
        s.keys[0] == closed.key && caller_of(s, "dl_spin") == Some("main")
    });
    assert!(in_spin >= 20, "{stacks:#?}");
    assert!(with_main * 100 >= in_spin * 95, "{with_main} of {in_spin}");
}

#[test]
fn sixteen_threads_each_show_their_own_start_routine() {
    let ws = Workspace::new();
    let include_flag = include();
    let include = [include_flag.as_str()];
    let mut flags = include.to_vec();
    flags.push("-pthread");
    let program = ws.program("threads16", &[source("threads16.c")], &flags);
    let profile = run_profiled(
        &ws,
        &program,
        &[],
        &[("MSLPROF_HZ", "1000")],
        10,
        "joined\n",
    );
    let stacks = resolved_stacks(&profile);
    for worker in 0..16 {
        let name = format!("worker_{worker}");
        let samples = samples_where(&stacks, |s| {
            s.functions.first().is_some_and(|f| f == "thread_spin")
                && caller_of(s, "thread_spin") == Some(name.as_str())
        });
        assert!(samples >= 3, "{name}: {samples} samples: {stacks:#?}");
    }
}

#[test]
fn stack_depth_zero_writes_no_stacks() {
    let ws = Workspace::new();
    let program = ws.program("counter", &[source("gprof_counter.c")], &[]);
    let profile = run_profiled(
        &ws,
        &program,
        &[],
        &[("MSLPROF_STACK_DEPTH", "0")],
        3,
        "done 1\n",
    );
    assert!(profile.stacks.is_none());
    assert!(profile.header.total_samples > 0);
}

#[test]
fn a_started_thread_whose_stacks_fit_gets_its_ring_once_they_have_been_seen_to_fit() {
    // A thread the program starts samples by signals, walked live, until its ring with stack copies is mapped
    // and 16 live walks in a row have fitted in a copy. Those walks are counted from its first sample on, so
    // its ring comes after about 16 samples (16 ms of its CPU time at 1 kHz) and the drain thread's next round
    // (at most 20 ms later), not only once the thread has lived 50 ms.
    let ws = Workspace::new();
    let program = stack_program(&ws, "ring_soon");
    let output = run(ws.command_with_runtime(&program).env("MSLPROF_HZ", "1000"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    let profile = read_profile(&ws.join("gmon.out"));
    if profile.header.sampling_sources != sampling_sources::TASK_CLOCK {
        eprintln!(
            "SKIPPED: no task clocks in this run (sources {}): no ring to wait for",
            profile.header.sampling_sources
        );
        return;
    }
    let found_ms: f64 = stdout
        .trim()
        .strip_prefix("ring after ")
        .and_then(|rest| rest.strip_suffix(" ms"))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("the worker found no ring of its own: {stdout}"));
    assert!(
        found_ms < 50.0,
        "the started thread's ring came after {found_ms} ms of its CPU time"
    );
}
