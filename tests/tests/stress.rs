//! The runtime under stress from the program and from outside, bounded in time: forks while sites are being
//! rewritten (widened with the test hooks' delay, and natural), a program that patches its own code, SIGSTOP
//! storms and a debugger attaching and detaching while hot sites are rewritten. Each run must end as it
//! would without the runtime, with exact counts.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mslprof_tests::analyzer::have;
use mslprof_tests::callcounts::{
    assert_hot_counts_exact, build_program, pg_flags, profile_call_graph, run_ok,
};
use mslprof_tests::{Workspace, read_profile, send_signal, wait_at_most_20s};

/// forkstorm's output: forks made, children hung, functions rewritten, calls the workers made.
fn fork_storm(command: &mut Command, workspace: &Workspace, what: &str) -> (u64, u64) {
    let stdout = run_ok(command);
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(fields.len(), 8, "{what}: {stdout}");
    let [forks, hung, jumps, calls] =
        [1, 3, 5, 7].map(|i| fields[i].parse::<u64>().expect("a number"));
    assert_eq!(
        hung, 0,
        "{what}: children hung on a half-rewritten site: {stdout}"
    );
    assert!(forks > 0, "{what}: {stdout}");
    assert!(
        jumps > 0,
        "{what}: no site was rewritten, so nothing was tested: {stdout}"
    );
    // Every call of the f functions is counted from burst, through mcount or a stub.
    let profile = read_profile(&workspace.join("gmon.out"));
    let graph = profile_call_graph(&profile, &|name| {
        name == "burst" || (name.starts_with('f') && name[1..].parse::<u32>().is_ok())
    });
    let counted: u64 = graph
        .iter()
        .filter(|((caller, _), _)| caller == "burst")
        .map(|(_, count)| count)
        .sum();
    assert_eq!(counted, calls, "{what}: {stdout}");
    (forks, jumps)
}

#[test]
fn forks_during_rewrites_never_leave_a_child_on_a_half_rewritten_site() {
    let workspace = Workspace::new();
    let exe = build_program(
        &workspace,
        "forkstorm",
        &["forkstorm.c"],
        &[],
        &pg_flags("-O2"),
    );
    // Each round of rewrites waits 20 ms with its sites at `jmp $`: the forking thread forks inside it.
    let mut widened = workspace.command_with_test_hooks_runtime(&exe);
    widened.env("MSLPROF_TEST_REWRITE_DELAY_US", "20000");
    fork_storm(&mut widened, &workspace, "with 20 ms rewrite windows");
    for run in 0..2 {
        fork_storm(
            &mut workspace.command_with_runtime(&exe),
            &workspace,
            &format!("natural run {run}"),
        );
    }
}

#[test]
fn a_program_that_patches_its_own_code_runs_to_the_end() {
    let workspace = Workspace::new();
    let exe = build_program(
        &workspace,
        "selfpatch",
        &["selfpatch.c"],
        &[],
        &pg_flags("-O2"),
    );
    let stdout = run_ok(workspace.command_with_runtime(&exe).arg("400000"));
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(fields.len(), 6, "{stdout}");
    // hot_leaf's site was rewritten on the page the program made writable; the program's own patch of that
    // page worked afterwards, and the page is still as the program set it.
    assert_eq!(
        [fields[0], fields[1], fields[2], fields[4]],
        ["jump", "11223344", "55667788", "rwxp"],
        "{stdout}"
    );
    let rounds: u64 = fields[3].parse().expect("a number");
    let profile = read_profile(&workspace.join("gmon.out"));
    let graph = profile_call_graph(&profile, &|name| {
        ["main", "round_of_calls", "hot_leaf"].contains(&name)
    });
    assert_eq!(
        graph.get(&("round_of_calls".into(), "hot_leaf".into())),
        Some(&(1000 * rounds)),
        "{stdout}"
    );
    assert_eq!(
        graph.get(&("main".into(), "round_of_calls".into())),
        Some(&rounds),
        "{stdout}"
    );
}

/// Runs hot.c (`thread` mode, so a second thread runs through the site as it changes; for 3 s at least)
/// while `disturb` is called with its pid again and again until it ends; checks its output and exact
/// counts.
fn hot_run_disturbed(what: &str, mut disturb: impl FnMut(u32)) {
    let workspace = Workspace::new();
    let exe = build_program(&workspace, "hot", &["hot.c"], &[], &pg_flags("-O2"));
    let mut child = workspace
        .command_with_runtime(&exe)
        .args(["thread", "400000", "3000"])
        .env("MSLPROF_HZ", "1000")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start hot");
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait().expect("wait").is_none() && Instant::now() < deadline {
        disturb(child.id());
    }
    let status = wait_at_most_20s(&mut child, &format!("{what}: hot did not end"));
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut stdout)
        .expect("read stdout");
    assert!(status.success(), "{what}: {status:?} {stdout}");
    let profile = read_profile(&workspace.join("gmon.out"));
    let sites = assert_hot_counts_exact(&stdout, &profile, true, what);
    assert_eq!(sites, "jump call call", "{what}");
}

#[test]
fn sigstop_storms_while_sites_are_rewritten_change_nothing() {
    let mut stops = 0;
    hot_run_disturbed("SIGSTOP storm", |pid| {
        if send_signal(pid, libc::SIGSTOP) {
            stops += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
        send_signal(pid, libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(2));
    });
    assert!(stops > 0, "no SIGSTOP was sent");
}

#[test]
fn a_debugger_attaching_and_detaching_while_sites_are_rewritten_changes_nothing() {
    if !have("gdb") {
        eprintln!("SKIPPED: gdb is not installed");
        return;
    }
    let mut attached = 0;
    hot_run_disturbed("gdb attach and detach", |pid| {
        let output = Command::new("gdb")
            .args(["-nx", "-batch", "-p", &pid.to_string()])
            .args(["-ex", "info threads", "-ex", "detach"])
            .stdin(Stdio::null())
            .output()
            .expect("run gdb");
        if String::from_utf8_lossy(&output.stdout).contains("Thread") {
            attached += 1;
        }
    });
    if attached == 0 {
        eprintln!(
            "SKIPPED: gdb could not attach (ptrace refused here); the run itself was checked"
        );
    }
}

/// Removes perf's map file of a process when dropped (perf reads it from /tmp only).
struct PerfMapFile(Option<std::path::PathBuf>);

impl Drop for PerfMapFile {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[test]
fn with_mslprof_perf_map_perf_names_the_runtimes_generated_code() {
    if let Some(reason) = mslprof_tests::perf_unavailable() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let workspace = Workspace::new();
    let exe = build_program(&workspace, "hot", &["hot.c"], &[], &pg_flags("-O2"));
    let data = workspace.join("perf.data");
    let mut command = Command::new("perf");
    command
        .current_dir(workspace.path())
        .args(["record", "-q", "-e", "cpu-clock", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&exe)
        .args(["alone", "400000", "300"]);
    let program = workspace.command_with_runtime(&exe);
    for (name, value) in program.get_envs() {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command.env("MSLPROF_PERF_MAP", "1");
    run_ok(&mut command);
    let report = Command::new("perf")
        .args(["report", "--stdio", "--sort", "dso,sym", "-i"])
        .arg(&data)
        .output()
        .expect("perf report");
    let report = String::from_utf8_lossy(&report.stdout).into_owned();
    // perf files the samples in code outside any file under `[JIT] tid N`, and names them from the map.
    let generated: Vec<&str> = report
        .lines()
        .filter(|line| line.contains("[JIT] tid "))
        .collect();
    let pid = generated.first().and_then(|line| {
        let after = &line[line.find("[JIT] tid ")? + "[JIT] tid ".len()..];
        after.split_whitespace().next()
    });
    let _map = PerfMapFile(pid.map(|pid| format!("/tmp/perf-{pid}.map").into()));
    assert!(
        !generated.is_empty(),
        "no sample in the runtime's generated code:\n{report}"
    );
    assert!(
        generated.iter().all(|line| line.contains("[.] mslprof ")),
        "perf did not name every piece of generated code:\n{report}"
    );
    assert!(
        generated
            .iter()
            .any(|line| line.contains("mslprof stub for the mcount call at hot+0x")),
        "hot_leaf's stub is not named:\n{report}"
    );
}

#[test]
fn forked_children_that_record_nothing_leave_no_file_however_they_end() {
    let workspace = Workspace::new();
    let source = mslprof_tests::fixtures_dir("bench").join("fork_loop.c");
    let exe = workspace.program("fork_loop", &[source], &[]);
    // 50 children that `_exit(0)` at once: their reset is never needed, and they write nothing.
    run_ok(workspace.command_with_runtime(&exe).arg("50"));
    let mut files: Vec<String> = std::fs::read_dir(workspace.path())
        .expect("read the workspace")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.starts_with("gmon.out"))
        .collect();
    files.sort();
    assert_eq!(files, ["gmon.out"]);
}
