//! The Rust half of the mcount family: turns one profiling call into one arc count.
//!
//! Entry points: `mcount`, `_mcount` and `__fentry__` (assembly stubs in `sys`, which save the
//! registers and call [`record_call`]), and `__cyg_profile_func_enter` / `__cyg_profile_func_exit`
//! (`-finstrument-functions`, ordinary C calls, defined here).
//!
//! **Fast path.** Each thread has a two-way set-associative cache of [`CACHE_ENTRIES`] entries
//! (header in static TLS, `sys::thread_cache_block`; entries in a private mapping of 256 KiB whose
//! pages are touched as used, unmapped at thread exit), mapping the raw pair (frompc, selfpc) to
//! the arc's counter in the
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

/// Entries of each thread's call cache: two-way set-associative, [`CACHE_SET_BITS`] bits of set
/// index (the top bits of the hash; the assembly fast path in `sys` computes the same).
pub const CACHE_ENTRIES: usize = 2 << CACHE_SET_BITS;
/// See [`CACHE_ENTRIES`].
pub const CACHE_SET_BITS: u32 = 12;
/// Bytes of one thread's cache entries (mapped on the thread's first call, pages touched as used).
const CACHE_BYTES: usize = CACHE_ENTRIES * core::mem::size_of::<CacheEntry>();

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

static START_TRIED: AtomicBool = AtomicBool::new(false);

/// The constructors of libraries loaded with the program can run before the runtime's own
/// constructor (ELF runs dependencies' initialisers first, and a preloaded library depends on
/// nothing): their instrumented calls reach `mcount` before any module is known. The first such
/// call starts the runtime (once per process), with the vector state saved around it.
fn start_before_own_constructor() -> bool {
    if modules::generation() != 0 || START_TRIED.swap(true, Ordering::Relaxed) {
        return false;
    }
    extern "C" fn start() -> bool {
        crate::ensure_started()
    }
    // SAFETY: `start` is an ordinary function that never unwinds (ensure_started catches panics);
    // this is x86_64.
    unsafe { sys::call_preserving_vector_state(start) }
}

/// One cached arc: raw PCs and the counter (null: callee in an unprofiled module). Two of them,
/// the ways of one set, fill one 64-byte cache line.
#[repr(C, align(32))]
struct CacheEntry {
    frompc: usize,
    selfpc: usize,
    counter: *const AtomicU64,
}

/// The per-thread cache header, overlaid on `sys::thread_cache_block` (static TLS); the entries
/// are a private mapping of [`CACHE_BYTES`], unmapped when the thread exits.
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
    /// True once the thread's cache was released at thread exit: never map another.
    released: bool,
    _reserved: [u8; 6],
    /// [`CACHE_ENTRIES`] entries, or null (not mapped yet, or mapping failed: no caching).
    entries: *mut CacheEntry,
}

// The assembly fast path in `sys` depends on this layout.
const _: () = {
    assert!(core::mem::size_of::<ThreadCache>() <= sys::THREAD_CACHE_BYTES);
    assert!(core::mem::offset_of!(ThreadCache, generation) == 0);
    assert!(core::mem::offset_of!(ThreadCache, depth) == 8);
    assert!(core::mem::offset_of!(ThreadCache, shared_stripe) == 16);
    assert!(core::mem::offset_of!(ThreadCache, entries) == 24);
    assert!(core::mem::size_of::<CacheEntry>() == 32);
};

impl ThreadCache {
    /// The entries, mapping them on first use. Empty when they cannot be had.
    fn entries(&mut self) -> &mut [CacheEntry] {
        if self.entries.is_null() && !self.released {
            if let Some(base) = sys::map_zeroed(CACHE_BYTES) {
                self.entries = base.cast();
                register_thread_exit(base);
            } else {
                self.released = true;
            }
        }
        if self.entries.is_null() {
            return &mut [];
        }
        // SAFETY: `entries` is this thread's private mapping of CACHE_ENTRIES zero-initialised
        // entries (all-zero is a valid CacheEntry), unmapped only by the thread-exit destructor
        // after it cleared the pointer.
        unsafe { core::slice::from_raw_parts_mut(self.entries, CACHE_ENTRIES) }
    }

    /// Forgets every entry (the pages go back to the kernel and read as zero).
    fn clear(&mut self) {
        if !self.entries.is_null() {
            sys::discard(self.entries.cast(), CACHE_BYTES);
        }
    }
}

static THREAD_EXIT_KEY: std::sync::OnceLock<Option<libc::pthread_key_t>> =
    std::sync::OnceLock::new();

/// Makes the thread's exit unmap its cache (`pthread_key_create` once, `pthread_setspecific` per
/// thread).
fn register_thread_exit(base: *mut u8) {
    let key = THREAD_EXIT_KEY.get_or_init(|| sys::create_thread_key(release_thread_cache));
    if let Some(key) = *key {
        sys::set_thread_value(key, base as usize);
    }
}

/// Thread-exit destructor: clears this thread's pointer first (instrumented code may still run
/// in later destructors on this thread), then unmaps the entries.
unsafe extern "C" fn release_thread_cache(base: *mut libc::c_void) {
    let cache = sys::thread_cache_block().cast::<ThreadCache>();
    // SAFETY: the exiting thread's own header; a signal handler running now sees `depth` as usual
    // and, once the pointer is null, never touches the entries.
    let cache = unsafe { &mut *cache };
    if cache.entries.cast() == base {
        cache.entries = core::ptr::null_mut();
        cache.released = true;
        compiler_fence(Ordering::SeqCst);
        // SAFETY: `base` is the mapping of CACHE_BYTES made for this thread; the only pointer to
        // it was just cleared.
        unsafe { sys::unmap(base.cast(), CACHE_BYTES) };
    }
}

#[inline(always)]
/// Index of the first way of the pair's set.
fn cache_index(frompc: usize, selfpc: usize) -> usize {
    let mixed = (selfpc ^ frompc.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> (usize::BITS - CACHE_SET_BITS)) * 2
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
        cache.clear();
        cache.generation = generation;
    }
    let index = cache_index(frompc, selfpc);
    let shared = cache.shared_stripe;
    let cached = cache
        .entries()
        .get(index..index + 2)
        .and_then(|ways| {
            ways.iter()
                .find(|entry| entry.frompc == frompc && entry.selfpc == selfpc)
        })
        .map(|entry| entry.counter);
    match cached {
        // Cached counters stay valid: the generation check above dropped entries made before the
        // last module-table change or reset.
        Some(counter) => {
            if let Some(counter) = unsafe_counter(counter) {
                increment(counter, shared);
            }
        }
        None => {
            let stripe = thread_stripe(cache);
            let counter = record_uncached(stripe, frompc, selfpc, true);
            if let Some(counter) = counter
                && let Some(counter) = unsafe_counter(counter)
            {
                increment(counter, cache.shared_stripe);
            }
            if let (Some(counter), Some([first, second])) =
                (counter, cache.entries().get_mut(index..index + 2))
            {
                // The newest arc takes the first way, the one it displaces the second.
                second.frompc = first.frompc;
                second.selfpc = first.selfpc;
                second.counter = first.counter;
                first.frompc = frompc;
                first.selfpc = selfpc;
                first.counter = counter;
            }
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
    if let Some(counter) = record_uncached(stripe, frompc, selfpc, false)
        && let Some(counter) = unsafe_counter(counter)
    {
        // The interrupted code's own add is one instruction, which a signal cannot split.
        increment(counter, cache.shared_stripe);
    }
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

/// The counter behind a pointer returned by [`record_uncached`] (null: unprofiled callee).
fn unsafe_counter(counter: *const AtomicU64) -> Option<&'static AtomicU64> {
    // SAFETY: non-null pointers from `record_uncached` point into arc tables of leaked
    // LiveModules, valid for the rest of the process.
    unsafe { counter.as_ref() }
}

#[inline(always)]
fn increment(counter: &AtomicU64, shared: bool) {
    if shared {
        counter.fetch_add(1, Ordering::Relaxed);
    } else {
        sys::increment_unshared(counter);
    }
}

/// Maps the PCs to modules and finds (or inserts) the arc; the caller adds the call. Returns the
/// counter to add to and cache: the arc's counter in `stripe`, or null when the callee's module
/// is not profiled; `None` when nothing may be cached (no module, or the call was dropped and
/// counted as such).
///
/// `top_level` is false for a call nested in another `record_call` (a signal handler): only a
/// top-level call may start the runtime or scan for modules.
#[cold]
fn record_uncached(
    stripe: usize,
    frompc: usize,
    selfpc: usize,
    top_level: bool,
) -> Option<*const AtomicU64> {
    let callee = modules::find(selfpc)
        .or_else(|| {
            (top_level && start_before_own_constructor())
                .then(|| modules::find(selfpc))
                .flatten()
        })
        .or_else(|| crate::lifecycle::module_loaded_during_open(selfpc))?;
    if !callee.profiled {
        return Some(core::ptr::null());
    }
    let (caller_key, caller_addr) = match modules::find(frompc) {
        Some(caller) => (caller.key, frompc.wrapping_sub(caller.bias) as u64),
        None => (UNKNOWN_KEY, 0),
    };
    callee
        .arcs
        .counter(
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
