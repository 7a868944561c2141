//! `fork()`: the atfork handlers. Prepare blocks SIGPROF on the forking thread (so a large process's fork is not
//! restarted forever by profiling signals, gperftools #704) and takes the loader lock if that costs no waiting;
//! the parent undoes both; the child resets each owner's per-process state (process.rs, dynamic_loading.rs,
//! signals.rs) and then tells the runtime.

use crate::dynamic_loading::{self, ForkLock};
use crate::{events, process, signals, sys};

thread_local! {
    /// Set by the prepare handler on the forking thread (several threads may fork at once): whether SIGPROF
    /// was already blocked on it, and what prepare did with the loader lock.
    static FORK_STATE: std::cell::Cell<(bool, ForkLock)> =
        const { std::cell::Cell::new((false, ForkLock::NOT_TAKEN)) };
}

pub(crate) fn install() {
    sys::register_fork_handlers(prepare, in_parent, in_child);
}

unsafe extern "C" fn prepare() {
    let sigprof_was_blocked = sys::block_signal(sys::SIGPROF);
    let lock = dynamic_loading::lock_for_fork();
    FORK_STATE.with(|state| state.set((sigprof_was_blocked, lock)));
    if let Some(events) = events::handler() {
        let _ = std::panic::catch_unwind(|| events.before_fork());
    }
}

unsafe extern "C" fn in_parent() {
    let (sigprof_was_blocked, lock) = FORK_STATE.with(|state| state.get());
    if let Some(events) = events::handler() {
        let _ = std::panic::catch_unwind(|| events.after_fork_in_parent());
    }
    dynamic_loading::unlock_after_fork_in_parent(lock);
    if !sigprof_was_blocked {
        sys::unblock_signal(sys::SIGPROF);
    }
}

unsafe extern "C" fn in_child() {
    let (sigprof_was_blocked, lock) = FORK_STATE.with(|state| state.get());
    process::reset_after_fork();
    signals::reset_after_fork();
    dynamic_loading::reset_after_fork(lock);
    if let Some(events) = events::handler() {
        let _ = std::panic::catch_unwind(|| events.after_fork_in_child());
    }
    if !sigprof_was_blocked {
        sys::unblock_signal(sys::SIGPROF);
    }
}
