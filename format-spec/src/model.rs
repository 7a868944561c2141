//! The in-memory profile: what every reader produces and what the owned writer consumes.
//!
//! One [`Profile`] is the whole process. Each [`Module`] is one *load instance* of one ELF module, identified by
//! its key. GNU and BSD gmon.out files become a profile with a single module (the main program).
//! Every address here is a link-time address of the module it belongs to (see SPEC.md §1).

use crate::address::{LinkAddress, LoadBias};

/// The arc caller key meaning "unknown / spontaneous" (SPEC.md §5).
pub const UNKNOWN_KEY: u32 = 0xFFFF_FFFF;

/// Which on-disk format a profile was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// The keyed multi-module mslprof format of SPEC.md.
    Mslprof { major: u16, minor: u16 },
    /// GNU gmon.out (magic `gmon`).
    Gnu { version: u32 },
    /// The old BSD gmon.out (no magic).
    Bsd,
}

/// Bits of [`Header::flags`] (SPEC.md §4).
pub mod header_flags {
    pub const INCOMPLETE: u32 = 1 << 0;
    pub const MERGED: u32 = 1 << 1;
    pub const PRE_EXEC: u32 = 1 << 2;
    pub const FORKED_CHILD: u32 = 1 << 3;
    pub const SAMPLING_SHARED_TIMER: u32 = 1 << 4;
    /// A thread whose samples are signals blocked SIGPROF: it was not sampled while it did.
    pub const SIGPROF_BLOCKED: u32 = 1 << 5;
}

/// Bits of [`Header::sampling_sources`] (SPEC.md §4, since 1.3): what sent the runtime its sample signals.
pub mod sampling_sources {
    /// Per-thread CPU-time timers, which the kernel checks on its tick.
    pub const CPU_TIMER: u32 = 1 << 0;
    /// Per-thread task-clock perf events (`PERF_COUNT_SW_TASK_CLOCK`), at the rate asked for.
    pub const TASK_CLOCK: u32 = 1 << 1;
}

/// Bits of [`Module::flags`] (SPEC.md §6).
pub mod module_flags {
    pub const PROFILED: u32 = 1 << 0;
    pub const UNLOADED: u32 = 1 << 1;
    pub const MAIN_PROGRAM: u32 = 1 << 2;
    pub const VDSO: u32 = 1 << 3;
    pub const DYNAMIC_LINKER: u32 = 1 << 4;
    pub const HAS_BUILD_ID: u32 = 1 << 5;
    /// Since 1.2: a module LD_PROFILE did not select that carries arcs all the same, the calls into it
    /// counted at the PLT from selected modules (never set together with PROFILED).
    pub const CALLEE_ARCS: u32 = 1 << 6;
    /// Since 1.5: the module's arc records are 20 bytes, both addresses in 32 bits (SPEC.md §7.1). A layout
    /// bit: writers set it where every arc's addresses fit, and readers take it out of
    /// [`Module::flags`](super::Module::flags).
    pub const COMPACT_ARCS: u32 = 1 << 7;
}

/// Why a profile is incomplete (SPEC.md §4, `incomplete_cause`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IncompleteCause {
    #[default]
    None,
    Signal,
    UnderscoreExit,
    ExitFromThread,
    Exec,
    InternalFault,
    /// A cause code this reader does not know (a newer minor version).
    Other(u32),
}

impl IncompleteCause {
    pub fn code(self) -> u32 {
        match self {
            IncompleteCause::None => 0,
            IncompleteCause::Signal => 1,
            IncompleteCause::UnderscoreExit => 2,
            IncompleteCause::ExitFromThread => 3,
            IncompleteCause::Exec => 4,
            IncompleteCause::InternalFault => 5,
            IncompleteCause::Other(c) => c,
        }
    }

    pub fn from_code(code: u32) -> Self {
        match code {
            0 => IncompleteCause::None,
            1 => IncompleteCause::Signal,
            2 => IncompleteCause::UnderscoreExit,
            3 => IncompleteCause::ExitFromThread,
            4 => IncompleteCause::Exec,
            5 => IncompleteCause::InternalFault,
            c => IncompleteCause::Other(c),
        }
    }
}

/// The file header (SPEC.md §4). For GNU/BSD input, fields the format lacks are zero or empty.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Header {
    pub flags: u32,
    pub incomplete_cause: IncompleteCause,
    pub incomplete_signal: u32,
    pub pid: u32,
    pub ppid: u32,
    pub start_time_ns: i64,
    pub end_time_ns: i64,
    /// Nominal rate in samples per second (GNU: the histogram's `prof_rate`): the rate requested.
    pub hz: u32,
    /// What sent the sample signals ([`sampling_sources`] bits); 0 when the file does not say (GNU/BSD input,
    /// mslprof files before 1.3).
    pub sampling_sources: u32,
    /// True period of one sample in nanoseconds (GNU input: `1e9 / prof_rate`); `1e9 / sample_period_ns` is the
    /// rate achieved.
    pub sample_period_ns: u64,
    /// Unit name, at most 15 bytes, normally `seconds`.
    pub dimension: Vec<u8>,
    /// Unit abbreviation, normally `b's'`.
    pub dimension_abbrev: u8,
    pub total_samples: u64,
    pub unknown_samples: u64,
    pub dropped_arcs: u64,
    pub dropped_samples: u64,
    pub program_name: Vec<u8>,
    pub program_path: Vec<u8>,
    /// The process's user and system CPU time when the file was written (SPEC.md §4); `None` when the file
    /// does not say (GNU/BSD input, or an mslprof file written before format 1.1).
    pub cpu_time: Option<CpuTime>,
}

/// CPU time the kernel charged to a process, split into user and system (kernel) time, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CpuTime {
    pub user_ns: u64,
    pub system_ns: u64,
}

/// Bucket values of one histogram range, stored the way that costs least memory.
///
/// Equality compares values, not storage: `Dense16([0, 5])`, `Dense32([0, 5])` and
/// `Sparse { len: 2, entries: [(1, 5)] }` are equal (a writer may pick either encoding).
#[derive(Clone, Debug)]
pub enum Buckets {
    Dense16(Vec<u16>),
    Dense32(Vec<u32>),
    /// `len` buckets of which only `entries` (index, count) are non-zero; indices strictly increasing.
    Sparse {
        len: u64,
        entries: Vec<(u64, u32)>,
    },
}

impl Buckets {
    /// Number of buckets (the dense count).
    pub fn len(&self) -> u64 {
        match self {
            Buckets::Dense16(v) => v.len() as u64,
            Buckets::Dense32(v) => v.len() as u64,
            Buckets::Sparse { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The non-zero buckets as (index, count), in increasing index order.
    pub fn nonzero(&self) -> Box<dyn Iterator<Item = (u64, u32)> + '_> {
        match self {
            Buckets::Dense16(v) => Box::new(
                v.iter()
                    .enumerate()
                    .filter(|(_, c)| **c != 0)
                    .map(|(i, c)| (i as u64, u32::from(*c))),
            ),
            Buckets::Dense32(v) => Box::new(
                v.iter()
                    .enumerate()
                    .filter(|(_, c)| **c != 0)
                    .map(|(i, c)| (i as u64, *c)),
            ),
            Buckets::Sparse { entries, .. } => {
                Box::new(entries.iter().copied().filter(|(_, c)| *c != 0))
            }
        }
    }

    /// Sum of all bucket values (saturating at `u64::MAX`).
    pub fn total(&self) -> u64 {
        self.nonzero()
            .fold(0u64, |sum, (_, c)| sum.saturating_add(u64::from(c)))
    }
}

impl PartialEq for Buckets {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.nonzero().eq(other.nonzero())
    }
}

impl Eq for Buckets {}

/// One histogram range: buckets laid evenly over `[start, end)` (link-time addresses).
///
/// For mslprof input `end - start` is a multiple of the bucket count. For GNU input it need not be: GNU gprof
/// divides `(end - start)` by the bucket count in floating point, and so must an analyzer that wants the same
/// numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistRange {
    pub start: LinkAddress,
    pub end: LinkAddress,
    pub buckets: Buckets,
}

impl HistRange {
    /// Bytes covered, `end - start` (wrapping, so a malformed range cannot overflow).
    pub fn span(&self) -> u64 {
        self.end.0.wrapping_sub(self.start.0)
    }

    /// Whether `address` lies in `[start, end)`.
    pub fn contains(&self, address: LinkAddress) -> bool {
        self.start <= address && address < self.end
    }
}

/// A module's PC-sampling histogram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    /// 16 or 32: the width of the buckets the runtime counted in (16-bit ones can saturate).
    pub bucket_bits: u8,
    pub ranges: Vec<HistRange>,
}

/// One call-graph arc into a module (SPEC.md §7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arc {
    /// Load instance of the call site, or [`UNKNOWN_KEY`].
    pub caller_key: u32,
    /// Link-time address of the call site in the caller's module.
    pub caller_address: LinkAddress,
    /// Link-time address in this module of the called (instrumented) function.
    pub callee_address: LinkAddress,
    pub count: u64,
}

/// A GNU basic-block execution count record entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BasicBlockCount {
    pub address: LinkAddress,
    pub count: u64,
}

/// One load instance of one module.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Module {
    pub key: u32,
    /// Full path as the loader knew it (empty for the vDSO).
    pub path: Vec<u8>,
    /// File name as LD_PROFILE matches it.
    pub name: Vec<u8>,
    pub soname: Vec<u8>,
    pub build_id: Vec<u8>,
    /// [`module_flags`] bits.
    pub flags: u32,
    pub load_order: u32,
    pub unload_order: u32,
    /// Where this load instance sat from its link-time addresses (recorded, never applied: every address
    /// in a profile is link-time).
    pub load_bias: LoadBias,
    pub samples: u64,
    pub saturated_buckets: u64,
    pub dropped_arcs: u64,
    pub histogram: Option<Histogram>,
    pub arcs: Vec<Arc>,
    /// Only GNU input has these.
    pub basic_blocks: Vec<BasicBlockCount>,
}

impl Module {
    pub fn is_profiled(&self) -> bool {
        self.flags & module_flags::PROFILED != 0
    }
    /// Whether the module may carry arcs: PROFILED, or CALLEE_ARCS (an unselected module with the calls
    /// into it counted at the PLT).
    pub fn may_have_arcs(&self) -> bool {
        self.flags & (module_flags::PROFILED | module_flags::CALLEE_ARCS) != 0
    }
    pub fn is_main_program(&self) -> bool {
        self.flags & module_flags::MAIN_PROGRAM != 0
    }
}

/// Bits of [`StackRecord::flags`] (SPEC.md, STACKS section, since 1.4).
pub mod stack_flags {
    /// The walk stopped at the depth limit (`Stacks::max_depth`) before the stack's root.
    pub const TRUNCATED_DEPTH: u32 = 1 << 0;
    /// The walk stopped before the stack's root because a frame could not be unwound (no unwind information
    /// and no usable frame pointer, a return address in no known module, or memory outside the stack).
    pub const TRUNCATED_UNWIND: u32 = 1 << 1;
}

/// One frame of a sampled call stack: a load instance and a link-time address in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StackFrame {
    /// The frame's module key, or [`UNKNOWN_KEY`] (then `address` is 0) when the address was in no known module.
    pub key: u32,
    /// Frame 0: the sampled PC. Frames 1..: return addresses, as an arc's `caller_address` (a reader looks up
    /// `address - 1` to find the calling function).
    pub address: LinkAddress,
}

/// One distinct sampled stack and the number of samples that had it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackRecord {
    pub count: u64,
    /// [`stack_flags`].
    pub flags: u32,
    /// Leaf first: `frames[0]` is the sampled PC, the last frame the outermost one reached.
    pub frames: Vec<StackFrame>,
}

/// The call stacks captured at samples (SPEC.md, STACKS section, since 1.4).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Stacks {
    /// The depth limit in force (`MSLPROF_STACK_DEPTH`); a stack of this many frames may be truncated.
    pub max_depth: u32,
    /// Samples whose stack was captured but could not be stored (the runtime's stack table was full).
    pub dropped: u64,
    pub records: Vec<StackRecord>,
}

impl Stacks {
    /// Samples with a stored stack.
    pub fn sample_count(&self) -> u64 {
        self.records
            .iter()
            .fold(0u64, |sum, r| sum.saturating_add(r.count))
    }

    /// Sorts the records by (flags, frames), adds up the counts of identical ones (saturating) and drops those
    /// with count 0: the form a reader returns and a writer writes.
    pub fn normalize(&mut self) {
        let mut records = std::mem::take(&mut self.records);
        records.sort_unstable_by(|a, b| (a.flags, &a.frames).cmp(&(b.flags, &b.frames)));
        for record in records {
            if record.count == 0 {
                continue;
            }
            match self.records.last_mut() {
                Some(last) if last.flags == record.flags && last.frames == record.frames => {
                    last.count = last.count.saturating_add(record.count);
                }
                _ => self.records.push(record),
            }
        }
    }
}

/// A whole profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub format: SourceFormat,
    pub header: Header,
    pub modules: Vec<Module>,
    /// The sampled call stacks, when the file has a STACKS section (mslprof 1.4 and later); `None` otherwise.
    pub stacks: Option<Stacks>,
}
