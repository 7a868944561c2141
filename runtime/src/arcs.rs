//! Call-graph arc storage: one lock-free [`ArcTable`] per profiled module load instance.
//!
//! An arc is (caller key, caller address, callee address) → exact 64-bit count, all addresses
//! module-relative (link-time). The table is written from `mcount` on every call of an
//! instrumented function, from any thread and from signal handlers that interrupt `mcount`, so:
//!
//! - **No locks.** A slot is claimed with one compare-and-swap of its tag (EMPTY → BUSY, with bits of
//!   the key's hash), its key words are written, then the tag is published with a release store. A
//!   reader that meets a BUSY slot skips it and never waits, so a signal handler that interrupts an
//!   insertion cannot deadlock. The price is that two racing insertions of the same arc may occupy
//!   two slots. A lookup that skips a BUSY slot with its own key's hash bits, and an insertion that
//!   saw the levels change under it, mark the table, and [`ArcTable::for_each`] of a marked table
//!   sums duplicates, so counts stay exact (see [`ArcTable::counter`]).
//! - **No shared cache line written on every call.** Each slot has [`STRIPES`] counters that live in
//!   separate arrays (separate cache lines); a thread adds to the stripe of its own thread number
//!   ([`take_stripe`]: each of up to 63 live threads owns one, given back when it exits), so two
//!   threads calling the same function do not bounce one line between cores. The count of an arc is
//!   the sum of its stripes (only the stripes ever handed out are read). Threads that share a
//!   stripe (the 64th live thread on) still count exactly (atomic add); a thread that owns its
//!   stripe may store into it with plain stores: `mcount` keeps an arc's running total for the
//!   thread in its call cache and stores it here (the dump may raise it with `fetch_max`, never
//!   above a total the thread has had).
//! - **Bounded growth without locks.** Storage is a chain of up to [`MAX_LEVELS`] open-addressing
//!   levels, level *i* having `FIRST_LEVEL_SLOTS << i` slots, each level one anonymous `mmap`. A level
//!   accepts new arcs until it is half full; then the next one is mapped (the thread that wins the
//!   compare-and-swap of the level pointer installs it, a loser unmaps its own). A slot costs 528
//!   bytes of address space (16 of key, 8 per stripe), of which only the keys and the counters of
//!   the stripes in use, handed out densely, become resident (with the rest of their 2 MiB where huge
//!   pages back the level). New arcs land on keys all over a level, so the keys of every level but
//!   the first are made resident when it is mapped (one system call; from the fourth level on, whose
//!   keys take 512 KiB, the whole mapping is a multiple of 2 MiB backed by transparent huge pages,
//!   counters included) instead of a read fault and a write fault per page. Nothing is mapped before
//!   a module's first arc, the first level is 2.2 MiB of address space, and each level is mapped
//!   only when the previous ones hold about as many arcs as it has slots, whatever the size of the
//!   module's text. The bound is [`MAX_ARCS`] = 8 386 560 distinct arcs per module load instance;
//!   every call of an arc that does not fit, or whose caller or callee address does not fit in 32
//!   bits (a key keeps 32 of each; a module's link-time addresses do fit), is counted in
//!   [`ArcTable::dropped`] and ends up in the dump, never lost silently.
//! - **New arcs cost one level's probe.** From the third level on, a Bloom filter of the table's
//!   keys lets the lookup of an arc that is not there skip the older levels.
//! - **New arcs of neighbouring call sites are neighbours.** A key's probe sequence starts at slots
//!   its call site's stretch of code picks, then goes on at slots its hash picks; the filter's word
//!   follows the call site too. A program makes its arcs' first calls in roughly the order of its
//!   code, so inserting them walks the table's memory instead of missing the cache at each one.

use core::cell::Cell;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use mslprof_format::LinkAddress;

use crate::sys;

/// Counter stripes per arc. A counting thread takes a free stripe of its own (returned when it
/// exits); while all of the first `STRIPES - 1` are taken, further threads share the last one,
/// [`SHARED_STRIPE`], with atomic adds.
pub const STRIPES: usize = 64;
/// The stripe threads without one of their own share.
pub const SHARED_STRIPE: usize = STRIPES - 1;

/// Stripes no live thread owns (bit i: stripe i), all but the shared one at first.
static FREE_STRIPES: AtomicU64 = AtomicU64::new((1 << SHARED_STRIPE) - 1);

/// A stripe for a thread that starts counting: one no other live thread owns, or
/// [`SHARED_STRIPE`] when there is none. Lock-free and async-signal-safe.
pub fn take_stripe() -> usize {
    let mut free = FREE_STRIPES.load(Ordering::Relaxed);
    loop {
        if free == 0 {
            return SHARED_STRIPE;
        }
        let stripe = free.trailing_zeros() as usize;
        match FREE_STRIPES.compare_exchange_weak(
            free,
            free & !(1 << stripe),
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => return stripe,
            Err(now) => free = now,
        }
    }
}

/// Gives an exiting thread's stripe back (its counts stay; the next owner adds to them). The thread
/// must not add to the stripe with plain adds afterwards.
pub fn release_stripe(stripe: usize) {
    if stripe < SHARED_STRIPE {
        FREE_STRIPES.fetch_or(1 << stripe, Ordering::Release);
    }
}

/// In a forked child, the only thread: every stripe but `own` (its own, if it has one) is free again.
pub fn reset_stripes_after_fork(own: Option<usize>) {
    let own_bit = own.filter(|&s| s < SHARED_STRIPE).map_or(0, |s| 1u64 << s);
    FREE_STRIPES.store(((1 << SHARED_STRIPE) - 1) & !own_bit, Ordering::Relaxed);
}
/// Slots of the first level (a power of two).
pub const FIRST_LEVEL_SLOTS: usize = 1 << 12;
/// Number of levels; level `i` has `FIRST_LEVEL_SLOTS << i` slots.
pub const MAX_LEVELS: usize = 12;
/// Distinct arcs one table can hold: every level is filled to half its slots (8 386 560).
pub const MAX_ARCS: usize = (FIRST_LEVEL_SLOTS / 2) * ((1 << MAX_LEVELS) - 1);

const _: () = assert!(MAX_ARCS == 8_386_560);

/// The level whose mapping also maps the table's key filter (tables of more than about 6 000 arcs):
/// from there on a lookup of a new arc probes only the newest level, not every level.
const FILTER_FROM_LEVEL: usize = 2;
/// 64-bit words of the key filter (2 MiB: 16 bits per arc at the largest table size).
const FILTER_WORDS: usize = 1 << 18;

/// A key's probe sequence in a level: first [`NEAR_PROBE`] slots from a place its call site picks
/// (neighbouring call sites, neighbouring slots), then [`MAX_PROBE`] from a place its hash picks;
/// past both the level counts as full for the key.
const NEAR_PROBE: usize = 32;
const MAX_PROBE: usize = 64;
/// Bytes of a caller's code whose call sites start their probe sequences in one run of
/// [`NEAR_PROBE`] slots (a call is 5 bytes or more).
const SITE_STRETCH_BYTES: u64 = 64;

const TAG_EMPTY: u64 = 0;
/// The tag of a claimed slot whose key is not published yet; the word's other bits are the key's hash's
/// ([`busy_word`]).
const TAG_BUSY: u64 = 1;

/// Keys of a level from which its mapping is a multiple of 2 MiB (the kernel then aligns it) backed by
/// transparent huge pages: one fault and 2 MiB cleared instead of a fault per 4 KiB page.
const HUGE_KEYS_FROM: usize = 512 << 10;
const HUGE_PAGE_BYTES: usize = 2 << 20;
/// Pages of a stripe's counters that [`Level::populate_counters_ahead`] makes resident at once.
const COUNTER_PAGES_AHEAD: usize = 4;

/// One slot's key, in two words. `word` is EMPTY, BUSY, or, once the key is published, its tag
/// (`caller_key + 2`) in the low [`TAG_BITS`] bits and above them the index of the arc's counters in
/// the level's stripe arrays: counters are handed out densely in order of insertion, so arcs first
/// used together (a loop's, a phase's) have their counters side by side instead of spread over the
/// whole array like the slots. `addresses` is the caller's link-time address in its low 32 bits and
/// the callee's in its high 32 (a module's link-time addresses fit; [`ArcTable::counter`] drops an
/// arc with a larger one). 16 bytes a slot: a level's keys take half the memory, and the page
/// faults, that four words took.
#[repr(C, align(16))]
struct KeySlot {
    word: AtomicU64,
    addresses: AtomicU64,
}

const KEY_SLOT_BYTES: usize = core::mem::size_of::<KeySlot>();

/// Bits of a published key's word that hold its tag (a caller key is 32 bits, plus 2).
const TAG_BITS: u32 = 33;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
// A counter index is below the slots of the largest level.
const _: () = assert!(((FIRST_LEVEL_SLOTS << (MAX_LEVELS - 1)) as u64) <= u64::MAX >> TAG_BITS);

/// The key word's tag: EMPTY, BUSY or `caller_key + 2`.
fn tag_of(word: u64) -> u64 {
    word & TAG_MASK
}

/// The word of a slot claimed for the key whose hash is `hash`: BUSY, and above the tag the hash's bits
/// there, so that another lookup of the same key can tell that it may be inserting it twice.
fn busy_word(hash: u64) -> u64 {
    TAG_BUSY | (hash & !TAG_MASK)
}

/// Whether a key word read as `found` is a slot claimed for a key with this hash ([`busy_word`]): maybe the
/// same key, being inserted by another lookup (another thread, or the code a signal handler interrupted).
fn busy_with(found: u64, hash: u64) -> bool {
    found == busy_word(hash)
}

/// Whether an arc's addresses fit a key's addresses word.
fn addresses_fit(caller_addr: u64, callee_addr: u64) -> bool {
    (caller_addr | callee_addr) >> 32 == 0
}

/// The addresses word of an arc whose addresses fit ([`addresses_fit`]).
fn packed_addresses(caller_addr: u64, callee_addr: u64) -> u64 {
    caller_addr | callee_addr << 32
}

/// The caller's and the callee's address in an addresses word ([`packed_addresses`]).
fn unpacked_addresses(addresses: u64) -> (u64, u64) {
    (addresses & u64::from(u32::MAX), addresses >> 32)
}

impl KeySlot {
    /// Whether this slot, whose word was read as `found`, holds the key (`tag`, `caller_addr`,
    /// `callee_addr`: addresses that fit). The addresses are published before the word (release), so
    /// a word read with acquire that is neither EMPTY nor BUSY makes them readable.
    fn holds(&self, found: u64, tag: u64, caller_addr: u64, callee_addr: u64) -> bool {
        tag_of(found) == tag
            && self.addresses.load(Ordering::Relaxed) == packed_addresses(caller_addr, callee_addr)
    }

    /// Publishes a claimed (BUSY) slot's key (addresses that fit) with its counter index.
    fn publish(&self, tag: u64, caller_addr: u64, callee_addr: u64, counter: usize) {
        self.addresses.store(
            packed_addresses(caller_addr, callee_addr),
            Ordering::Relaxed,
        );
        self.word
            .store(tag | (counter as u64) << TAG_BITS, Ordering::Release);
    }

    /// The index of the arc's counters (a published slot).
    fn counter_index(&self) -> usize {
        (self.word.load(Ordering::Relaxed) >> TAG_BITS) as usize
    }
}

/// One arc as the dump sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ArcRecord {
    /// Load instance of the call site's module, or `UNKNOWN_KEY`.
    pub caller_key: u32,
    /// Link-time address of the call site (return address) in the caller's module.
    pub caller_addr: LinkAddress,
    /// Link-time address of the instrumented function in the table's module.
    pub callee_addr: LinkAddress,
    /// Exact number of calls.
    pub count: u64,
}

/// The lock-free arc table of one module load instance; see the module documentation.
pub struct ArcTable {
    levels: [AtomicPtr<u8>; MAX_LEVELS],
    used: [AtomicUsize; MAX_LEVELS],
    /// Levels this table may map: [`MAX_LEVELS`], or fewer in tests of the bound.
    level_limit: usize,
    dropped: AtomicU64,
    /// Bit i set once a thread has been handed a counter of stripe i: the only stripes the dump sums.
    stripes_used: AtomicU64,
    /// A blocked Bloom filter of the keys in the table ([`FILTER_WORDS`] words, mapped with level
    /// [`FILTER_FROM_LEVEL`]; null before). "Absent" lets a lookup skip the older levels. It may
    /// wrongly say absent for a key being inserted concurrently: that lookup then inserts a duplicate,
    /// which the insertions' checks reveal ([`ArcTable::counter`]) and the dump merges.
    filter: AtomicPtr<AtomicU64>,
    /// The filter holds every key of the levels below [`FILTER_FROM_LEVEL`] but those whose insertion was
    /// still under way when it was filled (which marked the table): lookups may use it.
    filter_ready: AtomicBool,
    /// Set when two racing insertions may have put one arc in two slots: only then does
    /// [`ArcTable::for_each`] look for duplicates to sum (a probe of every level per arc).
    maybe_duplicates: AtomicBool,
    /// A bit per page of the first level's keys that a claim wrote: a walk reads those pages only, since
    /// the first level is left to fault in and reading its other pages would fault in pages of zeros (the
    /// other levels are made resident whole when mapped).
    first_level_pages: AtomicU64,
}

/// Key slots per 4 KiB page (a larger page only makes neighbouring bits of
/// [`ArcTable::first_level_pages`] describe one page).
const KEYS_PER_PAGE: usize = 4096 / KEY_SLOT_BYTES;
const _: () = assert!(FIRST_LEVEL_SLOTS / KEYS_PER_PAGE <= 64);

impl core::fmt::Debug for ArcTable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ArcTable")
            .field("len", &self.len())
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl Default for ArcTable {
    fn default() -> Self {
        Self::new()
    }
}

/// Geometry of level `index`: its slot count and the byte offsets of its parts in its mapping.
#[derive(Clone, Copy)]
struct Level<'table> {
    base: *mut u8,
    slots: usize,
    /// The table's [`ArcTable::first_level_pages`] for the first level; `None` for the others.
    claimed_pages: Option<&'table AtomicU64>,
}

impl<'table> Level<'table> {
    const fn slots_of(index: usize) -> usize {
        FIRST_LEVEL_SLOTS << index
    }

    /// Whether a level with `slots` slots is backed by transparent huge pages ([`HUGE_KEYS_FROM`]).
    const fn huge(slots: usize) -> bool {
        slots * KEY_SLOT_BYTES >= HUGE_KEYS_FROM
    }

    /// Bytes of the mapping of a level with `slots` slots: keys, then one counter array per stripe.
    const fn mapping_bytes(slots: usize) -> usize {
        let bytes = slots * KEY_SLOT_BYTES + STRIPES * slots * 8;
        if Self::huge(slots) {
            bytes.next_multiple_of(HUGE_PAGE_BYTES)
        } else {
            bytes
        }
    }

    /// The first level's marks of the pages of keys a claim wrote (`None` for the other levels), as they are
    /// now, for [`Level::unclaimed`].
    fn claimed_now(&self, order: Ordering) -> Option<u64> {
        self.claimed_pages.map(|pages| pages.load(order))
    }

    /// Whether `slot` lies on a page of keys that no claim had written when `claimed` was read.
    fn unclaimed(claimed: Option<u64>, slot: usize) -> bool {
        claimed.is_some_and(|pages| pages & (1 << (slot / KEYS_PER_PAGE)) == 0)
    }

    fn key(&self, index: usize) -> &'table KeySlot {
        // SAFETY: `base` is a live, zero-initialised mapping of `mapping_bytes(slots)` bytes, page
        // aligned, whose first `slots * KEY_SLOT_BYTES` bytes are the key slots; `index < slots`.
        // An all-zero KeySlot is valid (atomics of 0). Mappings are only unmapped by `Drop`, which
        // has exclusive access.
        unsafe { &*(self.base as *const KeySlot).add(index) }
    }

    /// The slots that are not EMPTY (claimed, published or not), in slot order: `(slot, word)`.
    fn claimed(self) -> impl Iterator<Item = (usize, u64)> + 'table {
        let claimed = self.claimed_now(Ordering::SeqCst);
        (0..self.slots).filter_map(move |slot| {
            if Self::unclaimed(claimed, slot) {
                return None;
            }
            let word = self.key(slot).word.load(Ordering::SeqCst);
            (word != TAG_EMPTY).then_some((slot, word))
        })
    }

    /// The slots whose keys are published, in slot order: `(slot, tag, caller_addr, callee_addr)`.
    /// BUSY and EMPTY slots are skipped.
    fn published(self) -> impl Iterator<Item = (usize, u64, u64, u64)> + 'table {
        self.claimed().filter_map(move |(slot, word)| {
            let tag = tag_of(word);
            (tag >= 2).then(|| {
                let (caller_addr, callee_addr) =
                    unpacked_addresses(self.key(slot).addresses.load(Ordering::Relaxed));
                (slot, tag, caller_addr, callee_addr)
            })
        })
    }

    /// The slots a key's lookup visits, in order, until it finds the key or an EMPTY slot (slots are
    /// never emptied, so a key is always before the first EMPTY slot of its sequence). The first
    /// [`NEAR_PROBE`] follow the call site: each [`SITE_STRETCH_BYTES`] of a module's code has a run of
    /// slots somewhere in the level, and a call site starts at its offset in that stretch, halved. A
    /// program makes the first calls of its arcs in the order its code runs, mostly address order, so
    /// neighbouring new arcs land in neighbouring slots instead of a cache miss each. The other
    /// [`MAX_PROBE`] follow the whole key's hash: a call site with more callees than a run holds (an
    /// indirect call), or a run that other stretches filled, goes on there.
    fn probe_sequence(
        &self,
        hash: u64,
        tag: u64,
        caller_addr: u64,
    ) -> impl Iterator<Item = usize> + use<'table> {
        let mask = self.slots - 1;
        // The stretch's run: consecutive stretches of a module's code, consecutive runs (from an
        // offset the caller's module picks), so that new arcs made in address order walk the level's
        // keys as one stream the hardware prefetches.
        let run_mask = (self.slots / NEAR_PROBE - 1) as u64;
        let stretch = (caller_addr / SITE_STRETCH_BYTES)
            .wrapping_add(tag.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        let run = (stretch & run_mask) as usize;
        let near = run * NEAR_PROBE + (caller_addr % SITE_STRETCH_BYTES / 2) as usize;
        let far = hash as usize;
        // The far run may overlap the near one: a slot is visited once (`merged_count` sums what it
        // visits).
        let in_near_run = move |slot: usize| slot.wrapping_sub(near) & mask < NEAR_PROBE;
        (0..NEAR_PROBE)
            .map(move |step| near.wrapping_add(step) & mask)
            .chain(
                (0..MAX_PROBE)
                    .map(move |step| far.wrapping_add(step) & mask)
                    .filter(move |&slot| !in_near_run(slot)),
            )
    }

    /// Counter `index` (a slot's `counter`, below `slots`) of stripe `stripe`.
    fn counter(&self, stripe: usize, index: usize) -> &'table AtomicU64 {
        let index = index & (self.slots - 1);
        let offset = self.slots * KEY_SLOT_BYTES + (stripe * self.slots + index) * 8;
        // SAFETY: as in `key`; `offset` is inside the mapping (the index is masked below `slots`)
        // and 8-byte aligned, and zeroed memory is a valid AtomicU64.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    /// Called with a new arc's counter `index` in the stripe of the thread that made it: when `index` is the first
    /// counter of a page of the stripe (but the first level's first, which most tables never leave), that page
    /// and the next ones, [`COUNTER_PAGES_AHEAD`] in all, are made resident in one system call. The thread reads
    /// a new arc's counter (the start of its running total) before it writes it: on a fresh page, a fault for
    /// the zero page and a second one for the write. Levels backed by huge pages fault once per 2 MiB and are
    /// left alone.
    fn populate_counters_ahead(&self, stripe: usize, index: usize) {
        const PER_PAGE: usize = 4096 / 8;
        if !index.is_multiple_of(PER_PAGE)
            || (index == 0 && self.claimed_pages.is_some())
            || index >= self.slots
            || Self::huge(self.slots)
        {
            return;
        }
        let end = (index + COUNTER_PAGES_AHEAD * PER_PAGE).min(self.slots);
        // Page-aligned: the keys and each stripe's array are multiples of 4 KiB (a level has at least
        // FIRST_LEVEL_SLOTS slots), and `index` is a multiple of PER_PAGE.
        let first = self.counter(stripe, index) as *const AtomicU64 as *mut u8;
        sys::populate(first, (end - index) * 8);
    }

    /// The counter of the arc in published slot `slot`, stripe `stripe`.
    fn count(&self, stripe: usize, slot: usize) -> &'table AtomicU64 {
        self.counter(stripe, self.key(slot).counter_index())
    }

    /// The sum of the arc's counters in the stripes of `stripes` (a bit mask).
    fn total(&self, slot: usize, mut stripes: u64) -> u64 {
        let index = self.key(slot).counter_index();
        let mut total = 0u64;
        while stripes != 0 {
            let stripe = stripes.trailing_zeros() as usize;
            stripes &= stripes - 1;
            total = total.wrapping_add(self.counter(stripe, index).load(Ordering::Relaxed));
        }
        total
    }
}

/// Where a key is, or where it could go, in one level.
enum Probe {
    Found(usize),
    /// Not in this level; the first EMPTY slot of its probe sequence.
    Vacant(usize),
    /// Not found before the probe limit; nothing can be inserted here.
    Exhausted,
}

fn hash(caller_key: u32, caller_addr: u64, callee_addr: u64) -> u64 {
    let mixed = callee_addr
        ^ caller_addr.rotate_left(29)
        ^ (u64::from(caller_key)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    let mixed = mixed.wrapping_mul(crate::FIBONACCI);
    mixed ^ (mixed >> 31)
}

thread_local! {
    /// This thread's counter stripe for [`ArcTable::record`], taken on first use (`u32::MAX` = not
    /// yet) and never returned.
    static THREAD_STRIPE: Cell<u32> = const { Cell::new(u32::MAX) };
}

/// The stripe of the calling thread for [`ArcTable::record`]. Const-initialised TLS: no allocation,
/// usable from a signal handler.
pub fn current_stripe() -> usize {
    let stripe = THREAD_STRIPE.with(|cell| {
        let current = cell.get();
        if current != u32::MAX {
            return current;
        }
        let assigned = take_stripe() as u32;
        cell.set(assigned);
        assigned
    });
    stripe as usize
}

impl ArcTable {
    /// An empty table; it maps no memory until the first arc is recorded.
    pub const fn new() -> Self {
        Self {
            levels: [const { AtomicPtr::new(ptr::null_mut()) }; MAX_LEVELS],
            used: [const { AtomicUsize::new(0) }; MAX_LEVELS],
            level_limit: MAX_LEVELS,
            dropped: AtomicU64::new(0),
            stripes_used: AtomicU64::new(0),
            filter: AtomicPtr::new(ptr::null_mut()),
            filter_ready: AtomicBool::new(false),
            maybe_duplicates: AtomicBool::new(false),
            first_level_pages: AtomicU64::new(0),
        }
    }

    fn level(&self, index: usize) -> Option<Level<'_>> {
        let base = self.levels[index].load(Ordering::Acquire);
        (!base.is_null()).then(|| self.level_at(index, base))
    }

    /// Level `index`, mapped at `base`.
    fn level_at(&self, index: usize, base: *mut u8) -> Level<'_> {
        Level {
            base,
            slots: Level::slots_of(index),
            claimed_pages: (index == 0).then_some(&self.first_level_pages),
        }
    }

    /// Counts one call of the arc in the calling thread's stripe.
    pub fn record(&self, caller_key: u32, caller_addr: LinkAddress, callee_addr: LinkAddress) {
        self.record_in_stripe(current_stripe(), caller_key, caller_addr, callee_addr);
    }

    /// Counts one call of the arc in counter stripe `stripe % STRIPES`. Lock-free and
    /// async-signal-safe; reentrant (a signal handler may call it while it runs on the same thread).
    /// Returns the counter it incremented (see [`Self::counter`]); `None` when the call was
    /// counted as dropped.
    pub fn record_in_stripe(
        &self,
        stripe: usize,
        caller_key: u32,
        caller_addr: LinkAddress,
        callee_addr: LinkAddress,
    ) -> Option<&AtomicU64> {
        let counter = self.counter(stripe, caller_key, caller_addr, callee_addr)?;
        counter.fetch_add(1, Ordering::Relaxed);
        Some(counter)
    }

    /// The arc's counter in stripe `stripe % STRIPES`, inserting the arc if it is new, without
    /// counting anything; the caller adds the call. The counter stays valid and belongs to this arc
    /// for the table's lifetime, until [`Self::reset`]. `None` when the table is full: that call is
    /// then counted as dropped here. Lock-free, async-signal-safe, reentrant.
    ///
    /// Two lookups of one arc that overlap in time (two threads, or a signal handler and the code it
    /// interrupted) may both insert it. Either both insert into one level, whose probe sequence for the
    /// key is the same for both: the one that comes second meets the first one's claimed slot, BUSY
    /// with the key's hash bits, and marks the table. Or they insert into two levels, and the newer
    /// level was mapped during the lookup of the one that inserts into the older: that one sees a
    /// newer level after its claim and marks the table; or the newer level was mapped by the other
    /// lookup itself, after its probe of the older one, and it probes the older one again after its
    /// claim. The claims, the level pointers, the filter's bits and the lookups' reads of them are
    /// sequentially consistent, so in each case one of the two sees the other.
    pub fn counter(
        &self,
        stripe: usize,
        caller_key: u32,
        caller_addr: LinkAddress,
        callee_addr: LinkAddress,
    ) -> Option<&AtomicU64> {
        let (LinkAddress(caller_addr), LinkAddress(callee_addr)) = (caller_addr, callee_addr);
        if !addresses_fit(caller_addr, callee_addr) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let stripe = stripe % STRIPES;
        let bit = 1u64 << stripe;
        if self.stripes_used.load(Ordering::Relaxed) & bit == 0 {
            self.stripes_used.fetch_or(bit, Ordering::Relaxed);
        }
        let tag = u64::from(caller_key) + 2;
        let hash = hash(caller_key, caller_addr, callee_addr);
        self.find_or_insert(stripe, hash, tag, caller_addr, callee_addr)
    }

    fn find_or_insert(
        &self,
        stripe: usize,
        hash: u64,
        tag: u64,
        caller_addr: u64,
        callee_addr: u64,
    ) -> Option<&AtomicU64> {
        // Newest (largest) level first: it holds the most arcs, so a lookup that finds its arc
        // probes fewer levels. Any occurrence of the key will do (`for_each` merges duplicates).
        // Only the newest level takes new arcs: its vacant slot is the candidate. The older levels
        // are probed only if the key filter does not rule the key out.
        let Some(newest) = self.newest_level_index() else {
            return self.insert(stripe, hash, tag, caller_addr, callee_addr, None, None);
        };
        let older_may_hold_it = self.filter_may_contain(tag, caller_addr, hash);
        let mut candidate = None;
        for index in (0..=newest).rev() {
            if index != newest && !older_may_hold_it {
                break;
            }
            let Some(level) = self.level(index) else {
                continue;
            };
            match self.probe(&level, hash, tag, caller_addr, callee_addr) {
                Probe::Found(slot) => return Some(level.count(stripe, slot)),
                Probe::Vacant(slot) if index == newest => candidate = Some((index, level, slot)),
                Probe::Vacant(_) | Probe::Exhausted => {}
            }
        }
        self.insert(
            stripe,
            hash,
            tag,
            caller_addr,
            callee_addr,
            Some(newest),
            candidate,
        )
    }

    /// The key filter's word and bits for a key. The word follows the call site: one cache line of
    /// words per 16 bytes of the caller's code (the module's key mixed in), a word of that line and
    /// two bits from the hash's high bits (the slot index uses the low ones). A program's first calls
    /// of its arcs come in the order its code runs, mostly its address order, so the filter is walked
    /// a line at a time instead of missing the cache on every new arc; the callees of one call site
    /// spread over its line's eight words.
    fn filter_position(tag: u64, caller_addr: u64, hash: u64) -> (usize, u64) {
        let line = (caller_addr >> 4) ^ tag.wrapping_mul(crate::FIBONACCI);
        let word = ((line << 3) | ((hash >> 40) & 7)) as usize & (FILTER_WORDS - 1);
        let bits = (1u64 << ((hash >> 28) & 63)) | (1u64 << ((hash >> 34) & 63));
        (word, bits)
    }

    fn filter(&self) -> Option<&[AtomicU64]> {
        let base = self.filter.load(Ordering::SeqCst);
        // SAFETY: a non-null filter is a live zero-initialised mapping of FILTER_WORDS words (all-zero
        // AtomicU64s are valid), unmapped only by `Drop`, which has exclusive access.
        (!base.is_null()).then(|| unsafe { core::slice::from_raw_parts(base, FILTER_WORDS) })
    }

    /// False only when the filter holds the keys of the levels below [`FILTER_FROM_LEVEL`] and rules the key
    /// out of every level.
    fn filter_may_contain(&self, tag: u64, caller_addr: u64, hash: u64) -> bool {
        if !self.filter_ready.load(Ordering::SeqCst) {
            return true;
        }
        let Some(filter) = self.filter() else {
            return true;
        };
        let (word, bits) = Self::filter_position(tag, caller_addr, hash);
        filter[word].load(Ordering::SeqCst) & bits == bits
    }

    fn filter_add(filter: &[AtomicU64], tag: u64, caller_addr: u64, hash: u64) {
        let (word, bits) = Self::filter_position(tag, caller_addr, hash);
        if filter[word].load(Ordering::SeqCst) & bits != bits {
            filter[word].fetch_or(bits, Ordering::SeqCst);
        }
    }

    /// Maps the key filter (before level [`FILTER_FROM_LEVEL`]) and adds the keys of the levels below, then
    /// lets lookups use it. An insertion that read no filter claimed its slot before the filter was
    /// published, so this reads its key; a key still BUSY here may never be added, and a later lookup may
    /// then insert it again, so the table is marked.
    #[cold]
    fn install_filter(&self) {
        let bytes = FILTER_WORDS * 8;
        let Some(fresh) = sys::map_zeroed(bytes) else {
            return;
        };
        sys::prefer_huge_pages(fresh, bytes);
        sys::populate(fresh, bytes);
        if self
            .filter
            .compare_exchange(
                ptr::null_mut(),
                fresh.cast(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // SAFETY: `fresh` was mapped above with `bytes` bytes and was never published.
            unsafe { sys::unmap(fresh, bytes) };
            return;
        }
        let Some(filter) = self.filter() else {
            return;
        };
        for index in 0..FILTER_FROM_LEVEL {
            let Some(level) = self.level(index) else {
                break;
            };
            for (slot, word) in level.claimed() {
                let tag = tag_of(word);
                if tag == TAG_BUSY {
                    self.note_race();
                    continue;
                }
                let (caller_addr, callee_addr) =
                    unpacked_addresses(level.key(slot).addresses.load(Ordering::Relaxed));
                let hash = hash((tag - 2) as u32, caller_addr, callee_addr);
                Self::filter_add(filter, tag, caller_addr, hash);
            }
        }
        self.filter_ready.store(true, Ordering::SeqCst);
    }

    /// Slow path: the arc is in no level. Claims a slot in the newest level, or maps the next one.
    /// `newest_at_lookup` is the newest level when the lookup began (`None`: there was none).
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn insert<'table>(
        &'table self,
        stripe: usize,
        hash: u64,
        tag: u64,
        caller_addr: u64,
        callee_addr: u64,
        newest_at_lookup: Option<usize>,
        mut candidate: Option<(usize, Level<'table>, usize)>,
    ) -> Option<&'table AtomicU64> {
        let mut level_index = match candidate {
            Some((index, _, _)) => index,
            None => self.newest_level_index().map_or(0, |index| index + 1),
        };
        loop {
            if level_index >= self.level_limit {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            let level = match candidate.take() {
                Some((_, level, _)) => level,
                None => match self
                    .level(level_index)
                    .or_else(|| self.map_level(level_index))
                {
                    Some(level) => level,
                    None => {
                        self.dropped.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                },
            };
            // A level takes new arcs until half full, so probe sequences stay short.
            let used = &self.used[level_index];
            if used.load(Ordering::Relaxed) < level.slots / 2
                && let Some((slot, fresh)) =
                    self.claim(&level, used, hash, tag, caller_addr, callee_addr)
            {
                if fresh {
                    if let Some(filter) = self.filter() {
                        Self::filter_add(filter, tag, caller_addr, hash);
                    }
                    self.note_if_raced(
                        newest_at_lookup,
                        level_index,
                        hash,
                        tag,
                        caller_addr,
                        callee_addr,
                    );
                    level.populate_counters_ahead(stripe, level.key(slot).counter_index());
                }
                return Some(level.count(stripe, slot));
            }
            level_index += 1;
        }
    }

    /// After publishing a new key in level `inserted` (see [`Self::counter`]): marks the table when a
    /// level newer than `inserted` exists now (a lookup of the arc that began since may have probed only
    /// that one), and when the lookup began with an older newest level, probes the levels from that one
    /// up to `inserted` again (another lookup may have inserted the arc there meanwhile).
    fn note_if_raced(
        &self,
        newest_at_lookup: Option<usize>,
        inserted: usize,
        hash: u64,
        tag: u64,
        caller_addr: u64,
        callee_addr: u64,
    ) {
        if self.newest_level_index() > Some(inserted) {
            self.note_race();
            return;
        }
        for index in newest_at_lookup.unwrap_or(0)..inserted {
            if let Some(level) = self.level(index)
                && matches!(
                    self.probe(&level, hash, tag, caller_addr, callee_addr),
                    Probe::Found(_)
                )
            {
                self.note_race();
            }
        }
    }

    /// Two slots may hold one arc: [`Self::for_each`] must merge.
    fn note_race(&self) {
        self.maybe_duplicates.store(true, Ordering::Relaxed);
    }

    fn newest_level_index(&self) -> Option<usize> {
        (0..MAX_LEVELS)
            .rev()
            .find(|&index| !self.levels[index].load(Ordering::SeqCst).is_null())
    }

    /// Maps level `index` (all lower levels exist). Returns the installed level, whoever mapped it.
    fn map_level(&self, index: usize) -> Option<Level<'_>> {
        let slots = Level::slots_of(index);
        let bytes = Level::mapping_bytes(slots);
        let fresh = sys::map_zeroed(bytes)?;
        // Keys land in runs scattered over the level (by call site, then by hash): a level's arcs
        // reach all its key pages long before it is half full. The first level may hold a handful
        // of arcs and is left to fault in.
        let key_bytes = slots * KEY_SLOT_BYTES;
        if Level::huge(slots) {
            sys::prefer_huge_pages(fresh, bytes);
        }
        if index > 0 {
            sys::populate(fresh, key_bytes);
        }
        // The filter exists before the level does, so that every key claimed in it reads the filter.
        if index == FILTER_FROM_LEVEL {
            self.install_filter();
        }
        match self.levels[index].compare_exchange(
            ptr::null_mut(),
            fresh,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => Some(self.level_at(index, fresh)),
            Err(winner) => {
                // SAFETY: `fresh` was mapped above with `bytes` bytes and was never published.
                unsafe { sys::unmap(fresh, bytes) };
                Some(self.level_at(index, winner))
            }
        }
    }

    /// Number of occupied slots: an upper bound of the distinct arcs [`Self::for_each`] yields
    /// (racing insertions of one arc may occupy two slots, which `for_each` merges).
    pub fn len(&self) -> usize {
        self.used
            .iter()
            .map(|used| used.load(Ordering::Relaxed))
            .sum()
    }

    /// True when no arc has been recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls that could not be recorded because the table was full (or memory could not be mapped).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Adds `calls` to the dropped counter (used by `mcount` for calls it could not attribute).
    pub fn add_dropped(&self, calls: u64) {
        self.dropped.fetch_add(calls, Ordering::Relaxed);
    }

    /// Calls `visit` once per distinct arc with a non-zero count, duplicates summed. Allocates
    /// nothing. Each count is read once, so threads still running while the dump is written make
    /// it a snapshot of some moment during the walk, never a torn value.
    pub fn for_each(&self, mut visit: impl FnMut(ArcRecord)) {
        let merge = self.maybe_duplicates.load(Ordering::Relaxed);
        let stripes = self.stripes_used.load(Ordering::Relaxed);
        for index in 0..MAX_LEVELS {
            let Some(level) = self.level(index) else {
                break;
            };
            for (slot, tag, caller_addr, callee_addr) in level.published() {
                let count = if merge {
                    self.merged_count(index, slot, tag, caller_addr, callee_addr, stripes)
                } else {
                    Some(level.total(slot, stripes))
                };
                if let Some(count) = count
                    && count != 0
                {
                    visit(ArcRecord {
                        caller_key: (tag - 2) as u32,
                        caller_addr: LinkAddress(caller_addr),
                        callee_addr: LinkAddress(callee_addr),
                        count,
                    });
                }
            }
        }
    }

    /// If (`level_index`, `slot`) is the first occurrence of its key in lookup order, the sum of the
    /// counts of every occurrence; `None` for a later duplicate.
    fn merged_count(
        &self,
        level_index: usize,
        slot: usize,
        tag: u64,
        caller_addr: u64,
        callee_addr: u64,
        stripes: u64,
    ) -> Option<u64> {
        let hash = hash((tag - 2) as u32, caller_addr, callee_addr);
        let mut first = None;
        let mut total = 0u64;
        for index in 0..MAX_LEVELS {
            let Some(level) = self.level(index) else {
                break;
            };
            for probe_slot in level.probe_sequence(hash, tag, caller_addr) {
                let key = level.key(probe_slot);
                let probe_tag = key.word.load(Ordering::Acquire);
                if probe_tag == TAG_EMPTY {
                    break;
                }
                if key.holds(probe_tag, tag, caller_addr, callee_addr) {
                    first.get_or_insert((index, probe_slot));
                    total = total.wrapping_add(level.total(probe_slot, stripes));
                }
            }
        }
        (first == Some((level_index, slot))).then_some(total)
    }

    /// Forgets every arc and the dropped count (in a forked child, before it runs on). Only valid
    /// while no other thread records (after `fork` there is one thread); the pages go back to the
    /// kernel and are zero when touched again.
    pub fn reset(&self) {
        for index in 0..MAX_LEVELS {
            let Some(level) = self.level(index) else {
                break;
            };
            sys::discard(level.base, Level::mapping_bytes(level.slots));
            self.used[index].store(0, Ordering::Relaxed);
        }
        self.dropped.store(0, Ordering::Relaxed);
        let filter = self.filter.load(Ordering::Acquire);
        if !filter.is_null() {
            sys::discard(filter.cast(), FILTER_WORDS * 8);
        }
        self.maybe_duplicates.store(false, Ordering::Relaxed);
        self.stripes_used.store(0, Ordering::Relaxed);
        self.first_level_pages.store(0, Ordering::Relaxed);
    }
}

impl ArcTable {
    /// Looks the key up in one level. In the first level a slot on a page no claim has written is EMPTY
    /// without being read: reading it would fault in a page of zeros that the claim then faults again to
    /// write. A claim on another thread that this misses only sends the lookup to [`Self::claim`], which
    /// reads the slots themselves. A BUSY slot with the key's hash bits marks the table.
    fn probe(
        &self,
        level: &Level,
        hash: u64,
        tag: u64,
        caller_addr: u64,
        callee_addr: u64,
    ) -> Probe {
        let claimed = level.claimed_now(Ordering::SeqCst);
        for slot in level.probe_sequence(hash, tag, caller_addr) {
            if Level::unclaimed(claimed, slot) {
                return Probe::Vacant(slot);
            }
            let key = level.key(slot);
            let probe_tag = key.word.load(Ordering::SeqCst);
            if probe_tag == TAG_EMPTY {
                return Probe::Vacant(slot);
            }
            if key.holds(probe_tag, tag, caller_addr, callee_addr) {
                return Probe::Found(slot);
            }
            if busy_with(probe_tag, hash) {
                self.note_race();
            }
        }
        Probe::Exhausted
    }

    /// Finds the key or claims an EMPTY slot for it in one level, or `None` when the probe limit is
    /// hit. A claimed slot gets the next counter index of the level (`used`, the number of claimed
    /// slots: below `slots`, as every claim takes a distinct EMPTY slot). A BUSY slot with the key's hash
    /// bits marks the table.
    fn claim(
        &self,
        level: &Level,
        used: &AtomicUsize,
        hash: u64,
        tag: u64,
        caller_addr: u64,
        callee_addr: u64,
    ) -> Option<(usize, bool)> {
        for slot in level.probe_sequence(hash, tag, caller_addr) {
            let key = level.key(slot);
            match key.word.compare_exchange(
                TAG_EMPTY,
                busy_word(hash),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    if let Some(pages) = level.claimed_pages {
                        pages.fetch_or(1 << (slot / KEYS_PER_PAGE), Ordering::SeqCst);
                    }
                    let counter = used.fetch_add(1, Ordering::Relaxed);
                    key.publish(tag, caller_addr, callee_addr, counter);
                    return Some((slot, true));
                }
                Err(found) => {
                    if key.holds(found, tag, caller_addr, callee_addr) {
                        return Some((slot, false));
                    }
                    if busy_with(found, hash) {
                        self.note_race();
                    }
                }
            }
        }
        None
    }
}

impl Drop for ArcTable {
    fn drop(&mut self) {
        let filter = *self.filter.get_mut();
        if !filter.is_null() {
            // SAFETY: the filter was mapped by `install_filter` with exactly this size; `&mut self`
            // proves nothing else refers to it.
            unsafe { sys::unmap(filter.cast(), FILTER_WORDS * 8) };
        }
        for index in 0..MAX_LEVELS {
            let base = *self.levels[index].get_mut();
            if !base.is_null() {
                // SAFETY: `base` was mapped by `map_level` with exactly this size, and `&mut self`
                // proves no other reference to the table (hence to the mapping) exists.
                unsafe { sys::unmap(base, Level::mapping_bytes(Level::slots_of(index))) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Runs `work(thread)` on `threads` threads at once.
    fn on_threads(threads: u64, work: impl Fn(u64) + Sync) {
        std::thread::scope(|scope| {
            for thread in 0..threads {
                let work = &work;
                scope.spawn(move || work(thread));
            }
        });
    }

    fn snapshot(table: &ArcTable) -> BTreeMap<(u32, u64, u64), u64> {
        let mut arcs = BTreeMap::new();
        table.for_each(|arc| {
            let previous = arcs.insert(
                (arc.caller_key, arc.caller_addr.0, arc.callee_addr.0),
                arc.count,
            );
            assert!(previous.is_none(), "for_each yielded {arc:?} twice");
        });
        arcs
    }

    #[test]
    fn empty_table_maps_nothing_and_yields_nothing() {
        let table = ArcTable::new();
        assert_eq!(table.len(), 0);
        assert!(table.level(0).is_none());
        assert!(snapshot(&table).is_empty());
    }

    #[test]
    fn counts_each_arc_exactly() {
        let table = ArcTable::new();
        for repeat in 0..5u64 {
            for arc in 0..100u64 {
                for _ in 0..=arc {
                    table.record(7, LinkAddress(0x1000 + arc), LinkAddress(0x2000 + arc % 3));
                }
            }
            let arcs = snapshot(&table);
            assert_eq!(arcs.len(), 100);
            for arc in 0..100u64 {
                assert_eq!(
                    arcs[&(7, 0x1000 + arc, 0x2000 + arc % 3)],
                    (arc + 1) * (repeat + 1)
                );
            }
        }
        assert_eq!(table.len(), 100);
        assert_eq!(table.dropped(), 0);
    }

    #[test]
    fn keys_distinguish_caller_module() {
        let table = ArcTable::new();
        table.record(1, LinkAddress(0x10), LinkAddress(0x20));
        table.record(2, LinkAddress(0x10), LinkAddress(0x20));
        table.record(u32::MAX, LinkAddress(0), LinkAddress(0x20));
        table.record(u32::MAX, LinkAddress(0), LinkAddress(0x20));
        let arcs = snapshot(&table);
        assert_eq!(arcs[&(1, 0x10, 0x20)], 1);
        assert_eq!(arcs[&(2, 0x10, 0x20)], 1);
        assert_eq!(arcs[&(u32::MAX, 0, 0x20)], 2);
    }

    #[test]
    fn grows_through_levels_then_counts_overflow_as_dropped() {
        // The bound of a table of 9 levels (1 046 528 arcs): the mechanism is the same at 12.
        const LEVELS: usize = 9;
        const MAX_ARCS: usize = (FIRST_LEVEL_SLOTS / 2) * ((1 << LEVELS) - 1);
        let mut table = ArcTable::new();
        table.level_limit = LEVELS;
        let distinct = MAX_ARCS as u64 + 1000;
        for arc in 0..distinct {
            table.record(3, LinkAddress(arc * 16), LinkAddress(0x40));
        }
        // Every arc once more: stored ones are found again, the others are dropped again.
        for arc in 0..distinct {
            table.record(3, LinkAddress(arc * 16), LinkAddress(0x40));
        }
        let arcs = snapshot(&table);
        let stored = arcs.len() as u64;
        assert!(
            stored > MAX_ARCS as u64 * 9 / 10,
            "only {stored} arcs stored"
        );
        assert!(arcs.values().all(|&count| count == 2));
        assert_eq!(stored * 2 + table.dropped(), distinct * 2);
        assert!(table.level(LEVELS - 1).is_some());
        assert!(table.level(LEVELS).is_none());
    }

    #[test]
    fn threads_count_exactly() {
        const THREADS: u64 = 8;
        const CALLS: u64 = 200_000;
        let table = ArcTable::new();
        on_threads(THREADS, |thread| {
            for call in 0..CALLS {
                // Shared arcs (every thread) and private ones; new arcs keep appearing while others
                // are counted, so insertions race with lookups.
                table.record(1, LinkAddress(call % 64), LinkAddress(0x100));
                table.record(2, LinkAddress(thread), LinkAddress(call % 3000));
            }
        });
        let arcs = snapshot(&table);
        let shared: u64 = arcs
            .iter()
            .filter(|(key, _)| key.0 == 1)
            .map(|(_, count)| count)
            .sum();
        assert_eq!(shared, THREADS * CALLS);
        for call in 0..64 {
            assert_eq!(arcs[&(1, call, 0x100)], THREADS * CALLS / 64);
        }
        let private: u64 = arcs
            .iter()
            .filter(|(key, _)| key.0 == 2)
            .map(|(_, c)| c)
            .sum();
        assert_eq!(private, THREADS * CALLS);
        assert_eq!(table.dropped(), 0);
    }

    #[test]
    fn threads_inserting_the_same_new_arcs_through_level_growth_count_them_once_each() {
        // Every thread makes the same 60 000 new arcs in the same order, so that insertions of one arc
        // race, in one level and across the levels and the key filter mapped meanwhile: any twin left
        // unmarked makes `snapshot` fail ("yielded twice").
        const THREADS: u64 = 4;
        const ARCS: u64 = 60_000;
        for round in 0..4 {
            let table = ArcTable::new();
            on_threads(THREADS, |_| {
                for arc in 0..ARCS {
                    table.record(round, LinkAddress(arc * 5), LinkAddress(0x40 + arc % 11));
                }
            });
            let arcs = snapshot(&table);
            assert_eq!(arcs.len() as u64, ARCS);
            assert!(arcs.values().all(|&count| count == THREADS));
        }
    }

    #[test]
    fn an_arc_with_an_address_beyond_32_bits_is_counted_as_dropped() {
        let table = ArcTable::new();
        table.record(1, LinkAddress(0xffff_fff0), LinkAddress(0xffff_ff00));
        table.record(1, LinkAddress(1 << 32), LinkAddress(0x20));
        table.record(1, LinkAddress(0x10), LinkAddress(1 << 32));
        assert_eq!(table.dropped(), 2);
        let arcs = snapshot(&table);
        assert_eq!(arcs.len(), 1);
        assert_eq!(arcs.get(&(1, 0xffff_fff0, 0xffff_ff00)), Some(&1));
    }

    #[test]
    fn duplicate_slots_are_merged() {
        let table = ArcTable::new();
        table.record(9, LinkAddress(0x90), LinkAddress(0x20));
        assert!(!table.maybe_duplicates.load(Ordering::Relaxed));
        // Insertion A of the arc has claimed its home slot (BUSY, with the key's hash bits) but not
        // published it yet, when insertion B (another thread, or a signal handler) of the same arc
        // skips that slot and claims the next one: B marks the table.
        let level = table.level(0).unwrap();
        let tag = 1 + 2;
        let key_hash = hash(1, 0x10, 0x20);
        let mut sequence = level.probe_sequence(key_hash, tag, 0x10);
        let (home, duplicate) = (sequence.next().unwrap(), sequence.next().unwrap());
        level
            .key(home)
            .word
            .store(busy_word(key_hash), Ordering::Relaxed);
        table
            .first_level_pages
            .fetch_or(1 << (home / KEYS_PER_PAGE), Ordering::Relaxed);
        table.record(1, LinkAddress(0x10), LinkAddress(0x20));
        assert_eq!(level.total(duplicate, u64::MAX), 1);
        assert!(table.maybe_duplicates.load(Ordering::Relaxed));
        // A finishes as `claim` does, and counts 5 calls.
        let counter = table.used[0].fetch_add(1, Ordering::Relaxed);
        level.key(home).publish(tag, 0x10, 0x20, counter);
        level
            .count(current_stripe(), home)
            .fetch_add(5, Ordering::Relaxed);
        let arcs = snapshot(&table);
        assert_eq!(arcs.len(), 2);
        assert_eq!(arcs[&(1, 0x10, 0x20)], 6);
        // Recording again finds one of the occurrences.
        table.record(1, LinkAddress(0x10), LinkAddress(0x20));
        assert_eq!(snapshot(&table)[&(1, 0x10, 0x20)], 7);
    }

    #[test]
    fn a_slot_claimed_for_another_key_marks_nothing() {
        let table = ArcTable::new();
        table.record(9, LinkAddress(0x90), LinkAddress(0x20));
        let level = table.level(0).unwrap();
        let key_hash = hash(1, 0x10, 0x20);
        let home = level.probe_sequence(key_hash, 3, 0x10).next().unwrap();
        level
            .key(home)
            .word
            .store(busy_word(key_hash ^ (1 << 40)), Ordering::Relaxed);
        table
            .first_level_pages
            .fetch_or(1 << (home / KEYS_PER_PAGE), Ordering::Relaxed);
        table.record(1, LinkAddress(0x10), LinkAddress(0x20));
        assert!(!table.maybe_duplicates.load(Ordering::Relaxed));
        assert_eq!(snapshot(&table)[&(1, 0x10, 0x20)], 1);
    }

    #[test]
    fn an_insertion_that_meets_a_newer_level_or_moved_up_levels_checks_for_a_twin() {
        // A newer level exists after the insertion into level 0: a lookup that began since may have
        // probed only that one.
        let table = ArcTable::new();
        table.record(1, LinkAddress(0x10), LinkAddress(0x20));
        table.map_level(1).unwrap();
        table.note_if_raced(Some(0), 0, hash(1, 0x10, 0x20), 3, 0x10, 0x20);
        assert!(table.maybe_duplicates.load(Ordering::Relaxed));
        // The lookup began with level 0 newest and inserted into level 1 (level 0 was full): the arc
        // may have been inserted into level 0 meanwhile.
        let table = ArcTable::new();
        table.record(1, LinkAddress(0x10), LinkAddress(0x20));
        table.map_level(1).unwrap();
        table.note_if_raced(Some(0), 1, hash(1, 0x10, 0x20), 3, 0x10, 0x20);
        assert!(table.maybe_duplicates.load(Ordering::Relaxed));
        // Nothing of the kind: no mark.
        table.maybe_duplicates.store(false, Ordering::Relaxed);
        table.note_if_raced(Some(0), 1, hash(1, 0x18, 0x20), 3, 0x18, 0x20);
        assert!(!table.maybe_duplicates.load(Ordering::Relaxed));
        table.note_if_raced(Some(1), 1, hash(1, 0x10, 0x20), 3, 0x10, 0x20);
        assert!(!table.maybe_duplicates.load(Ordering::Relaxed));
    }

    #[test]
    fn arcs_of_the_oldest_levels_are_found_again_once_the_key_filter_exists() {
        let table = ArcTable::new();
        const ARCS: u64 = 40_000;
        for round in 0..3 {
            for arc in 0..ARCS {
                table.record(4, LinkAddress(arc * 8), LinkAddress(0x400 + arc % 7));
            }
            if round == 0 {
                assert!(
                    table.filter().is_some(),
                    "a table this large has a key filter"
                );
            }
        }
        // No duplicate slot was made: each arc was found again, wherever it lives.
        assert!(!table.maybe_duplicates.load(Ordering::Relaxed));
        assert_eq!(table.len(), ARCS as usize);
        let arcs = snapshot(&table);
        assert_eq!(arcs.len(), ARCS as usize);
        assert!(arcs.values().all(|&count| count == 3));
    }

    /// Placement near the call site must not cost capacity: dense call sites (a call every 5 bytes) fill
    /// the levels as scattered ones do, and an indirect call site with thousands of callees (far more
    /// than a run of near slots holds) keeps every one.
    #[test]
    fn dense_call_sites_and_a_site_with_thousands_of_callees_fit_like_scattered_ones() {
        let levels = |table: &ArcTable| {
            (0..MAX_LEVELS)
                .filter(|&i| table.level(i).is_some())
                .count()
        };
        let dense = ArcTable::new();
        let scattered = ArcTable::new();
        for site in 0..100_000u64 {
            dense.record(
                1,
                LinkAddress(0x1000 + site * 5),
                LinkAddress(0x40 + site % 2000 * 16),
            );
            let spread = hash(1, site, 0) >> 32;
            scattered.record(1, LinkAddress(spread), LinkAddress(0x40 + site % 2000 * 16));
        }
        assert_eq!((dense.len(), dense.dropped()), (100_000, 0));
        assert_eq!(levels(&dense), levels(&scattered));
        let fan_out = ArcTable::new();
        for round in 0..2 {
            for callee in 0..20_000u64 {
                fan_out.record(2, LinkAddress(0x777), LinkAddress(0x10_0000 + callee * 32));
            }
            assert_eq!(
                (fan_out.len(), fan_out.dropped()),
                (20_000, 0),
                "round {round}"
            );
        }
        assert!(snapshot(&fan_out).values().all(|&count| count == 2));
    }

    /// A probe sequence visits each slot once, even where its two runs overlap: the dump's merge sums
    /// every occurrence of a key it visits.
    #[test]
    fn probe_sequences_visit_each_slot_once() {
        let table = ArcTable::new();
        table.record(1, LinkAddress(0x10), LinkAddress(0x20));
        let level = table.level(0).unwrap();
        let mut overlapping = 0;
        for caller_addr in (0..200_000u64).step_by(5) {
            let hash = hash(1, caller_addr, 0x20);
            let slots: Vec<usize> = level.probe_sequence(hash, 3, caller_addr).collect();
            let mut unique = slots.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), slots.len(), "caller {caller_addr:#x}");
            overlapping += usize::from(slots.len() < NEAR_PROBE + MAX_PROBE);
        }
        assert!(
            overlapping > 0,
            "some sequences have overlapping runs to check"
        );
    }

    #[test]
    fn reset_forgets_everything() {
        let table = ArcTable::new();
        for arc in 0..5000 {
            table.record(1, LinkAddress(arc), LinkAddress(2));
        }
        table.reset();
        assert_eq!(table.len(), 0);
        assert!(snapshot(&table).is_empty());
        table.record(1, LinkAddress(1), LinkAddress(2));
        assert_eq!(snapshot(&table)[&(1, 1, 2)], 1);
    }

    /// Each level fills to its half before the next is mapped, however densely the call sites lie (one
    /// every 5 bytes is the densest code there is) and in however many modules: a program of 2 000 call
    /// sites fits the first level, and 30 000 arcs take as many levels as their number needs.
    #[test]
    fn levels_fill_to_half_before_the_next_is_mapped() {
        let levels_needed = |arcs: usize| {
            (1..=MAX_LEVELS)
                .find(|&n| (0..n).map(|i| Level::slots_of(i) / 2).sum::<usize>() >= arcs)
                .unwrap()
        };
        for (spacing, modules) in [(5u64, 1u64), (5, 2), (12, 1), (40, 3)] {
            for arcs in [2_000u64, 30_000] {
                let table = ArcTable::new();
                for i in 0..arcs {
                    let module = 1 + (i % modules) as u32;
                    let callee = 0x20_0000 + 16 * (i * 7919 % 2000);
                    table.record(
                        module,
                        LinkAddress(0x1200 + spacing * i),
                        LinkAddress(callee),
                    );
                }
                let what =
                    format!("{arcs} arcs, a call every {spacing} bytes, {modules} module(s)");
                assert_eq!((table.len(), table.dropped()), (arcs as usize, 0), "{what}");
                let newest = table.newest_level_index().unwrap();
                assert_eq!(newest + 1, levels_needed(arcs as usize), "{what}");
            }
        }
    }

    /// New arcs whose call sites lie on distinct pages of the first level's keys cost one page fault per page:
    /// a lookup does not read a page no claim has written (a read fault of a page of zeros, which the claim
    /// would fault again to write).
    #[test]
    fn new_arcs_in_the_first_level_fault_each_page_of_keys_once() {
        let table = ArcTable::new();
        table.record(1, LinkAddress(0x10), LinkAddress(0x20));
        // Consecutive 64-byte stretches of code have consecutive runs of 32 slots (1 KiB of keys): a call site
        // every 4 stretches lands on the next page.
        let pages = (FIRST_LEVEL_SLOTS / KEYS_PER_PAGE) as u64;
        let stride = SITE_STRETCH_BYTES * (KEYS_PER_PAGE / NEAR_PROBE) as u64;
        let before = sys::thread_minor_faults();
        for page in 1..pages {
            table.record(1, LinkAddress(0x10 + page * stride), LinkAddress(0x20));
        }
        let faults = sys::thread_minor_faults() - before;
        assert_eq!(table.len(), pages as usize);
        assert!(
            faults <= pages + 4,
            "{faults} page faults for {} new arcs on as many pages of keys",
            pages - 1
        );
    }

    /// The counters of new arcs are made resident a few pages ahead of use in the first level's stripe, once the
    /// first page is used up; a table of fewer arcs keeps a page of counters.
    #[test]
    fn new_arcs_find_their_counters_resident_past_the_first_page() {
        let table = ArcTable::new();
        let stripe = 5;
        let per_page = 4096 / 8;
        let new_arcs = |range: core::ops::Range<u64>| {
            for site in range {
                table.record_in_stripe(
                    stripe,
                    1,
                    LinkAddress(0x1000 + site * 5),
                    LinkAddress(0x2000),
                );
            }
        };
        let resident_counter_pages = |table: &ArcTable| {
            let level = table.level(0).unwrap();
            let start = level.counter(stripe, 0) as *const AtomicU64 as usize;
            let mut resident = vec![0u8; 8];
            assert!(sys::resident_pages(start, 8 * 4096, &mut resident));
            resident.iter().map(|&page| page & 1).collect::<Vec<u8>>()
        };
        new_arcs(0..per_page as u64);
        assert_eq!(resident_counter_pages(&table), [1, 0, 0, 0, 0, 0, 0, 0]);
        new_arcs(per_page as u64..per_page as u64 + 1);
        assert_eq!(table.len(), per_page + 1);
        assert_eq!(resident_counter_pages(&table), [1, 1, 1, 1, 1, 0, 0, 0]);
    }

    /// A walk of a table of a few arcs reads the pages of the first level's keys that hold them, not the
    /// rest: reading those would fault in pages of zeros at every dump, in every table.
    #[test]
    fn a_walk_reads_only_the_first_levels_pages_that_hold_keys() {
        let table = ArcTable::new();
        for site in 0..3u64 {
            table.record(1, LinkAddress(0x1000 + site * 5), LinkAddress(0x2000));
        }
        assert_eq!(snapshot(&table).len(), 3);
        let level = table.level(0).unwrap();
        let pages = FIRST_LEVEL_SLOTS / KEYS_PER_PAGE;
        let mut resident = vec![0u8; pages];
        assert!(sys::resident_pages(
            level.base as usize,
            FIRST_LEVEL_SLOTS * KEY_SLOT_BYTES,
            &mut resident
        ));
        let read = resident.iter().filter(|&&page| page & 1 != 0).count();
        assert!(read <= 3, "{read} of {pages} pages of keys resident");
    }
}
