//! The drain thread: a thread of the runtime that counts the samples of the task-clock rings whose records
//! copy the user stack, as the kernel fills them.
//!
//! With stacks, a sample signalled to its thread costs the kernel an interrupt and a signal delivery besides
//! the walk (BENCHMARKS.md, "Sampling rate and its cost"). With such a ring, the kernel copies the registers and
//! the top of the stack into the thread's ring and signals nobody. A ring holds about 31 samples (31 ms of a
//! thread's CPU time at 1 kHz), so it is drained by its fill level, not on a clock of its thread's CPU time,
//! whose ticks come tens of milliseconds late when threads share a CPU. This thread polls the descriptor of
//! every ring whose event does not signal each sample, which the kernel makes readable when the ring is half
//! full, and walks each sample's copy. It also maps the rings of the threads the program started, once their
//! stacks were seen to fit in a copy or they have lived a while (`task_clock::poll_set`). An event signals
//! each sample, and the SIGPROF handler walks the live stack, until this thread has seen its ring and its
//! stacks fit in a copy; the thread also wakes every [`POLL_TIMEOUT_MS`], for rings whose descriptor the
//! program closed, and every half ring's worth of CPU time while an event signals each sample, for a ring that
//! fills while its thread blocks SIGPROF.
//!
//! The thread starts before the sampler, with every signal blocked, unsampled and detached, and lives as long
//! as the process. A forked child has none: its events signal each sample, as without rings. Its CPU time is
//! taken out of the CPU time the samples stand for (`sampler::note_drainer_cpu_ns`): it takes no sample.

use std::os::raw::c_void;

use crate::{sampler, sys, task_clock};

/// The longest the thread sleeps between two drains (less while a ring's event signals each sample:
/// `task_clock::poll_set`).
const POLL_TIMEOUT_MS: i32 = 20;

/// Starts the drain thread, unless this process has one already. Where it cannot be started, events get no
/// ring with stack copies (`task_clock::drainer_runs`).
pub fn start() {
    if task_clock::drainer_runs() {
        return;
    }
    sampler::note_drainer_cpu_ns([0, 0]);
    if sampler::start_runtime_thread(run) {
        task_clock::set_drainer();
    }
}

/// The drain thread: polls the rings, drains them all, notes its CPU time; for ever. Should it ever panic,
/// sampling stops (the rings would fill) and profiling is off.
extern "C" fn run(_: *mut c_void) -> *mut c_void {
    sys::name_this_thread(c"mslprof-drain");
    let fault = std::panic::catch_unwind(|| {
        let mut descriptors = Vec::with_capacity(64);
        loop {
            let timeout_ms = match task_clock::poll_set(&mut descriptors) {
                Some(longest_ns) => {
                    (longest_ns / 1_000_000).clamp(1, POLL_TIMEOUT_MS as u64) as i32
                }
                None => POLL_TIMEOUT_MS,
            };
            sys::poll_descriptors(&mut descriptors, timeout_ms);
            sampler::drain_rings_now();
            if let Some((user, system)) = sys::thread_cpu_ns() {
                sampler::note_drainer_cpu_ns([user + system, user]);
            }
        }
    });
    if fault.is_err() {
        sampler::stop_and_quiesce();
        crate::status::turn_off(b"the drain thread");
    }
    std::ptr::null_mut()
}
