//! The Rust half of the mcount family: turns one profiling call into one arc count.
//!
//! Entry points: `mcount`, `_mcount` and `__fentry__` (assembly stubs in `x86_64`, which save the
//! registers and call [`record_call`]), and `__cyg_profile_func_enter` / `__cyg_profile_func_exit`
//! (`-finstrument-functions`, ordinary C calls, defined here).
//!
//! **Fast path.** Each thread has a cache of sets of two entries, [`FIRST_CACHE_SETS`] sets at
//! first (header in static TLS, `x86_64::thread_cache_block`; entries in a private mapping owned by the
//! thread's slot in `cache_slots`, whose pages are touched as used), mapping the raw pair (frompc,
//! selfpc) to the arc's counter in the thread's own stripe of the callee module's
//! [`ArcTable`](crate::arcs::ArcTable) and to the arc's count, kept in the entry itself. A hit is
//! handled by the assembly stub alone: a few loads and one non-locked add into the entry, on the same
//! cache line as the compared addresses; nothing shared is written. The count reaches the counter when
//! the entry goes (eviction, cache clear, thread exit) or a dump publishes it (`cache_slots` says how,
//! and why no call is counted twice). runtime/CALLCOUNTS.md goes through the stub instruction by
//! instruction. The cache is emptied (its counts flushed) when the module table changes (load/unload:
//! `modules::CURRENT`) or counting is paused, and dropped when the arcs are reset (fork): all three
//! change `CURRENT ^ CACHE_STATE`, the generation the cache was filled under. A cache that keeps
//! displacing entries (a working set larger than itself) grows, up to [`MAX_CACHE_SETS`] sets. A pair
//! lives in its own entry, one per 4 bytes of calling code ([`cache_index`]: two direct call sites never
//! share one), or, when another arc took that (another callee of the same site, a site as far away as the
//! cache's reach), in the other way of its set or in the alternate set its callee picks
//! ([`alternate_index`]); the stub looks in all four.
//!
//! **Rewritten sites** (`sites`, `hot`): the `-pg` sites of the selected modules' hottest functions, found
//! while the program runs (or, with `MSLPROF_SITE_STUBS=1`, of every eligible function at start-up), become
//! jumps to per-function stubs that count in a per-thread table (one compare) and jump back; their misses reach
//! [`record_site_call`], which shares `record_call`'s protocol and counts in the table or, when the table's
//! entry holds another caller, in the cache.
//!
//! **Slow path** (cache miss): map selfpc to its module load instance; a callee in a module that
//! LD_PROFILE did not select returns at once (remembered in the cache with no counter, so the next call is
//! cheap too), unless the call came through a PLT stub of the audit module (`LiveModule::plt_counted`)
//! from a selected module: that arc is recorded in the callee's table all the same. The caller may be in
//! any module (key and link-time address), or in none (`UNKNOWN_KEY`, address 0). The arc is recorded in
//! the table and cached with its count.
//!
//! **Reentrancy.** The cache header holds a nesting depth and a fast-path window count (non-zero while
//! a stub is between its first look at the cache and its add), and its generation is 0 while this Rust
//! side may change the entries (see `ThreadCache`). A signal handler that interrupts `record_call` or a
//! stub and calls instrumented code takes the slow path without touching the cache (so it cannot move an
//! entry the interrupted code is using) and still counts exactly, atomically in the shared stripe: the
//! table is lock-free and reentrant. Nesting deeper than [`MAX_DEPTH`] (runaway recursion, e.g. when
//! code the runtime calls is itself instrumented) is counted as dropped in the callee's table.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, compiler_fence};

use mslprof_format::{LinkAddress, RuntimeAddress};

use crate::arcs;
use crate::fork_reset::ForkOwner;
use crate::modules;
use crate::sys;
use cache_slots::{CacheEntry, CacheSlot};

mod cache_slots;
#[cfg(target_arch = "x86_64")]
pub mod hot;
#[cfg(target_arch = "x86_64")]
pub mod near;
#[cfg(target_arch = "x86_64")]
pub mod plt_sites;
#[cfg(target_arch = "x86_64")]
pub mod sites;
#[cfg(target_arch = "x86_64")]
mod x86_64;

/// Caller key of an arc whose call site is in no known module (SPEC.md §5).
pub const UNKNOWN_KEY: u32 = 0xFFFF_FFFF;

/// Nesting of `record_call` on one thread that is still counted: the call itself plus signal
/// handlers interrupting it.
pub const MAX_DEPTH: u32 = 3;

/// Sets of a thread's call cache when it is first mapped (two ways each: 8192 entries, 256 KiB).
pub const FIRST_CACHE_SETS: usize = CACHE_SETS[0];
/// The sizes a thread's cache has, in sets: the first mapping, then one per growth. The first growth goes
/// to 2 MiB, the smallest mapping transparent huge pages back (one page fault and 2 MiB cleared, where
/// 1 MiB of 4 KiB pages took 256 faults); the later ones multiply by 4, the last by 2. At most 4 194 304
/// sets (8 388 608 entries, 256 MiB of address space, of which only the pages used become resident; a
/// slot keeps every size it had, 426 MiB of address space at most). Entries follow call-site addresses
/// (4 bytes of code per entry), so that covers 32 MiB of code. A cache grows only after
/// displacing one entry per [`SETS_PER_GROWTH_EVICTION`] of its sets, so only a thread whose hot call
/// sites do not fit gets there.
const CACHE_SETS: [usize; 6] = [1 << 12, 1 << 15, 1 << 17, 1 << 19, 1 << 21, 1 << 22];
/// A cache grows once it has displaced one entry per this many of its sets since it was claimed or last
/// grew (growing moves the entries, so it may come early: see runtime/CALLCOUNTS.md).
const SETS_PER_GROWTH_EVICTION: usize = 32;
/// In the first cache, a displacement made by the first call of an arc counts this much less toward growth
/// than one made by an arc called before: the first cache grows after 2 048 of them. Every first call
/// misses, whatever the cache's size, so they say little about the working set; and the first growth (a 2 MiB
/// huge page cleared, the entries moved: 0.2–0.3 ms) costs more than the flushes of that many displaced
/// entries, so a program whose few thousand call sites each run once never pays for it.
const FIRST_CALL_DISPLACEMENT_WEIGHT: u32 = 16;
/// Most sets a thread's cache can have.
pub const MAX_CACHE_SETS: usize = CACHE_SETS[CACHE_SETS.len() - 1];

/// Counting state that every call checks, in one word so the fast path reads it with one load:
/// bit 0 is set by `moncontrol(0)` (paused), bit 1 is always set (so a cache generation is never
/// 0), bits 2.. count fork-time resets. A thread's cache is valid while its generation equals
/// `modules::CURRENT ^ CACHE_STATE`: a new module table, a reset or a pause all change it.
#[unsafe(link_section = "mslprof_fork_data")]
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
        let was = CACHE_STATE.fetch_or(STATE_PAUSED, Ordering::SeqCst);
        if was & STATE_PAUSED == 0 {
            cache_slots::stop_site_counting_everywhere();
        }
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

/// In a forked child's atfork handler (one thread): sends every call to the slow path (the fork epoch) and
/// takes this thread's stubs off its site region, so that nothing is counted before the child's counts are
/// reset (`fork_reset`). Returns what the thread keeps.
#[unsafe(link_section = "mslprof_fork_text")]
pub fn reset_thread_after_fork() -> ForkOwner {
    CACHE_STATE.fetch_add(STATE_EPOCH, Ordering::Relaxed);
    // SAFETY: as in `record_call`; only this (the only) thread's own header is used.
    let cache = unsafe { &mut *x86_64::thread_cache_block().cast::<ThreadCache>() };
    cache.generation = 0;
    cache.site_region.store(0, Ordering::Relaxed);
    ForkOwner {
        slot: cache.slot as usize,
        stripe: cache.stripe as usize,
    }
}

/// Forgets every arc of every module and every cached count but those of `own` (in a forked child, which
/// must profile only itself; `fork_reset` calls it before the child's first count).
pub fn reset_counts_after_fork(own: ForkOwner) {
    for module in modules::all() {
        module.arcs.reset();
    }
    // SAFETY: a non-zero slot address points into the static slot table.
    cache_slots::reset_after_fork(unsafe { (own.slot as *const CacheSlot).as_ref() });
    arcs::reset_stripes_after_fork(own.stripe.checked_sub(1));
}

/// Each piece of code the runtime made outside any file, with a name for profilers that name such code
/// (`perf_map`): the copy of `mcount` next to the main program, and in each stub mapping the copy of the hit
/// path and one stub per kept or rewritten site, named by the site's module and link-time address.
#[cfg(target_arch = "x86_64")]
pub fn for_each_generated_code(mut visit: impl FnMut(usize, usize, &str)) {
    if let Some((start, len)) = near::copy_range() {
        visit(
            start,
            len,
            "mslprof mcount (its copy next to the main program)",
        );
    }
    sites::for_each_generated_code(&mut |start, len, site| {
        let Some(site) = site else {
            visit(start, len, "mslprof mcount (its copy next to the stubs)");
            return;
        };
        let at = RuntimeAddress::from_usize(site);
        let name = match modules::find_address(at) {
            Some(module) => {
                let path = module.info.path.as_slice();
                let file = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
                let LinkAddress(link) = module.link_address(at);
                format!(
                    "mslprof stub for the mcount call at {}+{link:#x}",
                    String::from_utf8_lossy(file)
                )
            }
            None => format!("mslprof stub for the mcount call at {site:#x}"),
        };
        visit(start, len, &name);
    });
}

/// After a module was unloaded: the site regions' entries whose caller was in it must go before a stub can
/// match them again (a module loaded later at the same address would be counted as the old one), so every
/// thread leaves its region until its next miss, which drops them (`CacheSlot::site_region`).
pub fn note_unload() {
    if sites::region_bytes() != 0 {
        sites::note_unload();
        cache_slots::stop_site_counting_everywhere();
    }
}

/// Maps per-function stubs for the `-pg` sites of the profiled modules (`sites.rs`) and, with
/// [`sites::Rewrite::AtStartUp`], rewrites the sites to jump to them; with [`sites::Rewrite::WhenHot`] the
/// sites are kept for `hot.rs`. Start-up only, from the runtime's own start outside any counting call. A
/// rewrite at start-up needs a process with one thread, and flushes the calls counted so far from this
/// thread's cache first, so that no arc is in both. With `plt_sites`, the site regions also get room for the
/// PLT call sites and audit stubs `plt_sites.rs` redirects while the program runs, also when the runtime
/// starts inside a counting call (a library's constructor calling through the PLT before the runtime's own
/// constructor), where the `-pg` sites are left as they are. Returns the sites rewritten or kept.
pub fn install_site_stubs(
    modules: &[&modules::LiveModule],
    rewrite: sites::Rewrite,
    plt_sites: bool,
) -> usize {
    // SAFETY: as in `record_call`; only this thread's own header is used.
    let cache = unsafe { &mut *x86_64::thread_cache_block().cast::<ThreadCache>() };
    let now = rewrite == sites::Rewrite::AtStartUp;
    let outside_counting = cache.depth == 0 && cache.window == 0;
    let pg_sites = outside_counting && (!now || sys::thread_count() == Some(1));
    if !pg_sites && !plt_sites {
        return 0;
    }
    let Some(tls) = x86_64::site_region_tls_offset() else {
        return 0;
    };
    let (modules, rewrite) = if pg_sites {
        (modules, rewrite)
    } else {
        (&[][..], sites::Rewrite::WhenHot)
    };
    let now = pg_sites && now;
    let depth = core::mem::replace(&mut cache.depth, 1);
    if now {
        cache.generation = 0;
        compiler_fence(Ordering::SeqCst);
        // SAFETY: a non-null `slot` points into the static slot table.
        if let Some(slot) = unsafe { cache.slot.as_ref() } {
            slot.empty_now(true);
        }
    }
    let rewritten = sites::install(
        modules,
        install_site_stubs as *const () as usize,
        &x86_64::mcount_entry_points(),
        tls,
        x86_64::site_miss as *const () as usize,
        rewrite,
        if plt_sites {
            plt_sites::ROOM
        } else {
            sites::PltRoom::default()
        },
    );
    if plt_sites {
        plt_sites::enable(tls, x86_64::plt_site_miss as *const () as usize);
    }
    compiler_fence(Ordering::SeqCst);
    cache.depth = depth;
    rewritten
}

/// Where libmslprof_audit.so's PLT-counting stubs live: the base and length of its stub arena, written by the
/// audit module (the length alone once it sees this library loaded, the base when it makes the arena).
/// Samples there are this library's, the cost of profiling ([`library_address`]).
#[unsafe(no_mangle)]
pub static mslprof_plt_arena: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Bytes of one of the audit module's stubs (`runtime/audit/src/sys.rs`, stub convention 2:
/// `mslprof_plt_abi`), all at multiples of it from the arena's base, and where each keeps its callee.
pub const PLT_STUB_BYTES: usize = 32;
pub const PLT_STUB_CALLEE: usize = 24;

/// Whether the audit module counts calls through the PLT in this process: it writes the arena's length as
/// soon as it sees this library loaded, before any constructor runs, and its base once the arena is made.
pub fn plt_counting_announced() -> bool {
    mslprof_plt_arena[1].load(Ordering::Acquire) != 0
}

/// The audit module's stub arena, base and length, once it is made. Async-signal-safe.
pub fn plt_arena() -> Option<(usize, usize)> {
    let [arena, arena_bytes] = &mslprof_plt_arena;
    let base = arena.load(Ordering::Acquire);
    (base != 0).then(|| (base, arena_bytes.load(Ordering::Relaxed)))
}

/// `pc` as an address in this library when it is in a stub or in the copy of `mcount` (both this library's
/// counting code, moved next to the code that calls it), or in a PLT-counting stub of the audit module.
/// Async-signal-safe.
pub fn library_address(pc: usize) -> usize {
    let [arena, arena_bytes] = &mslprof_plt_arena;
    let arena = arena.load(Ordering::Acquire);
    if arena != 0 && pc.wrapping_sub(arena) < arena_bytes.load(Ordering::Relaxed)
        || plt_sites::contains(pc)
    {
        return x86_64::mslprof_plt_entry as *const () as usize;
    }
    sites::library_address(
        near::library_address(pc),
        x86_64::mcount as *const () as usize,
    )
}

static START_TRIED: AtomicBool = AtomicBool::new(false);

/// The constructors of libraries loaded with the program can run before the runtime's own
/// constructor (ELF runs dependencies' initialisers first, and a preloaded library depends on
/// nothing): their instrumented calls reach `mcount` before any module is known. The first such
/// call after libc's initialiser starts the runtime (once per process), with the vector state saved around it.
fn start_before_own_constructor() -> bool {
    if modules::generation() != 0
        || !sys::environment_ready()
        || START_TRIED.swap(true, Ordering::Relaxed)
    {
        return false;
    }
    extern "C" fn start() -> bool {
        crate::ensure_started()
    }
    // SAFETY: `start` is an ordinary function that never unwinds (ensure_started catches panics);
    // this is x86_64.
    unsafe { x86_64::call_preserving_vector_state(start) }
}

/// The per-thread cache header, overlaid on `x86_64::thread_cache_block` (static TLS). The entries live in
/// the thread's [`CacheSlot`] (`cache_slots`), which outlives the thread; `entries` and `entry_mask` mirror
/// the slot's current mapping for the assembly fast path.
///
/// The fast path writes only `window` (around its lookup) and an entry's count. It must not use an entry
/// that the interrupted Rust code was writing, hence `generation` is 0 (a miss) while `record_call` (top
/// level) runs. And the Rust code must not rewrite an entry that an interrupted fast path has matched and
/// is about to add to, hence `window`: a `record_call` that finds it non-zero interrupted a fast path (it
/// runs in a signal handler) and counts without touching the cache, as a nested call does.
#[repr(C)]
struct ThreadCache {
    /// `modules::CURRENT ^ CACHE_STATE` the entries were made under. 0 (which no generation is) while
    /// the Rust side may be changing the entries, and while there are none: the fast path then misses.
    generation: usize,
    /// Fast paths of this thread between their first and last access to the cache (incremented and
    /// decremented by the stub: non-zero only in a signal handler that interrupted one).
    window: u32,
    /// Nesting depth of `record_call` on this thread.
    depth: u32,
    /// The slot's current mapping: `entry_mask + 1` entries, or null (none yet, or none to be had).
    entries: *mut CacheEntry,
    /// Entries − 1 (a power of two − 1).
    entry_mask: u32,
    /// True once the thread's cache was released at thread exit (or could not be had): never claim another.
    released: bool,
    _reserved: [u8; 3],
    /// Stripe + 1 (0 = unassigned).
    stripe: u32,
    /// Valid entries displaced since the cache was claimed or last grew.
    evictions: u32,
    /// The thread's slot (null: none claimed yet).
    slot: *const CacheSlot,
    /// The thread's site region (`sites.rs`), read by every stub of a rewritten site; 0 while the stubs must
    /// miss: before the thread's first miss, while the slow path runs, and after another thread took every
    /// thread off its region (a pause, an unload: [`CacheSlot::stop_site_counting`]).
    site_region: AtomicUsize,
}

impl ThreadCache {
    /// The thread's slot, claimed (with a mapping) on first use. `None` when none can be had: the thread
    /// then counts every call on the slow path.
    fn slot(&mut self) -> Option<&'static CacheSlot> {
        if self.slot.is_null() && !self.released {
            match cache_slots::claim() {
                Some(slot) => {
                    self.slot = slot;
                    self.mirror(slot);
                    register_thread_exit(slot as *const CacheSlot as *mut u8);
                }
                None => self.released = true,
            }
        }
        // SAFETY: a non-null `slot` points into the static slot table.
        unsafe { self.slot.as_ref() }
    }

    /// Copies the slot's current mapping into the header (for the fast path).
    fn mirror(&mut self, slot: &CacheSlot) {
        let (entries, level) = slot.mapping();
        self.entries = entries;
        self.entry_mask = cache_slots::entry_mask(cache_slots::level_entries(level));
    }

    fn sets(&self) -> usize {
        (self.entry_mask as usize >> 1) + 1
    }

    /// Counts a displaced entry, made by the miss of an arc `called_before` or by an arc's first call (which in
    /// the first cache counts less: [`FIRST_CALL_DISPLACEMENT_WEIGHT`]); once a cache has displaced one entry
    /// per [`SETS_PER_GROWTH_EVICTION`] sets, the thread's working set does not fit: the slot moves to its
    /// next, larger mapping ([`CACHE_SETS`]), the old entries moved into it with their counts
    /// (`CacheSlot::grow`).
    fn count_eviction(&mut self, slot: &CacheSlot, called_before: bool) {
        let sets = self.sets();
        // In units of a first call's displacement in the first cache.
        let weight = if called_before || sets > FIRST_CACHE_SETS {
            FIRST_CALL_DISPLACEMENT_WEIGHT
        } else {
            1
        };
        self.evictions = self.evictions.saturating_add(weight);
        let due = sets / SETS_PER_GROWTH_EVICTION * FIRST_CALL_DISPLACEMENT_WEIGHT as usize;
        if (self.evictions as usize) < due || sets >= MAX_CACHE_SETS {
            return;
        }
        self.evictions = 0;
        if slot.grow() {
            self.mirror(slot);
        }
    }
}

static THREAD_EXIT_KEY: std::sync::OnceLock<Option<libc::pthread_key_t>> =
    std::sync::OnceLock::new();

/// Makes the thread's exit flush and give back its cache (`pthread_key_create` once,
/// `pthread_setspecific` per thread).
fn register_thread_exit(value: *mut u8) {
    let key = THREAD_EXIT_KEY.get_or_init(|| sys::create_thread_key(release_thread_cache));
    if let Some(key) = *key {
        sys::set_thread_value(key, value as usize);
    }
}

/// Thread-exit destructor: flushes this thread's cached counts into its stripe, then gives the stripe and
/// the slot back. Instrumented code may still run in later destructors on this thread: it counts on the
/// slow path, atomically, in the shared stripe.
unsafe extern "C" fn release_thread_cache(_slot: *mut libc::c_void) {
    let cache = x86_64::thread_cache_block().cast::<ThreadCache>();
    // SAFETY: the exiting thread's own header. A signal handler running meanwhile sees `depth` and
    // counts without the cache.
    let cache = unsafe { &mut *cache };
    let depth = core::mem::replace(&mut cache.depth, 1);
    cache.generation = 0;
    cache.site_region.store(0, Ordering::Relaxed);
    compiler_fence(Ordering::SeqCst);
    // SAFETY: a non-null `slot` points into the static slot table.
    if let Some(slot) = unsafe { cache.slot.as_ref() } {
        // No other thread may write this thread's TLS once it is gone.
        slot.unregister_site_word();
        if slot.begin_exit() {
            slot.empty_now(true);
            slot.empty_site_region_now();
            slot.release();
        }
    }
    cache.slot = core::ptr::null();
    cache.entries = core::ptr::null_mut();
    cache.released = true;
    let stripe = core::mem::replace(&mut cache.stripe, arcs::SHARED_STRIPE as u32 + 1);
    compiler_fence(Ordering::SeqCst);
    if stripe != 0 {
        arcs::release_stripe((stripe - 1) as usize);
    }
    cache.depth = depth;
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

/// Makes every count the call caches hold visible in the arc tables, for a dump: the calling thread's own
/// cache is flushed and emptied (unless this runs in a signal handler that interrupted the cache's
/// code), and the running totals of every other thread's cache are published (`cache_slots`). Calls a
/// running thread makes meanwhile may or may not be in the dump; none is counted twice. `last_dump` (the
/// process ends after it, counting is paused) also lends the other threads' deltas to the counters, once.
/// Async-signal-safe.
pub fn publish_cached_counts(last_dump: bool) {
    // SAFETY: as in `record_call`.
    let cache = unsafe { &mut *x86_64::thread_cache_block().cast::<ThreadCache>() };
    // SAFETY: a non-null `slot` points into the static slot table.
    let own = unsafe { cache.slot.as_ref() };
    let mut flushed = None;
    if let Some(slot) = own
        && cache.depth == 0
        && cache.window == 0
    {
        cache.depth = 1;
        cache.generation = 0;
        compiler_fence(Ordering::SeqCst);
        slot.empty_now(true);
        slot.flush_site_region();
        compiler_fence(Ordering::SeqCst);
        cache.depth = 0;
        flushed = Some(slot);
    }
    cache_slots::publish_all(flushed, last_dump && is_paused());
}

/// Index of the pair's own entry: one per 4 bytes of the call site's code (no two direct call sites, 5 bytes
/// each, share one), the stub's `shr rax, 2` / `and eax, mask`.
#[inline(always)]
fn cache_index(frompc: usize, entry_mask: u32) -> usize {
    ((frompc >> 2) as u32 & entry_mask) as usize
}

/// Index of the first way of the alternate set, for an arc whose callee is `selfpc`, of the set holding entry
/// `index`: two sets away, or four when bit 4 of `selfpc` is set (set index XOR 2 or 4, the stub's
/// `and rax, -64` / `xor rax, 128` / `xor rax, 384` with that bit). It holds the further callees of a call
/// site with more than its own set has room for (an indirect call; a chain of tail calls: `auxsort` →
/// `sort_comp` → `lua_compare` → `luaV_lessthan` all return to one address in `auxsort`), spread over two
/// sets by their callees.
#[inline(always)]
fn alternate_index(index: usize, selfpc: usize) -> usize {
    (index & !1) ^ if selfpc & 0x10 == 0 { 4 } else { 8 }
}

/// Records the arc `frompc` → `selfpc` (runtime PCs). Called by the assembly stubs with the stack
/// aligned and every argument register saved; async-signal-safe, never panics, never allocates.
pub extern "C" fn record_call(frompc: usize, selfpc: usize) {
    record_top_level(frompc, selfpc, None);
}

/// Records a call that missed in a rewritten site's stub (`sites.rs`): `miss_return` is the return address
/// of the stub's `call`, behind which the stub keeps its function's table and selfpc. The call is counted in
/// the thread's site region when its entry is free (and then hits in the stub from now on), else in the call
/// cache. Called by `x86_64::site_miss` as [`record_call`] is by the `mcount` stubs.
pub extern "C" fn record_site_call(frompc: usize, miss_return: usize) {
    // SAFETY: `site_miss` is reached only from a stub's `call`, whose return address this is.
    let (table, selfpc) = unsafe { sites::stub_metadata(miss_return) };
    let table =
        (!plt_sites::binding_miss_from_rewritten_site(frompc, miss_return)).then_some(table);
    record_top_level(frompc, selfpc, table);
}

/// [`record_call`], and [`record_site_call`] with `site_table` the stub's table.
#[inline(always)]
fn record_top_level(frompc: usize, selfpc: usize, site_table: Option<u32>) {
    crate::fork_reset::settle();
    let state = CACHE_STATE.load(Ordering::Relaxed);
    if state & STATE_PAUSED != 0 {
        return;
    }
    let cache = x86_64::thread_cache_block().cast::<ThreadCache>();
    // SAFETY: the block is this thread's own, zero-initialised (a valid ThreadCache: integers,
    // false, null pointers), aligned and large enough (checked in `x86_64`). Only this thread touches
    // it (but `site_region`, an atomic); a signal handler on this thread sees `depth` or `window` non-zero
    // and stays away from the entries.
    let cache = unsafe { &mut *cache };
    if cache.depth != 0 || cache.window != 0 {
        record_nested(cache, frompc, selfpc);
        return;
    }
    cache.depth = 1;
    // While this runs, a signal handler's fast path must not read the entries (nor a stub the site region):
    // it misses and its call, nested, is counted without them.
    if site_table.is_some() {
        cache.site_region.store(0, Ordering::Relaxed);
    }
    let made_under = core::mem::replace(&mut cache.generation, 0);
    compiler_fence(Ordering::SeqCst);
    // Never 0 (STATE_FIXED; the table pointer is aligned), so a zeroed cache is always stale.
    let generation = modules::generation() ^ state;
    let slot = cache.slot();
    if let Some(slot) = slot {
        slot.begin_write();
        if made_under != generation {
            slot.empty(true);
        }
        let site = site_table.and_then(|table| Some((slot.site_region()?, table)));
        let in_region = site.is_some_and(|(region, table)| {
            record_in_region(cache, slot, region, table, frompc, selfpc)
        });
        if !in_region {
            record_cached(cache, slot, frompc, selfpc);
        }
        slot.end_write();
        compiler_fence(Ordering::SeqCst);
        cache.generation = generation;
        if let Some((region, _)) = site {
            install_site_region(cache, slot, region);
        }
    } else if let Some(counted) = record_uncached(thread_stripe(cache), frompc, selfpc, true)
        && let Some(counter) = unsafe_counter(counted.counter)
    {
        counter.fetch_add(1, Ordering::Relaxed);
    }
    cache.depth = 0;
}

/// Points the thread's stubs at its site region again, unless a pause or an unload meanwhile wants them off
/// it: the other thread changes its state, then takes every thread off (`stop_site_counting`); this thread
/// installs, then reads the state (both sequentially consistent), so one of them sees the other.
fn install_site_region(cache: &ThreadCache, slot: &CacheSlot, region: *mut u8) {
    slot.register_site_word(&cache.site_region);
    cache.site_region.store(region as usize, Ordering::SeqCst);
    if CACHE_STATE.load(Ordering::SeqCst) & STATE_PAUSED != 0
        || sites::unloads() != slot.site_region_unloads()
    {
        cache.site_region.store(0, Ordering::Relaxed);
    }
}

/// The site-region part of [`record_site_call`]: counts the call in its entry of the function's table when
/// the entry holds this caller, or makes the entry when it is free; false (the cache counts it) when another
/// caller holds it. An arc is therefore in the region or in the cache, never both: an entry, once made, is
/// dropped only with the whole region (thread exit, fork) or when its caller's module is unloaded.
fn record_in_region(
    cache: &mut ThreadCache,
    slot: &CacheSlot,
    region: *mut u8,
    table: u32,
    frompc: usize,
    selfpc: usize,
) -> bool {
    let offset = sites::entry_offset(table, frompc);
    if offset + core::mem::size_of::<CacheEntry>() > sites::region_bytes() {
        return false;
    }
    // SAFETY: `region` is this thread's site region and `offset` an entry of a table in it.
    let entry = unsafe { sites::region_entry(region, offset) };
    match entry.frompc.load(Ordering::Relaxed) {
        0 => {}
        held if held == frompc => {
            entry.count.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        _ => return false,
    }
    take_from_cache(cache, slot, frompc, selfpc);
    let stripe = thread_stripe(cache);
    let Some(counted) = record_uncached(stripe, frompc, selfpc, true) else {
        return true;
    };
    let (counter, count) = cached_count(&counted, stripe);
    entry.counter.store(counter, Ordering::Relaxed);
    entry.count.store(count, Ordering::Relaxed);
    // A region entry's `selfpc` is its caller's module key (the stub knows its callee): unload drops by it.
    entry
        .selfpc
        .store(counted.caller_key as usize, Ordering::Relaxed);
    entry.frompc.store(frompc, Ordering::Release);
    // SAFETY: as above.
    unsafe { sites::touch(region, offset) };
    true
}

/// Takes the arc `frompc` → `selfpc` out of the thread's cache, its count flushed into its counter, when the
/// cache holds it. A function whose site is rewritten while the program runs (`hot.rs`) has arcs that the
/// cache counted until then: each moves to the site region when its entry there is made, so that the entry's
/// running total starts from a counter that has every earlier call, and the arc is never in both.
fn take_from_cache(cache: &ThreadCache, slot: &CacheSlot, frompc: usize, selfpc: usize) {
    if let Some(ways) = pair_ways(slot, cache_index(frompc, cache.entry_mask), selfpc)
        && let Some(entry) = way_holding(ways, frompc, selfpc)
    {
        cache_slots::flush(entry, slot.is_lent());
    }
}

/// The indices of the four entries where the cache may hold a pair whose own entry is `index`
/// ([`cache_index`]) and whose callee is `selfpc`, in the order the stub looks: that entry, the other way of
/// its set, then the two ways of its alternate set.
fn pair_places(index: usize, selfpc: usize) -> [usize; 4] {
    let alternate = alternate_index(index, selfpc);
    [index, index ^ 1, alternate, alternate + 1]
}

/// The entries at [`pair_places`]. `None` when the mapping is too short (none yet).
fn pair_ways(slot: &CacheSlot, index: usize, selfpc: usize) -> Option<[&CacheEntry; 4]> {
    let entries = slot.entries();
    let [own, other, alternate_first, alternate_second] = pair_places(index, selfpc);
    Some([
        entries.get(own)?,
        entries.get(other)?,
        entries.get(alternate_first)?,
        entries.get(alternate_second)?,
    ])
}

/// The one of `ways` that holds the pair (an arc is in one entry at most).
fn way_holding(ways: [&CacheEntry; 4], frompc: usize, selfpc: usize) -> Option<&CacheEntry> {
    ways.into_iter().find(|entry| {
        entry.frompc.load(Ordering::Relaxed) == frompc
            && entry.selfpc.load(Ordering::Relaxed) == selfpc
    })
}

/// What a new cache or region entry holds for `counted` (found in counter stripe `stripe`), with the call being
/// made counted: its counter, tagged [`cache_slots::DELTA`] when the count is a delta (the stripe is the shared
/// one, or the caller is in no module), and the count: a running total starts from what the thread's stripe
/// holds (see `cache_slots`), a delta from 0.
fn cached_count(counted: &Counted, stripe: usize) -> (usize, u64) {
    let delta = stripe == arcs::SHARED_STRIPE || counted.shared_arc;
    match unsafe_counter(counted.counter) {
        None => (0, 0),
        Some(_) if delta => (counted.counter as usize | cache_slots::DELTA, 1),
        Some(counter) => (
            counted.counter as usize,
            counter.load(Ordering::Relaxed).wrapping_add(1),
        ),
    }
}

/// The cache part of [`record_call`]: counts the call in its entry (one of the four of [`pair_ways`]), making
/// the entry on a miss. The newest arc takes its own entry; what that entry held moves on ([`make_room`]):
/// another callee of the same call site, or the arc of a call site whose own entry is the same one (code as
/// far apart as the cache's reach), so that two of them that are hot together do not miss on every call.
fn record_cached(cache: &mut ThreadCache, slot: &CacheSlot, frompc: usize, selfpc: usize) {
    let index = cache_index(frompc, cache.entry_mask);
    let Some(ways) = pair_ways(slot, index, selfpc) else {
        return;
    };
    if let Some(entry) = way_holding(ways, frompc, selfpc) {
        entry.count.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let stripe = thread_stripe(cache);
    let Some(counted) = record_uncached(stripe, frompc, selfpc, true) else {
        return;
    };
    // Read before this call is counted: whether the thread's stripe (or the shared counter) has counted the arc
    // before, so that this miss is of an arc the cache lost rather than of one never called.
    let called_before =
        unsafe_counter(counted.counter).is_some_and(|c| c.load(Ordering::Relaxed) != 0);
    let (counter, count) = cached_count(&counted, stripe);
    let lent = slot.is_lent();
    let own = ways[0];
    let mut displaced = false;
    if own.in_use() {
        displaced = make_room(cache.entry_mask, slot, index, lent);
    }
    own.set(frompc, selfpc, counter, count);
    slot.touch(index);
    if displaced {
        cache.count_eviction(slot, called_before);
    }
}

/// Moves the arc in the own entry `index` (about to take another arc) into the other way of its set, unless
/// that is a neighbouring call site's own entry, else into its alternate set. Each arc moved takes a free way
/// or one holding an arc away from its own entry, which moves on the same way in turn (from the other way to
/// its alternate set, from there out of the cache); arcs in their own entries stay. True if a valid entry was
/// flushed (the moved arc itself when its alternate set holds two call sites' own arcs).
fn make_room(entry_mask: u32, slot: &CacheSlot, index: usize, lent: bool) -> bool {
    let entries = slot.entries();
    let (Some(own), Some(other)) = (entries.get(index), entries.get(index ^ 1)) else {
        return false;
    };
    let in_own_entry = |entry: &CacheEntry, at: usize| {
        entry.in_use() && cache_index(entry.frompc.load(Ordering::Relaxed), entry_mask) == at
    };
    let mut displaced = false;
    // Into the arc's alternate set: a free way, else one whose arc is away from its own entry (flushed), else
    // nowhere (flushed itself).
    let mut to_alternate = |moved: &CacheEntry| {
        let alternate = alternate_index(index, moved.selfpc.load(Ordering::Relaxed));
        let target = (alternate..alternate + 2)
            .filter_map(|at| Some((entries.get(at)?, at)))
            .min_by_key(|&(way, at)| (way.in_use(), in_own_entry(way, at)))
            .filter(|&(way, at)| !in_own_entry(way, at));
        match target {
            Some((way, _)) => {
                if way.in_use() {
                    cache_slots::flush(way, lent);
                    displaced = true;
                }
                way.copy_from(moved);
                slot.touch(alternate);
                moved.set(0, 0, 0, 0);
            }
            None => {
                cache_slots::flush(moved, lent);
                displaced = true;
            }
        }
    };
    if in_own_entry(other, index ^ 1) {
        to_alternate(own);
        return displaced;
    }
    if other.in_use() {
        to_alternate(other);
    }
    other.copy_from(own);
    own.set(0, 0, 0, 0);
    displaced
}

/// The slow path of a call nested in another (a signal handler that interrupted `record_call` or a fast
/// path): counts without the cache, atomically in the shared stripe (the interrupted code may be about to
/// store the thread's own stripe).
#[cold]
fn record_nested(cache: &mut ThreadCache, frompc: usize, selfpc: usize) {
    crate::fork_reset::settle();
    let depth = cache.depth;
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
    if let Some(counted) = record_uncached(arcs::SHARED_STRIPE, frompc, selfpc, false)
        && let Some(counter) = unsafe_counter(counted.counter)
    {
        counter.fetch_add(1, Ordering::Relaxed);
    }
    compiler_fence(Ordering::SeqCst);
    cache.depth = depth;
}

/// The thread's counter stripe, taken on its first use ([`arcs::SHARED_STRIPE`] when it has none of its own,
/// and after it gave its own back at exit).
fn thread_stripe(cache: &mut ThreadCache) -> usize {
    if cache.stripe == 0 {
        cache.stripe = arcs::take_stripe() as u32 + 1;
    }
    (cache.stripe - 1) as usize
}

/// The counter behind a pointer returned by [`record_uncached`] (null: unprofiled callee).
fn unsafe_counter(counter: *const AtomicU64) -> Option<&'static AtomicU64> {
    // SAFETY: non-null pointers from `record_uncached` point into arc tables of leaked LiveModules,
    // valid for the rest of the process.
    unsafe { counter.as_ref() }
}

/// What [`record_uncached`] found for a call.
struct Counted {
    /// The arc's counter in the stripe asked for; null when the callee's module is not profiled.
    counter: *const AtomicU64,
    /// The caller is in no module: calls from many return addresses share this arc (and its counter).
    shared_arc: bool,
    /// The caller's module key ([`UNKNOWN_KEY`] for none).
    caller_key: u32,
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
) -> Option<Counted> {
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
    let unprofiled = Counted {
        counter: core::ptr::null(),
        shared_arc: false,
        caller_key: UNKNOWN_KEY,
    };
    if !callee.profiled && !callee.plt_counted {
        return Some(unprofiled);
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
        return Some(unprofiled);
    }
    let (caller_key, caller_addr) = match caller {
        Some(caller) => (caller.key, caller.link_address(frompc)),
        None => (UNKNOWN_KEY, LinkAddress(0)),
    };
    callee
        .arcs
        .counter(stripe, caller_key, caller_addr, callee.link_address(selfpc))
        .map(|counter| Counted {
            counter,
            shared_arc: caller.is_none(),
            caller_key,
        })
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
