//! A bit per page of a memory area that is left to fault in (histogram buckets, the stack table's slots): set
//! where the area is written, so that a walk reads only the pages that may hold something. Reading the others
//! would fault in pages of zeros, one fault each.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes per mark (a 4 KiB page; a larger page only makes neighbouring marks describe one page).
pub const PAGE_BYTES: usize = 4096;

/// The marks of one area.
#[derive(Debug)]
pub struct PageMarks {
    words: Box<[AtomicU64]>,
}

impl PageMarks {
    /// Marks for an area of `bytes` bytes, none set. Allocates: not for handlers.
    pub fn new(bytes: usize) -> PageMarks {
        let words = bytes.div_ceil(PAGE_BYTES).div_ceil(64);
        PageMarks {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Marks the page holding byte `offset` of the area. Async-signal-safe; a locked instruction only the
    /// first time.
    pub fn mark(&self, offset: usize) {
        let page = offset / PAGE_BYTES;
        if let Some(word) = self.words.get(page / 64) {
            let bit = 1u64 << (page % 64);
            if word.load(Ordering::Relaxed) & bit == 0 {
                word.fetch_or(bit, Ordering::Relaxed);
            }
        }
    }

    /// Visits the byte ranges of the marked pages (below `bytes`), in order.
    pub fn for_each_marked(&self, bytes: usize, mut visit: impl FnMut(core::ops::Range<usize>)) {
        for (word_index, word) in self.words.iter().enumerate() {
            let mut bits = word.load(Ordering::Acquire);
            while bits != 0 {
                let start = (word_index * 64 + bits.trailing_zeros() as usize) * PAGE_BYTES;
                bits &= bits - 1;
                if start < bytes {
                    visit(start..(start + PAGE_BYTES).min(bytes));
                }
            }
        }
    }

    /// Clears every mark (the area was given back and reads as zero). Only while nothing writes the area.
    pub fn clear(&self) {
        for word in &self.words {
            word.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_pages_are_visited_in_order_and_cleared() {
        let marks = PageMarks::new(PAGE_BYTES * 130 - 7);
        for offset in [
            PAGE_BYTES * 129 + 3,
            5,
            PAGE_BYTES * 64,
            PAGE_BYTES * 64 + 1,
        ] {
            marks.mark(offset);
        }
        marks.mark(PAGE_BYTES * 500);
        let mut seen = Vec::new();
        marks.for_each_marked(PAGE_BYTES * 130 - 7, |range| seen.push(range));
        assert_eq!(
            seen,
            [
                0..PAGE_BYTES,
                PAGE_BYTES * 64..PAGE_BYTES * 65,
                PAGE_BYTES * 129..PAGE_BYTES * 130 - 7
            ]
        );
        marks.clear();
        marks.for_each_marked(usize::MAX, |range| panic!("{range:?} still marked"));
    }
}
