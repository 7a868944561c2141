//! Rewritten PLT call sites and redirected audit stubs: a hot `call foo@plt` whose PLT slot holds the audit
//! module's counting stub for `foo` becomes a `call` to a stub of its own, which counts the call in the
//! thread's site region and jumps straight to `foo`; and the audit stub of a hot callee reached otherwise (a
//! tail call `jmp foo@plt`, a call through a pointer to the PLT entry) jumps to a stub that counts by the
//! caller's return address in a table of the callee's, as a `-pg` function's stub does.
//!
//! Through the audit module, a counted call takes three jumps (the PLT's, the audit stub's `call` of
//! `mslprof_plt_entry` and its jump to the function) and a two-key lookup in the thread cache; runtime/README.md
//! ("Calls through the PLT") measured the extra hop alone at a third of the cost. A rewritten site's stub is
//! reached by the site's own `call`, needs no key (the site has one caller and one callee), and ends in one
//! jump to the function:
//! ```text
//!  0  mov r11, [rip + got]           the site's PLT slot, as the program has it now
//!  7  cmp r11, [rip + bound]         still the audit stub this site was rewritten for?
//! 14  jne plt                        no: the PLT, as if never rewritten
//! 20  mov r11, fs:[tls]              the thread's site region (ThreadCache::site_region)
//! 29  test r11, r11                  none: a miss
//! 32  jz 58
//! 34  cmp qword [r11 + entry], 0     the site's entry, made by the slow path
//! 42  je 58
//! 44  add qword [r11 + entry + 24], 1
//! 52  jmp [rip + callee]
//! 58  call trampoline                the slow path counts the call (x86_64::plt_site_miss)
//! 63  jmp 52
//! 68  table (u32), callee (u64)      read by the slow path through its return address
//! 80  bound (u64), callee (u64)
//! ```
//! r11 and the flags are the stub's scratch: a function's caller keeps nothing in them (ld.so's lazy
//! binding clobbers both). A site is picked by `hot.rs`'s look, in a SIGPROF handler, from the arcs the
//! thread's cache counts most: the five bytes before the arc's return address must be a `call rel32` into
//! its module's PLT (`jmp [rip + slot]`, after `endbr64` or with `bnd`), the slot a word of the module's
//! file-backed data holding an audit stub whose callee is the arc's. Each site gets an entry of its own in
//! every thread's site region (`sites::plt_entry_table`), which the slow path (`mod.rs`, `record_site_call`)
//! makes once per thread, moving the arc's count out of the cache; its dumps, flushes, pauses, unloads and
//! forks are those of `-pg` sites' entries. The site's five bytes change in `sites::rewrite_round`, by
//! the cross-modifying-code protocol while other threads run.
//!
//! A hot arc whose return address follows no such call has its callee's audit stubs (one per module that
//! bound it) redirected: the first six bytes of each (`push qword [rip + 18]`) become `jmp stub; nop`, in
//! the same round, and the stub ([`encode_binding_stub`]) counts a call in the entry of the callee's table
//! (`sites::binding_table`) picked by the caller's return address, misses into the same slow path, and runs
//! the audit stub's own instructions when another caller holds the entry. An arc is counted in one entry of
//! a region at most (running totals of two would not add up), so a call site whose audit stub is
//! redirected is not rewritten, a look that redirects an audit stub rewrites no site calling through it, and
//! a call from a rewritten site that reaches a redirected audit stub (it was on its way through the PLT when
//! the site changed) is counted in the thread's cache, not in the audit stub's table
//! ([`binding_miss_from_rewritten_site`]). An audit stub that site stubs were made for may be redirected:
//! its other callers (tail calls, calls through pointers) are then counted in its table.
//!
//! A look takes the loader lock without waiting (none when a `dlopen` or `dlclose` runs): the modules it
//! reads and writes stay mapped until it is done. The stubs are mapped within 130 MiB of their module's
//! code, a fresh page each look, written, then made read-only and executable: a page other threads may run
//! is never written again.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use mslprof_format::RuntimeAddress;

use super::cache_slots::CacheSlot;
use super::sites::{self, SITE_BYTES, SiteJump, Writing};
use crate::modules::{self, LiveModule};

/// Most sites rewritten in all (an entry each reserved in every thread's region: 16 KiB).
pub const MAX_SITES: usize = 512;
/// Most audit stubs redirected in all (a table each reserved in every thread's region: 1 MiB of address
/// space, a page or two of it used per stub and thread).
pub const MAX_BINDINGS: usize = 128;
/// What every thread's site region keeps for them.
pub const ROOM: sites::PltRoom = sites::PltRoom {
    site_entries: MAX_SITES,
    stub_tables: MAX_BINDINGS,
};
/// Most sites rewritten in one look.
const PICKS_PER_LOOK: usize = 64;
const _: () = assert!(PICKS_PER_LOOK <= sites::MOST_AT_ONCE);
/// Bytes of one stub: two cache lines; the hit path is the first.
const STUB_BYTES: usize = 128;
/// The return address of a site stub's `call trampoline`, and of a redirected audit stub's; the metadata
/// follows the `jmp` after it.
const MISS_RETURN: usize = 63;
const BINDING_MISS_RETURN: usize = 74;
/// The first bytes of a redirected audit stub's stub (`push rax`, then `mov rax, fs:`).
const BINDING_STUB_HEAD: [u8; 3] = [0x50, 0x64, 0x48];
/// Bytes of a module's stub mapping (a page of it per look that rewrites some of its sites).
const REGION_BYTES: usize = 64 << 10;
/// Most modules with stubs.
const MAX_REGIONS: usize = 64;
/// Bits of the filter of call sites not to be rewritten (a site's bit is its return address, hashed).
const REFUSED_BITS: usize = 4096;
/// An arc is picked when the cache counted at least this many of its calls since the last look (about
/// 400 000 a second at a look every 10 ms of CPU time), and one SHAREth of all those counted.
const MIN_CALLS: u64 = 1 << 9;
const SHARE: u64 = 1024;
/// CPU time a thread must have run since its last look for a look that found nothing on it to count as
/// idle (the looks come every 10 ms of the process's CPU time: `sampler::LOOK_PERIOD_NS`).
const RAN_NS: u64 = 1_000_000;
/// Slots of [`SEEN`], and how many of them an arc may take (a bucket).
const SEEN_SLOTS: usize = 1 << 14;
const SEEN_WAYS: usize = 4;
/// Most cache entries a look reads (as `hot.rs`).
const LOOK_ENTRIES: usize = 1 << 13;

/// Set at start-up when the audit module counts calls through the PLT and the site regions have tables
/// for PLT sites.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Whether sites may be rewritten while other threads run (`sys::register_core_sync` succeeded).
static LIVE: AtomicBool = AtomicBool::new(false);
/// The `fs`-relative offset of `ThreadCache::site_region`, and the slow path's trampoline target.
static TLS: AtomicI32 = AtomicI32::new(0);
static MISS: AtomicUsize = AtomicUsize::new(0);
/// Looks so far, and how many of them to pass over since the last that wrote anything: one in
/// 2^IDLE_SHIFT is made.
static TICKS: AtomicU32 = AtomicU32::new(0);
static IDLE_SHIFT: AtomicU32 = AtomicU32::new(0);
const MOST_IDLE_SHIFT: u32 = 5;
/// Entries handed out to site stubs, and tables to redirected audit stubs, so far.
static ENTRIES_USED: AtomicUsize = AtomicUsize::new(0);
static BINDINGS_USED: AtomicUsize = AtomicUsize::new(0);
/// The count each arc had at the last look that read it, so that a look judges the calls made since: the
/// arcs of a past phase of the program (Python's imports) are not rewritten in place of those of the current
/// one. Twice as many slots as the cache entries a look reads, in buckets of [`SEEN_WAYS`]: an arc new to its
/// bucket takes the slot with the fewest calls, unless it has fewer than [`MIN_CALLS`] calls and that slot's
/// arc more. With a slot per arc, two hot arcs of the ~400 a look reads in Python would share one at almost
/// every look, take it from each other and both be new at every look, and looks would never back off.
static SEEN: [(AtomicUsize, AtomicU64); SEEN_SLOTS] =
    [const { (AtomicUsize::new(0), AtomicU64::new(0)) }; SEEN_SLOTS];
/// The stub mappings: module key, start, pages used; `REGIONS` of them valid.
static REGION_KEYS: [AtomicU32; MAX_REGIONS] = [const { AtomicU32::new(0) }; MAX_REGIONS];
static REGION_STARTS: [AtomicUsize; MAX_REGIONS] = [const { AtomicUsize::new(0) }; MAX_REGIONS];
static REGION_PAGES: [AtomicUsize; MAX_REGIONS] = [const { AtomicUsize::new(0) }; MAX_REGIONS];
static REGIONS: AtomicUsize = AtomicUsize::new(0);
/// Call sites found not to be PLT calls, or whose rewrite failed, by a bit of their return address's hash:
/// not looked at again (a site sharing the bit of one refused is passed over too).
static REFUSED: [AtomicU64; REFUSED_BITS / 64] = [const { AtomicU64::new(0) }; REFUSED_BITS / 64];

/// Turns the rewriting of PLT sites on (start-up, after `sites::install` reserved their tables): stubs find
/// the thread's region at `fs:[tls]` and miss into `miss`.
pub fn enable(tls: i32, miss: usize) {
    if sites::plt_entry_table(0, 0).is_none() {
        return;
    }
    TLS.store(tls, Ordering::Relaxed);
    MISS.store(miss, Ordering::Relaxed);
    LIVE.store(crate::sys::register_core_sync(), Ordering::Relaxed);
    ENABLED.store(true, Ordering::Release);
}

/// Whether a look should search for PLT sites to rewrite. Async-signal-safe.
pub fn wanted() -> bool {
    ENABLED.load(Ordering::Acquire)
        && (ENTRIES_USED.load(Ordering::Relaxed) < MAX_SITES
            || BINDINGS_USED.load(Ordering::Relaxed) < MAX_BINDINGS)
}

/// Whether `pc` is in a PLT site's stub (profiling overhead). Async-signal-safe.
pub fn contains(pc: usize) -> bool {
    offset_in_region(pc).is_some()
}

/// How far `pc` is into the stub mapping that holds it, if one does. Async-signal-safe.
fn offset_in_region(pc: usize) -> Option<usize> {
    let regions = REGIONS.load(Ordering::Acquire).min(MAX_REGIONS);
    REGION_STARTS[..regions]
        .iter()
        .map(|start| pc.wrapping_sub(start.load(Ordering::Relaxed)))
        .find(|&offset| offset < REGION_BYTES)
}

/// Whether a miss of a redirected audit stub's stub (its `call trampoline` returning to `miss_return`) comes
/// from a call site rewritten to a stub of its own: a call that was on its way through the PLT when the site
/// changed. The slow path counts it in the thread's cache, not in the audit stub's table: the site's arc has
/// its entry in the site's table, and two entries of a region never hold one arc.
pub fn binding_miss_from_rewritten_site(frompc: usize, miss_return: usize) -> bool {
    let stub = miss_return.wrapping_sub(BINDING_MISS_RETURN);
    let in_region = offset_in_region(stub).is_some_and(|offset| offset.is_multiple_of(STUB_BYTES));
    // SAFETY: a stub of our mapping, written before any code ran there, never written again nor unmapped;
    // the caller's call site, in the code it returns to (mapped while it runs).
    in_region
        && unsafe { core::ptr::read_volatile(stub as *const [u8; 3]) } == BINDING_STUB_HEAD
        && call_before(frompc).is_some_and(|before| contains(before.target))
}

/// One look's search (`hot.rs`, SIGPROF handler): rewrites the sites of the arcs of `slot` (the running
/// thread's cache) with the most calls that are PLT calls, while no `dlopen` or `dlclose` runs, with every
/// signal of this thread blocked. Async-signal-safe: no allocation, no lock but the loader lock taken
/// without waiting, system calls (`mmap`, `mprotect`, `membarrier`, reads of `/proc/self/stat` and
/// `/proc/self/maps`, only when there is something to rewrite) with errno kept.
pub fn look(slot: &CacheSlot) {
    let Some(arena) = super::plt_arena() else {
        return;
    };
    // Looks that find nothing to do space out, up to one tick in 2^MOST_IDLE_SHIFT: a program whose calls
    // through the PLT are spread over thousands of sites (rustc's into its allocator) pays for the reads of
    // its cache and gains nothing.
    let shift = IDLE_SHIFT.load(Ordering::Relaxed);
    if TICKS.fetch_add(1, Ordering::Relaxed) & ((1 << shift) - 1) != 0 {
        return;
    }
    let mut picks = [Pick::default(); PICKS_PER_LOOK];
    let (picks, first_seen, total) = hottest_arcs(slot, &mut picks);
    let written = if picks.is_empty() {
        0
    } else {
        // With one thread (this one, in its handler) no code runs elsewhere; with more, the rewrite follows
        // the cross-modifying-code protocol, where the kernel provides it.
        let writing = match crate::sys::thread_count() {
            Some(1) => Some(Writing::Alone),
            _ if LIVE.load(Ordering::Relaxed) => Some(Writing::WhileOthersRun),
            _ => None,
        };
        writing.map_or(0, |writing| {
            let signals = crate::sys::block_signals();
            let written =
                mslprof_loader_hooks::while_loader_idle(|| rewrite(picks, arena, writing));
            crate::sys::restore_signals(&signals);
            written.unwrap_or(0)
        })
    };
    // A look that first saw an arc with many calls is not idle: the next one may pick it. Nor is one on a
    // thread that counted next to nothing since its last look and barely ran (the timer's signal may go to
    // a thread that waits, such as a `main` in `pthread_join`): it says nothing of the others. A thread
    // that ran and counted nothing in its cache is idle: its hot calls are counted in stubs already (as in
    // `openssl speed`, one thread whose hot calls all go through stubs).
    let shift = if written > 0 || first_seen {
        0
    } else if total < MIN_CALLS && !slot.ran_since_last_look(RAN_NS) {
        shift
    } else {
        (shift + 1).min(MOST_IDLE_SHIFT)
    };
    IDLE_SHIFT.store(shift, Ordering::Relaxed);
}

/// An arc of the thread's cache, or (no return address) a callee of many of them.
#[derive(Clone, Copy, Default)]
struct Pick {
    calls: u64,
    frompc: usize,
    selfpc: usize,
    /// The callee's arcs in the cache (`u32::MAX`: not known).
    callers: u32,
}

impl Pick {
    /// What [`refuse`] remembers when nothing can be done for it: the call site, or the callee.
    fn key(&self) -> usize {
        if self.frompc == 0 {
            self.selfpc
        } else {
            self.frompc
        }
    }
}

/// The arcs of `slot` with the most calls since the last look, at least [`MIN_CALLS`] and a [`SHARE`]th of
/// all, not refused before, most first; then, in the room left, the callees with as many calls from arcs
/// none of which has that many (a function called from all over: its audit stubs are redirected, since no
/// one site is worth a stub). The part of `picks` filled (a callee's pick has no return address: 0), whether
/// an arc with at least [`MIN_CALLS`] calls in all was seen for the first time, and the calls since the last
/// look in all.
fn hottest_arcs<'a>(slot: &CacheSlot, picks: &'a mut [Pick]) -> (&'a mut [Pick], bool, u64) {
    let thread = slot as *const CacheSlot as usize;
    let mut total = 0u64;
    let mut first_seen = false;
    let mut filled = 0;
    let mut callees = [CalleeCalls::default(); CALLEE_SLOTS];
    slot.for_each_sampled_entry_in_use(LOOK_ENTRIES, |entry| {
        let count = entry.count.load(Ordering::Relaxed);
        let frompc = entry.frompc.load(Ordering::Relaxed);
        let selfpc = entry.selfpc.load(Ordering::Relaxed);
        let seen = calls_since_last_look(thread, frompc, selfpc, count);
        first_seen |= seen.is_none() && count >= MIN_CALLS;
        let calls = seen.unwrap_or(0);
        add_callee_calls(&mut callees, selfpc, calls);
        total = total.saturating_add(calls);
        if calls < MIN_CALLS || picks.is_empty() || refused(frompc) {
            return;
        }
        let pick = Pick {
            calls,
            frompc,
            selfpc,
            callers: u32::MAX,
        };
        if filled < picks.len() {
            picks[filled] = pick;
            filled += 1;
        } else if let Some(least) = picks.iter_mut().min_by_key(|pick| pick.calls)
            && least.calls < calls
        {
            *least = pick;
        }
    });
    picks[..filled].sort_unstable_by_key(|pick| core::cmp::Reverse(pick.calls));
    let hot = |calls: u64| calls >= MIN_CALLS && calls.saturating_mul(SHARE) >= total;
    let mut kept = picks[..filled]
        .iter()
        .take_while(|pick| hot(pick.calls))
        .count();
    for pick in &mut picks[..kept] {
        if let Some(callee) = callees.iter().find(|callee| callee.selfpc == pick.selfpc) {
            pick.callers = callee.arcs;
        }
    }
    for callee in callees {
        if kept == picks.len() {
            break;
        }
        if hot(callee.calls) && callee.most < MIN_CALLS && !refused(callee.selfpc) {
            picks[kept] = Pick {
                calls: callee.calls,
                frompc: 0,
                selfpc: callee.selfpc,
                callers: callee.arcs,
            };
            kept += 1;
        }
    }
    (&mut picks[..kept], first_seen, total)
}

/// The calls since the last look to one callee, summed over its arcs, the most of one arc, and its arcs.
#[derive(Clone, Copy, Default)]
struct CalleeCalls {
    selfpc: usize,
    calls: u64,
    most: u64,
    arcs: u32,
}

/// Most arcs to a callee (in the cache's entries a look reads) for its audit stubs to be redirected: half a
/// table's entries (88 callers of `pthread_mutex_unlock` in Python + SQLite, most of them cold: a few
/// collide, and the rest are counted in the table).
const MOST_CALLERS: u32 = (sites::TABLE_ENTRIES / 2) as u32;
/// Slots of a look's sums per callee (on the signal handler's stack: 8 KiB).
const CALLEE_SLOTS: usize = 256;

/// Adds an arc's `calls` to its callee's sums (a callee that finds no slot in a few probes is not summed).
fn add_callee_calls(callees: &mut [CalleeCalls; CALLEE_SLOTS], selfpc: usize, calls: u64) {
    let start = top_bits(selfpc, CALLEE_SLOTS.trailing_zeros());
    for probe in 0..8 {
        let slot = &mut callees[(start + probe) % CALLEE_SLOTS];
        if slot.selfpc == 0 {
            slot.selfpc = selfpc;
        }
        if slot.selfpc == selfpc {
            slot.calls = slot.calls.saturating_add(calls);
            slot.most = slot.most.max(calls);
            slot.arcs = slot.arcs.saturating_add(1);
            return;
        }
    }
}

/// The calls of the arc `frompc` → `selfpc` in the cache of `thread` (its slot's address: each thread's
/// cache keeps its own running totals) since the last look that read it there, from its count now (`None`
/// the first time). Looks take turns (`hot.rs`), so the slots are read and written without atomic exchanges.
fn calls_since_last_look(thread: usize, frompc: usize, selfpc: usize, count: u64) -> Option<u64> {
    let key = seen_key(thread, frompc, selfpc);
    let bucket = seen_bucket(key);
    if let Some((_, seen_count)) = bucket
        .iter()
        .find(|(seen_key, _)| seen_key.load(Ordering::Relaxed) == key)
    {
        let before = seen_count.load(Ordering::Relaxed);
        if before != count {
            seen_count.store(count, Ordering::Relaxed);
        }
        return Some(count.saturating_sub(before));
    }
    // An arc with few calls does not take the slot of one with many: they would take it from each other at
    // every look, and the one with many would be new at every look (and never picked).
    if let Some((seen_key, seen_count)) = bucket
        .iter()
        .min_by_key(|(_, seen_count)| seen_count.load(Ordering::Relaxed))
        && (seen_count.load(Ordering::Relaxed) < MIN_CALLS || count >= MIN_CALLS)
    {
        seen_key.store(key, Ordering::Relaxed);
        seen_count.store(count, Ordering::Relaxed);
    }
    None
}

/// The key of the arc `frompc` → `selfpc` in the cache of `thread` in [`SEEN`].
fn seen_key(thread: usize, frompc: usize, selfpc: usize) -> usize {
    (frompc.wrapping_mul(FIBONACCI) ^ selfpc).wrapping_mul(FIBONACCI) ^ thread
}

/// The bucket of [`SEEN`] for `key`.
fn seen_bucket(key: usize) -> &'static [(AtomicUsize, AtomicU64)] {
    let first = top_bits(key, (SEEN_SLOTS / SEEN_WAYS).trailing_zeros()) * SEEN_WAYS;
    &SEEN[first..first + SEEN_WAYS]
}

/// The word and bit of [`REFUSED`] for the call site returning to `frompc`.
fn refused_bit(frompc: usize) -> (&'static AtomicU64, u64) {
    let bit = top_bits(frompc, REFUSED_BITS.trailing_zeros());
    (&REFUSED[bit / 64], 1 << (bit % 64))
}

/// [`crate::FIBONACCI`] for `usize` arithmetic.
const FIBONACCI: usize = crate::FIBONACCI as usize;

/// The top `bits` bits of `value`'s Fibonacci hash: an index into a table of 2^bits slots.
fn top_bits(value: usize, bits: u32) -> usize {
    value.wrapping_mul(FIBONACCI) >> (usize::BITS - bits)
}

/// Whether the call site returning to `frompc` was refused before.
fn refused(frompc: usize) -> bool {
    let (word, bit) = refused_bit(frompc);
    word.load(Ordering::Relaxed) & bit != 0
}

/// Remembers that the call site returning to `frompc` (or the callee at `frompc`: [`Pick::key`]) is not to
/// be rewritten.
fn refuse(frompc: usize) {
    let (word, bit) = refused_bit(frompc);
    word.fetch_or(bit, Ordering::Relaxed);
}

/// A PLT call site found behind an arc, and its module.
#[derive(Clone, Copy)]
struct PltCall {
    module: &'static LiveModule,
    target: StubTarget,
}

/// What a PLT call site's stub is made for.
#[derive(Clone, Copy)]
struct StubTarget {
    /// The `call rel32`'s address, and its six bytes (the last is the next instruction's).
    site: usize,
    original: [u8; SITE_BYTES],
    /// The PLT entry it calls, the slot that entry jumps through, and the audit stub the slot holds.
    plt: usize,
    slot: usize,
    bound: usize,
}

/// The PLT call `before` (a `call rel32`, [`call_before`]), if the arc to `selfpc` is one: it calls a PLT
/// entry of its module that jumps through a slot of the module's file-backed data holding the audit
/// module's stub for `selfpc`.
/// Reads only the module's mapped segments and the arena (the caller holds the loader lock).
fn plt_call(before: CallBefore, selfpc: usize, arena: (usize, usize)) -> Option<PltCall> {
    let CallBefore {
        module,
        site,
        original,
        target: plt,
    } = before;
    const ENTRY_BYTES: usize = 11;
    if !module.contains_bytes(RuntimeAddress::from_usize(plt), ENTRY_BYTES) {
        return None;
    }
    // SAFETY: as above, inside one executable segment.
    let entry = unsafe { core::ptr::read(plt as *const [u8; ENTRY_BYTES]) };
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    let jump_at = if entry[..4] == ENDBR64 { 4 } else { 0 };
    let jump_at = if entry[jump_at] == 0xf2 {
        jump_at + 1
    } else {
        jump_at
    };
    if entry.get(jump_at..jump_at + 2)? != [0xff, 0x25] {
        return None;
    }
    let disp = entry.get(jump_at + 2..jump_at + 6)?;
    let disp = i32::from_le_bytes([disp[0], disp[1], disp[2], disp[3]]);
    let slot = (plt + jump_at + 6).wrapping_add_signed(disp as isize);
    let slot_link = slot.wrapping_sub(module.info.bias) as u64;
    let in_data = module
        .info
        .readable_ranges
        .iter()
        .any(|range| range.start <= slot_link && slot_link + 8 <= range.end);
    if !slot.is_multiple_of(8) || !in_data {
        return None;
    }
    // SAFETY: an aligned word of the module's mapped, readable data; ld.so and the program may write it, so
    // it is read atomically.
    let bound = unsafe { &*(slot as *const AtomicUsize) }.load(Ordering::Relaxed);
    let (arena_base, arena_bytes) = arena;
    let into_arena = bound.wrapping_sub(arena_base);
    if into_arena < super::PLT_STUB_BYTES
        || into_arena + super::PLT_STUB_BYTES > arena_bytes
        || !into_arena.is_multiple_of(super::PLT_STUB_BYTES)
    {
        return None;
    }
    // SAFETY: a stub of the arena, written before ld.so stored its address in the slot; the arena is never
    // unmapped.
    let (head, callee) = unsafe {
        (
            core::ptr::read_volatile(bound as *const [u8; SITE_BYTES]),
            ((bound + super::PLT_STUB_CALLEE) as *const u64).read_unaligned() as usize,
        )
    };
    // A redirected audit stub counts its calls in its own table: the site's calls stay with it.
    (callee == selfpc && head == AUDIT_STUB_HEAD).then_some(PltCall {
        module,
        target: StubTarget {
            site,
            original,
            plt,
            slot,
            bound,
        },
    })
}

/// A `call rel32` found before a return address.
#[derive(Clone, Copy)]
struct CallBefore {
    module: &'static LiveModule,
    /// The call's address, its six bytes (the last is the next instruction's), and where it calls.
    site: usize,
    original: [u8; SITE_BYTES],
    target: usize,
}

/// The `call rel32` whose return address is `frompc`, if the five bytes before it, in one executable
/// segment of a loaded module, are one. The module must stay mapped: the caller holds the loader lock, or
/// `frompc` is where its own running call returns.
fn call_before(frompc: usize) -> Option<CallBefore> {
    let module = modules::find_address(RuntimeAddress::from_usize(frompc))?;
    let site = frompc.checked_sub(5)?;
    if !module.contains_bytes(RuntimeAddress::from_usize(site), SITE_BYTES) {
        return None;
    }
    // SAFETY: six bytes inside one executable segment of a loaded module, which stays mapped: a look holds the
    // loader lock, and the slow path reads the call site its running call returns to.
    let original = unsafe { core::ptr::read(site as *const [u8; SITE_BYTES]) };
    if original[0] != 0xe8 {
        return None;
    }
    let rel = i32::from_le_bytes([original[1], original[2], original[3], original[4]]);
    Some(CallBefore {
        module,
        site,
        original,
        target: frompc.wrapping_add_signed(rel as isize),
    })
}

/// The page this look writes stubs near a module's code into (or near the arena's: [`ARENA_KEY`]), and the
/// bytes it holds so far.
#[derive(Clone, Copy, Default)]
struct OpenPage {
    key: u32,
    page: usize,
    used: usize,
}

/// The key of the stub mapping near the audit module's arena (module keys are smaller).
const ARENA_KEY: u32 = u32::MAX - 1;

/// The stubs one look makes and the jumps to them, written in one round.
struct NewStubs {
    pages: [OpenPage; sites::MOST_AT_ONCE],
    open: usize,
    jumps: [Option<SiteJump>; sites::MOST_AT_ONCE],
    /// For each jump: the page of its stub, and the return address of the arc that asked for it.
    page_of_jump: [usize; sites::MOST_AT_ONCE],
    frompc_of_jump: [usize; sites::MOST_AT_ONCE],
    count: usize,
    page_bytes: usize,
}

impl NewStubs {
    fn new() -> NewStubs {
        NewStubs {
            pages: [OpenPage::default(); sites::MOST_AT_ONCE],
            open: 0,
            jumps: [None; sites::MOST_AT_ONCE],
            page_of_jump: [0; sites::MOST_AT_ONCE],
            frompc_of_jump: [0; sites::MOST_AT_ONCE],
            count: 0,
            page_bytes: crate::sys::page_size(),
        }
    }

    fn full(&self) -> bool {
        self.count == sites::MOST_AT_ONCE
    }

    /// Room for a stub within reach of `[low, high)` (the code of the mapping keyed `key`): the page it goes
    /// on (in `pages`) and its address.
    fn room(&mut self, key: u32, low: usize, high: usize) -> Option<(usize, usize)> {
        let page_bytes = self.page_bytes;
        let with_room = self.pages[..self.open]
            .iter()
            .position(|p| p.key == key && p.used + STUB_BYTES <= page_bytes);
        let at = match with_room {
            Some(at) => at,
            None if self.open < self.pages.len() => {
                let page = fresh_page(key, low, high, page_bytes)?;
                self.pages[self.open] = OpenPage {
                    key,
                    page,
                    used: STUB_BYTES,
                };
                self.open += 1;
                self.open - 1
            }
            None => return None,
        };
        Some((at, self.pages[at].page + self.pages[at].used))
    }

    /// Writes `code` at the stub's room `at` took and keeps `jump` to it, for the arc returning to `frompc`.
    fn add(&mut self, at: usize, code: &[u8; STUB_BYTES], jump: SiteJump, frompc: usize) {
        let stub = self.pages[at].page + self.pages[at].used;
        // SAFETY: a stub's room in a fresh page of our own mapping, still read-write, that no code runs yet.
        unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), stub as *mut u8, STUB_BYTES) };
        self.pages[at].used += STUB_BYTES;
        self.jumps[self.count] = Some(jump);
        self.page_of_jump[self.count] = at;
        self.frompc_of_jump[self.count] = frompc;
        self.count += 1;
    }

    /// Makes the pages read-only and executable and writes the jumps in one round; the arcs of jumps not
    /// written are refused. How many were written.
    fn write(mut self, writing: Writing) -> usize {
        for (at, page) in self.pages[..self.open].iter().enumerate() {
            // SAFETY: our own page, which no code runs in yet and nothing writes after this.
            if !unsafe { crate::sys::protect(page.page, self.page_bytes, false, true) } {
                for (jump, _) in self
                    .jumps
                    .iter_mut()
                    .zip(self.page_of_jump)
                    .filter(|(_, of)| *of == at)
                {
                    *jump = None;
                }
            }
        }
        let jumps = &self.jumps[..self.count];
        // SAFETY: the caller (hot.rs) blocked this thread's signals; `writing` says how others may run.
        let written = unsafe { sites::rewrite_round(jumps.iter().flatten(), writing) };
        for (jump, &frompc) in jumps.iter().zip(&self.frompc_of_jump) {
            // SAFETY: a site of a loaded module's code or a stub of the arena, readable (checked when found).
            if jump.is_none_or(|jump| !unsafe { jump.written() }) {
                refuse(frompc);
            }
        }
        written
    }
}

/// Makes the stubs for `picks` and rewrites in one round: the call sites found to be PLT calls, and the
/// audit stubs of the other arcs' callees. The loader lock is held: no module is unloaded meanwhile.
///
/// An arc is never counted in two entries of a region (their running totals would not add up): a site is
/// not rewritten when its slot's audit stub is redirected, before (`plt_call` refuses it) or in the same
/// round (a call made through the PLT during the round could make an entry in the audit stub's table).
fn rewrite(picks: &[Pick], arena: (usize, usize), writing: Writing) -> usize {
    let mut stubs = NewStubs::new();
    let mut direct: [Option<PltCall>; PICKS_PER_LOOK] = [const { None }; PICKS_PER_LOOK];
    let mut redirected = [0usize; sites::MOST_AT_ONCE];
    let mut redirected_count = 0;
    for (pick, direct) in picks.iter().zip(direct.iter_mut()) {
        let before = call_before(pick.frompc);
        *direct = before.and_then(|before| plt_call(before, pick.selfpc, arena));
        if direct.is_some() || stubs.full() {
            continue;
        }
        // A site rewritten already: its arc, still in some thread's cache with an older count, is counted in
        // the site's entry from now on, and must not get a second one in a redirected audit stub's table.
        if before.is_some_and(|before| contains(before.target)) {
            refuse(pick.key());
            continue;
        }
        // A table of the callee's keeps one caller an entry: with many callers, most would collide and pay
        // for the redirected stub on top of the audit stub's own path.
        if pick.callers > MOST_CALLERS {
            refuse(pick.key());
            continue;
        }
        let redirected_before = redirected_count;
        for_each_audit_stub(arena, pick.selfpc, |audit_stub| {
            // An earlier pick of this look with the same callee took it already.
            let taken = redirected[..redirected_count].contains(&audit_stub);
            if !taken
                && redirected_count < redirected.len()
                && redirect_audit_stub(&mut stubs, arena, audit_stub, pick)
            {
                redirected[redirected_count] = audit_stub;
                redirected_count += 1;
            }
        });
        if redirected_count == redirected_before {
            refuse(pick.key());
        }
    }
    for (pick, call) in picks.iter().zip(&direct) {
        let Some(call) = call else {
            continue;
        };
        if stubs.full() || redirected[..redirected_count].contains(&call.target.bound) {
            continue;
        }
        if !rewrite_site(&mut stubs, call, pick) {
            refuse(pick.frompc);
        }
    }
    stubs.write(writing)
}

/// Adds the stub and the jump that rewrite the PLT call site `call` of `pick`; false when it cannot be made.
fn rewrite_site(stubs: &mut NewStubs, call: &PltCall, pick: &Pick) -> bool {
    let (low, high) = call.module.code_span();
    let Some((at, stub)) = stubs.room(call.module.key, low, high) else {
        return false;
    };
    let entry = ENTRIES_USED.load(Ordering::Relaxed);
    let page = stubs.pages[at].page;
    let made = sites::plt_entry_table(entry, pick.frompc).and_then(|table| {
        let code = encode_stub(stub, &call.target, pick.selfpc, table, page)?;
        let jump = SiteJump::call(call.target.site, call.target.original, stub)?;
        Some((code, jump))
    });
    let Some((code, jump)) = made else {
        return false;
    };
    ENTRIES_USED.store(entry + 1, Ordering::Relaxed);
    stubs.add(at, &code, jump, pick.frompc);
    true
}

/// The first six bytes of an audit stub as the audit module writes them: `push qword [rip + 18]`.
const AUDIT_STUB_HEAD: [u8; SITE_BYTES] = [0xff, 0x35, 0x12, 0, 0, 0];

/// Visits each audit stub of the arena whose callee is `callee` and whose head is still [`AUDIT_STUB_HEAD`],
/// up to the first slot not yet written.
fn for_each_audit_stub(arena: (usize, usize), callee: usize, mut visit: impl FnMut(usize)) {
    let (base, bytes) = arena;
    let stub_bytes = super::PLT_STUB_BYTES;
    for stub in (base + stub_bytes..base + bytes - stub_bytes + 1).step_by(stub_bytes) {
        // SAFETY: a slot of the arena, mapped readable and never unmapped (a slot never written reads as
        // zeros); the audit module may be writing it, so a head may read half-written: it is then skipped.
        let (head, stub_callee) = unsafe {
            (
                core::ptr::read_volatile(stub as *const [u8; SITE_BYTES]),
                core::ptr::read_volatile((stub + super::PLT_STUB_CALLEE) as *const u64),
            )
        };
        if head == [0; SITE_BYTES] && stub_callee == 0 {
            break;
        }
        if head == AUDIT_STUB_HEAD && stub_callee as usize == callee {
            visit(stub);
        }
    }
}

/// Adds the stub and the jump that redirect the audit stub at `audit_stub` (its head becomes `jmp stub`)
/// for `pick`'s callee; false when it cannot be made.
fn redirect_audit_stub(
    stubs: &mut NewStubs,
    arena: (usize, usize),
    audit_stub: usize,
    pick: &Pick,
) -> bool {
    let binding = BINDINGS_USED.load(Ordering::Relaxed);
    let Some(table) = sites::binding_table(binding) else {
        return false;
    };
    let Some((at, stub)) = stubs.room(ARENA_KEY, arena.0, arena.0 + arena.1) else {
        return false;
    };
    let page = stubs.pages[at].page;
    let made = encode_binding_stub(stub, audit_stub, pick.selfpc, table, page)
        .zip(SiteJump::to_stub(audit_stub, AUDIT_STUB_HEAD, stub));
    let Some((code, jump)) = made else {
        return false;
    };
    BINDINGS_USED.store(binding + 1, Ordering::Relaxed);
    stubs.add(at, &code, jump, pick.key());
    true
}

/// A fresh page of the stub mapping keyed `key` (mapped within reach of `[low, high)` on first use),
/// read-write, starting with the trampoline to the slow path: `jmp [rip]` and the slow path's address.
fn fresh_page(key: u32, low: usize, high: usize, page_bytes: usize) -> Option<usize> {
    let regions = REGIONS.load(Ordering::Relaxed);
    let found =
        (0..regions.min(MAX_REGIONS)).find(|&i| REGION_KEYS[i].load(Ordering::Relaxed) == key);
    let region = match found {
        Some(region) => region,
        None if regions < MAX_REGIONS => {
            let base = super::near::map_near(low, high, REGION_BYTES)? as usize;
            REGION_KEYS[regions].store(key, Ordering::Relaxed);
            REGION_STARTS[regions].store(base, Ordering::Relaxed);
            REGION_PAGES[regions].store(0, Ordering::Relaxed);
            REGIONS.store(regions + 1, Ordering::Release);
            regions
        }
        None => return None,
    };
    let used = REGION_PAGES[region].load(Ordering::Relaxed);
    if (used + 1) * page_bytes > REGION_BYTES {
        return None;
    }
    REGION_PAGES[region].store(used + 1, Ordering::Relaxed);
    let page = REGION_STARTS[region].load(Ordering::Relaxed) + used * page_bytes;
    let trampoline = sites::trampoline(MISS.load(Ordering::Relaxed));
    // SAFETY: the start of a page of our own read-write mapping that nothing has used yet.
    unsafe {
        core::ptr::copy_nonoverlapping(trampoline.as_ptr(), page as *mut u8, trampoline.len())
    };
    Some(page)
}

/// Machine code being written into a fixed buffer (no allocation: stubs are made in a signal handler).
struct Code {
    bytes: [u8; STUB_BYTES],
    len: usize,
    /// The address the first byte will have.
    at: usize,
}

impl Code {
    fn put(&mut self, bytes: &[u8]) {
        let end = (self.len + bytes.len()).min(STUB_BYTES);
        self.bytes[self.len..end].copy_from_slice(&bytes[..end - self.len]);
        self.len = end;
    }

    /// The displacement to `to` of a rip-relative operand written next, with `rest` more bytes of its
    /// instruction after it.
    fn disp_to(&self, to: usize, rest: usize) -> Option<[u8; 4]> {
        let next = self.at + self.len + 4 + rest;
        Some(
            i32::try_from(to as isize - next as isize)
                .ok()?
                .to_le_bytes(),
        )
    }
}

/// The stub at `stub` for `call` (its callee `callee`, its table at `table` bytes into the region), whose
/// misses call the trampoline at the start of `page`. `None` when a branch does not reach or the layout
/// (module documentation) comes out otherwise.
fn encode_stub(
    stub: usize,
    call: &StubTarget,
    callee: usize,
    table: u32,
    page: usize,
) -> Option<[u8; STUB_BYTES]> {
    let entry = i32::try_from(sites::entry_offset(table, call.site + 5)).ok()?;
    let count = entry.checked_add(24)?;
    let tls = TLS.load(Ordering::Relaxed);
    const BOUND_AT: usize = 80;
    const CALLEE_AT: usize = 88;
    let mut code = Code {
        bytes: [0xcc; STUB_BYTES],
        len: 0,
        at: stub,
    };
    code.put(&[0x4c, 0x8b, 0x1d]);
    code.put(&code.disp_to(call.slot, 0)?);
    code.put(&[0x4c, 0x3b, 0x1d]);
    code.put(&code.disp_to(stub + BOUND_AT, 0)?);
    code.put(&[0x0f, 0x85]);
    code.put(&code.disp_to(call.plt, 0)?);
    code.put(&[0x64, 0x4c, 0x8b, 0x1c, 0x25]);
    code.put(&tls.to_le_bytes());
    code.put(&[0x4d, 0x85, 0xdb, 0x74, 24]);
    code.put(&[0x49, 0x83, 0xbb]);
    code.put(&entry.to_le_bytes());
    code.put(&[0x00, 0x74, 14]);
    code.put(&[0x49, 0x83, 0x83]);
    code.put(&count.to_le_bytes());
    code.put(&[0x01, 0xff, 0x25]);
    code.put(&code.disp_to(stub + CALLEE_AT, 0)?);
    code.put(&[0xe8]);
    code.put(&code.disp_to(page, 0)?);
    if code.len != MISS_RETURN {
        return None;
    }
    code.put(&[0xe9]);
    code.put(&(-16i32).to_le_bytes());
    code.put(&table.to_le_bytes());
    code.put(&(callee as u64).to_le_bytes());
    if code.len != BOUND_AT {
        return None;
    }
    code.put(&(call.bound as u64).to_le_bytes());
    code.put(&(callee as u64).to_le_bytes());
    (code.len == CALLEE_AT + 8).then_some(code.bytes)
}

/// The stub at `stub` that the audit stub at `audit_stub` (callee `callee`) is redirected to: it counts
/// the call in the callee's table at `table` bytes into the thread's region, the entry picked by the caller's
/// return address as in a `-pg` function's stub (`sites.rs`), and jumps to the callee. A call whose entry is
/// free, or with no region, calls the trampoline at the start of `page` (the slow path makes the entry); one
/// whose entry another caller holds runs the audit stub as it was (its head, then the rest of it). At entry
/// `[rsp]` is the caller's return address: the audit stub was reached by a jump.
/// ```text
///  0  push rax
///  1  mov rax, fs:[tls]           the thread's site region
/// 10  test rax, rax               none: a miss
/// 13  jz 68
/// 15  mov r11, [rsp + 8]          the caller's return address
/// 20  shl r11d, 3                 ((frompc >> 2) mod TABLE_ENTRIES) * 32
/// 24  and r11d, INDEX_MASK
/// 31  add rax, r11
/// 34  mov r11, [rax + table]      the entry's caller
/// 41  cmp r11, [rsp + 8]
/// 46  jne 63
/// 48  add qword [rax + table + 24], 1
/// 56  pop rax
/// 57  jmp [rip + callee]
/// 63  test r11, r11               another caller holds the entry: the audit stub counts
/// 66  jnz 91
/// 68  pop rax
/// 69  call trampoline             the slow path makes the entry (x86_64::plt_site_miss)
/// 74  jmp 57
/// 79  table (u32), callee (u64)   read by the slow path through its return address
/// 91  pop rax
/// 92  push qword [rip + callee]   the audit stub's head, then its second instruction
/// 98  jmp audit_stub + 6
/// 104 callee (u64)
/// ```
fn encode_binding_stub(
    stub: usize,
    audit_stub: usize,
    callee: usize,
    table: u32,
    page: usize,
) -> Option<[u8; STUB_BYTES]> {
    const CALLEE_AT: usize = 104;
    let table_disp = i32::try_from(table).ok()?;
    let count_disp = table_disp.checked_add(24)?;
    let tls = TLS.load(Ordering::Relaxed);
    let mut code = Code {
        bytes: [0xcc; STUB_BYTES],
        len: 0,
        at: stub,
    };
    code.put(&[0x50, 0x64, 0x48, 0x8b, 0x04, 0x25]);
    code.put(&tls.to_le_bytes());
    code.put(&[0x48, 0x85, 0xc0, 0x74, 53]);
    code.put(&[0x4c, 0x8b, 0x5c, 0x24, 0x08]);
    code.put(&[0x41, 0xc1, 0xe3, 0x03, 0x41, 0x81, 0xe3]);
    code.put(&sites::INDEX_MASK.to_le_bytes());
    code.put(&[0x4c, 0x01, 0xd8, 0x4c, 0x8b, 0x98]);
    code.put(&table_disp.to_le_bytes());
    code.put(&[0x4c, 0x3b, 0x5c, 0x24, 0x08, 0x75, 15]);
    code.put(&[0x48, 0x83, 0x80]);
    code.put(&count_disp.to_le_bytes());
    code.put(&[0x01, 0x58, 0xff, 0x25]);
    code.put(&code.disp_to(stub + CALLEE_AT, 0)?);
    code.put(&[0x4d, 0x85, 0xdb, 0x75, 23, 0x58, 0xe8]);
    code.put(&code.disp_to(page, 0)?);
    if code.len != BINDING_MISS_RETURN {
        return None;
    }
    code.put(&[0xe9]);
    code.put(&(57i32 - 79).to_le_bytes());
    code.put(&table.to_le_bytes());
    code.put(&(callee as u64).to_le_bytes());
    code.put(&[0x58, 0xff, 0x35]);
    code.put(&code.disp_to(stub + CALLEE_AT, 0)?);
    code.put(&[0xe9]);
    code.put(&code.disp_to(audit_stub + SITE_BYTES, 0)?);
    code.put(&[0xcc]);
    if code.len != CALLEE_AT {
        return None;
    }
    code.put(&(callee as u64).to_le_bytes());
    Some(code.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arc_with_few_calls_leaves_the_seen_slot_of_one_with_many() {
        // A made-up thread (slot address) of this test's own, and arcs whose keys share a bucket of SEEN.
        let thread = 0x5eed_0000_0040;
        let bucket_of = |(frompc, selfpc): (usize, usize)| {
            seen_bucket(seen_key(thread, frompc, selfpc)).as_ptr()
        };
        let hot = (0x1000, 0x9000);
        let mut sharing = (0x1001..)
            .map(|frompc| (frompc, 0x9000))
            .filter(|&arc| bucket_of(arc) == bucket_of(hot));
        let others: Vec<(usize, usize)> = sharing.by_ref().take(SEEN_WAYS - 1).collect();
        let cold = sharing.next().expect("an arc sharing the bucket");
        let newer = sharing.next().expect("an arc sharing the bucket");
        let since = |(frompc, selfpc): (usize, usize), count| {
            calls_since_last_look(thread, frompc, selfpc, count)
        };
        // Arcs with many calls fill the bucket and each keeps its slot: none is new at the next look.
        assert_eq!(since(hot, MIN_CALLS), None);
        for (more, &arc) in others.iter().enumerate() {
            assert_eq!(since(arc, MIN_CALLS + 1 + more as u64), None);
        }
        for (more, &arc) in others.iter().enumerate() {
            assert_eq!(since(arc, MIN_CALLS + 11 + more as u64), Some(10));
        }
        // One with few calls takes none of their slots.
        assert_eq!(since(cold, 3), None);
        assert_eq!(since(cold, 5), None);
        assert_eq!(since(hot, MIN_CALLS + 700), Some(700));
        // One with many takes the slot of the arc with the fewest calls.
        assert_eq!(since(newer, MIN_CALLS), None);
        assert_eq!(since(newer, MIN_CALLS + 1), Some(1));
        assert_eq!(since(others[0], MIN_CALLS + 20), None);
        assert_eq!(since(hot, MIN_CALLS + 701), Some(1));
    }

    #[test]
    fn the_stub_lays_out_as_documented() {
        let stub = 0x7000_0000_1080;
        let call = StubTarget {
            site: 0x7000_0010_0000,
            original: [0xe8, 0, 0, 0, 0, 0x90],
            plt: 0x7000_0010_2000,
            slot: 0x7000_0010_4000,
            bound: 0x7100_0000_0020,
        };
        let code = encode_stub(stub, &call, 0x7200_0000_0000, 4096, stub & !0xfff).expect("a stub");
        // The miss call's metadata is where `sites::stub_metadata` reads it.
        assert_eq!(
            &code[MISS_RETURN + 5..MISS_RETURN + 9],
            &4096u32.to_le_bytes()
        );
        assert_eq!(
            &code[MISS_RETURN + 9..MISS_RETURN + 17],
            &0x7200_0000_0000u64.to_le_bytes()
        );
        // jz/je land on the miss call; the jump after it goes back to the `jmp [rip + callee]`.
        assert_eq!(34 + code[33] as usize, 58);
        assert_eq!(44 + code[43] as usize, 58);
        assert_eq!(&code[52..54], &[0xff, 0x25]);
        assert_eq!(code[58], 0xe8);
        let back = i32::from_le_bytes(code[64..68].try_into().unwrap());
        assert_eq!(68 + back as isize, 52);
        // The PLT fallback and the slot load are rip-relative to their targets.
        let slot_disp = i32::from_le_bytes(code[3..7].try_into().unwrap());
        assert_eq!(
            (stub + 7).wrapping_add_signed(slot_disp as isize),
            call.slot
        );
        let plt_disp = i32::from_le_bytes(code[16..20].try_into().unwrap());
        assert_eq!((stub + 20).wrapping_add_signed(plt_disp as isize), call.plt);
    }

    #[test]
    fn the_redirected_audit_stub_lays_out_as_documented() {
        let stub = 0x7000_0000_2080;
        let audit_stub = 0x7000_1000_0040;
        let callee = 0x7200_0000_0000u64;
        let code = encode_binding_stub(stub, audit_stub, callee as usize, 8192, stub & !0xfff)
            .expect("a stub");
        assert_eq!(&code[..3], &BINDING_STUB_HEAD);
        // The miss call's metadata is where `sites::stub_metadata` reads it.
        let metadata = BINDING_MISS_RETURN + sites::METADATA_AFTER_MISS_CALL;
        assert_eq!(&code[metadata..metadata + 4], &8192u32.to_le_bytes());
        assert_eq!(&code[metadata + 4..metadata + 12], &callee.to_le_bytes());
        // Each branch lands where the layout says.
        let rel8 = |at: usize| at + 2 + code[at + 1] as usize;
        assert_eq!((code[13], rel8(13)), (0x74, 68));
        assert_eq!((code[46], rel8(46)), (0x75, 63));
        assert_eq!((code[66], rel8(66)), (0x75, 91));
        let rel32 = |at: usize| {
            let rel = i32::from_le_bytes(code[at + 1..at + 5].try_into().unwrap());
            (stub + at + 5).wrapping_add_signed(rel as isize)
        };
        assert_eq!((code[69], rel32(69)), (0xe8, stub & !0xfff));
        assert_eq!((code[74], rel32(74)), (0xe9, stub + 57));
        assert_eq!((code[98], rel32(98)), (0xe9, audit_stub + SITE_BYTES));
        // Both rip-relative reads of the callee read the literal.
        let literal = |at: usize, next: usize| {
            let disp = i32::from_le_bytes(code[at..at + 4].try_into().unwrap());
            (stub + next).wrapping_add_signed(disp as isize) - stub
        };
        assert_eq!(literal(59, 63), 104);
        assert_eq!(literal(94, 98), 104);
        assert_eq!(&code[104..112], &callee.to_le_bytes());
    }
}
