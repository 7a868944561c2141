//! `MSLPROF_PERF_MAP=1`: names the runtime's code outside any file for `perf`, in the map file perf reads for
//! code that JITs generate (`/tmp/perf-PID.map`, one `START SIZE name` line per piece of code, hexadecimal).
//!
//! Without it, `perf report` shows the time in the per-function stubs (`mcount::sites`), the copies of
//! `mcount`'s hit path next to them and next to the main program (`mcount::near`), and the PLT-counting
//! stubs (libmslprof_audit.so's arena, which names itself in the same file) as `[JIT] tid N`. Off by default:
//! the runtime writes nothing outside the profile unasked.
//!
//! A file of the same name left by an earlier process with this pid (born before this process started) is
//! removed first; the lines are appended, since the audit module may have written its line already. A forked
//! child copies its parent's file to its own name.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::sys;

/// Whether `MSLPROF_PERF_MAP=1` asked for the file.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The map file perf reads for process `pid`, NUL-terminated.
fn path_of(pid: u32) -> Vec<u8> {
    format!("/tmp/perf-{pid}.map\0").into_bytes()
}

/// At start-up, once the stubs and copies are mapped: writes their lines when `MSLPROF_PERF_MAP=1`.
pub fn write_at_start_up() {
    if std::env::var_os("MSLPROF_PERF_MAP").is_none_or(|value| value != "1") {
        return;
    }
    ENABLED.store(true, Ordering::Relaxed);
    let path = path_of(sys::getpid());
    let Ok(c_path) = std::ffi::CStr::from_bytes_with_nul(&path) else {
        return;
    };
    if let (Some((_, born)), Some(started)) =
        (sys::inode_and_birth(c_path), sys::process_start_ns())
        && born < started
    {
        sys::remove_file(&path);
    }
    let mut lines = String::new();
    #[cfg(target_arch = "x86_64")]
    crate::mcount::for_each_generated_code(|start, len, name| {
        let _ = writeln!(lines, "{start:x} {len:x} {name}");
    });
    if lines.is_empty() {
        return;
    }
    if sys::append_to_file(&path, lines.as_bytes()).is_err() {
        sys::stderr_line(&[
            b"mslprof: MSLPROF_PERF_MAP: cannot write ",
            &path[..path.len() - 1],
            b"\n",
        ]);
    }
}

/// In a forked child: copies the parent's map file to the child's name (the code is at the same addresses).
/// Allocation-free.
#[inline]
#[unsafe(link_section = "mslprof_fork_text")]
pub fn copy_after_fork() {
    if ENABLED.load(Ordering::Relaxed) {
        copy_parents_file();
    }
}

#[cold]
fn copy_parents_file() {
    let mut parent = [0u8; 32];
    let mut child = [0u8; 32];
    let (Some(parent), Some(child)) = (
        pid_path(sys::getppid(), &mut parent),
        pid_path(sys::getpid(), &mut child),
    ) else {
        return;
    };
    sys::copy_file(parent, child);
}

/// `/tmp/perf-PID.map` with its NUL in `buffer`, without allocating.
fn pid_path(pid: u32, buffer: &mut [u8; 32]) -> Option<&[u8]> {
    let mut digits = [0u8; 10];
    let parts: [&[u8]; 4] = [
        b"/tmp/perf-",
        crate::dump::file::decimal(u64::from(pid), &mut digits),
        b".map",
        b"\0",
    ];
    let mut used = 0;
    for part in parts {
        buffer
            .get_mut(used..used + part.len())?
            .copy_from_slice(part);
        used += part.len();
    }
    Some(&buffer[..used])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_is_perfs() {
        let mut buffer = [0u8; 32];
        assert_eq!(
            pid_path(4242, &mut buffer),
            Some(&b"/tmp/perf-4242.map\0"[..])
        );
        assert_eq!(pid_path(0, &mut buffer), Some(&b"/tmp/perf-0.map\0"[..]));
        assert_eq!(path_of(17), b"/tmp/perf-17.map\0");
    }
}
