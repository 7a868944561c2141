//! The libc functions the runtime interposes (exported from libmslprof.so): `pthread_create`, so every new
//! thread gets a CPU-time timer, and `sigaction`/`signal`/`setitimer`, so a program's own SIGPROF use is kept.
//! Each catches panics at the boundary: a fault of ours turns profiling off and the call still happens.

use std::os::raw::c_void;

use crate::{program_sigprof, sampler, sys};

/// # Safety
/// As `pthread_create(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attributes: *const libc::pthread_attr_t,
    routine: extern "C" fn(*mut c_void) -> *mut c_void,
    argument: *mut c_void,
) -> i32 {
    // SAFETY: the caller's arguments, passed on.
    let call = || unsafe { sampler::create_thread(thread, attributes, routine, argument) };
    std::panic::catch_unwind(call).unwrap_or_else(|_| {
        crate::internal_fault(b"pthread_create");
        libc::EAGAIN
    })
}

/// # Safety
/// As `sigaction(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sigaction(
    signal: i32,
    action: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> i32 {
    // SAFETY: the caller's arguments, passed on.
    let call = || unsafe { program_sigprof::program_sigaction(signal, action, old) };
    std::panic::catch_unwind(call).unwrap_or_else(|_| {
        crate::internal_fault(b"sigaction");
        // SAFETY: the caller's arguments, passed on to libc.
        unsafe { program_sigprof::sigaction_passthrough(signal, action, old) }
    })
}

/// # Safety
/// As `signal(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(signal: i32, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's arguments, passed on.
    let call = || unsafe { program_sigprof::program_signal(signal, handler) };
    std::panic::catch_unwind(call).unwrap_or_else(|_| {
        crate::internal_fault(b"signal");
        libc::SIG_ERR
    })
}

type SetitimerFn = unsafe extern "C" fn(i32, *const libc::itimerval, *mut libc::itimerval) -> i32;

/// # Safety
/// As `setitimer(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setitimer(
    which: i32,
    value: *const libc::itimerval,
    old: *mut libc::itimerval,
) -> i32 {
    let _ = std::panic::catch_unwind(|| {
        if crate::ensure_started() {
            // SAFETY: the caller's pointer, as setitimer(2) requires.
            unsafe { program_sigprof::note_program_itimer(which, value) };
        }
    });
    let Some(real) = sys::next_symbol(c"setitimer") else {
        return -1;
    };
    // SAFETY: `real` is libc's setitimer.
    let real: SetitimerFn = unsafe { std::mem::transmute::<usize, SetitimerFn>(real) };
    // SAFETY: the caller's arguments.
    unsafe { real(which, value, old) }
}
