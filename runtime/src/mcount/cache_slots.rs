//! The lasting half of the per-thread call caches: a fixed table of [`CacheSlot`]s, one claimed by each
//! thread that counts calls. A slot owns the thread's entry mappings (never unmapped: a dump on another
//! thread may be reading them, and the slot's next owner reuses them), a bitmap of the chunks that hold
//! entries, and the write sequence under which another thread (the dump) reads them.
//!
//! A cache entry keeps its arc's count itself ([`CacheEntry::count`]), so a call that hits the cache touches
//! one cache line. What the count means depends on the entry ([`CacheEntry::counter`]):
//! - **a running total** (the thread owns its counter stripe and the arc's caller is known, so no other
//!   entry anywhere holds the same counter): the arc's count in the thread's stripe, calls since the entry
//!   was made included. Storing it into the counter ([`flush`]) publishes it, and reading it from another
//!   thread (`publish`) can only raise the counter to a value it really had: the dump takes the larger.
//! - **a delta** (tagged [`DELTA`]: the thread shares the last stripe, or the caller is in no module so
//!   many call sites share the arc): calls not yet added to the counter, added when the entry goes. A
//!   snapshot sees a delta only once it is added: at eviction, a cache clear, thread exit, or the dumping
//!   thread's own flush. The process's last dump, taken with counting paused, **lends** every other slot's
//!   deltas to the counters (`publish` with `lend`): a slot is lent at most once, and from then on its owner
//!   never adds a delta again (an owner that exits meanwhile leaves its slot untouched for the dump).

use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};

use super::sites;
use crate::modules;
use crate::sys;

/// Slots in the table: threads beyond this many alive at once count without a cache (every call takes
/// the slow path, still exactly).
pub const MAX_SLOTS: usize = 1024;

/// Entries per chunk of a cache mapping (64 KiB): the unit of the touched bitmap, of flushing and of
/// giving pages back.
pub const CHUNK_ENTRIES: usize = 2048;

/// Mapping sizes a slot can have: the first and each growth.
pub const LEVELS: usize = super::CACHE_SETS.len();

/// Entries of the largest mapping.
const MAX_ENTRIES: usize = super::MAX_CACHE_SETS * 2;
/// Words of the touched bitmap (one bit per chunk of the largest mapping).
const TOUCHED_WORDS: usize = MAX_ENTRIES / CHUNK_ENTRIES / 64;

/// Entries per 4 KiB page: the unit of [`CacheSlot::first_pages`].
const PAGE_ENTRIES: usize = 4096 / core::mem::size_of::<CacheEntry>();
const _: () = assert!(level_entries(0) / PAGE_ENTRIES <= 64);

/// Pages of the first mapping that [`CacheSlot::populate_ahead`] makes resident at once.
const POPULATE_AHEAD: usize = 4;

/// Tag bit of [`CacheEntry::counter`]: the count is a delta, not a running total.
pub const DELTA: usize = 1;

/// Rounds of waiting for another thread's cache change to end before the dump gives up on that thread
/// (its cached counts then reach the file when it flushes them, not in this dump).
const STABLE_READ_ROUNDS: usize = 64;
/// Spins per round before yielding the CPU.
const SPINS_PER_ROUND: usize = 128;

/// [`CacheSlot::phase`]: the owner counts as usual.
const ACTIVE: u8 = 0;
/// [`CacheSlot::phase`]: the owner is exiting and flushes the slot itself.
const EXITING: u8 = 1;
/// [`CacheSlot::phase`]: the last dump has added the slot's deltas to the counters; nobody adds them again.
const LENT: u8 = 2;

/// One cached arc, 32 bytes: two of them (the ways of one set) fill a 64-byte line. The assembly fast
/// path compares `frompc` and `selfpc` and adds 1 to `count`: it writes nothing else.
#[repr(C, align(32))]
pub struct CacheEntry {
    /// Raw return address in the caller (0: empty entry).
    pub frompc: AtomicUsize,
    /// Raw address identifying the callee.
    pub selfpc: AtomicUsize,
    /// Address of the arc's counter in the callee module's table, `| DELTA` when `count` is a delta; 0
    /// when the callee's module is not profiled (the count is then never read).
    pub counter: AtomicUsize,
    /// Running total or delta, as the module documentation says.
    pub count: AtomicU64,
}

impl CacheEntry {
    /// Writes the four fields (owner only, with the fast path kept off the entry).
    pub fn set(&self, frompc: usize, selfpc: usize, counter: usize, count: u64) {
        self.frompc.store(frompc, Ordering::Relaxed);
        self.selfpc.store(selfpc, Ordering::Relaxed);
        self.counter.store(counter, Ordering::Relaxed);
        self.count.store(count, Ordering::Relaxed);
    }

    /// Whether the entry holds an arc (an empty one is all zero; every arc has a callee).
    pub fn in_use(&self) -> bool {
        self.selfpc.load(Ordering::Relaxed) != 0
    }

    /// Makes this entry a copy of `other` (owner only).
    pub fn copy_from(&self, other: &CacheEntry) {
        self.set(
            other.frompc.load(Ordering::Relaxed),
            other.selfpc.load(Ordering::Relaxed),
            other.counter.load(Ordering::Relaxed),
            other.count.load(Ordering::Relaxed),
        );
    }
}

/// The arc counter behind a [`CacheEntry::counter`] value and whether the count is a delta; `None` for an
/// unprofiled callee.
fn tagged_counter(tagged: usize) -> Option<(&'static AtomicU64, bool)> {
    let address = tagged & !DELTA;
    // SAFETY: non-zero entry counters are arc counters in tables of leaked LiveModules, valid for the rest of
    // the process.
    let counter = unsafe { (address as *const AtomicU64).as_ref() }?;
    Some((counter, tagged & DELTA != 0))
}

/// The entry mask (entries − 1) of a mapping of `entries` entries.
pub const fn entry_mask(entries: usize) -> u32 {
    (entries - 1) as u32
}

/// Entries of a mapping at growth level `level`.
pub const fn level_entries(level: usize) -> usize {
    super::CACHE_SETS[level] * 2
}

const fn level_bytes(level: usize) -> usize {
    level_entries(level) * core::mem::size_of::<CacheEntry>()
}

/// The part of a thread's call cache that outlives the thread.
pub struct CacheSlot {
    claimed: AtomicBool,
    /// [`ACTIVE`], [`EXITING`] or [`LENT`]: who adds the deltas, decided by one atomic exchange each.
    phase: AtomicU8,
    /// Odd while the owning thread changes its entries, the counters they hold or `entries`/`level`.
    writes: AtomicU32,
    /// The current mapping (null before the first).
    entries: AtomicPtr<CacheEntry>,
    /// Growth level of `entries`.
    level: AtomicUsize,
    /// Every mapping this slot ever had, by level: kept for the slot's next owners.
    mappings: [AtomicPtr<CacheEntry>; LEVELS],
    /// Bit i: chunk i of the current mapping may hold entries. Written by the owner only.
    touched: [AtomicU64; TOUCHED_WORDS],
    /// While the current mapping is the first (level 0), bit i: its page i may hold entries. A thread with a
    /// few arcs uses a few of its 64 pages, and reading the rest of their chunks when it empties the cache
    /// or a dump reads it would fault in pages of zeros. Written by the owner only.
    first_pages: AtomicU64,
    /// The slot's site region (`sites.rs`: one table per rewritten function; null before its first use),
    /// kept for the slot's next owners like the cache mappings.
    site_base: AtomicPtr<u8>,
    /// [`sites::unloads`] when the region last dropped the entries of unloaded callers.
    site_unloads: AtomicUsize,
    /// The owner's `ThreadCache::site_region` (its stubs' region address, in its TLS), which other threads
    /// clear to take the owner off its region ([`CacheSlot::stop_site_counting`]); null while none.
    site_word: AtomicPtr<AtomicUsize>,
    /// Other threads between reading `site_word` and clearing the word: the owner waits for 0 before its TLS
    /// goes away.
    site_users: AtomicU32,
    /// The owner's CPU time at its last look that found nothing in its cache ([`CacheSlot::ran_since_last_look`]).
    look_cpu_ns: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: CacheSlot = CacheSlot {
    claimed: AtomicBool::new(false),
    phase: AtomicU8::new(ACTIVE),
    writes: AtomicU32::new(0),
    entries: AtomicPtr::new(core::ptr::null_mut()),
    level: AtomicUsize::new(0),
    mappings: [const { AtomicPtr::new(core::ptr::null_mut()) }; LEVELS],
    touched: [const { AtomicU64::new(0) }; TOUCHED_WORDS],
    first_pages: AtomicU64::new(0),
    site_base: AtomicPtr::new(core::ptr::null_mut()),
    site_unloads: AtomicUsize::new(0),
    site_word: AtomicPtr::new(core::ptr::null_mut()),
    site_users: AtomicU32::new(0),
    look_cpu_ns: AtomicU64::new(0),
};

static SLOTS: [CacheSlot; MAX_SLOTS] = [EMPTY_SLOT; MAX_SLOTS];

/// One more than the highest index of a slot ever claimed (raised before the claim): the slots from there
/// on are as [`EMPTY_SLOT`] made them, and the walks over every slot stop there. The table is 154 pages: a
/// forked child that read and wrote every slot took about 330 page faults (a zero page mapped, then
/// copied), most of what a fork cost under the runtime.
static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);

/// The slots that may have been claimed (every other one is untouched).
fn used_slots() -> &'static [CacheSlot] {
    let used = SLOTS_USED.load(Ordering::SeqCst).min(MAX_SLOTS);
    SLOTS.get(..used).unwrap_or(&[])
}

/// Claims a free slot for the calling thread, with a mapping ready (the slot's largest one, or a new one
/// of the first level). `None` if every slot is taken or nothing can be mapped.
pub fn claim() -> Option<&'static CacheSlot> {
    let slot = SLOTS.iter().enumerate().find_map(|(index, slot)| {
        if slot.claimed.load(Ordering::Relaxed) {
            return None;
        }
        // Before the claim, so that a walk (or a fork) that sees the slot claimed sees it among the used.
        SLOTS_USED.fetch_max(index + 1, Ordering::SeqCst);
        slot.claimed
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then_some(slot)
    })?;
    slot.phase.store(ACTIVE, Ordering::Relaxed);
    if slot.entries.load(Ordering::Relaxed).is_null() {
        let Some(base) = sys::map_zeroed(level_bytes(0)) else {
            slot.claimed.store(false, Ordering::Release);
            return None;
        };
        slot.mappings[0].store(base.cast(), Ordering::Relaxed);
        slot.begin_write();
        slot.entries.store(base.cast(), Ordering::Relaxed);
        slot.level.store(0, Ordering::Relaxed);
        slot.end_write();
    }
    Some(slot)
}

impl CacheSlot {
    /// Starts a change of the entries (the dump's reads made meanwhile are retried).
    pub fn begin_write(&self) {
        let writes = self.writes.load(Ordering::Relaxed);
        self.writes.store(writes.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Ends the change started by [`CacheSlot::begin_write`].
    pub fn end_write(&self) {
        let writes = self.writes.load(Ordering::Relaxed);
        self.writes.store(writes.wrapping_add(1), Ordering::Release);
    }

    /// The current mapping and its growth level.
    pub fn mapping(&self) -> (*mut CacheEntry, usize) {
        (
            self.entries.load(Ordering::Relaxed),
            self.level.load(Ordering::Relaxed),
        )
    }

    /// The current mapping's entries. Owner only.
    pub fn entries(&self) -> &[CacheEntry] {
        let (entries, level) = self.mapping();
        if entries.is_null() {
            return &[];
        }
        // SAFETY: `entries` is this slot's mapping of `level_entries(level)` zero-initialised entries
        // (all-zero is a valid CacheEntry: atomics), never unmapped.
        unsafe { core::slice::from_raw_parts(entries, level_entries(level)) }
    }

    /// Notes that entry `index` of the current mapping is in use. Owner only.
    pub fn touch(&self, index: usize) {
        if self.level.load(Ordering::Relaxed) == 0 {
            let page = (index / PAGE_ENTRIES) % 64;
            let pages = self.first_pages.load(Ordering::Relaxed);
            let marked = pages | self.populate_ahead(page, pages) | 1 << page;
            if marked != pages {
                self.first_pages.store(marked, Ordering::Relaxed);
            }
        }
        self.touch_chunk(index);
    }

    /// When an entry is made on page `page` of the first mapping and page `page - 1` has entries too (`pages`:
    /// the pages marked so far), the calls are walking the cache in address order (a program running through
    /// its call sites for the first time): the next [`POPULATE_AHEAD`] pages, unless marked already, are made
    /// resident in one system call, and returned to be marked (walks and [`CacheSlot::empty`] then cover them
    /// too). Otherwise the stub's first look at a set on a fresh page faults in the zero page, and the entry
    /// made there faults again to replace it: two faults per page, about 1 µs more than one on a VM.
    fn populate_ahead(&self, page: usize, pages: u64) -> u64 {
        let pages_in_first = level_bytes(0) / 4096;
        let next = page + 1;
        if page == 0
            || next >= pages_in_first
            || pages & (1 << (page - 1)) == 0
            || pages & (1 << next) != 0
        {
            return 0;
        }
        let end = (next + POPULATE_AHEAD).min(pages_in_first);
        let base = self.mappings[0].load(Ordering::Relaxed);
        if base.is_null() {
            return 0;
        }
        // SAFETY: pages `next .. end` lie inside the first mapping (`end` ≤ its pages).
        let first = unsafe { base.cast::<u8>().add(next * 4096) };
        sys::populate(first, (end - next) * 4096);
        (next..end).fold(0u64, |bits, ahead| bits | 1 << ahead)
    }

    /// The chunk part of [`CacheSlot::touch`] (for the next level's mapping while entries move into it).
    fn touch_chunk(&self, index: usize) {
        let chunk = index / CHUNK_ENTRIES;
        if let Some(word) = self.touched.get(chunk / 64) {
            let bit = 1u64 << (chunk % 64);
            let bits = word.load(Ordering::Relaxed);
            if bits & bit == 0 {
                word.store(bits | bit, Ordering::Relaxed);
            }
        }
    }

    /// Visits the index ranges (below `len`, the current mapping's entries) that may hold entries, clearing
    /// the marks with `clear`.
    fn for_each_touched_range(
        &self,
        clear: bool,
        len: usize,
        visit: impl FnMut(core::ops::Range<usize>),
    ) {
        let take = |word: &AtomicU64| {
            if clear {
                word.swap(0, Ordering::Relaxed)
            } else {
                word.load(Ordering::Relaxed)
            }
        };
        let pages = take(&self.first_pages);
        // Taken (and cleared) before any range is visited, also when the pages say where to go.
        let mut chunks = [0u64; TOUCHED_WORDS];
        for (copy, word) in chunks.iter_mut().zip(&self.touched) {
            *copy = take(word);
        }
        for_each_range_marked(len, chunks, pages, visit);
    }

    /// Whether the owner ran at least `ns` of CPU time since the last call (0 the first time: it may be a new
    /// owner). Owner only: its looks, which take turns.
    pub fn ran_since_last_look(&self, ns: u64) -> bool {
        let now = sys::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).max(0) as u64;
        let before = self.look_cpu_ns.swap(now, Ordering::Relaxed);
        before != 0 && now.saturating_sub(before) >= ns
    }

    /// Visits the entries that hold an arc among at most about `most` entries of the current mapping's
    /// chunks used: both ways of sets evenly spaced (all of them when the chunks hold no more; the same ones
    /// on each call while the mapping and its chunks stay the same). Owner only, or a signal handler on the
    /// owner that interrupted no change of the entries.
    pub fn for_each_sampled_entry_in_use(&self, most: usize, mut visit: impl FnMut(&CacheEntry)) {
        let all = self.entries();
        let chunks: usize = self
            .touched
            .iter()
            .map(|word| word.load(Ordering::Relaxed).count_ones() as usize)
            .sum();
        // In entries, a whole number of sets: a call site's own entry is either way of its set.
        let step = 2
            * (chunks * CHUNK_ENTRIES / 2)
                .div_ceil((most / 2).max(1))
                .max(1);
        // Entries to pass over at the start of the next chunk.
        let mut carry = 0;
        self.for_each_touched_range(false, all.len(), |range| {
            let chunk = &all[range];
            let mut index = carry;
            while let Some(set) = chunk.get(index..index + 2) {
                set.iter()
                    .filter(|entry| entry.in_use())
                    .for_each(&mut visit);
                index += step;
            }
            carry = index.saturating_sub(chunk.len());
        });
    }

    /// Flushes every entry of the current mapping ([`flush`]; not when `keep_counts` is false: a forked
    /// child drops its parent's) and gives the touched chunks' pages back (they read as zero). Owner only,
    /// inside `begin_write`/`end_write`.
    pub fn empty(&self, keep_counts: bool) {
        let all = self.entries();
        let lent = self.is_lent();
        let mut discard = Discard::default();
        self.for_each_touched_range(true, all.len(), |range| {
            let chunk = &all[range];
            if keep_counts {
                chunk.iter().for_each(|entry| flush(entry, lent));
            }
            discard.add(chunk);
        });
        discard.finish();
    }

    /// [`CacheSlot::empty`] as one change of its own (outside `record_call`: thread exit, a dump, fork).
    pub fn empty_now(&self, keep_counts: bool) {
        self.begin_write();
        self.empty(keep_counts);
        self.end_write();
    }

    /// Replaces the current mapping with the next level's. The old entries move into it with their counts
    /// (an entry whose new set is full is flushed instead), so a working set that outgrew the cache is not
    /// looked up again call by call; the old mapping's pages are given back. False (nothing changed) when
    /// the slot is at its largest or the mapping cannot be had. Owner only, inside
    /// `begin_write`/`end_write`.
    pub fn grow(&self) -> bool {
        let (_, level) = self.mapping();
        let Some(next) = self.mappings.get(level + 1) else {
            return false;
        };
        let mut larger = next.load(Ordering::Relaxed);
        if larger.is_null() {
            let Some(base) = sys::map_zeroed(level_bytes(level + 1)) else {
                return false;
            };
            sys::prefer_huge_pages(base, level_bytes(level + 1));
            larger = base.cast();
            next.store(larger, Ordering::Relaxed);
        }
        // SAFETY: `larger` is this slot's mapping of `level_entries(level + 1)` entries, never unmapped,
        // and empty: a mapping this slot left was emptied then, and no other thread writes it.
        let moved_to =
            unsafe { core::slice::from_raw_parts(larger.cast_const(), level_entries(level + 1)) };
        self.move_entries(moved_to);
        self.entries.store(larger, Ordering::Relaxed);
        self.level.store(level + 1, Ordering::Relaxed);
        true
    }

    /// Moves every entry of the current mapping into `larger` (the next level's mapping, empty): each to a
    /// free one of the four entries where the fast path looks for it there (`mcount::pair_places`), its own
    /// first, else flushed; then gives the current mapping's touched pages back. The touched bitmap ends up
    /// describing `larger`.
    fn move_entries(&self, larger: &[CacheEntry]) {
        let old = self.entries();
        let entry_mask = entry_mask(larger.len());
        let lent = self.is_lent();
        // The bitmap is rebuilt for `larger` while the old chunks are visited from this copy.
        let mut old_touched = [0u64; TOUCHED_WORDS];
        for (copy, word) in old_touched.iter_mut().zip(&self.touched) {
            *copy = word.swap(0, Ordering::Relaxed);
        }
        let old_pages = self.first_pages.swap(0, Ordering::Relaxed);
        let mut discard = Discard::default();
        for_each_range_marked(old.len(), old_touched, old_pages, |range| {
            let chunk = &old[range];
            for entry in chunk {
                if !entry.in_use() {
                    continue;
                }
                let selfpc = entry.selfpc.load(Ordering::Relaxed);
                let own = super::cache_index(entry.frompc.load(Ordering::Relaxed), entry_mask);
                let free = super::pair_places(own, selfpc)
                    .into_iter()
                    .find(|&at| larger.get(at).is_some_and(|way| !way.in_use()));
                match free {
                    Some(at) => {
                        larger[at].copy_from(entry);
                        self.touch_chunk(at);
                        entry.set(0, 0, 0, 0);
                    }
                    None => flush(entry, lent),
                }
            }
            discard.add(chunk);
        });
        discard.finish();
    }

    /// Gives the slot back (its owner is exiting, after emptying it) for the next thread.
    pub fn release(&self) {
        self.claimed.store(false, Ordering::Release);
    }

    /// Called by an exiting owner before it empties the slot: false when the last dump has lent the slot's
    /// deltas already, and the owner must then leave the slot as it is (claimed, for that dump to read).
    pub fn begin_exit(&self) -> bool {
        self.phase.swap(EXITING, Ordering::SeqCst) != LENT
    }

    /// True once the last dump has lent this slot's deltas: a flush must not add them again.
    pub fn is_lent(&self) -> bool {
        self.phase.load(Ordering::Relaxed) == LENT
    }

    /// Reads `read` (entries of this slot) at a moment when the owner is not changing them; `None` when
    /// the owner stays busy (it may be the caller itself, interrupted by a signal in the middle of a change).
    fn read_stable<T>(&self, read: impl Fn() -> T) -> Option<T> {
        for _ in 0..STABLE_READ_ROUNDS {
            for _ in 0..SPINS_PER_ROUND {
                let before = self.writes.load(Ordering::Acquire);
                if before & 1 == 0 {
                    let value = read();
                    fence(Ordering::Acquire);
                    if self.writes.load(Ordering::Relaxed) == before {
                        return Some(value);
                    }
                }
                core::hint::spin_loop();
            }
            std::thread::yield_now();
        }
        None
    }

    /// Raises each counter held as a running total by this slot's entries to that total (read from another
    /// thread, which may be running: see the module documentation); with `lend` (the last dump, counting
    /// paused), also adds its deltas, once. Async-signal-safe.
    fn publish(&self, lend: bool) {
        let lend = lend
            && self
                .phase
                .compare_exchange(ACTIVE, LENT, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok();
        let Some((entries, level)) = self.read_stable(|| self.mapping()) else {
            return;
        };
        if entries.is_null() {
            return;
        }
        let mut owner_busy = false;
        self.for_each_touched_range(false, level_entries(level), |range| {
            for index in range {
                if owner_busy {
                    return;
                }
                // SAFETY: `index` is below the entry count of mapping `entries` (read together with its
                // level), which is never unmapped; its fields are atomics.
                let entry = unsafe { &*entries.add(index) };
                owner_busy = !self.publish_entry(entry, lend);
            }
        });
        let region = self.site_base.load(Ordering::Acquire);
        if !region.is_null() && !owner_busy {
            // SAFETY: the slot's site region, never unmapped.
            unsafe {
                sites::for_each_used_entry(region, |entry| {
                    owner_busy = owner_busy || !self.publish_entry(entry, lend);
                })
            };
        }
    }

    /// [`CacheSlot::publish`] for one entry; false when the owner stays busy.
    fn publish_entry(&self, entry: &CacheEntry, lend: bool) -> bool {
        let Some((tagged, total)) = self.read_stable(|| {
            (
                entry.counter.load(Ordering::Relaxed),
                entry.count.load(Ordering::Relaxed),
            )
        }) else {
            return false;
        };
        match tagged_counter(tagged) {
            Some((counter, false)) => {
                counter.fetch_max(total, Ordering::Relaxed);
            }
            Some((counter, true)) if lend && total != 0 => {
                counter.fetch_add(total, Ordering::Relaxed);
            }
            _ => {}
        }
        true
    }

    /// The owner's site region, mapped on first use, with the entries whose caller's module was unloaded
    /// since the last look dropped (flushed); `None` when no site is rewritten or nothing can be mapped.
    /// Owner only, inside `begin_write`/`end_write`.
    pub fn site_region(&self) -> Option<*mut u8> {
        let bytes = sites::region_bytes();
        if bytes == 0 {
            return None;
        }
        let unloads = sites::unloads();
        let mut base = self.site_base.load(Ordering::Relaxed);
        if base.is_null() {
            base = sys::map_zeroed(bytes)?;
            self.site_base.store(base, Ordering::Release);
            self.site_unloads.store(unloads, Ordering::Relaxed);
        }
        if self.site_unloads.load(Ordering::Relaxed) != unloads {
            let lent = self.is_lent();
            // SAFETY: the slot's site region.
            unsafe {
                sites::for_each_used_entry(base, |entry| {
                    let key = entry.selfpc.load(Ordering::Relaxed) as u32;
                    if key != super::UNKNOWN_KEY
                        && modules::by_key(key).is_none_or(|module| module.is_unloaded())
                    {
                        flush(entry, lent);
                    }
                })
            };
            self.site_unloads.store(unloads, Ordering::Relaxed);
        }
        Some(base)
    }

    /// [`sites::unloads`] as of the region's last check.
    pub fn site_region_unloads(&self) -> usize {
        self.site_unloads.load(Ordering::Relaxed)
    }

    /// Makes `word` (the owner's `ThreadCache::site_region`) the one other threads clear.
    pub fn register_site_word(&self, word: &AtomicUsize) {
        let word = word as *const AtomicUsize as *mut AtomicUsize;
        if self.site_word.load(Ordering::Relaxed) != word {
            self.site_word.store(word, Ordering::SeqCst);
        }
    }

    /// Stops other threads from clearing the owner's word (it is exiting: its TLS goes), waiting for any that
    /// is about to.
    pub fn unregister_site_word(&self) {
        self.site_word
            .store(core::ptr::null_mut(), Ordering::SeqCst);
        while self.site_users.load(Ordering::SeqCst) != 0 {
            core::hint::spin_loop();
        }
    }

    /// Takes the owner off its site region: its stubs miss until its slow path installs the region again,
    /// having seen the change that called this. Async-signal-safe.
    fn stop_site_counting(&self) {
        self.site_users.fetch_add(1, Ordering::SeqCst);
        let word = self.site_word.load(Ordering::SeqCst);
        // SAFETY: a registered word is the owner's TLS, which stays while `site_users` is non-zero.
        if let Some(word) = unsafe { word.as_ref() } {
            word.store(0, Ordering::Relaxed);
        }
        self.site_users.fetch_sub(1, Ordering::Release);
    }

    /// Stores the running totals, and adds the deltas, of the owner's site region to their counters, keeping
    /// the entries (a dump on the owner's thread). Owner only.
    pub fn flush_site_region(&self) {
        let region = self.site_base.load(Ordering::Relaxed);
        if region.is_null() {
            return;
        }
        let lent = self.is_lent();
        // SAFETY: the slot's site region.
        unsafe { sites::for_each_used_entry(region, |entry| flush_kept(entry, lent)) };
    }

    /// Flushes and drops every entry of the owner's site region (it is exiting: the next owner has another
    /// stripe), giving its pages back.
    pub fn empty_site_region_now(&self) {
        let region = self.site_base.load(Ordering::Relaxed);
        if region.is_null() {
            return;
        }
        self.begin_write();
        let lent = self.is_lent();
        // SAFETY: the slot's site region.
        unsafe { sites::for_each_used_entry(region, |entry| flush(entry, lent)) };
        sys::discard(region, sites::region_bytes());
        self.end_write();
    }

    fn is_claimed(&self) -> bool {
        self.claimed.load(Ordering::Acquire)
    }
}

/// Publishes the running totals of every claimed slot but `except`, and with `lend` lends their deltas (see
/// [`CacheSlot::publish`]).
pub fn publish_all(except: Option<&CacheSlot>, lend: bool) {
    for slot in used_slots() {
        if slot.is_claimed() && !except.is_some_and(|except| core::ptr::eq(except, slot)) {
            slot.publish(lend);
        }
    }
}

/// Takes every thread off its site region (a pause, or an unload: see `mcount::note_unload`). Async-signal-safe.
pub fn stop_site_counting_everywhere() {
    if sites::region_bytes() == 0 {
        return;
    }
    // A slot beyond the used ones has no word to clear; one claimed meanwhile registers its word after its
    // claim, as if this walk had read its word before.
    for slot in used_slots() {
        slot.stop_site_counting();
    }
}

/// In a forked child (one thread): drops every slot's entries without counting them, and frees the slots
/// of the parent's other threads, which do not exist here. Only the used slots are visited: the others are
/// untouched, and storing into them would cost the child a page fault per page of the table.
pub fn reset_after_fork(own: Option<&CacheSlot>) {
    for slot in used_slots() {
        // A thread of the parent may have been in the middle of a change: its sequence must be even again.
        let writes = slot.writes.load(Ordering::Relaxed);
        slot.writes
            .store(writes.wrapping_add(writes & 1), Ordering::Relaxed);
        let region = slot.site_base.load(Ordering::Relaxed);
        if !region.is_null() {
            sys::discard(region, sites::region_bytes());
        }
        if !own.is_some_and(|own| core::ptr::eq(own, slot)) {
            slot.site_word
                .store(core::ptr::null_mut(), Ordering::Relaxed);
            slot.site_users.store(0, Ordering::Relaxed);
        }
        if slot.is_claimed() {
            slot.empty_now(false);
            if !own.is_some_and(|own| core::ptr::eq(own, slot)) {
                slot.release();
            }
        }
    }
}

/// Pages of emptied chunks to give back, a run of adjacent chunks at a time: one `madvise` per run instead of
/// one per 64 KiB chunk (a grown cache of 200 000 arcs is a hundred chunks).
struct Discard {
    start: *mut u8,
    len: usize,
}

impl Default for Discard {
    fn default() -> Self {
        Discard {
            start: core::ptr::null_mut(),
            len: 0,
        }
    }
}

impl Discard {
    /// Adds an emptied chunk, giving back the run so far first when the chunk does not continue it.
    fn add(&mut self, chunk: &[CacheEntry]) {
        let start = chunk.as_ptr().cast_mut().cast::<u8>();
        if self.len != 0 && self.start.wrapping_add(self.len) == start {
            self.len += core::mem::size_of_val(chunk);
            return;
        }
        self.finish();
        self.start = start;
        self.len = core::mem::size_of_val(chunk);
    }

    /// Gives the run so far back.
    fn finish(&mut self) {
        if self.len != 0 {
            sys::discard(self.start, self.len);
        }
        self.len = 0;
    }
}

/// Visits the index ranges of a mapping of `len` entries that may hold entries: the pages marked in `pages`
/// for the first mapping, else the chunks marked in `chunks`.
fn for_each_range_marked(
    len: usize,
    chunks: [u64; TOUCHED_WORDS],
    pages: u64,
    visit: impl FnMut(core::ops::Range<usize>),
) {
    if len == level_entries(0) {
        for_each_marked_in([pages], PAGE_ENTRIES, len, visit);
    } else {
        for_each_marked_in(chunks, CHUNK_ENTRIES, len, visit);
    }
}

/// Visits the index ranges (below `len`) of the runs of `unit` entries whose bits are set in `words` (bit i
/// of word w: run 64 w + i).
fn for_each_marked_in(
    words: impl IntoIterator<Item = u64>,
    unit: usize,
    len: usize,
    mut visit: impl FnMut(core::ops::Range<usize>),
) {
    for (word_index, mut bits) in words.into_iter().enumerate() {
        while bits != 0 {
            let start = (word_index * 64 + bits.trailing_zeros() as usize) * unit;
            bits &= bits - 1;
            if start < len {
                visit(start..(start + unit).min(len));
            }
        }
    }
}

/// Moves an entry's count into its counter as [`flush`] does, but keeps the entry: its running total stays, its
/// delta restarts from 0.
fn flush_kept(entry: &CacheEntry, lent: bool) {
    let tagged = entry.counter.load(Ordering::Relaxed);
    let count = if tagged & DELTA != 0 {
        entry.count.swap(0, Ordering::Relaxed)
    } else {
        entry.count.load(Ordering::Relaxed)
    };
    settle(tagged, count, lent);
}

/// Moves an entry's count into its counter (a running total is stored when larger, a delta added unless the
/// slot was `lent`) and empties the entry.
pub fn flush(entry: &CacheEntry, lent: bool) {
    let tagged = entry.counter.load(Ordering::Relaxed);
    let count = entry.count.load(Ordering::Relaxed);
    entry.set(0, 0, 0, 0);
    settle(tagged, count, lent);
}

/// Moves `count`, taken from an entry whose counter is `tagged`, into that counter: a running total is stored
/// when larger, a delta added unless the slot was `lent`.
fn settle(tagged: usize, count: u64, lent: bool) {
    match tagged_counter(tagged) {
        Some((counter, true)) if count != 0 && !lent => {
            counter.fetch_add(count, Ordering::Relaxed);
        }
        // Only this thread writes its own stripe (the dump may raise it, never above this total).
        Some((counter, false)) if count > counter.load(Ordering::Relaxed) => {
            counter.store(count, Ordering::Relaxed);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A walk of a first-level cache reads the pages that hold entries, not the rest of their chunks: a
    /// thread with a few arcs would fault in pages of zeros each time it is emptied or read by a dump.
    #[test]
    fn walks_of_a_first_level_cache_read_only_its_pages_in_use() {
        let slot = claim().expect("a cache slot");
        let entries = slot.entries();
        assert_eq!(entries.len(), level_entries(0));
        let used = [0, PAGE_ENTRIES * 3, PAGE_ENTRIES * 9 + 5];
        slot.begin_write();
        for index in used {
            entries[index].set(0x1000 + index, 0x2000, 0, 1);
            slot.touch(index);
        }
        slot.end_write();
        let mut seen = 0;
        slot.for_each_sampled_entry_in_use(level_entries(0), |_| seen += 1);
        assert_eq!(seen, used.len());
        let pages = level_entries(0) / PAGE_ENTRIES;
        let mut resident = vec![0u8; pages];
        assert!(sys::resident_pages(
            entries.as_ptr() as usize,
            level_bytes(0),
            &mut resident
        ));
        let read = resident.iter().filter(|&&page| page & 1 != 0).count();
        assert_eq!(read, used.len(), "pages of the first mapping resident");
        slot.empty_now(false);
        slot.release();
    }

    /// Calls that walk a first-level cache in address order, looking at each set before making its entry as
    /// the stub does, find the pages ahead resident: one fault per page, not a read fault and a write fault.
    #[test]
    fn a_walk_of_a_first_level_cache_in_address_order_takes_one_fault_per_page() {
        let slot = claim().expect("a cache slot");
        let entries = slot.entries();
        let pages = 24;
        let before = sys::thread_minor_faults();
        slot.begin_write();
        for page in 0..pages {
            let index = page * PAGE_ENTRIES + 3;
            assert!(!entries[index].in_use(), "a fresh page holds no entry");
            entries[index].set(0x1000 + index, 0x2000, 0, 1);
            slot.touch(index);
        }
        slot.end_write();
        // The kernel counts a page made resident ahead as a fault too, but takes no trap for it.
        let faults = sys::thread_minor_faults() - before;
        assert!(
            faults <= (pages + POPULATE_AHEAD + 2) as u64,
            "{faults} page faults for {pages} pages walked in order"
        );
        let mut resident = vec![0u8; level_entries(0) / PAGE_ENTRIES];
        assert!(sys::resident_pages(
            entries.as_ptr() as usize,
            level_bytes(0),
            &mut resident
        ));
        let ahead = resident[pages..]
            .iter()
            .take_while(|&&page| page & 1 != 0)
            .count();
        assert!(
            (1..=POPULATE_AHEAD).contains(&ahead),
            "{ahead} pages past the walk resident"
        );
        slot.empty_now(false);
        slot.release();
    }
}
