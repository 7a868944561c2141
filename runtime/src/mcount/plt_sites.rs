//! Rewritten PLT call sites: a hot `call foo@plt` whose PLT slot holds the audit module's counting stub for
//! `foo` becomes a `call` to a stub of its own, which counts the call in the thread's site region and jumps
//! straight to `foo`.
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
/// Most sites rewritten in one look.
const PICKS_PER_LOOK: usize = 64;
const _: () = assert!(PICKS_PER_LOOK <= sites::MOST_AT_ONCE);
/// Bytes of one stub: two cache lines; the hit path is the first.
const STUB_BYTES: usize = 128;
/// The return address of a stub's `call trampoline`; its metadata follows the `jmp` after it.
const MISS_RETURN: usize = 63;
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
/// Slots of [`SEEN`].
const SEEN_SLOTS: usize = 2048;
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
/// Entries handed out to stubs so far.
static ENTRIES_USED: AtomicUsize = AtomicUsize::new(0);
/// The count each arc had at the last look that read it (a slot per hash of its return address: arcs that
/// share one take turns), so that a look judges calls made since: the arcs of a past phase of the program
/// (Python's imports) are not rewritten in place of those of the current one.
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
    ENABLED.load(Ordering::Acquire) && ENTRIES_USED.load(Ordering::Relaxed) < MAX_SITES
}

/// Whether `pc` is in a PLT site's stub (profiling overhead). Async-signal-safe.
pub fn contains(pc: usize) -> bool {
    let regions = REGIONS.load(Ordering::Acquire).min(MAX_REGIONS);
    REGION_STARTS[..regions]
        .iter()
        .any(|start| pc.wrapping_sub(start.load(Ordering::Relaxed)) < REGION_BYTES)
}

/// One look's search (`hot.rs`, SIGPROF handler, signals blocked): rewrites the sites of the arcs of `slot`
/// (the running thread's cache) with the most calls that are PLT calls, while no `dlopen` or `dlclose` runs.
/// `alone`: no other thread exists. Async-signal-safe: no allocation, no lock but the loader lock taken
/// without waiting, system calls (`mmap`, `mprotect`, `membarrier`, a read of `/proc/self/maps`) with errno
/// kept.
pub fn look(slot: &CacheSlot, alone: bool) {
    let writing = if alone {
        Writing::Alone
    } else if LIVE.load(Ordering::Relaxed) {
        Writing::WhileOthersRun
    } else {
        return;
    };
    let Some(arena) = super::plt_arena() else {
        return;
    };
    let mut picks = [Pick::default(); PICKS_PER_LOOK];
    let room = MAX_SITES.saturating_sub(ENTRIES_USED.load(Ordering::Relaxed));
    let picks = hottest_arcs(slot, &mut picks[..room.min(PICKS_PER_LOOK)]);
    if picks.is_empty() {
        return;
    }
    mslprof_loader_hooks::while_loader_idle(|| rewrite(picks, arena, writing));
}

/// An arc of the thread's cache.
#[derive(Clone, Copy, Default)]
struct Pick {
    calls: u64,
    frompc: usize,
    selfpc: usize,
}

/// The arcs of `slot` with the most calls since the last look, at least [`MIN_CALLS`] and a [`SHARE`]th of
/// all, not refused before, most first; the part of `picks` filled.
fn hottest_arcs<'a>(slot: &CacheSlot, picks: &'a mut [Pick]) -> &'a mut [Pick] {
    let mut total = 0u64;
    let mut filled = 0;
    slot.for_each_sampled_entry_in_use(LOOK_ENTRIES, |entry| {
        let count = entry.count.load(Ordering::Relaxed);
        let frompc = entry.frompc.load(Ordering::Relaxed);
        let calls = calls_since_last_look(frompc, count);
        total = total.saturating_add(calls);
        if calls < MIN_CALLS || picks.is_empty() || refused(frompc) {
            return;
        }
        let pick = Pick {
            calls,
            frompc,
            selfpc: entry.selfpc.load(Ordering::Relaxed),
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
    let picks = &mut picks[..filled];
    picks.sort_unstable_by_key(|pick| core::cmp::Reverse(pick.calls));
    let kept = picks
        .iter()
        .take_while(|pick| pick.calls.saturating_mul(SHARE) >= total)
        .count();
    &mut picks[..kept]
}

/// The calls of the arc returning to `frompc` since the last look that read it, from its count now (0 the
/// first time).
fn calls_since_last_look(frompc: usize, count: u64) -> u64 {
    let hash = (frompc as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 53;
    let (seen_frompc, seen_count) = &SEEN[hash as usize % SEEN_SLOTS];
    let before = seen_count.swap(count, Ordering::Relaxed);
    if seen_frompc.swap(frompc, Ordering::Relaxed) == frompc {
        count.saturating_sub(before)
    } else {
        0
    }
}

/// The word and bit of [`REFUSED`] for the call site returning to `frompc`.
fn refused_bit(frompc: usize) -> (&'static AtomicU64, u64) {
    let hash = (frompc as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52;
    (&REFUSED[hash as usize / 64], 1 << (hash % 64))
}

/// Whether the call site returning to `frompc` was refused before.
fn refused(frompc: usize) -> bool {
    let (word, bit) = refused_bit(frompc);
    word.load(Ordering::Relaxed) & bit != 0
}

/// Remembers that the call site returning to `frompc` is not to be rewritten.
fn refuse(frompc: usize) {
    let (word, bit) = refused_bit(frompc);
    word.fetch_or(bit, Ordering::Relaxed);
}

/// A PLT call site found behind an arc, and its module.
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

/// The PLT call whose return address is `frompc`, if the arc `frompc` → `selfpc` is one: the five bytes
/// before `frompc` are a `call rel32` in the same executable segment, into a PLT entry of that module that
/// jumps through a slot of the module's file-backed data holding the audit module's stub for `selfpc`.
/// Reads only the module's mapped segments and the arena (the caller holds the loader lock).
fn plt_call(frompc: usize, selfpc: usize, arena: (usize, usize)) -> Option<PltCall> {
    let module = modules::find_address(RuntimeAddress::from_usize(frompc))?;
    let site = frompc.checked_sub(5)?;
    let in_segment = |start: usize, len: usize| {
        module.info.runtime_ranges().any(|(low, high)| {
            low.as_usize() <= start && start.saturating_add(len) <= high.as_usize()
        })
    };
    if !in_segment(site, SITE_BYTES) {
        return None;
    }
    // SAFETY: six bytes inside one executable segment of a loaded module, which stays mapped (loader lock).
    let original = unsafe { core::ptr::read(site as *const [u8; SITE_BYTES]) };
    if original[0] != 0xe8 {
        return None;
    }
    let rel = i32::from_le_bytes([original[1], original[2], original[3], original[4]]);
    let plt = frompc.wrapping_add_signed(rel as isize);
    const ENTRY_BYTES: usize = 11;
    if !in_segment(plt, ENTRY_BYTES) {
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
    let callee =
        unsafe { ((bound + super::PLT_STUB_CALLEE) as *const u64).read_unaligned() } as usize;
    (callee == selfpc).then_some(PltCall {
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

/// The page this look writes a module's stubs into, and how many it holds so far.
#[derive(Clone, Copy, Default)]
struct OpenPage {
    key: u32,
    page: usize,
    used: usize,
}

/// Makes the stubs of `picks` found to be PLT calls and rewrites their sites in one round. The loader lock
/// is held: no module is unloaded meanwhile.
fn rewrite(picks: &[Pick], arena: (usize, usize), writing: Writing) {
    let page_bytes = crate::sys::page_size();
    let mut pages = [OpenPage::default(); PICKS_PER_LOOK];
    let mut open = 0;
    let mut jumps: [Option<SiteJump>; PICKS_PER_LOOK] = [None; PICKS_PER_LOOK];
    let mut page_of_jump = [0usize; PICKS_PER_LOOK];
    for (index, pick) in picks.iter().enumerate() {
        let Some(call) = plt_call(pick.frompc, pick.selfpc, arena) else {
            refuse(pick.frompc);
            continue;
        };
        let with_room = pages[..open]
            .iter()
            .position(|p| p.key == call.module.key && p.used + STUB_BYTES <= page_bytes);
        let at = match with_room {
            Some(at) => at,
            None => {
                let Some(page) = fresh_page(call.module, page_bytes) else {
                    refuse(pick.frompc);
                    continue;
                };
                pages[open] = OpenPage {
                    key: call.module.key,
                    page,
                    used: STUB_BYTES,
                };
                open += 1;
                open - 1
            }
        };
        let stub = pages[at].page + pages[at].used;
        let entry = ENTRIES_USED.load(Ordering::Relaxed);
        let made = sites::plt_entry_table(entry, pick.frompc).and_then(|table| {
            let code = encode_stub(stub, &call.target, pick.selfpc, table, pages[at].page)?;
            let jump = SiteJump::call(call.target.site, call.target.original, stub)?;
            Some((code, jump))
        });
        let Some((code, jump)) = made else {
            refuse(pick.frompc);
            continue;
        };
        ENTRIES_USED.store(entry + 1, Ordering::Relaxed);
        // SAFETY: a stub's room in a fresh page of our own mapping, still read-write, that no code runs yet.
        unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), stub as *mut u8, STUB_BYTES) };
        pages[at].used += STUB_BYTES;
        jumps[index] = Some(jump);
        page_of_jump[index] = at;
    }
    for (at, page) in pages[..open].iter().enumerate() {
        // SAFETY: our own page, which no code runs in yet and nothing writes after this.
        if !unsafe { crate::sys::protect(page.page, page_bytes, false, true) } {
            for (jump, _) in jumps
                .iter_mut()
                .zip(page_of_jump)
                .filter(|(_, of)| *of == at)
            {
                *jump = None;
            }
        }
    }
    // SAFETY: the caller (hot.rs) blocked this thread's signals; `writing` says how others may run.
    unsafe { sites::rewrite_round(jumps.iter().flatten(), writing) };
    for (jump, pick) in jumps.iter().zip(picks) {
        // SAFETY: a site of a loaded module's code, readable (checked by `plt_call`).
        if jump.is_some_and(|jump| !unsafe { jump.written() }) {
            refuse(pick.frompc);
        }
    }
}

/// A fresh page of `module`'s stub mapping (mapped near its code on first use), read-write, starting with
/// the trampoline to the slow path: `jmp [rip]` and the slow path's address.
fn fresh_page(module: &LiveModule, page_bytes: usize) -> Option<usize> {
    let regions = REGIONS.load(Ordering::Relaxed);
    let found = (0..regions.min(MAX_REGIONS))
        .find(|&i| REGION_KEYS[i].load(Ordering::Relaxed) == module.key);
    let region = match found {
        Some(region) => region,
        None if regions < MAX_REGIONS => {
            let (low, high) = module
                .info
                .runtime_ranges()
                .fold((usize::MAX, 0), |(low, high), (start, end)| {
                    (low.min(start.as_usize()), high.max(end.as_usize()))
                });
            let base = super::near::map_near(low, high, REGION_BYTES)? as usize;
            REGION_KEYS[regions].store(module.key, Ordering::Relaxed);
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
    let mut trampoline = [0u8; 14];
    trampoline[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    trampoline[6..].copy_from_slice(&(MISS.load(Ordering::Relaxed) as u64).to_le_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
