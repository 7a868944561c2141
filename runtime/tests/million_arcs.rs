//! More distinct arcs than the old table bound (1 046 528) into one module: 1 200 000 call sites of
//! three callees, each called twice through mcount's counting path, all counted exactly, none dropped.

mod fake_modules;

use fake_modules::fake_module;
use mslprof::mcount;
use mslprof::modules;
use mslprof_format::RuntimeAddress;

const BIAS: usize = 0x7000_0000_0000;
const SITES: usize = 1_200_000;
const TEXT_END: u64 = 0x100_0000;

#[test]
fn one_million_two_hundred_thousand_arcs_are_counted_exactly() {
    let policy = fake_modules::policy(None);
    modules::update(&policy, |table| {
        table.add(fake_module("libmany.so", BIAS, TEXT_END))
    });
    for _ in 0..2 {
        for site in 0..SITES {
            let callee = BIAS + 0x80_0000 + (site % 3) * 0x40;
            mcount::record_call(BIAS + 0x1000 + site * 5, callee);
        }
    }
    // Counts still in this thread's call cache go into the table, as the dump does.
    mcount::publish_cached_counts(false);
    let module = modules::find_address(RuntimeAddress::from_usize(BIAS + 0x1000)).expect("module");
    let mut arcs = 0usize;
    let mut wrong = Vec::new();
    module.arcs.for_each(|arc| {
        arcs += 1;
        if arc.count != 2 && wrong.len() < 5 {
            wrong.push(arc);
        }
    });
    assert_eq!(module.arcs.dropped(), 0);
    assert!(wrong.is_empty(), "{wrong:?}");
    assert_eq!(arcs, SITES);
}
