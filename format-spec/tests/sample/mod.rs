//! A fixed, realistic multi-module profile shared by the integration tests (damage, error and stream tests).

#![allow(dead_code)]

use mslprof_format::*;

/// Three modules: a profiled main program (dense-friendly histogram, arcs from itself, a library and unknown
/// callers), a profiled library (sparse-friendly histogram in two ranges, 32-bit buckets) and an unprofiled one.
pub fn profile() -> Profile {
    let mut dense = vec![0u16; 64];
    for (i, c) in dense.iter_mut().enumerate() {
        *c = (i as u16 * 7) % 5;
    }
    let mut sparse = vec![0u32; 512];
    sparse[3] = 9;
    sparse[400] = 70_000;
    Profile {
        stacks: Some(stacks()),
        format: SourceFormat::Mslprof { major: 1, minor: 5 },
        header: Header {
            flags: header_flags::INCOMPLETE,
            incomplete_cause: IncompleteCause::Signal,
            incomplete_signal: 11,
            pid: 4242,
            ppid: 1,
            start_time_ns: 1_700_000_000_000_000_000,
            end_time_ns: 1_700_000_001_000_000_000,
            hz: 100,
            sampling_sources: sampling_sources::TASK_CLOCK,
            sample_period_ns: 10_000_000,
            dimension: b"seconds".to_vec(),
            dimension_abbrev: b's',
            total_samples: 1000,
            unknown_samples: 3,
            dropped_arcs: 2,
            dropped_samples: 1,
            program_name: b"app".to_vec(),
            program_path: b"/opt/app/bin/app".to_vec(),
            cpu_time: Some(CpuTime {
                user_ns: 900_000_000,
                system_ns: 120_000_000,
            }),
        },
        modules: vec![
            Module {
                key: 1,
                path: b"/opt/app/bin/app".to_vec(),
                name: b"app".to_vec(),
                build_id: vec![0xab; 20],
                flags: module_flags::PROFILED
                    | module_flags::MAIN_PROGRAM
                    | module_flags::HAS_BUILD_ID,
                load_order: 1,
                load_bias: LoadBias(0x5555_0000_0000),
                samples: 120,
                histogram: Some(Histogram {
                    bucket_bits: 16,
                    ranges: vec![HistRange {
                        start: LinkAddress(0x1000),
                        end: LinkAddress(0x1000 + 64 * 4),
                        buckets: Buckets::Dense16(dense),
                    }],
                }),
                arcs: vec![
                    Arc {
                        caller_key: 1,
                        caller_address: LinkAddress(0x1010),
                        callee_address: LinkAddress(0x1040),
                        count: 5,
                    },
                    Arc {
                        caller_key: 2,
                        caller_address: LinkAddress(0x2200),
                        callee_address: LinkAddress(0x1080),
                        count: 1 << 40,
                    },
                    Arc {
                        caller_key: UNKNOWN_KEY,
                        caller_address: LinkAddress(0),
                        callee_address: LinkAddress(0x1000),
                        count: 1,
                    },
                ],
                ..Module::default()
            },
            Module {
                key: 2,
                path: b"/usr/lib/libfoo.so.1.2.3".to_vec(),
                name: b"libfoo.so.1.2.3".to_vec(),
                soname: b"libfoo.so.1".to_vec(),
                flags: module_flags::PROFILED | module_flags::UNLOADED,
                load_order: 2,
                unload_order: 1,
                load_bias: LoadBias(0x7f00_0000_0000),
                samples: 70_009,
                saturated_buckets: 0,
                dropped_arcs: 2,
                histogram: Some(Histogram {
                    bucket_bits: 32,
                    ranges: vec![
                        HistRange {
                            start: LinkAddress(0x2000),
                            end: LinkAddress(0x2000 + 256 * 16),
                            buckets: Buckets::Dense32(sparse[..256].to_vec()),
                        },
                        HistRange {
                            start: LinkAddress(0x9000),
                            end: LinkAddress(0x9000 + 256 * 16),
                            buckets: Buckets::Dense32(sparse[256..].to_vec()),
                        },
                    ],
                }),
                arcs: vec![Arc {
                    caller_key: 1,
                    caller_address: LinkAddress(0x1020),
                    callee_address: LinkAddress(0x2000),
                    count: 77,
                }],
                ..Module::default()
            },
            Module {
                key: 3,
                path: b"/usr/lib/x86_64-linux-gnu/libc.so.6".to_vec(),
                name: b"libc.so.6".to_vec(),
                soname: b"libc.so.6".to_vec(),
                flags: 0,
                load_order: 3,
                samples: 4,
                ..Module::default()
            },
        ],
    }
}

/// The sample profile's stacks, normalised (sorted by flags and frames, unique): through the library, from the
/// main program, one truncated at the depth limit and one that left the known modules.
pub fn stacks() -> Stacks {
    let frame = |key, address| StackFrame {
        key,
        address: LinkAddress(address),
    };
    Stacks {
        max_depth: 4,
        dropped: 6,
        records: vec![
            StackRecord {
                count: 30,
                flags: 0,
                frames: vec![frame(1, 0x1044), frame(1, 0x1011)],
            },
            StackRecord {
                count: 1 << 33,
                flags: 0,
                frames: vec![frame(2, 0x2010), frame(1, 0x1021), frame(1, 0x1011)],
            },
            StackRecord {
                count: 2,
                flags: stack_flags::TRUNCATED_DEPTH,
                frames: vec![
                    frame(2, 0x9004),
                    frame(2, 0x2011),
                    frame(1, 0x1021),
                    frame(1, 0x1011),
                ],
            },
            StackRecord {
                count: 1,
                flags: stack_flags::TRUNCATED_UNWIND,
                frames: vec![frame(3, 0x300), frame(UNKNOWN_KEY, 0)],
            },
        ],
    }
}

/// The sample profile written in the given byte order.
pub fn bytes(big_endian: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let options = WriteOptions {
        big_endian,
        ..WriteOptions::default()
    };
    write_with(&profile(), options, &mut out).expect("the sample profile is writable");
    out
}

/// One section of a little-endian mslprof file, located by walking the section headers.
#[derive(Clone, Copy, Debug)]
pub struct SectionAt {
    pub tag: u32,
    pub header: usize,
    pub payload: usize,
    pub length: usize,
    /// Offset after the padding.
    pub end: usize,
}

pub fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The sections of a well-formed little-endian file.
pub fn sections(b: &[u8]) -> Vec<SectionAt> {
    let mut out = Vec::new();
    let mut pos = 16;
    while pos < b.len() {
        let length = le_u64(b, pos + 8) as usize;
        let end = (pos + 16 + length).div_ceil(8) * 8;
        out.push(SectionAt {
            tag: le_u32(b, pos),
            header: pos,
            payload: pos + 16,
            length,
            end,
        });
        pos = end;
    }
    out
}

pub fn section(b: &[u8], tag: u32) -> SectionAt {
    *sections(b)
        .iter()
        .find(|s| s.tag == tag)
        .expect("section present")
}

/// Offsets of the module header entries of a well-formed little-endian file.
pub fn module_entries(b: &[u8]) -> Vec<usize> {
    let s = section(b, 3);
    let count = le_u32(b, s.payload) as usize;
    let mut at = s.payload + 4;
    let mut out = Vec::new();
    for _ in 0..count {
        out.push(at);
        at += le_u32(b, at) as usize;
    }
    out
}

/// A small GNU gmon.out (little-endian, 64-bit) with two histogram records, arcs and basic blocks.
pub fn gnu_profile() -> Profile {
    Profile {
        stacks: None,
        format: SourceFormat::Gnu { version: 1 },
        header: Header {
            hz: 100,
            sample_period_ns: 10_000_000,
            dimension: b"seconds".to_vec(),
            dimension_abbrev: b's',
            total_samples: 0,
            ..Header::default()
        },
        modules: vec![Module {
            key: 0,
            flags: module_flags::MAIN_PROGRAM | module_flags::PROFILED,
            histogram: Some(Histogram {
                bucket_bits: 16,
                ranges: vec![
                    HistRange {
                        start: LinkAddress(0x1000),
                        end: LinkAddress(0x1100),
                        buckets: Buckets::Dense16((0..64).map(|i| (i % 3) as u16).collect()),
                    },
                    HistRange {
                        start: LinkAddress(0x4000),
                        end: LinkAddress(0x4040),
                        buckets: Buckets::Dense16(vec![1; 16]),
                    },
                ],
            }),
            arcs: vec![
                Arc {
                    caller_key: 0,
                    caller_address: LinkAddress(0x1010),
                    callee_address: LinkAddress(0x1080),
                    count: 3,
                },
                Arc {
                    caller_key: 0,
                    caller_address: LinkAddress(0x1090),
                    callee_address: LinkAddress(0x4000),
                    count: 6,
                },
            ],
            basic_blocks: vec![BasicBlockCount {
                address: LinkAddress(0x1004),
                count: 9,
            }],
            ..Module::default()
        }],
    }
}

pub fn gnu_bytes() -> Vec<u8> {
    let mut out = Vec::new();
    write_gnu(&gnu_profile(), GnuTarget::default(), &mut out).expect("GNU sample is writable");
    out
}
