//! Constants of the mslprof byte layout (SPEC.md): magic, section tags, fixed record sizes and limits.
//!
//! The reader and the one encoder (the `stream` module) both take their numbers from here.

/// `\x89MSLPROF` (SPEC.md §2).
pub const MAGIC: [u8; 8] = *b"\x89MSLPROF";
pub const VERSION_MAJOR: u16 = 1;
pub const VERSION_MINOR: u16 = 5;
pub const BYTE_ORDER_MARK: u32 = 0x0A0B_0C0D;
pub const PREAMBLE_SIZE: u64 = 16;

/// Section header: tag, flags, payload length (SPEC.md §3).
pub const SECTION_HEADER_SIZE: u64 = 16;
pub const SECTION_CRITICAL: u32 = 1;
pub const TAG_FILE_HEADER: u32 = 1;
pub const TAG_KEY_TABLE: u32 = 2;
pub const TAG_MODULE_HEADERS: u32 = 3;
pub const TAG_DATA: u32 = 4;
/// Not critical (since 1.4).
pub const TAG_STACKS: u32 = 5;

/// FILE_HEADER payload bytes before `program_name` (SPEC.md §4).
pub const FILE_HEADER_FIXED: u64 = 104;
/// Bytes of the NUL-padded `dimension` field.
pub const DIMENSION_SIZE: usize = 15;

/// Module header entry bytes before the ranges (SPEC.md §6).
pub const MODULE_ENTRY_FIXED: u64 = 112;
pub const RANGE_SIZE: u64 = 16;

pub const HIST_NONE: u8 = 0;
pub const HIST_DENSE: u8 = 1;
pub const HIST_SPARSE: u8 = 2;
/// One sparse histogram entry: `u64` index, `u32` count (SPEC.md §7.2).
pub const SPARSE_ENTRY_SIZE: u64 = 12;
/// One arc record (SPEC.md §7.1).
pub const ARC_RECORD_SIZE: u64 = 32;
/// One arc record of a module with flag COMPACT_ARCS (since 1.5): both addresses in 32 bits.
pub const COMPACT_ARC_RECORD_SIZE: u64 = 20;

/// The size of one arc record: compact (module flag COMPACT_ARCS) or not (SPEC.md §7.1).
pub fn arc_record_size(compact: bool) -> u64 {
    if compact {
        COMPACT_ARC_RECORD_SIZE
    } else {
        ARC_RECORD_SIZE
    }
}

/// Whether both of an arc's addresses fit the 32 bits of a compact record.
pub fn fits_compact_record(arc: &crate::model::Arc) -> bool {
    (arc.caller_address.0 | arc.callee_address.0) <= u64::from(u32::MAX)
}
/// STACKS payload bytes before the records: record_count, max_depth, dropped (SPEC.md §11).
pub const STACKS_FIXED: u64 = 16;
/// One stack record's bytes before its frames: count, flags, depth.
pub const STACK_RECORD_FIXED: u64 = 16;
/// One stack frame: `u32` key, `u64` address.
pub const STACK_FRAME_SIZE: u64 = 12;

// Limits (SPEC.md §8).
pub const MAX_MODULES: u32 = 65_536;
pub const MAX_RANGES: u32 = 64;
pub const MAX_BYTES_PER_BUCKET: u32 = 1 << 30;
pub const MAX_BUCKETS: u64 = 1 << 34;
pub const MAX_ARCS: u64 = 1 << 32;
pub const MAX_STRING: usize = 4096;
pub const MAX_BUILD_ID: usize = 64;
/// Frames of one stack record, and the largest `max_depth`.
pub const MAX_STACK_DEPTH: u32 = 4096;

/// Rounds `offset` up to a multiple of 8, or `None` on overflow.
pub fn align8(offset: u64) -> Option<u64> {
    offset.checked_add(7).map(|v| v & !7)
}
