//! The streaming writer the runtime uses: it allocates nothing (checked with a counting global allocator),
//! pads or cuts arcs to the announced count (and stacks to the size of their first visit), refuses invalid descriptors before writing, and its output reads
//! back as the profile the descriptors describe.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use mslprof_format::stream::{
    self, Counts, Encoding, HeaderDesc, HistogramDesc, ModuleDesc, RangeDesc, Sink,
    StackRecordDesc, StacksDesc, StreamError,
};
use mslprof_format::*;

struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    let _ = COUNTING.try_with(|c| {
        if c.get() {
            let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
        }
    });
}

// SAFETY: forwards to the system allocator unchanged; counting touches only const-initialised thread-locals.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Allocations made by this thread while `f` runs.
fn allocations_during<R>(f: impl FnOnce() -> R) -> (R, u64) {
    ALLOCATIONS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCATIONS.with(|a| a.get()))
}

/// A sink into a caller-provided buffer, like a runtime writing to a pre-mapped area or an fd.
struct SliceSink<'b> {
    buf: &'b mut [u8],
    len: usize,
    /// Fail once this many bytes have been written (to test error propagation).
    fail_after: usize,
}

#[derive(Debug, PartialEq)]
struct Full;

impl Sink for SliceSink<'_> {
    type Error = Full;
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), Full> {
        let end = self.len + bytes.len();
        if end > self.buf.len() || end > self.fail_after {
            return Err(Full);
        }
        self.buf[self.len..end].copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }
}

const HEADER: HeaderDesc<'static> = HeaderDesc {
    flags: header_flags::INCOMPLETE,
    incomplete_cause: 1,
    incomplete_signal: 11,
    pid: 77,
    ppid: 1,
    start_time_ns: 5,
    end_time_ns: 6,
    hz: 1000,
    sampling_sources: sampling_sources::TASK_CLOCK | sampling_sources::CPU_TIMER,
    sample_period_ns: 1_000_000,
    dimension: b"seconds",
    dimension_abbrev: b's',
    total_samples: 40,
    unknown_samples: 1,
    dropped_arcs: 0,
    dropped_samples: 0,
    program_name: b"app",
    program_path: b"/bin/app",
    cpu_time: Some(CpuTime {
        user_ns: 3_000_000,
        system_ns: 4_000_000,
    }),
};

fn arc(caller_key: u32, callee_address: u64, count: u64) -> Arc {
    Arc {
        caller_key,
        caller_address: LinkAddress(0x1000 + callee_address),
        callee_address: LinkAddress(callee_address),
        count,
    }
}

/// Writes a two-module profile through the stream API into `buf`, with `produced` arcs offered for an
/// announced count of 3 in module 1. Returns the writer's result and the allocations it made.
fn write_two_modules(
    buf: &mut [u8],
    produced: usize,
    fail_after: usize,
) -> (
    Result<(stream::StreamSummary, usize), StreamError<Full>>,
    u64,
) {
    write_two_modules_in(buf, produced, fail_after, false)
}

/// [`write_two_modules`] in either byte order.
fn write_two_modules_in(
    buf: &mut [u8],
    produced: usize,
    fail_after: usize,
    big_endian: bool,
) -> (
    Result<(stream::StreamSummary, usize), StreamError<Full>>,
    u64,
) {
    let dense: [u16; 8] = [0, 1, 2, 3, 0, 0, 70, 65535];
    let sparse: [u32; 64] = {
        let mut a = [0u32; 64];
        a[5] = 100_000;
        a[60] = 1;
        a
    };
    let ranges_main = [RangeDesc {
        start: LinkAddress(0x400000),
        end: LinkAddress(0x400000 + 8 * 4),
        counts: Counts::U16(&dense),
    }];
    let ranges_lib = [
        RangeDesc {
            start: LinkAddress(0x1000),
            end: LinkAddress(0x1000 + 32 * 2),
            counts: Counts::U32(&sparse[..32]),
        },
        RangeDesc {
            start: LinkAddress(0x8000),
            end: LinkAddress(0x8000 + 32 * 2),
            counts: Counts::U32(&sparse[32..]),
        },
    ];
    let all_arcs = [
        arc(1, 0x10, 4),
        arc(2, 0x20, 5),
        arc(UNKNOWN_KEY, 0x30, 6),
        arc(1, 0x40, 7),
    ];
    let feed = |emit: &mut dyn FnMut(Arc) -> bool| {
        // This feed ignores `emit`'s "enough" answer, to exercise the dropped counter.
        for a in &all_arcs[..produced] {
            emit(*a);
        }
    };
    let lib_feed = |emit: &mut dyn FnMut(Arc) -> bool| {
        emit(arc(1, 0x1_0000_1000, 9));
        // A caller key that is not among the modules written (a stale one).
        emit(arc(42, 0x1008, 2));
    };
    let modules = [
        ModuleDesc {
            key: 1,
            path: b"/bin/app",
            name: b"app",
            // Compact records, as the runtime writes them; the library's are wide (an address above 2³² − 1).
            flags: module_flags::PROFILED | module_flags::MAIN_PROGRAM | module_flags::COMPACT_ARCS,
            load_order: 1,
            samples: 20,
            histogram: Some(HistogramDesc {
                bucket_bits: 16,
                bytes_per_bucket: 4,
                ranges: &ranges_main,
                encoding: Encoding::Auto,
            }),
            arc_count: 3,
            arcs: Some(&feed),
            ..ModuleDesc::default()
        },
        ModuleDesc {
            key: 2,
            path: b"/lib/libfoo.so",
            name: b"libfoo.so",
            soname: b"libfoo.so",
            build_id: &[1, 2, 3, 4],
            flags: module_flags::PROFILED | module_flags::HAS_BUILD_ID,
            load_order: 2,
            samples: 19,
            histogram: Some(HistogramDesc {
                bucket_bits: 16,
                bytes_per_bucket: 2,
                ranges: &ranges_lib,
                encoding: Encoding::Auto,
            }),
            arc_count: 2,
            arcs: Some(&lib_feed),
            ..ModuleDesc::default()
        },
    ];
    let mut sink = SliceSink {
        buf,
        len: 0,
        fail_after,
    };
    let (result, allocations) = allocations_during(|| {
        stream::write_profile_with_byte_order(&mut sink, big_endian, &HEADER, &modules)
    });
    (result.map(|s| (s, sink.len)), allocations)
}

#[test]
fn big_endian_profiles_read_back_as_little_endian_ones() {
    let mut little = vec![0u8; 1 << 16];
    let mut big = vec![0u8; 1 << 16];
    let (little_len, big_len) = (
        write_two_modules_in(&mut little, 3, usize::MAX, false)
            .0
            .expect("writes")
            .1,
        write_two_modules_in(&mut big, 3, usize::MAX, true)
            .0
            .expect("writes")
            .1,
    );
    assert_ne!(little[..little_len], big[..big_len]);
    let little = read(&little[..little_len], GnuTarget::default()).expect("reads back");
    let big = read(&big[..big_len], GnuTarget::default()).expect("reads back");
    assert_eq!(big.modules.len(), 2);
    for (b, l) in big.modules.iter().zip(&little.modules) {
        assert_eq!(b.arcs, l.arcs);
        assert!(!b.arcs.is_empty());
    }
}

#[test]
fn streaming_path_allocates_nothing_and_reads_back() {
    let mut buf = vec![0u8; 1 << 16];
    let ((summary, len), allocations) = {
        let (r, a) = write_two_modules(&mut buf, 3, usize::MAX);
        (r.expect("writes"), a)
    };
    assert_eq!(allocations, 0, "the streaming writer must not allocate");
    assert_eq!(
        summary,
        stream::StreamSummary {
            arcs_caller_unknown: 1,
            ..stream::StreamSummary::default()
        }
    );
    // The counting allocator does see allocations (so the zero above means something).
    let (_, seen) = allocations_during(|| read(&buf[..len], GnuTarget::default()));
    assert!(seen > 0);

    let p = read(&buf[..len], GnuTarget::default()).expect("reads back");
    assert_eq!(p.header.pid, 77);
    assert_eq!(p.header.incomplete_cause, IncompleteCause::Signal);
    assert_eq!(p.modules.len(), 2);
    let main = &p.modules[0];
    assert_eq!(main.path, b"/bin/app");
    let h = main.histogram.as_ref().unwrap();
    assert_eq!(
        h.ranges[0].buckets.nonzero().collect::<Vec<_>>(),
        vec![(1, 1), (2, 2), (3, 3), (6, 70), (7, 65535)]
    );
    let mut expected = vec![arc(1, 0x10, 4), arc(2, 0x20, 5), arc(UNKNOWN_KEY, 0x30, 6)];
    expected.sort();
    assert_eq!(main.arcs, expected);
    let lib = &p.modules[1];
    assert_eq!(lib.build_id, [1, 2, 3, 4]);
    let h = lib.histogram.as_ref().unwrap();
    // 2 non-zero of 64 buckets: sparse wins; the 100000 in a 16-bit histogram is saturated to 65535.
    assert!(matches!(h.ranges[0].buckets, Buckets::Sparse { .. }));
    assert_eq!(
        h.ranges[0].buckets.nonzero().collect::<Vec<_>>(),
        vec![(5, 65535)]
    );
    assert_eq!(
        h.ranges[1].buckets.nonzero().collect::<Vec<_>>(),
        vec![(28, 1)]
    );
    let stale = Arc {
        caller_key: UNKNOWN_KEY,
        caller_address: LinkAddress(0),
        callee_address: LinkAddress(0x1008),
        count: 2,
    };
    assert_eq!(lib.arcs, vec![arc(1, 0x1_0000_1000, 9), stale]);
}

#[test]
fn fewer_arcs_than_announced_are_padded_and_more_are_cut() {
    let mut buf = vec![0u8; 1 << 16];
    let (r, allocations) = write_two_modules(&mut buf, 1, usize::MAX);
    let (summary, len) = r.expect("writes");
    assert_eq!(allocations, 0);
    assert_eq!(summary.arcs_padded, 2);
    let p = read(&buf[..len], GnuTarget::default()).unwrap();
    assert_eq!(p.modules[0].arcs, vec![arc(1, 0x10, 4)]);
    let size_with_padding = len;

    let (r, _) = write_two_modules(&mut buf, 4, usize::MAX);
    let (summary, len) = r.expect("writes");
    assert_eq!(summary.arcs_dropped, 1);
    assert_eq!(summary.arcs_padded, 0);
    assert_eq!(
        len, size_with_padding,
        "the file size depends only on the announced count"
    );
    let p = read(&buf[..len], GnuTarget::default()).unwrap();
    assert_eq!(p.modules[0].arcs.len(), 3);
    assert!(!p.modules[0].arcs.contains(&arc(1, 0x40, 7)));
}

#[test]
fn a_compact_module_leaves_out_an_arc_whose_address_does_not_fit() {
    let feed = |emit: &mut dyn FnMut(Arc) -> bool| {
        emit(arc(1, 0x1_0000_0000, 3));
        emit(arc(1, 0x40, 7));
    };
    let module = ModuleDesc {
        key: 1,
        name: b"m",
        flags: module_flags::PROFILED | module_flags::COMPACT_ARCS,
        arc_count: 2,
        arcs: Some(&feed),
        ..ModuleDesc::default()
    };
    let mut buf = vec![0u8; 1 << 12];
    let mut sink = SliceSink {
        buf: &mut buf,
        len: 0,
        fail_after: usize::MAX,
    };
    let summary = stream::write_profile(&mut sink, &HEADER, std::slice::from_ref(&module)).unwrap();
    let len = sink.len;
    assert_eq!((summary.arcs_dropped, summary.arcs_padded), (1, 1));
    let p = read(&buf[..len], GnuTarget::default()).unwrap();
    assert_eq!(p.modules[0].arcs, vec![arc(1, 0x40, 7)]);
}

#[test]
fn sink_errors_propagate() {
    let mut buf = vec![0u8; 1 << 16];
    for fail_after in [0, 100, 300] {
        let (r, _) = write_two_modules(&mut buf, 3, fail_after);
        assert!(
            matches!(r, Err(StreamError::Sink(Full))),
            "fail_after {fail_after}"
        );
    }
}

#[test]
fn invalid_descriptors_are_refused_before_writing() {
    let counts = [1u16, 2, 3];
    let bad_range = [RangeDesc {
        start: LinkAddress(0),
        end: LinkAddress(16), // 3 buckets of 4 bytes would be 12
        counts: Counts::U16(&counts),
    }];
    let cases: Vec<(ModuleDesc<'_>, HeaderDesc<'_>)> = vec![
        (
            ModuleDesc {
                key: 1,
                flags: module_flags::PROFILED,
                histogram: Some(HistogramDesc {
                    bucket_bits: 16,
                    bytes_per_bucket: 4,
                    ranges: &bad_range,
                    encoding: Encoding::Auto,
                }),
                ..ModuleDesc::default()
            },
            HEADER,
        ),
        (
            ModuleDesc {
                key: UNKNOWN_KEY,
                ..ModuleDesc::default()
            },
            HEADER,
        ),
        (
            ModuleDesc {
                key: 1,
                arc_count: 1,
                ..ModuleDesc::default()
            },
            HEADER,
        ),
        (
            ModuleDesc::default(),
            HeaderDesc {
                dimension: b"a-very-long-dimension",
                ..HEADER
            },
        ),
    ];
    for (module, header) in cases {
        let mut buf = [0u8; 64];
        let mut sink = SliceSink {
            buf: &mut buf,
            len: 0,
            fail_after: usize::MAX,
        };
        let r = stream::write_profile(&mut sink, &header, std::slice::from_ref(&module));
        assert!(matches!(r, Err(StreamError::Invalid(_))));
        assert_eq!(sink.len, 0, "nothing written");
    }
}

#[test]
fn owned_writer_and_stream_writer_are_the_same_encoder() {
    let mut buf = vec![0u8; 1 << 16];
    let (r, _) = write_two_modules(&mut buf, 3, usize::MAX);
    let (_, len) = r.unwrap();
    let p = read(&buf[..len], GnuTarget::default()).unwrap();
    let mut owned = Vec::new();
    write_with(
        &p,
        WriteOptions {
            big_endian: false,
            encoding: Encoding::Auto,
        },
        &mut owned,
    )
    .unwrap();
    assert_eq!(owned, buf[..len], "byte-identical output");
}

/// A runtime-like module table: descriptors are made afresh on every visit, plans live in the table, and the
/// arc table keeps growing while the dump is written; the layout bit COMPACT_ARCS comes and goes between visits
/// (a runtime's module may get its first arc meanwhile): the first visit's holds.
struct LiveTable {
    keys: [u32; 3],
    counts: [[u16; 4]; 3],
    plans: [stream::Plan; 3],
    visits: Cell<u64>,
}

impl stream::ModuleSource for LiveTable {
    fn module_count(&self) -> usize {
        self.keys.len()
    }
    fn with_module(&self, index: usize, visit: &mut dyn FnMut(&ModuleDesc<'_>)) {
        let visits = self.visits.get() + 1;
        self.visits.set(visits);
        let ranges = [RangeDesc {
            start: LinkAddress(0x1000),
            end: LinkAddress(0x1010),
            counts: Counts::U16(&self.counts[index]),
        }];
        let key = self.keys[index];
        let feed = move |emit: &mut dyn FnMut(Arc) -> bool| {
            // More arcs every time it is visited: only the first announced count is written.
            for i in 0..visits {
                if !emit(arc(key, 0x1000 + i, i + 1)) {
                    break;
                }
            }
        };
        let layout = if visits.is_multiple_of(2) {
            module_flags::COMPACT_ARCS
        } else {
            0
        };
        visit(&ModuleDesc {
            key,
            name: b"m",
            flags: module_flags::PROFILED | layout,
            histogram: Some(HistogramDesc {
                bucket_bits: 16,
                bytes_per_bucket: 4,
                ranges: &ranges,
                encoding: Encoding::Auto,
            }),
            arc_count: visits,
            arcs: Some(&feed),
            plan_slot: Some(&self.plans[index]),
            ..ModuleDesc::default()
        });
    }
}

#[test]
fn module_source_writes_without_any_descriptor_array() {
    let table = LiveTable {
        keys: [3, 7, 9],
        counts: [[1, 0, 0, 2], [0, 0, 0, 0], [5, 5, 5, 5]],
        plans: [
            stream::Plan::new(),
            stream::Plan::new(),
            stream::Plan::new(),
        ],
        visits: Cell::new(0),
    };
    let mut buf = vec![0u8; 1 << 16];
    let mut sink = SliceSink {
        buf: &mut buf,
        len: 0,
        fail_after: usize::MAX,
    };
    let (result, allocations) =
        allocations_during(|| stream::write_profile_from(&mut sink, false, &HEADER, &table));
    let summary = result.expect("writes");
    let len = sink.len;
    assert_eq!(allocations, 0);
    assert_eq!(summary.arcs_caller_unknown, 0);
    let p = read(&buf[..len], GnuTarget::default()).expect("reads back");
    assert_eq!(
        p.modules.iter().map(|m| m.key).collect::<Vec<_>>(),
        [3, 7, 9]
    );
    for (i, m) in p.modules.iter().enumerate() {
        // The arc count announced at the first visit of module i (visit number i + 1) is what was written.
        let announced = i as u64 + 1;
        assert_eq!(m.arcs.len() as u64, announced, "module {i}");
        assert!(m.arcs.iter().all(|a| a.caller_key == m.key));
        let values: Vec<u32> = (0..4u64)
            .map(|b| {
                m.histogram.as_ref().unwrap().ranges[0]
                    .buckets
                    .nonzero()
                    .find(|(j, _)| *j == b)
                    .map_or(0, |(_, c)| c)
            })
            .collect();
        let expected: Vec<u32> = table.counts[i].iter().map(|c| u32::from(*c)).collect();
        assert_eq!(values, expected);
    }
}

fn frame(key: u32, address: u64) -> StackFrame {
    StackFrame {
        key,
        address: LinkAddress(address),
    }
}

/// Writes one module (key 1) and a STACKS section whose feed yields `visits[n]` on its n-th visit (then
/// nothing); returns the writer's result, the allocations it made and the file.
fn write_stacks(
    max_depth: u32,
    visits: &[&[(u64, &[StackFrame])]],
) -> (
    Result<stream::StreamSummary, StreamError<Full>>,
    u64,
    Vec<u8>,
) {
    let mut buf = vec![0u8; 1 << 16];
    let visit = Cell::new(0usize);
    let feed = |emit: &mut dyn FnMut(&StackRecordDesc<'_>) -> bool| {
        let records = visits.get(visit.get()).copied().unwrap_or(&[]);
        visit.set(visit.get() + 1);
        for &(count, frames) in records {
            let frame = |i: usize| frames[i];
            let record = StackRecordDesc {
                count,
                flags: stack_flags::TRUNCATED_UNWIND,
                depth: frames.len(),
                frame: &frame,
            };
            if !emit(&record) {
                break;
            }
        }
    };
    let stacks = StacksDesc {
        max_depth,
        dropped: 3,
        records: &feed,
    };
    let modules = [ModuleDesc {
        key: 1,
        name: b"app",
        flags: module_flags::MAIN_PROGRAM,
        ..ModuleDesc::default()
    }];
    let mut sink = SliceSink {
        buf: &mut buf,
        len: 0,
        fail_after: usize::MAX,
    };
    let (r, allocations) = allocations_during(|| {
        stream::write_profile_with_stacks(&mut sink, false, &HEADER, &modules[..], Some(&stacks))
    });
    let len = sink.len;
    buf.truncate(len);
    (r, allocations, buf)
}

#[test]
fn stacks_keep_the_size_of_their_first_visit() {
    let a: &[StackFrame] = &[frame(1, 0x10), frame(1, 0x21), frame(1, 0x31)];
    let b: &[StackFrame] = &[frame(1, 0x40), frame(UNKNOWN_KEY, 0)];
    let stale: &[StackFrame] = &[frame(1, 0x10), frame(7, 0x99), frame(1, 0x31)];
    let long: &[StackFrame] = &[frame(1, 0x50); 4];
    let stacks = |file: &[u8]| read(file, GnuTarget::default()).unwrap().stacks.unwrap();
    let record = |count, frames: &[StackFrame]| StackRecord {
        count,
        flags: stack_flags::TRUNCATED_UNWIND,
        frames: frames.to_vec(),
    };

    // The same records on both visits: written as they are, without allocating.
    let (r, allocations, file) = write_stacks(8, &[&[(5, a), (2, b)], &[(5, a), (2, b)]]);
    assert_eq!(r.unwrap(), stream::StreamSummary::default());
    assert_eq!(allocations, 0, "the streaming writer must not allocate");
    let read_back = stacks(&file);
    assert_eq!((read_back.max_depth, read_back.dropped), (8, 3));
    assert_eq!(read_back.records, vec![record(5, a), record(2, b)]);
    let size = file.len();

    // Second visit: a frame of a key no module has (written as unknown), a record too large for the room
    // left (dropped), and one record fewer (an empty zero-count record fills its slot).
    let (r, allocations, file) = write_stacks(8, &[&[(5, a), (2, b)], &[(6, stale), (1, long)]]);
    assert_eq!(allocations, 0);
    assert_eq!(
        r.unwrap(),
        stream::StreamSummary {
            stacks_padded: 1,
            stacks_dropped: 1,
            stack_frames_unknown: 1,
            ..stream::StreamSummary::default()
        }
    );
    assert_eq!(file.len(), size, "the section keeps its first size");
    let unknown = [frame(1, 0x10), frame(UNKNOWN_KEY, 0), frame(1, 0x31)];
    assert_eq!(stacks(&file).records, vec![record(6, &unknown)]);

    // More records than on the first visit: the extra ones are left out.
    let (r, _, file) = write_stacks(8, &[&[(5, a)], &[(2, b), (5, a)]]);
    assert_eq!(r.unwrap().stacks_dropped, 1);
    assert_eq!(stacks(&file).records, vec![record(2, b)]);

    // Descriptions that break SPEC.md are refused before anything is written.
    for (max_depth, records) in [(0, &[(5, a)][..]), (4097, &[(5, a)]), (8, &[(1, &[][..])])] {
        let (r, _, file) = write_stacks(max_depth, &[records, records]);
        assert!(matches!(r, Err(StreamError::Invalid(_))), "{max_depth}");
        assert!(file.is_empty());
    }
}
