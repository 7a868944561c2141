//! Fatal and terminating signals: write what was collected (INCOMPLETE, cause = the signal), then let the
//! signal take the effect it would have had without mslprof (same exit status, same core dump).
//!
//! Installed at start-up for SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTERM, SIGINT and SIGHUP, except for
//! signals that are ignored at that moment (a `nohup`'d SIGHUP, a background job's SIGINT stay ignored). The
//! disposition found at install (another library's handler, or SIG_DFL) is chained to: if it was a handler, that
//! handler runs instead of our dump, exactly as it would have. A handler the program installs later replaces
//! ours, so the program's own crash handling is never changed; if that handler then calls `_exit`, the `_exit`
//! hook still writes the profile. `MSLPROF_ABNORMAL_DUMP=0` turns all of this off. SIGKILL (and SIGSTOP) cannot
//! be caught: a killed process leaves no profile.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::events::ProcessEnd;
use crate::process;
use crate::sys::{self, SignalAction};

/// The signals we handle, with whether a kernel-generated instance re-faults when the handler returns.
const HANDLED: [(libc::c_int, bool); 8] = [
    (libc::SIGSEGV, true),
    (libc::SIGBUS, true),
    (libc::SIGILL, true),
    (libc::SIGFPE, true),
    (libc::SIGABRT, false),
    (libc::SIGTERM, false),
    (libc::SIGINT, false),
    (libc::SIGHUP, false),
];

/// Highest signal number we keep state for.
const MAX_SIGNAL: usize = 32;

/// The disposition each handled signal had before ours. Written once at install (before the handler can run),
/// then only read, from the handler.
struct PreviousActions {
    actions: std::cell::UnsafeCell<[Option<SignalAction>; MAX_SIGNAL]>,
    installed: [AtomicBool; MAX_SIGNAL],
}

// SAFETY: `actions[s]` is written only by `install` before `installed[s]` is set (release) and before our
// handler for `s` exists; afterwards it is only read (after an acquire load of `installed[s]`).
unsafe impl Sync for PreviousActions {}

static PREVIOUS: PreviousActions = PreviousActions {
    actions: std::cell::UnsafeCell::new([None; MAX_SIGNAL]),
    installed: [const { AtomicBool::new(false) }; MAX_SIGNAL],
};

/// 0: no dump yet; 1: a thread is dumping; 2: the dump is written.
static DUMP_STATE: AtomicU32 = AtomicU32::new(0);

pub(crate) fn install() {
    if !process::ABNORMAL_DUMP.load(Ordering::Relaxed) {
        return;
    }
    for (signal, _) in HANDLED {
        let index = signal as usize;
        if index >= MAX_SIGNAL || PREVIOUS.installed[index].load(Ordering::Acquire) {
            continue;
        }
        let Some(previous) = sys::install_signal_handler(signal, on_signal) else {
            continue;
        };
        if sys::is_ignore(&previous) {
            // Ignored signals stay ignored.
            sys::set_signal_action(signal, &previous);
            continue;
        }
        // SAFETY: see `PreviousActions`: the slot is not yet published, and our handler only reads it after
        // `installed` is set; a signal arriving in between finds `installed` false and re-raises with SIG_DFL.
        unsafe { (*PREVIOUS.actions.get())[index] = Some(previous) };
        PREVIOUS.installed[index].store(true, Ordering::Release);
    }
}

fn previous_action(signal: libc::c_int) -> Option<SignalAction> {
    let index = usize::try_from(signal).ok().filter(|&i| i < MAX_SIGNAL)?;
    if !PREVIOUS.installed[index].load(Ordering::Acquire) {
        return None;
    }
    // SAFETY: published by `install` (release/acquire on `installed`), never written again.
    unsafe { (*PREVIOUS.actions.get())[index] }
}

extern "C" fn on_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let _errno = sys::SavedErrno::save();
    let previous = previous_action(signal);
    if let Some(previous) = previous.filter(|p| !sys::is_default(p) && !sys::is_ignore(p)) {
        // Someone else's handler was there first: it decides, as it would have without us.
        // SAFETY: `previous` is a real handler, and info/context are the kernel's values for this signal.
        unsafe { sys::call_program_handler(&previous, signal, info, context) };
        return;
    }
    // The default action is to end the process: write the profile once, then end it the same way.
    match DUMP_STATE.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            process::report_end(ProcessEnd::Signal { signal });
            DUMP_STATE.store(2, Ordering::Release);
        }
        Err(_) => {
            // Another thread is writing the profile: give it up to ~2 s before the process goes down.
            for _ in 0..200 {
                if DUMP_STATE.load(Ordering::Acquire) == 2 {
                    break;
                }
                sys::sleep_10ms();
            }
        }
    }
    sys::set_signal_action(signal, &sys::default_action());
    let refaults = HANDLED.iter().any(|&(s, r)| s == signal && r);
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let sent_by_kernel = !info.is_null() && unsafe { (*info).si_code } > 0;
    if refaults && sent_by_kernel {
        // Returning re-executes the faulting instruction, which now gets the default action (and core dump)
        // with the original fault address and code.
        return;
    }
    // Blocked while this handler runs: delivered with SIG_DFL as soon as it returns.
    sys::raise_in_this_thread(signal);
}
