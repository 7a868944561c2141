//! Round-trip properties: every profile the writer accepts reads back equal, in both byte orders, and the
//! dense and sparse histogram encodings decode to the same counts.

mod sample;

use mslprof_format::stream::Encoding;
use mslprof_format::*;
use proptest::prelude::*;

fn write_opts(p: &Profile, big_endian: bool, encoding: Encoding) -> Vec<u8> {
    let mut out = Vec::new();
    write_with(
        p,
        WriteOptions {
            big_endian,
            encoding,
        },
        &mut out,
    )
    .expect("generated profiles are writable");
    out
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

fn header() -> impl Strategy<Value = Header> {
    (
        (
            any::<u32>(),
            0u32..8,
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
        ),
        (any::<i64>(), any::<i64>(), any::<u32>(), any::<u64>()),
        ("[a-z]{0,15}", any::<u8>()),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
        (bytes(40), bytes(80)),
        prop::option::of((any::<u64>(), any::<u64>())),
    )
        .prop_map(|(a, b, c, d, e, f)| Header {
            flags: a.0,
            incomplete_cause: IncompleteCause::from_code(a.1),
            incomplete_signal: a.2,
            pid: a.3,
            ppid: a.4,
            start_time_ns: b.0,
            end_time_ns: b.1,
            hz: b.2,
            sampling_sources: b.2.rotate_left(16),
            sample_period_ns: b.3,
            dimension: c.0.into_bytes(),
            dimension_abbrev: c.1,
            total_samples: d.0,
            unknown_samples: d.1,
            dropped_arcs: d.2,
            dropped_samples: d.3,
            program_name: e.0,
            program_path: e.1,
            cpu_time: f.map(|(user_ns, system_ns)| CpuTime { user_ns, system_ns }),
        })
}

/// Bucket values of one range, mostly zero or mostly non-zero, in any of the three representations.
fn buckets(bits: u8) -> impl Strategy<Value = Buckets> {
    let max = if bits == 16 {
        u32::from(u16::MAX)
    } else {
        u32::MAX
    };
    let value = prop_oneof![3 => Just(0u32), 1 => 1..=max];
    (prop::collection::vec(value, 0..80), 0u8..3).prop_map(move |(v, repr)| match repr {
        0 if bits == 16 => Buckets::Dense16(v.iter().map(|c| *c as u16).collect()),
        0 | 1 => Buckets::Dense32(v),
        _ => Buckets::Sparse {
            len: v.len() as u64,
            entries: v
                .iter()
                .enumerate()
                .filter(|(_, c)| **c != 0)
                .map(|(i, c)| (i as u64, *c))
                .collect(),
        },
    })
}

fn histogram() -> impl Strategy<Value = Histogram> {
    (prop_oneof![Just(16u8), Just(32u8)], 0u32..6).prop_flat_map(|(bits, shift)| {
        let bpb = 1u64 << shift;
        (
            prop::collection::vec((buckets(bits), 0u64..4096), 0..4),
            0u64..1 << 40,
        )
            .prop_map(move |(parts, base)| {
                let mut start = base;
                let ranges = parts
                    .into_iter()
                    .map(|(b, gap)| {
                        start += gap;
                        let end = start + b.len() * bpb;
                        let r = HistRange {
                            start: LinkAddress(start),
                            end: LinkAddress(end),
                            buckets: b,
                        };
                        start = end;
                        r
                    })
                    .collect();
                Histogram {
                    bucket_bits: bits,
                    ranges,
                }
            })
    })
}

/// Canonical arcs (sorted, unique, non-zero) whose callers are among `keys` or unknown.
fn arcs(keys: Vec<u32>) -> impl Strategy<Value = Vec<Arc>> {
    let caller = prop_oneof![
        1 => Just(UNKNOWN_KEY),
        4 => prop::sample::select(keys),
    ];
    // Addresses that fit 32 bits half the time, so both record layouts (SPEC.md §7.1) are written.
    let address = || prop_oneof![any::<u64>(), any::<u32>().prop_map(u64::from)];
    prop::collection::btree_map((caller, address(), address()), 1..=u64::MAX, 0..12).prop_map(|m| {
        m.into_iter()
            .map(
                |((caller_key, caller_address, callee_address), count)| Arc {
                    caller_key,
                    caller_address: LinkAddress(caller_address),
                    callee_address: LinkAddress(callee_address),
                    count,
                },
            )
            .collect()
    })
}

/// Canonical stacks (records sorted by flags and frames, unique, non-zero) whose frames are in `keys` or unknown.
fn stacks(keys: Vec<u32>) -> impl Strategy<Value = Stacks> {
    let key = prop_oneof![
        1 => Just(UNKNOWN_KEY),
        4 => prop::sample::select(keys),
    ];
    let frame = (key, any::<u64>()).prop_map(|(key, address)| StackFrame {
        key,
        address: LinkAddress(if key == UNKNOWN_KEY { 0 } else { address }),
    });
    let frames = prop_oneof![
        8 => prop::collection::vec(frame.clone(), 1..8),
        1 => prop::collection::vec(frame, 4090..=4096),
    ];
    (
        1u32..=4096,
        any::<u64>(),
        prop::collection::btree_map((0u32..4, frames), 1..=u64::MAX, 0..6),
    )
        .prop_map(|(max_depth, dropped, records)| Stacks {
            max_depth,
            dropped,
            records: records
                .into_iter()
                .map(|((flags, frames), count)| StackRecord {
                    count,
                    flags,
                    frames,
                })
                .collect(),
        })
}

fn module(key: u32, keys: Vec<u32>) -> impl Strategy<Value = Module> {
    (
        (bytes(60), bytes(30), bytes(30), bytes(65)),
        (any::<u32>(), any::<bool>(), any::<u32>(), any::<u32>()),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
        prop::option::of(histogram()),
        arcs(keys),
    )
        .prop_map(move |(s, f, n, histogram, arcs)| {
            let profiled = f.1;
            // CALLEE_ARCS only on modules that are not PROFILED (the writer refuses both).
            // COMPACT_ARCS is the writer's to choose and the reader's to take out (a layout bit).
            let f0 = f.0 & !module_flags::COMPACT_ARCS;
            let flags = if profiled {
                (f0 | module_flags::PROFILED) & !module_flags::CALLEE_ARCS
            } else {
                f0 & !module_flags::PROFILED
            };
            let callee_arcs = flags & module_flags::CALLEE_ARCS != 0;
            Module {
                key,
                path: s.0,
                name: s.1,
                soname: s.2,
                build_id: s.3,
                flags,
                load_order: f.2,
                unload_order: f.3,
                load_bias: LoadBias(n.0),
                samples: n.1,
                saturated_buckets: n.2,
                dropped_arcs: n.3,
                histogram: if profiled { histogram } else { None },
                arcs: if profiled || callee_arcs {
                    arcs
                } else {
                    Vec::new()
                },
                basic_blocks: Vec::new(),
            }
        })
}

fn profile() -> impl Strategy<Value = Profile> {
    (
        header(),
        prop::collection::btree_set(0u32..UNKNOWN_KEY, 0..5),
    )
        .prop_flat_map(|(header, keys)| {
            let keys: Vec<u32> = keys.into_iter().collect();
            let arc_keys = if keys.is_empty() {
                vec![UNKNOWN_KEY]
            } else {
                keys.clone()
            };
            let modules: Vec<_> = keys.iter().map(|k| module(*k, arc_keys.clone())).collect();
            let stacks = prop::option::of(stacks(arc_keys));
            (Just(header), modules, stacks).prop_map(|(header, modules, stacks)| Profile {
                stacks,
                format: SourceFormat::Mslprof { major: 1, minor: 5 },
                header,
                modules,
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn any_writable_profile_reads_back_equal(p in profile(), big_endian in any::<bool>()) {
        let file = write_opts(&p, big_endian, Encoding::Auto);
        let back = read(&file, GnuTarget::default()).expect("a written profile reads back");
        prop_assert_eq!(back, p);
    }

    #[test]
    fn dense_and_sparse_give_the_same_counts(p in profile(), big_endian in any::<bool>()) {
        let dense = write_opts(&p, big_endian, Encoding::Dense);
        let sparse = write_opts(&p, big_endian, Encoding::Sparse);
        let auto = write_opts(&p, big_endian, Encoding::Auto);
        let from_dense = read(&dense, GnuTarget::default()).expect("dense reads back");
        let from_sparse = read(&sparse, GnuTarget::default()).expect("sparse reads back");
        for (d, s) in from_dense.modules.iter().zip(&from_sparse.modules) {
            let (Some(dh), Some(sh)) = (&d.histogram, &s.histogram) else {
                prop_assert!(d.histogram.is_none() && s.histogram.is_none());
                continue;
            };
            prop_assert_eq!(dh.ranges.len(), sh.ranges.len());
            for (dr, sr) in dh.ranges.iter().zip(&sh.ranges) {
                prop_assert_eq!(dr.buckets.len(), sr.buckets.len());
                prop_assert!(dr.buckets.nonzero().eq(sr.buckets.nonzero()));
            }
        }
        prop_assert_eq!(&from_dense, &p);
        // Auto is never larger than either forced encoding.
        prop_assert!(auto.len() <= dense.len() && auto.len() <= sparse.len());
    }
}

#[test]
fn sample_profile_reads_back_equal_in_both_byte_orders() {
    for big_endian in [false, true] {
        let file = sample::bytes(big_endian);
        let back = read(&file, GnuTarget::default()).expect("reads back");
        assert_eq!(back, sample::profile());
        assert_eq!(detect(&file), Some(FileFormat::Mslprof));
    }
    // The two byte orders really differ on disk.
    assert_ne!(sample::bytes(false), sample::bytes(true));
}

#[test]
fn reader_normalises_arcs_and_writer_refuses_broken_profiles() {
    let mut p = sample::profile();
    let arc = p.modules[0].arcs[0];
    p.modules[0].arcs.push(arc);
    p.modules[0].arcs.push(Arc { count: 0, ..arc });
    p.modules[0].arcs.reverse();
    let mut file = Vec::new();
    write(&p, &mut file).unwrap();
    let back = read(&file, GnuTarget::default()).unwrap();
    let mut expected = sample::profile();
    expected.modules[0].arcs.sort();
    expected.modules[0].arcs[0].count *= 2;
    assert_eq!(back.modules[0].arcs.len(), 3);
    assert_eq!(back, expected);

    // Stacks likewise: duplicates added up, zero counts left out, sorted by (flags, frames).
    let mut p = sample::profile();
    let stacks = p.stacks.as_mut().unwrap();
    let first = stacks.records[0].clone();
    stacks.records.push(first.clone());
    stacks.records.push(StackRecord { count: 0, ..first });
    stacks.records.reverse();
    let mut file = Vec::new();
    write(&p, &mut file).unwrap();
    let back = read(&file, GnuTarget::default()).unwrap();
    let mut expected = sample::profile();
    expected.stacks.as_mut().unwrap().records[0].count *= 2;
    assert_eq!(back.stacks.as_ref().unwrap().records.len(), 4);
    assert_eq!(back, expected);

    let refuse = |p: &Profile| {
        let err = write(p, Vec::new()).expect_err("must be refused");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
    };
    let mut dup = sample::profile();
    dup.modules[1].key = 1;
    refuse(&dup);
    let mut unknown_caller = sample::profile();
    unknown_caller.modules[0].arcs[0].caller_key = 99;
    refuse(&unknown_caller);
    let mut wide = sample::profile();
    wide.modules[0].histogram.as_mut().unwrap().bucket_bits = 16;
    wide.modules[0].histogram.as_mut().unwrap().ranges[0].buckets =
        Buckets::Dense32(vec![70_000; 64]);
    refuse(&wide);
    let mut long_dimension = sample::profile();
    long_dimension.header.dimension = b"sixteen-bytes-xx".to_vec();
    refuse(&long_dimension);
    let mut unprofiled = sample::profile();
    unprofiled.modules[0].flags &= !module_flags::PROFILED;
    refuse(&unprofiled);
    // CALLEE_ARCS lets an unprofiled module carry arcs, never a histogram.
    let mut callee_arcs = sample::profile();
    callee_arcs.modules[0].flags &= !module_flags::PROFILED;
    callee_arcs.modules[0].flags |= module_flags::CALLEE_ARCS;
    refuse(&callee_arcs);
    callee_arcs.modules[0].histogram = None;
    let mut file = Vec::new();
    write(&callee_arcs, &mut file).expect("arcs without a histogram on a CALLEE_ARCS module");
    let back = read(&file, GnuTarget::default()).expect("reads back");
    assert_eq!(back.modules[0].arcs, callee_arcs.modules[0].arcs);
    assert!(!back.modules[0].is_profiled() && back.modules[0].may_have_arcs());
    let mut unknown_frame = sample::profile();
    unknown_frame.stacks.as_mut().unwrap().records[0].frames[1].key = 99;
    refuse(&unknown_frame);
    for depth in [0, 4097] {
        let mut bad_depth = sample::profile();
        let record = &mut bad_depth.stacks.as_mut().unwrap().records[0];
        record.frames = record.frames.iter().copied().cycle().take(depth).collect();
        refuse(&bad_depth);
    }
    for max_depth in [0, 4097] {
        let mut bad_max = sample::profile();
        bad_max.stacks.as_mut().unwrap().max_depth = max_depth;
        refuse(&bad_max);
    }
    let mut bad_range = sample::profile();
    bad_range.modules[0].histogram.as_mut().unwrap().ranges[0]
        .end
        .0 += 1;
    refuse(&bad_range);
}

/// The encoding byte (entry offset 21) of the first module of a little-endian file.
fn first_module_encoding(file: &[u8]) -> u8 {
    file[sample::module_entries(file)[0] + 21]
}

#[test]
fn writer_picks_the_smaller_encoding_and_dense_on_a_tie() {
    let with_buckets = |buckets: Vec<u16>| {
        let mut p = sample::profile();
        p.modules.truncate(1);
        p.modules[0].arcs.retain(|a| a.caller_key != 2);
        p.stacks = None;
        let r = &mut p.modules[0].histogram.as_mut().unwrap().ranges[0];
        r.end = LinkAddress(r.start.0 + 4 * buckets.len() as u64);
        r.buckets = Buckets::Dense16(buckets);
        let mut out = Vec::new();
        write_with(
            &p,
            WriteOptions {
                big_endian: false,
                encoding: Encoding::Auto,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(read(&out, GnuTarget::default()).unwrap(), p);
        first_module_encoding(&out)
    };
    // 6 buckets × 2 bytes = 12 bytes dense; one non-zero bucket = 12 bytes sparse: a tie, so dense (1).
    assert_eq!(with_buckets(vec![0, 0, 5, 0, 0, 0]), 1);
    // 7 buckets: dense 14 bytes > sparse 12 bytes.
    assert_eq!(with_buckets(vec![0, 0, 5, 0, 0, 0, 0]), 2);
    // All non-zero: dense.
    assert_eq!(with_buckets(vec![1; 7]), 1);
}

/// Single-module profiles a GNU gmon.out can hold exactly (as the GNU reader presents them).
fn gnu_profile(address_size: u8) -> impl Strategy<Value = Profile> {
    let max_addr = if address_size == 4 {
        u64::from(u32::MAX)
    } else {
        u64::MAX
    };
    (
        1u32..100_000,
        "[a-z]{1,15}",
        any::<u8>(),
        prop::collection::vec(
            (prop::collection::vec(0u32..200_000, 1..20), 0u64..64),
            1..4,
        ),
        prop::collection::vec((0..=max_addr, 0..=max_addr, any::<u32>()), 0..10),
        prop::collection::vec((0..=max_addr, 0..=max_addr), 0..4),
    )
        .prop_map(move |(hz, dimension, abbrev, ranges, arcs, bbs)| {
            let mut start = 0x1000u64;
            let ranges: Vec<HistRange> = ranges
                .into_iter()
                .map(|(values, gap)| {
                    start += 4 * gap;
                    let end = start + 4 * values.len() as u64;
                    let r = HistRange {
                        start: LinkAddress(start),
                        end: LinkAddress(end),
                        buckets: Buckets::Dense32(values),
                    };
                    start = end;
                    r
                })
                .collect();
            let total = ranges.iter().map(|r| r.buckets.total()).sum();
            Profile {
                stacks: None,
                format: SourceFormat::Gnu { version: 1 },
                header: Header {
                    hz,
                    sample_period_ns: 1_000_000_000 / u64::from(hz),
                    dimension: dimension.into_bytes(),
                    dimension_abbrev: abbrev,
                    total_samples: total,
                    ..Header::default()
                },
                modules: vec![Module {
                    key: 0,
                    flags: module_flags::MAIN_PROGRAM | module_flags::PROFILED,
                    samples: total,
                    histogram: Some(Histogram {
                        bucket_bits: 16,
                        ranges,
                    }),
                    arcs: arcs
                        .into_iter()
                        .map(|(from, to, count)| Arc {
                            caller_key: 0,
                            caller_address: LinkAddress(from),
                            callee_address: LinkAddress(to),
                            count: u64::from(count),
                        })
                        .collect(),
                    basic_blocks: bbs
                        .into_iter()
                        .map(|(address, count)| BasicBlockCount {
                            address: LinkAddress(address),
                            count,
                        })
                        .collect(),
                    ..Module::default()
                }],
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn gnu_round_trip_little_endian_64(p in gnu_profile(8)) {
        let target = GnuTarget::default();
        let mut out = Vec::new();
        write_gnu(&p, target, &mut out).unwrap();
        prop_assert_eq!(detect(&out), Some(FileFormat::Gnu));
        prop_assert_eq!(read(&out, target).unwrap(), p);
    }

    #[test]
    fn gnu_round_trip_big_endian_32(p in gnu_profile(4)) {
        let target = GnuTarget { big_endian: true, address_size: 4 };
        let mut out = Vec::new();
        write_gnu(&p, target, &mut out).unwrap();
        prop_assert_eq!(read(&out, target).unwrap(), p);
    }
}
