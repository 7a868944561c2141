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
//! When samples have no stacks, an event also has a ring where the kernel maps one ([`RingPlan`]): each
//! sample is a record there (the user pc), and after the first one no signal is sent. A signal per sample
//! costs the kernel an inter-processor interrupt and a signal delivery, a record only its write
//! (BENCHMARKS.md, "Sampling rate and its cost"); the walk of a stack needs the live stack, so samples with
//! stacks are signals. The records are counted by whoever drains the rings: every watch tick of every thread
//! with a ring (every [`WATCH_PERIOD_NS`] of its CPU time) drains all of them ([`drain_all`]), and so do a
//! dump, a pause and a change of the module table; a thread's exit drains its own ([`release`]). A ring holds
//! [`RING_SPAN_NS`] of its thread's CPU time; should one still fill past half, its event signals each sample
//! again for a while ([`on_watch_tick`]). The mapping holds the event, so a program that closes the
//! descriptor does not stop it. Where no ring can be mapped (the locked-memory budget: `perf_event_mlock_kb`,
//! then `RLIMIT_MEMLOCK`), the event signals every sample.
//!
//! The SIGPROF handler reaches a slot through the signal: an event's signal carries its descriptor (`si_fd`,
//! looked up in [`FD_OWNERS`]), the watch timer's carries the slot's address (`si_value`). Atomics only: no
//! lock, no allocation, system calls only from the handler.

use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

use crate::sys;

/// Threads alive at once that can have a task-clock event; later ones are sampled by a CPU-time timer.
const SLOTS: usize = 4096;
/// Descriptors below this number can be a thread's event (a higher one is closed and the thread gets a timer).
const FD_LIMIT: usize = 65536;
/// CPU time of a thread between two checks that its event is still open, or two drains of the rings.
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
    /// The event's ring (0: none, the event signals every sample).
    ring: AtomicUsize,
    /// Held by whoever drains the ring, or unmaps it.
    draining: AtomicBool,
    /// The ring's event signals each sample, and the signal drains the ring ([`on_watch_tick`]).
    signalling: AtomicBool,
    /// The thread's CPU time at its last watch tick (ns).
    last_watch_ns: AtomicU64,
    /// Watch ticks in a row that came on time.
    timely_ticks: AtomicU32,
}

static SLOT_TABLE: [Slot; SLOTS] = [const {
    Slot {
        tid: AtomicI32::new(0),
        fd: AtomicI32::new(-1),
        event_id: AtomicU64::new(0),
        first_pending: AtomicBool::new(false),
        watch_timer: AtomicUsize::new(0),
        ring: AtomicUsize::new(0),
        draining: AtomicBool::new(false),
        signalling: AtomicBool::new(false),
        last_watch_ns: AtomicU64::new(0),
        timely_ticks: AtomicU32::new(0),
    }
}; SLOTS];

/// For each descriptor number: [`NOT_OURS`], [`FORMER`], or the index + 1 of the slot whose event it is.
static FD_OWNERS: [AtomicU16; FD_LIMIT] = [const { AtomicU16::new(NOT_OURS) }; FD_LIMIT];

/// One past the highest slot index ever claimed: the scans stop there.
static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);

/// The errno of the `perf_event_open` refusal that turned task clocks off for this process (0: not refused).
static REFUSED: AtomicI32 = AtomicI32::new(0);

/// Bytes of records in each ring (0: events get no ring), and the records it holds ([`plan_rings`]).
static RING_DATA_BYTES: AtomicUsize = AtomicUsize::new(0);
static RING_RECORDS: AtomicUsize = AtomicUsize::new(0);
/// Thread CPU time a ring holds the samples of: ten times the watch period. A thread that shares its CPU can
/// see its watch ticks come tens of milliseconds of its CPU time late.
pub const RING_SPAN_NS: u64 = 10 * WATCH_PERIOD_NS;
/// Watch ticks in a row that must come on time before a ring's event stops signalling each sample.
const TIMELY_TICKS_TO_GO_QUIET: u32 = 8;
/// Bytes of a sample record: its header and the pc.
const SAMPLE_RECORD_BYTES: usize = 16;
/// `PERF_RECORD_LOST` and `PERF_RECORD_SAMPLE`.
const RECORD_LOST: u32 = 2;
const RECORD_SAMPLE: u32 = 9;

/// The rings task-clock events get, before the first event is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingPlan {
    /// Bytes of records in a ring, a power of two of at least a page (0: no rings).
    pub data_bytes: usize,
    /// The sample period.
    pub period_ns: u64,
}

impl RingPlan {
    /// No rings: every event signals each sample.
    pub const NONE: RingPlan = RingPlan {
        data_bytes: 0,
        period_ns: 0,
    };

    /// Rings for samples every `period_ns` of CPU time: room for [`RING_SPAN_NS`] of them.
    pub fn for_period(period_ns: u64) -> RingPlan {
        let records = (RING_SPAN_NS / period_ns.max(1)) as usize + 1;
        RingPlan {
            data_bytes: (records * SAMPLE_RECORD_BYTES)
                .next_power_of_two()
                .max(sys::page_size()),
            period_ns,
        }
    }
}

/// The sample period (ns) of the events with a ring, for a drain that sets it.
static PERIOD_NS: AtomicU64 = AtomicU64::new(0);

/// Sets the rings of the events opened from now on.
pub fn plan_rings(plan: RingPlan) {
    PERIOD_NS.store(plan.period_ns, Ordering::Relaxed);
    RING_DATA_BYTES.store(plan.data_bytes, Ordering::Relaxed);
    RING_RECORDS.store(plan.data_bytes / SAMPLE_RECORD_BYTES, Ordering::Relaxed);
}

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

/// How a new event's first period is chosen ([`open_for_thread`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstPeriod {
    /// The random first period (`sampler::first_expiry`), at most `period_ns`.
    pub first_ns: u64,
    pub period_ns: u64,
    /// The thread is one the program started (through `pthread_create`): not the process's first thread or a
    /// forked child, which the program can make block SIGPROF before the first sample (`sigwait` servers).
    pub started_thread: bool,
}

/// The smallest first period of an event with a ring, as a fraction of the period: should the first sample's
/// signal never be handled and no ring ever be drained, the thread samples at most this many times too often.
const RING_FIRST_PERIOD_DIVISOR: u64 = 16;

/// Opens a task-clock event for the calling thread and gives it a slot: the slot's index. An event that
/// signals each sample first ends after `first_ns`, then signals every period (the first signal sets the
/// period). An event with a ring needs the first sample's signal handled, or a drain, to change its period:
/// it starts with the whole period where that may never come (the thread blocks SIGPROF already, or is not a
/// [`FirstPeriod::started_thread`]), else with a first period of at least 1/[`RING_FIRST_PERIOD_DIVISOR`].
pub fn open_for_thread(periods: FirstPeriod) -> Result<usize, NoEvent> {
    if REFUSED.load(Ordering::Relaxed) != 0 {
        return Err(NoEvent::Refused);
    }
    let tid = sys::gettid();
    let Some(index) = claim_slot(tid) else {
        return Err(NoEvent::Unavailable);
    };
    match open_into(index, periods) {
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
fn open_into(index: usize, periods: FirstPeriod) -> Result<(), i32> {
    let (event, ring) = open_with_ring(periods.first_ns)?;
    let Some(owner) = FD_OWNERS.get(event.fd as usize) else {
        close_with_ring(event, ring);
        return Err(libc::EMFILE);
    };
    let mut first_pending = periods.first_ns != periods.period_ns;
    if first_pending && ring != 0 {
        // The event is not enabled yet: its first period is the one set now.
        let first = if periods.started_thread && !sys::signal_blocked(libc::SIGPROF) {
            periods
                .first_ns
                .max(periods.period_ns / RING_FIRST_PERIOD_DIVISOR)
        } else {
            first_pending = false;
            periods.period_ns
        };
        sys::set_task_clock_period(event, first);
    }
    let slot = &SLOT_TABLE[index];
    // An event with a ring signals its first sample only (see `on_event_signal`); its watch ticks are timed
    // from now (`on_watch_tick`), which an event without a ring never reads.
    slot.signalling.store(false, Ordering::Relaxed);
    if ring != 0 {
        slot.timely_ticks.store(0, Ordering::Relaxed);
        slot.last_watch_ns.store(
            sys::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).max(0) as u64,
            Ordering::Relaxed,
        );
    }
    slot.ring.store(ring, Ordering::Release);
    slot.first_pending.store(first_pending, Ordering::Relaxed);
    slot.event_id.store(event.id, Ordering::Relaxed);
    slot.fd.store(event.fd, Ordering::Release);
    owner.store(index as u16 + 1, Ordering::Release);
    if !sys::enable_task_clock(event) {
        forget_descriptor(index, event.fd);
        slot.fd.store(-1, Ordering::Release);
        slot.ring.store(0, Ordering::Release);
        close_with_ring(event, ring);
        // This thread goes without (not a refusal for the process).
        return Err(libc::EAGAIN);
    }
    Ok(())
}

/// Opens an event with a ring as planned ([`plan_rings`]), or, when there is no plan or no ring can be mapped,
/// one that signals each sample: the event and its ring (0: none). Async-signal-safe.
fn open_with_ring(period_ns: u64) -> Result<(sys::TaskClock, usize), i32> {
    let data_bytes = RING_DATA_BYTES.load(Ordering::Relaxed);
    if data_bytes != 0 {
        let ring_bytes = u32::try_from(data_bytes).unwrap_or(u32::MAX);
        let event = sys::open_task_clock(libc::SIGPROF, period_ns, true, ring_bytes)?;
        if let Some(ring) = sys::map_event_ring(event, data_bytes) {
            return Ok((event, ring as usize));
        }
        sys::close_task_clock(event);
    }
    let event = sys::open_task_clock(libc::SIGPROF, period_ns, false, 0)?;
    Ok((event, 0))
}

/// Unmaps a ring (0: none). The caller holds it (nothing drains it).
fn unmap_ring(ring: usize) {
    if ring != 0 {
        // SAFETY: `ring` is an event's ring, mapped with the planned size, which nothing uses any more.
        unsafe { sys::unmap_event_ring(ring as *mut u8, RING_DATA_BYTES.load(Ordering::Relaxed)) };
    }
}

/// Closes an event and unmaps its ring (0: none), as [`unmap_ring`].
fn close_with_ring(event: sys::TaskClock, ring: usize) {
    sys::close_task_clock(event);
    unmap_ring(ring);
}

/// Whether the slot's event has a ring (its samples are not signals).
#[unsafe(link_section = "mslprof_fork_text")]
pub fn has_ring(index: usize) -> bool {
    SLOT_TABLE
        .get(index)
        .is_some_and(|slot| slot.ring.load(Ordering::Relaxed) != 0)
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
    /// A sample of a slot whose ring came late: drain that ring ([`drain`]).
    Drain(usize),
    /// The watch tick of a slot whose event has a ring: [`on_watch_tick`], then drain every ring
    /// ([`drain_all`]).
    Watch(usize),
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
            let index = usize::from(index) - 1;
            let slot = &SLOT_TABLE[index];
            let first = slot.first_pending.swap(false, Ordering::Relaxed);
            let event = event_of(slot);
            if first && let Some(event) = event {
                sys::set_task_clock_period(event, period_ns);
            }
            if slot.ring.load(Ordering::Relaxed) == 0 {
                return Tick::Sample;
            }
            // The sample is in the ring. While the event signals each sample, the signal drains the ring;
            // else this is its first sample, or one it signalled before it went quiet: quiet from now on.
            if slot.signalling.load(Ordering::Relaxed) {
                return Tick::Drain(index);
            }
            if let Some(event) = event {
                sys::stop_task_clock_signals(event);
            }
            Tick::Quiet
        }
    }
}

/// A CPU-time timer's signal with `si_value` `value`: a watch tick when it names a slot. When the slot's event
/// has a ring, the tick is [`Tick::Watch`]. Else, while the slot's event is open nothing happens; when the
/// program has closed it, a new one is opened, or, if the kernel refuses, the watch timer becomes the thread's
/// sampling timer (then its ticks are samples, and `on_fallback` is called once). Async-signal-safe.
pub fn on_timer_signal(value: usize, period_ns: u64, on_fallback: fn()) -> Tick {
    let Some(index) = slot_of_value(value) else {
        return Tick::NotOurs;
    };
    let slot = &SLOT_TABLE[index];
    if slot.ring.load(Ordering::Relaxed) != 0 {
        // The ring's mapping holds the event even if the program closed its descriptor.
        return Tick::Watch(index);
    }
    let Some(event) = event_of(slot) else {
        return Tick::Sample;
    };
    if sys::task_clock_is_open(event) {
        return Tick::Quiet;
    }
    forget_descriptor(index, event.fd);
    slot.fd.store(-1, Ordering::Release);
    let periods = FirstPeriod {
        first_ns: period_ns,
        period_ns,
        started_thread: false,
    };
    if open_into(index, periods).is_err() {
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

/// At the exit of the slot's thread: deletes its watch timer, gives the records left in its ring to `visit`,
/// closes its event (if the descriptor still is it), unmaps its ring and frees the slot.
pub fn release(index: usize, visit: &mut dyn FnMut(RingRecord)) {
    let Some(slot) = SLOT_TABLE.get(index) else {
        return;
    };
    let mask = sys::block_signals();
    let timer = slot.watch_timer.swap(0, Ordering::Relaxed);
    if timer != 0 {
        sys::delete_timer(sys::CpuTimer::from_id(timer - 1));
    }
    // Another thread may be draining this ring (a dump): wait for it, then drain what is left.
    while slot.draining.swap(true, Ordering::Acquire) {
        std::thread::yield_now();
    }
    let ring = slot.ring.swap(0, Ordering::AcqRel);
    if ring != 0 {
        read_ring(ring, visit);
    }
    slot.signalling.store(false, Ordering::Relaxed);
    if let Some(event) = event_of(slot) {
        sys::close_task_clock(event);
        forget_descriptor(index, event.fd);
    }
    unmap_ring(ring);
    slot.draining.store(false, Ordering::Release);
    slot.fd.store(-1, Ordering::Relaxed);
    slot.tid.store(0, Ordering::Release);
    sys::restore_signals(&mask);
}

/// In a forked child: the events inherited are the parent's threads' (their signals go to those threads), and
/// timers and rings are not inherited: close the descriptors, free every slot. The refusal, if any, stands.
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
        // The kernel does not copy a ring into a child (`VM_DONTCOPY`): nothing to unmap, and the address may
        // hold a mapping of the child's by now.
        slot.ring.store(0, Ordering::Relaxed);
        slot.draining.store(false, Ordering::Relaxed);
        slot.signalling.store(false, Ordering::Relaxed);
        slot.fd.store(-1, Ordering::Relaxed);
        slot.watch_timer.store(0, Ordering::Relaxed);
        slot.tid.store(0, Ordering::Release);
    }
}

/// One record of a ring, as [`drain`] gives it.
pub enum RingRecord {
    /// A sample: the interrupted user pc.
    Sample(usize),
    /// The kernel lost this many records (the ring was full).
    Lost(u64),
}

/// The data of a mapped ring.
struct Ring {
    data: *const u8,
    size: usize,
}

impl Ring {
    /// The word at position `at` (modulo the size; records are 8-byte aligned, so a word never wraps).
    fn word(&self, at: u64) -> u64 {
        let offset = (at % self.size as u64) as usize & !7;
        // SAFETY: `offset + 8 <= size` (size is a multiple of 8): inside the ring's data, mapped while the
        // caller holds the ring; the kernel does not write the records between tail and head, the only ones
        // read.
        unsafe { self.data.add(offset).cast::<u64>().read_volatile() }
    }
}

/// Gives every record of the slot's ring to `visit` and frees their room, unless someone else is draining it
/// (then returns at once). Async-signal-safe: atomics and reads of the ring only.
pub fn drain(index: usize, visit: &mut dyn FnMut(RingRecord)) {
    let Some(slot) = SLOT_TABLE.get(index) else {
        return;
    };
    if slot.draining.swap(true, Ordering::Acquire) {
        return;
    }
    let ring = slot.ring.load(Ordering::Acquire);
    if ring != 0 {
        let (records, lost) = read_ring(ring, visit);
        if records > 0 && slot.first_pending.swap(false, Ordering::Relaxed) {
            // The first sample's signal has not been handled (the thread blocks SIGPROF): the period is set
            // here, and the event goes quiet.
            if let Some(event) = event_of(slot)
                && sys::task_clock_is_open(event)
            {
                sys::set_task_clock_period(event, PERIOD_NS.load(Ordering::Relaxed));
                if !slot.signalling.load(Ordering::Relaxed) {
                    sys::stop_task_clock_signals(event);
                }
            }
        }
        if lost || records > RING_RECORDS.load(Ordering::Relaxed) / 2 {
            start_signalling(slot);
        }
    }
    slot.draining.store(false, Ordering::Release);
}

/// The event of the slot signals each sample from now on, if it did not (its descriptor still open).
fn start_signalling(slot: &Slot) {
    slot.timely_ticks.store(0, Ordering::Relaxed);
    if !slot.signalling.swap(true, Ordering::Relaxed)
        && let Some(event) = event_of(slot)
        && sys::task_clock_is_open(event)
    {
        sys::start_task_clock_signals(event);
    }
}

/// A watch tick of the calling thread's slot, whose event has a ring: decides whether the event signals each
/// sample. A thread's CPU-time timer fires only on the kernel ticks that find the thread running, so when the
/// thread shares its CPU (with its own process's threads or any other), its ticks can be tens of milliseconds
/// of its CPU time apart. A tick that comes later than half of what the ring holds ([`RING_SPAN_NS`]), or a
/// drain that finds the ring past half full, makes the event signal each sample (each signal drains the ring
/// at once); [`TIMELY_TICKS_TO_GO_QUIET`] ticks in a row on time make it quiet again. Async-signal-safe.
pub fn on_watch_tick(index: usize) {
    let Some(slot) = SLOT_TABLE.get(index) else {
        return;
    };
    let now = sys::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).max(0) as u64;
    let gap = now.saturating_sub(slot.last_watch_ns.swap(now, Ordering::Relaxed));
    if gap > RING_SPAN_NS / 2 {
        start_signalling(slot);
        return;
    }
    let timely = slot.timely_ticks.fetch_add(1, Ordering::Relaxed) + 1;
    if timely >= TIMELY_TICKS_TO_GO_QUIET
        && slot.signalling.swap(false, Ordering::Relaxed)
        && let Some(event) = event_of(slot)
        && sys::task_clock_is_open(event)
    {
        sys::stop_task_clock_signals(event);
    }
}

/// [`drain`] for every slot with a ring; a ring someone else is draining is left to them.
pub fn drain_all(visit: &mut dyn FnMut(RingRecord)) {
    let used = SLOTS_USED.load(Ordering::Relaxed);
    for (index, slot) in SLOT_TABLE.iter().enumerate().take(used) {
        if slot.ring.load(Ordering::Relaxed) != 0 {
            drain(index, visit);
        }
    }
}

/// Reads the records between the ring's tail and head, then moves the tail to the head: the records read, and
/// whether the kernel lost some. The caller holds the ring.
fn read_ring(base: usize, visit: &mut dyn FnMut(RingRecord)) -> (usize, bool) {
    let base = base as *const u8;
    let ring = Ring {
        // SAFETY: the data follows the header page in the ring's mapping.
        data: unsafe { base.add(sys::page_size()) },
        size: RING_DATA_BYTES.load(Ordering::Relaxed),
    };
    // SAFETY: `base` is a mapped ring, held by the caller.
    let head = unsafe { sys::ring_head(base) };
    // SAFETY: as above.
    let mut tail = unsafe { sys::ring_tail(base) };
    let (mut records, mut lost) = (0, false);
    while tail < head {
        records += 1;
        let header = ring.word(tail);
        let kind = header as u32;
        let size = header >> 48;
        if size < 8 || tail + size > head {
            break;
        }
        match kind {
            RECORD_SAMPLE => visit(RingRecord::Sample(ring.word(tail + 8) as usize)),
            RECORD_LOST => {
                lost = true;
                visit(RingRecord::Lost(ring.word(tail + 16)));
            }
            _ => {}
        }
        tail += size;
    }
    // SAFETY: as above.
    unsafe { sys::set_ring_tail(base, head) };
    (records, lost)
}
