//! The test helpers' uses of raw libc: reaping a child with `wait4` to learn the resources it used, sending a
//! child a signal, starting a child with the interrupt signals at their default action, and finding a symbol in
//! the running process.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};
use std::time::Duration;

/// What `wait4` reports about a child that ended.
#[derive(Clone, Copy, Debug)]
pub struct ChildUsage {
    pub status: ExitStatus,
    /// Peak resident set size in KiB.
    pub max_rss_kib: u64,
    pub user_cpu: Duration,
    pub system_cpu: Duration,
}

impl ChildUsage {
    /// User and system CPU time together.
    pub fn cpu(&self) -> Duration {
        self.user_cpu + self.system_cpu
    }
}

/// Waits for the child `pid` (not yet reaped, e.g. a `std::process::Child` never waited for) to end and
/// returns its exit status and resource usage.
pub fn wait_with_usage(pid: u32) -> std::io::Result<ChildUsage> {
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
    let time =
        |t: libc::timeval| Duration::from_micros(t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64);
    Ok(ChildUsage {
        status: ExitStatus::from_raw(status),
        max_rss_kib: usage.ru_maxrss as u64,
        user_cpu: time(usage.ru_utime),
        system_cpu: time(usage.ru_stime),
    })
}

/// Sends `signal` to the process `pid`; false when it is gone.
pub fn send_signal(pid: u32, signal: i32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill takes two integers and touches no memory of ours.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// The address of the global symbol `name` in this process (`dlsym(RTLD_DEFAULT, name)`), if any object
/// defines it.
pub fn global_symbol(name: &std::ffi::CStr) -> Option<usize> {
    // SAFETY: `name` is a NUL-terminated string; dlsym only reads it.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!address.is_null()).then_some(address as usize)
}

/// Makes `command`'s child start with SIGINT and SIGQUIT at their default action. A shell without job control
/// starts its background jobs with both ignored (POSIX), every descendant inherits that, and the runtime keeps
/// an ignored signal ignored, as `nohup` needs: a fixture that ends itself with `raise(SIGINT)` would then carry
/// on, in a test suite started in the background.
pub fn default_interrupt_signals(command: &mut Command) {
    // SAFETY: the closure runs in the forked child before `exec` and only calls `signal`, which is
    // async-signal-safe; the actions it sets are the kernel's defaults.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            Ok(())
        });
    }
}
