//! Issue 15: the runtime records the process's user and system CPU time as the kernel tells it, and the
//! report prints them; checked with a program that spends its time in system calls and one that only spins.

use std::path::Path;

use mslprof_format::model::{CpuTime, sampling_sources};
use mslprof_tests::{Workspace, analyzer_binary, assert_success, fixtures_dir, run};

/// Runs the fixture with `mode` under the runtime, keeps its profile as `MODE.out`, and returns the recorded
/// CPU time, the sources that sampled, and the flat profile report.
fn profile_run(ws: &Workspace, program: &Path, mode: &str) -> (CpuTime, u32, String) {
    let output = run(ws.command_with_runtime(program).arg(mode));
    assert_success(&output, mode);
    let header = ws.profile("gmon.out").header;
    let cpu = header.cpu_time.expect("the runtime records the CPU time");
    let report = run(std::process::Command::new(analyzer_binary())
        .current_dir(ws.path())
        .args(["-b", "-p", "kernel_time", "gmon.out"]));
    assert_success(&report, "mslprof");
    std::fs::rename(ws.join("gmon.out"), ws.join(&format!("{mode}.out"))).unwrap();
    (
        cpu,
        header.sampling_sources,
        String::from_utf8_lossy(&report.stdout).into_owned(),
    )
}

fn system_share(cpu: CpuTime) -> f64 {
    cpu.system_ns as f64 / (cpu.user_ns + cpu.system_ns) as f64
}

#[test]
fn system_time_is_recorded_and_reported() {
    let ws = Workspace::new();
    let program = ws.program(
        "kernel_time",
        &[fixtures_dir("sampling").join("kernel_time.c")],
        &[],
    );

    let (sys, sources, report) = profile_run(&ws, &program, "sys");
    // The program waits for 300 ms of its CPU time, most of it spent clearing buffers in the kernel.
    assert!(sys.user_ns + sys.system_ns >= 300_000_000, "{sys:?}");
    assert!(system_share(sys) > 0.6, "{sys:?}");
    let line = report
        .lines()
        .find(|l| l.starts_with("The kernel charged the process "))
        .unwrap_or_else(|| panic!("no CPU time line:\n{report}"));
    assert!(
        line.contains(&format!("{:.2} s of user", sys.user_ns as f64 / 1e9))
            && line.contains(&format!("{:.2} s of system", sys.system_ns as f64 / 1e9))
            && line.ends_with(if sources == sampling_sources::TASK_CLOCK {
                "; task clocks sample user time only, so the system time is in no function."
            } else {
                "; samples taken in system calls are charged to the libc functions that made the calls."
            }),
        "{line}"
    );
    // The line sits right under the one that says what 100 % is.
    let lines: Vec<&str> = report.lines().collect();
    let at = lines.iter().position(|l| *l == line).unwrap();
    assert!(lines[at - 1].starts_with("Percentages are of "), "{report}");

    let (spin, _, report) = profile_run(&ws, &program, "spin");
    assert!(spin.user_ns + spin.system_ns >= 300_000_000, "{spin:?}");
    assert!(system_share(spin) < 0.2, "{spin:?}");
    assert!(
        report.contains("The kernel charged the process "),
        "{report}"
    );

    // Summing adds them up.
    let sum = run(std::process::Command::new(analyzer_binary())
        .current_dir(ws.path())
        .args(["-s", "kernel_time", "sys.out", "spin.out"]));
    assert_success(&sum, "mslprof -s");
    assert_eq!(
        ws.profile("gmon.sum").header.cpu_time,
        Some(CpuTime {
            user_ns: sys.user_ns + spin.user_ns,
            system_ns: sys.system_ns + spin.system_ns,
        })
    );
}
