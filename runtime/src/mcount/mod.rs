//! The Rust half of the mcount family: turns one profiling call into one arc count.
//!
//! Entry points: `mcount`, `_mcount` and `__fentry__` (assembly stubs in `x86_64`, which save the
//! registers and call [`record_call`]), and `__cyg_profile_func_enter` / `__cyg_profile_func_exit`
//! (`-finstrument-functions`, ordinary C calls, defined here).
//!
//! **Fast path.** Each thread has a two-way set-associative cache, [`FIRST_CACHE_SETS`] sets at
//! first (header in static TLS, `x86_64::thread_cache_block`; entries in a private mapping whose
//! pages are touched as used, unmapped at thread exit), mapping the raw pair (frompc, selfpc) to
//! the arc's counter in the thread's own stripe of the callee module's
//! [`ArcTable`](crate::arcs::ArcTable). A hit is handled by the assembly stub alone: a few loads
//! and one add, the only write; nothing shared is written. A thread that owns its stripe adds with
//! one non-locked instruction, threads beyond the 63rd alive at once (sharing the last stripe) with
//! an atomic add. runtime/CALLCOUNTS.md goes through the stub instruction by instruction. The
//! cache is emptied when the module table changes (load/unload: `modules::CURRENT`), the arcs are
//! reset (fork) or counting is paused: all three change `CURRENT ^ CACHE_STATE`, the generation
//! the cache was filled under. A cache that keeps displacing entries (a working set larger than
//! itself) grows, up to [`MAX_CACHE_SETS`] sets.
//!
//! **Slow path** (cache miss): map selfpc to its module load instance; a callee in a module that
//! LD_PROFILE did not select returns at once (remembered in the cache with the thread's sink as
//! its counter, so the next call is cheap too), unless the call came through a PLT stub of the
//! audit module (`LiveModule::plt_counted`) from a selected module: that arc is recorded in the
//! callee's table all the same. The caller may be in any module (key and link-time address), or in none
//! (`UNKNOWN_KEY`, address 0). The arc is recorded in the table and the counter cached.
//!
//! **Reentrancy.** The cache header holds a nesting depth and a write sequence (bumped by every
//! top-level `record_call`; the stub checks it before and after reading an entry), and its
//! generation is 0 while this Rust side may change the entries (see `ThreadCache`). A signal handler that interrupts `record_call` and calls instrumented code
//! takes the slow path without touching the cache (so it cannot tear an entry the interrupted call
//! is reading) and still counts exactly: the table is lock-free and reentrant. Nesting deeper than
//! [`MAX_DEPTH`] (runaway recursion, e.g. when code the runtime calls is itself instrumented) is
//! counted as dropped in the callee's table.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, compiler_fence};

use mslprof_format::{LinkAddress, RuntimeAddress};

use crate::arcs;
use crate::modules;
use crate::sys;

#[cfg(target_arch = "x86_64")]
mod x86_64;

/// Caller key of an arc whose call site is in no known module (SPEC.md §5).
pub const UNKNOWN_KEY: u32 = 0xFFFF_FFFF;

/// Nesting of `record_call` on one thread that is still counted: the call itself plus signal
/// handlers interrupting it.
pub const MAX_DEPTH: u32 = 3;

/// Sets of a thread's call cache when it is first mapped (two ways each: 8192 entries, 256 KiB).
pub const FIRST_CACHE_SETS: usize = 1 << 12;
/// Each growth of a thread's cache multiplies its sets by this.
const CACHE_GROWTH: usize = 4;
/// Times a thread's cache can grow: at most `FIRST_CACHE_SETS * 1024` sets (8 388 608 entries,
/// 256 MiB of address space, of which only the pages used become resident). Sets follow call-site
/// addresses (4 bytes of code per set), so that covers 16 MiB of densely calling code. A cache
/// grows only after displacing half as many entries as it has sets, so only a thread whose hot
/// call sites do not fit gets there.
const CACHE_GROWTHS: usize = 5;
/// Most sets a thread's cache can have.
pub const MAX_CACHE_SETS: usize = FIRST_CACHE_SETS * CACHE_GROWTH.pow(CACHE_GROWTHS as u32);

/// Bytes of a cache of `sets` sets.
const fn cache_bytes(sets: usize) -> usize {
    sets * 2 * core::mem::size_of::<CacheEntry>()
}

/// Counting state that every call checks, in one word so the fast path reads it with one load:
/// bit 0 is set by `moncontrol(0)` (paused), bit 1 is always set (so a cache generation is never
/// 0), bits 2.. count fork-time resets. A thread's cache is valid while its generation equals
/// `modules::CURRENT ^ CACHE_STATE`: a new module table, a reset or a pause all change it.
pub(crate) static CACHE_STATE: AtomicUsize = AtomicUsize::new(STATE_FIXED);

/// Bit of [`CACHE_STATE`] set while counting is paused.
const STATE_PAUSED: usize = 1;
/// Bit of [`CACHE_STATE`] that is always set.
const STATE_FIXED: usize = 2;
/// One fork-time reset in [`CACHE_STATE`].
const STATE_EPOCH: usize = 4;

/// Pauses (`true`) or resumes call counting.
pub fn set_paused(paused: bool) {
    if paused {
        CACHE_STATE.fetch_or(STATE_PAUSED, Ordering::Relaxed);
    } else {
        CACHE_STATE.fetch_and(!STATE_PAUSED, Ordering::Relaxed);
    }
}

/// Runs `work` (a call of the runtime's own, at start-up, before the program's threads) with counting
/// paused, so that calls libc makes for it through its own PLT (`setenv` → `realloc`) are not counted.
pub fn uncounted<R>(work: impl FnOnce() -> R) -> R {
    let was_paused = is_paused();
    set_paused(true);
    let result = work();
    set_paused(was_paused);
    result
}

/// True while `moncontrol(0)` is in effect.
pub fn is_paused() -> bool {
    CACHE_STATE.load(Ordering::Relaxed) & STATE_PAUSED != 0
}

/// Forgets every arc of every module (in a forked child, which must profile only itself). Only
/// valid while no other thread records: after `fork` there is one thread.
pub fn reset_after_fork() {
    CACHE_STATE.fetch_add(STATE_EPOCH, Ordering::Relaxed);
    for module in modules::all() {
        module.arcs.reset();
    }
    // SAFETY: as in `record_call`; only this (the only) thread's own header is read.
    let cache = unsafe { &*x86_64::thread_cache_block().cast::<ThreadCache>() };
    let own = (cache.stripe != 0).then(|| (cache.stripe - 1) as usize);
    arcs::reset_stripes_after_fork(own);
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
    unsafe { x86_64::call_preserving_vector_state(start) }
}

/// One cached arc: raw PCs and the counter (null: callee in an unprofiled module). Two of them,
/// the ways of one set, fill one 64-byte cache line.
#[repr(C, align(32))]
struct CacheEntry {
    frompc: usize,
    selfpc: usize,
    counter: *const AtomicU64,
}

/// The per-thread cache header, overlaid on `x86_64::thread_cache_block` (static TLS); the entries
/// are a private mapping of [`cache_bytes`]`(sets)`, unmapped when the thread exits.
///
/// The assembly fast path only reads it. It must not use an entry that the interrupted Rust code
/// was writing, hence `generation` is 0 (a miss) while `record_call` (top level) runs; nor one that
/// a signal handler rewrote while it was reading it, hence `writes`, bumped by every top-level
/// `record_call`: the fast path reads it before the entry and checks it is unchanged after loading
/// the counter pointer, and takes the slow path otherwise.
#[repr(C)]
struct ThreadCache {
    /// `modules::CURRENT ^ CACHE_STATE` the entries were made under. 0 (which no generation is) while
    /// the Rust side may be changing the entries, and while there are none: the fast path then misses.
    generation: usize,
    /// Bumped by every `record_call` at the top level; see above.
    writes: u32,
    /// Nesting depth of `record_call` on this thread.
    depth: u32,
    /// `2 * (set_mask + 1)` entries, or null (not mapped yet, or mapping failed: no caching).
    entries: *mut CacheEntry,
    /// Sets − 1 (a power of two − 1).
    set_mask: u32,
    /// True when this thread shares its stripe (atomic adds needed).
    shared_stripe: bool,
    /// True once the thread's cache was released at thread exit: never map another.
    released: bool,
    _reserved: [u8; 2],
    /// Stripe + 1 (0 = unassigned).
    stripe: u32,
    /// Valid entries displaced since the cache was mapped or last grew.
    evictions: u32,
    /// The smaller mappings this cache had before it grew (their pages discarded), unmapped at
    /// thread exit: a signal handler may grow the cache while the interrupted fast path is
    /// reading the old entries, which must stay mapped.
    retired: [*mut CacheEntry; CACHE_GROWTHS],
    /// Where cached calls of unprofiled callees are added (and never read), so that the fast path
    /// needs no null test: entries of such pairs point here.
    unprofiled_sink: AtomicU64,
}

impl ThreadCache {
    /// The entries, mapping them on first use. Empty when they cannot be had.
    fn entries(&mut self) -> &mut [CacheEntry] {
        if self.entries.is_null() && !self.released {
            if let Some(base) = sys::map_zeroed(cache_bytes(FIRST_CACHE_SETS)) {
                self.entries = base.cast();
                self.set_mask = (FIRST_CACHE_SETS - 1) as u32;
                register_thread_exit(base);
            } else {
                self.released = true;
            }
        }
        if self.entries.is_null() {
            return &mut [];
        }
        // SAFETY: `entries` is this thread's private mapping of `sets()` zero-initialised sets
        // (all-zero is a valid CacheEntry), unmapped only by the thread-exit destructor after it
        // cleared the pointer.
        unsafe { core::slice::from_raw_parts_mut(self.entries, self.sets() * 2) }
    }

    fn sets(&self) -> usize {
        self.set_mask as usize + 1
    }

    /// Forgets every entry (the pages go back to the kernel and read as zero).
    fn clear(&mut self) {
        if !self.entries.is_null() {
            sys::discard(self.entries.cast(), cache_bytes(self.sets()));
        }
    }

    /// Counts a displaced entry; once a cache has displaced an eighth as many entries as it has sets, the
    /// thread's working set does not fit: replaces it with one [`CACHE_GROWTH`] times larger
    /// (empty; it fills on the next misses). The old mapping's pages are discarded at once, the
    /// mapping itself is kept until thread exit (see `retired`).
    fn count_eviction(&mut self) {
        self.evictions = self.evictions.saturating_add(1);
        let sets = self.sets();
        if (self.evictions as usize) < sets / 8 || sets >= MAX_CACHE_SETS || self.entries.is_null()
        {
            return;
        }
        self.evictions = 0;
        let growth = (sets / FIRST_CACHE_SETS).ilog2() as usize / CACHE_GROWTH.ilog2() as usize;
        let larger = sets * CACHE_GROWTH;
        let (Some(slot), Some(base)) = (
            self.retired.get(growth),
            sys::map_zeroed(cache_bytes(larger)),
        ) else {
            return;
        };
        debug_assert!(slot.is_null());
        sys::prefer_huge_pages(base, cache_bytes(larger));
        let old = self.entries;
        sys::discard(old.cast(), cache_bytes(sets));
        self.retired[growth] = old;
        self.entries = base.cast();
        self.set_mask = (larger - 1) as u32;
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
/// in later destructors on this thread), then unmaps the entries and the retired mappings.
unsafe extern "C" fn release_thread_cache(_first_mapping: *mut libc::c_void) {
    let cache = x86_64::thread_cache_block().cast::<ThreadCache>();
    // SAFETY: the exiting thread's own header; a signal handler running now sees `depth` as usual
    // and, once the pointer is null, never touches the entries.
    let cache = unsafe { &mut *cache };
    let entries = cache.entries;
    let sets = cache.sets();
    cache.generation = 0;
    cache.entries = core::ptr::null_mut();
    cache.released = true;
    // Calls this thread still makes (later destructors) add atomically to the shared stripe; its
    // own goes back to the pool for the next thread.
    let stripe = core::mem::replace(&mut cache.stripe, arcs::SHARED_STRIPE as u32 + 1);
    cache.shared_stripe = true;
    compiler_fence(Ordering::SeqCst);
    if stripe != 0 {
        arcs::release_stripe((stripe - 1) as usize);
    }
    if !entries.is_null() {
        // SAFETY: `entries` is this thread's current mapping of `sets` sets; the only pointer to
        // it was just cleared.
        unsafe { sys::unmap(entries.cast(), cache_bytes(sets)) };
    }
    let mut retired_sets = FIRST_CACHE_SETS;
    for retired in &mut cache.retired {
        let base = core::mem::replace(retired, core::ptr::null_mut());
        if !base.is_null() {
            // SAFETY: retired mapping number i had FIRST_CACHE_SETS * CACHE_GROWTH^i sets; nothing
            // reads it any more (it was replaced before, and the fast path of this thread no
            // longer runs on a released cache).
            unsafe { sys::unmap(base.cast(), cache_bytes(retired_sets)) };
        }
        retired_sets *= CACHE_GROWTH;
    }
}

/// Sets of the calling thread's call cache (0 before its first counted call or after its release).
pub fn thread_cache_sets() -> usize {
    // SAFETY: as in `record_call`; only reads this thread's own header.
    let cache = unsafe { &*x86_64::thread_cache_block().cast::<ThreadCache>() };
    if cache.entries.is_null() {
        0
    } else {
        cache.sets()
    }
}

#[inline(always)]
/// Index of the first way of the pair's set.
fn cache_index(frompc: usize, selfpc: usize, set_mask: u32) -> usize {
    let callee_part = (selfpc >> 4) & 1;
    (callee_part.wrapping_add(frompc >> 2) as u32 & set_mask) as usize * 2
}

/// Records the arc `frompc` → `selfpc` (runtime PCs). Called by the assembly stubs with the stack
/// aligned and every argument register saved; async-signal-safe, never panics, never allocates.
pub extern "C" fn record_call(frompc: usize, selfpc: usize) {
    let state = CACHE_STATE.load(Ordering::Relaxed);
    if state & STATE_PAUSED != 0 {
        return;
    }
    let cache = x86_64::thread_cache_block().cast::<ThreadCache>();
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
    cache.writes = cache.writes.wrapping_add(1);
    // While this runs, a signal handler's fast path must not read the entries: it misses and its
    // call, nested, is counted without the cache.
    let made_under = core::mem::replace(&mut cache.generation, 0);
    compiler_fence(Ordering::SeqCst);
    // Never 0 (STATE_FIXED; the table pointer is aligned), so a zeroed cache is always stale.
    let generation = modules::generation() ^ state;
    if made_under != generation {
        cache.clear();
    }
    // Maps the entries on first use, which sets the mask.
    cache.entries();
    let index = cache_index(frompc, selfpc, cache.set_mask);
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
            // An unprofiled callee's entry points at the thread's sink, never null (see `ThreadCache`).
            let counter = counter.map(|c| {
                if c.is_null() {
                    &cache.unprofiled_sink as *const AtomicU64
                } else {
                    c
                }
            });
            if let (Some(counter), Some([first, second])) =
                (counter, cache.entries().get_mut(index..index + 2))
            {
                // The newest arc takes the first way, the one it displaces the second.
                let displaced = second.selfpc != 0;
                second.frompc = first.frompc;
                second.selfpc = first.selfpc;
                second.counter = first.counter;
                first.frompc = frompc;
                first.selfpc = selfpc;
                first.counter = counter;
                if displaced {
                    cache.count_eviction();
                }
            }
        }
    }
    compiler_fence(Ordering::SeqCst);
    cache.writes = cache.writes.wrapping_add(1);
    // Only entries that exist may be read by the fast path.
    if !cache.entries.is_null() {
        cache.generation = generation;
    }
    cache.depth = 0;
}

/// The slow path of a call nested in another (a signal handler): count without the cache.
#[cold]
fn record_nested(cache: &mut ThreadCache, depth: u32, frompc: usize, selfpc: usize) {
    if depth >= MAX_DEPTH {
        if let Some(callee) = modules::find_address(RuntimeAddress::from_usize(selfpc))
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
        let stripe = arcs::take_stripe();
        cache.shared_stripe = stripe == arcs::SHARED_STRIPE;
        cache.stripe = stripe as u32 + 1;
    }
    (cache.stripe - 1) as usize
}

/// The counter behind a pointer returned by [`record_uncached`] (null: unprofiled callee).
fn unsafe_counter(counter: *const AtomicU64) -> Option<&'static AtomicU64> {
    // SAFETY: non-null pointers from `record_uncached` point into arc tables of leaked
    // LiveModules, valid for the rest of the process; cached ones may also be the calling thread's
    // `unprofiled_sink`, valid while the thread runs (the reference does not outlive this call).
    unsafe { counter.as_ref() }
}

#[inline(always)]
fn increment(counter: &AtomicU64, shared: bool) {
    if shared {
        counter.fetch_add(1, Ordering::Relaxed);
    } else {
        x86_64::increment_unshared(counter);
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
    // The stubs' raw PCs become typed here, the one boundary.
    let (frompc, selfpc) = (
        RuntimeAddress::from_usize(frompc),
        RuntimeAddress::from_usize(selfpc),
    );
    let callee = modules::find_address(selfpc)
        .or_else(|| {
            (top_level && start_before_own_constructor())
                .then(|| modules::find_address(selfpc))
                .flatten()
        })
        .or_else(|| modules::module_loaded_during_open(selfpc))?;
    if !callee.profiled && !callee.plt_counted {
        return Some(core::ptr::null());
    }
    // Most calls come from the callee's own module: no table search for those.
    let caller = if callee.contains_address(frompc) {
        Some(callee)
    } else {
        modules::find_address(frompc)
    };
    // A module LD_PROFILE did not select, reached through a PLT stub: counted only when the caller's module is
    // selected, so that a selected module's calls out into libraries are counted.
    if !callee.profiled && !caller.is_some_and(|caller| caller.profiled) {
        return Some(core::ptr::null());
    }
    let (caller_key, caller_addr) = match caller {
        Some(caller) => (caller.key, caller.link_address(frompc)),
        None => (UNKNOWN_KEY, LinkAddress(0)),
    };
    callee
        .arcs
        .counter(stripe, caller_key, caller_addr, callee.link_address(selfpc))
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
