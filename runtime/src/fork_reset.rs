//! A forked child's fresh start, made when the child first records something rather than at `fork`.
//!
//! The child's profile covers only the child, so the parent's samples, arcs, cached counts and stripes must
//! go before the child counts anything. Done in the atfork child handler, that work touched pages a child
//! that only `exec`s or `_exit`s never needs (copy-on-write faults, code first run in the child), and made a
//! fork cost 1.6–1.9× a plain one. So the handler does only what cannot wait (`lifecycle::after_fork_in_child`:
//! the code rewrite in flight, the thread's own cache header and the fork epoch that sends every call to the
//! slow path, the child's timer) and marks the rest pending; it is done by [`settle`], which every path that
//! records calls first: the slow path of `mcount` (every call of the child reaches it first, through the
//! epoch), the SIGPROF handler, and snapshots. The dumps at the end of a child with the reset still pending
//! know that it recorded nothing ([`pending`]).

use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::sys;

/// What a forked child's one thread keeps of the forking thread: its cache slot (address, 0: none) and its
/// stripe + 1 (0: none).
#[derive(Clone, Copy, Debug, Default)]
pub struct ForkOwner {
    pub slot: usize,
    pub stripe: usize,
}

const NONE: u8 = 0;
const PENDING: u8 = 1;
const RUNNING: u8 = 2;

#[unsafe(link_section = "mslprof_fork_data")]
static STATE: AtomicU8 = AtomicU8::new(NONE);
/// The forking thread's own cache slot (address; 0: none) and stripe + 1 (0: none), which it keeps.
#[unsafe(link_section = "mslprof_fork_data")]
static OWN_SLOT: AtomicUsize = AtomicUsize::new(0);
#[unsafe(link_section = "mslprof_fork_data")]
static OWN_STRIPE: AtomicUsize = AtomicUsize::new(0);
/// The reset itself (`lifecycle`, which owns the state it resets), set at start-up.
static RESET: OnceLock<fn(ForkOwner)> = OnceLock::new();

/// At start-up: the function that drops the parent's counts, keeping those of the forking thread.
pub fn install(reset: fn(ForkOwner)) {
    let _ = RESET.set(reset);
}

/// In the atfork child handler (one thread): the reset is pending, keeping `own` (the forking thread's slot
/// and stripe, from `mcount::reset_thread_after_fork`).
#[unsafe(link_section = "mslprof_fork_text")]
pub fn mark_pending(own: ForkOwner) {
    OWN_SLOT.store(own.slot, Ordering::Relaxed);
    OWN_STRIPE.store(own.stripe, Ordering::Relaxed);
    STATE.store(PENDING, Ordering::Release);
}

/// Whether this process is a forked child that has recorded nothing yet (its reset still pending).
#[inline]
pub fn pending() -> bool {
    STATE.load(Ordering::Acquire) != NONE
}

/// Makes the pending reset, if any, before the caller records. Async-signal-safe (atomics, `madvise`, the
/// signal mask): the thread that makes it blocks its signals meanwhile, so no handler of its own can find it
/// half done; another thread that arrives meanwhile waits (with its signals blocked too) until it is done.
#[inline]
pub fn settle() {
    if STATE.load(Ordering::Acquire) != NONE {
        settle_slowly();
    }
}

#[cold]
fn settle_slowly() {
    let signals = sys::block_signals();
    match STATE.compare_exchange(PENDING, RUNNING, Ordering::Acquire, Ordering::Acquire) {
        Ok(_) => {
            if let Some(reset) = RESET.get() {
                reset(ForkOwner {
                    slot: OWN_SLOT.load(Ordering::Relaxed),
                    stripe: OWN_STRIPE.load(Ordering::Relaxed),
                });
            }
            STATE.store(NONE, Ordering::Release);
        }
        Err(_) => {
            while STATE.load(Ordering::Acquire) == RUNNING {
                core::hint::spin_loop();
            }
        }
    }
    sys::restore_signals(&signals);
}
