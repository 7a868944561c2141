//! The Rust half of mcount, driven directly: exact counts from several threads, no allocation on
//! the counting path (a counting global allocator), and correct counts across a module-table change
//! (which must empty the per-thread call caches) and a fork-time reset.

mod fake_modules;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fake_modules::fake_module;
use mslprof::mcount::{self, UNKNOWN_KEY};
use mslprof::modules;
use mslprof_format::RuntimeAddress;

struct CountingAllocator;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on the threads under test: the test harness's own threads allocate whenever they like.
    static MEASURED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn measured() -> bool {
    COUNTING.load(Ordering::Relaxed) && MEASURED.try_with(|m| m.get()).unwrap_or(false)
}

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if measured() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if measured() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const BIAS_A: usize = 0x7000_0000_0000;
const BIAS_B: usize = 0x7100_0000_0000;

/// End of the fake modules' code (link-time).
const TEXT_END: u64 = 0x9000;

/// (caller key, caller address, callee address) → count, for the module containing `pc`.
/// Counts still in the calling thread's call cache are published first, as the dump does.
fn arcs_at(pc: usize) -> BTreeMap<(u32, u64, u64), u64> {
    mcount::publish_cached_counts(false);
    let mut arcs = BTreeMap::new();
    modules::find_address(RuntimeAddress::from_usize(pc))
        .expect("module")
        .arcs
        .for_each(|arc| {
            arcs.insert(
                (arc.caller_key, arc.caller_addr.0, arc.callee_addr.0),
                arc.count,
            );
        });
    arcs
}

#[test]
fn counting_path_is_exact_allocation_free_and_survives_table_changes() {
    let policy = fake_modules::policy(Some(b"liba.so"));
    let (a, b) = modules::update(&policy, |table| {
        (
            table.add(fake_module("liba.so", BIAS_A, TEXT_END)),
            table.add(fake_module("libb.so", BIAS_B, TEXT_END)),
        )
    });
    assert!(a.profiled && !b.profiled);

    const THREADS: usize = 4;
    const CALLS: u64 = 200_000;
    // Counting covers every call: it starts before the workers are released and stops after all of
    // them have finished calling but before any of them exits (thread exit is not ours to check).
    let started = Barrier::new(THREADS + 1);
    let ready = Barrier::new(THREADS + 1);
    let finished = AtomicU64::new(0);
    let release = Barrier::new(THREADS + 1);
    std::thread::scope(|scope| {
        let mut workers = Vec::with_capacity(THREADS);
        for thread in 0..THREADS {
            let (started, ready) = (&started, &ready);
            let (finished, release) = (&finished, &release);
            workers.push(scope.spawn(move || {
                // Thread start-up (which allocates) is over before counting starts.
                started.wait();
                MEASURED.with(|m| m.set(true));
                ready.wait();
                for call in 0..CALLS {
                    // Within liba, from libb, from nowhere, and into the unselected libb; some
                    // arcs per thread, some shared, more than a call cache holds.
                    let site = BIAS_A + 0x2000 + (call % 300) as usize * 4;
                    mcount::record_call(site, BIAS_A + 0x4000);
                    mcount::record_call(BIAS_B + 0x1500 + thread, BIAS_A + 0x5000);
                    mcount::record_call(0x10, BIAS_A + 0x6000);
                    mcount::record_call(BIAS_A + 0x2000, BIAS_B + 0x3000);
                    mcount::__cyg_profile_func_enter(
                        (BIAS_A + 0x7000) as *mut _,
                        (BIAS_A + 0x1234) as *mut _,
                    );
                }
                MEASURED.with(|m| m.set(false));
                finished.fetch_add(1, Ordering::SeqCst);
                release.wait();
            }));
        }
        started.wait();
        COUNTING.store(true, Ordering::SeqCst);
        ready.wait();
        while finished.load(Ordering::SeqCst) < THREADS as u64 {
            std::hint::spin_loop();
        }
        COUNTING.store(false, Ordering::SeqCst);
        release.wait();
        // Joined explicitly: the scope alone returns once the closures have returned, possibly before
        // the threads' exit destructors have flushed the counts their caches still hold (calls from no
        // module are held as deltas, which only the thread itself or the process's last dump adds).
        for worker in workers {
            worker.join().expect("worker");
        }
    });
    assert_eq!(
        ALLOCATIONS.load(Ordering::SeqCst),
        0,
        "the counting path allocated"
    );

    let total = THREADS as u64 * CALLS;
    let arcs = arcs_at(BIAS_A + 0x1000);
    let within: u64 = arcs
        .iter()
        .filter(|(key, _)| key.2 == 0x4000)
        .map(|(key, count)| {
            assert_eq!(key.0, a.key);
            count
        })
        .sum();
    assert_eq!(within, total);
    assert_eq!(
        arcs[&(a.key, 0x2000, 0x4000)],
        THREADS as u64 * CALLS.div_ceil(300)
    );
    for thread in 0..THREADS as u64 {
        assert_eq!(arcs[&(b.key, 0x1500 + thread, 0x5000)], CALLS);
    }
    assert_eq!(arcs[&(UNKNOWN_KEY, 0, 0x6000)], total);
    assert_eq!(arcs[&(a.key, 0x1234, 0x7000)], total);
    assert!(b.arcs.is_empty(), "unselected module recorded arcs");
    assert_eq!(a.arcs.dropped(), 0);

    // A table change (a module loaded) empties the call caches; counting carries on exactly.
    let c = modules::update(&policy, |table| {
        table.add(fake_module("libc_fake.so", 0x7200_0000_0000, TEXT_END))
    });
    for _ in 0..10 {
        mcount::record_call(BIAS_A + 0x1234, BIAS_A + 0x7000);
    }
    assert_eq!(
        arcs_at(BIAS_A + 0x1000)[&(a.key, 0x1234, 0x7000)],
        total + 10
    );
    assert!(!c.profiled);

    // moncontrol(0): nothing is counted while paused.
    mcount::set_paused(true);
    mcount::record_call(BIAS_A + 0x1234, BIAS_A + 0x7000);
    mcount::set_paused(false);
    assert_eq!(
        arcs_at(BIAS_A + 0x1000)[&(a.key, 0x1234, 0x7000)],
        total + 10
    );

    // After a fork-time reset (the thread's part at fork, the counts' part before the child's first count)
    // the cached counters must not be used: counts start from zero.
    let own = mcount::reset_thread_after_fork();
    mcount::reset_counts_after_fork(own);
    assert!(arcs_at(BIAS_A + 0x1000).is_empty());
    for _ in 0..3 {
        mcount::record_call(BIAS_A + 0x1234, BIAS_A + 0x7000);
    }
    assert_eq!(arcs_at(BIAS_A + 0x1000)[&(a.key, 0x1234, 0x7000)], 3);
}
