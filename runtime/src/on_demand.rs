//! Profiles written while the program runs, for long-running programs (MSLP's paper, 2.2.2): the C call
//! `mslprof_dump(path)`, a signal named by `MSLPROF_DUMP_SIGNAL` and a period given by
//! `MSLPROF_DUMP_INTERVAL`. Every snapshot goes through the dump's one pipeline ([`dump::write_file`]: a
//! temporary file renamed into place, so a reader never sees a torn file). Counting
//! goes on; nothing is reset, so each snapshot holds everything since the start.
//!
//! The signal handler only writes one byte to a pipe. A helper thread, started only when one of the two
//! variables is set, waits on that pipe (with the interval as its timeout) and writes the snapshot.

use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use crate::config::Settings;
use crate::dump::{self, DUMP};
use crate::ending::ENDING;
use crate::{mcount, sampler, status, sys};

/// The state of dumps on demand.
struct OnDemand {
    /// The last `.N` used by a snapshot written to the usual path.
    snapshots: AtomicU32,
    /// One snapshot at a time.
    dumping: Mutex<()>,
    /// The wakeup pipe's write end (-1 before the helper thread exists).
    wakeup_fd: AtomicI32,
}

static ON_DEMAND: OnDemand = OnDemand {
    snapshots: AtomicU32::new(0),
    dumping: Mutex::new(()),
    wakeup_fd: AtomicI32::new(-1),
};

/// Why a snapshot was not written, as an errno value.
pub type Errno = i32;

/// Writes the profile collected so far to `path`, or to the usual path (`gmon.out`, `GPROFDIR/PID.prog`,
/// `GMON_OUT_PREFIX.PID`) with `.N` appended, N = 1, 2, ... Sampling pauses while the file is written and
/// then goes on (unless `moncontrol(0)` had paused it); call counting never stops.
pub fn snapshot(path: Option<&[u8]>) -> Result<(), Errno> {
    let Some(settings) = status::settings().filter(|_| status::is_active()) else {
        return Err(libc::ENOTSUP);
    };
    write_snapshot(settings, path)
}

fn write_snapshot(settings: &Settings, path: Option<&[u8]>) -> Result<(), Errno> {
    crate::fork_reset::settle();
    let _one_at_a_time = ON_DEMAND.dumping.lock().unwrap_or_else(|e| e.into_inner());
    if DUMP.exit_dump_written() {
        return Err(libc::ENOTSUP);
    }
    let target = match path {
        Some(p) => p.to_vec(),
        None => {
            let pid = sys::getpid();
            let pid_named = DUMP.in_forked_child() || ENDING.writes_pid_named_file();
            let Some(usual) = settings.output_path(pid, pid_named) else {
                return Err(libc::ENOTSUP);
            };
            let mut usual = ENDING.output_path(usual);
            let n = ON_DEMAND.snapshots.fetch_add(1, Ordering::Relaxed) + 1;
            usual.extend_from_slice(format!(".{n}").as_bytes());
            usual
        }
    };
    let was_sampling = sampler::is_sampling();
    sampler::stop_and_quiesce();
    // SAFETY: sampling is stopped and quiesced until the file is written.
    let written = unsafe { dump::write_file(settings, &target) };
    if was_sampling && !mcount::is_paused() && !DUMP.exit_dump_written() {
        sampler::resume();
    }
    written
}

/// `MSLPROF_DUMP_SIGNAL`: the signal that asks for a snapshot (not SIGPROF, SIGKILL or SIGSTOP).
fn dump_signal(value: Option<&[u8]>) -> Result<Option<i32>, ()> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match sys::signal_number(value) {
        Some(s) if ![libc::SIGPROF, libc::SIGKILL, libc::SIGSTOP].contains(&s) => Ok(Some(s)),
        _ => Err(()),
    }
}

/// `MSLPROF_DUMP_INTERVAL`: seconds between periodic snapshots (a positive whole number).
fn dump_interval(value: Option<&[u8]>) -> Result<Option<u32>, ()> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match std::str::from_utf8(value)
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
    {
        Some(s) if s > 0 && s <= i32::MAX as u32 / 1000 => Ok(Some(s)),
        _ => Err(()),
    }
}

extern "C" fn on_dump_signal(_signal: i32) {
    let fd = ON_DEMAND.wakeup_fd.load(Ordering::Relaxed);
    if fd >= 0 {
        sys::poke(fd);
    }
}

/// Reads `MSLPROF_DUMP_SIGNAL` and `MSLPROF_DUMP_INTERVAL` and, when either is set, starts the helper
/// thread and installs the signal handler. Called once, when profiling has started.
pub fn start_from_environment() {
    let var = |name: &str| std::env::var_os(name).map(|v| v.as_bytes().to_vec());
    let signal = dump_signal(var("MSLPROF_DUMP_SIGNAL").as_deref()).unwrap_or_else(|()| {
        sys::stderr_line(&[
            b"mslprof: MSLPROF_DUMP_SIGNAL is not a signal name the runtime can use; ignored\n",
        ]);
        None
    });
    let interval = dump_interval(var("MSLPROF_DUMP_INTERVAL").as_deref()).unwrap_or_else(|()| {
        sys::stderr_line(&[
            b"mslprof: MSLPROF_DUMP_INTERVAL is not a positive number of seconds; ignored\n",
        ]);
        None
    });
    if signal.is_none() && interval.is_none() {
        return;
    }
    let Some((read_end, write_end)) = sys::wakeup_pipe() else {
        sys::stderr_line(&[b"mslprof: cannot create the dump pipe; no dumps on demand\n"]);
        return;
    };
    ON_DEMAND.wakeup_fd.store(write_end, Ordering::Relaxed);
    let timeout_ms = interval.map_or(-1, |s| (s * 1000) as i32);
    let helper = std::thread::Builder::new()
        .name("mslprof-dump".into())
        .spawn(move || {
            loop {
                sys::wait_and_drain(read_end, timeout_ms);
                if DUMP.exit_dump_written() {
                    return;
                }
                // ENOTSUP: profiling is not (or no longer) active; nothing to say.
                if let Err(errno) = snapshot(None)
                    && errno != libc::ENOTSUP
                {
                    let text = std::io::Error::from_raw_os_error(errno).to_string();
                    sys::stderr_line(&[b"mslprof: snapshot not written: ", text.as_bytes(), b"\n"]);
                }
            }
        });
    if helper.is_err() {
        sys::stderr_line(&[b"mslprof: cannot start the dump thread; no dumps on demand\n"]);
        return;
    }
    if let Some(signal) = signal
        && !sys::install_plain_handler(signal, on_dump_signal)
    {
        sys::stderr_line(&[b"mslprof: cannot install the dump signal handler\n"]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_and_numbers() {
        assert_eq!(dump_signal(Some(b"USR2")), Ok(Some(libc::SIGUSR2)));
        assert_eq!(dump_signal(Some(b"SIGUSR1")), Ok(Some(libc::SIGUSR1)));
        assert_eq!(dump_signal(Some(b"usr2")), Ok(Some(libc::SIGUSR2)));
        assert_eq!(
            dump_signal(Some(b"RTMIN+2")),
            Ok(Some(libc::SIGRTMIN() + 2))
        );
        assert_eq!(dump_signal(Some(b"10")), Ok(Some(10)));
        assert_eq!(dump_signal(None), Ok(None));
        assert_eq!(dump_signal(Some(b"")), Ok(None));
        assert_eq!(dump_signal(Some(b"PROF")), Err(()));
        assert_eq!(dump_signal(Some(b"KILL")), Err(()));
        assert_eq!(dump_signal(Some(b"NOPE")), Err(()));
    }

    #[test]
    fn intervals() {
        assert_eq!(dump_interval(Some(b"5")), Ok(Some(5)));
        assert_eq!(dump_interval(None), Ok(None));
        assert_eq!(dump_interval(Some(b"0")), Err(()));
        assert_eq!(dump_interval(Some(b"1.5")), Err(()));
        assert_eq!(dump_interval(Some(b"-3")), Err(()));
    }
}
