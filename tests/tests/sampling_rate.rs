//! Issue 33: samples at the rate asked for. Each thread samples its CPU time through its own task-clock perf
//! event (1 and 4 kHz, on one and on four threads), which writes each sample into a ring (with a copy of the
//! stack for the drain thread to walk, or only the pc when samples have no stacks, `MSLPROF_STACK_DEPTH=0`),
//! or signals each sample (`MSLPROF_TEST_NO_RING=1`, a test-hooks switch); where the kernel refuses perf events
//! (a seccomp filter here) the runtime falls back to CPU-time timers and says so; a program that closes every
//! descriptor above 2 keeps being sampled, and no descriptor of ours is ever 0, 1 or 2 or survives an exec; a
//! rate above the highest gets the highest, and forked children are not held up by their events' first periods.

use std::path::{Path, PathBuf};
use std::process::Output;

use mslprof_format::model::{Profile, header_flags, sampling_sources};
use mslprof_tests::{Workspace, analyzer_binary, fixtures_dir, histogram_total, module, run};

fn source(name: &str) -> PathBuf {
    fixtures_dir("sampling").join(name)
}

/// The `name=value` number of a fixture's output.
fn field(stdout: &str, name: &str) -> f64 {
    stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {stdout}"))
}

fn assert_ran(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The runtime's stderr lines.
fn mslprof_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|l| l.starts_with("mslprof"))
        .map(str::to_owned)
        .collect()
}

/// Whether the kernel gave this run task clocks; when it did not, why the test cannot say anything.
fn task_clocks_used(profile: &Profile) -> bool {
    if profile.header.sampling_sources == sampling_sources::TASK_CLOCK {
        return true;
    }
    let paranoid =
        std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default();
    assert!(
        paranoid.trim().parse::<i32>().is_ok_and(|level| level > 2),
        "no task clocks (sources {}) although perf_event_paranoid is {paranoid}",
        profile.header.sampling_sources
    );
    eprintln!(
        "SKIPPED: perf_event_paranoid {} refuses perf events",
        paranoid.trim()
    );
    false
}

/// The ways a task-clock event delivers its samples: the name, `MSLPROF_STACK_DEPTH` and
/// `MSLPROF_TEST_NO_RING` that select each.
const DELIVERIES: [(&str, &str, &str); 3] = [
    ("rings with stack copies", "128", "0"),
    ("rings of the pc", "0", "0"),
    ("signals", "128", "1"),
];

/// The rate fixture with `threads` libraries, each thread burning `ms` in its own.
fn rate_fixture(ws: &Workspace, threads: usize) -> PathBuf {
    for i in 0..threads {
        ws.shared_library(&format!("librate{i}.so"), &[source("rate_lib.c")], &[]);
    }
    ws.program("rate", &[source("rate.c")], &["-ldl", "-pthread"])
}

#[test]
fn task_clocks_give_the_rate_asked_for_on_one_thread_and_on_each_of_four() {
    let ws = Workspace::new();
    let program = rate_fixture(&ws, 4);
    let runs = [(1000.0, 0.90), (4000.0, 0.75)]
        .into_iter()
        .flat_map(|rate| [1, 4].map(|threads| (rate, threads)))
        .flat_map(|(rate, threads)| DELIVERIES.map(|delivery| (rate, threads, delivery)));
    for ((hz, least), threads, (delivery, depth, no_ring)) in runs {
        let output = run(ws
            .command_with_test_hooks_runtime(&program)
            .env("MSLPROF_HZ", format!("{hz}"))
            .env("MSLPROF_STACK_DEPTH", depth)
            .env("MSLPROF_TEST_NO_RING", no_ring)
            .args([&threads.to_string(), "400", ws.path().to_str().unwrap()]));
        let stdout = assert_ran(&output);
        assert_eq!(mslprof_lines(&output), Vec::<String>::new());
        let profile = ws.profile("gmon.out");
        if !task_clocks_used(&profile) {
            return;
        }
        for i in 0..threads {
            let samples = histogram_total(module(&profile, &format!("librate{i}.so")));
            let cpu_seconds = field(&stdout, &format!("cpu_ms_{i}")) / 1e3;
            let rate = samples as f64 / cpu_seconds;
            assert!(
                rate >= least * hz,
                "{hz} Hz asked for, {threads} threads, samples by {delivery}: thread {i} took \
                 {samples} samples in {cpu_seconds:.3} s of CPU, {rate:.0} per CPU-second"
            );
        }
        std::fs::remove_file(ws.join("gmon.out")).unwrap();
    }
}

#[test]
fn a_rate_above_the_highest_gets_the_highest_and_one_warning_line() {
    let ws = Workspace::new();
    let program = rate_fixture(&ws, 1);
    let output = run(ws
        .command_with_runtime(&program)
        .env("MSLPROF_HZ", "100000")
        .args(["1", "300", ws.path().to_str().unwrap()]));
    let stdout = assert_ran(&output);
    assert_eq!(
        mslprof_lines(&output),
        [
            "mslprof: MSLPROF_HZ=100000 is above 10000, the highest rate (faster, a sample's cost nears its \
          period and the program can almost stop); using 10000"
        ]
    );
    let profile = ws.profile("gmon.out");
    assert_eq!(profile.header.hz, 10_000);
    if !task_clocks_used(&profile) {
        return;
    }
    // The rate taken is the highest one, not the one asked for.
    let samples = histogram_total(module(&profile, "librate0.so"));
    let cpu_seconds = field(&stdout, "cpu_ms_0") / 1e3;
    let rate = samples as f64 / cpu_seconds;
    assert!(
        (7_500.0..=11_000.0).contains(&rate),
        "{samples} samples in {cpu_seconds:.3} s of CPU: {rate:.0} per CPU-second"
    );
}

/// Whether `line` is the runtime's report of a seccomp filter's refusal (EACCES) of task clocks, at `hz` asked for.
fn says_eacces_refusal(line: &str, hz: &str) -> bool {
    line.starts_with(
        "mslprof: the kernel refuses task-clock perf events (perf_event_open: EACCES; ",
    ) && line.contains("sampling on CPU-time timers")
        && line.contains(&format!(
            "fewer than the {hz} samples per CPU-second asked for"
        ))
}

#[test]
fn where_perf_events_are_refused_cpu_timers_sample_and_a_rate_above_the_tick_says_so() {
    let ws = Workspace::new();
    let program = rate_fixture(&ws, 1);
    let launcher = ws.no_perf_events_launcher();
    for (hz, warned) in [("1000", true), ("100", false)] {
        let output = run(ws
            .command_with_test_hooks_runtime(&launcher)
            .env("MSLPROF_HZ", hz)
            .arg(&program)
            .args(["1", "300", ws.path().to_str().unwrap()]));
        assert_ran(&output);
        let lines = mslprof_lines(&output);
        if warned {
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(says_eacces_refusal(&lines[0], hz), "{}", lines[0]);
        } else {
            assert_eq!(lines, Vec::<String>::new());
        }
        let profile = ws.profile("gmon.out");
        assert_eq!(profile.header.sampling_sources, sampling_sources::CPU_TIMER);
        assert!(
            histogram_total(module(&profile, "librate0.so")) >= 10,
            "the timers sample: {} samples",
            profile.header.total_samples
        );
        let report = run(std::process::Command::new(analyzer_binary())
            .current_dir(ws.path())
            .args(["-b", "-p", "rate", "gmon.out"]));
        let report = String::from_utf8_lossy(&report.stdout);
        let rate_line = report
            .lines()
            .find(|l| l.starts_with("Sampled at "))
            .unwrap_or_else(|| panic!("no rate line:\n{report}"));
        assert!(
            rate_line.contains(&format!(
                "({hz} asked for; per-thread CPU-time timers, checked on the kernel tick)."
            )),
            "{rate_line}"
        );
        std::fs::remove_file(ws.join("gmon.out")).unwrap();
    }
}

#[test]
fn a_program_that_closes_every_descriptor_above_2_keeps_being_sampled() {
    let ws = Workspace::new();
    let program = ws.program("closes_fds", &[source("closes_fds.c")], &["-pthread"]);
    for delivery in DELIVERIES {
        closes_every_descriptor_above_2(&ws, &program, delivery);
    }
}

/// The samples of the `closes_fds` program's `function` (4 bytes of text per bucket).
fn samples_in_function(profile: &Profile, program: &Path, function: &str) -> u64 {
    let symbols = mslprof_tests::callcounts::Symbols::of(program);
    let histogram = module(profile, "closes_fds")
        .histogram
        .as_ref()
        .expect("a histogram");
    histogram
        .ranges
        .iter()
        .flat_map(|range| {
            range
                .buckets
                .nonzero()
                .map(move |(index, count)| (range.start.0 + index * 4, count))
        })
        .filter(|(address, _)| symbols.function_at(*address) == Some(function))
        .map(|(_, count)| u64::from(count))
        .sum()
}

fn closes_every_descriptor_above_2(
    ws: &Workspace,
    program: &Path,
    (delivery, depth, no_ring): (&str, &str, &str),
) {
    let output = run(ws
        .command_with_test_hooks_runtime(program)
        .env("MSLPROF_HZ", "1000")
        .env("MSLPROF_STACK_DEPTH", depth)
        .env("MSLPROF_TEST_NO_RING", no_ring));
    let stdout = assert_ran(&output);
    assert_eq!(mslprof_lines(&output), Vec::<String>::new());
    let profile = ws.profile("gmon.out");
    if !task_clocks_used(&profile) {
        return;
    }
    // Before the close: the main thread's event, close-on-exec, not a standard stream.
    assert_eq!(field(&stdout, "perf_fds"), 1.0, "{stdout}");
    assert_eq!(field(&stdout, "not_cloexec"), 0.0, "{stdout}");
    assert_eq!(field(&stdout, "standard_perf_fds"), 0.0, "{stdout}");
    // The thread started after stdin was closed got its event elsewhere than on descriptor 0.
    assert_eq!(field(&stdout, "stdin_reused"), 0.0, "{stdout}");
    // After the close, the main thread's event is found closed (within a 50 ms watch period of its CPU
    // time) and opened again: at least 75 % of 1 kHz over its 600 ms in `after_close`.
    let samples_in = |function: &str| samples_in_function(&profile, program, function);
    let after = samples_in("after_close") as f64 / (field(&stdout, "cpu_ms_after_close") / 1e3);
    assert!(
        after >= 750.0,
        "samples by {delivery}: {after:.0} samples per CPU-second after the close"
    );
    assert!(
        samples_in("in_new_thread") >= 150,
        "samples by {delivery}: {} samples in the thread started after the close (300 ms at 1 kHz)",
        samples_in("in_new_thread")
    );
    std::fs::remove_file(ws.join("gmon.out")).unwrap();
}

/// A daemon that closes every descriptor above 2 and then forbids itself perf events (a seccomp filter): when a
/// watch tick finds the main thread's event closed, the new one it opens is refused. Where no ring holds the
/// old event (samples are signals), the thread samples on its CPU-time timer from then on and the refusal is
/// said, once; a ring's mapping keeps the old event sampling.
#[test]
fn a_program_that_forbids_perf_events_after_closing_its_descriptors_falls_back_to_timers_and_says_so()
 {
    let ws = Workspace::new();
    let program = ws.program("closes_fds", &[source("closes_fds.c")], &["-pthread"]);
    for (delivery, depth, no_ring) in DELIVERIES {
        let output = run(ws
            .command_with_test_hooks_runtime(&program)
            .env("MSLPROF_HZ", "1000")
            .env("MSLPROF_STACK_DEPTH", depth)
            .env("MSLPROF_TEST_NO_RING", no_ring)
            .arg("then-refused"));
        let stdout = assert_ran(&output);
        let profile = ws.profile("gmon.out");
        std::fs::remove_file(ws.join("gmon.out")).unwrap();
        // No event at the start: task clocks were refused from the first (the sources cannot say it here, the
        // timers being expected later on).
        if field(&stdout, "perf_fds") == 0.0 {
            task_clocks_used(&profile);
            return;
        }
        let lines = mslprof_lines(&output);
        let timers = profile.header.sampling_sources & sampling_sources::CPU_TIMER != 0;
        let after_close = samples_in_function(&profile, &program, "after_close") as f64
            / (field(&stdout, "cpu_ms_after_close") / 1e3);
        if no_ring == "1" {
            assert_eq!(lines.len(), 1, "{delivery}: {lines:?}");
            assert!(says_eacces_refusal(&lines[0], "1000"), "{}", lines[0]);
            assert!(
                timers,
                "{delivery}: sources {}",
                profile.header.sampling_sources
            );
        } else {
            assert_eq!(lines, Vec::<String>::new(), "{delivery}");
            assert!(
                !timers,
                "{delivery}: sources {}",
                profile.header.sampling_sources
            );
        }
        // The ring's event at 1 kHz, or the timer: the kernel's tick (250 Hz here) caps its rate, and takes at
        // most one sample at each tick that finds the thread running, which a busy machine makes fewer (about
        // 90 per CPU-second with two busy loops on the two cores). Without the timer there would be none.
        let least = if no_ring == "1" { 50.0 } else { 750.0 };
        assert!(
            after_close >= least,
            "{delivery}: {after_close:.0} samples per CPU-second after the close; {stdout}"
        );
    }
}

#[test]
fn threads_whose_first_period_ends_at_once_are_not_killed_by_their_own_signal() {
    // Each event's first period is a random part of (0, 250 µs] at 4 kHz: some end right after the event is
    // opened. Its signal must find the event known to the handler, or it goes to the program's SIGPROF
    // action, the default one, which ends the process (12 runs of 30 died so before the fix).
    let ws = Workspace::new();
    let program = rate_fixture(&ws, 16);
    for (_, depth, no_ring) in DELIVERIES {
        for _ in 0..20 {
            let output = run(ws
                .command_with_test_hooks_runtime(&program)
                .env("MSLPROF_HZ", "4000")
                .env("MSLPROF_STACK_DEPTH", depth)
                .env("MSLPROF_TEST_NO_RING", no_ring)
                .args(["16", "2", ws.path().to_str().unwrap()]));
            assert_ran(&output);
        }
    }
}

/// A forked child's event signals each sample (it has no drain thread to walk stack copies), and the child opens
/// it in the fork handler, where SIGPROF is blocked until `fork` returns. An event whose random first period was
/// shorter than what a sample costs the kernel (25-40 us on a virtual machine) expired again and again meanwhile:
/// children that only `_exit` took up to 2.5 s of CPU instead of a fraction of a millisecond.
#[test]
fn forked_children_that_exit_at_once_are_not_held_up_by_their_first_period() {
    let ws = Workspace::new();
    let program = ws.program(
        "fork_loop",
        &[fixtures_dir("bench").join("fork_loop.c")],
        &[],
    );
    for hz in ["1000", "4000"] {
        let output = run(ws
            .command_with_runtime(&program)
            .env("MSLPROF_HZ", hz)
            .args(["200", "20000"]));
        let stdout = assert_ran(&output);
        assert_eq!(mslprof_lines(&output), Vec::<String>::new());
        assert_eq!(
            field(&stdout, "over"),
            0.0,
            "MSLPROF_HZ={hz}: children that took more than 20 ms of CPU to _exit: {stdout}"
        );
    }
}

/// The name of the profile a forked child wrote in the workspace (`gmon.out.<pid>`); `stdout` is the run's, for
/// the message when there is none.
fn child_profile(ws: &Workspace, stdout: &str) -> String {
    std::fs::read_dir(ws.path())
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .find(|name| name.starts_with("gmon.out."))
        .unwrap_or_else(|| panic!("no child profile; {stdout}"))
}

/// A forked child opens its task-clock event at its first sample, which its CPU-time timer takes: a child that
/// `exec`s or `_exit`s first never pays for one. Once open, the event samples at the rate asked for.
#[test]
fn a_forked_child_opens_its_event_at_its_first_sample_and_then_samples_at_the_rate() {
    let ws = Workspace::new();
    let program = ws.program("fork_event", &[source("fork_event.c")], &[]);
    for depth in ["128", "0"] {
        let output = run(ws
            .command_with_runtime(&program)
            .env("MSLPROF_HZ", "1000")
            .env("MSLPROF_STACK_DEPTH", depth)
            .arg("300"));
        let stdout = assert_ran(&output);
        assert_eq!(mslprof_lines(&output), Vec::<String>::new());
        let child_file = child_profile(&ws, &stdout);
        let profile = ws.profile(&child_file);
        std::fs::remove_file(ws.join(&child_file)).unwrap();
        if !task_clocks_used(&profile) {
            return;
        }
        assert_eq!(
            (field(&stdout, "before"), field(&stdout, "after")),
            (0.0, 1.0),
            "depth {depth}: perf-event descriptors of the child: {stdout}"
        );
        let samples: u64 = profile.modules.iter().map(histogram_total).sum();
        let rate = samples as f64 / (field(&stdout, "user_ms") / 1e3);
        assert!(
            rate >= 900.0,
            "depth {depth}: the child took {samples} samples: {rate:.0} per CPU-second; {stdout}"
        );
    }
}

/// A forked child whose event cannot be opened at its first sample goes on sampling on its CPU-time timer, and
/// its profile says so: quietly when it has used up its descriptors (a shortage), with the one stderr line of a
/// refusal when a seccomp filter refuses it perf_event_open.
#[test]
fn a_forked_child_that_cannot_open_its_event_samples_on_its_timer_and_says_so() {
    let ws = Workspace::new();
    let program = ws.program("fork_event", &[source("fork_event.c")], &[]);
    for why in ["no-descriptors", "refused"] {
        let output = run(ws
            .command_with_runtime(&program)
            .env("MSLPROF_HZ", "1000")
            .args(["300", why]));
        let stdout = assert_ran(&output);
        let child_file = child_profile(&ws, &stdout);
        let profile = ws.profile(&child_file);
        std::fs::remove_file(ws.join(&child_file)).unwrap();
        if !task_clocks_used(&ws.profile("gmon.out")) {
            return;
        }
        assert_eq!(field(&stdout, "after"), 0.0, "{why}: {stdout}");
        assert_ne!(
            profile.header.sampling_sources & sampling_sources::CPU_TIMER,
            0,
            "{why}: sources {}; {stdout}",
            profile.header.sampling_sources
        );
        let samples: u64 = profile.modules.iter().map(histogram_total).sum();
        assert!(samples >= 30, "{why}: {samples} samples; {stdout}");
        let lines = mslprof_lines(&output);
        if why == "refused" {
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(says_eacces_refusal(&lines[0], "1000"), "{}", lines[0]);
        } else {
            assert_eq!(lines, Vec::<String>::new());
        }
    }
}

#[test]
fn samples_in_rings_are_taken_while_the_program_blocks_sigprof() {
    // The fixture burns 400 ms with SIGPROF blocked, then 300 ms with it unblocked. A ring takes samples
    // whatever the thread's signal mask. A ring of pcs holds 500 ms of them: while SIGPROF is blocked no watch
    // tick drains it, so the first tick after is late, and the event then signals each sample until ticks come
    // on time again. A ring with stack copies holds 31 ms: its event signals each sample until its handler has
    // walked the live stack, which it cannot while SIGPROF is blocked, so the drain thread drains it when it is
    // half full. Every sample is counted once. Samples that are signals wait for the program to unblock
    // SIGPROF: the same run without rings (test hook) samples only the last 300 ms, so the ring is what samples
    // the rest.
    let ws = Workspace::new();
    let program = ws.program("blocks_sigprof", &[source("blocks_sigprof.c")], &[]);
    for ((delivery, depth, no_ring), least, most) in [
        (DELIVERIES[0], 0.90, 1.05),
        (DELIVERIES[1], 0.90, 1.05),
        (DELIVERIES[2], 0.35, 0.50),
    ] {
        let rings = no_ring == "0";
        let output = run(ws
            .command_with_test_hooks_runtime(&program)
            .env("MSLPROF_HZ", "1000")
            .env("MSLPROF_STACK_DEPTH", depth)
            .env("MSLPROF_TEST_NO_RING", no_ring)
            .args(["400", "300", "1"]));
        let stdout = assert_ran(&output);
        assert_eq!(mslprof_lines(&output), Vec::<String>::new());
        let profile = ws.profile("gmon.out");
        if !task_clocks_used(&profile) {
            return;
        }
        let samples = histogram_total(module(&profile, "blocks_sigprof"));
        let rate = samples as f64 / (field(&stdout, "cpu_ms") / 1e3);
        assert!(
            (least * 1000.0..=most * 1000.0).contains(&rate),
            "samples by {delivery}: {samples} samples, {rate:.0} per CPU-second at 1 kHz"
        );
        // The thread ends the process with SIGPROF blocked again: the header says so when its samples are
        // signals.
        assert_eq!(
            profile.header.flags & header_flags::SIGPROF_BLOCKED != 0,
            !rings,
            "samples by {delivery}"
        );
        std::fs::remove_file(ws.join("gmon.out")).unwrap();
    }
}

#[test]
fn a_report_says_when_threads_sampled_by_signals_blocked_sigprof() {
    // At the default rate CPU-time timers sample, by signals: a thread that blocks SIGPROF (here from the
    // start of main to its end) goes unsampled meanwhile, and the report says so under its rate line. The same
    // program blocking it for no time and not at the end gets no such line.
    let ws = Workspace::new();
    let program = ws.program("blocks_sigprof", &[source("blocks_sigprof.c")], &[]);
    for (args, flagged) in [(["200", "0", "1"], true), (["0", "200", "0"], false)] {
        let output = run(ws.command_with_test_hooks_runtime(&program).args(args));
        assert_ran(&output);
        let profile = ws.profile("gmon.out");
        assert_eq!(
            profile.header.flags & header_flags::SIGPROF_BLOCKED != 0,
            flagged,
            "{args:?}"
        );
        let report = run(std::process::Command::new(analyzer_binary())
            .current_dir(ws.path())
            .args(["-b", "-p", "blocks_sigprof", "gmon.out"]));
        let report = String::from_utf8_lossy(&report.stdout);
        assert_eq!(
            report.contains(
                "The program blocked SIGPROF in threads sampled by signals: they were not sampled while \
                 they did"
            ),
            flagged,
            "{report}"
        );
        std::fs::remove_file(ws.join("gmon.out")).unwrap();
    }
    // A thread that starts with SIGPROF blocked (it inherits its creator's mask), the process ending with it
    // unblocked.
    let workers = ws.program(
        "blocked_worker",
        &[source("blocked_worker.c")],
        &["-pthread"],
    );
    let output = run(ws.command_with_test_hooks_runtime(&workers).arg("100"));
    assert_ran(&output);
    let profile = ws.profile("gmon.out");
    assert_ne!(profile.header.flags & header_flags::SIGPROF_BLOCKED, 0);
}

#[test]
fn samples_a_ring_holds_when_their_library_is_closed_go_to_that_library() {
    // The fixture spins 400 ms in a library it then closes, and 100 ms in main. Rings are drained before the
    // module table changes: without that, the samples taken since the last watch tick (up to 50 ms of them)
    // would find no module at the drain and count as unknown.
    let ws = Workspace::new();
    let stacks = mslprof_tests::fixtures_dir("stacks");
    let include = format!("-I{}", stacks.display());
    let library = ws.shared_library(
        "libdl_spin.so",
        &[stacks.join("libdl_spin.c")],
        &[include.as_str()],
    );
    let program = ws.program(
        "dlopen_close",
        &[stacks.join("dlopen_close.c")],
        &[include.as_str(), "-ldl"],
    );
    for _ in 0..3 {
        let output = run(ws
            .command_with_test_hooks_runtime(&program)
            .env("MSLPROF_HZ", "1000")
            .env("MSLPROF_STACK_DEPTH", "0")
            .arg(&library));
        assert_eq!(output.status.code(), Some(9), "{output:?}");
        let profile = ws.profile("gmon.out");
        if !task_clocks_used(&profile) {
            return;
        }
        let closed = module(&profile, "libdl_spin.so");
        assert!(
            histogram_total(closed) >= 360,
            "{} samples in the closed library for its 400 ms at 1 kHz",
            histogram_total(closed)
        );
        assert!(
            profile.header.unknown_samples <= 2,
            "{} samples in no module",
            profile.header.unknown_samples
        );
        std::fs::remove_file(ws.join("gmon.out")).unwrap();
    }
}
