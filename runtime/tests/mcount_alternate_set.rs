//! A call site with four callees whose set bit agrees (a chain of tail calls returns to one address): two
//! arcs stay in the site's set and two in its alternate set, so cycling through them neither misses nor
//! makes the cache grow, and the counts stay exact.

mod fake_modules;

use fake_modules::fake_module;
use mslprof::mcount;
use mslprof::modules;
use mslprof_format::RuntimeAddress;

const BIAS: usize = 0x7200_0000_0000;
const ROUNDS: u64 = 50_000;

#[test]
fn four_callees_of_one_call_site_fit_without_growing_the_cache() {
    let policy = fake_modules::policy(None);
    modules::update(&policy, |table| {
        table.add(fake_module("libtail.so", BIAS, 0x10_0000))
    });
    let site = BIAS + 0x1000;
    // Callees 64 bytes apart: bit 4 of each is 0, so all four pairs have the same set.
    let callees: Vec<usize> = (0..4).map(|i| BIAS + 0x8_0000 + i * 64).collect();
    let expected_callees = callees.clone();
    std::thread::spawn(move || {
        for _ in 0..ROUNDS {
            for &callee in &callees {
                mcount::record_call(site, callee);
            }
        }
        // Each miss that displaces an entry counts towards growth: cycling four arcs through one 2-way
        // set would make it grow within a few hundred rounds.
        assert_eq!(mcount::thread_cache_sets(), mcount::FIRST_CACHE_SETS);
    })
    .join()
    .unwrap();
    let mut counted = Vec::new();
    modules::find_address(RuntimeAddress::from_usize(site))
        .expect("module")
        .arcs
        .for_each(|arc| counted.push((arc.caller_addr.0, arc.callee_addr.0, arc.count)));
    counted.sort();
    let expected: Vec<(u64, u64, u64)> = expected_callees
        .iter()
        .map(|&callee| ((site - BIAS) as u64, (callee - BIAS) as u64, ROUNDS))
        .collect();
    assert_eq!(counted, expected);
}
