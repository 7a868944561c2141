//! The kernel's account of a profiled process's CPU time (user versus system), as the runtime recorded it in
//! the file header: one line for the report above the flat profile and for `-i`.

use mslprof_format::model::{CpuTime, sampling_sources};

/// The sentence printed under the line that says what 100 % is. `sources` (the header's sampling sources) says
/// where system time went: task clocks alone do not sample it, CPU-time timers charge it to the caller.
pub fn report_line(cpu: CpuTime, sources: u32) -> String {
    let system_time = if sources == sampling_sources::TASK_CLOCK {
        "task clocks sample user time only, so the system time is in no function"
    } else {
        "samples taken in system calls are charged to the libc functions that made the calls"
    };
    format!(
        "The kernel charged the process {} of user and {} of system CPU time ({} system); {system_time}.",
        seconds(cpu.user_ns),
        seconds(cpu.system_ns),
        system_share(cpu)
    )
}

/// The `-i` line for one file.
pub fn info_line(cpu: CpuTime) -> String {
    format!(
        "\tCPU time: {} user, {} system ({} system)",
        seconds(cpu.user_ns),
        seconds(cpu.system_ns),
        system_share(cpu)
    )
}

fn seconds(ns: u64) -> String {
    format!("{:.2} s", ns as f64 / 1e9)
}

fn system_share(cpu: CpuTime) -> String {
    let total = cpu.user_ns as f64 + cpu.system_ns as f64;
    if total <= 0.0 {
        return "0 %".into();
    }
    format!("{:.0} %", cpu.system_ns as f64 * 100.0 / total)
}
