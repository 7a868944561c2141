//! Which `-pg` sites are rewritten while the program runs: those of the functions that take a large share of
//! the calls (the default; `MSLPROF_SITE_STUBS=1` rewrites every eligible site at start-up instead, `0` none).
//!
//! A rewritten site jumps to a stub of its function's own (`sites.rs`), which costs less than a call of
//! `mcount` when the function is called often, and more when many functions are hot in scattered order: a
//! stub is a line of code of its own, cold when its function is one of thousands called in turn, where
//! `mcount` is one piece of code that stays hot (runtime/CALLCOUNTS.md, "Rewritten sites"). So at start-up
//! the stubs are made and the sites kept ([`sites::Rewrite::WhenHot`]), and on each tick of a timer of the
//! process's CPU time (`sampler::start_look_timer`, every 10 ms) this file looks at the calls the running
//! thread's cache (`mcount`) counted since the last look, and rewrites the sites of the functions with at
//! least one [`SHARE`]th of them, unless their callers collide in their tables; at most [`MAX_FUNCTIONS`]
//! in all. A function of a phase of the program that starts late is thus found within a tick or two, and
//! a program whose thousands of functions are called in turn has none to rewrite.
//!
//! The rewrite happens in a SIGPROF handler, with every signal of its thread blocked (the interrupted code is
//! at an instruction boundary, and a frame returning to the site's end finds one there too). When
//! `/proc/self/stat` counts one thread, nothing else runs while the site's six bytes change; with more, the
//! rewrite follows the cross-modifying-code protocol ([`sites::rewrite_round`]), or is not done
//! where the kernel lacks `membarrier`'s core-serialising command. The calls of a function rewritten now were
//! counted in each thread's cache: each arc moves to the stub's table, with its count, when that thread's
//! entry there is made (`take_from_cache` in `mod.rs`).

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::{CACHE_STATE, STATE_PAUSED, ThreadCache, plt_sites, sites, x86_64};
use crate::sys;

/// A function is rewritten when the thread's cache counted at least this fraction (1/SHARE) of its calls
/// since the last look for it.
pub const SHARE: u64 = 512;
/// Most functions rewritten in all (their stubs are 16 KiB of code; those of one phase of a program fit the
/// instruction cache).
pub const MAX_FUNCTIONS: usize = 128;
/// Most functions rewritten in one look.
const PICKS_PER_LOOK: usize = 32;
const _: () = assert!(PICKS_PER_LOOK <= sites::MOST_AT_ONCE);
/// A hot function is not rewritten when more than one MOST_COLLIDINGth of its calls come from callers whose
/// entry of its table another caller takes.
pub const MOST_COLLIDING: u64 = 4;
/// Nor is a function called fewer times than this since the last look (about 400 000 calls a second at a
/// look every 10 ms: below that, a stub saves nothing worth one of the [`MAX_FUNCTIONS`]).
const MIN_CALLS: u64 = 1 << 12;
/// Most cache entries a look reads (256 KiB: all of a cache of the first size, evenly spaced ones of a
/// larger; about 30 µs against the 10 ms of CPU time between looks).
const LOOK_ENTRIES: usize = 1 << 13;

/// The thread (its cache header's address) that looked last, and the total it counted then.
static LAST_LOOKER: AtomicUsize = AtomicUsize::new(0);
static LAST_TOTAL: AtomicU64 = AtomicU64::new(0);
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

/// Called by the SIGPROF handler on every tick of the look timer (`sampler::start_look_timer`): rewrites the
/// sites of the functions found hot. Async-signal-safe: atomics, reads of this thread's cache, a read of
/// `/proc/self/stat` and `/proc/self/maps`, two `mprotect`s per page (and, while other threads run, three `membarrier`s a look);
/// no allocation, no lock, errno kept.
pub fn on_tick() {
    if REWRITTEN.load(Ordering::Relaxed) >= MAX_FUNCTIONS {
        GIVEN_UP.store(true, Ordering::Relaxed);
    }
    let kept = sites::kept().filter(|_| !GIVEN_UP.load(Ordering::Relaxed));
    let plt = plt_sites::wanted();
    if kept.is_none() && !plt {
        return;
    }
    if BUSY.swap(true, Ordering::Acquire) {
        return;
    }
    look_and_rewrite(kept, plt);
    BUSY.store(false, Ordering::Release);
}

/// Counts the calls of each kept site's function in this thread's cache, and rewrites the sites of the
/// hottest functions with at least a [`SHARE`]th of the calls; with `plt`, then rewrites the PLT call sites of
/// the hottest arcs (`plt_sites.rs`).
fn look_and_rewrite(kept: Option<&sites::KeptSites>, plt: bool) {
    // SAFETY: this thread's own header (see `record_top_level`), only read here; its entries are read only
    // when the Rust side, which may move them or change their mapping, was not interrupted (`depth` 0, a
    // valid generation). A fast path interrupted between its lookup and its add (`window` non-zero) is no
    // reason to wait: the look reads counts and changes code, never an entry, and the interrupted `mcount`
    // returns to the site's end, an instruction boundary either way. Waiting for it skipped most looks of a
    // program that spends its time in `mcount`, which is the program that needs one (runtime/CALLCOUNTS.md).
    let cache = unsafe { &*x86_64::thread_cache_block().cast::<ThreadCache>() };
    if cache.depth != 0
        || cache.generation == 0
        || CACHE_STATE.load(Ordering::Relaxed) & STATE_PAUSED != 0
    {
        return;
    }
    // SAFETY: a non-null `slot` points into the static slot table.
    let Some(slot) = (unsafe { cache.slot.as_ref() }) else {
        return;
    };
    if let Some(kept) = kept {
        rewrite_hot_functions(kept, cache, slot);
    }
    if plt {
        plt_sites::look(slot);
    }
}

/// The `-pg` part of a look: rewrites the sites of the hottest functions of `kept`.
fn rewrite_hot_functions(kept: &sites::KeptSites, cache: &ThreadCache, slot: &super::CacheSlot) {
    let total = count_calls(kept, cache, slot);
    let mut picked = [Pick::default(); PICKS_PER_LOOK];
    let room =
        (MAX_FUNCTIONS - REWRITTEN.load(Ordering::Relaxed).min(MAX_FUNCTIONS)).min(PICKS_PER_LOOK);
    let picked = pick_hottest(kept, total, &mut picked[..room]);
    if picked.is_empty() {
        return;
    }
    count_colliding_calls(kept, slot, picked);
    // With one thread (this one, in its handler) no code runs elsewhere; with more, the rewrite follows the
    // cross-modifying-code protocol, where the kernel provides it.
    let alone = sys::thread_count() == Some(1);
    if !alone && !kept.live {
        return;
    }
    let signals = sys::block_signals();
    for pick in picked.iter() {
        kept.done[pick.index].store(true, Ordering::Relaxed);
    }
    let chosen = picked
        .iter()
        .filter(|pick| pick.colliding.saturating_mul(MOST_COLLIDING) <= pick.calls)
        .map(|pick| &kept.sites[pick.index]);
    let writing = if alone {
        sites::Writing::Alone
    } else {
        sites::Writing::WhileOthersRun
    };
    // SAFETY: signals blocked on this thread; alone, no other thread runs while the sites change, and
    // with others the live protocol (its registration is `kept.live`) keeps them off the sites.
    let rewritten = unsafe { sites::rewrite_round(chosen, writing) };
    REWRITTEN.fetch_add(rewritten, Ordering::Relaxed);
    sys::restore_signals(&signals);
}

/// Sums, for each kept site's function, the counts of the thread cache's entries whose callee it is, and
/// the counts of all its entries (at most [`LOOK_ENTRIES`] read): the calls `mcount` counted (the stubs'
/// tables are not read: a look would cost ten times as much). Stores in `kept.calls` each function's calls
/// since this thread's last look (all of them if another thread looked last), and returns the same for the
/// total.
///
/// Counting since the last look, not since the start, lets a phase of the program that begins late have
/// its functions found as soon as the phases before it (a function's running total would have to reach a
/// [`SHARE`]th of everything counted before it started).
fn count_calls(kept: &sites::KeptSites, cache: &ThreadCache, slot: &super::CacheSlot) -> u64 {
    kept.calls
        .iter()
        .for_each(|calls| calls.store(0, Ordering::Relaxed));
    let mut total = 0u64;
    slot.for_each_sampled_entry_in_use(LOOK_ENTRIES, |entry| {
        let count = entry.count.load(Ordering::Relaxed);
        total = total.saturating_add(count);
        if let Some(index) = kept.find(entry.selfpc.load(Ordering::Relaxed)) {
            kept.calls[index].fetch_add(count, Ordering::Relaxed);
        }
    });
    let looker = cache as *const ThreadCache as usize;
    let same_thread = LAST_LOOKER.swap(looker, Ordering::Relaxed) == looker;
    let before = LAST_TOTAL.swap(total, Ordering::Relaxed);
    for (calls, seen) in kept.calls.iter().zip(kept.seen.iter()) {
        let now = calls.load(Ordering::Relaxed);
        let then = seen.swap(now, Ordering::Relaxed);
        if same_thread {
            calls.store(now.saturating_sub(then), Ordering::Relaxed);
        }
    }
    if same_thread {
        total.saturating_sub(before)
    } else {
        total
    }
}

/// A function found hot in a look.
#[derive(Clone, Copy, Default)]
struct Pick {
    /// Its kept site.
    index: usize,
    /// Its calls in the thread's cache since the last look.
    calls: u64,
    /// Those of them whose caller's entry in the function's table another caller took first.
    colliding: u64,
    /// The entries of its table its callers take (a bit each).
    taken: [u64; sites::TABLE_ENTRIES / 64],
}

/// Fills `picked` with the kept sites not yet rewritten whose function has at least [`MIN_CALLS`] and a
/// [`SHARE`]th of `total`, hottest first; the part filled. A site picked has its calls zeroed, so that the next
/// pass passes it over.
fn pick_hottest<'a>(kept: &sites::KeptSites, total: u64, picked: &'a mut [Pick]) -> &'a mut [Pick] {
    let mut filled = 0;
    while filled < picked.len() {
        let hottest = (0..kept.sites.len())
            .filter(|&index| !kept.done[index].load(Ordering::Relaxed))
            .map(|index| (kept.calls[index].load(Ordering::Relaxed), index))
            .filter(|&(calls, _)| calls >= MIN_CALLS && calls.saturating_mul(SHARE) >= total)
            .max();
        let Some((calls, index)) = hottest else {
            break;
        };
        kept.calls[index].store(0, Ordering::Relaxed);
        picked[filled] = Pick {
            index,
            calls,
            ..Pick::default()
        };
        filled += 1;
    }
    &mut picked[..filled]
}

/// Counts, for each picked function, the calls in the thread's cache whose caller would find its entry of
/// the function's table taken by a caller seen before it: calls the stub would pass on to `mcount`'s hit
/// path at a higher cost than `mcount`'s own (runtime/CALLCOUNTS.md, "Which sites are rewritten"). In a
/// cache larger than [`LOOK_ENTRIES`], only the callers in the entries read are seen.
fn count_colliding_calls(kept: &sites::KeptSites, slot: &super::CacheSlot, picked: &mut [Pick]) {
    slot.for_each_sampled_entry_in_use(LOOK_ENTRIES, |entry| {
        let Some(index) = kept.find(entry.selfpc.load(Ordering::Relaxed)) else {
            return;
        };
        let Some(pick) = picked.iter_mut().find(|pick| pick.index == index) else {
            return;
        };
        let at = sites::entry_index(entry.frompc.load(Ordering::Relaxed));
        let (word, bit) = (at / 64, 1u64 << (at % 64));
        if pick.taken[word] & bit != 0 {
            pick.colliding = pick
                .colliding
                .saturating_add(entry.count.load(Ordering::Relaxed));
        }
        pick.taken[word] |= bit;
    });
}
