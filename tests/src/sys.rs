//! The test helpers' one use of raw libc: reaping a child with `wait4` to learn the CPU time it used.

use std::time::Duration;

/// Waits for the child `pid` and returns its raw wait status and its CPU time (user + system).
pub fn wait_with_cpu_time(pid: u32) -> std::io::Result<(i32, Duration)> {
    let mut status = 0;
    // SAFETY: all-zero is a valid `rusage` (integers and timevals only).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are valid out-pointers; `pid` is our own unreaped child.
        let reaped = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
        if reaped == pid as libc::pid_t {
            break;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    let cpu = Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime));
    Ok((status, cpu))
}
