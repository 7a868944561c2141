//! `smonitor(regions, nregions, buffer, bufsize, nfunc, flags)` (MSLP's paper, 2.2.2): the program hands
//! over text regions and a buffer of 16-bit (`PROF_USHORT`) or 32-bit (`PROF_UINT`) buckets, and the
//! sampler adds each sample whose PC lies in a region to that buffer too, on top of the runtime's own
//! per-module histograms. A later call first writes the profile collected so far through the usual dump
//! path (as `mslprof_dump(NULL)` does; `exports.rs` asks `on_demand` for it), then collects into its own
//! buffer.
//!
//! The layout is one granularity `G` for all regions: the smallest whole number of bytes per bucket such
//! that the buckets of every region, `ceil(size / G)` each, fit in the buffer; region i's buckets follow
//! region i-1's. The buffer is never cleared: counts are added to what it holds, saturating.
//!
//! The SIGPROF handler only reads atomics here: the description of the buffer lives in fixed-size static
//! tables, switched off (and waited for) while `smonitor` rewrites them.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicUsize, Ordering};

use crate::sys;

/// `PROF_USHORT`: 16-bit buckets (glibc's `<sys/profil.h>` value).
pub const PROF_USHORT: c_uint = 0;
/// `PROF_UINT`: 32-bit buckets (glibc's `<sys/profil.h>` value).
pub const PROF_UINT: c_uint = 1;
/// Most regions one call may name.
pub const MAX_REGIONS: usize = 64;

/// C: `struct text_region { const void *low_pc; const void *high_pc; }`, the range `[low_pc, high_pc)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TextRegion {
    pub low_pc: *const c_void,
    pub high_pc: *const c_void,
}

/// The program's buffer being filled, described in fixed tables the SIGPROF handler reads.
struct Collection {
    starts: [AtomicUsize; MAX_REGIONS],
    ends: [AtomicUsize; MAX_REGIONS],
    first_buckets: [AtomicUsize; MAX_REGIONS],
    regions: AtomicUsize,
    buffer: AtomicUsize,
    buckets: AtomicUsize,
    granularity: AtomicUsize,
    wide: AtomicBool,
    /// The tables above describe a buffer being filled.
    active: AtomicBool,
    /// Handlers inside [`record`] right now.
    recording: AtomicUsize,
    /// One `smonitor` call at a time.
    calls: Mutex<()>,
}

/// The one collection of this process.
static COLLECTION: Collection = Collection {
    starts: [const { AtomicUsize::new(0) }; MAX_REGIONS],
    ends: [const { AtomicUsize::new(0) }; MAX_REGIONS],
    first_buckets: [const { AtomicUsize::new(0) }; MAX_REGIONS],
    regions: AtomicUsize::new(0),
    buffer: AtomicUsize::new(0),
    buckets: AtomicUsize::new(0),
    granularity: AtomicUsize::new(1),
    wide: AtomicBool::new(false),
    active: AtomicBool::new(false),
    recording: AtomicUsize::new(0),
    calls: Mutex::new(()),
};

/// The bytes per bucket for regions of `sizes` in `buckets` buckets (None if they cannot fit).
pub fn granularity(sizes: &[usize], buckets: usize) -> Option<usize> {
    let total: usize = sizes.iter().sum();
    if buckets < sizes.len() || buckets == 0 {
        return None;
    }
    let fits = |g: usize| sizes.iter().map(|s| s.div_ceil(g)).sum::<usize>() <= buckets;
    // The smallest fitting granularity lies between the average and the largest region (one bucket each).
    let (mut low, mut high) = (
        total.div_ceil(buckets).max(1),
        sizes.iter().copied().max().unwrap_or(1).max(1),
    );
    while low < high {
        let middle = low + (high - low) / 2;
        if fits(middle) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    let g = low;
    Some(g)
}

/// Adds one sample at `pc` to the program's buffer when a region holds it. Async-signal-safe.
pub fn record(pc: usize) {
    if !COLLECTION.active.load(Ordering::Acquire) {
        return;
    }
    COLLECTION.recording.fetch_add(1, Ordering::SeqCst);
    if COLLECTION.active.load(Ordering::SeqCst) {
        let regions = COLLECTION.regions.load(Ordering::Relaxed).min(MAX_REGIONS);
        let g = COLLECTION.granularity.load(Ordering::Relaxed).max(1);
        for i in 0..regions {
            let (start, end) = (
                COLLECTION.starts[i].load(Ordering::Relaxed),
                COLLECTION.ends[i].load(Ordering::Relaxed),
            );
            if start <= pc && pc < end {
                let bucket = COLLECTION.first_buckets[i].load(Ordering::Relaxed) + (pc - start) / g;
                if bucket < COLLECTION.buckets.load(Ordering::Relaxed) {
                    add_one(COLLECTION.buffer.load(Ordering::Relaxed), bucket);
                }
                break;
            }
        }
    }
    COLLECTION.recording.fetch_sub(1, Ordering::SeqCst);
}

fn add_one(buffer: usize, bucket: usize) {
    if COLLECTION.wide.load(Ordering::Relaxed) {
        // SAFETY: `smonitor` checked that the buffer holds `BUCKETS` aligned 32-bit buckets, and the program
        // promised to keep it until the next call.
        let counter = unsafe { &*((buffer as *const AtomicU32).add(bucket)) };
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1));
    } else {
        // SAFETY: as above, with 16-bit buckets.
        let counter = unsafe { &*((buffer as *const AtomicU16).add(bucket)) };
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1));
    }
}

/// Stops filling the current buffer and waits until no handler writes to it.
pub fn stop() -> bool {
    let was = COLLECTION.active.swap(false, Ordering::SeqCst);
    for _ in 0..100_000 {
        if COLLECTION.recording.load(Ordering::SeqCst) == 0 {
            break;
        }
        std::hint::spin_loop();
        std::thread::yield_now();
    }
    was
}

fn refuse(why: &[u8]) {
    sys::stderr_line(&[b"mslprof: smonitor: ", why, b"; not collecting\n"]);
}

/// The Rust side of the exported `smonitor` (see `exports.rs`).
///
/// # Safety
/// `regions` points to `nregions` regions; `buffer` is `bufsize` writable bytes that stay valid until the
/// next call (or the end of the process).
/// When an earlier call was collecting, `collected` runs after that collection stopped (the caller writes
/// the profile then: what it collected is in the runtime's histograms too).
pub unsafe fn start(
    regions: *const TextRegion,
    nregions: c_int,
    buffer: *mut c_void,
    bufsize: usize,
    flags: c_uint,
    collected: impl FnOnce(),
) {
    let _one_at_a_time = COLLECTION.calls.lock().unwrap_or_else(|e| e.into_inner());
    if stop() {
        collected();
    }
    if regions.is_null() || nregions <= 0 || buffer.is_null() || bufsize == 0 {
        return;
    }
    let width = match flags {
        PROF_USHORT => 2,
        PROF_UINT => 4,
        _ => return refuse(b"flags is neither PROF_USHORT nor PROF_UINT"),
    };
    let count = nregions as usize;
    if count > MAX_REGIONS {
        return refuse(b"more than 64 regions");
    }
    if !(buffer as usize).is_multiple_of(width) {
        return refuse(b"buffer is not aligned to its buckets");
    }
    // SAFETY: the caller passes `nregions` regions.
    let regions = unsafe { std::slice::from_raw_parts(regions, count) };
    let mut sizes = [0usize; MAX_REGIONS];
    for (size, r) in sizes.iter_mut().zip(regions) {
        *size = (r.high_pc as usize).saturating_sub(r.low_pc as usize);
    }
    let buckets = bufsize / width;
    let Some(g) = granularity(&sizes[..count], buckets) else {
        return refuse(b"buffer has fewer buckets than regions");
    };
    let mut first = 0;
    for (i, r) in regions.iter().enumerate() {
        COLLECTION.starts[i].store(r.low_pc as usize, Ordering::Relaxed);
        COLLECTION.ends[i].store(r.high_pc as usize, Ordering::Relaxed);
        COLLECTION.first_buckets[i].store(first, Ordering::Relaxed);
        first += sizes[i].div_ceil(g);
    }
    COLLECTION.regions.store(count, Ordering::Relaxed);
    COLLECTION.buffer.store(buffer as usize, Ordering::Relaxed);
    COLLECTION.buckets.store(buckets, Ordering::Relaxed);
    COLLECTION.granularity.store(g, Ordering::Relaxed);
    COLLECTION.wide.store(width == 4, Ordering::Relaxed);
    COLLECTION.active.store(true, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::granularity;

    #[test]
    fn granularity_fits_every_region() {
        assert_eq!(granularity(&[100], 100), Some(1));
        assert_eq!(granularity(&[100], 10), Some(10));
        assert_eq!(granularity(&[101], 10), Some(11));
        assert_eq!(granularity(&[1, 1, 1], 2), None);
        for (sizes, buckets) in [(&[5usize, 7, 9][..], 4), (&[1000, 3, 1], 17), (&[0, 8], 2)] {
            let g = granularity(sizes, buckets).unwrap();
            assert!(sizes.iter().map(|s| s.div_ceil(g)).sum::<usize>() <= buckets);
            // Smallest: one byte less no longer fits.
            if g > 1 {
                assert!(sizes.iter().map(|s| s.div_ceil(g - 1)).sum::<usize>() > buckets);
            }
        }
    }
}
