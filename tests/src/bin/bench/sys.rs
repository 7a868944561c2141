//! The one place the benchmark harness calls libc: waiting for a child with its resource usage.

use std::io;
use std::time::Duration;

/// What `wait4` reports about a finished child.
pub struct ChildUsage {
    pub exit_code: Option<i32>,
    /// Peak resident set size in KiB.
    pub max_rss_kib: u64,
    pub user_cpu: Duration,
    pub system_cpu: Duration,
}

/// Waits for the child `pid` and returns its exit status and resource usage.
pub fn wait_with_usage(pid: u32) -> io::Result<ChildUsage> {
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = pid as libc::pid_t;
    loop {
        // SAFETY: `status` and `usage` are valid, writable and live for the call; `pid` is our own child.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    let exit_code = if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else {
        None
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    Ok(ChildUsage {
        exit_code,
        max_rss_kib: usage.ru_maxrss as u64,
        user_cpu: tv(usage.ru_utime),
        system_cpu: tv(usage.ru_stime),
    })
}
