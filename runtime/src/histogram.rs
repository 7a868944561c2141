//! PC-sampling histograms: one per profiled module, laid over its executable segments.
//!
//! A bucket covers [`BYTES_PER_BUCKET`] bytes of text (4, glibc's granularity: at most one instruction start on
//! x86_64 is lost between neighbours). Buckets are 16 or 32 bits wide (`LD_PROFILEBUCKET_SIZE`). The memory is
//! reserved with `MAP_NORESERVE` anonymous pages, so only the pages whose buckets are hit ever cost RAM: a
//! 100 MB library costs 50 MB of address space and a few pages of memory.
//!
//! Buckets are incremented with atomics from the SIGPROF handler of any thread; 16-bit buckets stop at 65535
//! (saturate) instead of wrapping, and the histogram counts how many did.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

use mslprof_format::LinkAddress;
use mslprof_loader_hooks::LinkRange;

use crate::page_marks::PageMarks;
use crate::sys;

/// Text bytes covered by one bucket (a power of two).
pub const BYTES_PER_BUCKET: u32 = 4;

/// Width of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BucketBits {
    Sixteen,
    ThirtyTwo,
}

impl BucketBits {
    pub fn bits(self) -> u8 {
        match self {
            BucketBits::Sixteen => 16,
            BucketBits::ThirtyTwo => 32,
        }
    }

    fn bytes(self) -> usize {
        usize::from(self.bits() / 8)
    }

    /// 16 or 32; anything else is not a bucket width.
    pub fn from_bits(bits: i64) -> Option<BucketBits> {
        match bits {
            16 => Some(BucketBits::Sixteen),
            32 => Some(BucketBits::ThirtyTwo),
            _ => None,
        }
    }
}

/// One histogram range: buckets over `[start, end)` (link-time), the first of them at index `first_bucket`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistogramRange {
    pub start: LinkAddress,
    pub end: LinkAddress,
    pub first_bucket: usize,
}

impl HistogramRange {
    pub fn bucket_count(&self) -> usize {
        (self.end.offset_from(self.start) / u64::from(BYTES_PER_BUCKET)) as usize
    }
}

/// The counters of one module. The memory is never unmapped: a signal handler may still hold a reference.
#[derive(Debug)]
pub struct Histogram {
    base: usize,
    bucket_bits: BucketBits,
    ranges: Vec<HistogramRange>,
    bucket_count: usize,
    saturated: AtomicU64,
    /// The pages of buckets a sample was counted in: the pages a dump reads.
    sampled_pages: PageMarks,
}

impl Histogram {
    /// Reserves a zeroed histogram over `exec_ranges`; `None` when the address space cannot be reserved.
    pub fn new(exec_ranges: &[LinkRange], bucket_bits: BucketBits) -> Option<Histogram> {
        let ranges = bucket_ranges(exec_ranges);
        let bucket_count = ranges
            .last()
            .map_or(0, |r| r.first_bucket + r.bucket_count());
        let bytes = bucket_count.checked_mul(bucket_bits.bytes())?;
        let base = if bytes == 0 {
            0
        } else {
            sys::map_zeroed(bytes)? as usize
        };
        Some(Histogram {
            base,
            bucket_bits,
            ranges,
            bucket_count,
            saturated: AtomicU64::new(0),
            sampled_pages: PageMarks::new(bytes),
        })
    }

    pub fn bucket_bits(&self) -> BucketBits {
        self.bucket_bits
    }

    pub fn ranges(&self) -> &[HistogramRange] {
        &self.ranges
    }

    pub fn bucket_count(&self) -> usize {
        self.bucket_count
    }

    /// Bytes of bucket memory.
    pub fn byte_len(&self) -> usize {
        self.bucket_count * self.bucket_bits.bytes()
    }

    /// How many 16-bit buckets reached 65535 and stopped counting.
    pub fn saturated_buckets(&self) -> u64 {
        self.saturated.load(Ordering::Relaxed)
    }

    /// The bucket index of a link-time address, if the histogram covers it.
    pub fn bucket_of(&self, address: LinkAddress) -> Option<usize> {
        let range = self
            .ranges
            .iter()
            .find(|r| r.start <= address && address < r.end)?;
        Some(
            range.first_bucket
                + (address.offset_from(range.start) / u64::from(BYTES_PER_BUCKET)) as usize,
        )
    }

    /// Counts one sample at a link-time address. Async-signal-safe: atomics only. Returns false when the
    /// address is outside the histogram.
    pub fn record(&self, address: LinkAddress) -> bool {
        let Some(index) = self.bucket_of(address) else {
            return false;
        };
        self.sampled_pages.mark(index * self.bucket_bits.bytes());
        match self.bucket_bits {
            BucketBits::Sixteen => {
                let Some(bucket) = self.buckets16().get(index) else {
                    return false;
                };
                let previous =
                    bucket.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1));
                if previous == Ok(u16::MAX - 1) {
                    self.saturated.fetch_add(1, Ordering::Relaxed);
                }
            }
            BucketBits::ThirtyTwo => {
                let Some(bucket) = self.buckets32().get(index) else {
                    return false;
                };
                // Even 32-bit buckets never wrap (at 250 Hz that takes 200 days of CPU in 4 bytes of code).
                let _ =
                    bucket.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1));
            }
        }
        true
    }

    /// Sets every bucket and the saturation count back to zero (a forked child starts afresh). The pages are
    /// given back (`MADV_DONTNEED` reads as zero) rather than written: a forked child that stored zeros paid
    /// a copy-on-write fault per page holding counts, and finding those pages (`mincore`, then a scan) was a
    /// tenth of its handler's time. Only valid while no handler can write (after fork there is one thread).
    pub fn reset(&self) {
        if self.base != 0 {
            sys::discard(self.base as *mut u8, self.byte_len());
        }
        self.sampled_pages.clear();
        self.saturated.store(0, Ordering::Relaxed);
    }

    /// The 16-bit buckets (empty for a 32-bit histogram).
    pub fn buckets16(&self) -> &[AtomicU16] {
        if self.bucket_bits != BucketBits::Sixteen || self.bucket_count == 0 {
            return &[];
        }
        // SAFETY: `base` is a private anonymous mapping of bucket_count × 2 bytes, page-aligned, never unmapped;
        // AtomicU16 has the layout of u16 and the memory is only ever accessed atomically or after sampling
        // stopped.
        unsafe { std::slice::from_raw_parts(self.base as *const AtomicU16, self.bucket_count) }
    }

    /// The 32-bit buckets (empty for a 16-bit histogram).
    pub fn buckets32(&self) -> &[AtomicU32] {
        if self.bucket_bits != BucketBits::ThirtyTwo || self.bucket_count == 0 {
            return &[];
        }
        // SAFETY: as in buckets16, with 4-byte buckets.
        unsafe { std::slice::from_raw_parts(self.base as *const AtomicU32, self.bucket_count) }
    }

    /// The buckets as plain integers, for the dump.
    ///
    /// # Safety
    /// No thread may increment a bucket while the returned slice is alive (sampling stopped and every
    /// SIGPROF handler finished).
    pub unsafe fn quiescent_buckets16(&self) -> &[u16] {
        let atomics = self.buckets16();
        // SAFETY: same layout; the caller guarantees no concurrent writes.
        unsafe { std::slice::from_raw_parts(atomics.as_ptr() as *const u16, atomics.len()) }
    }

    /// # Safety
    /// As [`Histogram::quiescent_buckets16`].
    pub unsafe fn quiescent_buckets32(&self) -> &[u32] {
        let atomics = self.buckets32();
        // SAFETY: same layout; the caller guarantees no concurrent writes.
        unsafe { std::slice::from_raw_parts(atomics.as_ptr() as *const u32, atomics.len()) }
    }

    /// Visits the non-zero buckets as (index, count) in index order, reading only the pages of buckets that
    /// were sampled (the others are all zero, and reading them would fault in pages of zeros), and skipping
    /// runs of zero buckets within a page a run at a time ([`visit_nonzero_in`]). Allocates nothing (the
    /// fatal-signal dump uses it). Meant for moments when no handler writes.
    pub fn for_each_nonzero(&self, mut visit: impl FnMut(u64, u32)) {
        let width = self.bucket_bits.bytes();
        let (sixteen, thirty_two) = (self.buckets16(), self.buckets32());
        self.sampled_pages
            .for_each_marked(self.byte_len(), |bytes| {
                let indices = bytes.start / width..bytes.end / width;
                let first = indices.start;
                match self.bucket_bits {
                    BucketBits::Sixteen => visit_nonzero_in(
                        sixteen.get(indices).unwrap_or_default(),
                        first,
                        |bucket| u32::from(bucket.load(Ordering::Relaxed)),
                        &mut visit,
                    ),
                    BucketBits::ThirtyTwo => visit_nonzero_in(
                        thirty_two.get(indices).unwrap_or_default(),
                        first,
                        |bucket| bucket.load(Ordering::Relaxed),
                        &mut visit,
                    ),
                }
            });
    }

    /// The non-zero buckets as (index, count); see [`Histogram::for_each_nonzero`].
    pub fn nonzero_buckets(&self) -> Vec<(u64, u32)> {
        let mut entries = Vec::new();
        self.for_each_nonzero(|index, count| entries.push((index, count)));
        entries
    }

    /// Sum of every bucket (for tests and sanity checks).
    pub fn total(&self) -> u64 {
        let sixteen = self
            .buckets16()
            .iter()
            .map(|b| u64::from(b.load(Ordering::Relaxed)));
        let thirty_two = self
            .buckets32()
            .iter()
            .map(|b| u64::from(b.load(Ordering::Relaxed)));
        sixteen.chain(thirty_two).sum()
    }
}

/// Buckets read together by [`visit_nonzero_in`] before it looks at any one of them.
const ZERO_RUN: usize = 16;

/// Visits the non-zero ones of `buckets` (the first is bucket `first`) as (index, count), in order: a run of
/// [`ZERO_RUN`] buckets whose counts OR to zero is passed over without a branch per bucket (most of a sampled
/// page's buckets are zero).
fn visit_nonzero_in<B>(
    buckets: &[B],
    first: usize,
    count_of: impl Fn(&B) -> u32,
    visit: &mut impl FnMut(u64, u32),
) {
    for (run_index, run) in buckets.chunks(ZERO_RUN).enumerate() {
        if run.iter().fold(0, |any, bucket| any | count_of(bucket)) == 0 {
            continue;
        }
        for (offset, bucket) in run.iter().enumerate() {
            let count = count_of(bucket);
            if count != 0 {
                visit((first + run_index * ZERO_RUN + offset) as u64, count);
            }
        }
    }
}

/// Aligns each executable range outwards to whole buckets, merges ranges that then touch or overlap, and
/// numbers their buckets end to end.
fn bucket_ranges(exec_ranges: &[LinkRange]) -> Vec<HistogramRange> {
    let step = u64::from(BYTES_PER_BUCKET);
    let mut sorted: Vec<LinkRange> = exec_ranges
        .iter()
        .copied()
        .filter(|r| !r.is_empty())
        .collect();
    sorted.sort();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for range in sorted {
        let start = range.start & !(step - 1);
        let end = range.end.saturating_add(step - 1) & !(step - 1);
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    let mut first_bucket = 0;
    merged
        .into_iter()
        .map(|(start, end)| {
            let range = HistogramRange {
                start: LinkAddress(start),
                end: LinkAddress(end),
                first_bucket,
            };
            first_bucket += range.bucket_count();
            range
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_aligned_merged_and_numbered() {
        let ranges = bucket_ranges(&[
            LinkRange {
                start: 0x2001,
                end: 0x2003,
            },
            LinkRange {
                start: 0x1002,
                end: 0x1010,
            },
            LinkRange {
                start: 0x1010,
                end: 0x1011,
            },
        ]);
        assert_eq!(
            ranges,
            vec![
                HistogramRange {
                    start: LinkAddress(0x1000),
                    end: LinkAddress(0x1014),
                    first_bucket: 0
                },
                HistogramRange {
                    start: LinkAddress(0x2000),
                    end: LinkAddress(0x2004),
                    first_bucket: 5
                },
            ]
        );
    }

    #[test]
    fn sixteen_bit_buckets_saturate_and_are_counted_once() {
        let h = Histogram::new(
            &[LinkRange {
                start: 0x1000,
                end: 0x1100,
            }],
            BucketBits::Sixteen,
        )
        .unwrap();
        assert!(!h.record(LinkAddress(0xfff)));
        assert!(!h.record(LinkAddress(0x1100)));
        for _ in 0..70_000 {
            assert!(h.record(LinkAddress(0x1005)));
        }
        h.record(LinkAddress(0x10ff));
        assert_eq!(h.buckets16()[1].load(Ordering::Relaxed), u16::MAX);
        assert_eq!(h.buckets16()[63].load(Ordering::Relaxed), 1);
        assert_eq!(h.saturated_buckets(), 1);
        assert_eq!(h.total(), 65_536);
    }

    #[test]
    fn the_nonzero_buckets_are_those_a_read_of_every_bucket_finds() {
        for bits in [BucketBits::Sixteen, BucketBits::ThirtyTwo] {
            // Three pages' worth of buckets and a part page; samples at both ends of runs and pages.
            let end = (3 * crate::page_marks::PAGE_BYTES as u64 + 200) * 4;
            let h = Histogram::new(&[LinkRange { start: 0, end }], bits).unwrap();
            let width = bits.bytes() as u64;
            let per_page = crate::page_marks::PAGE_BYTES as u64 / width;
            let mut addresses = vec![0, 4 * 15, 4 * 16, 4 * 17, 4 * (per_page - 1), end - 4];
            addresses.extend((0..40).map(|i| 4 * (per_page + i * 37 % per_page)));
            for (i, &address) in addresses.iter().enumerate() {
                for _ in 0..=i {
                    assert!(h.record(LinkAddress(address)));
                }
            }
            let every: Vec<(u64, u32)> = match bits {
                BucketBits::Sixteen => (h.buckets16().iter())
                    .map(|b| u32::from(b.load(Ordering::Relaxed)))
                    .enumerate()
                    .filter(|&(_, c)| c != 0)
                    .map(|(i, c)| (i as u64, c))
                    .collect(),
                BucketBits::ThirtyTwo => (h.buckets32().iter())
                    .map(|b| b.load(Ordering::Relaxed))
                    .enumerate()
                    .filter(|&(_, c)| c != 0)
                    .map(|(i, c)| (i as u64, c))
                    .collect(),
            };
            assert!(every.len() > 40, "{bits:?}: {every:?}");
            assert_eq!(h.nonzero_buckets(), every, "{bits:?}");
        }
    }

    #[test]
    fn thirty_two_bit_buckets_count_past_65535() {
        let h = Histogram::new(&[LinkRange { start: 0, end: 64 }], BucketBits::ThirtyTwo).unwrap();
        for _ in 0..70_000 {
            h.record(LinkAddress(8));
        }
        assert_eq!(h.buckets32()[2].load(Ordering::Relaxed), 70_000);
        assert_eq!(h.saturated_buckets(), 0);
        assert!(h.buckets16().is_empty());
    }

    #[test]
    fn large_histograms_cost_no_memory_until_touched() {
        // 1 GiB of text → 512 MiB reserved; touching one bucket must not fault in the rest.
        let h = Histogram::new(
            &[LinkRange {
                start: 0,
                end: 1 << 30,
            }],
            BucketBits::Sixteen,
        )
        .unwrap();
        assert_eq!(h.bucket_count(), 1 << 28);
        assert!(h.record(LinkAddress(12_345_678)));
        assert!(h.record(LinkAddress(12_345_678)));
        assert!(h.record(LinkAddress(1 << 29)));
        assert_eq!(h.buckets16()[12_345_678 / 4].load(Ordering::Relaxed), 2);
        assert_eq!(h.buckets16()[1 << 27].load(Ordering::Relaxed), 1);
        assert_eq!(h.nonzero_buckets(), vec![(12_345_678 / 4, 2), (1 << 27, 1)]);
        // The walk read the two sampled pages of buckets, no other.
        let mut resident = vec![0u8; h.byte_len() / crate::page_marks::PAGE_BYTES];
        assert!(sys::resident_pages(h.base, h.byte_len(), &mut resident));
        assert_eq!(resident.iter().filter(|&&page| page & 1 != 0).count(), 2);
        h.reset();
        assert!(h.record(LinkAddress(64)));
        assert_eq!(h.nonzero_buckets(), vec![(16, 1)]);
    }

    #[test]
    fn reset_zeroes_every_bucket_and_the_saturation_count() {
        let h = Histogram::new(
            &[LinkRange {
                start: 0,
                end: 1 << 20,
            }],
            BucketBits::Sixteen,
        )
        .unwrap();
        for _ in 0..70_000 {
            h.record(LinkAddress(4));
        }
        h.record(LinkAddress((1 << 20) - 4));
        h.reset();
        assert_eq!(h.nonzero_buckets(), vec![]);
        assert_eq!(h.saturated_buckets(), 0);
        assert!(h.record(LinkAddress(4)));
        assert_eq!(h.nonzero_buckets(), vec![(1, 1)]);
    }
}
