//! Per-thread task-clock perf events: the sampler's source of SIGPROF where the kernel allows it.
//!
//! A thread's CPU-time timer is checked only on the kernel's tick (250 Hz here), whatever rate is asked for.
//! A `PERF_COUNT_SW_TASK_CLOCK` event runs an hrtimer while its thread is on a CPU and signals the thread each
//! sample period of its CPU time in user mode, at any rate up to `config::MAX_HZ`. Each thread that gets
//! one has a slot here: its descriptor, the kernel's id of the event (to tell our descriptor from one the
//! program opened under the same number after closing ours) and its watch timer, a CPU-time timer every
//! [`WATCH_PERIOD_NS`] whose signal checks that the event is still open. A program that closes every
//! descriptor above 2 (daemons do) closes the event too: the next watch tick opens a new one, or, when the
//! kernel refuses, turns the watch timer into the thread's sampling timer.
//!
//! Where the kernel maps one, an event also has a ring ([`RingPlan`]): each sample is a record there and, after
//! the first one, no signal is sent. A signal per sample costs the kernel an inter-processor interrupt and a
//! signal delivery, a record only its write (BENCHMARKS.md, "Sampling rate and its cost"). When samples have no
//! stacks, a record is the user pc, and whoever drains the rings counts them: every watch tick of every thread
//! with a ring (every [`WATCH_PERIOD_NS`] of its CPU time) drains all of them ([`drain_all`]); such a ring holds
//! [`RING_SPAN_NS`] of its thread's CPU time, and should one still fill past half, its event signals each
//! sample again for a while ([`on_watch_tick`]). When samples have stacks, a record also holds the registers
//! and a copy of the top of the stack ([`CopiedStack`]), and the drain thread (`ring_drainer`) walks them as
//! the ring fills ([`poll_set`]); should a walk need more than the copy, the ring goes and the event signals
//! each sample for a while, and the handler walks the live stack. A dump, a pause and a change of the module
//! table drain every ring; a thread's exit drains its own ([`release`]). The mapping holds the event, so a
//! program that closes the descriptor does not stop it. Where no ring can be mapped (the locked-memory budget:
//! `perf_event_mlock_kb`, then `RLIMIT_MEMLOCK`), the event signals every sample.
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
    /// The drain thread polls the ring's descriptor ([`poll_set`]); until then, its event signals each sample.
    adopted: AtomicBool,
    /// The descriptor was found to be no longer the event's (the program closed it): the drain thread no longer
    /// polls it, and drains the ring on its timeout.
    descriptor_gone: AtomicBool,
    /// The event's records copy stacks, and the drain thread maps its ring once [`FITTING_WALKS_TO_GO_QUIET`]
    /// live walks of its samples in a row have fitted in a copy, or the thread has lived [`STACK_RING_DELAY_NS`]
    /// ([`poll_set`]); until then it has none.
    ring_wanted: AtomicBool,
    /// When the event was opened (`CLOCK_MONOTONIC`, ns).
    opened_ns: AtomicU64,
    /// The wanted ring is mapped only once live walks fit, never for the thread's age: the thread's stacks were
    /// seen to outgrow a copy ([`map_ring_once_stacks_fit`]); cleared when the ring is mapped.
    ring_once_fitting: AtomicBool,
    /// Live walks still to come, whether they fit or not, before a ring wanted [`Slot::ring_once_fitting`] is
    /// mapped.
    walks_before_ring: AtomicU32,
    /// While [`Slot::ring_once_fitting`]: when the thread's samples were last walked live, or its ring withheld
    /// (`CLOCK_MONOTONIC`, ns).
    last_walk_ns: AtomicU64,
    /// The last live walk of the thread's samples needed more stack than a copy holds ([`note_live_walk`]).
    last_walk_outgrew: AtomicBool,
    /// The thread's CPU time at its last watch tick (ns).
    last_watch_ns: AtomicU64,
    /// Watch ticks in a row that came on time.
    timely_ticks: AtomicU32,
    /// Timely watch ticks in a row after which a signalling event goes quiet ([`start_signalling`]).
    quiet_after_ticks: AtomicU32,
    /// Live walks in a row, by the handler of a signalling event with stack copies, whose stacks the copy would
    /// have held ([`note_live_walk`]).
    fitting_walks: AtomicU32,
    /// A forked child's slot whose event is opened at the child's first sample, which its watch timer takes
    /// ([`defer_for_thread`]).
    deferred: AtomicBool,
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
        adopted: AtomicBool::new(false),
        descriptor_gone: AtomicBool::new(false),
        ring_wanted: AtomicBool::new(false),
        opened_ns: AtomicU64::new(0),
        ring_once_fitting: AtomicBool::new(false),
        walks_before_ring: AtomicU32::new(0),
        last_walk_ns: AtomicU64::new(0),
        last_walk_outgrew: AtomicBool::new(false),
        last_watch_ns: AtomicU64::new(0),
        timely_ticks: AtomicU32::new(0),
        quiet_after_ticks: AtomicU32::new(TIMELY_TICKS_TO_GO_QUIET),
        fitting_walks: AtomicU32::new(0),
        deferred: AtomicBool::new(false),
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
/// Bytes of user stack each record copies (0: records hold the pc only).
static RING_STACK_BYTES: AtomicU32 = AtomicU32::new(0);
/// The process whose drain thread polls the rings with stack copies ([`set_drainer`]; 0: none). A forked
/// child has no drain thread: its events get no such ring.
static DRAINER_PID: AtomicU32 = AtomicU32::new(0);
/// Thread CPU time a ring holds the samples of: ten times the watch period. A thread that shares its CPU can
/// see its watch ticks come tens of milliseconds of its CPU time late.
pub const RING_SPAN_NS: u64 = 10 * WATCH_PERIOD_NS;
/// Watch ticks in a row that must come on time before a ring's event stops signalling each sample.
const TIMELY_TICKS_TO_GO_QUIET: u32 = 8;
/// Watch ticks in a row (2 s of the thread's CPU time) that an event signals each sample after a sample's walk
/// needed more than its stack copy (a stack deeper than the copy, a signal handler on an alternate stack): the
/// handler walks the live stack meanwhile. A thread whose ring was given back meanwhile counts as many watch
/// periods of samples instead ([`map_ring_once_stacks_fit`]).
const LIVE_STACK_TICKS: u32 = 40;
/// Live walks in a row whose stacks a copy would have held before an event whose records copy stacks stops
/// signalling each sample: a thread whose stacks are deeper than the copy keeps being walked live.
const FITTING_WALKS_TO_GO_QUIET: u32 = 16;
/// Bytes of a sample record: its header and the pc.
const SAMPLE_RECORD_BYTES: usize = 16;
/// Bytes of a sample record with a stack copy besides the copy: its header, the pc, the registers' ABI and
/// three registers, the copy's size and the bytes of it the kernel filled.
const STACK_RECORD_FIXED_BYTES: usize = 64;
/// Bytes of records in a ring with stack copies: 31 samples of 16 KiB stacks, 31 ms of a thread's CPU at
/// 1 kHz. The drain thread is woken when half of it is full.
const STACK_RING_BYTES: usize = 512 << 10;
/// How long a thread lives before the drain thread maps its event's ring with stack copies, unless its stacks
/// were seen to fit in a copy before ([`FITTING_WALKS_TO_GO_QUIET`] live walks in a row, as many periods of its
/// CPU time): mapping (and at the thread's exit unmapping) 512 KiB costs about as much as 100 µs of the thread's
/// own work, which threads that live a few milliseconds would pay for nothing; until then the event signals
/// each sample.
const STACK_RING_DELAY_NS: u64 = 50_000_000;
/// How long a thread whose ring was withheld because its stacks outgrow a copy ([`map_ring_once_stacks_fit`])
/// goes without a live walk of its samples before the drain thread maps its ring anyway: a thread that blocks
/// SIGPROF takes no signal, and its samples would be lost without a ring; one that sleeps pays a mapping.
const UNWALKED_RING_DELAY_NS: u64 = 100_000_000;
/// `PERF_RECORD_LOST` and `PERF_RECORD_SAMPLE`.
const RECORD_LOST: u32 = 2;
const RECORD_SAMPLE: u32 = 9;

/// The rings task-clock events get, before the first event is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingPlan {
    /// Bytes of records in a ring, a power of two of at least a page (0: no rings).
    pub data_bytes: usize,
    /// Bytes of user stack each record copies (0: the pc only).
    pub stack_bytes: u32,
    /// The sample period.
    pub period_ns: u64,
}

impl RingPlan {
    /// No rings: every event signals each sample.
    pub const NONE: RingPlan = RingPlan {
        data_bytes: 0,
        stack_bytes: 0,
        period_ns: 0,
    };

    /// Rings of the pc for samples every `period_ns` of CPU time: room for [`RING_SPAN_NS`] of them.
    pub fn for_period(period_ns: u64) -> RingPlan {
        let records = (RING_SPAN_NS / period_ns.max(1)) as usize + 1;
        RingPlan {
            data_bytes: (records * SAMPLE_RECORD_BYTES)
                .next_power_of_two()
                .max(sys::page_size()),
            stack_bytes: 0,
            period_ns,
        }
    }

    /// Rings whose records copy `stack_bytes` of the user stack (a multiple of 8, at most 32 KiB), for the
    /// drain thread to walk: [`STACK_RING_BYTES`] each.
    pub fn with_stacks(period_ns: u64, stack_bytes: u32) -> RingPlan {
        RingPlan {
            data_bytes: STACK_RING_BYTES,
            stack_bytes: stack_bytes.min(32 << 10) & !7,
            period_ns,
        }
    }

    /// Bytes of one record.
    fn record_bytes(&self) -> usize {
        if self.stack_bytes == 0 {
            SAMPLE_RECORD_BYTES
        } else {
            STACK_RECORD_FIXED_BYTES + self.stack_bytes as usize
        }
    }
}

/// The sample period (ns) of the events with a ring, for a drain that sets it.
static PERIOD_NS: AtomicU64 = AtomicU64::new(0);

/// Sets the rings of the events opened from now on.
pub fn plan_rings(plan: RingPlan) {
    PERIOD_NS.store(plan.period_ns, Ordering::Relaxed);
    RING_STACK_BYTES.store(plan.stack_bytes, Ordering::Relaxed);
    RING_DATA_BYTES.store(plan.data_bytes, Ordering::Relaxed);
    RING_RECORDS.store(plan.data_bytes / plan.record_bytes(), Ordering::Relaxed);
}

/// This process's drain thread is running: events opened from now on get rings with stack copies, if the
/// plan has them. Called by the drain thread's starter, before any event is opened.
pub fn set_drainer() {
    DRAINER_PID.store(sys::getpid(), Ordering::Relaxed);
}

/// Whether this process's drain thread runs ([`set_drainer`]; a forked child has none).
pub fn drainer_runs() -> bool {
    DRAINER_PID.load(Ordering::Relaxed) == sys::getpid()
}

/// Whether the rings of this process's events copy stacks for its drain thread.
pub fn rings_copy_stacks() -> bool {
    RING_STACK_BYTES.load(Ordering::Relaxed) != 0
        && RING_DATA_BYTES.load(Ordering::Relaxed) != 0
        && drainer_runs()
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

/// The smallest random first period, as a fraction of the period: should the first sample's signal never be
/// handled and no ring ever be drained, the thread samples at most this many times too often.
const FIRST_PERIOD_DIVISOR: u64 = 16;

/// The shortest sample period, that of the highest rate (`config::MAX_HZ`, 10 kHz), and the shortest random first
/// period. On a virtual machine a sample costs the kernel 25-40 us (timer interrupts and their re-arming exit to
/// the host, and the guest charges that time to the thread's CPU time); nearer the period than that, the task
/// clock expires again as soon as the thread gets back to its own code, and the program almost stops (measured
/// here: an empty `main` at 100 kHz took 0.06 s or over 1 s from one run to the next; `perf record -c 10000` on
/// a loop, 10 to 50 times its time). A thread that blocks SIGPROF when its event starts keeps its first period
/// until its signal is handled: forked children, which opened their events in the fork handler with SIGPROF
/// blocked until `fork` returned, took up to 2.5 s of CPU to `_exit` with a first period of a few microseconds.
pub const SHORTEST_PERIOD_NS: u64 = 100_000;

/// The first period an event starts with: the random one of `periods`, but no shorter than
/// 1/[`FIRST_PERIOD_DIVISOR`] of the period nor than [`SHORTEST_PERIOD_NS`]; the whole period when the
/// shortened one's signal may never be handled or the ring never drained (`whole`).
fn first_period(periods: FirstPeriod, whole: bool) -> u64 {
    if whole {
        return periods.period_ns;
    }
    let shortest = (periods.period_ns / FIRST_PERIOD_DIVISOR).max(SHORTEST_PERIOD_NS);
    periods.first_ns.max(shortest).min(periods.period_ns)
}

/// Opens a task-clock event for the calling thread and gives it a slot: the slot's index. An event first ends
/// after its first period ([`first_period`]), then samples every period (the first signal, or a drain, sets the
/// period). An event that signals each sample starts with the whole period when a started thread blocks SIGPROF
/// already (its signal may never be handled). An event with a ring needs the first sample's signal handled, or a
/// drain, to change its period: it starts with the whole period where that may never come (the thread blocks
/// SIGPROF already, or is not a [`FirstPeriod::started_thread`]).
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
            Err(no_event(error))
        }
    }
}

/// For a forked child's thread: a slot whose event is opened at the child's first sample. The caller starts the
/// slot's watch timer to take that sample, at a random point of the first period and every period after it; the
/// sample's signal opens the event and makes the timer a watch timer ([`on_timer_signal`]). A child that
/// `exec`s or `_exit`s first (most do) never opens one: an event costs a child about as much CPU time as the
/// rest of its fork (BENCHMARKS.md, "fork"). Async-signal-safe.
#[unsafe(link_section = "mslprof_fork_text")]
pub fn defer_for_thread() -> Result<usize, NoEvent> {
    if REFUSED.load(Ordering::Relaxed) != 0 {
        return Err(NoEvent::Refused);
    }
    let index = claim_slot(sys::gettid()).ok_or(NoEvent::Unavailable)?;
    SLOT_TABLE[index].deferred.store(true, Ordering::Relaxed);
    Ok(index)
}

/// Opens the event of a slot made by [`defer_for_thread`] (its thread's first sample is being taken): the event
/// samples from its first whole period on, and the slot's timer becomes its watch timer. When it cannot be
/// opened, the timer goes on sampling (`on_fallback`, told why). Async-signal-safe.
pub fn open_deferred(index: usize, period_ns: u64, on_fallback: fn(NoEvent)) {
    let Some(slot) = SLOT_TABLE.get(index) else {
        return;
    };
    // Loaded first: the timer of a thread without an event calls here at each sample.
    if !slot.deferred.load(Ordering::Relaxed) || !slot.deferred.swap(false, Ordering::Relaxed) {
        return;
    }
    let periods = FirstPeriod {
        first_ns: period_ns,
        period_ns,
        started_thread: false,
    };
    let timer = slot.watch_timer.load(Ordering::Relaxed);
    match open_into(index, periods) {
        Ok(()) if timer != 0 => {
            let timer = sys::CpuTimer::from_id(timer - 1);
            let _ = sys::set_timer_period(timer, WATCH_PERIOD_NS, WATCH_PERIOD_NS);
        }
        Ok(()) => {}
        Err(error) => on_fallback(no_event(error)),
    }
}

/// What the failed open of an event (`error`) means: a shortage of this thread's, or the kernel refusing task
/// clocks to this process, which turns them off for every later thread ([`REFUSED`]); the first refusal is
/// [`NoEvent::RefusedNow`], which the caller reports.
fn no_event(error: i32) -> NoEvent {
    if !is_refusal(error) {
        NoEvent::Unavailable
    } else if REFUSED
        .compare_exchange(0, error, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
    {
        NoEvent::RefusedNow(error)
    } else {
        NoEvent::Refused
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
    let blocked = sys::signal_blocked(libc::SIGPROF);
    let signalling_first = first_period(periods, periods.started_thread && blocked);
    let (event, ring) = open_with_ring(signalling_first, !periods.started_thread)?;
    let Some(owner) = FD_OWNERS.get(event.fd as usize) else {
        close_with_ring(event, ring);
        return Err(libc::EMFILE);
    };
    // Records with stack copies: the drain thread maps the ring later (`install_ring`).
    let ring_wanted = ring == 0 && rings_copy_stacks();
    let first = if ring != 0 || ring_wanted {
        first_period(periods, !periods.started_thread || blocked)
    } else {
        signalling_first
    };
    if first != signalling_first {
        // The event is not enabled yet: its first period is the one set now.
        sys::set_task_clock_period(event, first);
    }
    let first_pending = first != periods.period_ns;
    let slot = &SLOT_TABLE[index];
    // An event with a ring signals its first sample only (see `on_event_signal`), or, when its records copy
    // stacks, each sample until the drain thread polls it and its stacks fit (see `go_quiet_if_due`); its watch
    // ticks are timed from now (`on_watch_tick`), which an event without a ring never reads.
    slot.ring_wanted.store(ring_wanted, Ordering::Relaxed);
    slot.ring_once_fitting.store(false, Ordering::Relaxed);
    slot.last_walk_outgrew.store(false, Ordering::Relaxed);
    slot.opened_ns.store(monotonic_ns(), Ordering::Relaxed);
    slot.fitting_walks.store(0, Ordering::Relaxed);
    begin_ring_states(slot, ring != 0 && rings_copy_stacks());
    if ring != 0 {
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

/// The states of a slot whose event just got its ring (or none yet): not polled by the drain thread, no watch
/// tick counted, quiet as soon as it is due ([`go_quiet_if_due`]); signalling each sample as `signalling` says.
/// The fitting walks are the event's: counted from its opening (`open_into`), before its ring as after.
fn begin_ring_states(slot: &Slot, signalling: bool) {
    slot.adopted.store(false, Ordering::Relaxed);
    slot.descriptor_gone.store(false, Ordering::Relaxed);
    slot.timely_ticks.store(0, Ordering::Relaxed);
    slot.quiet_after_ticks.store(0, Ordering::Relaxed);
    slot.signalling.store(signalling, Ordering::Relaxed);
}

/// Opens an event with a ring as planned ([`plan_rings`]), or, when there is no plan or no ring can be mapped,
/// one that signals each sample: the event and its ring (0: none). A ring with stack copies is mapped now only
/// with `map_stack_ring_now` (the process's first thread, a forked child's: they live long); a started
/// thread's comes from the drain thread once its stacks were seen to fit or it has lived a while
/// ([`poll_set`]).
/// Async-signal-safe.
fn open_with_ring(
    period_ns: u64,
    map_stack_ring_now: bool,
) -> Result<(sys::TaskClock, usize), i32> {
    let data_bytes = RING_DATA_BYTES.load(Ordering::Relaxed);
    let stack_bytes = RING_STACK_BYTES.load(Ordering::Relaxed);
    let record = match stack_bytes {
        0 => sys::SampleRecord::Pc,
        // Without the drain thread (a forked child), nobody would walk the copies in time.
        _ if !rings_copy_stacks() => sys::SampleRecord::None,
        stack_bytes => sys::SampleRecord::PcAndStack { stack_bytes },
    };
    if data_bytes != 0 && record != sys::SampleRecord::None {
        // A ring of pcs never wakes anyone (its watermark is its size); one with stack copies wakes the drain
        // thread when half full.
        let wake_bytes = if stack_bytes == 0 {
            data_bytes
        } else {
            data_bytes / 2
        };
        let wake_bytes = u32::try_from(wake_bytes).unwrap_or(u32::MAX);
        let event = sys::open_task_clock(libc::SIGPROF, period_ns, record, wake_bytes)?;
        if stack_bytes != 0 && !map_stack_ring_now {
            // Its ring comes later, from the drain thread (`install_ring`); without one, each sample signals.
            return Ok((event, 0));
        }
        if let Some(ring) = sys::map_event_ring(event, data_bytes) {
            return Ok((event, ring as usize));
        }
        sys::close_task_clock(event);
    }
    let event = sys::open_task_clock(libc::SIGPROF, period_ns, sys::SampleRecord::None, 0)?;
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

/// `CLOCK_MONOTONIC` now, in ns. Async-signal-safe.
fn monotonic_ns() -> u64 {
    sys::clock_ns(sys::CLOCK_MONOTONIC).max(0) as u64
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
    /// A sample of a slot whose ring with stack copies the drain thread has yet to map: count the interrupted PC,
    /// and note whether a copy would have held the live stack ([`note_live_walk`]): a thread whose stacks fit
    /// gets its ring without waiting for [`STACK_RING_DELAY_NS`] ([`poll_set`]).
    BeforeRing(usize),
    /// Ours, but no sample: a watch tick, or a signal a closed event had queued.
    Quiet,
    /// A sample of a slot whose event signals each sample (its ring came late, its stack copies fell short, or
    /// the drain thread does not poll it yet): drain that ring ([`drain`]), walking the live stack for this
    /// sample.
    Drain(usize),
    /// The watch tick of a slot whose event has a ring: [`on_watch_tick`], then drain every quiet ring
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
                if slot.ring_wanted.load(Ordering::Relaxed) {
                    return Tick::BeforeRing(index);
                }
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
/// sampling timer (then its ticks are samples, and `on_fallback` is called once, told why). Async-signal-safe.
pub fn on_timer_signal(value: usize, period_ns: u64, on_fallback: fn(NoEvent)) -> Tick {
    let Some(index) = slot_of_value(value) else {
        return Tick::NotOurs;
    };
    let slot = &SLOT_TABLE[index];
    if slot.ring.load(Ordering::Relaxed) != 0 {
        // The ring's mapping holds the event even if the program closed its descriptor.
        return Tick::Watch(index);
    }
    let Some(event) = event_of(slot) else {
        // The timer samples: a forked child's first sample (its event opens now), or where no event could be had.
        open_deferred(index, period_ns, on_fallback);
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
    if let Err(error) = open_into(index, periods) {
        let why = no_event(error);
        let timer = slot.watch_timer.load(Ordering::Relaxed);
        if timer != 0 {
            let _ = sys::set_timer_period(sys::CpuTimer::from_id(timer - 1), period_ns, period_ns);
            on_fallback(why);
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
pub fn release(index: usize, visit: &mut dyn FnMut(RingRecord<'_>) -> bool) {
    let Some(slot) = SLOT_TABLE.get(index) else {
        return;
    };
    let mask = sys::block_signals();
    let timer = slot.watch_timer.swap(0, Ordering::Relaxed);
    if timer != 0 {
        sys::delete_timer(sys::CpuTimer::from_id(timer - 1));
    }
    // Another thread may be draining this ring (the drain thread, a dump): wait for it, then drain what is
    // left. Should it never let go (a debugger stopped it), the slot and its ring stay as they are.
    if !hold(slot, true) {
        sys::restore_signals(&mask);
        return;
    }
    let ring = slot.ring.swap(0, Ordering::AcqRel);
    if ring != 0 {
        read_ring(ring, visit);
    }
    slot.signalling.store(false, Ordering::Relaxed);
    slot.adopted.store(false, Ordering::Relaxed);
    slot.ring_wanted.store(false, Ordering::Relaxed);
    slot.deferred.store(false, Ordering::Relaxed);
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
        slot.adopted.store(false, Ordering::Relaxed);
        slot.ring_wanted.store(false, Ordering::Relaxed);
        slot.deferred.store(false, Ordering::Relaxed);
        slot.fd.store(-1, Ordering::Relaxed);
        slot.watch_timer.store(0, Ordering::Relaxed);
        slot.tid.store(0, Ordering::Release);
    }
}

/// One record of a ring, as [`drain`] gives it to its visitor, which returns whether the record's stack needed
/// more than its copy.
pub enum RingRecord<'a> {
    /// A sample: the interrupted user pc and, when the records copy stacks, its registers and stack.
    Sample {
        pc: usize,
        stack: Option<CopiedStack<'a>>,
    },
    /// The kernel lost this many records (the ring was full).
    Lost(u64),
}

/// The registers and the copy of the stack of one sample, read in place in its ring.
pub struct CopiedStack<'a> {
    /// The user stack pointer and frame pointer (rsp, rbp) at the sample.
    pub sp: usize,
    pub fp: usize,
    ring: Ring<'a>,
    /// Where the copy of the stack from `sp` up starts in the ring (a position, taken modulo its size).
    start: u64,
    len: usize,
    /// The kernel filled the whole copy: the stack may go on above it.
    cut: bool,
}

impl CopiedStack<'_> {
    /// Whether the stack went on above the copy (the kernel filled all of it).
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// Copies the stack bytes from `address` on into `buffer`: the bytes copied (0 when `address` is outside
    /// the copy).
    pub fn copy(&self, address: usize, buffer: &mut [u8]) -> usize {
        let Some(offset) = address.checked_sub(self.sp).filter(|&o| o < self.len) else {
            return 0;
        };
        let len = buffer.len().min(self.len - offset);
        if let Some(buffer) = buffer.get_mut(..len) {
            self.ring.copy(self.start + offset as u64, buffer);
        }
        len
    }
}

/// The data of a mapped ring, held by the caller while `'a` lasts.
#[derive(Clone, Copy)]
struct Ring<'a> {
    data: *const u8,
    size: usize,
    _held: std::marker::PhantomData<&'a u8>,
}

impl Ring<'_> {
    /// The word at position `at` (modulo the size; records are 8-byte aligned, so a word never wraps).
    fn word(&self, at: u64) -> u64 {
        let offset = (at % self.size as u64) as usize & !7;
        // SAFETY: `offset + 8 <= size` (size is a multiple of 8): inside the ring's data, mapped while the
        // caller holds the ring; the kernel does not write the records between tail and head, the only ones
        // read.
        unsafe { self.data.add(offset).cast::<u64>().read_volatile() }
    }

    /// Copies `buffer.len()` bytes from position `at` (modulo the size, wrapping around its end).
    fn copy(&self, at: u64, buffer: &mut [u8]) {
        let mut done = 0;
        while done < buffer.len() {
            let offset = ((at + done as u64) % self.size as u64) as usize;
            let len = (buffer.len() - done).min(self.size - offset);
            // SAFETY: `offset + len <= size`: inside the ring's data, mapped while the caller holds the ring;
            // the kernel does not write the records between tail and head, the only ones read; `buffer` has
            // room for `len` bytes from `done`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.data.add(offset),
                    buffer.as_mut_ptr().add(done),
                    len,
                )
            };
            done += len;
        }
    }
}

/// Gives every record of the slot's ring to `visit` and frees their room, unless someone else is draining it
/// (then returns at once). Async-signal-safe: atomics and reads of the ring only.
pub fn drain(index: usize, visit: &mut dyn FnMut(RingRecord<'_>) -> bool) {
    drain_if_holding(index, visit, 0, false);
}

/// Takes the slot's ring for the caller (its `draining` flag): at once, or, with `wait` (not in a signal
/// handler), once whoever holds it lets go, waiting up to [`DRAIN_WAIT_YIELDS`]. False when it stays held.
fn hold(slot: &Slot, wait: bool) -> bool {
    let mut yields = 0;
    while slot.draining.swap(true, Ordering::Acquire) {
        if !wait || yields == DRAIN_WAIT_YIELDS {
            return false;
        }
        std::thread::yield_now();
        yields += 1;
    }
    true
}

/// [`drain`], but only when the ring holds at least `least_bytes` of records (else it is left as it is), and,
/// with `wait`, after waiting for whoever else is draining it ([`hold`]).
fn drain_if_holding(
    index: usize,
    visit: &mut dyn FnMut(RingRecord<'_>) -> bool,
    least_bytes: u64,
    wait: bool,
) {
    let Some(slot) = SLOT_TABLE.get(index) else {
        return;
    };
    if !hold(slot, wait) {
        return;
    }
    let ring = slot.ring.load(Ordering::Acquire);
    // SAFETY: a mapped ring, held (its `draining` flag).
    let holding = |ring: usize| unsafe {
        sys::ring_head(ring as *const u8).wrapping_sub(sys::ring_tail(ring as *const u8))
    };
    if ring != 0 && holding(ring) >= least_bytes {
        let (records, lost, wants_live) = read_ring(ring, visit);
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
        // A ring of pcs is drained by ticks of CPU time and should stay below half full; one with stacks is
        // drained by its own fill level, at half.
        let ring_records = RING_RECORDS.load(Ordering::Relaxed);
        let too_full = if RING_STACK_BYTES.load(Ordering::Relaxed) == 0 {
            ring_records / 2
        } else {
            ring_records - ring_records / 8
        };
        // A signalling event's samples are walked live: a live walk that outgrew a copy since the ring was mapped
        // gives the ring back. A walk of a copy that ran off its end makes the event signal, so that the next
        // samples are walked live; a thread that blocks SIGPROF keeps its ring.
        let walked_deep = slot.signalling.load(Ordering::Relaxed)
            && slot.last_walk_outgrew.load(Ordering::Relaxed);
        if walked_deep
            && let Some(event) = event_of(slot).filter(|&event| sys::task_clock_is_open(event))
        {
            give_back_ring(slot, event, ring);
        } else if wants_live || walked_deep {
            // (Walked deep: the mapping holds an event whose descriptor the program closed; it stays.)
            start_signalling(slot, LIVE_STACK_TICKS);
        } else if lost || records > too_full {
            start_signalling(slot, TIMELY_TICKS_TO_GO_QUIET);
        }
    }
    slot.draining.store(false, Ordering::Release);
}

/// A live walk of a sample of the slot's signalling event needed more stack than a copy holds: the ring is
/// unmapped, so that the kernel stops copying stacks no walk can use, and the event signals each sample, walked
/// live, as before its first ring, until [`map_ring_once_stacks_fit`] says. The caller holds the ring and has
/// just read it: a sample the kernel writes before the unmapping is lost. Async-signal-safe.
fn give_back_ring(slot: &Slot, event: sys::TaskClock, ring: usize) {
    slot.ring.store(0, Ordering::Release);
    map_ring_once_stacks_fit(slot);
    unmap_ring(ring);
    // The caller saw the event signalling, but the thread's own handler may have made it quiet since
    // (`go_quiet_if_due`): without a ring, it must signal again.
    if !slot.signalling.swap(false, Ordering::Relaxed) {
        sys::start_task_clock_signals(event);
    }
}

/// The slot's thread has stacks deeper than a copy: the drain thread maps its ring once the thread has had
/// [`LIVE_STACK_TICKS`] watch periods of samples, walked live, and the last [`FITTING_WALKS_TO_GO_QUIET`] of
/// them fit in a copy, or once none of its samples has been walked for [`UNWALKED_RING_DELAY_NS`]
/// ([`poll_set`]). A thread that is deep from time to time is then walked live throughout, not copied and cut
/// short at each deep spell.
fn map_ring_once_stacks_fit(slot: &Slot) {
    slot.fitting_walks.store(0, Ordering::Relaxed);
    slot.last_walk_ns.store(monotonic_ns(), Ordering::Relaxed);
    let walks =
        LIVE_STACK_TICKS as u64 * WATCH_PERIOD_NS / PERIOD_NS.load(Ordering::Relaxed).max(1);
    slot.walks_before_ring
        .store(u32::try_from(walks).unwrap_or(u32::MAX), Ordering::Relaxed);
    slot.ring_once_fitting.store(true, Ordering::Relaxed);
    slot.ring_wanted.store(true, Ordering::Relaxed);
}

/// The event of the slot signals each sample from now on, if it did not (its descriptor still open), until
/// `quiet_after_ticks` watch ticks in a row come on time ([`on_watch_tick`]).
fn start_signalling(slot: &Slot, quiet_after_ticks: u32) {
    slot.timely_ticks.store(0, Ordering::Relaxed);
    slot.fitting_walks.store(0, Ordering::Relaxed);
    // A reason to signal for longer, found earlier, stands.
    if slot.signalling.load(Ordering::Relaxed) {
        slot.quiet_after_ticks
            .fetch_max(quiet_after_ticks, Ordering::Relaxed);
    } else {
        slot.quiet_after_ticks
            .store(quiet_after_ticks, Ordering::Relaxed);
    }
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
/// at once); [`TIMELY_TICKS_TO_GO_QUIET`] ticks in a row on time make it quiet again ([`LIVE_STACK_TICKS`] when
/// a walk needed the live stack). Async-signal-safe.
pub fn on_watch_tick(index: usize) {
    let Some(slot) = SLOT_TABLE.get(index) else {
        return;
    };
    let now = sys::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).max(0) as u64;
    let gap = now.saturating_sub(slot.last_watch_ns.swap(now, Ordering::Relaxed));
    // Rings with stacks wake the drain thread: a late tick says nothing of them.
    if gap > RING_SPAN_NS / 2 && !rings_copy_stacks() {
        start_signalling(slot, TIMELY_TICKS_TO_GO_QUIET);
        return;
    }
    slot.timely_ticks.fetch_add(1, Ordering::Relaxed);
    go_quiet_if_due(slot);
}

/// The handler of a signalling event has walked the live stack of its sample: whether a copy would have held it
/// (`fits`). For an event whose records copy stacks, [`FITTING_WALKS_TO_GO_QUIET`] such walks in a row (with
/// the drain thread polling its ring) let it stop signalling. Async-signal-safe.
pub fn note_live_walk(index: usize, fits: bool) {
    let Some(slot) = SLOT_TABLE.get(index) else {
        return;
    };
    slot.last_walk_outgrew.store(!fits, Ordering::Relaxed);
    // Only a ring withheld for the thread's depth waits on its live walks (`poll_set`).
    if slot.ring_once_fitting.load(Ordering::Relaxed) {
        let to_go = slot.walks_before_ring.load(Ordering::Relaxed);
        if to_go > 0 {
            slot.walks_before_ring.store(to_go - 1, Ordering::Relaxed);
        }
        slot.last_walk_ns.store(monotonic_ns(), Ordering::Relaxed);
    }
    if !fits {
        slot.fitting_walks.store(0, Ordering::Relaxed);
        return;
    }
    slot.fitting_walks.fetch_add(1, Ordering::Relaxed);
    go_quiet_if_due(slot);
}

/// Stops the slot's event signalling each sample when it may: the watch ticks [`start_signalling`] asked for
/// came on time in a row, and, when records copy stacks, the drain thread polls the ring and the last live
/// walks would have fit in a copy.
fn go_quiet_if_due(slot: &Slot) {
    let due = slot.timely_ticks.load(Ordering::Relaxed)
        >= slot.quiet_after_ticks.load(Ordering::Relaxed)
        && (!rings_copy_stacks()
            || (slot.adopted.load(Ordering::Relaxed)
                && slot.fitting_walks.load(Ordering::Relaxed) >= FITTING_WALKS_TO_GO_QUIET));
    if due
        && slot.signalling.swap(false, Ordering::Relaxed)
        && let Some(event) = event_of(slot)
        && sys::task_clock_is_open(event)
    {
        sys::stop_task_clock_signals(event);
    }
}

/// Which rings [`drain_all`] drains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rings {
    /// Every ring, waiting a while (up to [`DRAIN_WAIT_YIELDS`]) for one someone else is draining: afterwards no
    /// ring holds a sample taken before the call. Not in a signal handler.
    Every,
    /// The rings whose events do not signal each sample, and those of signalling events that hold more than
    /// a quarter of a ring (their thread blocks SIGPROF), unless someone else is draining them. A signalling event's
    /// samples are otherwise counted by its own signals, whose handler walks the live stack.
    Quiet,
}

/// For the drain thread: maps the ring of a slot whose event wants one ([`Slot::ring_wanted`]), while holding
/// it (the owning thread may be exiting: `release`). The event signals each sample until its stacks fit
/// ([`go_quiet_if_due`]). Where the ring cannot be mapped (the locked-memory budget), the event goes on
/// signalling. A thread due for its age whose last live walk outgrew a copy gets none yet
/// ([`map_ring_once_stacks_fit`]).
fn install_ring(slot: &Slot) {
    if !hold(slot, false) {
        return;
    }
    if slot.last_walk_outgrew.load(Ordering::Relaxed)
        && !slot.ring_once_fitting.load(Ordering::Relaxed)
    {
        // Due for its age, but its stacks were just seen deeper than a copy.
        map_ring_once_stacks_fit(slot);
    } else if slot.ring_wanted.swap(false, Ordering::Relaxed)
        && slot.ring.load(Ordering::Relaxed) == 0
        && let Some(event) = event_of(slot).filter(|&event| sys::task_clock_is_open(event))
        && let Some(ring) = sys::map_event_ring(event, RING_DATA_BYTES.load(Ordering::Relaxed))
    {
        // The live walks of its samples so far (`fitting_walks`, kept) count towards going quiet: they were
        // walks of this thread's stacks as much as the ones to come.
        begin_ring_states(slot, true);
        slot.last_walk_outgrew.store(false, Ordering::Relaxed);
        slot.ring_once_fitting.store(false, Ordering::Relaxed);
        slot.last_watch_ns.store(0, Ordering::Relaxed);
        slot.ring.store(ring as usize, Ordering::Release);
    }
    slot.draining.store(false, Ordering::Release);
}

/// [`drain`] for every slot with a ring, as `rings` says.
pub fn drain_all(visit: &mut dyn FnMut(RingRecord<'_>) -> bool, rings: Rings) {
    let used = SLOTS_USED.load(Ordering::Relaxed);
    for (index, slot) in SLOT_TABLE.iter().enumerate().take(used) {
        if slot.ring.load(Ordering::Relaxed) == 0 {
            continue;
        }
        // A signalling event's ring that fills anyway is not drained by its signals (its thread blocks SIGPROF).
        // Past a quarter: the drain thread, which does not poll it, comes back within half a ring's span
        // (`poll_set`), before it can be full.
        let least_bytes = if rings == Rings::Quiet && slot.signalling.load(Ordering::Relaxed) {
            RING_DATA_BYTES.load(Ordering::Relaxed) as u64 / 4
        } else {
            0
        };
        drain_if_holding(index, visit, least_bytes, rings == Rings::Every);
    }
}

/// Rounds of the drain thread between two checks that a polled descriptor is still its event's (an `ioctl`
/// each; a ring is also checked when it is first polled): a descriptor the program closed polls at once
/// (invalid, or a file of the program's that is readable) for at most so many rounds, and then its ring is
/// drained on the timeout only.
const DESCRIPTOR_CHECK_ROUNDS: u32 = 8;
/// The drain thread's rounds so far ([`poll_set`]).
static POLL_ROUNDS: AtomicU32 = AtomicU32::new(0);

/// How long [`drain_all`] waits for a ring another thread drains: a drain thread stopped by a debugger must not
/// stop the program's `dlclose` or exit.
const DRAIN_WAIT_YIELDS: u32 = 10_000;

/// For the drain thread: maps the rings that are due ([`Slot::ring_wanted`]), and puts the descriptors of the
/// rings it is to poll into `set` (emptied first). A ring it sees is adopted: its event may stop signalling each
/// sample ([`go_quiet_if_due`]). A ring whose descriptor the program closed is left out once found so (every
/// [`DESCRIPTOR_CHECK_ROUNDS`]; the drain thread's timeout drains it).
///
/// So is the ring of an event that signals each sample: the kernel wakes every poller of an event at each
/// signal it sends, and the poll, finding the ring below its mark, sleeps again (a wake-up per sample, about
/// 25 µs each here). Each signal's handler drains that ring; one that fills anyway (its thread blocks SIGPROF)
/// is drained on the timeout once past a quarter ([`drain_all`]), so the timeout must come before another
/// three quarters fill: the longest sleep, returned, is half the CPU time a ring holds (`None`: no limit).
pub fn poll_set(set: &mut Vec<libc::pollfd>) -> Option<u64> {
    set.clear();
    let mut longest_sleep_ns = None;
    let check = POLL_ROUNDS
        .fetch_add(1, Ordering::Relaxed)
        .is_multiple_of(DESCRIPTOR_CHECK_ROUNDS);
    let used = SLOTS_USED.load(Ordering::Relaxed);
    let now = monotonic_ns();
    for slot in SLOT_TABLE.iter().take(used) {
        if slot.ring_wanted.load(Ordering::Relaxed) {
            let fitting = slot.fitting_walks.load(Ordering::Relaxed) >= FITTING_WALKS_TO_GO_QUIET;
            let due = if slot.ring_once_fitting.load(Ordering::Relaxed) {
                (fitting && slot.walks_before_ring.load(Ordering::Relaxed) == 0)
                    || now.saturating_sub(slot.last_walk_ns.load(Ordering::Relaxed))
                        >= UNWALKED_RING_DELAY_NS
            } else {
                fitting
                    || now.saturating_sub(slot.opened_ns.load(Ordering::Relaxed))
                        >= STACK_RING_DELAY_NS
            };
            if due {
                install_ring(slot);
            }
        }
        if slot.ring.load(Ordering::Acquire) == 0 || slot.descriptor_gone.load(Ordering::Relaxed) {
            continue;
        }
        let Some(event) = event_of(slot) else {
            continue;
        };
        if (check || !slot.adopted.load(Ordering::Relaxed)) && !sys::task_clock_is_open(event) {
            slot.descriptor_gone.store(true, Ordering::Relaxed);
            continue;
        }
        slot.adopted.store(true, Ordering::Relaxed);
        if slot.signalling.load(Ordering::Relaxed) {
            let span_ns =
                RING_RECORDS.load(Ordering::Relaxed) as u64 * PERIOD_NS.load(Ordering::Relaxed);
            longest_sleep_ns = Some(span_ns / 2);
            continue;
        }
        set.push(libc::pollfd {
            fd: event.fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }
    longest_sleep_ns
}

/// Reads the records between the ring's tail and head, then moves the tail to the head: the records read,
/// whether the kernel lost some, and whether `visit` said of a record that its walk needed the live stack. The
/// caller holds the ring.
fn read_ring(base: usize, visit: &mut dyn FnMut(RingRecord<'_>) -> bool) -> (usize, bool, bool) {
    let base = base as *const u8;
    let ring = Ring {
        // SAFETY: the data follows the header page in the ring's mapping.
        data: unsafe { base.add(sys::page_size()) },
        size: RING_DATA_BYTES.load(Ordering::Relaxed),
        _held: std::marker::PhantomData,
    };
    let with_stack = RING_STACK_BYTES.load(Ordering::Relaxed) != 0;
    // SAFETY: `base` is a mapped ring, held by the caller.
    let head = unsafe { sys::ring_head(base) };
    // SAFETY: as above.
    let mut tail = unsafe { sys::ring_tail(base) };
    let (mut records, mut lost, mut wants_live) = (0, false, false);
    while tail < head {
        records += 1;
        let header = ring.word(tail);
        let kind = header as u32;
        let size = header >> 48;
        if size < 8 || tail + size > head {
            break;
        }
        match kind {
            RECORD_SAMPLE => {
                let pc = ring.word(tail + 8) as usize;
                let stack = if with_stack {
                    sample_stack(ring, tail + 16, tail + size)
                } else {
                    None
                };
                wants_live |= visit(RingRecord::Sample { pc, stack });
            }
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
    (records, lost, wants_live)
}

/// The registers and stack copy of a sample record whose `PERF_SAMPLE_REGS_USER` part is at `at` and which
/// ends at `end`; `None` when the sample has no user registers (or the record is malformed).
fn sample_stack(ring: Ring<'_>, at: u64, end: u64) -> Option<CopiedStack<'_>> {
    // The registers' ABI (0: none, and then no registers), rbp, rsp, rip; the copy's size, the copy, the bytes
    // of it the kernel could fill.
    if ring.word(at) == 0 {
        return None;
    }
    let fp = ring.word(at + 8) as usize;
    let sp = ring.word(at + 16) as usize;
    let size = ring.word(at + 32);
    let start = at + 40;
    if size == 0 || start.checked_add(size)?.checked_add(8)? > end {
        return None;
    }
    let filled = ring.word(start + size).min(size);
    Some(CopiedStack {
        sp,
        fp,
        ring,
        start,
        len: filled as usize,
        cut: filled == size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring in plain memory: its header page, then `DATA` bytes of records, written as the kernel does.
    const DATA: usize = 4096;

    fn write(ring: &mut [u8], at: u64, bytes: &[u8]) {
        let page = sys::page_size();
        for (i, byte) in bytes.iter().enumerate() {
            ring[page + (at as usize + i) % DATA] = *byte;
        }
    }

    fn word(value: u64) -> [u8; 8] {
        value.to_ne_bytes()
    }

    #[test]
    fn records_with_stack_copies_are_read_across_the_end_of_the_ring() {
        let stack_bytes = 256u64;
        plan_rings(RingPlan {
            data_bytes: DATA,
            stack_bytes: stack_bytes as u32,
            period_ns: 1_000_000,
        });
        let page = sys::page_size();
        let mut memory = vec![0u64; (page + DATA) / 8];
        // SAFETY: the Vec's bytes, viewed as bytes while `memory` is not otherwise used.
        let ring = unsafe {
            std::slice::from_raw_parts_mut(memory.as_mut_ptr().cast::<u8>(), memory.len() * 8)
        };
        // A sample whose stack copy wraps around the end of the data: header, ip, ABI, rbp, rsp, rip, size,
        // the copy (byte i of the stack is i), the bytes filled (all: the stack goes on above).
        let tail = 3 * DATA as u64 - 80;
        let size = 64 + stack_bytes;
        let (pc, fp, sp) = (0x40_1000u64, 0x7ff0_0100u64, 0x7ff0_0000u64);
        let mut at = tail;
        for value in [
            u64::from(RECORD_SAMPLE) | (size << 48),
            pc,
            2,
            fp,
            sp,
            pc,
            stack_bytes,
        ] {
            write(ring, at, &word(value));
            at += 8;
        }
        let stack: Vec<u8> = (0..stack_bytes as usize).map(|i| i as u8).collect();
        write(ring, at, &stack);
        at += stack_bytes;
        write(ring, at, &word(stack_bytes));
        at += 8;
        // Then a sample whose copy the kernel filled in part (the stack ends there), and a lost record.
        let second = at;
        for value in [
            u64::from(RECORD_SAMPLE) | (size << 48),
            pc + 4,
            2,
            fp,
            sp,
            pc + 4,
            stack_bytes,
        ] {
            write(ring, at, &word(value));
            at += 8;
        }
        at += stack_bytes;
        write(ring, at, &word(24));
        at += 8;
        assert_eq!(at, second + size);
        write(ring, at, &word(u64::from(RECORD_LOST) | (24 << 48)));
        write(ring, at + 8, &word(7));
        write(ring, at + 16, &word(3));
        at += 24;
        let base = ring.as_mut_ptr();
        // SAFETY: the header page of our plain-memory ring.
        unsafe {
            (*base.add(1024).cast::<AtomicU64>()).store(at, Ordering::Relaxed);
            sys::set_ring_tail(base, tail);
        }

        let mut seen = Vec::new();
        let (records, lost, wants_live) = read_ring(base as usize, &mut |record| {
            match record {
                RingRecord::Sample { pc, stack } => {
                    let stack = stack.expect("a stack copy");
                    let mut bytes = [0u8; 16];
                    let copied = stack.copy(stack.sp + 70, &mut bytes);
                    let outside = stack.copy(stack.sp + 300, &mut bytes[..1]);
                    seen.push(format!(
                        "sample {pc:#x} sp {:#x} fp {:#x} cut {} copied {copied} first {} outside {outside}",
                        stack.sp,
                        stack.fp,
                        stack.is_cut(),
                        bytes[0]
                    ));
                }
                RingRecord::Lost(count) => seen.push(format!("lost {count}")),
            }
            true
        });
        assert_eq!(
            seen,
            [
                "sample 0x401000 sp 0x7ff00000 fp 0x7ff00100 cut true copied 16 first 70 outside 0",
                "sample 0x401004 sp 0x7ff00000 fp 0x7ff00100 cut false copied 0 first 0 outside 0",
                "lost 3",
            ]
        );
        assert_eq!((records, lost, wants_live), (3, true, true));
        // SAFETY: as above.
        assert_eq!(unsafe { sys::ring_tail(base) }, at);
    }
}
