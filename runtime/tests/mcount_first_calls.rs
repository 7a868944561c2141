//! The first cache grows on the displacements made by first calls of arcs only after 2 048 of them (every
//! first call misses, whatever the cache's size), and on those made by arcs called before after 128; every
//! count stays exact.

mod fake_modules;

use std::collections::BTreeMap;

use fake_modules::fake_module;
use mslprof::mcount;
use mslprof::modules;
use mslprof_format::RuntimeAddress;

const BIAS: usize = 0x7000_0000_0000;
/// Code the first cache reaches: an entry per 4 bytes of calling code.
const REACH: usize = mcount::FIRST_CACHE_SETS * 2 * 4;
const CALLEE: usize = BIAS + 0x10_0000;

/// The call site `index` of a run of sites 4 bytes apart starting `fold` cache reaches into the code: sites of
/// different folds with the same index share their own entry.
fn site(fold: usize, index: usize) -> usize {
    BIAS + 0x1000 + fold * REACH + index * 4
}

fn call_sites(fold: usize, sites: std::ops::Range<usize>) {
    for index in sites {
        mcount::record_call(site(fold, index), CALLEE);
    }
}

fn arcs() -> BTreeMap<u64, u64> {
    let mut arcs = BTreeMap::new();
    modules::find_address(RuntimeAddress::from_usize(BIAS + 0x1000))
        .expect("module")
        .arcs
        .for_each(|arc| {
            arcs.insert(arc.caller_addr.0, arc.count);
        });
    arcs
}

#[test]
fn first_calls_grow_the_first_cache_late_and_calls_made_before_early() {
    let policy = fake_modules::policy(None);
    modules::update(&policy, |table| {
        table.add(fake_module("liba.so", BIAS, 0x100_0000))
    });
    let entries = mcount::FIRST_CACHE_SETS * 2;
    let (first_done, wait_first) = std::sync::mpsc::channel();
    let (second_done, wait_second) = std::sync::mpsc::channel::<()>();
    let first = std::thread::spawn(move || {
        // Every entry of the first cache taken by a call site of its own.
        call_sites(0, 0..entries);
        assert_eq!(mcount::thread_cache_sets(), mcount::FIRST_CACHE_SETS);
        // 2 000 first calls of sites whose own entries those hold: each displaces an arc, none grows the cache.
        call_sites(1, 0..2_000);
        assert_eq!(mcount::thread_cache_sets(), mcount::FIRST_CACHE_SETS);
        // 100 more first calls: past 2 048 displacements, the cache grows.
        call_sites(1, 2_000..2_100);
        assert!(mcount::thread_cache_sets() > mcount::FIRST_CACHE_SETS);
        first_done.send(()).unwrap();
        // Alive, so that the second thread gets a first cache (and a counter stripe) of its own.
        wait_second.recv().unwrap();
    });
    wait_first.recv().unwrap();
    // 1 000 first calls displace as many arcs; calling 200 of those again (arcs called before) grows the cache.
    std::thread::spawn(move || {
        call_sites(0, 0..entries);
        call_sites(2, 0..1_000);
        assert_eq!(mcount::thread_cache_sets(), mcount::FIRST_CACHE_SETS);
        call_sites(0, 0..200);
        assert!(mcount::thread_cache_sets() > mcount::FIRST_CACHE_SETS);
    })
    .join()
    .unwrap();
    second_done.send(()).unwrap();
    first.join().unwrap();
    let counted = arcs();
    assert_eq!(counted.len(), entries + 2_100 + 1_000);
    for (&caller, &count) in &counted {
        let caller = caller as usize + BIAS;
        let expected = if caller < site(0, 200) {
            3
        } else if caller < site(1, 0) {
            2
        } else {
            1
        };
        assert_eq!(count, expected, "the arc from {caller:#x}");
    }
}
