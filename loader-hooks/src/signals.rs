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
//! the program's action and answers queries with it, so the program always sees the disposition it set.
//! `MSLPROF_ABNORMAL_DUMP=0` turns all of this off (nothing is watched, nothing installed). SIGKILL and SIGSTOP
//! cannot be caught: a process killed by SIGKILL leaves no profile. Code that bypasses libc (raw
//! `rt_sigaction`) is not seen.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::events::ProcessEnd;
use crate::process;
use crate::sys::{self, SignalAction};

pub use crate::sys::call_program_handler;

/// The watched signals, with whether a kernel-generated instance re-faults when the handler returns.
const WATCHED_SIGNALS: [(libc::c_int, bool); 8] = [
    (libc::SIGSEGV, true),
    (libc::SIGBUS, true),
    (libc::SIGILL, true),
    (libc::SIGFPE, true),
    (libc::SIGABRT, false),
    (libc::SIGTERM, false),
    (libc::SIGINT, false),
    (libc::SIGHUP, false),
];

/// Highest signal number (exclusive) we keep state for.
const MAX_SIGNAL: usize = 32;
const MASK_WORDS: usize = std::mem::size_of::<libc::sigset_t>() / 8;

/// The program's action for one signal, readable from the signal handler (atomics only).
struct ProgramAction {
    watched: AtomicBool,
    handler: AtomicUsize,
    flags: AtomicI32,
    mask: [AtomicU64; MASK_WORDS],
}

impl ProgramAction {
    const fn new() -> Self {
        ProgramAction {
            watched: AtomicBool::new(false),
            handler: AtomicUsize::new(0),
            flags: AtomicI32::new(0),
            mask: [const { AtomicU64::new(0) }; MASK_WORDS],
        }
    }

    fn store(&self, action: &SignalAction) {
        self.handler.store(action.sa_sigaction, Ordering::Relaxed);
        self.flags.store(action.sa_flags, Ordering::Relaxed);
        // SAFETY: sigset_t is plain data, MASK_WORDS 64-bit words.
        let words: [u64; MASK_WORDS] = unsafe { std::mem::transmute_copy(&action.sa_mask) };
        for (slot, word) in self.mask.iter().zip(words) {
            slot.store(word, Ordering::Relaxed);
        }
    }

    fn load(&self) -> SignalAction {
        let mut words = [0u64; MASK_WORDS];
        for (word, slot) in words.iter_mut().zip(&self.mask) {
            *word = slot.load(Ordering::Relaxed);
        }
        let mut action = sys::empty_action();
        action.sa_sigaction = self.handler.load(Ordering::Relaxed);
        action.sa_flags = self.flags.load(Ordering::Relaxed);
        // SAFETY: same size, plain data.
        action.sa_mask = unsafe { std::mem::transmute_copy(&words) };
        action
    }
}

static PROGRAM: [ProgramAction; MAX_SIGNAL] = [const { ProgramAction::new() }; MAX_SIGNAL];

/// 0: no dump yet; 1: a thread is dumping; 2: the dump is written.
static DUMP_STATE: AtomicU32 = AtomicU32::new(0);

fn slot(signal: libc::c_int) -> Option<&'static ProgramAction> {
    PROGRAM.get(usize::try_from(signal).ok()?)
}

/// Whether loader-hooks keeps the program's action for `signal`.
pub fn is_watched(signal: libc::c_int) -> bool {
    slot(signal).is_some_and(|s| s.watched.load(Ordering::Acquire))
}

pub(crate) fn install() {
    if !process::ABNORMAL_DUMP.load(Ordering::Relaxed) || !sys::resolve_real_sigaction() {
        return;
    }
    for (signal, _) in WATCHED_SIGNALS {
        let Some(state) = slot(signal) else { continue };
        let mut current = sys::empty_action();
        if !sys::set_and_get_action(signal, None, Some(&mut current)) {
            continue;
        }
        state.store(&current);
        state.watched.store(true, Ordering::Release);
        apply(signal, state);
    }
}

/// Installs the real action that corresponds to the program's action (see the module documentation).
fn apply(signal: libc::c_int, state: &ProgramAction) {
    let program = state.load();
    let real = if program.sa_sigaction == libc::SIG_IGN {
        program
    } else if program.sa_sigaction == libc::SIG_DFL {
        sys::handler_action(on_signal, libc::SA_ONSTACK | libc::SA_RESTART, None)
    } else {
        let kept = program.sa_flags & (libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER);
        sys::handler_action(on_signal, kept, Some(&program.sa_mask))
    };
    sys::set_and_get_action(signal, Some(&real), None);
}

/// The runtime's `sigaction` interposer calls this first: for a watched signal, record the program's new
/// action (and give back its previous one) and return `Some(0)`; for other signals `None` (pass through).
///
/// # Safety
/// `action` and `old` are null or valid, as for `sigaction(2)`.
pub unsafe fn program_sigaction(
    signal: libc::c_int,
    action: *const SignalAction,
    old: *mut SignalAction,
) -> Option<libc::c_int> {
    let state = slot(signal).filter(|s| s.watched.load(Ordering::Acquire))?;
    // SAFETY: the caller passes null or a valid pointer.
    if let Some(old) = unsafe { old.as_mut() } {
        *old = state.load();
    }
    // SAFETY: the caller passes null or a valid pointer.
    if let Some(action) = unsafe { action.as_ref() } {
        state.store(action);
        apply(signal, state);
    }
    Some(0)
}

extern "C" fn on_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let _errno = sys::SavedErrno::save();
    let Some(state) = slot(signal) else { return };
    let handler = state.handler.load(Ordering::Relaxed);
    let flags = state.flags.load(Ordering::Relaxed);
    let refaults = WATCHED_SIGNALS.iter().any(|&(s, r)| s == signal && r);
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let sent_by_kernel = !info.is_null() && unsafe { (*info).si_code } > 0;
    if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
        if flags & libc::SA_RESETHAND != 0 {
            let mut default = state.load();
            default.sa_sigaction = libc::SIG_DFL;
            default.sa_flags &= !libc::SA_RESETHAND;
            state.store(&default);
            apply(signal, state);
        }
        // SAFETY: the program installed `handler` for `signal` with these flags; info/context are the
        // kernel's for this delivery.
        unsafe {
            sys::call_program_handler(
                handler,
                flags & libc::SA_SIGINFO != 0,
                signal,
                info,
                context,
            )
        };
        return;
    }
    if handler == libc::SIG_IGN && !(refaults && sent_by_kernel) {
        // Only in the instant between the program's sigaction and ours: ignored, as the program asked.
        return;
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
