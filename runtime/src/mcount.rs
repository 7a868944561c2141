//! The Rust half of the mcount family: turns one profiling call into one arc count.
//!
//! Entry points: `mcount`, `_mcount` and `__fentry__` (assembly stubs in `sys`, which save the
//! registers and call [`record_call`]), and `__cyg_profile_func_enter` / `__cyg_profile_func_exit`
//! (`-finstrument-functions`, ordinary C calls, defined here).
//!
//! **Fast path.** Each thread has a direct-mapped cache of [`CACHE_ENTRIES`] entries in static TLS
//! (`sys::thread_cache_block`), mapping the raw pair (frompc, selfpc) to the arc's counter in the
//! thread's own stripe of the callee module's [`ArcTable`](crate::arcs::ArcTable). A hit costs a
//! few loads and one add; nothing shared is written. A thread that owns its stripe adds with one
//! non-locked instruction, later threads (sharing the last stripe) with an atomic add. The cache is
//! emptied when the module table changes (load/unload: `modules::generation`) or the arcs are
//! reset (fork).
//!
//! **Slow path** (cache miss): map selfpc to its module load instance; a callee in a module that
//! LD_PROFILE did not select returns at once (remembered in the cache with a null counter, so the
//! next call is cheap too). The caller may be in any module (key and link-time address), or in none
//! (`UNKNOWN_KEY`, address 0). The arc is recorded in the table and the counter cached.
//!
//! **Reentrancy.** The cache header holds a nesting depth. A signal handler that interrupts
//! `record_call` and calls instrumented code takes the slow path without touching the cache (so it
//! cannot tear an entry the interrupted call is reading) and still counts exactly: the table is
//! lock-free and reentrant. Nesting deeper than [`MAX_DEPTH`] (runaway recursion, e.g. when code
//! the runtime calls is itself instrumented) is counted as dropped in the callee's table.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, compiler_fence};

use crate::arcs::{self, ArcTable};
use crate::modules;
use crate::sys;

/// Caller key of an arc whose call site is in no known module (SPEC.md §5).
pub const UNKNOWN_KEY: u32 = 0xFFFF_FFFF;

/// Nesting of `record_call` on one thread that is still counted: the call itself plus signal
/// handlers interrupting it.
pub const MAX_DEPTH: u32 = 3;

/// Entries of each thread's call cache (the assembly fast path in `sys` indexes it with 8 bits).
pub const CACHE_ENTRIES: usize = 256;

/// Set by `moncontrol(0)`, cleared by `moncontrol(1)`.
pub(crate) static PAUSED: AtomicBool = AtomicBool::new(false);

/// Bumped by [`reset_after_fork`] so every thread cache is emptied.
pub(crate) static RESET_EPOCH: AtomicUsize = AtomicUsize::new(0);

/// Pauses (`true`) or resumes call counting.
pub fn set_paused(paused: bool) {
    PAUSED.store(paused, Ordering::Relaxed);
}

/// True while `moncontrol(0)` is in effect.
pub fn is_paused() -> bool {
    PAUSED.load(Ordering::Relaxed)
}

/// Forgets every arc of every module (in a forked child, which must profile only itself). Only
/// valid while no other thread records: after `fork` there is one thread.
pub fn reset_after_fork() {
    RESET_EPOCH.fetch_add(1, Ordering::Relaxed);
    for module in modules::all() {
        module.arcs.reset();
    }
}

/// The module's arcs for the dump, module-relative, sorted (SPEC.md §7.1); empty when it is not
/// profiled.
pub fn arcs_snapshot(module: &modules::LiveModule) -> Vec<mslprof_format::model::Arc> {
    let mut arcs = Vec::with_capacity(module.arcs.len());
    module.arcs.for_each(|arc| {
        arcs.push(mslprof_format::model::Arc {
            caller_key: arc.caller_key,
            caller_address: arc.caller_addr,
            callee_address: arc.callee_addr,
            count: arc.count,
        });
    });
    arcs.sort_unstable();
    arcs
}

/// One cached arc: raw PCs and the counter (null: callee in an unprofiled module).
#[repr(C)]
struct CacheEntry {
    frompc: usize,
    selfpc: usize,
    counter: *const AtomicU64,
}

/// The per-thread cache, overlaid on `sys::thread_cache_block`.
#[repr(C)]
struct ThreadCache {
    /// `modules::generation() ^ epoch` the entries were made under; 0 = never used.
    generation: usize,
    /// Nesting depth of `record_call` on this thread.
    depth: u32,
    /// Stripe + 1 (0 = unassigned).
    stripe: u32,
    /// True when this thread shares its stripe (atomic adds needed).
    shared_stripe: bool,
    _reserved: [u8; 15],
    entries: [CacheEntry; CACHE_ENTRIES],
}

// The assembly fast path in `sys` depends on this layout.
const _: () = {
    assert!(core::mem::size_of::<ThreadCache>() <= sys::THREAD_CACHE_BYTES);
    assert!(core::mem::offset_of!(ThreadCache, generation) == 0);
    assert!(core::mem::offset_of!(ThreadCache, depth) == 8);
    assert!(core::mem::offset_of!(ThreadCache, shared_stripe) == 16);
    assert!(core::mem::offset_of!(ThreadCache, entries) == 32);
    assert!(core::mem::size_of::<CacheEntry>() == 24);
};

#[inline(always)]
fn cache_index(frompc: usize, selfpc: usize) -> usize {
    let mixed = (selfpc ^ frompc.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    mixed >> 56
}

#[inline(always)]
fn current_generation() -> usize {
    // Never 0, so a zeroed cache is always stale.
    (modules::generation() ^ RESET_EPOCH.load(Ordering::Relaxed).rotate_right(1)) | 1
}

/// Records the arc `frompc` → `selfpc` (runtime PCs). Called by the assembly stubs with the stack
/// aligned and every argument register saved; async-signal-safe, never panics, never allocates.
pub extern "C" fn record_call(frompc: usize, selfpc: usize) {
    if PAUSED.load(Ordering::Relaxed) {
        return;
    }
    let cache = sys::thread_cache_block().cast::<ThreadCache>();
    // SAFETY: the block is this thread's own, zero-initialised (a valid ThreadCache: integers,
    // false, null pointers), aligned and large enough (checked above). Only this thread touches
    // it; a signal handler on this thread sees `depth != 0` and stays away from the entries.
    let cache = unsafe { &mut *cache };
    let depth = cache.depth;
    if depth != 0 {
        record_nested(cache, depth, frompc, selfpc);
        return;
    }
    cache.depth = 1;
    compiler_fence(Ordering::SeqCst);
    let generation = current_generation();
    if cache.generation != generation {
        for entry in &mut cache.entries {
            entry.frompc = 0;
            entry.selfpc = 0;
        }
        cache.generation = generation;
    }
    let entry = &mut cache.entries[cache_index(frompc, selfpc)];
    if entry.frompc == frompc && entry.selfpc == selfpc {
        // SAFETY: cached counters point into arc tables of leaked (never freed) LiveModules, whose
        // level mappings are only unmapped on drop; the generation check above dropped entries
        // made before the last module-table change or reset.
        if let Some(counter) = unsafe { entry.counter.as_ref() } {
            increment(counter, cache.shared_stripe);
        }
    } else {
        let stripe = thread_stripe(cache);
        let counter = record_uncached(stripe, frompc, selfpc);
        let entry = &mut cache.entries[cache_index(frompc, selfpc)];
        match counter {
            Some(counter) => {
                entry.frompc = frompc;
                entry.selfpc = selfpc;
                entry.counter = counter;
            }
            None => entry.frompc = 0,
        }
    }
    compiler_fence(Ordering::SeqCst);
    cache.depth = 0;
}

/// The slow path of a call nested in another (a signal handler): count without the cache.
#[cold]
fn record_nested(cache: &mut ThreadCache, depth: u32, frompc: usize, selfpc: usize) {
    if depth >= MAX_DEPTH {
        if let Some(callee) = modules::find(selfpc)
            && callee.profiled
        {
            callee.arcs.add_dropped(1);
        }
        return;
    }
    cache.depth = depth + 1;
    compiler_fence(Ordering::SeqCst);
    let stripe = thread_stripe(cache);
    record_uncached(stripe, frompc, selfpc);
    compiler_fence(Ordering::SeqCst);
    cache.depth = depth;
}

fn thread_stripe(cache: &mut ThreadCache) -> usize {
    if cache.stripe == 0 {
        let number = arcs::next_thread_number();
        let stripe = ArcTable::stripe_of_thread(number);
        cache.shared_stripe = stripe == arcs::STRIPES - 1;
        cache.stripe = stripe as u32 + 1;
    }
    (cache.stripe - 1) as usize
}

#[inline(always)]
fn increment(counter: &AtomicU64, shared: bool) {
    if shared {
        counter.fetch_add(1, Ordering::Relaxed);
    } else {
        sys::increment_unshared(counter);
    }
}

/// Maps the PCs to modules and records the arc. Returns the counter to cache: the arc's counter,
/// or null when the callee's module is not profiled; `None` when nothing may be cached (no
/// module, or the call was dropped).
#[cold]
fn record_uncached(stripe: usize, frompc: usize, selfpc: usize) -> Option<*const AtomicU64> {
    let callee = modules::find(selfpc)?;
    if !callee.profiled {
        return Some(core::ptr::null());
    }
    let (caller_key, caller_addr) = match modules::find(frompc) {
        Some(caller) => (caller.key, frompc.wrapping_sub(caller.bias) as u64),
        None => (UNKNOWN_KEY, 0),
    };
    callee
        .arcs
        .record_in_stripe(
            stripe,
            caller_key,
            caller_addr,
            selfpc.wrapping_sub(callee.bias) as u64,
        )
        .map(|counter| counter as *const AtomicU64)
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
