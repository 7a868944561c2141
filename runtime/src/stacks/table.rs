//! The table of distinct call stacks: bounded, preallocated, lock-free, usable from signal handlers.
//!
//! One anonymous mapping, reserved at start-up (`MAP_NORESERVE`: only pages written cost memory), holds an
//! open-addressing array of [`Slot`]s and an arena of frames. A stack is inserted by claiming an empty slot
//! with a CAS (EMPTY → BUSY), taking its frames' room from the arena with one `fetch_add`, writing them, and
//! publishing the slot by storing its hash (release). An identical stack, found by hash and contents on its
//! probe path, adds to the count instead. Nothing blocks: a slot still BUSY is passed over, so two threads
//! inserting the same new stack at once can make two entries; the writer merges them ([`Table::visit`]).
//! When the probe limit or the arena is exhausted the sample is counted as dropped. Entries are never removed,
//! except all at once by [`Table::clear`] in a forked child. A bit per page of slots says which pages a claim
//! wrote, so that a dump reads those only: reading the others would fault in pages of zeros.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::unwind::Frame;
use crate::page_marks::PageMarks;
use crate::sys;

const EMPTY: u64 = 0;
/// Claimed, being written.
const BUSY: u64 = 2;
/// Claimed, but the arena had no room: never published.
const DEAD: u64 = 4;
/// Published slots hold the stack's hash with bit 0 set, so they never equal the markers above.
const PUBLISHED_BIT: u64 = 1;
/// Slots looked at before an insert gives up.
const MOST_PROBES: usize = 64;
/// Bytes of one frame in the arena: key (u32) and address (u64), packed.
const FRAME_BYTES: usize = 12;

/// One entry.
#[derive(Debug)]
#[repr(C)]
struct Slot {
    /// EMPTY, BUSY, DEAD, or the published hash.
    tag: AtomicU64,
    count: AtomicU64,
    /// Index of the first frame in the arena.
    first: AtomicU64,
    /// Depth in the low 32 bits, flags in the high 32.
    shape: AtomicU64,
}

/// One published stack, as [`Table::visit`] gives it.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub count: u64,
    pub flags: u32,
    frames: &'a [u8],
}

impl Entry<'_> {
    pub fn depth(&self) -> usize {
        self.frames.len() / FRAME_BYTES
    }

    /// Frame `index` (0: the leaf).
    pub fn frame(&self, index: usize) -> Option<Frame> {
        let at = index.checked_mul(FRAME_BYTES)?;
        let bytes = self.frames.get(at..at.checked_add(FRAME_BYTES)?)?;
        let mut key = [0u8; 4];
        let mut address = [0u8; 8];
        key.copy_from_slice(&bytes[..4]);
        address.copy_from_slice(&bytes[4..]);
        Some(Frame {
            key: u32::from_ne_bytes(key),
            address: u64::from_ne_bytes(address),
        })
    }

    /// The frames, leaf first.
    pub fn frames(&self) -> impl Iterator<Item = Frame> + '_ {
        (0..self.depth()).filter_map(|index| self.frame(index))
    }
}

/// The table (see the module documentation).
#[derive(Debug)]
pub struct Table {
    slots: *const Slot,
    slot_count: usize,
    arena: *mut u8,
    arena_frames: usize,
    arena_used: AtomicUsize,
    dropped: AtomicU64,
    /// The pages of the slot array where a slot was claimed.
    claimed_pages: PageMarks,
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared through atomics (slots) and the publish protocol (arena bytes are written by
// the one thread that claimed their room, before the release store of the slot's tag, and read only after an
// acquire load of it).
unsafe impl Sync for Table {}
// SAFETY: as above; the mapping is not tied to a thread.
unsafe impl Send for Table {}

fn hash(frames: &[Frame], flags: u32) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ u64::from(flags) ^ ((frames.len() as u64) << 32);
    for frame in frames {
        h = (h ^ frame.address).wrapping_mul(0x0000_0100_0000_01B3);
        h = (h ^ u64::from(frame.key)).wrapping_mul(crate::FIBONACCI);
        h ^= h >> 29;
    }
    h | PUBLISHED_BIT
}

impl Table {
    /// Reserves a table of about `bytes` (a sixteenth for the slots, the rest for frames). Not for handlers.
    pub fn new(bytes: usize) -> Option<Table> {
        let slot_bytes = std::mem::size_of::<Slot>();
        let slot_count = ((bytes / 16) / slot_bytes).max(64).next_power_of_two();
        let slots_len = slot_count * slot_bytes;
        let arena_frames = (bytes.saturating_sub(slots_len) / FRAME_BYTES).max(4096);
        let len = slots_len + arena_frames * FRAME_BYTES;
        let base = sys::map_zeroed(len)?;
        Some(Table {
            slots: base.cast::<Slot>(),
            slot_count,
            // SAFETY: `slots_len < len`: the arena starts inside the mapping.
            arena: unsafe { base.add(slots_len) },
            arena_frames,
            arena_used: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            claimed_pages: PageMarks::new(slots_len),
            base,
            len,
        })
    }

    fn slot(&self, index: usize) -> &Slot {
        // SAFETY: callers pass `index & (slot_count - 1)`; the mapping holds `slot_count` zero-initialised
        // slots (all-zero atomics are valid) for the table's whole life.
        unsafe { &*self.slots.add(index & (self.slot_count - 1)) }
    }

    /// The frame bytes of a published slot.
    fn frame_bytes(&self, slot: &Slot) -> &[u8] {
        let first = slot.first.load(Ordering::Relaxed) as usize;
        let depth = (slot.shape.load(Ordering::Relaxed) & 0xFFFF_FFFF) as usize;
        if first.saturating_add(depth) > self.arena_frames {
            return &[];
        }
        // SAFETY: in bounds (checked above); written before the slot was published and never written again.
        unsafe {
            std::slice::from_raw_parts(self.arena.add(first * FRAME_BYTES), depth * FRAME_BYTES)
        }
    }

    fn same(&self, slot: &Slot, frames: &[Frame], flags: u32) -> bool {
        let shape = slot.shape.load(Ordering::Relaxed);
        if shape != (frames.len() as u64 | (u64::from(flags) << 32)) {
            return false;
        }
        let bytes = self.frame_bytes(slot);
        bytes.len() == frames.len() * FRAME_BYTES
            && bytes
                .chunks_exact(FRAME_BYTES)
                .zip(frames)
                .all(|(b, f)| b[..4] == f.key.to_ne_bytes() && b[4..] == f.address.to_ne_bytes())
    }

    /// Counts one sample of the stack `frames` (leaf first) with `flags`. Async-signal-safe, lock-free.
    pub fn insert(&self, frames: &[Frame], flags: u32) {
        let tag = hash(frames, flags);
        let home = (tag >> 17) as usize;
        for probe in 0..MOST_PROBES {
            let slot = self.slot(home.wrapping_add(probe));
            let mut current = slot.tag.load(Ordering::Acquire);
            if current == EMPTY {
                match slot
                    .tag
                    .compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Acquire)
                {
                    Ok(_) => {
                        self.fill(slot, tag, frames, flags);
                        return;
                    }
                    Err(actual) => current = actual,
                }
            }
            if current == tag && self.same(slot, frames, flags) {
                slot.count.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes a claimed slot and publishes it (or marks it dead when the arena is full).
    fn fill(&self, slot: &Slot, tag: u64, frames: &[Frame], flags: u32) {
        self.claimed_pages
            .mark(slot as *const Slot as usize - self.slots as usize);
        let first = self.arena_used.fetch_add(frames.len(), Ordering::Relaxed);
        if first.saturating_add(frames.len()) > self.arena_frames {
            slot.tag.store(DEAD, Ordering::Release);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        for (index, frame) in frames.iter().enumerate() {
            let mut bytes = [0u8; FRAME_BYTES];
            bytes[..4].copy_from_slice(&frame.key.to_ne_bytes());
            bytes[4..].copy_from_slice(&frame.address.to_ne_bytes());
            // SAFETY: `first + index < arena_frames` (checked above); this room was handed to this thread
            // alone by the fetch_add, and nobody reads it before the slot is published.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    self.arena.add((first + index) * FRAME_BYTES),
                    FRAME_BYTES,
                )
            };
        }
        slot.first.store(first as u64, Ordering::Relaxed);
        slot.shape.store(
            frames.len() as u64 | (u64::from(flags) << 32),
            Ordering::Relaxed,
        );
        slot.count.store(1, Ordering::Relaxed);
        slot.tag.store(tag, Ordering::Release);
    }

    /// Samples whose stack was not stored (probe limit or arena exhausted).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Counts a sample whose stack could not be captured for want of scratch memory.
    pub fn note_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    pub fn slot_count(&self) -> usize {
        self.slot_count
    }

    /// Marks in `marks` (one byte per slot, all zero on entry) the entries to write: 1 for an entry published
    /// now and not a duplicate of an earlier one on its probe path, 2 for a duplicate (its count goes to the
    /// first one), 0 otherwise. Returns the number of entries to write and the frames they hold. What is
    /// published later is left out of this dump. Only the pages of slots that were claimed are read, and only
    /// their marks written.
    pub fn mark(&self, marks: &mut [u8]) -> (usize, usize) {
        let slot_bytes = std::mem::size_of::<Slot>();
        let slots_len = self.slot_count.min(marks.len()) * slot_bytes;
        self.claimed_pages.for_each_marked(slots_len, |bytes| {
            for index in bytes.start.div_ceil(slot_bytes)..bytes.end.div_ceil(slot_bytes) {
                if let Some(mark) = marks.get_mut(index)
                    && self.slot(index).tag.load(Ordering::Acquire) & PUBLISHED_BIT != 0
                {
                    *mark = 1;
                }
            }
        });
        let (mut entries, mut frames) = (0, 0);
        for index in 0..self.slot_count.min(marks.len()) {
            if marks[index] == 0 {
                continue;
            }
            if self.first_of_kind(index, marks) == index {
                entries += 1;
                frames += self.frame_bytes(self.slot(index)).len() / FRAME_BYTES;
            } else {
                marks[index] = 2;
            }
        }
        (entries, frames)
    }

    /// The first slot on `index`'s probe path (from its home) marked in `marks` that holds the same stack.
    fn first_of_kind(&self, index: usize, marks: &[u8]) -> usize {
        let slot = self.slot(index);
        let tag = slot.tag.load(Ordering::Acquire);
        let home = (tag >> 17) as usize;
        let bytes = self.frame_bytes(slot);
        let shape = slot.shape.load(Ordering::Relaxed);
        for probe in 0..MOST_PROBES {
            let other_index = home.wrapping_add(probe) & (self.slot_count - 1);
            if other_index == index {
                break;
            }
            let other = self.slot(other_index);
            if marks.get(other_index).is_some_and(|&m| m != 0)
                && other.tag.load(Ordering::Acquire) == tag
                && other.shape.load(Ordering::Relaxed) == shape
                && self.frame_bytes(other) == bytes
            {
                return other_index;
            }
        }
        index
    }

    /// Visits, in slot order, the entries [`Table::mark`] chose, with the counts of their duplicates added.
    pub fn visit(&self, marks: &[u8], mut each: impl FnMut(Entry<'_>)) {
        for index in 0..self.slot_count.min(marks.len()) {
            if marks[index] != 1 {
                continue;
            }
            let slot = self.slot(index);
            let mut count = slot.count.load(Ordering::Relaxed);
            let tag = slot.tag.load(Ordering::Acquire);
            let home = (tag >> 17) as usize;
            for probe in 0..MOST_PROBES {
                let other_index = home.wrapping_add(probe) & (self.slot_count - 1);
                if marks.get(other_index) == Some(&2)
                    && self.first_of_kind(other_index, marks) == index
                {
                    count =
                        count.saturating_add(self.slot(other_index).count.load(Ordering::Relaxed));
                }
            }
            each(Entry {
                count,
                flags: (slot.shape.load(Ordering::Relaxed) >> 32) as u32,
                frames: self.frame_bytes(slot),
            });
        }
    }

    /// Forgets every stack (a forked child's fresh start). Only while nothing inserts (one thread, its
    /// signals blocked).
    pub fn clear(&self) {
        sys::discard(self.base, self.len);
        self.claimed_pages.clear();
        self.arena_used.store(0, Ordering::Relaxed);
        self.dropped.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(addresses: &[u64]) -> Vec<Frame> {
        addresses
            .iter()
            .map(|&address| Frame { key: 1, address })
            .collect()
    }

    fn contents(table: &Table) -> Vec<(u64, u32, Vec<u64>)> {
        let mut marks = vec![0u8; table.slot_count()];
        table.mark(&mut marks);
        let mut seen = Vec::new();
        table.visit(&marks, |e| {
            seen.push((e.count, e.flags, e.frames().map(|f| f.address).collect()))
        });
        seen.sort();
        seen
    }

    #[test]
    fn every_published_stack_is_marked_on_every_page_of_slots() {
        let table = Table::new(4 << 20).unwrap();
        let slots_per_page = crate::page_marks::PAGE_BYTES / std::mem::size_of::<Slot>();
        assert!(table.slot_count() / slots_per_page >= 8);
        // Enough distinct stacks to claim slots on most pages, each inserted as often as its number.
        let stacks: Vec<Vec<Frame>> = (0..300).map(|i| frames(&[i, 7, 9])).collect();
        for (i, stack) in stacks.iter().enumerate() {
            for _ in 0..=i % 3 {
                table.insert(stack, 0);
            }
        }
        let mut marks = vec![0u8; table.slot_count()];
        let (entries, frames_marked) = table.mark(&mut marks);
        assert_eq!((entries, frames_marked), (300, 900));
        let published = (0..table.slot_count())
            .filter(|&index| table.slot(index).tag.load(Ordering::Acquire) & PUBLISHED_BIT != 0)
            .count();
        assert_eq!(marks.iter().filter(|&&mark| mark == 1).count(), published);
        let mut total = 0;
        table.visit(&marks, |entry| total += entry.count);
        assert_eq!(total, (0..300).map(|i| i % 3 + 1).sum::<u64>());
    }

    #[test]
    fn identical_stacks_count_once_and_different_flags_differ() {
        let table = Table::new(1 << 16).unwrap();
        for _ in 0..3 {
            table.insert(&frames(&[1, 2, 3]), 0);
        }
        table.insert(&frames(&[1, 2, 3]), 1);
        table.insert(&frames(&[1, 2]), 0);
        assert_eq!(
            contents(&table),
            vec![
                (1, 0, vec![1, 2]),
                (1, 1, vec![1, 2, 3]),
                (3, 0, vec![1, 2, 3])
            ]
        );
        table.clear();
        assert!(contents(&table).is_empty());
    }

    #[test]
    fn duplicates_on_one_probe_path_are_merged_when_written() {
        let table = Table::new(1 << 16).unwrap();
        let stack = frames(&[7, 8]);
        table.insert(&stack, 0);
        // Another thread's concurrent insert of the same stack: its own slot further on the path.
        let tag = hash(&stack, 0);
        let home = (tag >> 17) as usize;
        let next = table.slot(home + 1);
        next.tag.store(BUSY, Ordering::Relaxed);
        table.fill(next, tag, &stack, 0);
        next.count.store(4, Ordering::Relaxed);
        assert_eq!(contents(&table), vec![(5, 0, vec![7, 8])]);
    }

    #[test]
    fn a_full_arena_drops_and_counts() {
        let table = Table::new(0).unwrap();
        let big: Vec<u64> = (0..4096).collect();
        table.insert(&frames(&big), 0);
        table.insert(&frames(&[1]), 0);
        assert_eq!(table.dropped(), 1);
        assert_eq!(contents(&table).len(), 1);
    }

    /// A dump reads the pages of slots that were claimed, not the rest of the array: reading those would
    /// fault in pages of zeros.
    #[test]
    fn marking_reads_only_the_pages_of_claimed_slots() {
        let table = Table::new(4 << 20).unwrap();
        let slots_per_page = crate::page_marks::PAGE_BYTES / std::mem::size_of::<Slot>();
        let pages = table.slot_count().div_ceil(slots_per_page);
        assert!(pages >= 64, "{pages} pages of slots");
        for leaf in 0..3 {
            table.insert(&frames(&[leaf, 100]), 0);
        }
        let mut marks = vec![0u8; table.slot_count()];
        assert_eq!(table.mark(&mut marks), (3, 6));
        let mut resident = vec![0u8; pages];
        let slot_bytes = table.slot_count() * std::mem::size_of::<Slot>();
        assert!(sys::resident_pages(
            table.slots as usize,
            slot_bytes,
            &mut resident
        ));
        let read = resident.iter().filter(|&&page| page & 1 != 0).count();
        assert!(read <= 3, "{read} of {pages} pages of slots resident");
    }
}
