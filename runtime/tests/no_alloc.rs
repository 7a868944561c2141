//! Proves that the sampling path never allocates: a counting global allocator watches the process while the
//! real SIGPROF handler takes samples on this thread (and while samples are counted in every kind of place:
//! a profiled module, an unprofiled one, and no module at all), with `smonitor` filling a program buffer too.
//!
//! A plain `main` (harness = false), so no other thread allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the caller's layout, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded to the allocator that made it.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[inline(never)]
fn spin(rounds: u64) -> u64 {
    let mut x = 0u64;
    for i in 0..rounds {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
    x
}

fn main() {
    // SAFETY: no other thread exists yet.
    unsafe {
        std::env::set_var("GPROFDIR", ""); // no file at exit
        std::env::set_var("MSLPROF_HZ", "1000");
        std::env::set_var("LD_PROFILE", "a.out"); // this test program profiled, libc not
    }
    assert!(mslprof::start_explicitly(), "the runtime did not start");
    // smonitor over every address: the handler also adds each sample to this buffer.
    static BUFFER: [AtomicU32; 64] = [const { AtomicU32::new(0) }; 64];
    let everything = mslprof::smonitor::TextRegion {
        low_pc: std::ptr::without_provenance(1),
        high_pc: std::ptr::without_provenance(usize::MAX),
    };
    // SAFETY: one region; the buffer is 64 aligned 32-bit buckets that live as long as the program.
    unsafe {
        mslprof::exports::smonitor(
            &everything,
            1,
            BUFFER.as_ptr() as *mut c_void,
            std::mem::size_of_val(&BUFFER),
            0,
            mslprof::smonitor::PROF_UINT,
        )
    };
    let samples_before = mslprof::sampler::SAMPLER.total_samples();
    let libc_pc = libc_function();

    let allocations_before = ALLOCATIONS.load(Ordering::SeqCst);
    let mut rounds = 0;
    while mslprof::sampler::SAMPLER.total_samples() < samples_before + 100 && rounds < 10_000 {
        spin(1_000_000);
        rounds += 1;
    }
    // The same counting path the handler uses, at a profiled PC, an unprofiled one and an unknown one.
    for pc in [spin as *const () as usize, libc_pc, 16] {
        mslprof::sampler::record_pc(pc);
    }
    let allocations = ALLOCATIONS.load(Ordering::SeqCst) - allocations_before;
    let samples = mslprof::sampler::SAMPLER.total_samples() - samples_before;

    assert!(samples >= 100, "only {samples} samples were taken");
    let in_buffer: u64 = BUFFER
        .iter()
        .map(|b| u64::from(b.load(Ordering::SeqCst)))
        .sum();
    assert!(
        in_buffer >= samples,
        "smonitor's buffer has {in_buffer} of {samples} samples"
    );
    assert_eq!(
        allocations, 0,
        "{allocations} allocations while {samples} samples were taken"
    );
    let main_module =
        mslprof::modules::find(spin as *const () as usize).expect("the test program is a module");
    assert!(main_module.profiled && main_module.histogram.is_some());
    assert!(mslprof::modules::find(libc_pc).is_some_and(|m| !m.profiled));
    assert!(mslprof::sampler::SAMPLER.unknown_samples() >= 1);
    let dumped = fatal_signal_dump_allocates_nothing();
    println!(
        "no_alloc: {samples} samples, 0 allocations; a {dumped}-byte fatal-signal dump, 0 allocations"
    );
    println!("1 passed, 0 failed");
}

/// The fatal-signal dump (`dump::write_without_heap` once the output path is prepared): moment, descriptors,
/// temporary file, rename, with no allocation. Returns the file's size.
fn fatal_signal_dump_allocates_nothing() -> usize {
    let scratch = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("no_alloc.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let path = scratch.join("gmon.out");
    let prepared = Box::new(mslprof::dump::PreparedPath::new());
    prepared.prepare(
        Some(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())),
        std::process::id(),
    );
    let program = mslprof::dump::build::Program {
        name: b"no_alloc",
        hz: 1000,
    };
    mslprof::sampler::stop_and_quiesce();
    let allocations_before = ALLOCATIONS.load(Ordering::SeqCst);
    let moment = mslprof::dump::moment();
    // SAFETY: sampling was stopped and quiesced above.
    let written = unsafe {
        mslprof::dump::write_prepared(program, &moment, mslprof::modules::all(), &prepared)
    };
    let allocations = ALLOCATIONS.load(Ordering::SeqCst) - allocations_before;
    assert_eq!(written, Some(Ok(())));
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in the fatal-signal dump"
    );
    let bytes = std::fs::read(&path).unwrap();
    let profile = mslprof_format::read(&bytes, Default::default()).unwrap();
    assert_eq!(profile.header.pid, std::process::id());
    assert!(profile.modules.iter().any(|m| m.samples > 0));
    std::fs::remove_dir_all(&scratch).unwrap();
    bytes.len()
}

/// The address of libc's `getpid`, as the loader resolves it.
fn libc_function() -> usize {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr()) };
    assert!(!address.is_null());
    address as usize
}
