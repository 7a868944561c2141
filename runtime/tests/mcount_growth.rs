//! A thread whose working set is far larger than a first call cache: the cache grows (5 times) while
//! counting, across a module-table change and a pause, and every count stays exact; the thread
//! then exits (its grown and retired cache mappings are unmapped) and another thread counts on.

mod fake_modules;

use std::collections::BTreeMap;

use fake_modules::fake_module;
use mslprof::mcount;
use mslprof::modules;
use mslprof_format::RuntimeAddress;

const BIAS: usize = 0x7000_0000_0000;
/// Distinct arcs whose call sites, spread as [`SITE_BYTES`] says, need more of every cache but the largest
/// than it has, so every growth step is taken.
const SITES: usize = 300_000;
const ROUNDS: u64 = 6;
/// Bytes between two call sites: the cache has an entry per 4 bytes of calling code, and a call site whose
/// own entry another took keeps its arc in one of three more (the other way of its set, two of its alternate
/// set). 300 000 sites 256 bytes apart are 19.2 M entries of code, folded onto each entry of the
/// second-largest cache (4 M entries) about 4.6 times: more than the four ways a site can use.
const SITE_BYTES: usize = 256;

/// End of the fake modules' code (link-time).
const TEXT_END: u64 = 0x500_0000;

fn arcs() -> BTreeMap<(u64, u64), u64> {
    let mut arcs = BTreeMap::new();
    modules::find_address(RuntimeAddress::from_usize(BIAS + 0x1000))
        .expect("module")
        .arcs
        .for_each(|arc| {
            arcs.insert((arc.caller_addr.0, arc.callee_addr.0), arc.count);
        });
    arcs
}

fn sweep() {
    for site in 0..SITES {
        // Two callees, so sites share sets with different callees too.
        let callee = BIAS + 0x8_0000 + (site % 2) * 0x100;
        mcount::record_call(BIAS + 0x1000 + site * SITE_BYTES, callee);
    }
}

#[test]
fn a_large_working_set_grows_the_cache_and_counts_exactly() {
    let policy = fake_modules::policy(None);
    modules::update(&policy, |table| {
        table.add(fake_module("liba.so", BIAS, TEXT_END))
    });
    std::thread::spawn(move || {
        for round in 0..ROUNDS {
            if round == ROUNDS / 2 {
                // A new module table empties the (grown) cache.
                modules::update(&policy, |table| {
                    table.add(fake_module("libb.so", 0x7100_0000_0000, TEXT_END))
                });
            }
            if round == ROUNDS / 3 {
                mcount::set_paused(true);
                sweep();
                mcount::set_paused(false);
            }
            sweep();
            if round == 0 {
                assert!(mcount::thread_cache_sets() > mcount::FIRST_CACHE_SETS);
            }
        }
        assert_eq!(mcount::thread_cache_sets(), mcount::MAX_CACHE_SETS);
    })
    .join()
    .unwrap();
    let counted = arcs();
    assert_eq!(counted.len(), SITES);
    assert!(counted.values().all(|&count| count == ROUNDS));

    // A new thread starts with a small cache again and counts on.
    std::thread::spawn(sweep).join().unwrap();
    let counted = arcs();
    assert_eq!(counted.len(), SITES);
    assert!(counted.values().all(|&count| count == ROUNDS + 1));
    assert_eq!(
        modules::find_address(RuntimeAddress::from_usize(BIAS + 0x1000))
            .unwrap()
            .arcs
            .dropped(),
        0
    );
}
