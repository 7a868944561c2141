//! Rewritten `-pg` call sites: each `call *mcount@GOTPCREL(%rip)` of a module becomes a jump to a stub of
//! its own, which counts the call in a table that belongs to the function and to the thread, and jumps back.
//!
//! runtime/CALLCOUNTS.md ("Jumping to a per-function stub") measured the design: a jump to a stub and back
//! costs Lua's interpreter about 0.4 ns less per call than a call and its return, and a table per function
//! needs one compare (the caller's return address) where the thread cache needs two. This file finds the
//! sites in a module's code, encodes the stubs, rewrites the sites at start-up or keeps them for `hot.rs`
//! ([`install`]), rewrites kept sites while other threads may run them ([`rewrite_round`]) and lays
//! out the per-thread site regions; the slow path is `record_site_call` in `mod.rs`, and each thread's region belongs
//! to its slot in `cache_slots`. runtime/CALLCOUNTS.md, "Rewritten sites", explains why each part is safe.
//!
//! **A site** is `ff 15 disp32` (`call *[rip + disp32]`) whose operand is a GOT entry holding `mcount` or
//! `_mcount`, after the `-pg` prologue: `push rbp; mov rbp, rsp` (`55 48 89 e5`), then only pushes of
//! callee-saved registers and `sub rsp, imm` (gcc -O2 puts those before the call in 516 of the 680 functions
//! of the bench's `liblua.so`). The stub reads the caller's return address at `[rbp + 8]`, as `mcount` does.
//! A site becomes `jmp stub` (`e9 rel32`) and a `nop`; the stub jumps back to the instruction after the site.
//! At start-up ([`Rewrite::AtStartUp`]) only the sites of functions with at most [`MAX_CALL_SITES`] direct
//! call sites in their module are rewritten ([`with_few_call_sites`]); while the program runs, `hot.rs`
//! judges each function by the callers it sees.
//!
//! **A stub** ([`STUB_BYTES`] bytes, starting a cache line) looks the caller's return address up in the
//! function's table, a slice of [`TABLE_ENTRIES`] entries at a fixed offset in the thread's site region. The
//! region's address is a word of the thread's cache header in static TLS (`ThreadCache::site_region`), 0
//! until the thread's first miss installs it and whenever counting must leave the stubs (a pause, an unload,
//! the slow path itself):
//! ```text
//!  0  push rax
//!  1  mov rax, fs:[tls]             the thread's site region
//! 10  test rax, rax                 none: a miss
//! 13  jz 90
//! 15  mov r11, [rbp + 8]            the caller's return address
//! 19  shl r11d, 3                   ((frompc >> 2) mod TABLE_ENTRIES) * 32
//! 23  and r11d, INDEX_MASK
//! 30  add rax, r11
//! 33  mov r11, [rax + table]        the entry's frompc
//! 40  cmp r11, [rbp + 8]
//! 44  jne 60
//! 46  add qword [rax + table + 24], 1
//! 54  pop rax
//! 55  jmp back
//! 60  test r11, r11                 a free entry: the slow path fills it
//! 63  jz 90
//! 65  pop rax                       another caller holds it: the arc is the thread cache's, so call the
//! 66  lea r11, [rip + back]         module's copy of `mcount`'s hit path with the site's return address
//! 73  push r11                      (selfpc) pushed; it returns here (every `ret` matches its `call`)
//! 75  call elsewhere
//! 80  lea rsp, [rsp + 8]
//! 85  jmp back
//! 90  pop rax                       no region, or a free entry: as if `mcount` were called from the site
//! 91  call miss                     (the module's trampoline to the slow path)
//! 96  jmp back
//! 101 table (u32), selfpc (u64)     read by the slow path through its return address
//! ```
//! Each module's stub mapping starts with the trampoline to the slow path and the copy of the hit path
//! (`x86_64::near_site_mcount_template`), both within a `rel32` of every stub.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use mslprof_format::RuntimeAddress;

/// Entries of one function's table: callers whose return addresses differ in bits 2–9 never collide.
pub const TABLE_ENTRIES: usize = 256;
/// Bytes of one function's table (entries are 32 bytes, as the thread cache's).
pub const TABLE_BYTES: usize = TABLE_ENTRIES * 32;
/// Bytes of one stub: two cache lines, so that each stub starts one and its hit path (60 bytes) is one line.
pub const STUB_BYTES: usize = 128;
/// Where the slow path finds a stub's table offset and selfpc: this far after the return address of its
/// `call miss`.
pub const METADATA_AFTER_MISS_CALL: usize = 5;
/// Offset of the return address of a stub's `call miss` in the stub.
pub const MISS_RETURN: usize = 96;
/// Most direct call sites of a function whose site is rewritten (see [`with_few_call_sites`]).
pub const MAX_CALL_SITES: usize = 8;
/// `endbr64`, which may come before a function's prologue (the entry of an indirect-branch-tracking build).
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// The start of the `-pg` prologue before a site.
const PROLOGUE: [u8; 4] = [0x55, 0x48, 0x89, 0xe5];
/// Most bytes between the prologue's start and the site: `mov rbp, rsp`, six pushes, a `sub rsp, imm32`.
const PROLOGUE_REACH: usize = PROLOGUE.len() + 6 * 2 + 7;
/// Bytes of a site (`call *[rip + disp32]`).
pub const SITE_BYTES: usize = 6;
/// Mask of the table index, already multiplied by the entry size.
pub const INDEX_MASK: u32 = ((TABLE_ENTRIES - 1) * 32) as u32;

/// A site found in a module's code: its address, and its function's entry (where direct calls to the
/// function go: the prologue's start, or the `endbr64` before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    pub at: usize,
    pub entry: usize,
}

/// The sites in `text` (mapped at `text_start`) whose operand is one of `got_entries` (runtime addresses of
/// GOT entries holding `mcount`), in order. The scan looks for the prologue's four bytes (`memmem`), rarer
/// than the call's two, and decodes forward from each.
pub fn find_sites(text: &[u8], text_start: usize, got_entries: &[usize]) -> Vec<Site> {
    let mut sites = Vec::new();
    if got_entries.is_empty() {
        return sites;
    }
    let mut free_from = 0;
    for start in memchr::memmem::find_iter(text, &PROLOGUE) {
        if start < free_from {
            continue;
        }
        let Some(at) = site_after_prologue(text, start) else {
            continue;
        };
        let operand = rel32_target(text_start + at + SITE_BYTES, &text[at + 2..at + SITE_BYTES]);
        if !got_entries.contains(&operand) {
            continue;
        }
        let entry = match start.checked_sub(ENDBR64.len()) {
            Some(before) if text[before..start] == ENDBR64 => before,
            _ => start,
        };
        sites.push(Site {
            at: text_start + at,
            entry: text_start + entry,
        });
        free_from = at + SITE_BYTES;
    }
    sites
}

/// Where the `-pg` prologue at `start` (`push rbp; mov rbp, rsp`) ends in a `call *[rip + disp32]`: after
/// pushes of registers and at most one `sub rsp, imm8/imm32`, the last of the frame setup, within
/// [`PROLOGUE_REACH`] bytes.
fn site_after_prologue(text: &[u8], start: usize) -> Option<usize> {
    let mut at = start + PROLOGUE.len();
    loop {
        at += match text.get(at..)? {
            [0xff, 0x15, _, _, _, _, ..] => break,
            [0x50..=0x57, ..] => 1,
            [0x41, 0x50..=0x57, ..] => 2,
            [0x48, 0x83, 0xec, _, 0xff, 0x15, _, _, _, _, ..] => {
                at += 4;
                break;
            }
            [0x48, 0x81, 0xec, _, _, _, _, 0xff, 0x15, _, _, _, _, ..] => {
                at += 7;
                break;
            }
            _ => return None,
        };
        if at - start > PROLOGUE_REACH {
            return None;
        }
    }
    (at - start <= PROLOGUE_REACH).then_some(at)
}

/// The sites of `sites` whose function is the target of at most [`MAX_CALL_SITES`] direct calls (`call
/// rel32`) in `code` (a module's executable ranges, each with its runtime start). A function called from
/// many places spreads its callers over its table, where they collide and go to the thread cache through
/// the stub, and its table is read at scattered entries: such a function costs less through `mcount`
/// (runtime/CALLCOUNTS.md, "Which sites are rewritten").
pub fn with_few_call_sites(sites: &[Site], code: &[(usize, &[u8])]) -> Vec<usize> {
    let mut entries: Vec<(usize, usize)> = sites.iter().map(|site| (site.entry, 0)).collect();
    entries.sort_unstable();
    entries.dedup();
    for &(start, text) in code {
        for (i, window) in text.windows(5).enumerate() {
            if window[0] != 0xe8 {
                continue;
            }
            let target = rel32_target(start + i + 5, &window[1..]);
            if let Ok(found) = entries.binary_search_by_key(&target, |&(entry, _)| entry) {
                entries[found].1 += 1;
            }
        }
    }
    sites
        .iter()
        .filter(|site| {
            entries
                .binary_search_by_key(&site.entry, |&(entry, _)| entry)
                .is_ok_and(|found| entries[found].1 <= MAX_CALL_SITES)
        })
        .map(|site| site.at)
        .collect()
}

/// Where a `rel32` (or rip-relative `disp32`) operand whose 4 bytes are `rel` points, from `next`, the address
/// of the byte after its instruction.
fn rel32_target(next: usize, rel: &[u8]) -> usize {
    let rel = i32::from_le_bytes([rel[0], rel[1], rel[2], rel[3]]);
    next.wrapping_add_signed(rel as isize)
}

/// The `rel32` of a branch at `from` (address of the byte after it) to `to`, when it reaches.
fn rel32(from: usize, to: usize) -> Option<i32> {
    i32::try_from(to as isize - from as isize).ok()
}

/// The bytes that replace a site at `site`: `jmp stub; nop`. `None` when the stub is out of reach.
pub fn site_jump(site: usize, stub: usize) -> Option<[u8; SITE_BYTES]> {
    let rel = rel32(site + 5, stub)?.to_le_bytes();
    Some([0xe9, rel[0], rel[1], rel[2], rel[3], 0x90])
}

/// The stub at `stub` for the site at `site`: its function's table at `table` bytes into the thread's site
/// region, whose address is at `fs:[tls]`; a call whose entry is free (or with no region) calls `miss`, one
/// whose entry holds another caller calls `elsewhere` (the mapping's copy of the hit path) with selfpc
/// pushed. `None` when a branch does not reach or the table is beyond a 32-bit displacement.
pub fn encode_stub(
    stub: usize,
    site: usize,
    tls: i32,
    table: u32,
    miss: usize,
    elsewhere: usize,
) -> Option<[u8; STUB_BYTES]> {
    let back = site + SITE_BYTES;
    let table_disp = i32::try_from(table).ok()?;
    let count_disp = table_disp.checked_add(24)?;
    let mut code = Vec::with_capacity(STUB_BYTES);
    // A branch's rel32, from the end of the instruction being written (opcode and rel32 still to come).
    let branch = |code: &Vec<u8>, to: usize| rel32(stub + code.len() + 5, to);
    // A rip-relative displacement to `to`, written next with `rest` bytes of the instruction still to come.
    let branch_disp = |code: &Vec<u8>, rest: usize, to: usize| rel32(stub + code.len() + rest, to);
    // Where each rel8 branch's byte is, filled in once its target's position is known.
    let mut to_miss = Vec::new();
    code.push(0x50);
    code.extend([0x64, 0x48, 0x8b, 0x04, 0x25]);
    code.extend(tls.to_le_bytes());
    code.extend([0x48, 0x85, 0xc0]);
    code.extend([0x74, 0x00]);
    to_miss.push(code.len() - 1);
    code.extend([0x4c, 0x8b, 0x5d, 0x08]);
    code.extend([0x41, 0xc1, 0xe3, 0x03]);
    code.extend([0x41, 0x81, 0xe3]);
    code.extend(INDEX_MASK.to_le_bytes());
    code.extend([0x4c, 0x01, 0xd8]);
    code.extend([0x4c, 0x8b, 0x98]);
    code.extend(table_disp.to_le_bytes());
    code.extend([0x4c, 0x3b, 0x5d, 0x08]);
    code.extend([0x75, 0x00]);
    let not_this_caller = code.len() - 1;
    code.extend([0x48, 0x83, 0x80]);
    code.extend(count_disp.to_le_bytes());
    code.push(0x01);
    code.push(0x58);
    let hit_back = branch(&code, back)?;
    code.push(0xe9);
    code.extend(hit_back.to_le_bytes());
    code[not_this_caller] = u8::try_from(code.len() - not_this_caller - 1).ok()?;
    code.extend([0x4d, 0x85, 0xdb]);
    code.extend([0x74, 0x00]);
    to_miss.push(code.len() - 1);
    code.push(0x58);
    // lea r11, [rip + back]; push r11: selfpc, with no load (the stub's bytes are code, not data).
    code.extend([0x4c, 0x8d, 0x1d]);
    code.extend(branch_disp(&code, 4, back)?.to_le_bytes());
    code.extend([0x41, 0x53]);
    let call_elsewhere = branch(&code, elsewhere)?;
    code.push(0xe8);
    code.extend(call_elsewhere.to_le_bytes());
    code.extend([0x48, 0x8d, 0x64, 0x24, 0x08]);
    let elsewhere_back = branch(&code, back)?;
    code.push(0xe9);
    code.extend(elsewhere_back.to_le_bytes());
    let miss_at = code.len();
    for rel8_at in to_miss {
        code[rel8_at] = u8::try_from(miss_at - rel8_at - 1).ok()?;
    }
    code.push(0x58);
    let call_miss = branch(&code, miss)?;
    code.push(0xe8);
    code.extend(call_miss.to_le_bytes());
    if code.len() != MISS_RETURN {
        return None;
    }
    let miss_back = branch(&code, back)?;
    code.push(0xe9);
    code.extend(miss_back.to_le_bytes());
    code.extend(table.to_le_bytes());
    let selfpc_at = code.len();
    code.extend((back as u64).to_le_bytes());
    if selfpc_at != MISS_RETURN + METADATA_AFTER_MISS_CALL + 4 || code.len() > STUB_BYTES {
        return None;
    }
    code.resize(STUB_BYTES, 0xcc);
    code.try_into().ok()
}

/// What the slow path needs from the stub whose `call miss` returned to `miss_return`: the function's table
/// offset in the site region and its selfpc.
///
/// # Safety
/// `miss_return` must be the return address of a stub's `call miss`.
pub unsafe fn stub_metadata(miss_return: usize) -> (u32, usize) {
    let at = miss_return + METADATA_AFTER_MISS_CALL;
    // SAFETY: the caller guarantees a stub, whose metadata follows its last jump; stubs are never unmapped.
    unsafe {
        (
            (at as *const u32).read_unaligned(),
            ((at + 4) as *const u64).read_unaligned() as usize,
        )
    }
}

/// The entry a call from `frompc` uses in its callee's table: bits 2–9 of the return address, as the stub
/// computes it.
pub fn entry_index(frompc: usize) -> usize {
    ((frompc << 3) as u32 & INDEX_MASK) as usize / 32
}

/// The offset of the entry a call from `frompc` uses in the table at `table`.
pub fn entry_offset(table: u32, frompc: usize) -> usize {
    table as usize + entry_index(frompc) * 32
}

// ---- In this process: the rewrite at start-up, the site regions' layout, and the stubs' addresses. ----

/// Most tables (rewritten functions) in all: a thread's region is then at most 512 MiB of address space
/// (mapped without reserve; only the pages of tables used become resident). Further modules keep `mcount`.
pub const MAX_TABLES: usize = 1 << 16;
/// Most modules whose stubs are mapped (each gets one mapping).
const MAX_STUB_MAPPINGS: usize = 64;
/// Where the copy of the hit path for calls held by another caller starts in each stub mapping, after the
/// trampoline to the slow path (`jmp [rip]`, then the slow path's address).
const ELSEWHERE_AT: usize = 64;

/// Bytes of a site region's header (the bitmap of the tables used, one bit per table, rounded up to a
/// page); the tables follow it. 0 while no site is rewritten.
static HEADER_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Bytes of a site region (0: no site is rewritten, no thread needs one).
static REGION_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Where the entries of rewritten PLT call sites (`plt_sites.rs`) start in a region, one table after those of
/// the `-pg` functions, and how many there are room for (0: none).
static PLT_ENTRIES_AT: AtomicUsize = AtomicUsize::new(0);
static PLT_ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// The first table of the audit stubs redirected to stubs of their own (`plt_sites.rs`), after those of
/// the `-pg` functions, and how many there are (0: none).
static BINDING_FIRST_TABLE: AtomicUsize = AtomicUsize::new(0);
static BINDING_TABLES: AtomicUsize = AtomicUsize::new(0);
/// Unloads seen: a region whose entries were checked under an older count may hold callers that are gone.
static UNLOADS: AtomicUsize = AtomicUsize::new(0);
/// The stub mappings, `[start, end)`, for the sampler (`library_address`); `STUB_MAPPINGS` of them valid.
static STUB_STARTS: [AtomicUsize; MAX_STUB_MAPPINGS] =
    [const { AtomicUsize::new(0) }; MAX_STUB_MAPPINGS];
static STUB_ENDS: [AtomicUsize; MAX_STUB_MAPPINGS] =
    [const { AtomicUsize::new(0) }; MAX_STUB_MAPPINGS];
static STUB_MAPPINGS: AtomicUsize = AtomicUsize::new(0);

/// Bytes of one thread's site region; 0 when no site was rewritten.
pub fn region_bytes() -> usize {
    REGION_BYTES.load(Ordering::Relaxed)
}

/// Unloads so far (see [`note_unload`]).
pub fn unloads() -> usize {
    UNLOADS.load(Ordering::SeqCst)
}

/// Notes that a module was unloaded: each region drops its entries whose caller was in it before it is
/// used again (the caller must then take every thread off its region).
pub fn note_unload() {
    UNLOADS.fetch_add(1, Ordering::SeqCst);
}

/// `pc` as an address in this library: a PC in a stub counts as `count_in` (the library's `mcount`: the
/// stubs are its hit path, moved next to the modules). Async-signal-safe.
pub fn library_address(pc: usize, count_in: usize) -> usize {
    let mappings = STUB_MAPPINGS.load(Ordering::Acquire).min(MAX_STUB_MAPPINGS);
    let inside = (0..mappings).any(|i| {
        (STUB_STARTS[i].load(Ordering::Relaxed)..STUB_ENDS[i].load(Ordering::Relaxed)).contains(&pc)
    });
    if inside { count_in } else { pc }
}

/// The table bytes of the `table`th rewritten function, from the start of a region.
fn table_offset(table: usize) -> Option<u32> {
    u32::try_from(HEADER_BYTES.load(Ordering::Relaxed) + table * TABLE_BYTES).ok()
}

/// The table offset that puts the entry of a call from `frompc` ([`entry_offset`]) at the `index`th entry
/// reserved for PLT call sites: they are packed, one entry each (a site has one caller and one callee), so
/// a table offset here may start in the table before theirs, which no function owns. `None` beyond those
/// reserved.
pub fn plt_entry_table(index: usize, frompc: usize) -> Option<u32> {
    (index < PLT_ENTRIES.load(Ordering::Relaxed))
        .then(|| {
            let entry = PLT_ENTRIES_AT.load(Ordering::Relaxed) + index * 32;
            u32::try_from(entry - entry_index(frompc) * 32).ok()
        })
        .flatten()
}

/// Tables that `entries` packed PLT site entries take, with the one before them.
fn plt_tables_for(entries: usize) -> usize {
    if entries == 0 {
        0
    } else {
        1 + (entries * 32).div_ceil(TABLE_BYTES)
    }
}

/// The offset of the `index`th table reserved for redirected audit stubs (one table each, a caller an
/// entry, as a `-pg` function's); `None` beyond those reserved.
pub fn binding_table(index: usize) -> Option<u32> {
    (index < BINDING_TABLES.load(Ordering::Relaxed))
        .then(|| table_offset(BINDING_FIRST_TABLE.load(Ordering::Relaxed) + index))
        .flatten()
}

/// The entry at `offset` (from [`entry_offset`]) of the region at `base`.
///
/// # Safety
/// `base` must be a site region ([`region_bytes`] bytes, zero-initialised, never unmapped) and `offset` an
/// entry's offset from [`entry_offset`] for a table of it.
pub unsafe fn region_entry(base: *mut u8, offset: usize) -> &'static super::CacheEntry {
    // SAFETY: as the caller guarantees; an all-zero entry is valid (atomics).
    unsafe { &*base.add(offset).cast::<super::CacheEntry>() }
}

/// Marks the table of the entry at `offset` used in the region at `base` (owner only).
///
/// # Safety
/// As [`region_entry`].
pub unsafe fn touch(base: *mut u8, offset: usize) {
    let table = (offset - HEADER_BYTES.load(Ordering::Relaxed)) / TABLE_BYTES;
    // SAFETY: the header holds one bit per table; `base` is a region.
    let word = unsafe { &*base.add(table / 64 * 8).cast::<AtomicU64>() };
    let bit = 1u64 << (table % 64);
    let bits = word.load(Ordering::Relaxed);
    if bits & bit == 0 {
        word.store(bits | bit, Ordering::Relaxed);
    }
}

/// Visits every entry of the used tables of the region at `base` that holds a caller.
///
/// # Safety
/// `base` must be a site region.
pub unsafe fn for_each_used_entry(
    base: *mut u8,
    mut visit: impl FnMut(&'static super::CacheEntry),
) {
    let header = HEADER_BYTES.load(Ordering::Relaxed);
    let region = REGION_BYTES.load(Ordering::Relaxed);
    for word_index in 0..header / 8 {
        // SAFETY: the header's words are in the region.
        let word = unsafe { &*base.add(word_index * 8).cast::<AtomicU64>() };
        let mut bits = word.load(Ordering::Relaxed);
        while bits != 0 {
            let table = word_index * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let start = header + table * TABLE_BYTES;
            if start + TABLE_BYTES > region {
                continue;
            }
            for entry in 0..TABLE_ENTRIES {
                // SAFETY: an entry of a table inside the region.
                let entry = unsafe { region_entry(base, start + entry * 32) };
                if entry.frompc.load(Ordering::Acquire) != 0 {
                    visit(entry);
                }
            }
        }
    }
}

/// One module's sites, found before any is rewritten.
struct ModuleSites {
    /// Lowest and highest address of its code.
    text: (usize, usize),
    sites: Vec<usize>,
}

/// The room every thread's site region keeps for `plt_sites.rs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PltRoom {
    /// Entries for rewritten PLT call sites, one each.
    pub site_entries: usize,
    /// Tables for redirected audit stubs, one each.
    pub stub_tables: usize,
}

/// When [`install`] rewrites the sites it finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rewrite {
    /// All of them, at once (start-up only, with one thread).
    AtStartUp,
    /// None yet: the stubs are made and the sites kept ([`kept`]); `hot.rs` rewrites those of the
    /// functions it finds hot while the program runs.
    WhenHot,
}

/// Finds the `-pg` sites of `modules` (profiled, with `mcount` or `_mcount` in their GOT, other than this
/// library) and maps a stub of their own for each, whose thread's region address is at `fs:[tls]` and whose
/// misses go to `miss`; `targets` are the addresses of `mcount` and `_mcount`. With [`Rewrite::AtStartUp`]
/// the sites are rewritten to jump to their stubs (only at start-up, with one thread: the rewrite is not
/// atomic for a thread running the code); with [`Rewrite::WhenHot`] they are kept for later. Every thread's
/// region also gets room for the PLT call sites and audit stubs that `plt_sites.rs` redirects while the
/// program runs (`plt`). Returns the sites rewritten or kept.
pub fn install(
    modules: &[&crate::modules::LiveModule],
    own_code: usize,
    targets: &[usize],
    tls: i32,
    miss: usize,
    rewrite: Rewrite,
    plt: PltRoom,
) -> usize {
    let PltRoom {
        site_entries: plt_entries,
        stub_tables: binding_tables,
    } = plt;
    let plt_tables = binding_tables + plt_tables_for(plt_entries);
    #[cfg(feature = "test-hooks")]
    read_test_settings();
    let page = crate::sys::page_size();
    let mut found = Vec::new();
    let mut tables = 0;
    for module in modules {
        let info = &module.info;
        if !module.profiled || info.is_vdso || info.is_dynamic_linker || module.is_unloaded() {
            continue;
        }
        let ranges: Vec<(usize, usize)> = info
            .runtime_ranges()
            .map(|(start, end)| (start.as_usize(), end.as_usize()))
            .filter(|&(start, end)| start < end)
            .collect();
        if ranges.is_empty() || module.contains_address(RuntimeAddress::from_usize(own_code)) {
            continue;
        }
        let got: Vec<usize> = super::near::relro_words_holding(info, targets)
            .into_iter()
            .map(|(word, _)| word as *const AtomicUsize as usize)
            .collect();
        if got.is_empty() {
            continue;
        }
        let code: Vec<(usize, &[u8])> = ranges
            .iter()
            .map(|&(start, end)| {
                // SAFETY: a loaded module's executable segment is mapped readable, and stays so (modules
                // present at start-up are never unloaded).
                (start, unsafe {
                    core::slice::from_raw_parts(start as *const u8, end - start)
                })
            })
            .collect();
        let found_sites: Vec<Site> = code
            .iter()
            .flat_map(|&(start, text)| find_sites(text, start, &got))
            .collect();
        // At start-up nothing is known of how the functions are called but their static call sites; while
        // the program runs, `hot.rs` sees each function's callers, and refuses those that collide.
        let sites = match rewrite {
            Rewrite::AtStartUp => with_few_call_sites(&found_sites, &code),
            Rewrite::WhenHot => found_sites.iter().map(|site| site.at).collect(),
        };
        if sites.is_empty()
            || tables + sites.len() + plt_tables > MAX_TABLES
            || found.len() == MAX_STUB_MAPPINGS
        {
            continue;
        }
        tables += sites.len();
        found.push(ModuleSites {
            text: module.code_span(),
            sites,
        });
    }
    let all_tables = tables + plt_tables;
    if all_tables == 0 {
        return 0;
    }
    let header = all_tables
        .div_ceil(64)
        .saturating_mul(8)
        .next_multiple_of(page);
    // The stubs may run as soon as a site is rewritten: the regions' layout is set first.
    HEADER_BYTES.store(header, Ordering::Relaxed);
    REGION_BYTES.store(header + all_tables * TABLE_BYTES, Ordering::Relaxed);
    BINDING_FIRST_TABLE.store(tables, Ordering::Relaxed);
    BINDING_TABLES.store(binding_tables, Ordering::Relaxed);
    PLT_ENTRIES_AT.store(
        header + (tables + binding_tables + 1) * TABLE_BYTES,
        Ordering::Relaxed,
    );
    PLT_ENTRIES.store(plt_entries, Ordering::Relaxed);
    let mut table = 0;
    let mut rewritten = 0;
    let mut kept = Vec::new();
    for module in &found {
        if let Some(jumps) = map_stubs(module, table, tls, miss, page) {
            match rewrite {
                Rewrite::AtStartUp => {
                    for round in jumps.chunks(MOST_AT_ONCE) {
                        // SAFETY: start-up, one thread, signals that could run a site not yet handled.
                        rewritten += unsafe { rewrite_round(round.iter(), Writing::Alone) };
                    }
                }
                Rewrite::WhenHot => kept.extend(jumps),
            }
        }
        table += module.sites.len();
    }
    if rewrite == Rewrite::WhenHot && !kept.is_empty() {
        rewritten = kept.len();
        keep(kept);
    }
    rewritten
}

/// Where the first stub starts in a stub mapping: after the trampoline and the copy of the hit path, at a
/// multiple of [`STUB_BYTES`].
fn first_stub_offset() -> usize {
    (ELSEWHERE_AT + super::x86_64::near_site_mcount_code().0.len()).next_multiple_of(STUB_BYTES)
}

/// Each piece of code in the stub mappings: `(start, length, None)` for a mapping's trampoline and copy of
/// the hit path, `(start, STUB_BYTES, Some(site))` for each stub, with the site it serves.
pub fn for_each_generated_code(visit: &mut dyn FnMut(usize, usize, Option<usize>)) {
    let first_stub = first_stub_offset();
    let mappings = STUB_MAPPINGS.load(Ordering::Acquire).min(MAX_STUB_MAPPINGS);
    for i in 0..mappings {
        let (start, end) = (
            STUB_STARTS[i].load(Ordering::Relaxed),
            STUB_ENDS[i].load(Ordering::Relaxed),
        );
        visit(start, first_stub, None);
        let mut stub = start + first_stub;
        // A stub starts with `push rax`; the mapping's rest, up to its last page, is zero.
        // SAFETY: stub mappings are readable and never unmapped; each read is inside one.
        while stub + STUB_BYTES <= end && unsafe { *(stub as *const u8) } == 0x50 {
            // SAFETY: a stub, whose metadata follows its miss call.
            let (_, selfpc) = unsafe { stub_metadata(stub + MISS_RETURN) };
            visit(stub, STUB_BYTES, Some(selfpc - SITE_BYTES));
            stub += STUB_BYTES;
        }
    }
}

/// Bytes of [`trampoline`].
pub const TRAMPOLINE_BYTES: usize = 14;

/// A jump to `to` from anywhere: `jmp [rip]` and the address. Stubs reach the slow path through one near
/// them with a `rel32` call.
pub fn trampoline(to: usize) -> [u8; TRAMPOLINE_BYTES] {
    let mut code = [0u8; TRAMPOLINE_BYTES];
    code[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    code[6..].copy_from_slice(&(to as u64).to_le_bytes());
    code
}

/// Maps `module`'s stubs (its tables numbered from `first_table`); the jump that rewrites each of its sites,
/// `None` when the stubs could not be placed within reach. The mapping holds the trampoline to `miss`, then
/// the copy of the hit path for calls held by another caller (`x86_64::near_site_mcount_template`), then the
/// stubs, each starting a cache line: its hit path is one line.
fn map_stubs(
    module: &ModuleSites,
    first_table: usize,
    tls: i32,
    miss: usize,
    page: usize,
) -> Option<Vec<SiteJump>> {
    let (elsewhere_code, elsewhere_values) = super::x86_64::near_site_mcount_code();
    let first_stub = first_stub_offset();
    let bytes = (first_stub + module.sites.len() * STUB_BYTES).next_multiple_of(page);
    let base = super::near::map_near(module.text.0, module.text.1, bytes)? as usize;
    let give_back = || {
        // SAFETY: our own fresh mapping, which no code runs in yet.
        unsafe { crate::sys::unmap(base as *mut u8, bytes) }
    };
    // SAFETY: `base` is our own fresh read-write mapping of `bytes` bytes.
    let code = unsafe { core::slice::from_raw_parts_mut(base as *mut u8, bytes) };
    code[..TRAMPOLINE_BYTES].copy_from_slice(&trampoline(miss));
    if !super::near::fill_copy(&mut code[ELSEWHERE_AT..], elsewhere_code, elsewhere_values) {
        give_back();
        return None;
    }
    let elsewhere = base + ELSEWHERE_AT;
    let mut jumps = Vec::with_capacity(module.sites.len());
    for (i, &site) in module.sites.iter().enumerate() {
        let at = first_stub + i * STUB_BYTES;
        let stub = base + at;
        let table = table_offset(first_table + i);
        let encoded = table.and_then(|table| encode_stub(stub, site, tls, table, base, elsewhere));
        let (Some(encoded), Some(jump)) = (encoded, site_jump(site, stub)) else {
            give_back();
            return None;
        };
        code[at..at + STUB_BYTES].copy_from_slice(&encoded);
        // SAFETY: the site's bytes are in the module's code, mapped readable (`find_sites` read them).
        let original = unsafe { core::ptr::read(site as *const [u8; SITE_BYTES]) };
        jumps.push(SiteJump {
            selfpc: site + SITE_BYTES,
            site,
            original,
            jump,
            len: SITE_BYTES,
        });
    }
    // SAFETY: no code runs in the stubs yet, and nothing writes them after this.
    if !unsafe { crate::sys::protect(base, bytes, false, true) } {
        give_back();
        return None;
    }
    let slot = STUB_MAPPINGS.load(Ordering::Relaxed);
    STUB_STARTS[slot].store(base, Ordering::Relaxed);
    STUB_ENDS[slot].store(base + bytes, Ordering::Relaxed);
    STUB_MAPPINGS.store(slot + 1, Ordering::Release);
    Some(jumps)
}

/// A site and the jump to its stub that replaces it.
#[derive(Clone, Copy, Debug)]
pub struct SiteJump {
    /// The return address of the site's call of `mcount`: the selfpc its calls are counted under.
    pub selfpc: usize,
    site: usize,
    /// The site's bytes when its module was read at start-up: a site that no longer holds them (a
    /// breakpoint, another patcher) is left alone.
    original: [u8; SITE_BYTES],
    jump: [u8; SITE_BYTES],
    /// How many of the bytes the rewrite changes: [`SITE_BYTES`], or 5 for a `call rel32` (`plt_sites.rs`),
    /// whose sixth byte is the next instruction's, left as it is.
    len: usize,
}

impl SiteJump {
    /// The rewrite of the `call rel32` at `site` (`e8` and four bytes: `original`) into a call of `target`;
    /// `None` when `target` is out of its reach. The sixth byte of `original` is the next
    /// instruction's first, compared before the write but never written.
    pub fn call(site: usize, original: [u8; SITE_BYTES], target: usize) -> Option<SiteJump> {
        let rel = rel32(site + 5, target)?.to_le_bytes();
        Some(SiteJump {
            selfpc: site + 5,
            site,
            original,
            jump: [0xe8, rel[0], rel[1], rel[2], rel[3], original[5]],
            len: 5,
        })
    }

    /// The rewrite of the six bytes at `site`, which hold `original`, into `jmp stub; nop`; `None` when `stub`
    /// is out of reach.
    pub fn to_stub(site: usize, original: [u8; SITE_BYTES], stub: usize) -> Option<SiteJump> {
        Some(SiteJump {
            selfpc: site + SITE_BYTES,
            site,
            original,
            jump: site_jump(site, stub)?,
            len: SITE_BYTES,
        })
    }

    /// The page(s) the site's bytes are on ([`site_pages`]).
    fn pages(&self, page: usize) -> [usize; 2] {
        site_pages(self.site, self.len, page)
    }

    /// Whether the site still holds the bytes start-up found.
    ///
    /// # Safety
    /// The site's page(s) must be readable.
    unsafe fn unchanged(&self) -> bool {
        // SAFETY: as the caller guarantees.
        unsafe { core::ptr::read_volatile(self.site as *const [u8; SITE_BYTES]) == self.original }
    }

    /// The jump's bytes and, in the last byte, how many of them it writes: one word of [`ROUND`].
    fn packed(&self) -> u64 {
        let mut packed = [0u8; 8];
        packed[..SITE_BYTES].copy_from_slice(&self.jump);
        packed[7] = self.len as u8;
        u64::from_le_bytes(packed)
    }

    /// Whether the site holds the jump now (a round may have left it out).
    ///
    /// # Safety
    /// The site's page(s) must be readable.
    pub unsafe fn written(&self) -> bool {
        // SAFETY: as the caller guarantees.
        let now = unsafe { core::ptr::read_volatile(self.site as *const [u8; SITE_BYTES]) };
        now[..self.len] == self.jump[..self.len]
    }

    /// Writes the whole jump over the site.
    ///
    /// # Safety
    /// The site's page(s) must be writable, and no other thread may be running the site's bytes (a thread
    /// returning past it is fine: the site's end stays an instruction boundary).
    unsafe fn write(&self) {
        // SAFETY: as the caller guarantees.
        unsafe {
            core::ptr::copy_nonoverlapping(self.jump.as_ptr(), self.site as *mut u8, self.len)
        };
    }
}

/// The page(s) the `len` bytes of a site at `site` are on: one, or two when they cross a page boundary.
fn site_pages(site: usize, len: usize, page: usize) -> [usize; 2] {
    [site & !(page - 1), (site + len - 1) & !(page - 1)]
}

/// Most sites one round ([`rewrite_round`]) rewrites.
pub const MOST_AT_ONCE: usize = 64;
/// Most pages one round's sites are on (two a site when each crosses a page boundary).
const MOST_PAGES: usize = 2 * MOST_AT_ONCE;

/// How a round writes its sites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writing {
    /// Six bytes at a time: no other thread runs (start-up, or a process of one thread).
    Alone,
    /// By the cross-modifying-code protocol: other threads may be running the sites.
    WhileOthersRun,
}

/// The round of rewrites under way, where a child forked meanwhile finds it ([`finish_round_after_fork`]).
/// One round at a time: `hot.rs`'s looks exclude each other, and the start-up rewrite runs alone.
///
/// The parent writes it in this order: the pages and their protections, `open`, then the sites, before
/// any byte of code or any protection changes; `open` is cleared after the last protection is given back.
/// fork() copies the parent's memory under the parent's mmap lock, and a store after the copy of its page
/// waits for the lock, so a child that sees any change of the round's code sees the record and `open`.
struct Round {
    open: AtomicBool,
    pages: [AtomicUsize; MOST_PAGES],
    protections: [AtomicI32; MOST_PAGES],
    page_count: AtomicUsize,
    sites: [AtomicUsize; MOST_AT_ONCE],
    jumps: [AtomicU64; MOST_AT_ONCE],
    site_count: AtomicUsize,
}

static ROUND: Round = Round {
    open: AtomicBool::new(false),
    pages: [const { AtomicUsize::new(0) }; MOST_PAGES],
    protections: [const { AtomicI32::new(0) }; MOST_PAGES],
    page_count: AtomicUsize::new(0),
    sites: [const { AtomicUsize::new(0) }; MOST_AT_ONCE],
    jumps: [const { AtomicU64::new(0) }; MOST_AT_ONCE],
    site_count: AtomicUsize::new(0),
};

/// Test hook (`test-hooks` builds, `MSLPROF_TEST_REWRITE_DELAY_US`): microseconds a live round waits with
/// its sites at `jmp $`, so that tests can fork, stop or trace the process inside the window.
#[cfg(feature = "test-hooks")]
static ROUND_DELAY_MICROS: AtomicU64 = AtomicU64::new(0);

/// Rewrites the sites of `jumps` (the first [`MOST_AT_ONCE`]) in one round; how many were rewritten.
///
/// Each page keeps the protection it had: the round reads it from `/proc/self/maps`, adds write permission
/// where it is missing, and gives back exactly what it read. A site is left out when it no longer holds the
/// bytes start-up found, when its page is shared, unreadable or cannot be made writable, or (while others
/// run) when its first two bytes straddle a cache line (their store would not be atomic).
///
/// While other threads run ([`Writing::WhileOthersRun`]), the round follows the cross-modifying-code
/// protocol: each site's first two bytes become `jmp $` (a thread arriving there waits), then, once every
/// thread has serialised, their last four change, and once more, their first two become the jump's; a
/// thread sees the old instruction, the wait, or the new one, never a mix. None is rewritten when the
/// kernel refuses to serialise (the sites are as they were). One round for all, not one per site: a thread
/// waiting on a `jmp $` spins until the rewriting thread goes on, and each `membarrier` is a point where the
/// kernel may switch that thread out (with 16 threads of fib on 2 cores, the rewrite of fib's one site took
/// 40 ms in one run of six, 0.1–0.2 ms in the others).
///
/// A child forked during the round finishes it ([`finish_round_after_fork`]). Async-signal-safe (system
/// calls only, errno kept).
///
/// # Safety
/// No signal handler on this thread may run the sites meanwhile (the caller blocks signals: with
/// `WhileOthersRun` this thread would wait for itself). With [`Writing::Alone`], no other thread runs;
/// with `WhileOthersRun`, `sys::register_core_sync` must have succeeded.
pub unsafe fn rewrite_round<'a>(
    jumps: impl Iterator<Item = &'a SiteJump>,
    writing: Writing,
) -> usize {
    const WAIT_HERE: [u8; 2] = [0xeb, 0xfe];
    let page = crate::sys::page_size();
    let mut candidates: [Option<&SiteJump>; MOST_AT_ONCE] = [None; MOST_AT_ONCE];
    let mut pages = [0usize; MOST_PAGES];
    let mut page_count = 0;
    for (slot, jump) in candidates.iter_mut().zip(jumps) {
        if writing == Writing::WhileOthersRun && jump.site % 64 == 63 {
            continue;
        }
        *slot = Some(jump);
        for at in jump.pages(page) {
            if let Err(index) = pages[..page_count].binary_search(&at) {
                pages.copy_within(index..page_count, index + 1);
                pages[index] = at;
                page_count += 1;
            }
        }
    }
    if page_count == 0 {
        return 0;
    }
    let pages = &pages[..page_count];
    let mut access = [crate::sys::PageAccess::default(); MOST_PAGES];
    let access = &mut access[..page_count];
    if !crate::sys::page_protections(pages, access) {
        return 0;
    }
    for (i, (&at, how)) in pages.iter().zip(access.iter()).enumerate() {
        ROUND.pages[i].store(at, Ordering::Relaxed);
        ROUND.protections[i].store(how.prot, Ordering::Relaxed);
    }
    ROUND.page_count.store(page_count, Ordering::Relaxed);
    ROUND.site_count.store(0, Ordering::Relaxed);
    ROUND.open.store(true, Ordering::Release);
    // Pages this round made writable (bit i: pages[i]), and those a site may be written on.
    let (mut opened, mut usable) = (0u128, 0u128);
    for (i, (&at, how)) in pages.iter().zip(access.iter()).enumerate() {
        if !how.mapped || how.shared || how.prot & libc::PROT_READ == 0 {
            continue;
        }
        if how.prot & libc::PROT_WRITE != 0 {
            usable |= 1 << i;
        // SAFETY: only adds write permission to a private mapping of code, keeping the rest.
        } else if unsafe { crate::sys::protect_exactly(at, page, how.prot | libc::PROT_WRITE) } {
            opened |= 1 << i;
            usable |= 1 << i;
        }
    }
    let usable_page = |at: usize| {
        pages
            .binary_search(&at)
            .is_ok_and(|index| usable & (1 << index) != 0)
    };
    let mut taken: [Option<&SiteJump>; MOST_AT_ONCE] = [None; MOST_AT_ONCE];
    let mut site_count = 0;
    for jump in candidates.iter().flatten() {
        // SAFETY: its pages are readable (usable).
        if jump.pages(page).into_iter().all(usable_page) && unsafe { jump.unchanged() } {
            ROUND.sites[site_count].store(jump.site, Ordering::Relaxed);
            ROUND.jumps[site_count].store(jump.packed(), Ordering::Relaxed);
            taken[site_count] = Some(jump);
            site_count += 1;
        }
    }
    ROUND.site_count.store(site_count, Ordering::Release);
    let taken = &taken[..site_count];
    let rewritten = match writing {
        Writing::Alone => {
            for jump in taken.iter().flatten() {
                // SAFETY: writable now; one thread, as the caller guarantees.
                unsafe { jump.write() };
            }
            site_count
        }
        // SAFETY: the sites' pages are writable now; the caller guarantees the rest.
        Writing::WhileOthersRun => unsafe { write_while_others_run(taken, WAIT_HERE) },
    };
    for (i, (&at, how)) in pages.iter().zip(access.iter()).enumerate() {
        if opened & (1 << i) != 0 {
            // SAFETY: gives back exactly the protection the page had, which took write away.
            unsafe { crate::sys::protect_exactly(at, page, how.prot) };
        }
    }
    ROUND.open.store(false, Ordering::Release);
    rewritten
}

/// The cross-modifying-code protocol of [`rewrite_round`] over `taken`; how many sites were rewritten.
///
/// # Safety
/// As [`rewrite_round`] with [`Writing::WhileOthersRun`]; the sites' pages are writable and each site's
/// first two bytes are in one cache line.
unsafe fn write_while_others_run(taken: &[Option<&SiteJump>], wait_here: [u8; 2]) -> usize {
    for jump in taken.iter().flatten() {
        // SAFETY: writable, the first two bytes in one line; the steps here are the protocol.
        unsafe { crate::sys::store_code_pair(jump.site, wait_here) }
    }
    #[cfg(feature = "test-hooks")]
    crate::sys::sleep_micros(ROUND_DELAY_MICROS.load(Ordering::Relaxed));
    let waiting = crate::sys::sync_cores();
    if waiting {
        for jump in taken.iter().flatten() {
            // SAFETY: no thread runs these bytes: any at the site waits on its first two.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    jump.jump[2..].as_ptr(),
                    (jump.site + 2) as *mut u8,
                    jump.len - 2,
                )
            }
        }
        crate::sys::sync_cores();
    }
    // The jumps' first two bytes, or (the kernel refused to serialise, the rest unchanged) the calls'.
    for jump in taken.iter().flatten() {
        let first = if waiting {
            [jump.jump[0], jump.jump[1]]
        } else {
            [jump.original[0], jump.original[1]]
        };
        // SAFETY: as the `jmp $` store.
        unsafe { crate::sys::store_code_pair(jump.site, first) }
    }
    crate::sys::sync_cores();
    if waiting { taken.len() } else { 0 }
}

/// In a forked child (one thread, before the program's own child handlers): if the parent was inside a
/// round when it forked, the child may hold sites at `jmp $` (which no thread of the child would ever
/// release), half-written, or pages the parent made writable. The child writes each of the round's jumps
/// whole and gives every page of the round its protection back. Async-signal-safe.
#[inline]
#[unsafe(link_section = "mslprof_fork_text")]
pub fn finish_round_after_fork() {
    if ROUND.open.load(Ordering::Acquire) {
        finish_open_round();
    }
}

/// [`finish_round_after_fork`] once the child found a round open.
#[cold]
fn finish_open_round() {
    let page = crate::sys::page_size();
    let page_count = ROUND.page_count.load(Ordering::Relaxed).min(MOST_PAGES);
    let protection_of = |at: usize| {
        (0..page_count)
            .find(|&i| ROUND.pages[i].load(Ordering::Relaxed) == at)
            .map(|i| ROUND.protections[i].load(Ordering::Relaxed))
    };
    let site_count = ROUND.site_count.load(Ordering::Acquire).min(MOST_AT_ONCE);
    let mut unfinished = 0;
    for i in 0..site_count {
        let site = ROUND.sites[i].load(Ordering::Relaxed);
        let jump = ROUND.jumps[i].load(Ordering::Relaxed).to_le_bytes();
        let len = usize::from(jump[7]).clamp(2, SITE_BYTES);
        let pages = site_pages(site, len, page);
        let writable = pages.iter().all(|&at| {
            // SAFETY: adds write permission to a page the parent made writable for this site (private
            // code, readable), keeping the rest of the protection it read.
            protection_of(at).is_some_and(|prot| unsafe {
                crate::sys::protect_exactly(at, page, prot | libc::PROT_WRITE)
            })
        });
        if writable {
            // SAFETY: the child runs one thread, here; the site's page(s) are writable; the parent checked
            // the site's bytes, which are now the call, a `jmp $`, a half-written jump or the jump.
            unsafe { core::ptr::copy_nonoverlapping(jump.as_ptr(), site as *mut u8, len) };
        } else {
            unfinished += 1;
        }
    }
    for i in 0..page_count {
        let (at, prot) = (
            ROUND.pages[i].load(Ordering::Relaxed),
            ROUND.protections[i].load(Ordering::Relaxed),
        );
        // SAFETY: gives back the protection the page had before the parent's round (the same protection
        // again where neither the parent nor the child changed it).
        unsafe { crate::sys::protect_exactly(at, page, prot) };
    }
    ROUND.open.store(false, Ordering::Relaxed);
    if unfinished > 0 {
        crate::sys::stderr_line(&[
            b"mslprof: a rewrite of code was under way at fork and this child cannot finish it; ",
            b"some of its profiled functions may hang\n",
        ]);
    }
}

/// Reads the test hooks' settings (`test-hooks` builds only; at start-up).
#[cfg(feature = "test-hooks")]
fn read_test_settings() {
    if let Some(micros) = std::env::var("MSLPROF_TEST_REWRITE_DELAY_US")
        .ok()
        .and_then(|value| value.parse().ok())
    {
        ROUND_DELAY_MICROS.store(micros, Ordering::Relaxed);
    }
}

/// The sites kept by [`Rewrite::WhenHot`], sorted by selfpc, with room for their call counts and whether
/// each was rewritten (or given up). Made once at start-up, never freed.
pub struct KeptSites {
    pub sites: Box<[SiteJump]>,
    /// Each site's function's calls counted by the looking thread since its previous look (`hot.rs`).
    pub calls: Box<[AtomicU64]>,
    /// Each site's function's calls counted by the thread that looked last, in all, as of that look.
    pub seen: Box<[AtomicU64]>,
    /// Whether each site was rewritten (or its rewrite failed: it is not tried again).
    pub done: Box<[AtomicBool]>,
    /// Whether sites may be rewritten while other threads run (`sys::register_core_sync` succeeded).
    pub live: bool,
}

impl KeptSites {
    /// The index of the site whose calls are counted under `selfpc`.
    pub fn find(&self, selfpc: usize) -> Option<usize> {
        self.sites
            .binary_search_by_key(&selfpc, |site| site.selfpc)
            .ok()
    }
}

/// The kept sites (null until [`install`] kept some).
static KEPT: AtomicPtr<KeptSites> = AtomicPtr::new(core::ptr::null_mut());

/// Publishes `jumps` as the kept sites.
fn keep(mut jumps: Vec<SiteJump>) {
    jumps.sort_unstable_by_key(|jump| jump.selfpc);
    let kept = Box::new(KeptSites {
        calls: jumps.iter().map(|_| AtomicU64::new(0)).collect(),
        seen: jumps.iter().map(|_| AtomicU64::new(0)).collect(),
        done: jumps.iter().map(|_| AtomicBool::new(false)).collect(),
        sites: jumps.into_boxed_slice(),
        live: crate::sys::register_core_sync(),
    });
    KEPT.store(Box::into_raw(kept), Ordering::Release);
}

/// The sites [`Rewrite::WhenHot`] kept, if any. Async-signal-safe (one atomic load).
pub fn kept() -> Option<&'static KeptSites> {
    // SAFETY: set once from a leaked Box, never freed.
    unsafe { KEPT.load(Ordering::Acquire).as_ref() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_with_site(at: usize, disp: i32) -> Vec<u8> {
        let mut text = vec![0x90u8; 64];
        text[at - 4..at].copy_from_slice(&PROLOGUE);
        text[at] = 0xff;
        text[at + 1] = 0x15;
        text[at + 2..at + 6].copy_from_slice(&disp.to_le_bytes());
        text
    }

    #[test]
    fn a_site_is_the_call_through_the_mcount_entry_after_the_prologue() {
        let start = 0x1000;
        let text = text_with_site(10, 0x200);
        let entry = start + 16 + 0x200;
        assert_eq!(
            find_sites(&text, start, &[entry]),
            vec![Site {
                at: start + 10,
                entry: start + 6
            }]
        );
        assert!(find_sites(&text, start, &[entry + 8]).is_empty());
        let mut no_prologue = text.clone();
        no_prologue[7] = 0x90;
        assert!(find_sites(&no_prologue, start, &[entry]).is_empty());
    }

    #[test]
    fn pushes_and_a_stack_adjustment_may_come_between_the_prologue_and_the_site() {
        let start = 0x1000;
        // push rbp; mov rbp, rsp; push r13; push r12; push rbx; sub rsp, 8; call *[rip + 0x200]
        let mut text = vec![0x90u8; 8];
        text.extend([
            0x55, 0x48, 0x89, 0xe5, 0x41, 0x55, 0x41, 0x54, 0x53, 0x48, 0x83, 0xec, 0x08,
        ]);
        let site = text.len();
        text.extend([0xff, 0x15, 0x00, 0x02, 0x00, 0x00, 0xc3]);
        let entry = start + site + 6 + 0x200;
        assert_eq!(
            find_sites(&text, start, &[entry])
                .iter()
                .map(|s| s.at)
                .collect::<Vec<_>>(),
            vec![start + site]
        );
        // A `mov` in between is not frame set-up.
        text[12] = 0x89;
        assert!(find_sites(&text, start, &[entry]).is_empty());
    }

    #[test]
    fn the_site_jumps_to_its_stub_and_the_stub_back() {
        let (site, stub) = (0x40_0000usize, 0x30_0000usize);
        let jump = site_jump(site, stub).unwrap();
        assert_eq!(jump[0], 0xe9);
        let rel = i32::from_le_bytes(jump[1..5].try_into().unwrap());
        assert_eq!((site as isize + 5 + rel as isize) as usize, stub);
        let (miss, elsewhere) = (stub - 0x1000, stub - 0x1000 + ELSEWHERE_AT);
        let code =
            encode_stub(stub, site, -0x100, 3 * TABLE_BYTES as u32, miss, elsewhere).unwrap();
        let target = |at: usize, len: usize| {
            let rel = i32::from_le_bytes(code[at + len - 4..at + len].try_into().unwrap());
            (stub as isize + (at + len) as isize + rel as isize) as usize
        };
        assert_eq!((code[55], target(55, 5)), (0xe9, site + SITE_BYTES));
        // Held by another caller: selfpc pushed without a load, a direct call, the stack restored, back.
        assert_eq!(code[66..69], [0x4c, 0x8d, 0x1d]);
        assert_eq!(target(66, 7), site + SITE_BYTES);
        assert_eq!(code[73..75], [0x41, 0x53]);
        assert_eq!((code[75], target(75, 5)), (0xe8, elsewhere));
        assert_eq!(code[80..85], [0x48, 0x8d, 0x64, 0x24, 0x08]);
        assert_eq!((code[85], target(85, 5)), (0xe9, site + SITE_BYTES));
        assert_eq!((code[91], target(91, 5)), (0xe8, miss));
        assert_eq!(
            (code[MISS_RETURN], target(MISS_RETURN, 5)),
            (0xe9, site + SITE_BYTES)
        );
        // No region (jz) and a free entry (jne, then jz) go to the miss at 90; another caller on to 65.
        assert_eq!((code[13], 15 + code[14] as usize), (0x74, 90));
        assert_eq!((code[44], 46 + code[45] as usize), (0x75, 60));
        assert_eq!((code[63], 65 + code[64] as usize), (0x74, 90));
        // SAFETY: `code` holds a whole stub; its metadata follows the miss call.
        let (table, selfpc) = unsafe { stub_metadata(code.as_ptr() as usize + MISS_RETURN) };
        assert_eq!((table, selfpc), (3 * TABLE_BYTES as u32, site + SITE_BYTES));
        assert!(site_jump(site, site + (3 << 30)).is_none());
    }

    #[test]
    fn only_functions_with_few_direct_call_sites_are_rewritten() {
        let start = 0x1000;
        let (few, many) = (
            Site {
                at: start + 4,
                entry: start,
            },
            Site {
                at: start + 36,
                entry: start + 32,
            },
        );
        let mut text = vec![0x90u8; 512];
        let mut call = |at: usize, to: usize| {
            text[at] = 0xe8;
            let rel = (to as isize - (start + at + 5) as isize) as i32;
            text[at + 1..at + 5].copy_from_slice(&rel.to_le_bytes());
        };
        for i in 0..MAX_CALL_SITES {
            call(64 + i * 5, few.entry);
        }
        for i in 0..=MAX_CALL_SITES {
            call(256 + i * 5, many.entry);
        }
        assert_eq!(
            with_few_call_sites(&[few, many], &[(start, &text)]),
            vec![few.at]
        );
    }

    #[test]
    fn a_function_entry_includes_its_endbr64() {
        let start = 0x1000;
        let mut text = ENDBR64.to_vec();
        text.extend(PROLOGUE);
        text.extend([0xff, 0x15, 0, 2, 0, 0]);
        let entry = start + text.len() + 0x200;
        assert_eq!(
            find_sites(&text, start, &[entry]),
            vec![Site {
                at: start + 8,
                entry: start
            }]
        );
    }

    /// A page of our own holding fake sites at `offsets` (`call *[rip + 0x200]`), with protection `prot`.
    fn page_of_sites(offsets: &[usize], prot: i32) -> (usize, Vec<SiteJump>) {
        let page = crate::sys::page_size();
        let base = crate::sys::map_zeroed(page).expect("a page") as usize;
        let original = [0xff, 0x15, 0x00, 0x02, 0x00, 0x00];
        let jumps = offsets
            .iter()
            .map(|&offset| {
                let site = base + offset;
                // SAFETY: our own fresh read-write page.
                unsafe { core::ptr::write(site as *mut [u8; SITE_BYTES], original) };
                SiteJump {
                    selfpc: site + SITE_BYTES,
                    site,
                    original,
                    jump: [0xe9, 1, 2, 3, 4, 0x90],
                    len: SITE_BYTES,
                }
            })
            .collect();
        // SAFETY: nothing runs in or writes the page.
        assert!(unsafe { crate::sys::protect_exactly(base, page, prot) });
        (base, jumps)
    }

    fn bytes_at(site: usize) -> [u8; SITE_BYTES] {
        // SAFETY: a readable page of a test.
        unsafe { core::ptr::read_volatile(site as *const [u8; SITE_BYTES]) }
    }

    fn protection(base: usize) -> i32 {
        let mut access = [crate::sys::PageAccess::default()];
        assert!(crate::sys::page_protections(&[base], &mut access));
        access[0].prot
    }

    #[test]
    fn a_round_keeps_each_page_protection_skips_changed_sites_and_a_forked_child_finishes_it() {
        let (rx, rwx) = (
            libc::PROT_READ | libc::PROT_EXEC,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
        );
        for prot in [rx, rwx] {
            let (base, jumps) = page_of_sites(&[100, 200], prot);
            // A patcher (a debugger's breakpoint) changed the second site since start-up.
            // SAFETY: our own page, made writable for the change.
            unsafe {
                crate::sys::protect_exactly(base, crate::sys::page_size(), rwx);
                core::ptr::write_volatile(jumps[1].site as *mut u8, 0xcc);
                crate::sys::protect_exactly(base, crate::sys::page_size(), prot);
            }
            // SAFETY: nothing runs the page's bytes.
            let rewritten = unsafe { rewrite_round(jumps.iter(), Writing::Alone) };
            assert_eq!(rewritten, 1);
            assert_eq!(bytes_at(jumps[0].site), jumps[0].jump);
            assert_eq!(bytes_at(jumps[1].site)[0], 0xcc);
            assert_eq!(protection(base), prot, "the page's protection changed");
            assert!(!ROUND.open.load(Ordering::Relaxed));
        }
        // A child forked with the round's sites at `jmp $`, its page still writable: it writes each jump
        // whole and gives the page its protection back.
        let (base, jumps) = page_of_sites(&[300], rx);
        // SAFETY: our own page, made writable as the parent's round did, with the first two bytes at `jmp $`.
        unsafe {
            crate::sys::protect_exactly(base, crate::sys::page_size(), rwx);
            core::ptr::write_volatile(jumps[0].site as *mut [u8; 2], [0xeb, 0xfe]);
        }
        ROUND.pages[0].store(base, Ordering::Relaxed);
        ROUND.protections[0].store(rx, Ordering::Relaxed);
        ROUND.page_count.store(1, Ordering::Relaxed);
        ROUND.sites[0].store(jumps[0].site, Ordering::Relaxed);
        ROUND.jumps[0].store(jumps[0].packed(), Ordering::Relaxed);
        ROUND.site_count.store(1, Ordering::Relaxed);
        ROUND.open.store(true, Ordering::Release);
        finish_round_after_fork();
        assert_eq!(bytes_at(jumps[0].site), jumps[0].jump);
        assert_eq!(protection(base), rx);
        assert!(!ROUND.open.load(Ordering::Relaxed));
    }

    #[test]
    fn callers_four_bytes_apart_use_neighbouring_entries() {
        assert_eq!(entry_offset(0, 0x1000), 0);
        assert_eq!(entry_offset(0, 0x1004), 32);
        assert_eq!(
            entry_offset(TABLE_BYTES as u32, 0x1000 + 4 * 255),
            2 * TABLE_BYTES - 32
        );
        assert_eq!(entry_offset(0, 0x1000 + 4 * 256), 0);
    }
}
