//! Which process this is and how it ends: the profiled pid, the exec family (the image's profile is written
//! before `execve` replaces it), `_exit`/`_Exit` (which skip atexit handlers) and the one report of the end that
//! fatal signals use too. Fork is in fork.rs.
//!
//! Only the process that installed loader-hooks (or a child it forked, after the child handler ran) acts on
//! these events: a `vfork` child shares the parent's memory and must not write the parent's data, and a
//! `posix_spawn` child calls glibc's internal `__execve`, never our stubs. Both are recognised because their pid
//! differs from [`profiled_pid`].

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use crate::events::{self, ProcessEnd};
use crate::sys;

/// The pid whose profile this memory holds (set at install and in a forked child).
#[unsafe(link_section = "mslprof_fork_data")]
static PROFILED_PID: AtomicI32 = AtomicI32::new(0);
/// Whether abnormal ends (`_exit`, fatal signals) are dumped (`MSLPROF_ABNORMAL_DUMP=0` turns it off).
static ABNORMAL_DUMP: AtomicBool = AtomicBool::new(true);
/// Whether the image is being replaced or the process is ending through one of our hooks: the first event
/// dumps, later ones (e.g. `_exit` from a signal handler after a crash dump) do not.
#[unsafe(link_section = "mslprof_fork_data")]
static ENDING: AtomicBool = AtomicBool::new(false);

/// The pid whose data the runtime holds, 0 before install.
pub fn profiled_pid() -> i32 {
    PROFILED_PID.load(Ordering::Relaxed)
}

/// Whether the calling process is the one whose data this memory holds (false in a vfork/clone child).
/// Async-signal-safe.
pub fn is_profiled_process() -> bool {
    let pid = profiled_pid();
    pid != 0 && pid == sys::process_id()
}

/// Whether the calling thread is the process's main thread (its tid equals the pid). Async-signal-safe.
pub fn on_main_thread() -> bool {
    sys::thread_id() == sys::process_id()
}

/// Whether abnormal ends are dumped (false with `MSLPROF_ABNORMAL_DUMP=0`, read at install).
pub(crate) fn abnormal_dumps_enabled() -> bool {
    ABNORMAL_DUMP.load(Ordering::Relaxed)
}

pub(crate) fn install() {
    PROFILED_PID.store(sys::process_id(), Ordering::Relaxed);
    if sys::environment_value(b"MSLPROF_ABNORMAL_DUMP\0") == Some(b"0") {
        ABNORMAL_DUMP.store(false, Ordering::Relaxed);
    }
    for entry in &EXEC_ENTRIES {
        entry.resolve();
    }
    REAL_EXIT.store(sys::next_definition(b"_exit\0"), Ordering::Relaxed);
}

/// In a forked child: this process is now the profiled one, and it has not begun to end.
#[unsafe(link_section = "mslprof_fork_text")]
pub(crate) fn reset_after_fork() {
    PROFILED_PID.store(sys::process_id(), Ordering::Relaxed);
    ENDING.store(false, Ordering::Relaxed);
}

/// Tells the runtime that the process (image) ends, once, if this process is the profiled one.
/// Returns whether the runtime was told. Async-signal-safe as far as loader-hooks is concerned.
#[unsafe(link_section = "mslprof_fork_text")]
pub(crate) fn report_end(end: ProcessEnd) -> bool {
    if !is_profiled_process() {
        return false;
    }
    if !matches!(end, ProcessEnd::Exec) && !abnormal_dumps_enabled() {
        return false;
    }
    if ENDING.swap(true, Ordering::AcqRel) {
        return false;
    }
    match events::handler() {
        Some(events) => {
            events.process_ending(end);
            true
        }
        None => false,
    }
}

/// One function of the exec family: its name and where the real one is.
struct ExecEntry {
    name: &'static [u8],
    real: AtomicUsize,
}

impl ExecEntry {
    const fn new(name: &'static [u8]) -> Self {
        ExecEntry {
            name,
            real: AtomicUsize::new(0),
        }
    }

    fn resolve(&self) -> usize {
        let known = self.real.load(Ordering::Relaxed);
        if known != 0 {
            return known;
        }
        let found = sys::next_definition(self.name);
        self.real.store(found, Ordering::Relaxed);
        found
    }
}

static EXEC_ENTRIES: [ExecEntry; 9] = [
    ExecEntry::new(b"execve\0"),
    ExecEntry::new(b"execv\0"),
    ExecEntry::new(b"execvp\0"),
    ExecEntry::new(b"execvpe\0"),
    ExecEntry::new(b"execl\0"),
    ExecEntry::new(b"execlp\0"),
    ExecEntry::new(b"execle\0"),
    ExecEntry::new(b"fexecve\0"),
    ExecEntry::new(b"execveat\0"),
];

/// Called by the exec stubs: write the image's profile (PRE_EXEC), then return the real function to jump to.
/// If the exec then fails, the program goes on and its exit writes the full profile again under the normal
/// name; the pre-exec file stays as the snapshot taken at that moment.
pub(crate) extern "C" fn before_exec(entry: u32) -> usize {
    let _errno = sys::SavedErrno::save();
    let Some(exec) = EXEC_ENTRIES.get(entry as usize) else {
        return 0;
    };
    if is_profiled_process() {
        let _ = std::panic::catch_unwind(|| {
            if report_end(ProcessEnd::Exec) {
                // The exec may fail; then the process goes on and must be able to dump again at its end.
                ENDING.store(false, Ordering::Release);
            }
        });
    }
    exec.resolve()
}

/// libc's `_exit`, resolved at install (0: use the system call directly).
static REAL_EXIT: AtomicUsize = AtomicUsize::new(0);

/// `_exit` and `_Exit` (exports.rs): the profile is written (INCOMPLETE, cause `_exit`), then the process ends
/// with `status` through libc's `_exit` (or the system call if it was not found).
#[unsafe(link_section = "mslprof_fork_text")]
pub(crate) fn exit_after_dump(status: i32) -> ! {
    let _ = std::panic::catch_unwind(|| report_end(ProcessEnd::UnderscoreExit { status }));
    let real = REAL_EXIT.load(Ordering::Relaxed);
    if real != 0 {
        // SAFETY: `real` is libc's `_exit`, found by dlsym(RTLD_NEXT, "_exit").
        unsafe { sys::call_exit(real, status) }
    }
    sys::exit_group(status)
}
