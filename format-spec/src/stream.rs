//! The one mslprof encoder: a streaming writer that never allocates, for the runtime and for [`crate::write()`].
//!
//! # How the runtime uses it
//!
//! At exit, at unload time or from a fatal-signal handler, `libmslprof.so` describes what it collected with
//! borrowed descriptors and hands them to [`write_profile`] together with a [`Sink`] (typically a small type
//! whose `write_all` loops over `libc::write` on the output file descriptor, retrying on `EINTR`):
//!
//! ```
//! use mslprof_format::stream::{self, Counts, HeaderDesc, HistogramDesc, ModuleDesc, RangeDesc};
//! use mslprof_format::{Arc, LinkAddress, module_flags};
//!
//! # let counts: [u16; 4] = [0, 3, 0, 1];
//! let ranges = [RangeDesc { start: LinkAddress(0x1000), end: LinkAddress(0x1010), counts: Counts::U16(&counts) }];
//! // The arc table is visited through a callback; `emit` returns false once the announced count is reached.
//! let visit_arcs = |emit: &mut dyn FnMut(Arc) -> bool| {
//!     let (caller_address, callee_address) = (LinkAddress(0x1004), LinkAddress(0x1008));
//!     emit(Arc { caller_key: 1, caller_address, callee_address, count: 7 });
//! };
//! let modules = [ModuleDesc {
//!     key: 1,
//!     path: b"/usr/bin/app",
//!     name: b"app",
//!     flags: module_flags::PROFILED | module_flags::MAIN_PROGRAM,
//!     histogram: Some(HistogramDesc {
//!         bucket_bits: 16,
//!         bytes_per_bucket: 4,
//!         ranges: &ranges,
//!         ..HistogramDesc::default()
//!     }),
//!     arc_count: 1,
//!     arcs: Some(&visit_arcs),
//!     ..ModuleDesc::default()
//! }];
//! let header = HeaderDesc { hz: 100, sample_period_ns: 10_000_000, dimension: b"seconds",
//!                           dimension_abbrev: b's', program_name: b"app", ..HeaderDesc::default() };
//! let mut file = Vec::new(); // the runtime uses an fd-backed Sink instead
//! stream::write_profile(&mut stream::IoSink(&mut file), &header, &modules).unwrap();
//! # assert!(mslprof_format::read(&file, Default::default()).is_ok());
//! ```
//!
//! Rules the runtime relies on:
//! - **No heap allocation** anywhere on this path, no locks, no errno use beyond what the sink does. Output goes
//!   through a 1 KiB buffer on the stack, so an alternate signal stack of `SIGSTKSZ` is enough.
//! - **Two passes over borrowed data.** The first validates the descriptors and computes every size and offset
//!   (it scans each histogram once to count non-zero buckets and choose dense or sparse: smaller wins, a tie is
//!   dense); the choice is kept in the module's [`Plan`]. The later passes write. If histogram memory changes
//!   between the passes (a thread still sampling), the file stays well-formed: dense values are whatever is
//!   read; a sparse histogram always gets exactly the planned number of entries (extra non-zero buckets are
//!   left out; missing ones are replaced by zero-count entries, which readers ignore).
//! - **Arcs are announced.** [`ModuleDesc::arc_count`] is the number of records written. The arc callback may
//!   produce fewer (the writer pads with zero-count records, which readers skip) but never more: `emit` returns
//!   `false` once the count is reached and further arcs are counted in [`StreamSummary::arcs_dropped`].
//! - Counts above 65535 in a 16-bit histogram are written as 65535 (saturated).
//! - The caller guarantees unique module keys (the owned writer checks them; this one cannot without memory).
//!   An arc whose caller key is not among the modules written (say, a module the caller left out) is written
//!   as coming from an unknown caller, so one stale key cannot make the whole file unreadable
//!   ([`StreamSummary::arcs_caller_unknown`]).
//! - **From a fatal-signal handler** nothing may allocate, so there is no room for a fresh array of
//!   descriptors either. Implement [`ModuleSource`] on the runtime's module table instead and call
//!   [`write_profile_from`]: it visits one module at a time, and the descriptor can be built on the stack in
//!   `with_module` (they only borrow). Give each module record a [`Plan`] (it is `Sync` and `const`-constructible)
//!   and point [`ModuleDesc::plan_slot`] at it, so the writer's decisions survive between visits. The announced
//!   arc count is read at the first visit only. Stop sampling (or at least make it stop touching the histograms)
//!   before calling: the data is read more than once.
//! - **Stacks** (the STACKS section, SPEC.md §11) are optional: pass a [`StacksDesc`] to
//!   [`write_profile_with_stacks`]. Its feed is visited twice, once to size the section and once to write it,
//!   and may yield other records the second time: the section keeps the size and record count of the first
//!   visit, a record that no longer fits is left out ([`StreamSummary::stacks_dropped`]), missing ones are
//!   replaced by empty zero-count records, which readers skip ([`StreamSummary::stacks_padded`]), and a frame
//!   whose key is not among the modules written is written as unknown.

use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64};

use crate::address::{LinkAddress, LoadBias};
use crate::layout::*;
use crate::model::{Arc, CpuTime, StackFrame, UNKNOWN_KEY, module_flags};

/// Where the bytes go. `write_all` must write the whole slice or fail.
pub trait Sink {
    type Error;
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), Self::Error>;
}

/// A [`Sink`] over any [`std::io::Write`].
#[derive(Debug)]
pub struct IoSink<W>(pub W);

impl<W: std::io::Write> Sink for IoSink<W> {
    type Error = std::io::Error;
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), Self::Error> {
        self.0.write_all(bytes)
    }
}

/// The file header (SPEC.md §4), borrowing its strings.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeaderDesc<'a> {
    pub flags: u32,
    /// `incomplete_cause` code (see [`crate::IncompleteCause::code`]).
    pub incomplete_cause: u32,
    pub incomplete_signal: u32,
    pub pid: u32,
    pub ppid: u32,
    pub start_time_ns: i64,
    pub end_time_ns: i64,
    pub hz: u32,
    /// [`crate::sampling_sources`] bits; 0: not said.
    pub sampling_sources: u32,
    pub sample_period_ns: u64,
    /// At most 15 bytes, no NUL.
    pub dimension: &'a [u8],
    pub dimension_abbrev: u8,
    pub total_samples: u64,
    pub unknown_samples: u64,
    pub dropped_arcs: u64,
    pub dropped_samples: u64,
    pub program_name: &'a [u8],
    pub program_path: &'a [u8],
    /// Written after `program_path` when known; `None` leaves the fields out (a reader then reads none).
    pub cpu_time: Option<CpuTime>,
}

/// The bucket values of one histogram range.
#[derive(Clone, Copy, Debug)]
pub enum Counts<'a> {
    U16(&'a [u16]),
    U32(&'a [u32]),
    /// `len` buckets, non-zero ones listed as (index within the range, count), indices strictly increasing.
    Sparse {
        len: u64,
        entries: &'a [(u64, u32)],
    },
}

impl Default for Counts<'_> {
    fn default() -> Self {
        Counts::U16(&[])
    }
}

impl Counts<'_> {
    fn len(&self) -> u64 {
        match self {
            Counts::U16(v) => v.len() as u64,
            Counts::U32(v) => v.len() as u64,
            Counts::Sparse { len, .. } => *len,
        }
    }
}

/// One histogram range `[start, end)` (link-time addresses) with `(end − start) / bytes_per_bucket` buckets.
#[derive(Clone, Copy, Debug, Default)]
pub struct RangeDesc<'a> {
    pub start: LinkAddress,
    pub end: LinkAddress,
    pub counts: Counts<'a>,
}

/// A module's histogram: bucket width, text bytes per bucket and its ranges, sorted and disjoint.
#[derive(Clone, Copy, Debug, Default)]
pub struct HistogramDesc<'a> {
    /// 16 or 32.
    pub bucket_bits: u8,
    /// A power of two, at most 2^30.
    pub bytes_per_bucket: u32,
    pub ranges: &'a [RangeDesc<'a>],
    /// Dense, sparse, or (default) whichever is smaller.
    pub encoding: Encoding,
}

/// How a histogram is encoded in the file (SPEC.md §7.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    /// The smaller of the two; dense on a tie. What SPEC.md asks writers to do.
    #[default]
    Auto,
    /// Always dense (skips nothing; useful to avoid the counting scan).
    Dense,
    /// Always sparse.
    Sparse,
}

/// Visits a module's arcs: calls `emit` for each; stops when `emit` returns `false`.
pub type ArcFeed<'a> = &'a dyn Fn(&mut dyn FnMut(Arc) -> bool);

/// One sampled stack as a [`StackFeed`] offers it (SPEC.md §11).
#[derive(Clone, Copy)]
pub struct StackRecordDesc<'a> {
    /// Samples that had this stack; a record with count 0 is not written.
    pub count: u64,
    /// [`crate::stack_flags`] bits.
    pub flags: u32,
    /// Number of frames, 1..=4096.
    pub depth: usize,
    /// Frame `i` (`0 ≤ i < depth`), leaf first: the sampled PC, then return addresses.
    pub frame: &'a dyn Fn(usize) -> StackFrame,
}

/// Visits the stacks: calls `emit` for each record; stops when `emit` returns `false`.
pub type StackFeed<'a> = &'a dyn Fn(&mut dyn FnMut(&StackRecordDesc<'_>) -> bool);

/// The STACKS section (SPEC.md §11): its two fixed fields and a feed of its records, which should be unique by
/// (flags, frames).
#[derive(Clone, Copy)]
pub struct StacksDesc<'a> {
    /// The depth limit in force, 1..=4096.
    pub max_depth: u32,
    /// Samples whose stack was captured but not stored.
    pub dropped: u64,
    pub records: StackFeed<'a>,
}

/// What the first pass decided for one module (kept in a [`Plan`] for the later passes).
#[derive(Clone, Copy, Debug, Default)]
struct PlanData {
    encoding: u8,
    arc_count: u64,
    /// The module's arc records are compact (flag COMPACT_ARCS as first seen).
    compact_arcs: bool,
    bucket_count: u64,
    sparse_entries: u64,
    hist_size: u64,
    hist_offset: u64,
    arc_offset: u64,
}

impl PlanData {
    /// Bytes of one of the module's arc records (SPEC.md §7.1).
    fn arc_record_size(&self) -> u64 {
        arc_record_size(self.compact_arcs)
    }
}

/// Scratch space the writer fills in its first pass and reads in the later ones: the encoding chosen, the
/// announced arc count as first seen, sizes and offsets. Create it with `Plan::default()` (or
/// `Plan::new()` in a `static`); it is `Sync`, so a runtime can keep one in each of its module records and point
/// [`ModuleDesc::plan_slot`] at it.
#[derive(Debug, Default)]
pub struct Plan {
    encoding: AtomicU8,
    arc_count: AtomicU64,
    compact_arcs: AtomicBool,
    bucket_count: AtomicU64,
    sparse_entries: AtomicU64,
    hist_size: AtomicU64,
    hist_offset: AtomicU64,
    arc_offset: AtomicU64,
}

impl Plan {
    pub const fn new() -> Self {
        Plan {
            encoding: AtomicU8::new(0),
            arc_count: AtomicU64::new(0),
            compact_arcs: AtomicBool::new(false),
            bucket_count: AtomicU64::new(0),
            sparse_entries: AtomicU64::new(0),
            hist_size: AtomicU64::new(0),
            hist_offset: AtomicU64::new(0),
            arc_offset: AtomicU64::new(0),
        }
    }

    fn get(&self) -> PlanData {
        PlanData {
            encoding: self.encoding.load(Relaxed),
            arc_count: self.arc_count.load(Relaxed),
            compact_arcs: self.compact_arcs.load(Relaxed),
            bucket_count: self.bucket_count.load(Relaxed),
            sparse_entries: self.sparse_entries.load(Relaxed),
            hist_size: self.hist_size.load(Relaxed),
            hist_offset: self.hist_offset.load(Relaxed),
            arc_offset: self.arc_offset.load(Relaxed),
        }
    }

    fn set(&self, p: PlanData) {
        self.encoding.store(p.encoding, Relaxed);
        self.arc_count.store(p.arc_count, Relaxed);
        self.compact_arcs.store(p.compact_arcs, Relaxed);
        self.bucket_count.store(p.bucket_count, Relaxed);
        self.sparse_entries.store(p.sparse_entries, Relaxed);
        self.hist_size.store(p.hist_size, Relaxed);
        self.hist_offset.store(p.hist_offset, Relaxed);
        self.arc_offset.store(p.arc_offset, Relaxed);
    }
}

/// One load instance of one module (SPEC.md §§5–6), borrowing its strings, histogram and arcs.
#[derive(Default)]
pub struct ModuleDesc<'a> {
    pub key: u32,
    pub path: &'a [u8],
    pub name: &'a [u8],
    pub soname: &'a [u8],
    pub build_id: &'a [u8],
    pub flags: u32,
    pub load_order: u32,
    pub unload_order: u32,
    pub load_bias: LoadBias,
    pub samples: u64,
    pub saturated_buckets: u64,
    pub dropped_arcs: u64,
    /// `None`: no histogram (encoding 0).
    pub histogram: Option<HistogramDesc<'a>>,
    /// Number of arc records written for this module (the announced count; read once, in the first pass).
    pub arc_count: u64,
    pub arcs: Option<ArcFeed<'a>>,
    /// Filled by the writer unless `plan_slot` is set; leave at `Plan::default()`.
    pub plan: Plan,
    /// Where the writer keeps its plan for this module when descriptors are made afresh on every visit of a
    /// [`ModuleSource`] (the inline `plan` would not survive between visits).
    pub plan_slot: Option<&'a Plan>,
}

impl ModuleDesc<'_> {
    fn plan(&self) -> &Plan {
        self.plan_slot.unwrap_or(&self.plan)
    }
}

/// The modules to write, visited one at a time, so that a caller never needs an array of descriptors (for
/// instance from a fatal-signal handler, where nothing may allocate).
///
/// `with_module(i, visit)` must call `visit` exactly once with the descriptor of module `i`
/// (`0 ≤ i < module_count()`); the writer visits each module several times (plan, key table, module headers,
/// data), and every visit must describe the same module: same key, strings, flags (but COMPACT_ARCS, of which
/// the first visit's holds), histogram ranges and slice lengths, and a `plan_slot` pointing at the same
/// [`Plan`]. Histogram values and the arcs a feed produces may
/// change between visits; the file stays well-formed (see the module documentation). While writing a module's
/// arcs, the writer calls `with_module` again (nested) to check caller keys, so it must be re-entrant.
pub trait ModuleSource {
    fn module_count(&self) -> usize;
    fn with_module(&self, index: usize, visit: &mut dyn FnMut(&ModuleDesc<'_>));
}

impl ModuleSource for [ModuleDesc<'_>] {
    fn module_count(&self) -> usize {
        self.len()
    }
    fn with_module(&self, index: usize, visit: &mut dyn FnMut(&ModuleDesc<'_>)) {
        if let Some(m) = self.get(index) {
            visit(m);
        }
    }
}

/// Why the streaming writer failed.
#[derive(Debug)]
pub enum StreamError<E> {
    /// The sink failed; the output is incomplete.
    Sink(E),
    /// A descriptor breaks a rule of SPEC.md; nothing was written.
    Invalid(&'static str),
}

impl<E: fmt::Display> fmt::Display for StreamError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Sink(e) => write!(f, "write failed: {e}"),
            StreamError::Invalid(what) => write!(f, "invalid profile: {what}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for StreamError<E> {}

/// What happened to the arcs while writing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamSummary {
    /// Zero-count records written because a callback produced fewer arcs than announced.
    pub arcs_padded: u64,
    /// Arcs a callback offered beyond the announced count, or with an address above 2³² − 1 in a module with
    /// flag COMPACT_ARCS (not written).
    pub arcs_dropped: u64,
    /// Arcs whose caller key was not among the modules written: written as unknown/spontaneous callers
    /// (caller key `0xFFFFFFFF`, address 0) so that the file stays readable.
    pub arcs_caller_unknown: u64,
    /// Empty zero-count stack records written because the feed yielded fewer records than it did when the
    /// section was sized.
    pub stacks_padded: u64,
    /// Stack records the feed offered that did not fit the section as sized, or whose depth changed to one
    /// outside 1..=4096 (not written).
    pub stacks_dropped: u64,
    /// Stack frames whose key was not among the modules written: written as unknown (key `0xFFFFFFFF`,
    /// address 0).
    pub stack_frames_unknown: u64,
}

/// Writes a complete mslprof file in the machine's byte order. See the module documentation.
pub fn write_profile<S: Sink>(
    sink: &mut S,
    header: &HeaderDesc<'_>,
    modules: &[ModuleDesc<'_>],
) -> Result<StreamSummary, StreamError<S::Error>> {
    write_profile_with_byte_order(sink, cfg!(target_endian = "big"), header, modules)
}

/// Like [`write_profile`], in the given byte order (for tests and cross-tools; readers accept both).
pub fn write_profile_with_byte_order<S: Sink>(
    sink: &mut S,
    big_endian: bool,
    header: &HeaderDesc<'_>,
    modules: &[ModuleDesc<'_>],
) -> Result<StreamSummary, StreamError<S::Error>> {
    write_profile_from(sink, big_endian, header, modules)
}

/// Writes a complete mslprof file from a [`ModuleSource`], in the given byte order. Allocates nothing.
pub fn write_profile_from<S: Sink, M: ModuleSource + ?Sized>(
    sink: &mut S,
    big_endian: bool,
    header: &HeaderDesc<'_>,
    modules: &M,
) -> Result<StreamSummary, StreamError<S::Error>> {
    write_profile_with_stacks(sink, big_endian, header, modules, None)
}

/// Like [`write_profile_from`], with a STACKS section after DATA when `stacks` is given. Allocates nothing.
pub fn write_profile_with_stacks<S: Sink, M: ModuleSource + ?Sized>(
    sink: &mut S,
    big_endian: bool,
    header: &HeaderDesc<'_>,
    modules: &M,
    stacks: Option<&StacksDesc<'_>>,
) -> Result<StreamSummary, StreamError<S::Error>> {
    let mut layout = plan(header, modules).map_err(StreamError::Invalid)?;
    layout.stacks = stacks
        .map(plan_stacks)
        .transpose()
        .map_err(StreamError::Invalid)?;
    let mut e = Encoder {
        sink,
        big_endian,
        buf: [0; BUFFER],
        len: 0,
        written: 0,
    };
    let mut summary = emit(&mut e, header, modules, &layout).map_err(StreamError::Sink)?;
    if let (Some(desc), Some(sized)) = (stacks, layout.stacks) {
        write_stacks(&mut e, desc, sized, modules, &mut summary).map_err(StreamError::Sink)?;
    }
    e.flush().map_err(StreamError::Sink)?;
    Ok(summary)
}

/// Sizes of the sections, from the first pass.
struct Layout {
    module_count: u32,
    file_header: u64,
    key_table: u64,
    module_headers: u64,
    data_start: u64,
    data: u64,
    stacks: Option<StacksSize>,
}

/// The STACKS section as the first visit of its feed sized it.
#[derive(Clone, Copy)]
struct StacksSize {
    records: u32,
    payload: u64,
}

const BUFFER: usize = 1024;

fn checked(v: Option<u64>) -> Result<u64, &'static str> {
    v.ok_or("profile too large")
}

fn section_end(start: u64, payload: u64) -> Result<u64, &'static str> {
    checked(
        start
            .checked_add(SECTION_HEADER_SIZE)
            .and_then(|v| v.checked_add(payload))
            .and_then(align8),
    )
}

fn string_ok(s: &[u8], what: &'static str) -> Result<u64, &'static str> {
    if s.len() > MAX_STRING {
        Err(what)
    } else {
        Ok(s.len() as u64)
    }
}

fn entry_length(m: &ModuleDesc<'_>) -> u64 {
    let ranges = m.histogram.map_or(0, |h| h.ranges.len() as u64);
    MODULE_ENTRY_FIXED
        + RANGE_SIZE * ranges
        + 2
        + m.name.len() as u64
        + 2
        + m.soname.len() as u64
        + 1
        + m.build_id.len() as u64
}

/// Validates a histogram and returns (bucket_count, non-zero buckets).
fn scan_histogram(h: &HistogramDesc<'_>) -> Result<(u64, u64), &'static str> {
    if h.bucket_bits != 16 && h.bucket_bits != 32 {
        return Err("bucket_bits must be 16 or 32");
    }
    if !h.bytes_per_bucket.is_power_of_two() || h.bytes_per_bucket > MAX_BYTES_PER_BUCKET {
        return Err("bytes_per_bucket must be a power of two up to 2^30");
    }
    if h.ranges.len() > MAX_RANGES as usize {
        return Err("more than 64 histogram ranges");
    }
    let bpb = u64::from(h.bytes_per_bucket);
    let mut total: u64 = 0;
    let mut nonzero: u64 = 0;
    let mut previous_end: Option<LinkAddress> = None;
    for r in h.ranges {
        if r.end < r.start || previous_end.is_some_and(|p| r.start < p) {
            return Err("histogram ranges must be ordered, disjoint and not reversed");
        }
        previous_end = Some(r.end);
        let span = r.end.0 - r.start.0;
        if span % bpb != 0 || span / bpb != r.counts.len() {
            return Err("histogram range length does not match its bucket count");
        }
        total = checked(total.checked_add(r.counts.len()))?;
        nonzero += match r.counts {
            Counts::U16(v) => v.iter().filter(|c| **c != 0).count() as u64,
            Counts::U32(v) => v.iter().filter(|c| **c != 0).count() as u64,
            Counts::Sparse { len, entries } => {
                let mut previous: Option<u64> = None;
                for &(index, _) in entries {
                    if index >= len || previous.is_some_and(|p| index <= p) {
                        return Err(
                            "sparse entries must be strictly increasing and inside the range",
                        );
                    }
                    previous = Some(index);
                }
                entries.iter().filter(|(_, c)| *c != 0).count() as u64
            }
        };
    }
    if total > MAX_BUCKETS {
        return Err("more than 2^34 histogram buckets");
    }
    Ok((total, nonzero))
}

/// Validates one module and returns its contribution to the key table and module header sizes.
fn check_module(m: &ModuleDesc<'_>) -> Result<(u64, u64), &'static str> {
    if m.key == UNKNOWN_KEY {
        return Err("key 0xFFFFFFFF is reserved");
    }
    let key_table = 8 + string_ok(m.path, "module path longer than 4096 bytes")?;
    string_ok(m.name, "module name longer than 4096 bytes")?;
    string_ok(m.soname, "module soname longer than 4096 bytes")?;
    if m.build_id.len() > MAX_BUILD_ID {
        return Err("build-id longer than 64 bytes");
    }
    if m.arc_count > MAX_ARCS {
        return Err("more than 2^32 arcs in one module");
    }
    if m.flags & module_flags::PROFILED == 0
        && (m.histogram.is_some() || (m.arc_count != 0 && m.flags & module_flags::CALLEE_ARCS == 0))
    {
        return Err(
            "only PROFILED modules have a histogram, and arcs only PROFILED or CALLEE_ARCS ones",
        );
    }
    if m.histogram
        .is_some_and(|h| h.ranges.len() > MAX_RANGES as usize)
    {
        return Err("more than 64 histogram ranges");
    }
    Ok((key_table, entry_length(m)))
}

/// Plans one module's data at `cursor` (arc count from the first visit); returns the cursor after it.
fn place_module(m: &ModuleDesc<'_>, mut cursor: u64) -> Result<u64, &'static str> {
    let mut p = PlanData {
        arc_count: m.plan().get().arc_count,
        compact_arcs: m.flags & module_flags::COMPACT_ARCS != 0,
        ..PlanData::default()
    };
    if p.arc_count != 0 {
        cursor = checked(align8(cursor))?;
        p.arc_offset = cursor;
        cursor = checked(cursor.checked_add(p.arc_count * p.arc_record_size()))?;
    }
    if let Some(h) = &m.histogram {
        let (buckets, nonzero) = scan_histogram(h)?;
        let dense = buckets * u64::from(h.bucket_bits / 8);
        let sparse = nonzero * SPARSE_ENTRY_SIZE;
        p.bucket_count = buckets;
        let use_sparse = match h.encoding {
            Encoding::Auto => sparse < dense,
            Encoding::Dense => false,
            Encoding::Sparse => true,
        };
        if use_sparse {
            p.encoding = HIST_SPARSE;
            p.sparse_entries = nonzero;
            p.hist_size = sparse;
        } else {
            p.encoding = HIST_DENSE;
            p.hist_size = dense;
        }
        if p.hist_size != 0 {
            cursor = checked(align8(cursor))?;
            p.hist_offset = cursor;
            cursor = checked(cursor.checked_add(p.hist_size))?;
        }
    }
    m.plan().set(p);
    Ok(cursor)
}

/// First pass: validate, choose encodings, compute sizes and offsets.
fn plan<M: ModuleSource + ?Sized>(
    header: &HeaderDesc<'_>,
    modules: &M,
) -> Result<Layout, &'static str> {
    if header.dimension.len() > DIMENSION_SIZE || header.dimension.contains(&0) {
        return Err("dimension must be at most 15 bytes without NUL");
    }
    let name = string_ok(header.program_name, "program name longer than 4096 bytes")?;
    let path = string_ok(header.program_path, "program path longer than 4096 bytes")?;
    let count = modules.module_count();
    if count > MAX_MODULES as usize {
        return Err("more than 65536 modules");
    }
    let cpu = if header.cpu_time.is_some() { 16 } else { 0 };
    let file_header = FILE_HEADER_FIXED + 2 + name + 2 + path + cpu;
    let mut key_table: u64 = 4;
    let mut module_headers: u64 = 4;
    for i in 0..count {
        let mut result = Err("a module source did not visit a module");
        modules.with_module(i, &mut |m| {
            result = check_module(m);
            m.plan().set(PlanData {
                arc_count: m.arc_count,
                ..PlanData::default()
            });
        });
        let (kt, mh) = result?;
        key_table += kt;
        module_headers += mh;
    }
    let fh_end = section_end(PREAMBLE_SIZE, file_header)?;
    let kt_end = section_end(fh_end, key_table)?;
    let mh_end = section_end(kt_end, module_headers)?;
    let data_start = checked(mh_end.checked_add(SECTION_HEADER_SIZE))?;
    let mut cursor = data_start;
    for i in 0..count {
        let mut result = Err("a module source did not visit a module");
        modules.with_module(i, &mut |m| result = place_module(m, cursor));
        cursor = result?;
    }
    Ok(Layout {
        module_count: count as u32,
        file_header,
        key_table,
        module_headers,
        data_start,
        data: cursor - data_start,
        stacks: None,
    })
}

/// Validates the STACKS description and sizes its section from one visit of the feed.
fn plan_stacks(s: &StacksDesc<'_>) -> Result<StacksSize, &'static str> {
    if s.max_depth == 0 || s.max_depth > MAX_STACK_DEPTH {
        return Err("stack max_depth must be 1..=4096");
    }
    let (mut records, mut frames) = (0u64, 0u64);
    let mut bad_depth = false;
    (s.records)(&mut |r| {
        if r.count == 0 {
            return true;
        }
        if r.depth == 0 || r.depth > MAX_STACK_DEPTH as usize {
            bad_depth = true;
            return false;
        }
        records += 1;
        frames += r.depth as u64;
        true
    });
    if bad_depth {
        return Err("a stack's depth must be 1..=4096");
    }
    let records = u32::try_from(records).map_err(|_| "more than 2^32 - 1 stack records")?;
    let payload = checked(
        (frames.checked_mul(STACK_FRAME_SIZE))
            .and_then(|f| f.checked_add(u64::from(records) * STACK_RECORD_FIXED))
            .and_then(|r| r.checked_add(STACKS_FIXED)),
    )?;
    Ok(StacksSize { records, payload })
}

/// Buffered, byte-order-aware output to a sink, with a running offset.
struct Encoder<'s, S: Sink> {
    sink: &'s mut S,
    big_endian: bool,
    buf: [u8; BUFFER],
    len: usize,
    written: u64,
}

impl<S: Sink> Encoder<'_, S> {
    fn bytes(&mut self, mut b: &[u8]) -> Result<(), S::Error> {
        self.written += b.len() as u64;
        while !b.is_empty() {
            if self.len == BUFFER {
                self.flush()?;
            }
            let n = b.len().min(BUFFER - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&b[..n]);
            self.len += n;
            b = &b[n..];
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), S::Error> {
        if self.len > 0 {
            self.sink.write_all(&self.buf[..self.len])?;
            self.len = 0;
        }
        Ok(())
    }
    fn u8(&mut self, v: u8) -> Result<(), S::Error> {
        self.bytes(&[v])
    }
    fn u16(&mut self, v: u16) -> Result<(), S::Error> {
        self.bytes(&if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        })
    }
    fn u32(&mut self, v: u32) -> Result<(), S::Error> {
        self.bytes(&if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        })
    }
    fn u64(&mut self, v: u64) -> Result<(), S::Error> {
        self.bytes(&if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        })
    }
    fn i64(&mut self, v: i64) -> Result<(), S::Error> {
        self.bytes(&if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        })
    }
    /// `str16`; the length was validated in the first pass.
    fn str16(&mut self, s: &[u8]) -> Result<(), S::Error> {
        self.u16(s.len() as u16)?;
        self.bytes(s)
    }
    fn pad_to(&mut self, offset: u64) -> Result<(), S::Error> {
        while self.written < offset {
            self.u8(0)?;
        }
        Ok(())
    }
    fn pad8(&mut self) -> Result<(), S::Error> {
        let target = align8(self.written).unwrap_or(self.written);
        self.pad_to(target)
    }
    fn section(&mut self, tag: u32, payload: u64) -> Result<(), S::Error> {
        self.section_flagged(tag, SECTION_CRITICAL, payload)
    }
    fn section_flagged(&mut self, tag: u32, flags: u32, payload: u64) -> Result<(), S::Error> {
        self.u32(tag)?;
        self.u32(flags)?;
        self.u64(payload)
    }
    /// One arc record (SPEC.md §7.1), copied into the buffer at once: a dump writes hundreds of
    /// thousands of them.
    #[inline(always)]
    fn arc(&mut self, arc: Arc, compact: bool) -> Result<(), S::Error> {
        let big = self.big_endian;
        let key = if big {
            arc.caller_key.to_be_bytes()
        } else {
            arc.caller_key.to_le_bytes()
        };
        let word = |w: u64| {
            if big {
                w.to_be_bytes()
            } else {
                w.to_le_bytes()
            }
        };
        // A compact record's addresses were checked to fit 32 bits by the caller.
        let half = |w: u64| {
            let w = w as u32;
            if big {
                w.to_be_bytes()
            } else {
                w.to_le_bytes()
            }
        };
        let fill = |record: &mut [u8]| {
            record[..4].copy_from_slice(&key);
            if compact {
                record[4..8].copy_from_slice(&half(arc.caller_address.0));
                record[8..12].copy_from_slice(&half(arc.callee_address.0));
                record[12..20].copy_from_slice(&word(arc.count));
            } else {
                record[4..8].fill(0);
                record[8..16].copy_from_slice(&word(arc.caller_address.0));
                record[16..24].copy_from_slice(&word(arc.callee_address.0));
                record[24..32].copy_from_slice(&word(arc.count));
            }
        };
        // A dump of 200 000 arcs writes 200 000 records: each goes straight into the buffer when it fits
        // (a record built aside and then copied stalls on every copy: the copy's loads span its stores).
        let size = arc_record_size(compact) as usize;
        if let Some(free) = self.buf.get_mut(self.len..self.len + size) {
            fill(free);
            self.len += size;
            self.written += size as u64;
            return Ok(());
        }
        let mut record = [0u8; ARC_RECORD_SIZE as usize];
        fill(&mut record);
        self.bytes(&record[..size])
    }
    fn bucket(&mut self, bits: u8, count: u32) -> Result<(), S::Error> {
        if bits == 16 {
            self.u16(u16::try_from(count).unwrap_or(u16::MAX))
        } else {
            self.u32(count)
        }
    }
    fn sparse_entry(&mut self, index: u64, count: u32) -> Result<(), S::Error> {
        self.u64(index)?;
        self.u32(count)
    }
}

/// The key of module `index` of a source.
fn key_of<M: ModuleSource + ?Sized>(modules: &M, index: usize) -> u32 {
    let mut key = UNKNOWN_KEY;
    modules.with_module(index, &mut |m| key = m.key);
    key
}

/// Whether `key` is the key of one of the modules written (or the reserved unknown key).
fn key_known<M: ModuleSource + ?Sized>(modules: &M, keys_sorted: bool, key: u32) -> bool {
    if key == UNKNOWN_KEY {
        return true;
    }
    let count = modules.module_count();
    if !keys_sorted {
        return (0..count).any(|i| key_of(modules, i) == key);
    }
    let (mut low, mut high) = (0usize, count);
    while low < high {
        let mid = low + (high - low) / 2;
        let k = key_of(modules, mid);
        match k.cmp(&key) {
            std::cmp::Ordering::Equal => return true,
            std::cmp::Ordering::Less => low = mid + 1,
            std::cmp::Ordering::Greater => high = mid,
        }
    }
    false
}

/// Writes one module header entry (SPEC.md §6) from its descriptor and plan.
fn module_entry<S: Sink>(e: &mut Encoder<'_, S>, m: &ModuleDesc<'_>) -> Result<(), S::Error> {
    let p = m.plan().get();
    let hist = m.histogram.unwrap_or_default();
    e.u32(entry_length(m) as u32)?;
    e.u32(m.key)?;
    // The layout bit as planned: a runtime's module may get its first arc between the visits.
    let flags = if p.compact_arcs {
        m.flags | module_flags::COMPACT_ARCS
    } else {
        m.flags & !module_flags::COMPACT_ARCS
    };
    e.u32(flags)?;
    e.u32(m.load_order)?;
    e.u32(m.unload_order)?;
    e.u8(hist.bucket_bits)?;
    e.u8(p.encoding)?;
    e.u16(0)?;
    e.u32(hist.bytes_per_bucket)?;
    e.u32(hist.ranges.len() as u32)?;
    e.u64(m.load_bias.0)?;
    e.u64(m.samples)?;
    e.u64(m.saturated_buckets)?;
    e.u64(m.dropped_arcs)?;
    e.u64(p.hist_offset)?;
    e.u64(p.hist_size)?;
    e.u64(p.bucket_count)?;
    e.u64(p.arc_offset)?;
    e.u64(p.arc_count * p.arc_record_size())?;
    e.u64(p.arc_count)?;
    for r in hist.ranges {
        e.u64(r.start.0)?;
        e.u64(r.end.0)?;
    }
    e.str16(m.name)?;
    e.str16(m.soname)?;
    e.u8(m.build_id.len() as u8)?;
    e.bytes(m.build_id)
}

/// Writes one module's arcs and histogram at the offsets planned for them.
fn module_data<S: Sink>(
    e: &mut Encoder<'_, S>,
    m: &ModuleDesc<'_>,
    known: &dyn Fn(u32) -> bool,
    summary: &mut StreamSummary,
) -> Result<(), S::Error> {
    let p = m.plan().get();
    if p.arc_count != 0 {
        e.pad_to(p.arc_offset)?;
        write_arcs(e, m, p.arc_count, known, summary)?;
    }
    if let Some(h) = &m.histogram
        && p.hist_size != 0
    {
        e.pad_to(p.hist_offset)?;
        if p.encoding == HIST_DENSE {
            write_dense(e, h)?;
        } else {
            write_sparse(e, h, p)?;
        }
    }
    Ok(())
}

/// Later passes: write everything the first pass planned.
fn emit<S: Sink, M: ModuleSource + ?Sized>(
    e: &mut Encoder<'_, S>,
    h: &HeaderDesc<'_>,
    modules: &M,
    layout: &Layout,
) -> Result<StreamSummary, S::Error> {
    let mut summary = StreamSummary::default();
    let count = layout.module_count as usize;
    e.bytes(&MAGIC)?;
    e.u16(VERSION_MAJOR)?;
    e.u16(VERSION_MINOR)?;
    e.u32(BYTE_ORDER_MARK)?;

    e.section(TAG_FILE_HEADER, layout.file_header)?;
    e.u32(h.flags)?;
    e.u32(h.incomplete_cause)?;
    e.u32(h.incomplete_signal)?;
    e.u32(h.pid)?;
    e.u32(h.ppid)?;
    e.u32(layout.module_count)?;
    e.i64(h.start_time_ns)?;
    e.i64(h.end_time_ns)?;
    e.u32(h.hz)?;
    e.u32(h.sampling_sources)?;
    e.u64(h.sample_period_ns)?;
    let mut dimension = [0u8; DIMENSION_SIZE];
    dimension[..h.dimension.len()].copy_from_slice(h.dimension);
    e.bytes(&dimension)?;
    e.u8(h.dimension_abbrev)?;
    e.u64(h.total_samples)?;
    e.u64(h.unknown_samples)?;
    e.u64(h.dropped_arcs)?;
    e.u64(h.dropped_samples)?;
    e.str16(h.program_name)?;
    e.str16(h.program_path)?;
    if let Some(cpu) = h.cpu_time {
        e.u64(cpu.user_ns)?;
        e.u64(cpu.system_ns)?;
    }
    e.pad8()?;

    e.section(TAG_KEY_TABLE, layout.key_table)?;
    e.u32(layout.module_count)?;
    for i in 0..count {
        let mut result = Ok(());
        modules.with_module(i, &mut |m| {
            result = (|| {
                e.u32(m.key)?;
                e.u32(m.path.len() as u32)?;
                e.bytes(m.path)
            })();
        });
        result?;
    }
    e.pad8()?;

    e.section(TAG_MODULE_HEADERS, layout.module_headers)?;
    e.u32(layout.module_count)?;
    for i in 0..count {
        let mut result = Ok(());
        modules.with_module(i, &mut |m| result = module_entry(e, m));
        result?;
    }
    e.pad8()?;

    e.section(TAG_DATA, layout.data)?;
    debug_assert_eq!(e.written, layout.data_start);
    let keys_sorted = (1..count).all(|i| key_of(modules, i - 1) < key_of(modules, i));
    let known = |key: u32| key_known(modules, keys_sorted, key);
    for i in 0..count {
        let mut result = Ok(());
        modules.with_module(i, &mut |m| result = module_data(e, m, &known, &mut summary));
        result?;
    }
    e.pad8()?;
    Ok(summary)
}

/// Writes the STACKS section (header, fixed fields, records, padding) as `size` planned it.
fn write_stacks<S: Sink, M: ModuleSource + ?Sized>(
    e: &mut Encoder<'_, S>,
    desc: &StacksDesc<'_>,
    size: StacksSize,
    modules: &M,
    summary: &mut StreamSummary,
) -> Result<(), S::Error> {
    e.section_flagged(TAG_STACKS, 0, size.payload)?;
    let end = e.written + size.payload;
    e.u32(size.records)?;
    e.u32(desc.max_depth)?;
    e.u64(desc.dropped)?;
    let count = modules.module_count();
    let keys_sorted = (1..count).all(|i| key_of(modules, i - 1) < key_of(modules, i));
    let mut left = u64::from(size.records);
    let mut failure: Option<S::Error> = None;
    (desc.records)(&mut |r| {
        if r.count == 0 {
            return true;
        }
        // A valid depth, and room for this record and for an empty one in each slot still to fill after it.
        let fits = r.depth != 0
            && r.depth <= MAX_STACK_DEPTH as usize
            && left != 0
            && e.written + STACK_RECORD_FIXED * left + STACK_FRAME_SIZE * r.depth as u64 <= end;
        if !fits {
            summary.stacks_dropped += 1;
            return true;
        }
        let mut write = || -> Result<(), S::Error> {
            e.u64(r.count)?;
            e.u32(r.flags)?;
            e.u32(r.depth as u32)?;
            for i in 0..r.depth {
                let mut frame = (r.frame)(i);
                if !key_known(modules, keys_sorted, frame.key) {
                    summary.stack_frames_unknown += 1;
                    frame = StackFrame {
                        key: UNKNOWN_KEY,
                        address: LinkAddress(0),
                    };
                }
                e.u32(frame.key)?;
                e.u64(frame.address.0)?;
            }
            Ok(())
        };
        match write() {
            Ok(()) => {
                left -= 1;
                true
            }
            Err(err) => {
                failure = Some(err);
                false
            }
        }
    });
    if let Some(err) = failure {
        return Err(err);
    }
    summary.stacks_padded += left;
    for _ in 0..left {
        e.u64(0)?;
        e.u32(0)?;
        e.u32(0)?;
    }
    // Bytes after the last record (when the feed yielded smaller records than planned) are ignored by readers.
    e.pad_to(end)?;
    e.pad8()
}

fn write_arcs<S: Sink>(
    e: &mut Encoder<'_, S>,
    m: &ModuleDesc<'_>,
    announced: u64,
    known: &dyn Fn(u32) -> bool,
    summary: &mut StreamSummary,
) -> Result<(), S::Error> {
    let compact = m.plan().get().compact_arcs;
    let mut written: u64 = 0;
    let mut failure: Option<S::Error> = None;
    let mut dropped: u64 = 0;
    let mut caller_unknown: u64 = 0;
    // The caller key last found among the modules written: most arcs of a module share a few.
    let mut last_known = None;
    if let Some(feed) = m.arcs {
        feed(&mut |mut arc: Arc| {
            if failure.is_some() {
                return false;
            }
            if written >= announced {
                dropped += 1;
                return false;
            }
            if last_known != Some(arc.caller_key) {
                if known(arc.caller_key) {
                    last_known = Some(arc.caller_key);
                } else {
                    caller_unknown += 1;
                    arc.caller_key = UNKNOWN_KEY;
                    arc.caller_address = LinkAddress(0);
                }
            }
            if compact && !fits_compact_record(&arc) {
                dropped += 1;
                return true;
            }
            match e.arc(arc, compact) {
                Ok(()) => {
                    written += 1;
                    written < announced
                }
                Err(err) => {
                    failure = Some(err);
                    false
                }
            }
        });
    }
    if let Some(err) = failure {
        return Err(err);
    }
    summary.arcs_dropped += dropped;
    summary.arcs_caller_unknown += caller_unknown;
    summary.arcs_padded += announced - written;
    let padding = Arc {
        caller_key: UNKNOWN_KEY,
        caller_address: LinkAddress(0),
        callee_address: LinkAddress(0),
        count: 0,
    };
    while written < announced {
        e.arc(padding, compact)?;
        written += 1;
    }
    Ok(())
}

fn write_dense<S: Sink>(e: &mut Encoder<'_, S>, h: &HistogramDesc<'_>) -> Result<(), S::Error> {
    let bits = h.bucket_bits;
    for r in h.ranges {
        match r.counts {
            Counts::U16(v) => {
                for c in v {
                    e.bucket(bits, u32::from(*c))?;
                }
            }
            Counts::U32(v) => {
                for c in v {
                    e.bucket(bits, *c)?;
                }
            }
            Counts::Sparse { len, entries } => {
                let mut next = 0u64;
                for &(index, count) in entries {
                    while next < index {
                        e.bucket(bits, 0)?;
                        next += 1;
                    }
                    e.bucket(bits, count)?;
                    next = index + 1;
                }
                while next < len {
                    e.bucket(bits, 0)?;
                    next += 1;
                }
            }
        }
    }
    Ok(())
}

/// Writes exactly `plan.sparse_entries` entries with strictly increasing indices, whatever the data does.
fn write_sparse<S: Sink>(
    e: &mut Encoder<'_, S>,
    h: &HistogramDesc<'_>,
    p: PlanData,
) -> Result<(), S::Error> {
    let clamp = |c: u32| {
        if h.bucket_bits == 16 {
            c.min(u32::from(u16::MAX))
        } else {
            c
        }
    };
    let mut left = p.sparse_entries;
    let mut base: u64 = 0;
    // Emits bucket `index` if it is non-zero, or if every remaining bucket is needed to reach the count.
    let mut offer = |e: &mut Encoder<'_, S>, index: u64, count: u32| -> Result<(), S::Error> {
        if left == 0 {
            return Ok(());
        }
        let buckets_left = p.bucket_count - index;
        if count != 0 || left >= buckets_left {
            e.sparse_entry(index, clamp(count))?;
            left -= 1;
        }
        Ok(())
    };
    for r in h.ranges {
        match r.counts {
            Counts::U16(v) => {
                for (i, c) in v.iter().enumerate() {
                    offer(e, base + i as u64, u32::from(*c))?;
                }
            }
            Counts::U32(v) => {
                for (i, c) in v.iter().enumerate() {
                    offer(e, base + i as u64, *c)?;
                }
            }
            Counts::Sparse { entries, .. } => {
                for &(i, c) in entries {
                    if c != 0 {
                        offer(e, base + i, c)?;
                    }
                }
            }
        }
        base += r.counts.len();
    }
    Ok(())
}
