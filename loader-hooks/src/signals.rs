//! Fatal and terminating signals: write what was collected (INCOMPLETE, cause = the signal), then let the
//! signal take the effect it would have had without mslprof (same exit status, same core dump).
//!
//! Watched: SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTERM, SIGINT and SIGHUP. For each, loader-hooks keeps
//! the *program's* action (what it last set with `sigaction`/`signal`, or what was there at start-up) and
//! installs the real action from it:
//!
//! * program action SIG_IGN → the real action is SIG_IGN (so an ignored signal stays ignored across `exec`,
//!   as `nohup` needs);
//! * SIG_DFL → our handler: write the profile, restore SIG_DFL, and let the signal end the process: a
//!   kernel-generated fault returns to the faulting instruction (same fault address, same core dump), any other
//!   signal is re-raised and delivered when the handler returns;
//! * a handler → our handler, installed with the program's mask and its SA_RESTART / SA_ONSTACK / SA_NODEFER
//!   flags (so interrupted system calls behave exactly as the program asked), which calls the program's handler
//!   as the kernel would have (SA_SIGINFO or plain form; SA_RESETHAND honoured). If that handler later puts
//!   SIG_DFL back and re-raises (the usual crash-handler pattern), the profile is written then.
//!
//! The runtime's `sigaction`/`signal` interposers route these signals to [`program_sigaction`], which records
//! the program's action in [`crate::program_actions`] (shared with the runtime's SIGPROF policy) and answers
//! queries with it, so the program always sees the disposition it set.
//! `MSLPROF_ABNORMAL_DUMP=0` turns all of this off (nothing is watched, nothing installed). SIGKILL and SIGSTOP
//! cannot be caught: a process killed by SIGKILL leaves no profile. Code that bypasses libc (raw
//! `rt_sigaction`) is not seen.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::events::ProcessEnd;
use crate::process;
use crate::program_actions::{self, Delivery, ProgramAction};
use crate::sys::{self, SignalAction, SignalInfo};

/// The watched signals, with whether a kernel-generated instance re-faults when the handler returns.
const WATCHED_SIGNALS: [(c_int, bool); 8] = [
    (sys::SIGSEGV, true),
    (sys::SIGBUS, true),
    (sys::SIGILL, true),
    (sys::SIGFPE, true),
    (sys::SIGABRT, false),
    (sys::SIGTERM, false),
    (sys::SIGINT, false),
    (sys::SIGHUP, false),
];

/// Bit `n` set: signal `n` is watched (its real action is ours, its program action kept in program_actions).
static WATCHED: AtomicU32 = AtomicU32::new(0);

/// 0: no dump yet; 1: a thread is dumping; 2: the dump is written. Per process (see [`reset_after_fork`]).
#[unsafe(link_section = "mslprof_fork_data")]
static DUMP_STATE: AtomicU32 = AtomicU32::new(0);

/// Whether loader-hooks keeps the program's action for `signal`.
pub fn is_watched(signal: c_int) -> bool {
    u32::try_from(signal)
        .ok()
        .and_then(|n| 1u32.checked_shl(n))
        .is_some_and(|bit| WATCHED.load(Ordering::Acquire) & bit != 0)
}

/// The program's action for a watched signal.
fn watched(signal: c_int) -> Option<&'static ProgramAction> {
    program_actions::of(signal).filter(|_| is_watched(signal))
}

pub(crate) fn install() {
    if !process::abnormal_dumps_enabled() || !sys::resolve_real_sigaction() {
        return;
    }
    for (signal, _) in WATCHED_SIGNALS {
        let Some(program) = program_actions::of(signal) else {
            continue;
        };
        let mut current = sys::empty_action();
        if !sys::set_and_get_action(signal, None, Some(&mut current)) {
            continue;
        }
        program.record(&current);
        WATCHED.fetch_or(1 << signal, Ordering::Release);
        apply(signal, program);
    }
}

/// In a forked child: no dump is in progress in this process (a parent's thread that was dumping does not
/// exist here).
#[unsafe(link_section = "mslprof_fork_text")]
pub(crate) fn reset_after_fork() {
    DUMP_STATE.store(0, Ordering::Relaxed);
}

/// Installs the real action that corresponds to the program's action (see the module documentation).
fn apply(signal: c_int, program: &ProgramAction) {
    let action = program.current();
    let real = if action.sa_sigaction == sys::SIG_IGN {
        action
    } else if action.sa_sigaction == sys::SIG_DFL {
        sys::handler_action(
            on_signal,
            sys::SA_ONSTACK | sys::SA_RESTART,
            &sys::all_signals(),
        )
    } else {
        let kept = action.sa_flags & (sys::SA_RESTART | sys::SA_ONSTACK | sys::SA_NODEFER);
        sys::handler_action(on_signal, kept, &action.sa_mask)
    };
    sys::set_and_get_action(signal, Some(&real), None);
}

/// The runtime's `sigaction` interposer calls this first: for a watched signal, record the program's new
/// action (and give back its previous one) and return `Some(0)`; for other signals `None` (pass through).
///
/// # Safety
/// `action` and `old` are null or valid, as for `sigaction(2)`.
pub unsafe fn program_sigaction(
    signal: c_int,
    action: *const SignalAction,
    old: *mut SignalAction,
) -> Option<c_int> {
    let program = watched(signal)?;
    // SAFETY: the caller's pointers, null or valid.
    if unsafe { program.exchange(action, old) } {
        apply(signal, program);
    }
    Some(0)
}

extern "C" fn on_signal(signal: c_int, info: *mut SignalInfo, context: *mut c_void) {
    let _errno = sys::SavedErrno::save();
    let Some(program) = program_actions::of(signal) else {
        return;
    };
    let refaults = WATCHED_SIGNALS.iter().any(|&(s, r)| s == signal && r);
    // SAFETY: the kernel passes a valid siginfo_t (or null) to an SA_SIGINFO handler.
    let sent_by_kernel = unsafe { sys::sent_by_kernel(info) };
    match program.deliver() {
        Delivery::Handler { handler, flags } => {
            if flags & sys::SA_RESETHAND != 0 {
                // deliver() put SIG_DFL back as the program's action: make the real action follow.
                apply(signal, program);
            }
            // SAFETY: the program installed `handler` for `signal` with these flags; info/context are the
            // kernel's for this delivery, and the kernel applied the program's mask (our real action has it).
            unsafe { program_actions::call_handler(handler, flags, signal, info, context) };
            return;
        }
        // Only in the instant between the program's sigaction and ours: ignored, as the program asked.
        Delivery::Ignore if !(refaults && sent_by_kernel) => return,
        Delivery::Ignore | Delivery::Default => {}
    }
    // The default action ends the process: write the profile once, then end it the same way.
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
    sys::set_and_get_action(signal, Some(&sys::empty_action()), None);
    if refaults && sent_by_kernel {
        // Returning re-executes the faulting instruction, which now gets the default action (and core dump)
        // with the original fault address and code.
        return;
    }
    // Blocked while this handler runs (unless the program asked for SA_NODEFER): delivered with SIG_DFL as
    // soon as the handler returns.
    sys::raise_in_this_thread(signal);
}
