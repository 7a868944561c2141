//! Damage tests: every truncation, random byte flips and blown-up length/count fields of sample files (mslprof
//! in both byte orders, GNU, BSD) give an error or a valid profile, never a panic, and the reader never makes
//! an allocation out of proportion to the file. Kept fast (well under 20 s) because CI runs them.

mod sample;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use mslprof_format::*;

/// Records the largest single allocation made by the current thread while tracking is on.
struct LargestAllocation;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; only records sizes in thread-locals that
// need no allocation (const-initialised Cells).
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note(size: usize) {
    let _ = TRACKING.try_with(|t| {
        if t.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// Reads `bytes` (never panicking: a panic fails the test) and checks the largest allocation it made.
/// A profile that reads must write and read back equal.
fn read_checked(bytes: &[u8], target: GnuTarget) -> Result<Profile, ReadError> {
    LARGEST.with(|l| l.set(0));
    TRACKING.with(|t| t.set(true));
    let result = read(bytes, target);
    TRACKING.with(|t| t.set(false));
    let largest = LARGEST.with(|l| l.get());
    // Module structs, Vec doubling and merge buffers stay within a small multiple of the input.
    let bound = 32 * bytes.len() + 4096;
    assert!(
        largest <= bound,
        "reading {} bytes allocated {largest} bytes at once",
        bytes.len()
    );
    if let Ok(p) = &result
        && matches!(p.format, SourceFormat::Mslprof { .. })
    {
        let mut again = Vec::new();
        write(p, &mut again).expect("a profile that was read is writable");
        let mut back = read(&again, target).expect("and reads back");
        // The writer writes version 1.0 whatever minor version was read.
        back.format = p.format;
        assert_eq!(&back, p);
    }
    result
}

/// xorshift64*: deterministic, dependency-free randomness for the flips.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn samples() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("mslprof little-endian", sample::bytes(false)),
        ("mslprof big-endian", sample::bytes(true)),
        ("GNU", sample::gnu_bytes()),
        ("BSD", bsd_sample()),
    ]
}

/// A 4.4BSD gmon.out, 64-bit little-endian: header, 8 samples, 2 arcs.
fn bsd_sample() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0x1000u64.to_le_bytes());
    b.extend_from_slice(&0x1020u64.to_le_bytes());
    b.extend_from_slice(&(40u32 + 16).to_le_bytes());
    b.extend_from_slice(&0x0005_1879u32.to_le_bytes());
    b.extend_from_slice(&100u32.to_le_bytes());
    b.extend_from_slice(&[0; 12]);
    for i in 0..8u16 {
        b.extend_from_slice(&i.to_le_bytes());
    }
    for (from, to, count) in [(0x1004u64, 0x1010u64, 2u64), (0x1014, 0x1000, 1)] {
        b.extend_from_slice(&from.to_le_bytes());
        b.extend_from_slice(&to.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
    }
    b
}

#[test]
fn every_truncation_point_is_an_error_or_a_profile() {
    for (name, file) in samples() {
        assert!(
            read_checked(&file, GnuTarget::default()).is_ok(),
            "{name} sample reads"
        );
        assert!(
            LARGEST.with(|l| l.get()) > 0,
            "the allocation tracker sees the reader's allocations"
        );
        // Both byte orders lay the sections out alike.
        let stacks_at = sample::section(&sample::bytes(false), 5).header;
        for n in 0..file.len() {
            let result = read_checked(&file[..n], GnuTarget::default());
            if name.starts_with("mslprof") && n == stacks_at {
                // Cut just before the optional STACKS section: a whole profile without stacks.
                let p = result.expect("a file without its STACKS section reads");
                assert_eq!(p.stacks, None);
                assert_eq!(p.modules, sample::profile().modules);
            } else if name.starts_with("mslprof") {
                // An mslprof file cut anywhere else is always detected.
                let e = result.expect_err("truncated mslprof file must not read");
                assert!(e.offset <= n as u64, "{name} cut at {n}: {e}");
            }
        }
    }
}

#[test]
fn random_byte_flips_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let targets = [
        GnuTarget::default(),
        GnuTarget {
            big_endian: true,
            address_size: 4,
        },
    ];
    for (_, file) in samples() {
        for round in 0..20_000 {
            let mut damaged = file.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(damaged.len());
                damaged[at] ^= 1 << rng.below(8);
            }
            if round % 7 == 0 {
                let at = rng.below(damaged.len());
                damaged[at] = rng.next() as u8;
            }
            let _ = read_checked(&damaged, targets[round % 2]);
        }
    }
}

#[test]
fn blown_up_length_and_count_fields_are_rejected_without_allocating() {
    let huge32 = [0xFFFF_FFFFu32, 0x8000_0000, 0x0001_0001, 0x7FFF_FFFF];
    let huge64 = [u64::MAX, 1 << 63, 1 << 40, 0x1_0000_0001];
    for (name, file) in samples() {
        // Every 4-byte-aligned field, as u32 and as u64.
        for at in (0..file.len().saturating_sub(4)).step_by(4) {
            for v in huge32 {
                let mut damaged = file.clone();
                sample::put_u32(&mut damaged, at, v);
                let _ = read_checked(&damaged, GnuTarget::default());
            }
            if at + 8 <= file.len() {
                for v in huge64 {
                    let mut damaged = file.clone();
                    sample::put_u64(&mut damaged, at, v);
                    let _ = read_checked(&damaged, GnuTarget::default());
                }
            }
        }
        // Also at every byte offset for the small GNU and BSD files (their fields are unaligned).
        if !name.starts_with("mslprof") {
            for at in 0..file.len().saturating_sub(4) {
                let mut damaged = file.clone();
                sample::put_u32(&mut damaged, at, u32::MAX);
                let _ = read_checked(&damaged, GnuTarget::default());
            }
        }
    }
}

#[test]
fn every_mslprof_count_and_length_field_blown_up_is_an_error() {
    let file = sample::bytes(false);
    let mut fields = Vec::new();
    for s in sample::sections(&file) {
        fields.push((s.header + 8, 8)); // payload_length
    }
    fields.push((sample::section(&file, 1).payload + 20, 4)); // module_count
    fields.push((sample::section(&file, 2).payload, 4)); // key table count
    fields.push((sample::section(&file, 2).payload + 8, 4)); // first path_length
    fields.push((sample::section(&file, 3).payload, 4)); // module header count
    for entry in sample::module_entries(&file) {
        fields.push((entry, 4)); // entry_length
        fields.push((entry + 28, 4)); // range_count
        for field in [72, 80, 96, 104] {
            fields.push((entry + field, 8)); // hist/arc sizes and counts
        }
        // Offsets matter only where their size is not zero.
        for (offset, size) in [(64, 72), (88, 96)] {
            if sample::le_u64(&file, entry + size) != 0 {
                fields.push((entry + offset, 8));
            }
        }
    }
    let stacks = sample::section(&file, 5);
    fields.push((stacks.payload, 4)); // record_count
    let mut record = stacks.payload + 16;
    for _ in 0..sample::le_u32(&file, stacks.payload) {
        fields.push((record + 12, 4)); // depth
        record += 16 + 12 * sample::le_u32(&file, record + 12) as usize;
    }
    for (at, width) in fields {
        let values: [u64; 3] = if width == 4 {
            [0xFFFF_FFFF, 0x8000_0000, 0x7FFF_FFFF]
        } else {
            [u64::MAX, 1 << 33, 0x7FFF_FFFF]
        };
        for big in values {
            let mut damaged = file.clone();
            if width == 4 {
                sample::put_u32(&mut damaged, at, big as u32);
            } else {
                sample::put_u64(&mut damaged, at, big);
            }
            let Err(e) = read_checked(&damaged, GnuTarget::default()) else {
                panic!("blown-up field at {at} (to {big:#x}) must be an error");
            };
            assert!(e.offset < file.len() as u64 + 16, "field at {at}: {e}");
        }
    }
}
