//! Sharing SIGPROF with a program that uses it itself: the SIGPROF policy on top of loader-hooks' view of the
//! program's signal actions (`mslprof_loader_hooks::program_actions`, the same one the fatal-signal dumps use).
//!
//! The runtime owns the real SIGPROF disposition. When the program calls `sigaction`/`signal` for SIGPROF,
//! our interposers record the program's action instead of installing it, and answer queries with it, so the
//! program sees exactly the disposition it set. Our handler tells our timer signals (SI_TIMER with our cookie)
//! from every other SIGPROF (the program's ITIMER_PROF, `kill`, `raise`) and passes the latter to the
//! program's action: its handler is called with its flags and mask, SIG_IGN drops the signal, SIG_DFL
//! terminates the process as the kernel would. So the program's handler gets the signals it would have got
//! without mslprof, and mslprof keeps sampling every thread with its own timers. `setitimer(ITIMER_PROF)` is
//! passed through untouched. The first of these is said once on stderr, and the dump records it
//! (`SAMPLING_SHARED_TIMER`). Code that bypasses libc (raw `rt_sigaction` syscalls) cannot be seen.
//!
//! The state here is per program, not per process: a forked child inherits the parent's SIGPROF action, its
//! sharing and the line already said, so nothing is reset after fork.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use mslprof_loader_hooks::program_actions::{self, Delivery, ProgramAction};
use mslprof_loader_hooks::sys::{
    self as signal_sys, ITIMER_PROF, SA_RESTART, SIG_DFL, SIG_ERR, SIG_IGN, SIGPROF, SignalAction,
    SignalDisposition, SignalHandler, SignalInfo, TimerSetting,
};

use crate::sys;

/// Set once our handler owns SIGPROF.
static OWNED: AtomicBool = AtomicBool::new(false);
/// One line on stderr, whichever use of SIGPROF is seen first.
static WARNED: AtomicBool = AtomicBool::new(false);
/// The program used SIGPROF or ITIMER_PROF itself (recorded in the dump header; read it with [`shared`]).
pub static SHARED: AtomicBool = AtomicBool::new(false);

/// Whether the program used SIGPROF or ITIMER_PROF itself (the dump's `SAMPLING_SHARED_TIMER`).
pub fn shared() -> bool {
    SHARED.load(Ordering::Relaxed)
}

/// The program's SIGPROF action, in loader-hooks' table (which keeps every classic signal, so this is always
/// `Some`).
fn program() -> Option<&'static ProgramAction> {
    program_actions::of(SIGPROF)
}

/// The real sigaction, for any signal.
///
/// # Safety
/// As `sigaction(2)`: pointers null or valid.
pub unsafe fn sigaction_passthrough(
    signal: i32,
    action: *const SignalAction,
    old: *mut SignalAction,
) -> i32 {
    // SAFETY: the caller's pointers, null or valid.
    unsafe { signal_sys::real_sigaction_call(signal, action, old) }
}

/// Makes `handler` the real SIGPROF handler, remembering what was there as the program's action.
pub fn install_sampling_handler(handler: SignalHandler) -> bool {
    let Some(program) = program() else {
        return false;
    };
    // SA_SIGINFO | SA_RESTART. Every signal but a fault's is blocked while it runs, so that no handler of the
    // program's runs on top of it (one that spins would hold its ring for as long); a signal forwarded to the
    // program runs with the mask the kernel would have given it.
    let action =
        signal_sys::handler_action(handler, SA_RESTART, &signal_sys::all_but_fault_signals());
    let mut previous = signal_sys::empty_action();
    if !signal_sys::set_and_get_action(SIGPROF, Some(&action), Some(&mut previous)) {
        return false;
    }
    if previous.sa_sigaction == SIG_IGN {
        SHARED.store(true, Ordering::Relaxed);
    } else if previous.sa_sigaction != SIG_DFL {
        // A handler was there before us: keep it as the program's. When it lives in ld.so, it is glibc's own
        // LD_PROFILE support (sprof), which reads the same variable when it holds a single name.
        let in_dynamic_linker = crate::modules::find_address(
            mslprof_format::RuntimeAddress::from_usize(previous.sa_sigaction),
        )
        .is_some_and(|m| m.info.is_dynamic_linker);
        if in_dynamic_linker {
            SHARED.store(true, Ordering::Relaxed);
            if !WARNED.swap(true, Ordering::Relaxed) {
                sys::stderr_line(&[
                    b"mslprof: glibc's ld.so is profiling the module named by LD_PROFILE as well (its sprof ",
                    b"output goes to /var/tmp); its SIGPROF signals are passed on to it\n",
                ]);
            }
        } else {
            note_program_handler();
        }
    }
    program.record(&previous);
    OWNED.store(true, Ordering::Release);
    true
}

fn note_program_handler() {
    SHARED.store(true, Ordering::Relaxed);
    if !WARNED.swap(true, Ordering::Relaxed) {
        sys::stderr_line(&[
            b"mslprof: the program handles SIGPROF itself; its handler keeps getting its own SIGPROF signals and ",
            b"mslprof samples with per-thread timers alongside\n",
        ]);
    }
}

/// Our `sigaction`: SIGPROF actions of the program are recorded, not installed, once we own SIGPROF.
///
/// # Safety
/// As `sigaction(2)`.
pub unsafe fn program_sigaction(
    signal: i32,
    action: *const SignalAction,
    old: *mut SignalAction,
) -> i32 {
    // The fatal/terminating signals watched by loader-hooks keep the program's action there.
    // SAFETY: the caller's arguments, null or valid as sigaction(2) requires.
    let watched = unsafe { mslprof_loader_hooks::signals::program_sigaction(signal, action, old) };
    if let Some(result) = watched {
        return result;
    }
    let ours = signal == SIGPROF && crate::ensure_started() && OWNED.load(Ordering::Acquire);
    let Some(program) = program().filter(|_| ours) else {
        // SAFETY: the caller's arguments.
        return unsafe { sigaction_passthrough(signal, action, old) };
    };
    // SAFETY: the caller passes null or a valid pointer.
    if unsafe { action.as_ref() }.is_some_and(|action| action.sa_sigaction != SIG_DFL) {
        note_program_handler();
    }
    // SAFETY: the caller's pointers, null or valid.
    unsafe { program.exchange(action, old) };
    0
}

/// Our `signal`: like glibc's, BSD semantics (SA_RESTART), routed through [`program_sigaction`].
///
/// # Safety
/// As `signal(2)`.
pub unsafe fn program_signal(signal: i32, handler: SignalDisposition) -> SignalDisposition {
    let mut action = signal_sys::empty_action();
    action.sa_sigaction = handler;
    action.sa_flags = SA_RESTART;
    let mut old = signal_sys::empty_action();
    // SAFETY: valid pointers.
    if unsafe { program_sigaction(signal, &action, &mut old) } != 0 {
        return SIG_ERR;
    }
    old.sa_sigaction
}

/// Notes a program's `setitimer(ITIMER_PROF)` (it is passed through unchanged).
///
/// # Safety
/// `value` is null or valid, as for `setitimer(2)`.
pub unsafe fn note_program_itimer(which: i32, value: *const TimerSetting) {
    // SAFETY: null or the caller's valid pointer.
    let arming = unsafe { value.as_ref() }
        .is_some_and(|v| v.it_value.tv_sec != 0 || v.it_value.tv_usec != 0);
    if which == ITIMER_PROF && arming {
        SHARED.store(true, Ordering::Relaxed);
        if !WARNED.swap(true, Ordering::Relaxed) {
            sys::stderr_line(&[
                b"mslprof: the program uses ITIMER_PROF; its SIGPROF signals go to its own SIGPROF disposition ",
                b"and mslprof samples with per-thread timers alongside\n",
            ]);
        }
    }
}

/// Delivers a SIGPROF that is not ours to the program's action. Async-signal-safe.
///
/// # Safety
/// `info` and `context` are the ones the kernel passed to our SA_SIGINFO handler.
pub unsafe fn forward(signal: i32, info: *mut SignalInfo, context: *mut c_void) {
    let Some(program) = program() else { return };
    match program.deliver() {
        Delivery::Ignore => {}
        Delivery::Default => {
            // The default action of SIGPROF is to terminate: give it that action and let it happen.
            signal_sys::set_and_get_action(SIGPROF, Some(&signal_sys::empty_action()), None);
            signal_sys::unblock_signal(signal);
            signal_sys::raise_in_this_thread(signal);
        }
        Delivery::Handler { handler, flags } => {
            // Our real action blocks every signal but a fault's: the program's handler runs with the mask the
            // kernel would have given it.
            // SAFETY: the kernel's context for this delivery.
            let mask =
                unsafe { signal_sys::delivery_mask(context, signal, flags, &program.mask()) };
            let _mask = signal_sys::BlockedSignals::set(&mask);
            // SAFETY: the program installed `handler` with these flags for SIGPROF; the kernel's arguments.
            unsafe { program_actions::call_handler(handler, flags, signal, info, context) };
        }
    }
}
