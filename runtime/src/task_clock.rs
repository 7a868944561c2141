//! Per-thread task-clock perf events: the sampler's source of SIGPROF where the kernel allows it.
//!
//! A thread's CPU-time timer is checked only on the kernel's tick (250 Hz here), whatever rate is asked for.
//! A `PERF_COUNT_SW_TASK_CLOCK` event runs an hrtimer while its thread is on a CPU and signals the thread each
//! sample period of its CPU time in user mode, at any rate up to the kernel's 100 kHz. Each thread that gets
//! one has a slot here: its descriptor, the kernel's id of the event (to tell our descriptor from one the
//! program opened under the same number after closing ours) and its watch timer, a CPU-time timer every
//! [`WATCH_PERIOD_NS`] whose signal checks that the event is still open. A program that closes every
//! descriptor above 2 (daemons do) closes the event too: the next watch tick opens a new one, or, when the
//! kernel refuses, turns the watch timer into the thread's sampling timer.
//!
//! The SIGPROF handler reaches a slot through the signal: an event's signal carries its descriptor (`si_fd`,
//! looked up in [`FD_OWNERS`]), the watch timer's carries the slot's address (`si_value`). Atomics only: no
//! lock, no allocation, system calls only from the handler.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU16, AtomicU64, AtomicUsize, Ordering};

use crate::sys;

/// Threads alive at once that can have a task-clock event; later ones are sampled by a CPU-time timer.
const SLOTS: usize = 4096;
/// Descriptors below this number can be a thread's event (a higher one is closed and the thread gets a timer).
const FD_LIMIT: usize = 65536;
/// CPU time of a thread between two checks that its event is still open.
pub const WATCH_PERIOD_NS: u64 = 50_000_000;

/// [`FD_OWNERS`]: the descriptor is no event of ours.
const NOT_OURS: u16 = 0;
/// [`FD_OWNERS`]: the descriptor was an event of ours; a signal it had queued is dropped.
const FORMER: u16 = u16::MAX;

struct Slot {
    /// The owning thread; 0 when the slot is free.
    tid: AtomicI32,
    /// The event's descriptor; -1 when the thread has none (its watch timer samples instead).
    fd: AtomicI32,
    event_id: AtomicU64,
    /// The event still runs its first, randomly shortened period (see `sampler::first_expiry`).
    first_pending: AtomicBool,
    /// The watch timer's id + 1 (0: none).
    watch_timer: AtomicUsize,
}

static SLOT_TABLE: [Slot; SLOTS] = [const {
    Slot {
        tid: AtomicI32::new(0),
        fd: AtomicI32::new(-1),
        event_id: AtomicU64::new(0),
        first_pending: AtomicBool::new(false),
        watch_timer: AtomicUsize::new(0),
    }
}; SLOTS];

/// For each descriptor number: [`NOT_OURS`], [`FORMER`], or the index + 1 of the slot whose event it is.
static FD_OWNERS: [AtomicU16; FD_LIMIT] = [const { AtomicU16::new(NOT_OURS) }; FD_LIMIT];

/// One past the highest slot index ever claimed: the scans stop there.
static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);

/// The errno of the `perf_event_open` refusal that turned task clocks off for this process (0: not refused).
static REFUSED: AtomicI32 = AtomicI32::new(0);

/// Why a thread got no event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoEvent {
    /// The kernel refuses task-clock events to this process (errno): this is the first refusal.
    RefusedNow(i32),
    /// The kernel refused earlier: no thread of this process gets an event.
    Refused,
    /// This thread only (no free slot, no descriptor left, ...).
    Unavailable,
}

/// Opens a task-clock event for the calling thread, first signalling after `first_ns` of its CPU time, and
/// gives it a slot: the slot's index.
pub fn open_for_thread(first_ns: u64) -> Result<usize, NoEvent> {
    if REFUSED.load(Ordering::Relaxed) != 0 {
        return Err(NoEvent::Refused);
    }
    let tid = sys::gettid();
    let Some(index) = claim_slot(tid) else {
        return Err(NoEvent::Unavailable);
    };
    match open_into(index, first_ns, true) {
        Ok(()) => Ok(index),
        Err(error) => {
            SLOT_TABLE[index].tid.store(0, Ordering::Release);
            if is_refusal(error) {
                return Err(
                    if REFUSED
                        .compare_exchange(0, error, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                    {
                        NoEvent::RefusedNow(error)
                    } else {
                        NoEvent::Refused
                    },
                );
            }
            Err(NoEvent::Unavailable)
        }
    }
}

/// Errors that say the kernel will not give this process task-clock events at all (rather than a shortage).
fn is_refusal(error: i32) -> bool {
    !matches!(
        error,
        libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EINTR | libc::EAGAIN
    )
}

fn claim_slot(tid: i32) -> Option<usize> {
    let index = (0..SLOTS).find(|&index| {
        SLOT_TABLE[index]
            .tid
            .compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    })?;
    SLOTS_USED.fetch_max(index + 1, Ordering::Relaxed);
    Some(index)
}

/// Opens an event for the slot's thread (the caller), publishes its descriptor, then enables it: a signal of
/// the event always finds its descriptor known (an unknown one would go to the program, whose default action
/// for SIGPROF ends the process). Async-signal-safe.
fn open_into(index: usize, period_ns: u64, first_pending: bool) -> Result<(), i32> {
    let event = sys::open_task_clock(libc::SIGPROF, period_ns)?;
    let Some(owner) = FD_OWNERS.get(event.fd as usize) else {
        sys::close_task_clock(event);
        return Err(libc::EMFILE);
    };
    let slot = &SLOT_TABLE[index];
    slot.first_pending.store(first_pending, Ordering::Relaxed);
    slot.event_id.store(event.id, Ordering::Relaxed);
    slot.fd.store(event.fd, Ordering::Release);
    owner.store(index as u16 + 1, Ordering::Release);
    if !sys::enable_task_clock(event) {
        forget_descriptor(index, event.fd);
        slot.fd.store(-1, Ordering::Release);
        sys::close_task_clock(event);
        // This thread goes without (not a refusal for the process).
        return Err(libc::EAGAIN);
    }
    Ok(())
}

/// Records the thread's watch timer (its signals carry [`slot_value`]).
pub fn set_watch_timer(index: usize, timer: sys::CpuTimer) {
    SLOT_TABLE[index]
        .watch_timer
        .store(timer.id() + 1, Ordering::Relaxed);
}

/// The `si_value` of a slot's watch timer: the slot's address.
pub fn slot_value(index: usize) -> usize {
    &SLOT_TABLE[index] as *const Slot as usize
}

fn slot_of_value(value: usize) -> Option<usize> {
    let base = SLOT_TABLE.as_ptr() as usize;
    let size = std::mem::size_of::<Slot>();
    let offset = value.checked_sub(base)?;
    (offset % size == 0 && offset / size < SLOTS).then_some(offset / size)
}

fn event_of(slot: &Slot) -> Option<sys::TaskClock> {
    let fd = slot.fd.load(Ordering::Acquire);
    (fd >= 0).then(|| sys::TaskClock {
        fd,
        id: slot.event_id.load(Ordering::Relaxed),
    })
}

/// What a SIGPROF of ours stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tick {
    /// A sample period ended: count the interrupted PC.
    Sample,
    /// Ours, but no sample: a watch tick, or a signal a closed event had queued.
    Quiet,
    /// Not one of ours: the program's.
    NotOurs,
}

/// An `O_ASYNC` signal (`POLL_IN`) for descriptor `fd`. The first signal of an event sets its period from the
/// random first one to `period_ns`. Async-signal-safe.
pub fn on_event_signal(fd: i32, period_ns: u64) -> Tick {
    let Some(owner) = usize::try_from(fd).ok().and_then(|fd| FD_OWNERS.get(fd)) else {
        return Tick::NotOurs;
    };
    match owner.load(Ordering::Acquire) {
        NOT_OURS => Tick::NotOurs,
        FORMER => Tick::Quiet,
        index => {
            let slot = &SLOT_TABLE[usize::from(index) - 1];
            if slot.first_pending.swap(false, Ordering::Relaxed)
                && let Some(event) = event_of(slot)
            {
                sys::set_task_clock_period(event, period_ns);
            }
            Tick::Sample
        }
    }
}

/// A CPU-time timer's signal with `si_value` `value`: a watch tick when it names a slot. While the slot's event
/// is open nothing happens; when the program has closed it, a new one is opened, or, if the kernel refuses,
/// the watch timer becomes the thread's sampling timer (then its ticks are samples, and `on_fallback` is
/// called once). Async-signal-safe.
pub fn on_timer_signal(value: usize, period_ns: u64, on_fallback: fn()) -> Tick {
    let Some(index) = slot_of_value(value) else {
        return Tick::NotOurs;
    };
    let slot = &SLOT_TABLE[index];
    let Some(event) = event_of(slot) else {
        return Tick::Sample;
    };
    if sys::task_clock_is_open(event) {
        return Tick::Quiet;
    }
    forget_descriptor(index, event.fd);
    slot.fd.store(-1, Ordering::Release);
    if open_into(index, period_ns, false).is_err() {
        let timer = slot.watch_timer.load(Ordering::Relaxed);
        if timer != 0 {
            let _ = sys::set_timer_period(sys::CpuTimer::from_id(timer - 1), period_ns, period_ns);
            on_fallback();
        }
    }
    Tick::Quiet
}

/// Marks `fd` as no longer the slot's event (when it still was).
fn forget_descriptor(index: usize, fd: i32) {
    if let Some(owner) = FD_OWNERS.get(fd as usize) {
        let _ = owner.compare_exchange(
            index as u16 + 1,
            FORMER,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

/// At the exit of the slot's thread: deletes its watch timer, closes its event (if the descriptor still is
/// it) and frees the slot.
pub fn release(index: usize) {
    let Some(slot) = SLOT_TABLE.get(index) else {
        return;
    };
    let mask = sys::block_signals();
    let timer = slot.watch_timer.swap(0, Ordering::Relaxed);
    if timer != 0 {
        sys::delete_timer(sys::CpuTimer::from_id(timer - 1));
    }
    if let Some(event) = event_of(slot) {
        sys::close_task_clock(event);
        forget_descriptor(index, event.fd);
    }
    slot.fd.store(-1, Ordering::Relaxed);
    slot.tid.store(0, Ordering::Release);
    sys::restore_signals(&mask);
}

/// In a forked child: the events inherited are the parent's threads' (their signals go to those threads), and
/// timers are not inherited: close the descriptors, free every slot. The refusal, if any, stands.
#[unsafe(link_section = "mslprof_fork_text")]
pub fn forget_after_fork() {
    let used = SLOTS_USED.load(Ordering::Relaxed);
    for (index, slot) in SLOT_TABLE.iter().enumerate().take(used) {
        if slot.tid.load(Ordering::Relaxed) == 0 {
            continue;
        }
        if let Some(event) = event_of(slot) {
            sys::close_task_clock(event);
            forget_descriptor(index, event.fd);
        }
        slot.fd.store(-1, Ordering::Relaxed);
        slot.watch_timer.store(0, Ordering::Relaxed);
        slot.tid.store(0, Ordering::Release);
    }
}
