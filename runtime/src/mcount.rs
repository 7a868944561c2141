//! The Rust half of the mcount family: turns one profiling call into one arc count.
//!
//! Entry points: `mcount`, `_mcount` and `__fentry__` (assembly stubs in `sys`, which save the
//! registers and call [`record_call`]), and `__cyg_profile_func_enter` / `__cyg_profile_func_exit`
//! (`-finstrument-functions`, ordinary C calls, defined here). Each maps the callee PC to its module
//! load instance; a callee in a module that LD_PROFILE did not select returns at once. The caller
//! may be in any module (key and link-time address), or in none (`UNKNOWN_KEY`, address 0).
//!
//! Reentrancy: a thread-local depth counter (const-initialised, so it never allocates) lets a
//! signal handler that interrupts `mcount` count its own calls (the arc table is lock-free and
//! reentrant), but stops runaway recursion when code the runtime itself calls is instrumented
//! (for example a `-pg` program that defines its own `memcpy`): calls beyond [`MAX_DEPTH`] are
//! counted as dropped in the callee's table.

use core::cell::Cell;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::arcs;
use crate::modules;

/// Caller key of an arc whose call site is in no known module (SPEC.md §5).
pub const UNKNOWN_KEY: u32 = 0xFFFF_FFFF;

/// Nesting of `record_call` on one thread that is still counted: the call itself plus signal
/// handlers interrupting it.
pub const MAX_DEPTH: u32 = 3;

/// Set by `moncontrol(0)`, cleared by `moncontrol(1)`.
static PAUSED: AtomicBool = AtomicBool::new(false);

/// Pauses (`true`) or resumes call counting.
pub fn set_paused(paused: bool) {
    PAUSED.store(paused, Ordering::Relaxed);
}

/// True while `moncontrol(0)` is in effect.
pub fn is_paused() -> bool {
    PAUSED.load(Ordering::Relaxed)
}

thread_local! {
    /// Bits 0..8: nesting depth of `record_call`; bits 8..: counter stripe + 1 (0 = unassigned).
    static THREAD_STATE: Cell<u32> = const { Cell::new(0) };
}

const DEPTH_MASK: u32 = 0xFF;

/// Records the arc `frompc` → `selfpc` (runtime PCs). Called by the assembly stubs with the stack
/// aligned and every argument register saved; async-signal-safe, never panics, never allocates.
pub extern "C" fn record_call(frompc: usize, selfpc: usize) {
    if PAUSED.load(Ordering::Relaxed) {
        return;
    }
    let Some(callee) = modules::find(selfpc) else {
        return;
    };
    if !callee.profiled {
        return;
    }
    THREAD_STATE.with(|state| {
        let value = state.get();
        let depth = value & DEPTH_MASK;
        if depth >= MAX_DEPTH {
            callee.arcs.add_dropped(1);
            return;
        }
        let stripe = match value >> 8 {
            0 => arcs::current_stripe(),
            assigned => (assigned - 1) as usize,
        };
        state.set(((stripe as u32 + 1) << 8) | (depth + 1));
        let (caller_key, caller_addr) = match modules::find(frompc) {
            Some(caller) => (caller.key, frompc.wrapping_sub(caller.bias) as u64),
            None => (UNKNOWN_KEY, 0),
        };
        callee.arcs.record_in_stripe(
            stripe,
            caller_key,
            caller_addr,
            selfpc.wrapping_sub(callee.bias) as u64,
        );
        // Restore the depth we found: a handler that ran meanwhile restored its own.
        state.set(((stripe as u32 + 1) << 8) | depth);
    });
}

/// `-finstrument-functions`: called on entry of every instrumented function with its address and
/// its return address.
#[unsafe(no_mangle)]
pub extern "C" fn __cyg_profile_func_enter(this_fn: *mut c_void, call_site: *mut c_void) {
    record_call(call_site as usize, this_fn as usize);
}

/// `-finstrument-functions`: called before every instrumented function returns; gprof's arcs need
/// nothing here.
#[unsafe(no_mangle)]
pub extern "C" fn __cyg_profile_func_exit(_this_fn: *mut c_void, _call_site: *mut c_void) {}
