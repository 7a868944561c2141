//! Snapshot → descriptors → bytes: the one encoder behind every mslprof file the runtime writes (at exit,
//! before `exec`, on demand, and from a fatal signal or `_exit`).
//!
//! It takes nothing from the heap, because a fatal signal may interrupt code that holds malloc's lock: the
//! descriptors live in one anonymous mapping sized beforehand (an [`Arena`]), unmapped when the file is
//! written; counts are borrowed from the histograms and arc tables. The state of the process that the header
//! states is read once, into a [`Moment`], so two encodings of one moment are the same bytes.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use mslprof_format::model::{Arc, CpuTime, IncompleteCause, module_flags};
use mslprof_format::stream::{
    self, ArcFeed, Counts, Encoding, HeaderDesc, HistogramDesc, ModuleDesc, RangeDesc, Sink,
    StreamError,
};

use crate::histogram::{BYTES_PER_BUCKET, BucketBits, Histogram};
use crate::modules::LiveModule;
use crate::sys;

/// What a dump's header says about the process, read once per dump.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moment {
    pub pid: u32,
    pub ppid: u32,
    pub start_time_ns: i64,
    pub end_time_ns: i64,
    pub sample_period_ns: u64,
    /// What sent the sample signals (`mslprof_format::sampling_sources` bits).
    pub sampling_sources: u32,
    pub total_samples: u64,
    pub unknown_samples: u64,
    pub cpu_time: Option<CpuTime>,
    /// Header flags: forked child, pre-exec, incomplete, shared SIGPROF timer.
    pub flags: u32,
    pub incomplete_cause: IncompleteCause,
    pub incomplete_signal: u32,
}

/// The program as the header names it.
#[derive(Clone, Copy, Debug)]
pub struct Program<'a> {
    /// argv[0] without its directories.
    pub name: &'a [u8],
    pub hz: u32,
}

/// Why nothing (or not all) was encoded.
#[derive(Debug)]
pub enum EncodeError<E> {
    /// The descriptors' memory could not be mapped.
    NoMemory,
    Stream(StreamError<E>),
}

/// The format's limit on load instances in one file (SPEC.md §8).
pub const MAX_MODULES_IN_FILE: usize = 65_536;

/// Histograms bigger than this are written from their touched pages only (as sparse ranges), so the dump
/// neither scans nor faults in buckets that were never hit: reading an untouched page of them is a page fault
/// (libc's 0.7 MB of buckets were 190 of them at every exit), and librustc_driver has 54 MB.
const SPARSE_FROM_BYTES: usize = 16 << 10;

/// A bump allocator over one anonymous mapping, unmapped when dropped. Values put in it are never dropped
/// (only plain data and borrows go in).
pub struct Arena {
    base: *mut u8,
    len: usize,
    used: Cell<usize>,
}

impl Arena {
    pub fn new(len: usize) -> Option<Arena> {
        let len = len.max(1);
        Some(Arena {
            base: sys::map_zeroed(len)?,
            len,
            used: Cell::new(0),
        })
    }

    /// Moves `count` values made by `make` into the arena and returns them. Each call hands out a new part of
    /// the mapping, so the slices never overlap (a bump allocator's shared-to-mutable borrow).
    #[allow(clippy::mut_from_ref)]
    pub fn slice<T>(&self, count: usize, mut make: impl FnMut(usize) -> T) -> Option<&mut [T]> {
        let align = std::mem::align_of::<T>();
        let start = self.used.get().checked_add(align - 1)? & !(align - 1);
        let end = start.checked_add(count.checked_mul(std::mem::size_of::<T>())?)?;
        if end > self.len {
            return None;
        }
        self.used.set(end);
        // SAFETY: `start` is inside the mapping (checked above, end ≤ len).
        let first = unsafe { self.base.add(start) }.cast::<T>();
        for index in 0..count {
            // SAFETY: `first + index` lies inside our mapping, aligned for T, and is written once.
            unsafe { first.add(index).write(make(index)) };
        }
        // SAFETY: `count` initialised values of T at `first`, in a part of the mapping no other slice covers
        // (`used` only grows), valid until the arena is dropped, which the borrow of `self` prevents.
        Some(unsafe { std::slice::from_raw_parts_mut(first, count) })
    }

    /// Bytes for `count` values of T, alignment slack included.
    fn bytes_for<T>(count: usize) -> usize {
        count
            .saturating_mul(std::mem::size_of::<T>())
            .saturating_add(std::mem::align_of::<T>())
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly our mapping; every slice borrowed from it has ended.
        unsafe { sys::unmap(self.base, self.len) };
    }
}

/// Whether a load instance holds any data.
pub fn recorded(module: &LiveModule) -> bool {
    module.samples.load(Ordering::Relaxed) != 0 || !module.arcs.is_empty()
}

/// Visits, in load order, the load instances to write when at most `limit` fit: every loaded module (up to
/// the limit), then as many unloaded ones as fit, those that recorded something before empty ones, newer before
/// older. Returns how many were left out. Allocates nothing.
pub fn select_for_dump<T: Copy>(
    all: &[T],
    limit: usize,
    is_unloaded: impl Fn(T) -> bool,
    has_data: impl Fn(T) -> bool,
    mut visit: impl FnMut(T),
) -> usize {
    let loaded = all.iter().filter(|&&m| !is_unloaded(m)).count();
    let with_data = all
        .iter()
        .filter(|&&m| is_unloaded(m) && has_data(m))
        .count();
    let empty = all.len() - loaded - with_data;
    let kept_loaded = loaded.min(limit);
    let kept_with_data = with_data.min(limit - kept_loaded);
    let kept_empty = empty.min(limit - kept_loaded - kept_with_data);
    // Within each kind the oldest are left out first.
    let (mut skip_loaded, mut skip_with_data, mut skip_empty) = (
        loaded - kept_loaded,
        with_data - kept_with_data,
        empty - kept_empty,
    );
    for &module in all {
        let skip = match (is_unloaded(module), has_data(module)) {
            (false, _) => &mut skip_loaded,
            (true, true) => &mut skip_with_data,
            (true, false) => &mut skip_empty,
        };
        if *skip > 0 {
            *skip -= 1;
        } else {
            visit(module);
        }
    }
    all.len() - (kept_loaded + kept_with_data + kept_empty)
}

/// Says once on stderr how many load instances did not fit in the file. Async-signal-safe.
fn warn_left_out(left_out: usize) {
    if left_out == 0 {
        return;
    }
    let mut digits = [0u8; 20];
    sys::stderr_line(&[
        b"mslprof: ",
        super::file::decimal(left_out as u64, &mut digits),
        b" load instances of unloaded modules left out of the profile (a file holds at most 65536)\n",
    ]);
}

/// Module flags of the format (SPEC.md §6) for one load instance.
fn module_flag_bits(module: &LiveModule) -> u32 {
    let info = &module.info;
    let mut flags = 0;
    for (set, bit) in [
        (module.histogram.is_some(), module_flags::PROFILED),
        (module.is_unloaded(), module_flags::UNLOADED),
        (info.is_main, module_flags::MAIN_PROGRAM),
        (info.is_vdso, module_flags::VDSO),
        (info.is_dynamic_linker, module_flags::DYNAMIC_LINKER),
        (!info.build_id.is_empty(), module_flags::HAS_BUILD_ID),
        // Arcs without a histogram: calls counted at the PLT into a module LD_PROFILE did not select.
        (
            module.histogram.is_none() && !module.arcs.is_empty(),
            module_flags::CALLEE_ARCS,
        ),
        // The table keeps 32 bits of each address (calls beyond are dropped), so every arc fits a compact
        // record.
        (!module.arcs.is_empty(), module_flags::COMPACT_ARCS),
    ] {
        if set {
            flags |= bit;
        }
    }
    flags
}

/// Whether a histogram is written from its non-zero buckets only.
fn is_sparse(histogram: &Histogram) -> bool {
    histogram.byte_len() >= SPARSE_FROM_BYTES
}

/// Non-zero buckets of a sparse histogram.
fn nonzero_count(histogram: &Histogram) -> usize {
    let mut count = 0;
    histogram.for_each_nonzero(|_, _| count += 1);
    count
}

/// Arcs to announce for a module: its table's occupied slots, at least as many as its arc feed produces
/// (racing insertions of one arc take two slots, which the feed merges; an arc whose calls are still in
/// another thread's cache during a snapshot has no count yet). The format pads the difference with zero-count
/// records (SPEC.md §7.1). Counting what the feed produces would walk the table once more, reading every
/// arc's counters a second time in scattered order.
fn arc_count(module: &LiveModule) -> u64 {
    module.arcs.len() as u64
}

/// Fills `entries` with the histogram's non-zero buckets, each range's run made relative to the range, and
/// returns the ranges' runs as (first entry, entries) per range, written into `runs`.
fn sparse_runs(histogram: &Histogram, entries: &mut [(u64, u32)], runs: &mut [(usize, usize)]) {
    let mut filled = 0;
    histogram.for_each_nonzero(|index, count| {
        if let Some(slot) = entries.get_mut(filled) {
            *slot = (index, count);
            filled += 1;
        }
    });
    let mut at = 0;
    for (range, run) in histogram.ranges().iter().zip(runs.iter_mut()) {
        let (first, last) = (
            range.first_bucket as u64,
            (range.first_bucket + range.bucket_count()) as u64,
        );
        let start = at;
        while at < filled && entries[at].0 < last {
            entries[at].0 = entries[at].0.saturating_sub(first);
            at += 1;
        }
        *run = (start, at - start);
    }
}

/// The range descriptors of one histogram: borrowed buckets, or runs of `entries` when sparse.
///
/// # Safety
/// No handler may write the buckets while the descriptors are alive (sampling stopped and quiesced).
unsafe fn fill_ranges<'a>(
    histogram: &'a Histogram,
    entries: Option<&'a [(u64, u32)]>,
    runs: &[(usize, usize)],
    out: &mut [RangeDesc<'a>],
) {
    // SAFETY: the caller guarantees no handler writes the buckets meanwhile.
    let (sixteen, thirty_two) = unsafe {
        (
            histogram.quiescent_buckets16(),
            histogram.quiescent_buckets32(),
        )
    };
    for (index, (range, slot)) in histogram.ranges().iter().zip(out).enumerate() {
        let buckets = range.first_bucket..range.first_bucket + range.bucket_count();
        let counts = match (entries, histogram.bucket_bits()) {
            (Some(entries), _) => {
                let (start, len) = runs.get(index).copied().unwrap_or((0, 0));
                Counts::Sparse {
                    len: range.bucket_count() as u64,
                    entries: &entries[start..start + len],
                }
            }
            (None, BucketBits::Sixteen) => Counts::U16(&sixteen[buckets]),
            (None, BucketBits::ThirtyTwo) => Counts::U32(&thirty_two[buckets]),
        };
        *slot = RangeDesc {
            start: range.start,
            end: range.end,
            counts,
        };
    }
}

/// Encodes the profile of the load instances `all` (at most [`MAX_MODULES_IN_FILE`] of them are written,
/// see [`select_for_dump`]) at `moment` into `sink`. Allocates nothing from the heap.
///
/// # Safety
/// Sampling must be stopped and quiesced (see `sampler`) for the duration of the call.
pub unsafe fn encode<S: Sink>(
    program: Program<'_>,
    moment: &Moment,
    all: &[&'static LiveModule],
    sink: &mut S,
) -> Result<(), EncodeError<S::Error>> {
    let select = |visit: &mut dyn FnMut(&'static LiveModule)| {
        select_for_dump(
            all,
            MAX_MODULES_IN_FILE,
            |m| m.is_unloaded(),
            recorded,
            visit,
        )
    };
    let mut selected = 0;
    let mut ranges = 0;
    let mut sparse_entries = 0;
    let left_out = select(&mut |m| {
        selected += 1;
        if let Some(h) = &m.histogram {
            ranges += h.ranges().len();
            if is_sparse(h) {
                sparse_entries += nonzero_count(h);
            }
        }
    });
    warn_left_out(left_out);
    let feed_for = |module: &'static LiveModule| {
        move |emit: &mut dyn FnMut(Arc) -> bool| {
            let mut open = true;
            module.arcs.for_each(|record| {
                if open {
                    open = emit(Arc {
                        caller_key: record.caller_key,
                        caller_address: record.caller_addr,
                        callee_address: record.callee_addr,
                        count: record.count,
                    });
                }
            });
        }
    };
    let Some(&first) = all.first() else {
        let header = header_desc(program, moment, &[], &[]);
        return stream::write_profile(sink, &header, &[])
            .map(|_| ())
            .map_err(EncodeError::Stream);
    };
    let feed_bytes = std::mem::size_of_val(&feed_for(first))
        .saturating_mul(selected)
        .saturating_add(std::mem::align_of_val(&feed_for(first)));
    let bytes = Arena::bytes_for::<&LiveModule>(selected)
        .saturating_add(Arena::bytes_for::<(u64, u32)>(sparse_entries))
        .saturating_add(Arena::bytes_for::<(usize, usize)>(ranges))
        .saturating_add(Arena::bytes_for::<RangeDesc<'static>>(ranges))
        .saturating_add(feed_bytes)
        .saturating_add(Arena::bytes_for::<ModuleDesc<'static>>(selected));
    let arena = Arena::new(bytes).ok_or(EncodeError::NoMemory)?;
    let modules = arena
        .slice(selected, |_| first)
        .ok_or(EncodeError::NoMemory)?;
    let mut next = 0;
    select(&mut |m| {
        if let Some(slot) = modules.get_mut(next) {
            *slot = m;
            next += 1;
        }
    });
    let modules: &[&'static LiveModule] = modules;
    let entries = arena
        .slice(sparse_entries, |_| (0u64, 0u32))
        .ok_or(EncodeError::NoMemory)?;
    let runs = arena
        .slice(ranges, |_| (0usize, 0usize))
        .ok_or(EncodeError::NoMemory)?;
    let range_store = arena
        .slice(ranges, |_| RangeDesc::default())
        .ok_or(EncodeError::NoMemory)?;
    // Each module's share of the entries, runs and ranges, in module order.
    let (mut entries_left, mut runs_left, mut ranges_left) = (entries, runs, range_store);
    let descriptors = {
        let feeds = arena
            .slice(modules.len(), |i| feed_for(modules[i]))
            .ok_or(EncodeError::NoMemory)?;
        let feeds: &[_] = feeds;
        arena
            .slice(modules.len(), |i| {
                let module = modules[i];
                let histogram = module.histogram.as_ref().map(|h| {
                    let count = h.ranges().len();
                    let (ranges, rest) = std::mem::take(&mut ranges_left).split_at_mut(count);
                    ranges_left = rest;
                    let (runs, rest) = std::mem::take(&mut runs_left).split_at_mut(count);
                    runs_left = rest;
                    let entries = is_sparse(h).then(|| {
                        let wanted = nonzero_count(h).min(entries_left.len());
                        let (mine, rest) = std::mem::take(&mut entries_left).split_at_mut(wanted);
                        entries_left = rest;
                        sparse_runs(h, mine, runs);
                        &*mine
                    });
                    // SAFETY: the caller keeps sampling quiesced while the descriptors are alive.
                    unsafe { fill_ranges(h, entries, runs, ranges) };
                    HistogramDesc {
                        bucket_bits: h.bucket_bits().bits(),
                        bytes_per_bucket: BYTES_PER_BUCKET,
                        ranges: &*ranges,
                        encoding: Encoding::Auto,
                    }
                });
                let flags = module_flag_bits(module);
                let (arc_count, arcs) =
                    if flags & (module_flags::PROFILED | module_flags::CALLEE_ARCS) != 0 {
                        let feed: ArcFeed<'_> = &feeds[i];
                        (arc_count(module), Some(feed))
                    } else {
                        (0, None)
                    };
                module_desc(module, flags, histogram, arc_count, arcs)
            })
            .ok_or(EncodeError::NoMemory)?
    };
    let header = header_desc(program, moment, descriptors, modules);
    let descriptors: &[ModuleDesc<'_>] = descriptors;
    crate::stacks::with_section(|stacks| {
        stream::write_profile_with_stacks(
            sink,
            cfg!(target_endian = "big"),
            &header,
            descriptors,
            stacks,
        )
    })
    .map(|_| ())
    .map_err(EncodeError::Stream)
}

/// The file header of a dump of `modules`.
fn header_desc<'a>(
    program: Program<'a>,
    moment: &Moment,
    descriptors: &[ModuleDesc<'_>],
    modules: &[&'a LiveModule],
) -> HeaderDesc<'a> {
    let program_path = modules
        .iter()
        .find(|m| m.info.is_main)
        .map_or(&[][..], |m| m.info.path.as_slice());
    HeaderDesc {
        flags: moment.flags,
        incomplete_cause: moment.incomplete_cause.code(),
        incomplete_signal: moment.incomplete_signal,
        pid: moment.pid,
        ppid: moment.ppid,
        start_time_ns: moment.start_time_ns,
        end_time_ns: moment.end_time_ns,
        hz: program.hz,
        sampling_sources: moment.sampling_sources,
        sample_period_ns: moment.sample_period_ns,
        dimension: b"seconds",
        dimension_abbrev: b's',
        total_samples: moment.total_samples,
        unknown_samples: moment.unknown_samples,
        dropped_arcs: descriptors.iter().map(|m| m.dropped_arcs).sum(),
        program_name: program.name,
        program_path,
        cpu_time: moment.cpu_time,
        ..HeaderDesc::default()
    }
}

/// The descriptor of one load instance: its identity and counters, with the given histogram and arcs.
fn module_desc<'a>(
    module: &'a LiveModule,
    flags: u32,
    histogram: Option<HistogramDesc<'a>>,
    arc_count: u64,
    arcs: Option<ArcFeed<'a>>,
) -> ModuleDesc<'a> {
    let info = &module.info;
    ModuleDesc {
        key: module.key,
        path: &info.path,
        name: &info.file_name,
        soname: &info.soname,
        build_id: &info.build_id,
        flags,
        load_order: module.load_order,
        unload_order: module.unload_order(),
        load_bias: module.load_bias,
        samples: module.samples.load(Ordering::Relaxed),
        saturated_buckets: module
            .histogram
            .as_ref()
            .map_or(0, Histogram::saturated_buckets),
        dropped_arcs: module.arcs.dropped(),
        histogram,
        arc_count,
        arcs,
        ..ModuleDesc::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (load order, unloaded, recorded something)
    type Instance = (u32, bool, bool);

    fn selected(all: &[Instance], limit: usize) -> (Vec<u32>, usize) {
        let mut kept = Vec::new();
        let left_out = select_for_dump(all, limit, |m| m.1, |m| m.2, |m| kept.push(m.0));
        (kept, left_out)
    }

    #[test]
    fn everything_is_written_when_it_fits() {
        let all = [(1, false, true), (2, true, false), (3, true, true)];
        assert_eq!(selected(&all, 3), (vec![1, 2, 3], 0));
    }

    #[test]
    fn loaded_first_then_unloaded_with_data_newest_first_then_empty_ones() {
        let all = [
            (1, false, false),
            (2, true, true),
            (3, true, false),
            (4, true, true),
            (5, true, false),
            (6, false, true),
            (7, true, true),
        ];
        // Loaded 1 and 6 always; data 2, 4, 7: the newest two fit.
        assert_eq!(selected(&all, 4), (vec![1, 4, 6, 7], 3));
        // All loaded and data ones, and the newest empty one.
        assert_eq!(selected(&all, 6), (vec![1, 2, 4, 5, 6, 7], 1));
        // Only loaded ones fit.
        assert_eq!(selected(&all, 2), (vec![1, 6], 5));
        // Not even every loaded one: the oldest loaded is left out.
        assert_eq!(selected(&all, 1), (vec![6], 6));
    }
}
