//! Every [`ErrorKind`] is reachable: each test damages a sample file in one precise way and asserts the kind
//! and the byte offset the reader reports.

mod sample;

use mslprof_format::*;

use sample::{module_entries, put_u32, put_u64, section};

fn read_err(bytes: &[u8]) -> ReadError {
    read(bytes, GnuTarget::default()).expect_err("this input must be refused")
}

fn le() -> Vec<u8> {
    sample::bytes(false)
}

#[test]
fn display_names_problem_and_hex_offset() {
    let e = ReadError::new(ErrorKind::Truncated("module header"), 0x1a4);
    assert_eq!(e.to_string(), "truncated module header at offset 0x1a4");
}

#[test]
fn bad_magic() {
    assert_eq!(read_err(b"xyz"), ReadError::new(ErrorKind::BadMagic, 0));
    // No magic and an impossible BSD header (ncnt below the header size): not a profile at all.
    assert_eq!(
        read_err(&[0u8; 24]),
        ReadError::new(ErrorKind::BadMagic, 16)
    );
    assert_eq!(
        read_err(b""),
        ReadError::new(ErrorKind::Truncated("profile"), 0)
    );
}

#[test]
fn bad_byte_order_mark() {
    let mut f = le();
    f[12] = 0x0B;
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::BadByteOrderMark, 12)
    );
}

#[test]
fn unsupported_major_version() {
    let mut f = le();
    f[8] = 2;
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::UnsupportedVersion(2), 8)
    );
    // A newer minor version reads.
    let mut f = le();
    f[10] = 7;
    let p = read(&f, GnuTarget::default()).unwrap();
    assert_eq!(p.format, SourceFormat::Mslprof { major: 1, minor: 7 });
    // GNU: versions other than 0 and 1.
    let mut g = sample::gnu_bytes();
    g[4] = 2;
    assert_eq!(
        read_err(&g),
        ReadError::new(ErrorKind::UnsupportedVersion(2), 4)
    );
}

#[test]
fn truncated() {
    let f = le();
    // Cut inside the FILE_HEADER payload: its length field (offset 24) promises more than there is.
    assert_eq!(
        read_err(&f[..40]),
        ReadError::new(ErrorKind::Truncated("section payload"), 24)
    );
    assert_eq!(
        read_err(&f[..10]),
        ReadError::new(ErrorKind::Truncated("preamble"), 10)
    );
    // Cut inside a section header.
    assert_eq!(
        read_err(&f[..20]),
        ReadError::new(ErrorKind::Truncated("section header"), 20)
    );
    // Drop the last padding byte of a final (unknown, non-critical) section with a 5-byte payload.
    let mut f = le();
    let end = f.len();
    f.extend_from_slice(&99u32.to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes());
    f.extend_from_slice(&5u64.to_le_bytes());
    f.extend_from_slice(&[1, 2, 3, 4, 5, 0, 0]);
    assert_eq!(
        read_err(&f),
        ReadError::new(
            ErrorKind::Truncated("section padding"),
            (end + 16 + 5) as u64
        )
    );
    // A module entry_length that reaches past its section.
    let mut f = le();
    let entries = module_entries(&f);
    let mh = section(&f, 3);
    let last = *entries.last().unwrap();
    put_u32(&mut f, last, (mh.payload + mh.length - last + 1) as u32);
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::Truncated("module header"), last as u64)
    );
}

#[test]
fn unknown_critical_section_and_skipped_unknown_section() {
    let mut f = le();
    let end = f.len();
    f.extend_from_slice(&99u32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(&0u64.to_le_bytes());
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::UnknownCriticalSection(99), end as u64)
    );
    // The same section without the critical bit, with a 5-byte payload and its padding, is skipped.
    put_u32(&mut f, end + 4, 0);
    put_u64(&mut f, end + 8, 5);
    f.extend_from_slice(&[1, 2, 3, 4, 5, 0, 0, 0]);
    assert_eq!(read(&f, GnuTarget::default()).unwrap(), sample::profile());
}

#[test]
fn missing_section() {
    let f = le();
    let data = section(&f, 4);
    assert_eq!(
        read_err(&f[..data.header]),
        ReadError::new(ErrorKind::MissingSection("DATA"), data.header as u64)
    );
    // FILE_HEADER must come first.
    let mut f = le();
    put_u32(&mut f, 16, 77);
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::MissingSection("FILE_HEADER"), 16)
    );
}

#[test]
fn duplicate_section() {
    let mut f = le();
    let kt = section(&f, 2);
    let end = f.len();
    let copy = f[kt.header..kt.end].to_vec();
    f.extend_from_slice(&copy);
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::DuplicateSection("KEY_TABLE"), end as u64)
    );
}

#[test]
fn limit_exceeded() {
    let mut f = le();
    let count_at = section(&f, 1).payload + 20;
    put_u32(&mut f, count_at, 65_537);
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::LimitExceeded("module count"), count_at as u64)
    );
    let mut f = le();
    let entry = module_entries(&f)[0];
    put_u32(&mut f, entry + 28, 65);
    assert_eq!(
        read_err(&f),
        ReadError::new(
            ErrorKind::LimitExceeded("histogram ranges"),
            (entry + 28) as u64
        )
    );
}

#[test]
fn bad_value() {
    let mut f = le();
    let entry = module_entries(&f)[0];
    f[entry + 20] = 17;
    assert_eq!(
        read_err(&f),
        ReadError::new(
            ErrorKind::BadValue("bucket_bits not 16 or 32"),
            (entry + 20) as u64
        )
    );
    let mut f = le();
    put_u32(&mut f, entry + 24, 3);
    assert_eq!(
        read_err(&f),
        ReadError::new(
            ErrorKind::BadValue("bytes_per_bucket not a power of two"),
            (entry + 24) as u64
        )
    );
}

#[test]
fn offset_out_of_range() {
    let mut f = le();
    let entry = module_entries(&f)[0];
    put_u64(&mut f, entry + 64, 0);
    assert_eq!(
        read_err(&f),
        ReadError::new(
            ErrorKind::OffsetOutOfRange("histogram"),
            (entry + 64) as u64
        )
    );
    let mut f = le();
    put_u64(&mut f, entry + 88, u64::MAX - 8);
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::OffsetOutOfRange("arcs"), (entry + 88) as u64)
    );
}

#[test]
fn overlapping_data() {
    let mut f = le();
    let entries = module_entries(&f);
    let arcs0 = sample::le_u64(&f, entries[0] + 88);
    put_u64(&mut f, entries[1] + 88, arcs0);
    assert_eq!(
        read_err(&f),
        ReadError::new(
            ErrorKind::OverlappingData("module data ranges overlap"),
            (entries[1] + 88) as u64
        )
    );
}

#[test]
fn unknown_key() {
    let mut f = le();
    let entries = module_entries(&f);
    let arcs0 = sample::le_u64(&f, entries[0] + 88) as usize;
    put_u32(&mut f, arcs0, 77);
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::UnknownKey(77), arcs0 as u64)
    );
    // A module header whose key is not in the key table.
    let mut f = le();
    put_u32(&mut f, entries[2] + 4, 78);
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::UnknownKey(78), (entries[2] + 4) as u64)
    );
}

#[test]
fn duplicate_key() {
    let mut f = le();
    let kt = section(&f, 2);
    // Entries: count, then (key, len, path)...; the second entry follows the first path.
    let first_len = sample::le_u32(&f, kt.payload + 8) as usize;
    let second = kt.payload + 4 + 8 + first_len;
    put_u32(&mut f, second, 1);
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::DuplicateKey(1), second as u64)
    );
    // Two module headers with the same key.
    let mut f = le();
    let entries = module_entries(&f);
    put_u32(&mut f, entries[1] + 4, 1);
    assert_eq!(
        read_err(&f),
        ReadError::new(ErrorKind::DuplicateKey(1), (entries[1] + 4) as u64)
    );
}

#[test]
fn count_mismatch() {
    let mut f = le();
    let kt = section(&f, 2);
    put_u32(&mut f, kt.payload, 2);
    assert_eq!(
        read_err(&f),
        ReadError::new(
            ErrorKind::CountMismatch("key table count differs from module count"),
            kt.payload as u64
        )
    );
    let mut f = le();
    let entry = module_entries(&f)[0];
    put_u64(&mut f, entry + 96, 33);
    assert_eq!(
        read_err(&f),
        ReadError::new(
            ErrorKind::CountMismatch("arc_size is not 20 × arc_count (COMPACT_ARCS)"),
            (entry + 96) as u64
        )
    );
}

#[test]
fn unknown_gnu_record_tag() {
    let mut g = sample::gnu_bytes();
    let end = g.len();
    g.push(7);
    assert_eq!(
        read_err(&g),
        ReadError::new(ErrorKind::UnknownRecordTag(7), end as u64)
    );
}

/// A GNU histogram record (64-bit little-endian) with `bins` zero samples.
fn gnu_hist(low: u64, high: u64, bins: u32, dimension: &[u8]) -> Vec<u8> {
    let mut r = vec![0u8];
    r.extend_from_slice(&low.to_le_bytes());
    r.extend_from_slice(&high.to_le_bytes());
    r.extend_from_slice(&bins.to_le_bytes());
    r.extend_from_slice(&100u32.to_le_bytes());
    let mut dim = [0u8; 15];
    dim[..dimension.len()].copy_from_slice(dimension);
    r.extend_from_slice(&dim);
    r.push(b's');
    r.extend(std::iter::repeat_n(0u8, 2 * bins as usize));
    r
}

fn gnu_header() -> Vec<u8> {
    let mut g = b"gmon".to_vec();
    g.extend_from_slice(&1u32.to_le_bytes());
    g.extend_from_slice(&[0; 12]);
    g
}

#[test]
fn incompatible_and_overlapping_gnu_histograms() {
    let mut g = gnu_header();
    g.extend(gnu_hist(0x1000, 0x1100, 64, b"seconds"));
    let second = g.len();
    g.extend(gnu_hist(0x2000, 0x2100, 64, b"cycles"));
    assert_eq!(
        read_err(&g),
        ReadError::new(
            ErrorKind::IncompatibleHistograms("dimension unit changed"),
            (second + 1) as u64
        )
    );
    let mut g = gnu_header();
    g.extend(gnu_hist(0x1000, 0x1100, 64, b"seconds"));
    let second = g.len();
    g.extend(gnu_hist(0x2000, 0x2100, 32, b"seconds"));
    assert_eq!(
        read_err(&g),
        ReadError::new(
            ErrorKind::IncompatibleHistograms("different scales"),
            (second + 1) as u64
        )
    );
    let mut g = gnu_header();
    g.extend(gnu_hist(0x1000, 0x1100, 64, b"seconds"));
    let second = g.len();
    g.extend(gnu_hist(0x1080, 0x1180, 64, b"seconds"));
    assert_eq!(
        read_err(&g),
        ReadError::new(
            ErrorKind::OverlappingData("histogram records overlap"),
            (second + 1) as u64
        )
    );
    // The same range twice is summed, as gprof does.
    let mut g = gnu_header();
    g.extend(gnu_hist(0x1000, 0x1100, 64, b"seconds"));
    g.extend(gnu_hist(0x1000, 0x1100, 64, b"seconds"));
    let p = read(&g, GnuTarget::default()).unwrap();
    assert_eq!(p.modules[0].histogram.as_ref().unwrap().ranges.len(), 1);
}

#[test]
fn unsupported_target() {
    let g = sample::gnu_bytes();
    let target = GnuTarget {
        big_endian: false,
        address_size: 3,
    };
    assert_eq!(
        read(&g, target).unwrap_err(),
        ReadError::new(
            ErrorKind::UnsupportedTarget("address size must be 4 or 8"),
            0
        )
    );
}

#[test]
fn required_sections_may_come_in_any_order_after_the_file_header() {
    let f = le();
    let kt = section(&f, 2);
    let mh = section(&f, 3);
    assert_eq!(kt.end, mh.header);
    // Swap KEY_TABLE and MODULE_HEADERS: DATA stays where it was, so its offsets stay valid.
    let mut swapped = f[..kt.header].to_vec();
    swapped.extend_from_slice(&f[mh.header..mh.end]);
    swapped.extend_from_slice(&f[kt.header..kt.end]);
    swapped.extend_from_slice(&f[mh.end..]);
    assert_eq!(swapped.len(), f.len());
    assert_eq!(
        read(&swapped, GnuTarget::default()).unwrap(),
        sample::profile()
    );
}

#[test]
fn fields_appended_by_a_newer_minor_version_are_ignored() {
    // A 1.6 writer appends 8 bytes to each module entry; DATA moves by 8 × modules and the offsets with it.
    let f = le();
    let mh = section(&f, 3);
    let entries = module_entries(&f);
    let grow = 8 * entries.len();
    let mut out = f[..mh.payload].to_vec();
    out.extend_from_slice(&f[mh.payload..mh.payload + 4]);
    for (i, &entry) in entries.iter().enumerate() {
        let end = entries
            .get(i + 1)
            .copied()
            .unwrap_or(mh.payload + mh.length);
        let mut e = f[entry..end].to_vec();
        put_u32(&mut e, 0, (end - entry + 8) as u32);
        for (offset, size) in [(64, 72), (88, 96)] {
            if sample::le_u64(&e, size) != 0 {
                let moved = sample::le_u64(&e, offset) + grow as u64;
                put_u64(&mut e, offset, moved);
            }
        }
        e.extend_from_slice(&[0xEE; 8]);
        out.extend_from_slice(&e);
    }
    while !out.len().is_multiple_of(8) {
        out.push(0);
    }
    put_u64(&mut out, mh.header + 8, (mh.length + grow) as u64);
    out.extend_from_slice(&f[mh.end..]);
    out[10] = 6; // minor version 6
    let p = read(&out, GnuTarget::default()).unwrap();
    assert_eq!(p.format, SourceFormat::Mslprof { major: 1, minor: 6 });
    assert_eq!(p.modules, sample::profile().modules);
}

#[test]
fn a_version_1_0_file_without_cpu_times_still_reads() {
    // A 1.0 writer stopped the FILE_HEADER payload after program_path: the same file without the two cpu
    // fields, with minor version 0.
    let mut old_profile = sample::profile();
    old_profile.header.cpu_time = None;
    let mut old = Vec::new();
    write(&old_profile, &mut old).unwrap();
    old[10] = 0; // minor version 0
    let new = le();
    assert_eq!(section(&new, 1).length, section(&old, 1).length + 16);
    let p = read(&old, GnuTarget::default()).unwrap();
    assert_eq!(p.format, SourceFormat::Mslprof { major: 1, minor: 0 });
    assert_eq!(p.header.cpu_time, None);
    let mut expected = sample::profile();
    expected.header.cpu_time = None;
    assert_eq!(p.header, expected.header);
    assert_eq!(p.modules, expected.modules);
    // And the 1.1 sample carries them.
    let p = read(&new, GnuTarget::default()).unwrap();
    assert_eq!(p.header.cpu_time, sample::profile().header.cpu_time);
    assert!(p.header.cpu_time.is_some());
}

/// The sample's STACKS payload offset and its records' offsets (the sample's four records have depths 2, 3, 4, 2).
fn stacks_layout(f: &[u8]) -> (usize, [usize; 4]) {
    let p = section(f, 5).payload;
    assert_eq!(sample::le_u32(f, p), 4);
    (p, [p + 16, p + 56, p + 108, p + 172])
}

#[test]
fn stacks_section_errors_name_the_field() {
    let (p, records) = stacks_layout(&le());
    let at = |kind, offset: usize| ReadError::new(kind, offset as u64);

    // A record running past the payload (the last one claims a third frame).
    let mut f = le();
    put_u32(&mut f, records[3] + 12, 3);
    assert_eq!(
        read_err(&f),
        at(ErrorKind::Truncated("stack record"), records[3])
    );
    // More records than the payload can hold at 16 bytes each, before anything is allocated.
    let mut f = le();
    put_u32(&mut f, p, 14);
    assert_eq!(read_err(&f), at(ErrorKind::Truncated("stack records"), p));
    // One record more than there are.
    put_u32(&mut f, p, 5);
    assert_eq!(
        read_err(&f),
        at(ErrorKind::Truncated("stack record"), records[3] + 40)
    );

    // Depths over the limit.
    let mut f = le();
    put_u32(&mut f, records[0] + 12, 4097);
    assert_eq!(
        read_err(&f),
        at(ErrorKind::LimitExceeded("stack depth"), records[0] + 12)
    );
    let mut f = le();
    put_u32(&mut f, p + 4, 4097);
    assert_eq!(
        read_err(&f),
        at(ErrorKind::LimitExceeded("stack max_depth"), p + 4)
    );
    put_u32(&mut f, p + 4, 0);
    assert_eq!(
        read_err(&f),
        at(ErrorKind::BadValue("stack max_depth 0"), p + 4)
    );
    // A counted record needs a frame.
    let mut f = le();
    put_u32(&mut f, records[3] + 12, 0);
    assert_eq!(
        read_err(&f),
        at(
            ErrorKind::BadValue("stack record without frames"),
            records[3] + 12
        )
    );

    // A frame's key must be in KEY_TABLE.
    let mut f = le();
    put_u32(&mut f, records[1] + 16, 99);
    assert_eq!(read_err(&f), at(ErrorKind::UnknownKey(99), records[1] + 16));

    // At most one STACKS section.
    let mut f = le();
    let stacks = section(&f, 5);
    let end = f.len();
    let copy = f[stacks.header..stacks.end].to_vec();
    f.extend_from_slice(&copy);
    assert_eq!(read_err(&f), at(ErrorKind::DuplicateSection("STACKS"), end));
}

#[test]
fn stacks_reader_skips_zero_counts_and_adds_up_duplicates() {
    let (_, records) = stacks_layout(&le());
    // A zero-count record is skipped whole, even with a key that is in no module.
    let mut f = le();
    put_u64(&mut f, records[1], 0);
    put_u32(&mut f, records[1] + 16, 99);
    let mut expected = sample::stacks();
    expected.records.remove(1);
    assert_eq!(
        read(&f, GnuTarget::default()).unwrap().stacks,
        Some(expected)
    );

    // The last record made equal to the first (flags and frames): one record with both counts.
    let mut f = le();
    put_u32(&mut f, records[3] + 8, 0);
    let frames = f[records[0] + 16..records[0] + 40].to_vec();
    f[records[3] + 16..records[3] + 40].copy_from_slice(&frames);
    let mut expected = sample::stacks();
    expected.records.pop();
    expected.records[0].count += 1;
    assert_eq!(
        read(&f, GnuTarget::default()).unwrap().stacks,
        Some(expected)
    );

    // Bytes after the last record are ignored: the last record shortened to one frame.
    let mut f = le();
    put_u32(&mut f, records[3] + 12, 1);
    let mut expected = sample::stacks();
    expected.records[3].frames.truncate(1);
    assert_eq!(
        read(&f, GnuTarget::default()).unwrap().stacks,
        Some(expected)
    );
}

#[test]
fn stacks_section_is_not_critical_and_older_files_have_none() {
    let f = le();
    let stacks = section(&f, 5);
    assert_eq!(sample::le_u32(&f, stacks.header + 4), 0, "not critical");
    assert_eq!(stacks.end, f.len(), "written last");
    assert_eq!(&f[8..12], &[1, 0, 5, 0], "version 1.5");

    // A 1.3 file: no STACKS section.
    let mut old_profile = sample::profile();
    old_profile.stacks = None;
    let mut old = Vec::new();
    write(&old_profile, &mut old).unwrap();
    assert!(sample::sections(&old).iter().all(|s| s.tag != 5));
    old[10] = 3;
    let p = read(&old, GnuTarget::default()).unwrap();
    assert_eq!(p.format, SourceFormat::Mslprof { major: 1, minor: 3 });
    assert_eq!(p.stacks, None);
    assert_eq!(p.modules, sample::profile().modules);
}

#[test]
fn arc_records_are_compact_where_addresses_fit_and_wide_elsewhere() {
    // The sample's arcs all fit 32 bits: 20-byte records, key, caller, callee, count (SPEC.md §7.1), sorted.
    let f = le();
    let main = module_entries(&f)[0];
    assert_ne!(sample::le_u32(&f, main + 8) & module_flags::COMPACT_ARCS, 0);
    assert_eq!(sample::le_u64(&f, main + 96), 3 * 20, "arc_size");
    let at = sample::le_u64(&f, main + 88) as usize;
    let words = |r: usize| {
        let r = at + 20 * r;
        (
            sample::le_u32(&f, r),
            sample::le_u32(&f, r + 4),
            sample::le_u32(&f, r + 8),
            sample::le_u64(&f, r + 12),
        )
    };
    assert_eq!(words(0), (1, 0x1010, 0x1040, 5));
    assert_eq!(words(1), (2, 0x2200, 0x1080, 1 << 40));
    assert_eq!(words(2), (UNKNOWN_KEY, 0, 0x1000, 1));
    let read_back = read(&f, GnuTarget::default()).unwrap();
    assert_eq!(
        read_back.modules,
        sample::profile().modules,
        "the flag is not in the model"
    );

    // One address above 2³² − 1 makes that module's records wide (32 bytes); the library's stay compact.
    let mut wide = sample::profile();
    wide.modules[0].arcs.push(Arc {
        caller_key: 1,
        caller_address: LinkAddress(0x1_0000_0010),
        callee_address: LinkAddress(0x1040),
        count: 3,
    });
    wide.modules[0].arcs.sort();
    let mut w = Vec::new();
    write(&wide, &mut w).unwrap();
    let entries = module_entries(&w);
    assert_eq!(
        sample::le_u32(&w, entries[0] + 8) & module_flags::COMPACT_ARCS,
        0
    );
    assert_eq!(sample::le_u64(&w, entries[0] + 96), 4 * 32);
    // Sorted by (caller key, caller address, callee address): the new arc is the second record.
    let r = sample::le_u64(&w, entries[0] + 88) as usize + 32;
    assert_eq!(sample::le_u64(&w, r + 8), 0x1_0000_0010, "caller_address");
    assert_eq!(sample::le_u64(&w, entries[1] + 96), 20);
    assert_eq!(
        read(&w, GnuTarget::default()).unwrap().modules,
        wide.modules
    );

    // A 1.4 file, whose records are all wide, reads the same.
    let mut old = sample::profile();
    for m in &mut old.modules {
        for a in &mut m.arcs {
            a.callee_address.0 |= 1 << 40;
        }
    }
    let mut o = Vec::new();
    write(&old, &mut o).unwrap();
    o[10] = 4;
    let p = read(&o, GnuTarget::default()).unwrap();
    assert_eq!(p.format, SourceFormat::Mslprof { major: 1, minor: 4 });
    assert_eq!(p.modules, old.modules);

    // A wide record's arc_size in a compact module is refused.
    let mut f = le();
    put_u64(&mut f, main + 96, 3 * 32);
    assert_eq!(
        read_err(&f),
        ReadError::new(
            ErrorKind::CountMismatch("arc_size is not 20 × arc_count (COMPACT_ARCS)"),
            (main + 96) as u64
        )
    );
}
