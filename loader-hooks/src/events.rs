//! The loader events the runtime receives: the Linux counterparts of HP-UX's POST_INIT, LOAD_COMPLETE,
//! UNLOAD_POST_FINI and TERMINATE_START, plus the process events (fork, exec, abnormal ends) that HP-UX
//! handled elsewhere.
//!
//! The runtime implements [`LoaderEvents`] once and passes it to [`crate::install`]. Every callback is made
//! by loader-hooks from the thread where the event happened; which callbacks may run inside a signal handler
//! is said on each one.

use std::sync::OnceLock;

use crate::scan::LoaderScan;

/// The runtime's event handler: set once by [`crate::install`], never replaced.
static HANDLER: OnceLock<&'static dyn LoaderEvents> = OnceLock::new();

/// Records the runtime's handler; false if one was recorded already.
pub(crate) fn set_handler(events: &'static dyn LoaderEvents) -> bool {
    HANDLER.set(events).is_ok()
}

/// The runtime's event handler, once installed. Lock-free (an atomic load once set).
pub(crate) fn handler() -> Option<&'static dyn LoaderEvents> {
    HANDLER.get().copied()
}

/// Why the set of loaded modules is being looked at again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadCause {
    /// An interposed `dlopen`/`dlmopen` returned (its modules are initialised; LOAD_COMPLETE).
    AfterOpen,
    /// An interposed `dlclose` returned (whatever it unloaded is gone; UNLOAD_POST_FINI).
    AfterClose,
    /// Code of a module that is not in the runtime's table ran on the thread that is inside `dlopen`: a
    /// constructor (or IFUNC resolver) of a module being loaded. The new modules are relocated but not yet
    /// initialised: this is the "before any of its code runs" registration.
    DuringOpen,
    /// Something else asked (fork, exec, termination, the runtime itself).
    Explicit,
}

/// How a process (or a process image) ends, for the dump's header (SPEC.md §4, `incomplete_cause`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessEnd {
    /// `exit()` from a thread other than the main one while other threads still ran (cause 3).
    ExitFromThread,
    /// `_exit()` or `_Exit()` (cause 2): no atexit handler runs, so loader-hooks dumps first.
    UnderscoreExit { status: i32 },
    /// A fatal or terminating signal (cause 1). Called inside the signal handler: async-signal-safe only.
    Signal { signal: i32 },
    /// `execve` and friends are about to replace the image (cause 4, flag PRE_EXEC).
    Exec,
}

/// What the runtime does on each loader/process event.
///
/// Implementations must not panic (loader-hooks catches unwinding where it can, but some callbacks run in
/// signal handlers) and must not call `dlopen`/`dlclose` themselves.
pub trait LoaderEvents: Sync + std::panic::RefUnwindSafe {
    /// The loaded set changed (the loader's add/remove counters moved since the last call). `scan` is the
    /// complete current set with the counters; the runtime compares it with its table: modules it does not
    /// have are loads (give each a new key, storage, and join sampling), modules it has that are absent are
    /// unloads (stop sampling, keep the data, mark UNLOADED with the next unload order).
    ///
    /// Called with the loader lock held (see [`crate::dynamic_loading`]), never from a signal handler.
    fn modules_changed(&self, scan: &LoaderScan, cause: LoadCause);

    /// `fork()` is about to run on this thread (SIGPROF is already blocked on it).
    fn before_fork(&self) {}
    /// In the parent after `fork()`.
    fn after_fork_in_parent(&self) {}
    /// In the child after `fork()`: reset the counters, re-arm the sampling timer for this thread, remember
    /// that this process is a forked child (FORKED_CHILD, pid-named output). Only this thread exists.
    fn after_fork_in_child(&self) {}

    /// The process (image) ends in a way that skips the runtime's normal exit dump, or execve is about to
    /// replace it. The runtime writes what it has, marked as `end` says. For [`ProcessEnd::Signal`] this runs
    /// inside a signal handler and must be async-signal-safe.
    fn process_ending(&self, end: ProcessEnd);
}
