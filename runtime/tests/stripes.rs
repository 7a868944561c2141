//! Counter stripes are owned by live threads: 63 threads that count at once each get a stripe of their
//! own, a 64th shares the last one, and a stripe given back at thread exit goes to the next thread.

use std::collections::BTreeSet;

use mslprof::arcs::{self, SHARED_STRIPE, STRIPES};

#[test]
fn live_threads_own_distinct_stripes_and_exited_threads_give_theirs_back() {
    let owned: Vec<usize> = (0..STRIPES - 1).map(|_| arcs::take_stripe()).collect();
    let distinct: BTreeSet<usize> = owned.iter().copied().collect();
    assert_eq!(distinct.len(), STRIPES - 1);
    assert!(!distinct.contains(&SHARED_STRIPE));
    // Every stripe of its own is taken: the next thread shares.
    assert_eq!(arcs::take_stripe(), SHARED_STRIPE);
    // A thread exits: its stripe is the next one handed out, and only once.
    arcs::release_stripe(owned[17]);
    assert_eq!(arcs::take_stripe(), owned[17]);
    assert_eq!(arcs::take_stripe(), SHARED_STRIPE);
    // Giving back the shared stripe changes nothing.
    arcs::release_stripe(SHARED_STRIPE);
    assert_eq!(arcs::take_stripe(), SHARED_STRIPE);
}
