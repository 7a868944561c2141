//! The runtime's side of the loader events (loader-hooks): modules that come and go, fork, exec, and the ends
//! of a process that skip the normal exit dump.
//!
//! * Loads and unloads: each event carries the loader's complete list; it is compared with the module table.
//!   A module not in the table is a new load instance (new key, its own histogram and arc storage); a module in
//!   the table that the loader no longer lists was unloaded: it leaves the address lookup but keeps its data,
//!   marked UNLOADED with the next unload order, for the final dump. Nothing is ever freed (see `modules`), so
//!   a SIGPROF or mcount in flight on another thread never touches freed memory, and because the table is
//!   replaced before the loader can map anything else at those addresses (loader-hooks' loader lock), a module
//!   loaded later at the same addresses is a different entry and never shares counts with the old one.
//! * Constructors: mcount meeting code in no known module on the thread that is inside `dlopen` registers the
//!   new modules at once ([`module_loaded_during_open`]); samples in unknown code while a `dlopen` is in
//!   progress are parked ([`defer_unknown_sample`]) and attributed after the rescan.
//! * Processes: a forked child resets every counter and writes a pid-named file; an image about to `exec`
//!   writes `<name>.pre-exec` (PRE_EXEC, cause exec) if it recorded anything; `_exit`, fatal signals and `exit`
//!   from another thread than the main one write the profile marked INCOMPLETE with the cause.
//! * Which process writes `gmon.out`: the first profiled process marks the environment with
//!   `MSLPROF_ROOT_PID=<pid>`; a process that finds another pid there is a descendant and writes a pid-named
//!   file, so no profile overwrites another.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use mslprof_format::model::{IncompleteCause, header_flags};
use mslprof_loader_hooks::{LoadCause, LoaderEvents, LoaderScan, ModuleInfo, ProcessEnd};

use crate::modules::{self, LiveModule, RuntimePc};
use crate::{dump, mcount, sampler, sys};

/// The events handler installed into loader-hooks.
pub struct Lifecycle;

pub static LIFECYCLE: Lifecycle = Lifecycle;

/// Environment variable marking the process that started profiling.
const ROOT_MARKER: &str = "MSLPROF_ROOT_PID";

/// This process (image) was started by a profiled process: its file is pid-named.
static DESCENDANT: AtomicBool = AtomicBool::new(false);
/// A fork happened since start-up: this process is a forked child.
static FORKED_CHILD: AtomicBool = AtomicBool::new(false);
/// How the image ends, for the dump's header: `IncompleteCause` code (0 = normal), the signal, PRE_EXEC.
static END_CAUSE: AtomicU32 = AtomicU32::new(0);
static END_SIGNAL: AtomicU32 = AtomicU32::new(0);
static PRE_EXEC: AtomicBool = AtomicBool::new(false);

/// Starts the loader events (called once profiling is active): decides whether this is the root process,
/// then installs the hooks, whose start-up scan is compared with the table built at start-up.
pub fn install() {
    let pid = sys::getpid().to_string();
    match std::env::var_os(ROOT_MARKER) {
        Some(root) => {
            DESCENDANT.store(root.as_encoded_bytes() != pid.as_bytes(), Ordering::Relaxed);
        }
        // libc's setenv calls realloc through libc's own PLT: a call of the runtime's, not counted.
        None => crate::mcount::uncounted(|| sys::set_environment_variable(ROOT_MARKER, &pid)),
    }
    prepare_output_path();
    mslprof_loader_hooks::install(&LIFECYCLE);
}

/// Whether this process writes a pid-named file rather than `gmon.out` (a forked child, a descendant).
pub fn writes_pid_named_file(forked_child: bool) -> bool {
    forked_child || FORKED_CHILD.load(Ordering::Relaxed) || DESCENDANT.load(Ordering::Relaxed)
}

/// The output path for this dump: `path` as the output rule gives it, plus `.pre-exec` for an image about
/// to be replaced.
pub fn output_path(mut path: Vec<u8>) -> Vec<u8> {
    if PRE_EXEC.load(Ordering::Relaxed) {
        path.extend_from_slice(b".pre-exec");
    }
    path
}

/// Header flags and incomplete cause/signal for the dump being written.
pub fn ending_header(flags: &mut u32, cause: &mut IncompleteCause, signal: &mut u32) {
    let code = END_CAUSE.load(Ordering::Relaxed);
    if code != 0 {
        *flags |= header_flags::INCOMPLETE;
        *cause = IncompleteCause::from_code(code);
        *signal = END_SIGNAL.load(Ordering::Relaxed);
    }
    if PRE_EXEC.load(Ordering::Relaxed) {
        *flags |= header_flags::PRE_EXEC;
    }
    if FORKED_CHILD.load(Ordering::Relaxed) {
        *flags |= header_flags::FORKED_CHILD;
    }
}

/// Called by the normal exit dump: `exit` from a thread other than the main one is an incomplete profile
/// (cause 3), since the other threads were still running.
pub fn note_normal_exit() {
    // Threads that still run while the process exits stop counting calls: the dump is the state at exit.
    mcount::set_paused(true);
    attribute_parked_samples();
    if END_CAUSE.load(Ordering::Relaxed) == 0
        && !mslprof_loader_hooks::on_main_thread()
        && other_threads_still_run()
    {
        END_CAUSE.store(IncompleteCause::ExitFromThread.code(), Ordering::Relaxed);
    }
}

/// Whether a thread other than the caller is still alive (not a zombie). After the main thread called
/// `pthread_exit`, the last thread to end runs the exit handlers while the main thread is a zombie: that is a
/// complete run, not an `exit` from a side thread. Unknown (no /proc) counts as still running.
fn other_threads_still_run() -> bool {
    let me = sys::gettid().to_string();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return true;
    };
    tasks.flatten().any(|task| {
        if task.file_name().as_encoded_bytes() == me.as_bytes() {
            return false;
        }
        let Ok(stat) = std::fs::read(task.path().join("stat")) else {
            // Gone meanwhile: not running.
            return false;
        };
        // The state follows the last ')' of "pid (comm) S ...".
        let state = stat
            .iter()
            .rposition(|&b| b == b')')
            .and_then(|close| stat.get(close + 2));
        !matches!(state, Some(b'Z' | b'X'))
    })
}

/// Same load instance? Key facts the loader gives: where, which file, which segments.
fn same_instance(module: &LiveModule, info: &ModuleInfo) -> bool {
    module.bias == info.bias
        && module.info.path == info.path
        && module.info.exec_ranges == info.exec_ranges
        && module.info.is_vdso == info.is_vdso
}

impl LoaderEvents for Lifecycle {
    fn modules_changed(&self, scan: &LoaderScan, _cause: LoadCause) {
        let Some(policy) = crate::module_policy() else {
            return;
        };
        modules::update(&policy, |table| {
            // Loaded modules by (bias, path): a few hundred at most, compared in one pass each way.
            let mut loaded: std::collections::HashMap<(usize, &[u8]), Vec<&'static LiveModule>> =
                std::collections::HashMap::new();
            for module in table.loaded() {
                loaded
                    .entry((module.bias, module.info.path.as_slice()))
                    .or_default()
                    .push(module);
            }
            let mut still_loaded = std::collections::HashSet::new();
            let mut added = Vec::new();
            for info in &scan.modules {
                let known = loaded
                    .get(&(info.bias, info.path.as_slice()))
                    .and_then(|candidates| candidates.iter().find(|m| same_instance(m, info)));
                match known {
                    Some(module) => {
                        still_loaded.insert(module.key);
                    }
                    None => added.push(info),
                }
            }
            let gone: Vec<u32> = loaded
                .values()
                .flatten()
                .map(|m| m.key)
                .filter(|key| !still_loaded.contains(key))
                .collect();
            // Unloads first, in load order, so that unload order numbers follow the loader's.
            let mut gone = gone;
            gone.sort_unstable();
            for key in gone {
                table.unload(key);
            }
            for info in added {
                table.add(info.clone());
            }
        });
        attribute_parked_samples();
    }

    fn after_fork_in_child(&self) {
        FORKED_CHILD.store(true, Ordering::Relaxed);
        END_CAUSE.store(0, Ordering::Relaxed);
        PRE_EXEC.store(false, Ordering::Relaxed);
        // The child's profile covers only the child: forget everything the parent had counted.
        for module in modules::all() {
            module.samples.store(0, Ordering::Relaxed);
            if let Some(histogram) = &module.histogram {
                histogram.reset();
            }
        }
        mcount::reset_after_fork();
        for counter in [
            &sampler::TOTAL_SAMPLES,
            &sampler::UNKNOWN_SAMPLES,
            &sampler::OVERRUNS,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
        for slot in &PARKED {
            slot.store(0, Ordering::Relaxed);
        }
        dump::allow_another_dump();
        dump::restart_clock();
        prepare_output_path();
        // Timers are not inherited: the child's one thread gets its own.
        sampler::arm_current_thread();
    }

    fn process_ending(&self, end: ProcessEnd) {
        let (cause, signal) = match end {
            ProcessEnd::ExitFromThread => (IncompleteCause::ExitFromThread, 0),
            ProcessEnd::UnderscoreExit { .. } => (IncompleteCause::UnderscoreExit, 0),
            ProcessEnd::Signal { signal } => (IncompleteCause::Signal, signal as u32),
            ProcessEnd::Exec => (IncompleteCause::Exec, 0),
        };
        let Some(settings) = crate::settings() else {
            return;
        };
        if matches!(end, ProcessEnd::Exec) {
            // A child that only forked and execs (shells, make) recorded nothing: it leaves no file.
            if !recorded_anything() {
                return;
            }
            PRE_EXEC.store(true, Ordering::Relaxed);
        }
        END_CAUSE.store(cause.code(), Ordering::Relaxed);
        END_SIGNAL.store(signal, Ordering::Relaxed);
        if matches!(
            end,
            ProcessEnd::Signal { .. } | ProcessEnd::UnderscoreExit { .. }
        ) {
            // Possibly inside a signal handler that interrupted malloc: no heap from here on.
            write_without_heap();
            return;
        }
        attribute_parked_samples();
        let paused_before = mcount::is_paused();
        mcount::set_paused(true);
        dump::write_at_exit(settings);
        mcount::set_paused(paused_before);
        if matches!(end, ProcessEnd::Exec) {
            // If the exec fails the image goes on: it counts on and dumps again, normally, at its end.
            PRE_EXEC.store(false, Ordering::Relaxed);
            END_CAUSE.store(0, Ordering::Relaxed);
            END_SIGNAL.store(0, Ordering::Relaxed);
            dump::allow_another_dump();
            sampler::resume();
        }
    }
}

/// The format's limit on load instances in one file (SPEC.md §8).
const MAX_MODULES_IN_FILE: usize = 65_536;

/// Whether a load instance holds any data.
fn recorded(module: &LiveModule) -> bool {
    module.samples.load(Ordering::Relaxed) != 0 || !module.arcs.is_empty()
}

/// Visits, in load order, the load instances to write when at most `limit` fit: every loaded module (up to
/// the limit), then as many unloaded ones as fit, those that recorded something before empty ones, newer before
/// older. Returns how many were left out. Allocates nothing (the signal-time dump uses it too).
fn select_for_dump<T: Copy>(
    all: &[T],
    limit: usize,
    is_unloaded: impl Fn(T) -> bool,
    has_data: impl Fn(T) -> bool,
    mut visit: impl FnMut(T),
) -> usize {
    let loaded = all.iter().filter(|&&m| !is_unloaded(m)).count();
    let with_data = all
        .iter()
        .filter(|&&m| is_unloaded(m) && has_data(m))
        .count();
    let empty = all.len() - loaded - with_data;
    let kept_loaded = loaded.min(limit);
    let kept_with_data = with_data.min(limit - kept_loaded);
    let kept_empty = empty.min(limit - kept_loaded - kept_with_data);
    // Within each kind the oldest are left out first.
    let (mut skip_loaded, mut skip_with_data, mut skip_empty) = (
        loaded - kept_loaded,
        with_data - kept_with_data,
        empty - kept_empty,
    );
    for &module in all {
        let skip = match (is_unloaded(module), has_data(module)) {
            (false, _) => &mut skip_loaded,
            (true, true) => &mut skip_with_data,
            (true, false) => &mut skip_empty,
        };
        if *skip > 0 {
            *skip -= 1;
        } else {
            visit(module);
        }
    }
    all.len() - (kept_loaded + kept_with_data + kept_empty)
}

/// [`select_for_dump`] over the module table's load instances.
fn select_instances(
    all: &[&'static LiveModule],
    limit: usize,
    visit: impl FnMut(&'static LiveModule),
) -> usize {
    select_for_dump(all, limit, |m| m.is_unloaded(), recorded, visit)
}

/// Says once on stderr how many load instances did not fit in the file. Async-signal-safe.
fn warn_left_out(left_out: usize) {
    if left_out == 0 {
        return;
    }
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut value = left_out;
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    sys::stderr_line(&[
        b"mslprof: ",
        &digits[at..],
        b" load instances of unloaded modules left out of the profile (a file holds at most 65536)\n",
    ]);
}

/// The load instances the normal dump writes: all of them, unless there are more than a file can hold (a
/// process that loaded and unloaded libraries more than 65536 times); then every loaded module and as many
/// unloaded ones as fit, those that recorded something first, newest first.
pub fn modules_to_dump() -> std::borrow::Cow<'static, [&'static LiveModule]> {
    let all = modules::all();
    if all.len() <= MAX_MODULES_IN_FILE {
        return std::borrow::Cow::Borrowed(all);
    }
    let mut selected = Vec::with_capacity(MAX_MODULES_IN_FILE);
    let left_out = select_instances(all, MAX_MODULES_IN_FILE, |m| selected.push(m));
    warn_left_out(left_out);
    std::borrow::Cow::Owned(selected)
}

/// Whether this image has counted a sample or a call since it started (or forked).
fn recorded_anything() -> bool {
    sampler::TOTAL_SAMPLES.load(Ordering::Relaxed) != 0
        || modules::all().iter().any(|m| !m.arcs.is_empty())
}

/// Whether a selected (profiled) module of this image has a sample or a call: a descendant that recorded
/// nothing in them (a wrapper's helper process) writes no file.
pub fn recorded_in_selected_modules() -> bool {
    modules::all()
        .iter()
        .any(|m| m.profiled && (m.samples.load(Ordering::Relaxed) != 0 || !m.arcs.is_empty()))
}

/// mcount slow path: `selfpc` is in no known module. If the calling thread is inside `dlopen`, this is code of
/// a module being initialised (a constructor): register the new modules now and return the callee's.
/// Not async-signal-safe in that case (it scans), which is why only the `dlopen` thread does it.
pub fn module_loaded_during_open(selfpc: usize) -> Option<&'static LiveModule> {
    if !mslprof_loader_hooks::open_in_progress() {
        return None;
    }
    if mslprof_loader_hooks::refresh_during_open() {
        modules::find(selfpc)
    } else {
        None
    }
}

/// Samples in unknown code taken while a `dlopen` is in progress, waiting for the rescan (0 = empty slot).
const PARKED_SLOTS: usize = 1024;
static PARKED: [AtomicUsize; PARKED_SLOTS] = [const { AtomicUsize::new(0) }; PARKED_SLOTS];
static PARKED_NEXT: AtomicUsize = AtomicUsize::new(0);

/// SIGPROF slow path: `pc` is in no known module. While a `dlopen` is in progress the PC may be in a module
/// that is being initialised: park it and return true; it is attributed after the rescan (or counted as
/// unknown then). Async-signal-safe (atomics only).
pub fn defer_unknown_sample(pc: usize) -> bool {
    if pc == 0 || !mslprof_loader_hooks::open_in_progress() {
        return false;
    }
    let slot = PARKED_NEXT.fetch_add(1, Ordering::Relaxed) % PARKED_SLOTS;
    PARKED[slot]
        .compare_exchange(0, pc, Ordering::Release, Ordering::Relaxed)
        .is_ok()
}

/// Gives each parked sample to the module that now contains it, or counts it as unknown.
pub fn attribute_parked_samples() {
    for slot in &PARKED {
        let pc = slot.swap(0, Ordering::Acquire);
        if pc == 0 {
            continue;
        }
        match modules::find(pc) {
            Some(module) => module.record_sample(RuntimePc(pc)),
            None => {
                sampler::UNKNOWN_SAMPLES.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// The async-signal-safe dump: fatal signals and `_exit` (often called from a signal handler) may interrupt
// code that holds malloc's lock, so this path allocates nothing from the heap: descriptors are built in a
// fresh anonymous mapping, counts are borrowed from the histograms and arc tables, the file name was
// prepared beforehand, and the bytes go straight to a file descriptor.
// ---------------------------------------------------------------------------------------------------------

use std::cell::UnsafeCell;

use mslprof_format::model::Arc as ArcRecordOut;
use mslprof_format::stream::{self, Counts, HistogramDesc, ModuleDesc, RangeDesc, Sink};

use crate::histogram::{BYTES_PER_BUCKET, BucketBits};

/// The output path of this process and the temporary name written first, both NUL-terminated, prepared at
/// start-up and after fork (the signal path cannot build them, and must not use much stack: it may run on a
/// small alternate signal stack).
struct PreparedPath {
    final_path: UnsafeCell<[u8; 4096]>,
    temporary: UnsafeCell<[u8; 4096]>,
    /// Length of `final_path` without its NUL; 0: no file is to be written or nothing prepared yet.
    len: AtomicUsize,
    /// Length of `temporary` without its NUL.
    temporary_len: AtomicUsize,
}

// SAFETY: the buffers are written only by `prepare_output_path` (start-up, fork child: one thread at a time,
// after `len` was set to 0 and before it is published again with release ordering) and read after an acquire
// load of a non-zero `len`.
unsafe impl Sync for PreparedPath {}

static PREPARED_PATH: PreparedPath = PreparedPath {
    final_path: UnsafeCell::new([0; 4096]),
    temporary: UnsafeCell::new([0; 4096]),
    len: AtomicUsize::new(0),
    temporary_len: AtomicUsize::new(0),
};

/// Computes this process's output path now, while allocating is still fine.
fn prepare_output_path() {
    PREPARED_PATH.len.store(0, Ordering::Release);
    let Some(settings) = crate::settings() else {
        return;
    };
    let pid = sys::getpid();
    let Some(path) =
        settings
            .output
            .path(pid, &settings.program_name, writes_pid_named_file(false))
    else {
        return;
    };
    let mut temporary = path.clone();
    temporary.extend_from_slice(format!(".tmp-{pid}").as_bytes());
    // Room for the NUL terminators; a path with a NUL in it cannot be opened anyway.
    if path.is_empty() || temporary.len() >= 4096 || path.contains(&0) {
        return;
    }
    // SAFETY: see `PreparedPath`: `len` is 0, so no reader looks at the buffers until it is published below.
    let (final_buffer, temporary_buffer) = unsafe {
        (
            &mut *PREPARED_PATH.final_path.get(),
            &mut *PREPARED_PATH.temporary.get(),
        )
    };
    final_buffer.fill(0);
    final_buffer[..path.len()].copy_from_slice(&path);
    temporary_buffer.fill(0);
    temporary_buffer[..temporary.len()].copy_from_slice(&temporary);
    PREPARED_PATH
        .temporary_len
        .store(temporary.len(), Ordering::Relaxed);
    PREPARED_PATH.len.store(path.len(), Ordering::Release);
}

/// A sink writing straight to a file descriptor.
struct FdSink(i32);

impl Sink for FdSink {
    type Error = i32;
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), i32> {
        sys::write_all(self.0, bytes)
    }
}

/// A bump allocator over one anonymous mapping, for the descriptors of the signal-time dump.
struct Arena {
    base: usize,
    len: usize,
    used: usize,
}

impl Arena {
    fn new(len: usize) -> Option<Arena> {
        Some(Arena {
            base: sys::reserve_zeroed(len)?,
            len,
            used: 0,
        })
    }

    /// Moves `count` values made by `make` into the arena and returns them as a slice living as long as the
    /// mapping (which is never unmapped: the process is ending).
    fn slice<T>(
        &mut self,
        count: usize,
        mut make: impl FnMut(usize) -> T,
    ) -> Option<&'static mut [T]> {
        let align = std::mem::align_of::<T>();
        let start = self.used.checked_add(align - 1)? & !(align - 1);
        let end = start.checked_add(count.checked_mul(std::mem::size_of::<T>())?)?;
        if end > self.len {
            return None;
        }
        self.used = end;
        let first = (self.base + start) as *mut T;
        for index in 0..count {
            // SAFETY: `first + index` lies inside our fresh mapping, aligned for T, and is written once.
            unsafe { first.add(index).write(make(index)) };
        }
        // SAFETY: `count` initialised values of T at `first`, in memory nobody else uses or frees.
        Some(unsafe { std::slice::from_raw_parts_mut(first, count) })
    }
}

/// The range descriptors of one histogram, borrowing its buckets.
///
/// # Safety
/// Sampling must be stopped (see `Histogram::quiescent_buckets16`).
unsafe fn range_counts(module: &'static LiveModule, range_index: usize) -> RangeDesc<'static> {
    let Some(histogram) = &module.histogram else {
        return RangeDesc::default();
    };
    let range = &histogram.ranges()[range_index];
    let first = range.first_bucket;
    let count = range.bucket_count();
    let counts = match histogram.bucket_bits() {
        BucketBits::Sixteen => {
            // SAFETY: sampling is stopped (caller); the slice lies inside the histogram.
            let buckets = unsafe { histogram.quiescent_buckets16() };
            Counts::U16(&buckets[first..first + count])
        }
        BucketBits::ThirtyTwo => {
            // SAFETY: as above.
            let buckets = unsafe { histogram.quiescent_buckets32() };
            Counts::U32(&buckets[first..first + count])
        }
    };
    RangeDesc {
        start: range.start,
        end: range.end,
        counts,
    }
}

/// Writes the profile without touching the heap (fatal signals, `_exit`). Returns false if nothing could be
/// written. The header's cause/flags come from `END_CAUSE` etc., set by the caller.
fn write_without_heap() -> bool {
    let Some(settings) = crate::settings() else {
        return false;
    };
    let path_len = PREPARED_PATH.len.load(Ordering::Acquire);
    if path_len == 0 {
        return false;
    }
    mcount::set_paused(true);
    sampler::stop_and_quiesce();
    let temporary_len = PREPARED_PATH.temporary_len.load(Ordering::Relaxed);
    // SAFETY: published before `len` (acquire above); rewritten only after a fork, in the child's own copy.
    let (final_path, temporary) = unsafe {
        (
            &(&*PREPARED_PATH.final_path.get())[..=path_len],
            &(&*PREPARED_PATH.temporary.get())[..=temporary_len],
        )
    };

    let all = modules::all();
    let Some(&first_module) = all.first() else {
        return false;
    };
    let mut selected_count = 0;
    select_instances(all, MAX_MODULES_IN_FILE, |_| selected_count += 1);
    // An upper bound when some instances are left out.
    let range_total: usize = all
        .iter()
        .map(|m| m.histogram.as_ref().map_or(0, |h| h.ranges().len()))
        .sum();
    type Feed = dyn Fn(&mut dyn FnMut(ArcRecordOut) -> bool);
    let feed_for = |module: &'static LiveModule| {
        move |emit: &mut dyn FnMut(ArcRecordOut) -> bool| {
            let mut open = true;
            module.arcs.for_each(|record| {
                if open {
                    open = emit(ArcRecordOut {
                        caller_key: record.caller_key,
                        caller_address: mslprof_format::LinkAddress(record.caller_addr),
                        callee_address: mslprof_format::LinkAddress(record.callee_addr),
                        count: record.count,
                    });
                }
            });
        }
    };
    let bytes = 4096
        + selected_count * std::mem::size_of::<&LiveModule>()
        + selected_count * (std::mem::size_of::<ModuleDesc<'static>>() + 64)
        + selected_count * std::mem::size_of_val(&feed_for(first_module))
        + range_total * std::mem::size_of::<RangeDesc<'static>>();
    let Some(mut arena) = Arena::new(bytes) else {
        return false;
    };
    let Some(modules) = arena.slice(selected_count, |_| first_module) else {
        return false;
    };
    let mut next = 0;
    let left_out = select_instances(all, MAX_MODULES_IN_FILE, |m| {
        modules[next] = m;
        next += 1;
    });
    warn_left_out(left_out);
    let modules: &'static [&'static LiveModule] = modules;
    let Some(feeds) = arena.slice(modules.len(), |i| feed_for(modules[i])) else {
        return false;
    };
    let feeds: &'static [_] = feeds;
    let mut next_range = 0;
    let Some(range_store) = arena.slice(range_total, |_| RangeDesc::default()) else {
        return false;
    };
    for module in modules {
        if let Some(histogram) = &module.histogram {
            for index in 0..histogram.ranges().len() {
                // SAFETY: sampling was stopped above.
                range_store[next_range] = unsafe { range_counts(module, index) };
                next_range += 1;
            }
        }
    }
    let range_store: &'static [RangeDesc<'static>] = range_store;
    let mut offset = 0;
    let Some(descriptors) = arena.slice(modules.len(), |i| {
        let module = modules[i];
        let histogram = module.histogram.as_ref().map(|h| {
            let count = h.ranges().len();
            let ranges = &range_store[offset..offset + count];
            offset += count;
            HistogramDesc {
                bucket_bits: h.bucket_bits().bits(),
                bytes_per_bucket: BYTES_PER_BUCKET,
                ranges,
                encoding: Default::default(),
            }
        });
        let feed: &'static Feed = &feeds[i];
        let (arc_count, arcs) = if module.profiled {
            (module.arcs.len() as u64, Some(feed))
        } else {
            (0, None)
        };
        dump::module_desc(module, histogram, arc_count, arcs)
    }) else {
        return false;
    };

    let header = dump::header_desc(settings, modules, 0, dump::start_time_ns());
    let Some(fd) = sys::create_new_file(temporary) else {
        sys::stderr_line(&[b"mslprof: cannot create ", trim_nul(temporary), b"\n"]);
        return false;
    };
    let written = stream::write_profile(&mut FdSink(fd), &header, descriptors).is_ok();
    sys::close_file(fd);
    if written && sys::rename_file(temporary, final_path) {
        return true;
    }
    sys::remove_file(temporary);
    sys::stderr_line(&[b"mslprof: cannot write ", trim_nul(final_path), b"\n"]);
    false
}

fn trim_nul(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (load order, unloaded, recorded something)
    type Instance = (u32, bool, bool);

    fn selected(all: &[Instance], limit: usize) -> (Vec<u32>, usize) {
        let mut kept = Vec::new();
        let left_out = select_for_dump(all, limit, |m| m.1, |m| m.2, |m| kept.push(m.0));
        (kept, left_out)
    }

    #[test]
    fn everything_is_written_when_it_fits() {
        let all = [(1, false, true), (2, true, false), (3, true, true)];
        assert_eq!(selected(&all, 3), (vec![1, 2, 3], 0));
    }

    #[test]
    fn loaded_first_then_unloaded_with_data_newest_first_then_empty_ones() {
        let all = [
            (1, false, false),
            (2, true, true),
            (3, true, false),
            (4, true, true),
            (5, true, false),
            (6, false, true),
            (7, true, true),
        ];
        // Loaded 1 and 6 always; data 2, 4, 7: the newest two fit.
        assert_eq!(selected(&all, 4), (vec![1, 4, 6, 7], 3));
        // All loaded and data ones, and the newest empty one.
        assert_eq!(selected(&all, 6), (vec![1, 2, 4, 5, 6, 7], 1));
        // Only loaded ones fit.
        assert_eq!(selected(&all, 2), (vec![1, 6], 5));
        // Not even every loaded one: the oldest loaded is left out.
        assert_eq!(selected(&all, 1), (vec![6], 6));
    }
}
