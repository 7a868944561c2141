//! Which `-pg` sites are rewritten while the program runs: those of the functions that take a large share of
//! the calls (the default; `MSLPROF_SITE_STUBS=1` rewrites every eligible site at start-up instead, `0` none).
//!
//! A rewritten site jumps to a stub of its function's own (`sites.rs`), which costs less than a call of
//! `mcount` when the function is called often, and more when many functions are hot in scattered order: a
//! stub is a line of code of its own, cold when its function is one of thousands called in turn, where
//! `mcount` is one piece of code that stays hot (runtime/CALLCOUNTS.md, "Rewritten sites"). So at start-up
//! the stubs are made and the sites kept ([`sites::Rewrite::WhenHot`]), and on the ticks of a timer of the
//! process's CPU time (`sampler::start_look_timer`) this file looks at the calls the running thread's cache
//! has counted and rewrites the sites of the functions with at least
//! one [`SHARE`]th of them, at most [`MAX_FUNCTIONS`] in all: few enough that their stubs stay in the
//! instruction cache.
//!
//! The rewrite happens in a SIGPROF handler, with every signal of its thread blocked (the interrupted code is
//! at an instruction boundary, and a frame returning to the site's end finds one there too). When
//! `/proc/self/stat` counts one thread, nothing else runs while the site's six bytes change; with more, the
//! rewrite follows the cross-modifying-code protocol ([`sites::SiteJump::rewrite_live`]), or is not done
//! where the kernel lacks `membarrier`'s core-serialising command. The calls of a function rewritten now were
//! counted in each thread's cache: each arc moves to the stub's table, with its count, when that thread's
//! entry there is made (`take_from_cache` in `mod.rs`).

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::{CACHE_STATE, STATE_PAUSED, ThreadCache, sites, x86_64};
use crate::sys;

/// A function is rewritten when the thread's cache counts at least this fraction (1/SHARE) of all its calls
/// for it.
pub const SHARE: u64 = 512;
/// Most functions rewritten in all.
pub const MAX_FUNCTIONS: usize = 64;
/// No decision before the thread has counted this many calls.
const MIN_CALLS: u64 = 1 << 18;
/// Ticks on which to look: every one up to this, then one in [`LATER_EVERY`] (a look reads the whole cache:
/// about 60 µs on Lua's, against the 10 ms of process CPU time between ticks).
const EVERY_TICK_UNTIL: u64 = 32;
const LATER_EVERY: u64 = 4;

/// SIGPROF ticks seen.
static TICKS: AtomicU64 = AtomicU64::new(0);
/// Functions rewritten so far.
static REWRITTEN: AtomicUsize = AtomicUsize::new(0);
/// Set while a look is under way: a second handler (another thread's) stays out.
static BUSY: AtomicBool = AtomicBool::new(false);
/// Set once [`MAX_FUNCTIONS`] are rewritten (or a look failed): no more looks.
static GIVEN_UP: AtomicBool = AtomicBool::new(false);

/// Stops the looks for good (after an internal fault in one).
pub fn give_up() {
    GIVEN_UP.store(true, Ordering::Relaxed);
}

/// Called by the SIGPROF handler on every tick of the look timer (`sampler::start_look_timer`): on the ticks
/// of the schedule, rewrites the sites of the functions found hot. Async-signal-safe: atomics, reads of this thread's cache, a read of
/// `/proc/self/stat`, two `mprotect`s per site (and three `membarrier`s while other threads run); no
/// allocation, no lock, errno kept.
pub fn on_tick() {
    let Some(kept) = sites::kept() else {
        return;
    };
    if GIVEN_UP.load(Ordering::Relaxed) {
        return;
    }
    let tick = TICKS.fetch_add(1, Ordering::Relaxed) + 1;
    if tick > EVERY_TICK_UNTIL && !tick.is_multiple_of(LATER_EVERY) {
        return;
    }
    if REWRITTEN.load(Ordering::Relaxed) >= MAX_FUNCTIONS {
        GIVEN_UP.store(true, Ordering::Relaxed);
        return;
    }
    if BUSY.swap(true, Ordering::Acquire) {
        return;
    }
    look_and_rewrite(kept);
    BUSY.store(false, Ordering::Release);
}

/// Counts the calls of each kept site's function in this thread's cache, and rewrites the sites of the
/// hottest functions with at least a [`SHARE`]th of the calls.
fn look_and_rewrite(kept: &sites::KeptSites) {
    // SAFETY: this thread's own header (see `record_top_level`), only read here; its entries are read only
    // when neither a stub's lookup nor the Rust side was interrupted (`window` and `depth` are 0).
    let cache = unsafe { &*x86_64::thread_cache_block().cast::<ThreadCache>() };
    if cache.depth != 0
        || cache.window != 0
        || cache.generation == 0
        || CACHE_STATE.load(Ordering::Relaxed) & STATE_PAUSED != 0
    {
        return;
    }
    // SAFETY: a non-null `slot` points into the static slot table.
    let Some(slot) = (unsafe { cache.slot.as_ref() }) else {
        return;
    };
    let Some(total) = count_calls(kept, cache, slot) else {
        return;
    };
    let mut picked = [usize::MAX; MAX_FUNCTIONS];
    let room = MAX_FUNCTIONS - REWRITTEN.load(Ordering::Relaxed).min(MAX_FUNCTIONS);
    let picked = pick_hottest(kept, total, &mut picked[..room]);
    if picked.is_empty() {
        return;
    }
    // With one thread (this one, in its handler) no code runs elsewhere; with more, the rewrite follows the
    // cross-modifying-code protocol, where the kernel provides it.
    let alone = sys::thread_count() == Some(1);
    if !alone && !kept.live {
        return;
    }
    let signals = sys::block_signals();
    for &index in picked.iter() {
        kept.done[index].store(true, Ordering::Relaxed);
        let site = &kept.sites[index];
        // SAFETY: signals blocked on this thread; with one thread nothing else runs while the site changes,
        // with more the live rewrite's protocol (its registration is `kept.live`) keeps them off it.
        let rewritten = unsafe {
            if alone {
                site.rewrite()
            } else {
                site.rewrite_live()
            }
        };
        if rewritten {
            REWRITTEN.fetch_add(1, Ordering::Relaxed);
        }
    }
    sys::restore_signals(&signals);
}

/// Sums, for each kept site's function, the counts of the cache entries whose callee it is, into
/// `kept.calls`; the total of every entry of the cache and of the thread's site region. `None` below
/// [`MIN_CALLS`].
fn count_calls(
    kept: &sites::KeptSites,
    cache: &ThreadCache,
    slot: &super::CacheSlot,
) -> Option<u64> {
    kept.calls
        .iter()
        .for_each(|calls| calls.store(0, Ordering::Relaxed));
    let mut total = 0u64;
    slot.for_each_entry_in_use(|entry| {
        let count = entry.count.load(Ordering::Relaxed);
        total = total.saturating_add(count);
        if let Some(index) = kept.find(entry.selfpc.load(Ordering::Relaxed)) {
            kept.calls[index].fetch_add(count, Ordering::Relaxed);
        }
    });
    let region = cache.site_region.load(Ordering::Relaxed);
    if region != 0 {
        // SAFETY: a non-zero `site_region` is this thread's site region.
        unsafe {
            sites::for_each_used_entry(region as *mut u8, |entry| {
                total = total.saturating_add(entry.count.load(Ordering::Relaxed));
            })
        };
    }
    (total >= MIN_CALLS).then_some(total)
}

/// Fills `picked` with the indices of the kept sites not yet rewritten whose function has at least a
/// [`SHARE`]th of `total` (not 0), hottest first; the part filled. A site picked has its calls zeroed, so
/// that the next pass passes it over.
fn pick_hottest<'a>(kept: &sites::KeptSites, total: u64, picked: &'a mut [usize]) -> &'a [usize] {
    let mut filled = 0;
    while filled < picked.len() {
        let hottest = (0..kept.sites.len())
            .filter(|&index| !kept.done[index].load(Ordering::Relaxed))
            .map(|index| (kept.calls[index].load(Ordering::Relaxed), index))
            .filter(|&(calls, _)| calls.saturating_mul(SHARE) >= total)
            .max();
        let Some((_, index)) = hottest else {
            break;
        };
        kept.calls[index].store(0, Ordering::Relaxed);
        picked[filled] = index;
        filled += 1;
    }
    &picked[..filled]
}
