//! Sharing SIGPROF with a program that uses it itself.
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

use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::sys;

/// libc's sigaction, resolved once.
static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);
/// Set once our handler owns SIGPROF.
static OWNED: AtomicBool = AtomicBool::new(false);
/// The program's SIGPROF action as it believes it to be.
static PROGRAM_HANDLER: AtomicUsize = AtomicUsize::new(0);
static PROGRAM_FLAGS: AtomicI32 = AtomicI32::new(0);
const MASK_WORDS: usize = std::mem::size_of::<libc::sigset_t>() / 8;
static PROGRAM_MASK: [AtomicU64; MASK_WORDS] = [const { AtomicU64::new(0) }; MASK_WORDS];
/// One line on stderr, whichever use of SIGPROF is seen first.
static WARNED: AtomicBool = AtomicBool::new(false);
/// The program used SIGPROF or ITIMER_PROF itself (recorded in the dump header).
pub static SHARED: AtomicBool = AtomicBool::new(false);

fn real_sigaction() -> usize {
    let mut real = REAL_SIGACTION.load(Ordering::Relaxed);
    if real == 0 {
        real = sys::next_symbol(c"sigaction").unwrap_or(0);
        REAL_SIGACTION.store(real, Ordering::Relaxed);
    }
    real
}

/// The real sigaction, for any signal.
///
/// # Safety
/// As `sigaction(2)`: pointers null or valid.
pub unsafe fn sigaction_passthrough(
    signal: i32,
    action: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> i32 {
    let real = real_sigaction();
    if real == 0 {
        return -1;
    }
    // SAFETY: `real` is libc's sigaction; the pointers are the caller's.
    unsafe { sys::call_sigaction(real, signal, action, old) }
}

fn store_program_action(action: &libc::sigaction) {
    PROGRAM_HANDLER.store(action.sa_sigaction, Ordering::Relaxed);
    PROGRAM_FLAGS.store(action.sa_flags, Ordering::Relaxed);
    // SAFETY: sigset_t is plain data of MASK_WORDS 64-bit words.
    let words: [u64; MASK_WORDS] = unsafe { std::mem::transmute_copy(&action.sa_mask) };
    for (slot, word) in PROGRAM_MASK.iter().zip(words) {
        slot.store(word, Ordering::Relaxed);
    }
}

fn program_action() -> libc::sigaction {
    let mut words = [0u64; MASK_WORDS];
    for (word, slot) in words.iter_mut().zip(&PROGRAM_MASK) {
        *word = slot.load(Ordering::Relaxed);
    }
    // SAFETY: sigaction is plain data; all-zero is valid.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = PROGRAM_HANDLER.load(Ordering::Relaxed);
    action.sa_flags = PROGRAM_FLAGS.load(Ordering::Relaxed);
    // SAFETY: same size and plain data.
    action.sa_mask = unsafe { std::mem::transmute_copy(&words) };
    action
}

/// Makes `handler` the real SIGPROF handler, remembering what was there as the program's action.
pub fn install_sampling_handler(handler: sys::SignalHandler) -> bool {
    let action = sys::sampling_action(handler);
    // SAFETY: sigaction is plain data.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    if unsafe { sigaction_passthrough(libc::SIGPROF, &action, &mut previous) } != 0 {
        return false;
    }
    if previous.sa_sigaction == libc::SIG_IGN {
        SHARED.store(true, Ordering::Relaxed);
    } else if previous.sa_sigaction != libc::SIG_DFL {
        // A handler was there before us: keep it as the program's. When it lives in ld.so, it is glibc's own
        // LD_PROFILE support (sprof), which reads the same variable when it holds a single name.
        let in_dynamic_linker =
            crate::modules::find(previous.sa_sigaction).is_some_and(|m| m.info.is_dynamic_linker);
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
    store_program_action(&previous);
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
    action: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> i32 {
    // The fatal/terminating signals watched by loader-hooks keep the program's action there.
    // SAFETY: the caller's arguments, null or valid as sigaction(2) requires.
    let watched = unsafe { mslprof_loader_hooks::signals::program_sigaction(signal, action, old) };
    if let Some(result) = watched {
        return result;
    }
    if signal != libc::SIGPROF || !crate::ensure_started() || !OWNED.load(Ordering::Acquire) {
        // SAFETY: the caller's arguments.
        return unsafe { sigaction_passthrough(signal, action, old) };
    }
    // SAFETY: the caller passes null or a valid pointer.
    if let Some(old) = unsafe { old.as_mut() } {
        *old = program_action();
    }
    // SAFETY: the caller passes null or a valid pointer.
    if let Some(action) = unsafe { action.as_ref() } {
        if action.sa_sigaction != libc::SIG_DFL {
            note_program_handler();
        }
        store_program_action(action);
    }
    0
}

/// Our `signal`: like glibc's, BSD semantics (SA_RESTART), routed through [`program_sigaction`].
///
/// # Safety
/// As `signal(2)`.
pub unsafe fn program_signal(signal: i32, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: sigaction is plain data.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler;
    action.sa_flags = libc::SA_RESTART;
    // SAFETY: sigaction is plain data.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    if unsafe { program_sigaction(signal, &action, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// Notes a program's `setitimer(ITIMER_PROF)` (it is passed through unchanged).
///
/// # Safety
/// `value` is null or valid, as for `setitimer(2)`.
pub unsafe fn note_program_itimer(which: i32, value: *const libc::itimerval) {
    // SAFETY: null or the caller's valid pointer.
    let arming = unsafe { value.as_ref() }
        .is_some_and(|v| v.it_value.tv_sec != 0 || v.it_value.tv_usec != 0);
    if which == libc::ITIMER_PROF && arming {
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
pub unsafe fn forward(signal: i32, info: *mut libc::siginfo_t, context: *mut c_void) {
    let handler = PROGRAM_HANDLER.load(Ordering::Relaxed);
    let flags = PROGRAM_FLAGS.load(Ordering::Relaxed);
    if handler == libc::SIG_IGN {
        return;
    }
    if handler == libc::SIG_DFL {
        // The default action of SIGPROF is to terminate: give it that action and let it happen.
        // SAFETY: sigaction is plain data.
        let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
        default.sa_sigaction = libc::SIG_DFL;
        // SAFETY: valid pointer; REAL_SIGACTION was resolved when the handler was installed.
        unsafe { sigaction_passthrough(libc::SIGPROF, &default, std::ptr::null_mut()) };
        sys::unblock_and_raise(signal);
        return;
    }
    if flags & libc::SA_RESETHAND != 0 {
        PROGRAM_HANDLER.store(libc::SIG_DFL, Ordering::Relaxed);
    }
    let mask = program_action().sa_mask;
    let _mask = sys::MaskGuard::block(&mask);
    // SAFETY: the program installed `handler` with these flags for SIGPROF.
    unsafe {
        mslprof_loader_hooks::signals::call_program_handler(
            handler,
            flags & libc::SA_SIGINFO != 0,
            signal,
            info,
            context,
        )
    };
}
