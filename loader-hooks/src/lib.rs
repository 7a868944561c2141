//! Loader events for the runtime: start-up scan, dlopen/dlclose, fork, exec and termination.
//!
//! The Linux counterparts of HP-UX MSLP's dynamic-loader events (POST_INIT, LOAD_COMPLETE, UNLOAD_POST_FINI,
//! TERMINATE_START) plus the process events a profile must survive. The runtime implements
//! [`LoaderEvents`] and calls [`install`] from its constructor; see loader-hooks/README.md for the mechanism and
//! why it was chosen.
//!
//! Modules, each depending only on those above it: `sys` (libc and system calls), `scan` (the loaded
//! modules), `events` (what the runtime is told, and its handler), `program_actions` (the program's view of its
//! signal actions), `process` (identity, exec, `_exit`), `signals` (fatal-signal dumps), `dynamic_loading`
//! (`dlopen`/`dlclose`), `fork`, `stubs` (the assembly) and `exports` (every exported symbol).

pub mod dynamic_loading;
pub mod events;
mod exports;
mod fork;
pub mod process;
pub mod program_actions;
pub mod scan;
pub mod signals;
mod stubs;
pub mod sys;

pub use dynamic_loading::{open_in_progress, refresh, refresh_during_open, while_loader_idle};
pub use events::{LoadCause, LoaderEvents, ProcessEnd};
pub use process::{is_profiled_process, on_main_thread, profiled_pid};
pub use scan::{LinkRange, LoaderScan, ModuleInfo, scan, scan_loaded_modules};
pub use sys::SavedErrno;

/// Starts delivering loader events to `events`: resolves the interposed functions' real definitions,
/// registers the fork handlers, installs the abnormal-end signal handlers (unless `MSLPROF_ABNORMAL_DUMP=0`),
/// and delivers the start-up scan (every module loaded now) through [`LoaderEvents::modules_changed`].
///
/// Call it once, from the runtime's constructor. A second call does nothing and returns false.
pub fn install(events: &'static dyn LoaderEvents) -> bool {
    if !events::set_handler(events) {
        return false;
    }
    dynamic_loading::resolve_real_functions();
    process::install();
    fork::install();
    signals::install();
    dynamic_loading::startup_scan();
    true
}
