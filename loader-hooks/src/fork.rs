//! `fork()`: the atfork handlers. Prepare blocks SIGPROF on the forking thread (so a large process's fork is not
//! restarted forever by profiling signals, gperftools #704) and takes the loader lock if that costs no waiting;
//! the parent undoes both; the child resets each owner's per-process state (process.rs, dynamic_loading.rs,
//! signals.rs) and then tells the runtime.
//!
//! A fork costs what the pages it touches cost: after `fork` every page the parent or the child writes, and every
//! code page the child runs, is a page fault (several microseconds each, more than all the handlers' work).
//! So the code the child runs from here to its first record, or to `_exit`, sits in one section,
//! `mslprof_fork_text`, and the state the handlers write in one other, `mslprof_fork_data`, each a page or
//! two; and the path makes its system calls itself instead of through libc's wrappers, whose pages a child
//! that only execs or exits would not touch otherwise (BENCHMARKS.md, "fork").

use std::sync::atomic::{AtomicU8, Ordering};

use crate::dynamic_loading::{self, ForkLock};
use crate::{events, process, signals, sys};

/// What the prepare handler found and did, for the parent's or child's handler that follows: bit 0, SIGPROF
/// was already blocked on the forking thread; bits 1–2, the loader lock ([`ForkLock::bits`]). glibc runs the
/// prepare handlers, the fork and then the parent's or child's handlers under its own atfork lock, so one fork at
/// a time passes through here (in a single-threaded process nothing else can fork meanwhile).
#[unsafe(link_section = "mslprof_fork_data")]
static FORKING: AtomicU8 = AtomicU8::new(0);

const SIGPROF_WAS_BLOCKED: u8 = 1;

pub(crate) fn install() {
    sys::register_fork_handlers(prepare, in_parent, in_child);
}

unsafe extern "C" fn prepare() {
    let sigprof_was_blocked = sys::block_signal(sys::SIGPROF);
    let lock = dynamic_loading::lock_for_fork();
    FORKING.store(
        u8::from(sigprof_was_blocked) | lock.bits() << 1,
        Ordering::Relaxed,
    );
    if let Some(events) = events::handler() {
        let _ = std::panic::catch_unwind(|| events.before_fork());
    }
}

unsafe extern "C" fn in_parent() {
    let forking = FORKING.load(Ordering::Relaxed);
    if let Some(events) = events::handler() {
        let _ = std::panic::catch_unwind(|| events.after_fork_in_parent());
    }
    dynamic_loading::unlock_after_fork_in_parent(ForkLock::from_bits(forking >> 1));
    if forking & SIGPROF_WAS_BLOCKED == 0 {
        sys::unblock_signal(sys::SIGPROF);
    }
}

#[unsafe(link_section = "mslprof_fork_text")]
unsafe extern "C" fn in_child() {
    let forking = FORKING.load(Ordering::Relaxed);
    process::reset_after_fork();
    signals::reset_after_fork();
    dynamic_loading::reset_after_fork(ForkLock::from_bits(forking >> 1));
    if let Some(events) = events::handler() {
        let _ = std::panic::catch_unwind(|| events.after_fork_in_child());
    }
    if forking & SIGPROF_WAS_BLOCKED == 0 {
        sys::unblock_signal(sys::SIGPROF);
    }
}
