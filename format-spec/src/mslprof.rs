//! Reader of the keyed multi-module mslprof format (SPEC.md §§2–9 and 11), both byte orders.
//!
//! The reader validates every count against the limits and against the bytes that remain before it allocates,
//! walks the file strictly forward (so it always terminates) and reports the first problem with its offset.

use crate::address::{LinkAddress, LoadBias};
use crate::decode::{Decoder, to_usize};
use crate::error::{ErrorKind, ReadError};
use crate::layout::*;
use crate::model::*;

/// Where one section's payload lies in the file.
#[derive(Clone, Copy)]
struct Section {
    payload: usize,
    payload_end: usize,
}

fn err(kind: ErrorKind, offset: usize) -> ReadError {
    ReadError::new(kind, offset as u64)
}

/// Reads the preamble; returns (big_endian, major, minor).
fn read_preamble(bytes: &[u8]) -> Result<(bool, u16, u16), ReadError> {
    let magic_len = bytes.len().min(MAGIC.len());
    if bytes[..magic_len] != MAGIC[..magic_len] {
        return Err(err(ErrorKind::BadMagic, 0));
    }
    if bytes.len() < PREAMBLE_SIZE as usize {
        return Err(err(ErrorKind::Truncated("preamble"), bytes.len()));
    }
    let big_endian = match bytes[12..16] {
        [0x0D, 0x0C, 0x0B, 0x0A] => false,
        [0x0A, 0x0B, 0x0C, 0x0D] => true,
        _ => return Err(err(ErrorKind::BadByteOrderMark, 12)),
    };
    let mut d = Decoder::new(bytes, 8, 12, big_endian);
    let major = d.u16("preamble")?;
    let minor = d.u16("preamble")?;
    if major != VERSION_MAJOR {
        return Err(err(ErrorKind::UnsupportedVersion(u32::from(major)), 8));
    }
    Ok((big_endian, major, minor))
}

/// The sections a reader decodes: the four required ones, in tag order, and STACKS if present.
struct Sections {
    required: [Section; 4],
    stacks: Option<Section>,
}

/// Splits the file after the preamble into its sections.
fn read_sections(bytes: &[u8], big_endian: bool) -> Result<Sections, ReadError> {
    let mut found: [Option<Section>; 4] = [None; 4];
    let mut stacks: Option<Section> = None;
    let names = ["FILE_HEADER", "KEY_TABLE", "MODULE_HEADERS", "DATA"];
    let mut pos = PREAMBLE_SIZE as usize;
    let mut first = true;
    while pos < bytes.len() {
        let mut d = Decoder::new(bytes, pos, bytes.len(), big_endian);
        let tag = d.u32("section header")?;
        let flags = d.u32("section header")?;
        let length_at = d.pos();
        let length = d.u64("section header")?;
        let payload = d.pos();
        if length > d.remaining() as u64 {
            return Err(err(ErrorKind::Truncated("section payload"), length_at));
        }
        let payload_end = payload + to_usize(length);
        let padded_end = align8(payload_end as u64)
            .map(to_usize)
            .unwrap_or(usize::MAX);
        if padded_end > bytes.len() {
            return Err(err(ErrorKind::Truncated("section padding"), payload_end));
        }
        let section = Section {
            payload,
            payload_end,
        };
        if first && tag != TAG_FILE_HEADER {
            return Err(err(ErrorKind::MissingSection("FILE_HEADER"), pos));
        }
        first = false;
        match tag {
            TAG_FILE_HEADER..=TAG_DATA => {
                let slot = (tag - 1) as usize;
                if found[slot].is_some() {
                    return Err(err(ErrorKind::DuplicateSection(names[slot]), pos));
                }
                found[slot] = Some(section);
            }
            TAG_STACKS => {
                if stacks.is_some() {
                    return Err(err(ErrorKind::DuplicateSection("STACKS"), pos));
                }
                stacks = Some(section);
            }
            _ if flags & SECTION_CRITICAL != 0 => {
                return Err(err(ErrorKind::UnknownCriticalSection(tag), pos));
            }
            _ => {}
        }
        pos = padded_end;
    }
    let mut out = [Section {
        payload: 0,
        payload_end: 0,
    }; 4];
    for (slot, section) in found.iter().enumerate() {
        match section {
            Some(s) => out[slot] = *s,
            None => return Err(err(ErrorKind::MissingSection(names[slot]), bytes.len())),
        }
    }
    Ok(Sections {
        required: out,
        stacks,
    })
}

/// A `str16` with the limit of SPEC.md §8.
fn read_str16(d: &mut Decoder<'_>, what: &'static str) -> Result<Vec<u8>, ReadError> {
    let at = d.pos();
    let len = usize::from(d.u16(what)?);
    if len > MAX_STRING {
        return Err(err(ErrorKind::LimitExceeded(what), at));
    }
    Ok(d.take(len, what)?.to_vec())
}

fn read_file_header(
    bytes: &[u8],
    s: Section,
    big_endian: bool,
) -> Result<(Header, u32), ReadError> {
    let mut d = Decoder::new(bytes, s.payload, s.payload_end, big_endian);
    const WHAT: &str = "file header";
    let flags = d.u32(WHAT)?;
    let cause = d.u32(WHAT)?;
    let incomplete_signal = d.u32(WHAT)?;
    let pid = d.u32(WHAT)?;
    let ppid = d.u32(WHAT)?;
    let count_at = d.pos();
    let module_count = d.u32(WHAT)?;
    if module_count > MAX_MODULES {
        return Err(err(ErrorKind::LimitExceeded("module count"), count_at));
    }
    let start_time_ns = d.i64(WHAT)?;
    let end_time_ns = d.i64(WHAT)?;
    let hz = d.u32(WHAT)?;
    // Reserved (zero) before 1.3.
    let sampling_sources = d.u32(WHAT)?;
    let sample_period_ns = d.u64(WHAT)?;
    let dimension_field = d.take(DIMENSION_SIZE, WHAT)?;
    let dimension_len = dimension_field
        .iter()
        .position(|b| *b == 0)
        .unwrap_or(DIMENSION_SIZE);
    let dimension = dimension_field[..dimension_len].to_vec();
    let dimension_abbrev = d.u8(WHAT)?;
    let total_samples = d.u64(WHAT)?;
    let unknown_samples = d.u64(WHAT)?;
    let dropped_arcs = d.u64(WHAT)?;
    let dropped_samples = d.u64(WHAT)?;
    let program_name = read_str16(&mut d, "program name")?;
    let program_path = read_str16(&mut d, "program path")?;
    // Appended in 1.1: a payload that ends before them does not say (SPEC.md §4).
    let cpu_time = if d.remaining() >= 16 {
        Some(CpuTime {
            user_ns: d.u64(WHAT)?,
            system_ns: d.u64(WHAT)?,
        })
    } else {
        None
    };
    let header = Header {
        flags,
        incomplete_cause: IncompleteCause::from_code(cause),
        incomplete_signal,
        pid,
        ppid,
        start_time_ns,
        end_time_ns,
        hz,
        sampling_sources,
        sample_period_ns,
        dimension,
        dimension_abbrev,
        total_samples,
        unknown_samples,
        dropped_arcs,
        dropped_samples,
        program_name,
        program_path,
        cpu_time,
    };
    Ok((header, module_count))
}

/// KEY_TABLE: (key, path, offset of the entry) in file order.
fn read_key_table(
    bytes: &[u8],
    s: Section,
    big_endian: bool,
    module_count: u32,
) -> Result<Vec<(u32, Vec<u8>, usize)>, ReadError> {
    let mut d = Decoder::new(bytes, s.payload, s.payload_end, big_endian);
    let count_at = d.pos();
    let count = d.u32("key table")?;
    if count != module_count {
        return Err(err(
            ErrorKind::CountMismatch("key table count differs from module count"),
            count_at,
        ));
    }
    let mut keys = Vec::new();
    for _ in 0..count {
        let key_at = d.pos();
        let key = d.u32("key table entry")?;
        if key == UNKNOWN_KEY {
            return Err(err(
                ErrorKind::BadValue("reserved key in key table"),
                key_at,
            ));
        }
        let len_at = d.pos();
        let len = d.u32("key table entry")?;
        if to_usize(u64::from(len)) > MAX_STRING {
            return Err(err(ErrorKind::LimitExceeded("module path"), len_at));
        }
        let path = d
            .take(to_usize(u64::from(len)), "key table entry")?
            .to_vec();
        keys.push((key, path, key_at));
    }
    Ok(keys)
}

/// One module header entry, before its data is decoded.
struct Entry {
    /// Offset of the entry (for errors about the entry as a whole).
    at: usize,
    module: Module,
    bucket_bits: u8,
    encoding: u8,
    bytes_per_bucket: u32,
    ranges: Vec<(u64, u64)>,
    hist_offset: u64,
    hist_offset_at: usize,
    hist_size: u64,
    bucket_count: u64,
    arc_offset: u64,
    arc_offset_at: usize,
    arc_size: u64,
    arc_count: u64,
    /// The arc records are compact (flag COMPACT_ARCS).
    compact_arcs: bool,
}

fn read_entry(bytes: &[u8], at: usize, end: usize, big_endian: bool) -> Result<Entry, ReadError> {
    const WHAT: &str = "module header";
    let mut d = Decoder::new(bytes, at, end, big_endian);
    d.skip(4, WHAT)?; // entry_length, already used by the caller
    let key = d.u32(WHAT)?;
    let flags = d.u32(WHAT)?;
    let load_order = d.u32(WHAT)?;
    let unload_order = d.u32(WHAT)?;
    let bucket_bits_at = d.pos();
    let bucket_bits = d.u8(WHAT)?;
    let encoding_at = d.pos();
    let encoding = d.u8(WHAT)?;
    d.skip(2, WHAT)?;
    let bpb_at = d.pos();
    let bytes_per_bucket = d.u32(WHAT)?;
    let range_count_at = d.pos();
    let range_count = d.u32(WHAT)?;
    let load_bias = d.u64(WHAT)?;
    let samples = d.u64(WHAT)?;
    let saturated_buckets = d.u64(WHAT)?;
    let dropped_arcs = d.u64(WHAT)?;
    let hist_offset_at = d.pos();
    let hist_offset = d.u64(WHAT)?;
    let hist_size_at = d.pos();
    let hist_size = d.u64(WHAT)?;
    let bucket_count_at = d.pos();
    let bucket_count = d.u64(WHAT)?;
    let arc_offset_at = d.pos();
    let arc_offset = d.u64(WHAT)?;
    let arc_size_at = d.pos();
    let arc_size = d.u64(WHAT)?;
    let arc_count_at = d.pos();
    let arc_count = d.u64(WHAT)?;

    if range_count > MAX_RANGES {
        return Err(err(
            ErrorKind::LimitExceeded("histogram ranges"),
            range_count_at,
        ));
    }
    let mut ranges = Vec::new();
    for _ in 0..range_count {
        let range_at = d.pos();
        let start = d.u64(WHAT)?;
        let end = d.u64(WHAT)?;
        if end < start {
            return Err(err(
                ErrorKind::BadValue("histogram range ends before it starts"),
                range_at,
            ));
        }
        if let Some(&(_, prev_end)) = ranges.last()
            && start < prev_end
        {
            return Err(err(
                ErrorKind::BadValue("histogram ranges unsorted or overlapping"),
                range_at,
            ));
        }
        ranges.push((start, end));
    }
    let name = read_str16(&mut d, "module name")?;
    let soname = read_str16(&mut d, "module soname")?;
    let build_id_at = d.pos();
    let build_id_len = usize::from(d.u8("module build-id")?);
    if build_id_len > MAX_BUILD_ID {
        return Err(err(ErrorKind::LimitExceeded("build-id"), build_id_at));
    }
    let build_id = d.take(build_id_len, "module build-id")?.to_vec();

    // Histogram description.
    match encoding {
        HIST_NONE => {
            if range_count != 0 || hist_size != 0 || bucket_count != 0 {
                return Err(err(
                    ErrorKind::BadValue("histogram fields set on a module without histogram"),
                    encoding_at,
                ));
            }
        }
        HIST_DENSE | HIST_SPARSE => {
            if bucket_bits != 16 && bucket_bits != 32 {
                return Err(err(
                    ErrorKind::BadValue("bucket_bits not 16 or 32"),
                    bucket_bits_at,
                ));
            }
            if bytes_per_bucket > MAX_BYTES_PER_BUCKET {
                return Err(err(ErrorKind::LimitExceeded("bytes per bucket"), bpb_at));
            }
            if !bytes_per_bucket.is_power_of_two() {
                return Err(err(
                    ErrorKind::BadValue("bytes_per_bucket not a power of two"),
                    bpb_at,
                ));
            }
            if bucket_count > MAX_BUCKETS {
                return Err(err(
                    ErrorKind::LimitExceeded("histogram buckets"),
                    bucket_count_at,
                ));
            }
            let mut sum: u64 = 0;
            for &(start, end) in &ranges {
                let span = end - start;
                if span % u64::from(bytes_per_bucket) != 0 {
                    return Err(err(
                        ErrorKind::BadValue("range length not a multiple of bytes_per_bucket"),
                        bpb_at,
                    ));
                }
                sum = sum.saturating_add(span / u64::from(bytes_per_bucket));
            }
            if sum != bucket_count {
                return Err(err(
                    ErrorKind::CountMismatch("hist_bucket_count differs from the ranges"),
                    bucket_count_at,
                ));
            }
            let size_ok = if encoding == HIST_DENSE {
                bucket_count.checked_mul(u64::from(bucket_bits / 8)) == Some(hist_size)
            } else {
                hist_size % SPARSE_ENTRY_SIZE == 0
            };
            if !size_ok {
                return Err(err(
                    ErrorKind::CountMismatch("hist_size does not fit the encoding"),
                    hist_size_at,
                ));
            }
        }
        _ => {
            return Err(err(
                ErrorKind::BadValue("unknown histogram encoding"),
                encoding_at,
            ));
        }
    }
    if arc_count > MAX_ARCS {
        return Err(err(ErrorKind::LimitExceeded("arc count"), arc_count_at));
    }
    let compact_arcs = flags & module_flags::COMPACT_ARCS != 0;
    if arc_count.checked_mul(arc_record_size(compact_arcs)) != Some(arc_size) {
        return Err(err(
            ErrorKind::CountMismatch(if compact_arcs {
                "arc_size is not 20 × arc_count (COMPACT_ARCS)"
            } else {
                "arc_size is not 32 × arc_count"
            }),
            arc_size_at,
        ));
    }
    if flags & module_flags::PROFILED == 0
        && (encoding != HIST_NONE || (arc_count != 0 && flags & module_flags::CALLEE_ARCS == 0))
    {
        return Err(err(
            ErrorKind::BadValue("histogram or arcs on a module that is not PROFILED"),
            at + 8,
        ));
    }
    Ok(Entry {
        at,
        module: Module {
            key,
            path: Vec::new(),
            name,
            soname,
            build_id,
            flags: flags & !module_flags::COMPACT_ARCS,
            load_order,
            unload_order,
            load_bias: LoadBias(load_bias),
            samples,
            saturated_buckets,
            dropped_arcs,
            histogram: None,
            arcs: Vec::new(),
            basic_blocks: Vec::new(),
        },
        bucket_bits,
        encoding,
        bytes_per_bucket,
        ranges,
        hist_offset,
        hist_offset_at,
        hist_size,
        bucket_count,
        arc_offset,
        arc_offset_at,
        arc_size,
        arc_count,
        compact_arcs,
    })
}

fn read_module_headers(
    bytes: &[u8],
    s: Section,
    big_endian: bool,
    module_count: u32,
) -> Result<Vec<Entry>, ReadError> {
    let mut d = Decoder::new(bytes, s.payload, s.payload_end, big_endian);
    let count_at = d.pos();
    let count = d.u32("module headers")?;
    if count != module_count {
        return Err(err(
            ErrorKind::CountMismatch("module header count differs from module count"),
            count_at,
        ));
    }
    let mut entries = Vec::new();
    for _ in 0..count {
        let at = d.pos();
        let length = d.u32("module header")?;
        let length = to_usize(u64::from(length));
        if length < 4 {
            return Err(err(ErrorKind::BadValue("module entry_length below 4"), at));
        }
        if length > s.payload_end - at {
            return Err(err(ErrorKind::Truncated("module header"), at));
        }
        entries.push(read_entry(bytes, at, at + length, big_endian)?);
        d = Decoder::new(bytes, at + length, s.payload_end, big_endian);
    }
    Ok(entries)
}

/// Checks that `[offset, offset + size)` lies inside the DATA payload; returns the range as `usize`.
fn data_range(
    data: Section,
    offset: u64,
    size: u64,
    at: usize,
    what: &'static str,
) -> Result<(usize, usize), ReadError> {
    let end = offset.checked_add(size);
    match end {
        Some(end) if offset >= data.payload as u64 && end <= data.payload_end as u64 => {
            Ok((to_usize(offset), to_usize(end)))
        }
        _ => Err(err(ErrorKind::OffsetOutOfRange(what), at)),
    }
}

fn decode_histogram(
    bytes: &[u8],
    e: &Entry,
    start: usize,
    end: usize,
    big_endian: bool,
) -> Result<Histogram, ReadError> {
    let bpb = u64::from(e.bytes_per_bucket);
    let mut d = Decoder::new(bytes, start, end, big_endian);
    let mut ranges = Vec::with_capacity(e.ranges.len());
    if e.encoding == HIST_DENSE {
        for &(rs, re) in &e.ranges {
            let n = to_usize((re - rs) / bpb);
            let buckets = if e.bucket_bits == 16 {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(d.u16("histogram")?);
                }
                Buckets::Dense16(v)
            } else {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(d.u32("histogram")?);
                }
                Buckets::Dense32(v)
            };
            ranges.push(HistRange {
                start: LinkAddress(rs),
                end: LinkAddress(re),
                buckets,
            });
        }
    } else {
        for &(rs, re) in &e.ranges {
            ranges.push(HistRange {
                start: LinkAddress(rs),
                end: LinkAddress(re),
                buckets: Buckets::Sparse {
                    len: (re - rs) / bpb,
                    entries: Vec::new(),
                },
            });
        }
        // Global index of the first bucket of range `r`, and of the one after it.
        let mut r = 0usize;
        let mut range_first: u64 = 0;
        let mut previous: Option<u64> = None;
        while !d.is_empty() {
            let entry_at = d.pos();
            let index = d.u64("sparse histogram entry")?;
            let count = d.u32("sparse histogram entry")?;
            if previous.is_some_and(|p| index <= p) {
                return Err(err(
                    ErrorKind::BadValue("sparse indices not strictly increasing"),
                    entry_at,
                ));
            }
            if index >= e.bucket_count {
                return Err(err(
                    ErrorKind::BadValue("sparse index beyond the histogram"),
                    entry_at,
                ));
            }
            if e.bucket_bits == 16 && count > u32::from(u16::MAX) {
                return Err(err(
                    ErrorKind::BadValue("sparse count above 65535 in a 16-bit histogram"),
                    entry_at,
                ));
            }
            previous = Some(index);
            // Advance to the range holding `index` (terminates: index < total bucket count).
            while r < ranges.len() {
                let len = ranges[r].buckets.len();
                if index < range_first + len {
                    break;
                }
                range_first += len;
                r += 1;
            }
            if count == 0 {
                continue;
            }
            if let Some(HistRange {
                buckets: Buckets::Sparse { entries, .. },
                ..
            }) = ranges.get_mut(r)
            {
                entries.push((index - range_first, count));
            }
        }
    }
    Ok(Histogram {
        bucket_bits: e.bucket_bits,
        ranges,
    })
}

fn decode_arcs(
    bytes: &[u8],
    start: usize,
    end: usize,
    big_endian: bool,
    compact: bool,
    keys: &[u32],
) -> Result<Vec<Arc>, ReadError> {
    let mut d = Decoder::new(bytes, start, end, big_endian);
    let mut arcs = Vec::new();
    while !d.is_empty() {
        let at = d.pos();
        let caller_key = d.u32("arc record")?;
        let (caller_address, callee_address) = if compact {
            (
                u64::from(d.u32("arc record")?),
                u64::from(d.u32("arc record")?),
            )
        } else {
            d.skip(4, "arc record")?;
            (d.u64("arc record")?, d.u64("arc record")?)
        };
        let (caller_address, callee_address) =
            (LinkAddress(caller_address), LinkAddress(callee_address));
        let count = d.u64("arc record")?;
        if caller_key != UNKNOWN_KEY && keys.binary_search(&caller_key).is_err() {
            return Err(err(ErrorKind::UnknownKey(caller_key), at));
        }
        if count != 0 {
            arcs.push(Arc {
                caller_key,
                caller_address,
                callee_address,
                count,
            });
        }
    }
    Ok(merge_arcs(arcs))
}

/// Sorts arcs by (caller key, caller address, callee address) and adds up duplicates (saturating).
pub(crate) fn merge_arcs(mut arcs: Vec<Arc>) -> Vec<Arc> {
    arcs.sort_unstable();
    let mut out: Vec<Arc> = Vec::with_capacity(arcs.len());
    for arc in arcs {
        match out.last_mut() {
            Some(last)
                if last.caller_key == arc.caller_key
                    && last.caller_address == arc.caller_address
                    && last.callee_address == arc.callee_address =>
            {
                last.count = last.count.saturating_add(arc.count);
            }
            _ => out.push(arc),
        }
    }
    out
}

/// Decodes the STACKS section (SPEC.md §11), normalised as [`Stacks::normalize`] does.
fn decode_stacks(
    bytes: &[u8],
    s: Section,
    big_endian: bool,
    keys: &[u32],
) -> Result<Stacks, ReadError> {
    const WHAT: &str = "stacks";
    let mut d = Decoder::new(bytes, s.payload, s.payload_end, big_endian);
    let count_at = d.pos();
    let record_count = d.u32(WHAT)?;
    let max_depth_at = d.pos();
    let max_depth = d.u32(WHAT)?;
    let dropped = d.u64(WHAT)?;
    if max_depth > MAX_STACK_DEPTH {
        return Err(err(
            ErrorKind::LimitExceeded("stack max_depth"),
            max_depth_at,
        ));
    }
    if max_depth == 0 {
        return Err(err(ErrorKind::BadValue("stack max_depth 0"), max_depth_at));
    }
    if u64::from(record_count) * STACK_RECORD_FIXED > d.remaining() as u64 {
        return Err(err(ErrorKind::Truncated("stack records"), count_at));
    }
    let mut records = Vec::new();
    for _ in 0..record_count {
        let at = d.pos();
        let count = d.u64("stack record")?;
        let flags = d.u32("stack record")?;
        let depth_at = d.pos();
        let depth = d.u32("stack record")?;
        if depth > MAX_STACK_DEPTH {
            return Err(err(ErrorKind::LimitExceeded("stack depth"), depth_at));
        }
        if depth == 0 && count != 0 {
            return Err(err(
                ErrorKind::BadValue("stack record without frames"),
                depth_at,
            ));
        }
        let frames_at = d.pos();
        let frame_bytes = to_usize(u64::from(depth) * STACK_FRAME_SIZE);
        if frame_bytes > d.remaining() {
            return Err(err(ErrorKind::Truncated("stack record"), at));
        }
        d.skip(frame_bytes, "stack record")?;
        if count == 0 {
            continue;
        }
        let mut f = Decoder::new(bytes, frames_at, d.pos(), big_endian);
        let mut frames = Vec::with_capacity(depth as usize);
        for _ in 0..depth {
            let key_at = f.pos();
            let key = f.u32("stack frame")?;
            let address = LinkAddress(f.u64("stack frame")?);
            if key != UNKNOWN_KEY && keys.binary_search(&key).is_err() {
                return Err(err(ErrorKind::UnknownKey(key), key_at));
            }
            frames.push(StackFrame { key, address });
        }
        records.push(StackRecord {
            count,
            flags,
            frames,
        });
    }
    let mut stacks = Stacks {
        max_depth,
        dropped,
        records,
    };
    stacks.normalize();
    Ok(stacks)
}

/// Reads a whole mslprof file. `bytes` must start with (a prefix of) the mslprof magic.
pub(crate) fn read(bytes: &[u8]) -> Result<Profile, ReadError> {
    let (big_endian, major, minor) = read_preamble(bytes)?;
    let sections = read_sections(bytes, big_endian)?;
    let [file_header, key_table, module_headers, data] = sections.required;
    let (header, module_count) = read_file_header(bytes, file_header, big_endian)?;
    let mut key_entries = read_key_table(bytes, key_table, big_endian, module_count)?;
    key_entries.sort_unstable_by_key(|(k, _, at)| (*k, *at));
    let keys: Vec<u32> = key_entries.iter().map(|(k, _, _)| *k).collect();
    if let Some(w) = key_entries.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(err(ErrorKind::DuplicateKey(w[0].0), w[1].2));
    }
    let entries = read_module_headers(bytes, module_headers, big_endian, module_count)?;

    // Every module key is in the key table, once.
    let mut seen = vec![false; keys.len()];
    for e in &entries {
        match keys.binary_search(&e.module.key) {
            Ok(i) if !seen[i] => seen[i] = true,
            Ok(_) => return Err(err(ErrorKind::DuplicateKey(e.module.key), e.at + 4)),
            Err(_) => return Err(err(ErrorKind::UnknownKey(e.module.key), e.at + 4)),
        }
    }

    // Data ranges: inside DATA, pairwise disjoint.
    let mut spans: Vec<(usize, usize, usize)> = Vec::new();
    for e in &entries {
        if e.arc_size != 0 {
            let (s, t) = data_range(data, e.arc_offset, e.arc_size, e.arc_offset_at, "arcs")?;
            spans.push((s, t, e.arc_offset_at));
        }
        if e.hist_size != 0 {
            let (s, t) = data_range(
                data,
                e.hist_offset,
                e.hist_size,
                e.hist_offset_at,
                "histogram",
            )?;
            spans.push((s, t, e.hist_offset_at));
        }
    }
    spans.sort_unstable();
    if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(err(
            ErrorKind::OverlappingData("module data ranges overlap"),
            w[0].2.max(w[1].2),
        ));
    }

    let mut modules = Vec::with_capacity(entries.len());
    for mut e in entries {
        if e.encoding != HIST_NONE {
            let (s, t) = if e.hist_size == 0 {
                (data.payload, data.payload)
            } else {
                (
                    to_usize(e.hist_offset),
                    to_usize(e.hist_offset.saturating_add(e.hist_size)),
                )
            };
            e.module.histogram = Some(decode_histogram(bytes, &e, s, t, big_endian)?);
        }
        if e.arc_count != 0 {
            let s = to_usize(e.arc_offset);
            let t = to_usize(e.arc_offset.saturating_add(e.arc_size));
            e.module.arcs = decode_arcs(bytes, s, t, big_endian, e.compact_arcs, &keys)?;
        }
        if let Ok(i) = keys.binary_search(&e.module.key) {
            e.module.path = std::mem::take(&mut key_entries[i].1);
        }
        modules.push(e.module);
    }
    let stacks = match sections.stacks {
        Some(s) => Some(decode_stacks(bytes, s, big_endian, &keys)?),
        None => None,
    };
    Ok(Profile {
        format: SourceFormat::Mslprof { major, minor },
        header,
        modules,
        stacks,
    })
}
