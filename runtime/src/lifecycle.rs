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
        None => sys::set_environment_variable(ROOT_MARKER, &pid),
    }
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
    attribute_parked_samples();
    if END_CAUSE.load(Ordering::Relaxed) == 0 && !mslprof_loader_hooks::on_main_thread() {
        END_CAUSE.store(IncompleteCause::ExitFromThread.code(), Ordering::Relaxed);
    }
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
            let loaded: Vec<&'static LiveModule> = table.loaded().collect();
            for module in &loaded {
                if !scan.modules.iter().any(|info| same_instance(module, info)) {
                    table.unload(module.key);
                }
            }
            for info in &scan.modules {
                if !loaded.iter().any(|module| same_instance(module, info)) {
                    table.add(info.clone());
                }
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
        if !matches!(end, ProcessEnd::Signal { .. }) {
            attribute_parked_samples();
        }
        dump::write_at_exit(settings);
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

/// Whether this image has counted a sample or a call since it started (or forked).
fn recorded_anything() -> bool {
    sampler::TOTAL_SAMPLES.load(Ordering::Relaxed) != 0
        || modules::all().iter().any(|m| !m.arcs.is_empty())
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
