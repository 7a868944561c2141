//! The ABI surface of libmslprof.so's runtime crate: every symbol it exports, as thin `extern "C"` wrappers
//! that catch panics at the boundary and call into the modules. (loader-hooks exports its own in its crate.)
//!
//! Exported elsewhere, because they are assembly or belong to the counting path's own file:
//! - `mcount`, `_mcount`, `__fentry__` (`-pg`, `-pg -mfentry`): naked stubs in `mcount/x86_64.rs`;
//! - `mslprof_plt_entry` (the PLT-counting stubs of libmslprof_audit.so): a naked stub in `mcount/x86_64.rs`;
//! - `mslprof_plt_arena` (where the audit module's stubs are): `mcount/mod.rs`;
//! - `__cyg_profile_func_enter`, `__cyg_profile_func_exit` (`-finstrument-functions`): `mcount/mod.rs`;

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulong, c_void};

use crate::smonitor::TextRegion;
use crate::{glibc_gmon, on_demand, program_sigprof, sampler, smonitor, sys};

/// Runs `call`; if it panics, profiling is turned off (one stderr line naming `what`) and `fallback` gives
/// the result instead, so the program's call still happens.
fn guarded<R>(
    what: &[u8],
    call: impl FnOnce() -> R + std::panic::UnwindSafe,
    fallback: impl FnOnce() -> R,
) -> R {
    std::panic::catch_unwind(call).unwrap_or_else(|_| {
        crate::internal_fault(what);
        fallback()
    })
}

// Interposed libc functions: every thread gets a CPU-time timer, and a program's own SIGPROF use is kept.
// A fault of ours turns profiling off and the call still happens.

/// # Safety
/// As `pthread_create(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attributes: *const libc::pthread_attr_t,
    routine: sys::ThreadStartRoutine,
    argument: *mut c_void,
) -> i32 {
    // SAFETY: the caller's arguments, passed on.
    let call = || unsafe {
        let profiling = crate::ensure_started();
        sampler::create_thread(thread, attributes, routine, argument, profiling)
    };
    guarded(b"pthread_create", call, || libc::EAGAIN)
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
    // SAFETY: the caller's arguments, passed on to libc.
    let passthrough = || unsafe { program_sigprof::sigaction_passthrough(signal, action, old) };
    guarded(b"sigaction", call, passthrough)
}

/// # Safety
/// As `signal(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn signal(signal: i32, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's arguments, passed on.
    let call = || unsafe { program_sigprof::program_signal(signal, handler) };
    guarded(b"signal", call, || libc::SIG_ERR)
}

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
    // SAFETY: the caller's arguments.
    unsafe { sys::next_setitimer(which, value, old) }
}

// glibc's gmon entry points (`gcc -pg` start-up and `moncontrol`), see `glibc_gmon`.

/// glibc: `void __monstartup(u_long lowpc, u_long highpc)`. The runtime starts from its own
/// constructor and covers every module, so there is nothing to set up here.
#[unsafe(no_mangle)]
pub extern "C" fn __monstartup(_lowpc: c_ulong, _highpc: c_ulong) {}

/// glibc: `void monstartup(u_long lowpc, u_long highpc)`, the public name of [`__monstartup`].
#[unsafe(no_mangle)]
pub extern "C" fn monstartup(_lowpc: c_ulong, _highpc: c_ulong) {}

/// glibc: `void _mcleanup(void)`, registered with `atexit` by `gcrt1.o` to write glibc's
/// `gmon.out`. The runtime writes its own dump at exit, so this does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn _mcleanup() {}

/// glibc: `void moncontrol(int mode)`: 0 pauses profiling (call counting and sampling), anything
/// else resumes it.
#[unsafe(no_mangle)]
pub extern "C" fn moncontrol(mode: c_int) {
    glibc_gmon::moncontrol(mode != 0);
}

// The runtime's own C API.

/// C: `int mslprof_dump(const char *path)`: writes the profile so far (see `on_demand::snapshot`); NULL
/// means the usual path with `.N` appended. Returns 0, or -1 with errno set (ENOTSUP when profiling is not
/// active).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mslprof_dump(path: *const c_char) -> c_int {
    let path = (!path.is_null()).then(|| {
        // SAFETY: a non-null path is a NUL-terminated string (the caller's promise).
        unsafe { CStr::from_ptr(path) }.to_bytes()
    });
    match std::panic::catch_unwind(|| on_demand::snapshot(path)) {
        Ok(Ok(())) => 0,
        Ok(Err(errno)) => {
            sys::set_errno(errno);
            -1
        }
        Err(_) => {
            crate::internal_fault(b"mslprof_dump");
            sys::set_errno(libc::EIO);
            -1
        }
    }
}

/// C: `void smonitor(struct text_region *regions, int nregions, void *buffer, size_t bufsize, int nfunc,
/// unsigned flags)`. Writes the profile collected so far when an earlier call is collecting, stops that
/// collection, and (unless `regions` is NULL or `nregions` is 0) starts adding the samples in `regions` to
/// `buffer`. `nfunc` is unused, as in the paper. Bad arguments: one stderr line, nothing collected.
///
/// # Safety
/// `regions` points to `nregions` regions; `buffer` is `bufsize` writable bytes that stay valid until the
/// next call (or the end of the process).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn smonitor(
    regions: *const TextRegion,
    nregions: c_int,
    buffer: *mut c_void,
    bufsize: usize,
    _nfunc: c_int,
    flags: c_uint,
) {
    let errno = sys::SavedErrno::save();
    // SAFETY: the caller's arguments, passed on.
    let call = || unsafe {
        smonitor::start(regions, nregions, buffer, bufsize, flags, || {
            // Failing to write (profiling not active) is not the program's concern; the exit dump follows.
            let _ = on_demand::snapshot(None);
        })
    };
    if std::panic::catch_unwind(call).is_err() {
        smonitor::stop();
        crate::internal_fault(b"smonitor");
    }
    drop(errno);
}

/// Marker for the `LD_AUDIT` module libmslprof_audit.so (runtime/audit/), which counts calls through the
/// PLT: it names this library as the runtime, whose `mslprof_plt_entry` the module's stubs call. The value
/// is the version of the stub convention (2: a stub pushes the callee's address and calls the entry, which
/// counts the arc and returns into the stub; the stub drops the address and jumps to the callee).
#[unsafe(no_mangle)]
pub static mslprof_plt_abi: u32 = 2;

// Test hooks, only in builds with the `test-hooks` feature.

/// Test hook: counts `count` samples at `pc` through the same path as the SIGPROF handler. It exists so
/// tests can reach 16-bit saturation (65 535 samples in one bucket) without hours of CPU time; it does
/// nothing unless profiling is active.
#[cfg(feature = "test-hooks")]
#[unsafe(no_mangle)]
pub extern "C" fn mslprof_test_inject_samples(pc: *const c_void, count: c_ulong) {
    let _ = std::panic::catch_unwind(|| {
        if crate::ensure_started() {
            sampler::inject_samples(pc as usize, count);
        }
    });
}

/// Test hook: the samples counted so far, in all modules when `pc` is null, else in the module whose code
/// holds `pc` (0 if none); `c_ulong::MAX` when profiling is not active. The sampling fixtures burn CPU until
/// they have enough samples: how often the kernel checks a thread's CPU timer on a busy machine is not theirs
/// to choose.
#[cfg(feature = "test-hooks")]
#[unsafe(no_mangle)]
pub extern "C" fn mslprof_test_samples(pc: *const c_void) -> c_ulong {
    std::panic::catch_unwind(|| {
        if !crate::ensure_started() {
            return c_ulong::MAX;
        }
        let pc = (!pc.is_null()).then_some(pc as usize);
        sampler::samples_in(pc).map_or(c_ulong::MAX, |samples| samples as c_ulong)
    })
    .unwrap_or(c_ulong::MAX)
}

/// Test hook `u64 mslprof_test_walk_here(u64 *frames, size_t capacity, u64 repeats, u64 report[7], u64 cold)`
/// (`test-hooks` builds): a naked stub (its assembly in `sys.rs`) that stores its caller's registers as they
/// will be once it returns in `report[0..3]` and jumps to [`test_walk_from_report`].
///
/// # Safety
/// As [`test_walk_from_report`]; `report` must be 7 writable words.
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mslprof_test_walk_here(
    frames: *mut u64,
    capacity: usize,
    repeats: u64,
    report: *mut u64,
    cold: u64,
) -> u64 {
    sys::store_caller_registers_and_jump!(test_walk_from_report)
}

/// Test hook's body, reached from `mslprof_test_walk_here` with the caller's pc, sp and rbp in
/// `report[0..3]`: walks the calling thread's stack from them `repeats` times with the SIGPROF handler's walk
/// (same bounds, same unwind tables, outside a handler) and a rule cache of its own, emptied before each walk
/// when `cold` is not 0; writes the last walk's frames into `frames` as runtime addresses (the caller's pc, then
/// return addresses; 0 outside every module), its frame count in `report[3]`, its flags in `report[4]`, the
/// cache's hits and misses over all the walks in `report[5..7]`, and returns the nanoseconds the walks took
/// (CLOCK_MONOTONIC; emptying the cache excluded). `u64::MAX` when profiling or stacks are off. It exists to
/// measure the walk against other unwinders on the same stacks (the bench's `unwinders` suite).
///
/// # Safety
/// `frames` is `capacity` writable words and `report` 7; only `mslprof_test_walk_here` calls this.
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub unsafe extern "C" fn test_walk_from_report(
    frames: *mut u64,
    capacity: usize,
    repeats: u64,
    report: *mut u64,
    cold: u64,
) -> u64 {
    // SAFETY: as the caller guarantees.
    let (frames, report) = unsafe {
        (
            std::slice::from_raw_parts_mut(frames, capacity),
            std::slice::from_raw_parts_mut(report, 7),
        )
    };
    let walk = std::panic::AssertUnwindSafe(|| {
        if !crate::ensure_started() {
            return None;
        }
        let start = crate::stacks::unwind::Registers {
            pc: report[0] as usize,
            sp: report[1] as usize,
            fp: report[2] as usize,
        };
        crate::stacks::walk_for_test(start, frames, repeats, cold != 0)
    });
    match std::panic::catch_unwind(walk) {
        Ok(Some(walks)) => {
            report[3] = walks.depth as u64;
            report[4] = u64::from(walks.flags);
            report[5] = walks.hits;
            report[6] = walks.misses;
            walks.nanoseconds
        }
        _ => u64::MAX,
    }
}
