//! PC sampling on CPU time: one task-clock perf event (or CPU-time timer) per thread, a SIGPROF handler that
//! counts the interrupted PC.
//!
//! Every thread gets its own source of SIGPROF, signalling that very thread, so each thread is sampled in
//! proportion to its own CPU time (a process-wide ITIMER_PROF picks whichever thread happens to run):
//! - where the kernel allows it, a `PERF_COUNT_SW_TASK_CLOCK` perf event (`task_clock`), which signals each
//!   period of the thread's CPU time in user mode, at the rate asked for;
//! - else a `timer_create(CLOCK_THREAD_CPUTIME_ID)` timer (`SIGEV_THREAD_ID`), which the kernel checks only on
//!   its tick (250 Hz here): the rate cannot exceed the tick's.
//!
//! The main thread's source is started at start-up; threads created later get theirs from our
//! `pthread_create`, which wraps the start routine. A pthread key destructor releases a thread's source when
//! the thread ends.
//!
//! The handler is async-signal-safe: atomics only, no allocation, no lock, errno saved and restored. Our
//! timers' signals carry a cookie (or a task-clock slot's address) in `si_value`, our events' their descriptor
//! in `si_fd`; any other SIGPROF (the program's own ITIMER_PROF, `kill`) is passed to the program's disposition
//! (see `program_sigprof`).
//!
//! A CPU-time timer's signal can come late (`si_overrun` counts the periods it stands for) and, on a busy
//! machine, a thread can run for tens or hundreds of milliseconds between two checks (measured: 280 ms of a
//! 600 ms run with no signal, with two other CPU-bound processes on 2 cores); a task clock does not count the
//! thread's time in the kernel. Periods that never produce a signal are invisible to overrun counts. So the
//! true sample period recorded in the profile is measured directly: the process's CPU time while sampling was
//! on, divided by the samples.

use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use mslprof_format::RuntimeAddress;

use crate::modules;
use crate::program_sigprof;
use crate::sys;
use crate::task_clock::{self, NoEvent, RingPlan, RingRecord, Rings, Tick};

/// Marks our timers' signals: its address is the `si_value` of every sampling SIGPROF.
static COOKIE: u8 = 0;

/// Samples in unknown code taken while a `dlopen` is in progress, waiting for the rescan (0 = empty slot).
const PARKED_SLOTS: usize = 1024;

/// The sampler's state: whether and how it samples, its CPU-time accounting and its counters. Atomics only
/// (the SIGPROF handler reads and writes it).
pub struct Sampler {
    started: AtomicBool,
    sampling: AtomicBool,
    handlers_running: AtomicUsize,
    period_ns: AtomicU64,
    /// The pthread key whose destructor releases a thread's event or timer (`usize::MAX`: none yet).
    thread_key: AtomicUsize,
    /// The sources threads got ([`sources`]).
    sources: AtomicU32,
    timer_failures: AtomicU64,
    /// Process CPU time (ns), all and user ([`ALL_CPU`], [`USER_CPU`]), when the current stretch of sampling
    /// began (valid while `sampling` is set).
    stretch_start_cpu_ns: [AtomicU64; 2],
    /// Process CPU time (ns), all and user, of the stretches of sampling that have ended (pauses, dumps before
    /// exec).
    ended_stretches_cpu_ns: [AtomicU64; 2],
    /// The process the two CPU times above belong to: a forked child's CPU clock starts again from zero.
    cpu_time_pid: AtomicU64,
    total_samples: AtomicU64,
    unknown_samples: AtomicU64,
    overruns: AtomicU64,
    /// libc's `pthread_create` (0: not looked up yet).
    real_pthread_create: AtomicUsize,
    parked: [AtomicUsize; PARKED_SLOTS],
    parked_next: AtomicUsize,
}

/// The one sampler of this process.
pub static SAMPLER: Sampler = Sampler {
    started: AtomicBool::new(false),
    sampling: AtomicBool::new(false),
    handlers_running: AtomicUsize::new(0),
    period_ns: AtomicU64::new(0),
    thread_key: AtomicUsize::new(usize::MAX),
    sources: AtomicU32::new(0),
    timer_failures: AtomicU64::new(0),
    stretch_start_cpu_ns: [const { AtomicU64::new(0) }; 2],
    ended_stretches_cpu_ns: [const { AtomicU64::new(0) }; 2],
    cpu_time_pid: AtomicU64::new(0),
    total_samples: AtomicU64::new(0),
    unknown_samples: AtomicU64::new(0),
    overruns: AtomicU64::new(0),
    real_pthread_create: AtomicUsize::new(0),
    parked: [const { AtomicUsize::new(0) }; PARKED_SLOTS],
    parked_next: AtomicUsize::new(0),
};

impl Sampler {
    /// Samples counted since start-up (or fork).
    pub fn total_samples(&self) -> u64 {
        self.total_samples.load(Ordering::Relaxed)
    }

    /// Samples in no known module.
    pub fn unknown_samples(&self) -> u64 {
        self.unknown_samples.load(Ordering::Relaxed)
    }

    /// In a forked child, before its first sample (`fork_reset`): the child's profile covers only the
    /// child, so the parent's counts and parked samples go. Stores only what is not zero already (a store
    /// copies the page).
    pub fn reset_counts_after_fork(&self) {
        for counter in [&self.total_samples, &self.unknown_samples, &self.overruns] {
            if counter.load(Ordering::Relaxed) != 0 {
                counter.store(0, Ordering::Relaxed);
            }
        }
        follow_fork();
        let child_source = CHILD_SOURCE.load(Ordering::Relaxed);
        if self.sources.load(Ordering::Relaxed) != child_source {
            self.sources.store(child_source, Ordering::Relaxed);
        }
        for slot in &self.parked {
            if slot.load(Ordering::Relaxed) != 0 {
                slot.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[inline]
fn cookie() -> usize {
    &COOKIE as *const u8 as usize
}

/// Marks the signals of the timer that asks `mcount::hot` to look for hot functions.
static LOOK_COOKIE: u8 = 0;

fn look_cookie() -> usize {
    &LOOK_COOKIE as *const u8 as usize
}

/// Process CPU time between two looks for hot functions (`mcount::hot`).
const LOOK_PERIOD_NS: u64 = 10_000_000;

/// Starts the timer that makes the SIGPROF handler look for hot functions whose sites to rewrite
/// (`mcount::hot`): every [`LOOK_PERIOD_NS`] of the process's CPU time, on whichever thread runs. One timer
/// for the process, where the sampling timers are per thread: with many threads sharing few cores, a
/// thread's own first tick comes late (16 threads on 2 cores: after about 80 ms), and the calls made until
/// the first look all pay `mcount`. False when the timer cannot be made (no look then).
pub fn start_look_timer() -> bool {
    is_started()
        && sys::start_cpu_timer(
            sys::CpuClock::Process,
            libc::SIGPROF,
            look_cookie(),
            LOOK_PERIOD_NS,
            LOOK_PERIOD_NS,
        )
        .is_ok()
}

/// Requested period for `hz` samples per second.
pub fn period_for(hz: u32) -> u64 {
    1_000_000_000 / u64::from(hz.max(1))
}

/// Installs the handler and starts the calling thread's timer. Later threads start theirs in
/// [`thread_started`]. Returns false (and leaves the process untouched) when the handler cannot be installed.
pub fn start(hz: u32) -> bool {
    SAMPLER.period_ns.store(period_for(hz), Ordering::Relaxed);
    if SAMPLER.thread_key.load(Ordering::Relaxed) == usize::MAX {
        match sys::create_thread_key(release_thread_source) {
            Some(key) => SAMPLER.thread_key.store(key as usize, Ordering::Relaxed),
            None => return false,
        }
    }
    if !program_sigprof::install_sampling_handler(on_sigprof) {
        return false;
    }
    task_clock::plan_rings(ring_plan(period_for(hz)));
    SAMPLER
        .cpu_time_pid
        .store(u64::from(sys::getpid()), Ordering::Relaxed);
    begin_stretch();
    for ended in &SAMPLER.ended_stretches_cpu_ns {
        ended.store(0, Ordering::Relaxed);
    }
    SAMPLER.started.store(true, Ordering::Release);
    SAMPLER.sampling.store(true, Ordering::Release);
    arm_current_thread(false);
    true
}

/// Bytes of stack a ring's record copies when samples have stacks: the walk reaches the frames whose return
/// addresses lie in it (deeper frames are cut, the stack flagged as truncated).
const RING_STACK_BYTES: u32 = 16 << 10;

/// Whether sampling at `hz` wants rings whose records copy the stack, for the drain thread to walk (the crate
/// root then starts it, before [`start`]): samples have stacks, and task clocks sample at that rate. Never in
/// `test-hooks` builds run with `MSLPROF_TEST_NO_RING=1`.
pub fn wants_stack_rings(hz: u32) -> bool {
    rings_allowed()
        && crate::stacks::enabled()
        && cfg!(target_arch = "x86_64")
        && period_for(hz) < TIMER_PERIODS_FROM_NS
}

/// False in `test-hooks` builds run with `MSLPROF_TEST_NO_RING=1`: every event signals each sample.
fn rings_allowed() -> bool {
    #[cfg(feature = "test-hooks")]
    if std::env::var_os("MSLPROF_TEST_NO_RING").is_some_and(|value| value == "1") {
        return false;
    }
    true
}

/// The rings task-clock events get at `period`: records of the pc when samples have no stacks; with stacks,
/// records with a copy of the stack when the drain thread runs, else none; none when not
/// [`rings_allowed`].
fn ring_plan(period: u64) -> RingPlan {
    if !rings_allowed() {
        return RingPlan::NONE;
    }
    if !crate::stacks::enabled() {
        return RingPlan::for_period(period);
    }
    if task_clock::drainer_runs() {
        return RingPlan::with_stacks(period, RING_STACK_BYTES);
    }
    RingPlan::NONE
}

/// The drain thread's CPU time (ns), all and user, as of its last round (`ring_drainer`).
static DRAINER_CPU_NS: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

/// Notes the drain thread's CPU time, all and user (ns): it takes no sample, so it is not in the CPU time the
/// samples stand for ([`sampled_cpu_ns`]).
pub fn note_drainer_cpu_ns(cpu_ns: [u64; 2]) {
    for (account, now) in DRAINER_CPU_NS.iter().zip(cpu_ns) {
        account.store(now, Ordering::Relaxed);
    }
}

/// Counts one record of a task-clock ring, and the stack it copied, unless sampling is paused: whether the
/// walk of the copy needed the live stack (`stacks::record_copied`). Async-signal-safe, as the handler.
fn count_ring_record(record: RingRecord<'_>) -> bool {
    if !SAMPLER.sampling.load(Ordering::SeqCst) {
        return false;
    }
    match record {
        RingRecord::Sample { pc, stack } => {
            record_pc(pc);
            #[cfg(target_arch = "x86_64")]
            if let Some(stack) = stack {
                return crate::stacks::record_copied(pc, &stack);
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = stack;
        }
        RingRecord::Lost(records) => {
            SAMPLER.overruns.fetch_add(records, Ordering::Relaxed);
        }
    }
    false
}

/// Notes for the slot's event whether a live walk that read `reach` bytes of stack would have fitted in a
/// ring's copy ([`task_clock::note_live_walk`]). Async-signal-safe.
#[cfg(target_arch = "x86_64")]
fn note_live_reach(slot: usize, reach: usize) {
    task_clock::note_live_walk(slot, reach <= RING_STACK_BYTES as usize);
}

/// Counts the records of a ring whose event signalled this sample ([`Tick::Drain`]): the record of the
/// interrupted pc (the sample this signal stands for, taken at this very instruction) is walked on the live
/// stack, the others on their copies.
///
/// # Safety
/// `context` is the ucontext the kernel passed to the SA_SIGINFO handler.
unsafe fn count_signalled_ring(slot: usize, context: *const c_void) {
    // SAFETY: as the caller guarantees.
    let interrupted = unsafe { sys::interrupted_pc(context) };
    let mut live_walked = false;
    task_clock::drain(slot, &mut |record| match record {
        RingRecord::Sample { pc, .. }
            if pc == interrupted && !live_walked && SAMPLER.sampling.load(Ordering::SeqCst) =>
        {
            live_walked = true;
            record_pc(pc);
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: as the caller guarantees.
                let reach = unsafe { crate::stacks::record_interrupted(context) };
                note_live_reach(slot, reach);
            }
            false
        }
        record => count_ring_record(record),
    });
}

/// Counts the samples every thread's ring holds now, waiting for a ring another thread is draining (before
/// the module table changes, so that they are attributed to the modules they were taken in, and before a
/// dump). Not in a signal handler.
pub fn drain_rings() {
    task_clock::drain_all(&mut count_ring_record, Rings::Every);
}

/// The drain thread's round ([`crate::ring_drainer`]): counts what the rings hold, as a handler would (known to
/// [`stop_and_quiesce`], sampling off after a fault).
pub fn drain_rings_now() {
    count_guarded(|| task_clock::drain_all(&mut count_ring_record, Rings::Quiet));
}

/// Starts a thread of the runtime's own on `routine`: through libc's `pthread_create` (not ours: it gets no
/// sampling source), detached, with every signal blocked (glibc keeps its own internal ones unblocked).
/// Whether it started.
pub fn start_runtime_thread(routine: sys::ThreadStartRoutine) -> bool {
    let real = real_pthread_create();
    if real == 0 {
        return false;
    }
    let mask = sys::block_signals();
    // SAFETY: pthread_t is plain data, written by pthread_create.
    let mut thread: libc::pthread_t = unsafe { std::mem::zeroed() };
    // SAFETY: `real` is libc's pthread_create; default attributes; `routine` takes a null argument.
    let started = unsafe {
        sys::call_pthread_create(
            real,
            &mut thread,
            std::ptr::null(),
            routine,
            std::ptr::null_mut(),
        )
    } == 0;
    sys::restore_signals(&mask);
    if started {
        sys::detach_thread(thread);
    }
    started
}

/// libc's `pthread_create` (0: not found).
fn real_pthread_create() -> usize {
    let mut real = SAMPLER.real_pthread_create.load(Ordering::Relaxed);
    if real == 0 {
        real = sys::next_symbol(c"pthread_create").unwrap_or(0);
        SAMPLER.real_pthread_create.store(real, Ordering::Relaxed);
    }
    real
}

/// Some thread whose samples are signals blocked SIGPROF (the header's `SIGPROF_BLOCKED`): it started with
/// SIGPROF blocked, or it blocked it when it ended the process ([`note_if_sigprof_blocked`]).
static SIGPROF_BLOCKED: AtomicBool = AtomicBool::new(false);

/// Whether some thread whose samples are signals was seen blocking SIGPROF.
pub fn sigprof_blocked() -> bool {
    SIGPROF_BLOCKED.load(Ordering::Relaxed)
}

/// Notes whether the calling thread, if its samples are signals (a CPU-time timer, or a task clock without
/// a ring), blocks SIGPROF now. For the thread that ends the process, before the runtime blocks anything, and
/// for each thread as it gets its source (a forked child's too, hence the fork section).
#[unsafe(link_section = "mslprof_fork_text")]
pub fn note_if_sigprof_blocked() {
    let key = SAMPLER.thread_key.load(Ordering::Relaxed);
    if key == usize::MAX || !is_started() {
        return;
    }
    let value = sys::thread_value(key as libc::pthread_key_t);
    let signalled = value & KEY_TIMER_TAG != 0 || (value != 0 && !task_clock::has_ring(value - 1));
    if signalled && sys::signal_blocked(libc::SIGPROF) {
        SIGPROF_BLOCKED.store(true, Ordering::Relaxed);
    }
}

/// Marks a thread key value that holds a CPU-time timer's id (else it is a task-clock slot's index + 1).
const KEY_TIMER_TAG: usize = 1 << (usize::BITS - 1);

/// [`sources`]: some thread was sampled by a CPU-time timer.
pub const SOURCE_CPU_TIMER: u32 = mslprof_format::sampling_sources::CPU_TIMER;
/// [`sources`]: some thread was sampled by a task-clock event.
pub const SOURCE_TASK_CLOCK: u32 = mslprof_format::sampling_sources::TASK_CLOCK;

/// Which sources sampled this process's threads since start-up (or fork): [`SOURCE_CPU_TIMER`],
/// [`SOURCE_TASK_CLOCK`], both, or neither before the first thread was armed.
pub fn sources() -> u32 {
    SAMPLER.sources.load(Ordering::Relaxed)
}

/// Adds `source` (bits, 0: none) to [`sources`], writing only when it adds something.
fn note_source(source: u32) {
    if source & !SAMPLER.sources.load(Ordering::Relaxed) != 0 {
        SAMPLER.sources.fetch_or(source, Ordering::Relaxed);
    }
}

/// The source a forked child's thread armed in the atfork handler ([`SOURCE_CPU_TIMER`], [`SOURCE_TASK_CLOCK`],
/// 0: none). It becomes the child's [`sources`] when the child first records ([`Sampler::reset_counts_after_fork`]),
/// so that the fork itself writes no page of [`SAMPLER`] (loader-hooks' fork.rs: every page written costs).
#[unsafe(link_section = "mslprof_fork_data")]
static CHILD_SOURCE: AtomicU32 = AtomicU32::new(0);

/// In a forked child's atfork handler: the task-clock events inherited are the parent's threads', and
/// timers are not inherited, so the child's one thread gets its own source. The CPU-time accounts follow the
/// fork when the child first records (`follow_fork`, from [`Sampler::reset_counts_after_fork`]).
#[unsafe(link_section = "mslprof_fork_text")]
pub fn arm_child_after_fork() {
    task_clock::forget_after_fork();
    // A handler or the drain thread counting in another thread of the parent at the fork goes on in the parent
    // only (written only when needed: a write copies the page).
    if SAMPLER.handlers_running.load(Ordering::Relaxed) != 0 {
        SAMPLER.handlers_running.store(0, Ordering::Relaxed);
    }
    CHILD_SOURCE.store(arm_thread(false, true), Ordering::Relaxed);
}

/// The shortest period CPU-time timers sample (200 Hz): the kernel's tick (250 Hz here) gives them in full,
/// and they cost less than a task-clock event at the same rate (BENCHMARKS.md, "Sampling rate and its cost":
/// +1.5 % at 100 Hz with task clocks) and charge system-call time to the functions that made the calls.
/// Shorter periods sample through task clocks.
const TIMER_PERIODS_FROM_NS: u64 = 5_000_000;

/// Starts the calling thread's task-clock event (above 200 Hz), or its CPU-time timer (up to 200 Hz, and where
/// the kernel refuses task clocks). `started_thread`: a thread the program started (not its first thread).
pub fn arm_current_thread(started_thread: bool) {
    if is_started() {
        follow_fork();
    }
    note_source(arm_thread(started_thread, false));
}

/// [`arm_current_thread`] but for the accounts: starts the thread's source and returns which it is (0: none, as
/// before [`start`]). A forked child's (`forked_child`) task-clock event waits for its first sample
/// ([`task_clock::defer_for_thread`]).
#[unsafe(link_section = "mslprof_fork_text")]
fn arm_thread(started_thread: bool, forked_child: bool) -> u32 {
    let period = SAMPLER.period_ns.load(Ordering::Relaxed);
    if period == 0 || !is_started() {
        return 0;
    }
    let first = first_expiry(period);
    let event = if period >= TIMER_PERIODS_FROM_NS {
        Err(NoEvent::Unavailable)
    } else if forked_child {
        task_clock::defer_for_thread()
    } else {
        task_clock::open_for_thread(task_clock::FirstPeriod {
            first_ns: first,
            period_ns: period,
            started_thread,
        })
    };
    let (source, key_value) = match event {
        Ok(slot) => {
            let watch = task_clock::WATCH_PERIOD_NS;
            // A forked child's timer takes its first sample, which opens the event.
            let (first_tick, ticks) = if forked_child {
                (first, period)
            } else {
                (watch, watch)
            };
            match sys::start_cpu_timer(
                sys::CpuClock::Thread,
                libc::SIGPROF,
                task_clock::slot_value(slot),
                first_tick,
                ticks,
            ) {
                Ok(timer) => task_clock::set_watch_timer(slot, timer),
                // Without its watch timer the event still samples; only a descriptor closed by the program
                // would go unnoticed.
                Err(_) => task_clock::open_deferred(slot, period, note_fallback),
            }
            (SOURCE_TASK_CLOCK, Some(slot + 1))
        }
        Err(no_event) => {
            if let NoEvent::RefusedNow(error) = no_event {
                report_refusal(error);
            }
            let timer = start_sampling_timer(first, period);
            (
                SOURCE_CPU_TIMER,
                timer.map(|timer| KEY_TIMER_TAG | timer.id()),
            )
        }
    };
    let key = SAMPLER.thread_key.load(Ordering::Relaxed);
    if let Some(value) = key_value
        && key != usize::MAX
    {
        sys::set_thread_value(key as libc::pthread_key_t, value);
    }
    if key_value.is_some() {
        note_if_sigprof_blocked();
    }
    source
}

/// The calling thread's CPU-time sampling timer; reported once when it cannot be made.
#[unsafe(link_section = "mslprof_fork_text")]
fn start_sampling_timer(first: u64, period: u64) -> Option<sys::CpuTimer> {
    sys::start_cpu_timer(
        sys::CpuClock::Thread,
        libc::SIGPROF,
        cookie(),
        first,
        period,
    )
    .inspect_err(|&error| report_timer_failure(error))
    .ok()
}

#[cold]
fn report_timer_failure(error: i32) {
    if SAMPLER.timer_failures.fetch_add(1, Ordering::Relaxed) == 0 {
        let text = error.to_string();
        sys::stderr_line(&[
            b"mslprof: cannot start a CPU-time timer (errno ",
            text.as_bytes(),
            b"); a thread is not sampled\n",
        ]);
    }
}

/// The lowest tick rate Linux is built with: asking for more than this from CPU-time timers may not be given.
const LOWEST_TICK_HZ: u64 = 100;

/// The first `perf_event_open` refusal: quiet at a rate any tick gives, else one stderr line saying which
/// source samples and why.
fn report_refusal(error: i32) {
    let hz = 1_000_000_000 / SAMPLER.period_ns.load(Ordering::Relaxed).max(1);
    if hz <= LOWEST_TICK_HZ {
        return;
    }
    let mut errno_text = [0u8; 20];
    let mut hz_text = [0u8; 20];
    let (errno_prefix, errno_value): (&[u8], &[u8]) = match errno_name(error) {
        Some(name) => (b"", name),
        None => (
            b"errno ",
            decimal(u64::from(error.unsigned_abs()), &mut errno_text),
        ),
    };
    sys::stderr_line(&[
        b"mslprof: the kernel refuses task-clock perf events (perf_event_open: ",
        errno_prefix,
        errno_value,
        b"; kernel.perf_event_paranoid above 2, or a seccomp filter); sampling on CPU-time timers, which the ",
        b"kernel checks on its tick: fewer than the ",
        decimal(hz, &mut hz_text),
        b" samples per CPU-second asked for (about 250 with a 250 Hz tick)\n",
    ]);
}

/// The name of a refusal's errno; `None` for one without a name here (then its number is printed).
fn errno_name(error: i32) -> Option<&'static [u8]> {
    Some(match error {
        libc::EACCES => b"EACCES",
        libc::EPERM => b"EPERM",
        libc::ENOSYS => b"ENOSYS",
        libc::ENOENT => b"ENOENT",
        libc::EINVAL => b"EINVAL",
        libc::EOPNOTSUPP => b"EOPNOTSUPP",
        _ => return None,
    })
}

/// `value` in decimal, in `buffer`. No allocation.
fn decimal(mut value: u64, buffer: &mut [u8; 20]) -> &[u8] {
    let mut start = buffer.len();
    loop {
        start -= 1;
        buffer[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &buffer[start..];
        }
    }
}

/// Called when a thread's task-clock event was closed by the program, or a forked child's could not be opened at
/// its first sample, and no new one could be had (`why`): its watch timer samples from then on. A forked child's
/// first sample comes here before the child's sources are set from [`CHILD_SOURCE`], which therefore says it too.
/// The process's first refusal is reported as a thread's at its start is ([`report_refusal`]).
fn note_fallback(why: task_clock::NoEvent) {
    if let task_clock::NoEvent::RefusedNow(error) = why {
        report_refusal(error);
    }
    note_source(SOURCE_CPU_TIMER);
    let child_source = CHILD_SOURCE.load(Ordering::Relaxed);
    if child_source != 0 && child_source & SOURCE_CPU_TIMER == 0 {
        CHILD_SOURCE.fetch_or(SOURCE_CPU_TIMER, Ordering::Relaxed);
    }
}

/// When a new thread's timer first fires: a pseudo-random point in `(0, period]` of its CPU time. With a fixed
/// first expiry, a thread that runs less than one period would never be sampled, and every thread would lose
/// the CPU time after its last sample; a random phase makes each thread's expected sample count exactly its
/// CPU time / period, however short the thread.
#[unsafe(link_section = "mslprof_fork_text")]
fn first_expiry(period: u64) -> u64 {
    // splitmix64 of the thread id and the time: cheap, allocation-free, different for every thread (the time by
    // a system call: a forked child comes here on its way out of `fork`, where the vDSO is a page to fault in).
    let mut z = (sys::gettid() as u64)
        ^ (sys::clock_ns_by_syscall(sys::CLOCK_REALTIME) as u64).rotate_left(17);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    1 + z % period.max(1)
}

unsafe extern "C" fn release_thread_source(value: *mut c_void) {
    let value = value as usize;
    if value & KEY_TIMER_TAG != 0 {
        sys::delete_timer(sys::CpuTimer::from_id(value & !KEY_TIMER_TAG));
    } else if value != 0 {
        task_clock::release(value - 1, &mut count_ring_record);
    }
}

/// Stops counting and waits (briefly) until no handler is inside the counters, so the histograms can be read
/// as plain memory. The timers keep firing into a handler that now returns at once.
pub fn stop_and_quiesce() {
    if SAMPLER.sampling.load(Ordering::SeqCst) {
        drain_rings();
    }
    if SAMPLER.sampling.swap(false, Ordering::SeqCst) {
        end_stretch();
    }
    for _ in 0..100_000 {
        if SAMPLER.handlers_running.load(Ordering::SeqCst) == 0 {
            return;
        }
        std::hint::spin_loop();
        std::thread::yield_now();
    }
}

/// Resumes counting after [`stop_and_quiesce`].
pub fn resume() {
    if SAMPLER.period_ns.load(Ordering::Relaxed) != 0 && !SAMPLER.sampling.load(Ordering::SeqCst) {
        // The samples the rings took during the pause are not counted.
        drain_rings();
        follow_fork();
        begin_stretch();
        SAMPLER.sampling.store(true, Ordering::SeqCst);
    }
}

/// Index of the process's whole CPU time in the stretch accounts.
const ALL_CPU: usize = 0;
/// Index of the process's user CPU time in the stretch accounts.
const USER_CPU: usize = 1;

/// CPU time of the whole process (all its threads, living and ended) but the drain thread's, which takes no
/// sample, in nanoseconds, all of it and its user part. Async-signal-safe.
fn process_cpu_ns() -> [u64; 2] {
    let all = sys::clock_ns(sys::CLOCK_PROCESS_CPUTIME_ID).max(0) as u64;
    let user = sys::process_cpu_ns().map_or(all, |(user, _)| user);
    let [drainer_all, drainer_user] = if task_clock::drainer_runs() {
        DRAINER_CPU_NS
            .each_ref()
            .map(|account| account.load(Ordering::Relaxed))
    } else {
        [0, 0]
    };
    [
        all.saturating_sub(drainer_all),
        user.saturating_sub(drainer_user),
    ]
}

fn begin_stretch() {
    for (start, now) in SAMPLER.stretch_start_cpu_ns.iter().zip(process_cpu_ns()) {
        start.store(now, Ordering::Relaxed);
    }
}

/// Adds the stretch of sampling that just ended to the sampled CPU time.
fn end_stretch() {
    follow_fork();
    let now = process_cpu_ns();
    for which in [ALL_CPU, USER_CPU] {
        let stretch =
            now[which].saturating_sub(SAMPLER.stretch_start_cpu_ns[which].load(Ordering::Relaxed));
        SAMPLER.ended_stretches_cpu_ns[which].fetch_add(stretch, Ordering::Relaxed);
    }
}

/// In a forked child (whose counts start afresh at the fork, see `lifecycle`), forgets the parent's CPU times:
/// the child's CPU clock started from zero at the fork, which is where its sampling began.
fn follow_fork() {
    let pid = u64::from(sys::getpid());
    if SAMPLER.cpu_time_pid.swap(pid, Ordering::Relaxed) != pid {
        for account in SAMPLER
            .ended_stretches_cpu_ns
            .iter()
            .chain(&SAMPLER.stretch_start_cpu_ns)
        {
            account.store(0, Ordering::Relaxed);
        }
    }
}

/// CPU time of the process while sampling was on: the time the samples stand for. That is all of it when
/// a CPU-time timer sampled some thread (its signal, even when the tick finds the thread in the kernel, comes
/// on the way back to user mode, so it lands on the code that made the system call); only the user part when
/// task clocks sampled every thread (they do not count a thread's time in the kernel).
pub fn sampled_cpu_ns() -> u64 {
    follow_fork();
    let which = if sources() == SOURCE_TASK_CLOCK {
        USER_CPU
    } else {
        ALL_CPU
    };
    let mut sampled = SAMPLER.ended_stretches_cpu_ns[which].load(Ordering::Relaxed);
    if SAMPLER.sampling.load(Ordering::SeqCst) {
        sampled += process_cpu_ns()[which]
            .saturating_sub(SAMPLER.stretch_start_cpu_ns[which].load(Ordering::Relaxed));
    }
    sampled
}

/// The handler is installed and threads get timers (even while counting is paused).
pub fn is_started() -> bool {
    SAMPLER.started.load(Ordering::Acquire)
}

pub fn is_sampling() -> bool {
    SAMPLER.sampling.load(Ordering::Relaxed)
}

/// The requested period in nanoseconds (0 before [`start`]).
pub fn requested_period_ns() -> u64 {
    SAMPLER.period_ns.load(Ordering::Relaxed)
}

/// The true average period of one sample: the CPU time sampled, divided by the samples (the requested period
/// when there is no sample, or no CPU clock).
///
/// The requested period × (signals + overruns) / signals would miss every period that never led to a signal:
/// the CPU time after each thread's last signal, which on a busy machine can be most of a short run. Threads
/// that have no timer (created with a raw `clone`, or before the runtime started, or whose timer could not be
/// created, which is reported) count in the process's CPU time but take no samples, and lengthen the period.
pub fn measured_period_ns() -> u64 {
    let samples = SAMPLER.total_samples.load(Ordering::Relaxed);
    let sampled = sampled_cpu_ns();
    if samples == 0 || sampled == 0 {
        return requested_period_ns();
    }
    sampled / samples
}

/// Counts one sample at `pc`. Async-signal-safe; also the test hook for the no-allocation test.
pub fn record_pc(pc: usize) {
    crate::fork_reset::settle();
    SAMPLER.total_samples.fetch_add(1, Ordering::Relaxed);
    crate::smonitor::record(pc);
    #[cfg(target_arch = "x86_64")]
    let pc = crate::mcount::library_address(pc);
    let pc = RuntimeAddress::from_usize(pc);
    match modules::find_address(pc) {
        Some(module) => module.record_sample(pc),
        None => {
            if !defer_unknown_sample(pc) {
                SAMPLER.unknown_samples.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// SIGPROF slow path: `pc` is in no known module. While a `dlopen` is in progress the PC may be in a module
/// that is being initialised: park it and return true; it is attributed after the rescan (or counted as
/// unknown then). Async-signal-safe (atomics only).
fn defer_unknown_sample(pc: RuntimeAddress) -> bool {
    if pc.0 == 0 || !mslprof_loader_hooks::open_in_progress() {
        return false;
    }
    let slot = SAMPLER.parked_next.fetch_add(1, Ordering::Relaxed) % PARKED_SLOTS;
    SAMPLER.parked[slot]
        .compare_exchange(0, pc.as_usize(), Ordering::Release, Ordering::Relaxed)
        .is_ok()
}

/// Gives each parked sample to the module that now contains it, or counts it as unknown.
pub fn attribute_parked_samples() {
    for slot in &SAMPLER.parked {
        // A plain load first: most slots are empty, and a swap of each is a locked instruction (this runs
        // after every change of the module table).
        if slot.load(Ordering::Relaxed) == 0 {
            continue;
        }
        let pc = slot.swap(0, Ordering::Acquire);
        if pc == 0 {
            continue;
        }
        let pc = RuntimeAddress::from_usize(pc);
        match modules::find_address(pc) {
            Some(module) => module.record_sample(pc),
            None => {
                SAMPLER.unknown_samples.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// What one SIGPROF is, from its siginfo.
fn classify(origin: &sys::SignalOrigin) -> Tick {
    let period = SAMPLER.period_ns.load(Ordering::Relaxed);
    match origin.code {
        sys::SI_TIMER if origin.value == cookie() => Tick::Sample,
        sys::SI_TIMER => task_clock::on_timer_signal(origin.value, period, note_fallback),
        sys::POLL_IN => task_clock::on_event_signal(origin.fd, period),
        _ => Tick::NotOurs,
    }
}

extern "C" fn on_sigprof(signal: i32, info: *mut libc::siginfo_t, context: *mut c_void) {
    let _errno = sys::SavedErrno::save();
    // SAFETY: the kernel passed `info` to this SA_SIGINFO handler.
    let origin = unsafe { sys::signal_origin(info) };
    #[cfg(target_arch = "x86_64")]
    if origin.code == sys::SI_TIMER && origin.value == look_cookie() {
        SAMPLER.handlers_running.fetch_add(1, Ordering::SeqCst);
        // Should the look ever panic, looks stop: profiling goes on.
        if std::panic::catch_unwind(crate::mcount::hot::on_tick).is_err() {
            crate::mcount::hot::give_up();
        }
        SAMPLER.handlers_running.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let before_ring = match classify(&origin) {
        Tick::Sample => None,
        Tick::BeforeRing(slot) => Some(slot),
        Tick::Quiet => return,
        Tick::Drain(slot) => {
            let context = context as usize;
            // SAFETY: the kernel passed `context` to this SA_SIGINFO handler.
            count_guarded(|| unsafe { count_signalled_ring(slot, context as *const c_void) });
            return;
        }
        Tick::Watch(slot) => {
            count_guarded(|| {
                task_clock::on_watch_tick(slot);
                // Every quiet ring: a thread's own ticks can come late (see `on_watch_tick`), the ticks of all
                // the threads together much less; and should the drain thread be stopped (a debugger), its
                // rings are still drained.
                task_clock::drain_all(&mut count_ring_record, Rings::Quiet);
            });
            return;
        }
        Tick::NotOurs => {
            // SAFETY: the kernel's arguments to this handler.
            unsafe { program_sigprof::forward(signal, info, context) };
            return;
        }
    };
    count_guarded(|| {
        if SAMPLER.sampling.load(Ordering::SeqCst) {
            if origin.overrun > 0 {
                SAMPLER
                    .overruns
                    .fetch_add(origin.overrun as u64, Ordering::Relaxed);
            }
            // SAFETY: the kernel passed `context` to this SA_SIGINFO handler.
            let pc = unsafe { sys::interrupted_pc(context) };
            record_pc(pc);
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: as above.
                let reach = unsafe { crate::stacks::record_interrupted(context) };
                if let Some(slot) = before_ring {
                    note_live_reach(slot, reach);
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = before_ring;
        }
    });
}

/// Runs the handler's counting `work`, known to [`stop_and_quiesce`] as a running handler. The counting paths
/// cannot panic (checked indexing only); should one ever, sampling stops instead of unwinding into the
/// interrupted program.
fn count_guarded(work: impl FnOnce() + std::panic::UnwindSafe) {
    SAMPLER.handlers_running.fetch_add(1, Ordering::SeqCst);
    let counted = std::panic::catch_unwind(work);
    SAMPLER.handlers_running.fetch_sub(1, Ordering::SeqCst);
    if counted.is_err() && SAMPLER.sampling.swap(false, Ordering::SeqCst) {
        sys::stderr_line(&[b"mslprof: internal error in the SIGPROF handler; profiling is off\n"]);
    }
}

/// What our `pthread_create` hands to the real one: the program's start routine and argument.
struct ThreadStart {
    routine: sys::ThreadStartRoutine,
    argument: *mut c_void,
}

extern "C" fn start_sampled_thread(start: *mut c_void) -> *mut c_void {
    // SAFETY: `start` is the Box leaked by `create_thread` for exactly this thread.
    let ThreadStart { routine, argument } = *unsafe { Box::from_raw(start as *mut ThreadStart) };
    crate::stacks::note_thread_stack();
    if std::panic::catch_unwind(|| arm_current_thread(true)).is_err() {
        stop_and_quiesce();
        crate::status::turn_off(b"thread start");
    }
    routine(argument)
}

/// Our `pthread_create`: the program's thread, started through [`start_sampled_thread`] so it gets a timer.
///
/// # Safety
/// The arguments are those of `pthread_create(3)`.
/// `profiling` tells whether profiling is active (the caller starts it if need be).
pub unsafe fn create_thread(
    thread: *mut libc::pthread_t,
    attributes: *const libc::pthread_attr_t,
    routine: sys::ThreadStartRoutine,
    argument: *mut c_void,
    profiling: bool,
) -> i32 {
    let real = real_pthread_create();
    if real == 0 {
        return libc::EAGAIN;
    }
    if !profiling || !is_started() {
        // SAFETY: `real` is the next pthread_create; plain pass-through of the caller's arguments.
        return unsafe { sys::call_pthread_create(real, thread, attributes, routine, argument) };
    }
    let start = Box::into_raw(Box::new(ThreadStart { routine, argument }));
    // SAFETY: the caller's arguments, with our start routine, which takes ownership of `start`.
    let result = unsafe {
        sys::call_pthread_create(
            real,
            thread,
            attributes,
            start_sampled_thread,
            start as *mut c_void,
        )
    };
    if result != 0 {
        // SAFETY: the thread was not created, so `start` is still ours.
        drop(unsafe { Box::from_raw(start) });
    }
    result
}

/// Counts `count` samples at `pc` through the same path as the SIGPROF handler, when profiling is
/// active and sampling (the `mslprof_test_inject_samples` test hook).
pub fn inject_samples(pc: usize, count: u64) {
    if is_sampling() {
        for _ in 0..count {
            record_pc(pc);
        }
    }
}

/// The samples counted so far, in all modules when `pc` is `None`, else in the module whose code holds `pc`
/// (0 if none); `None` when not sampling (the `mslprof_test_samples` test hook).
pub fn samples_in(pc: Option<usize>) -> Option<u64> {
    if !is_sampling() {
        return None;
    }
    Some(match pc {
        None => SAMPLER.total_samples(),
        Some(pc) => modules::find_address(RuntimeAddress::from_usize(pc))
            .map_or(0, |m| m.samples.load(Ordering::Relaxed)),
    })
}
