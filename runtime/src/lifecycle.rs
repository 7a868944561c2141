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
//!   new modules at once (`modules::module_loaded_during_open`); samples in unknown code while a `dlopen` is in
//!   progress are parked by the sampler and attributed after the rescan.
//! * Processes: a forked child has every owner of state reset itself and writes a pid-named file; an image about to `exec`
//!   writes `<name>.pre-exec` (PRE_EXEC, cause exec) if it recorded anything; `_exit`, fatal signals and `exit`
//!   from another thread than the main one write the profile marked INCOMPLETE with the cause (recorded in
//!   `ending`; the writing is `dump`'s).
//! * Which process writes `gmon.out`: the first profiled process marks the environment with
//!   `MSLPROF_ROOT_PID=<pid>`; a process that finds another pid there is a descendant and writes a pid-named
//!   file, so no profile overwrites another.

use std::sync::OnceLock;

use mslprof_format::LoadBias;
use mslprof_format::model::IncompleteCause;
use mslprof_loader_hooks::{LoadCause, LoaderEvents, LoaderScan, ModuleInfo, ProcessEnd};

use crate::config::Settings;
use crate::dump::{self, DUMP};
use crate::ending::ENDING;
use crate::fork_reset::{self, ForkOwner};
use crate::modules::{self, LiveModule, ModulePolicy};
use crate::{mcount, sampler, sys};

/// The events handler installed into loader-hooks, with the settings read at start-up.
pub struct Lifecycle {
    settings: OnceLock<&'static Settings>,
}

pub static LIFECYCLE: Lifecycle = Lifecycle {
    settings: OnceLock::new(),
};

/// Environment variable marking the process that started profiling.
const ROOT_MARKER: &str = "MSLPROF_ROOT_PID";

/// Starts the loader events (called once profiling is active): decides whether this is the root process,
/// then installs the hooks, whose start-up scan is compared with the table built at start-up.
pub fn install(settings: &'static Settings) {
    let _ = LIFECYCLE.settings.set(settings);
    let pid = sys::getpid().to_string();
    match std::env::var_os(ROOT_MARKER) {
        Some(root) => ENDING.set_descendant(root.as_encoded_bytes() != pid.as_bytes()),
        // libc's setenv calls realloc through libc's own PLT: a call of the runtime's, not counted.
        None => mcount::uncounted(|| sys::set_environment_variable(ROOT_MARKER, &pid)),
    }
    DUMP.prepare_output_path(settings);
    fork_reset::install(reset_counts_after_fork);
    mslprof_loader_hooks::install(&LIFECYCLE);
}

/// Called by the normal exit dump: `exit` from a thread other than the main one is an incomplete profile
/// (cause 3), since the other threads were still running.
pub fn note_normal_exit() {
    // Threads that still run while the process exits stop counting calls: the dump is the state at exit.
    mcount::set_paused(true);
    sampler::attribute_parked_samples();
    if !ENDING.is_incomplete()
        && !mslprof_loader_hooks::on_main_thread()
        && other_threads_still_run()
    {
        ENDING.record(IncompleteCause::ExitFromThread, 0, false);
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
    module.load_bias == info.load_bias()
        && module.info.path == info.path
        && module.info.exec_ranges == info.exec_ranges
        && module.info.is_vdso == info.is_vdso
}

impl LoaderEvents for Lifecycle {
    fn modules_changed(&self, scan: &LoaderScan, _cause: LoadCause) {
        let Some(settings) = self.settings.get() else {
            return;
        };
        // Samples still in task-clock rings go to the modules they were taken in, before any is unloaded.
        if sampler::is_sampling() {
            sampler::drain_rings();
        }
        let policy = ModulePolicy {
            selection: &settings.selection,
            bucket_bits: settings.bucket_bits,
        };
        let unloaded = modules::update(&policy, |table| {
            // Loaded modules by (bias, path): a few hundred at most, compared in one pass each way.
            let mut loaded: std::collections::HashMap<(LoadBias, &[u8]), Vec<&'static LiveModule>> =
                std::collections::HashMap::new();
            for module in table.loaded() {
                loaded
                    .entry((module.load_bias, module.info.path.as_slice()))
                    .or_default()
                    .push(module);
            }
            let mut still_loaded = std::collections::HashSet::new();
            let mut added = Vec::new();
            for info in &scan.modules {
                let known = loaded
                    .get(&(info.load_bias(), info.path.as_slice()))
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
            let unloaded = !gone.is_empty();
            for key in gone {
                table.unload(key);
            }
            for info in added {
                table.add(info.clone());
            }
            unloaded
        });
        if unloaded {
            mcount::note_unload();
        }
        sampler::attribute_parked_samples();
    }

    fn before_fork(&self) {
        DUMP.note_fork_time();
    }

    /// Only what cannot wait until the child first records (`fork_reset`), in the fork section
    /// (loader-hooks' fork.rs: each page a child touches costs a fault).
    #[unsafe(link_section = "mslprof_fork_text")]
    fn after_fork_in_child(&self) {
        // First: a rewrite of code the parent had under way is finished, before any code of the
        // program's runs in the child.
        mcount::sites::finish_round_after_fork();
        crate::perf_map::copy_after_fork();
        // The child's profile covers only the child: it starts afresh. What cannot wait is done now (every
        // call to the slow path, the child's timer); the rest when the child first records, if ever
        // (`fork_reset`: a child that only execs or exits never pays for it).
        let own = mcount::reset_thread_after_fork();
        fork_reset::mark_pending(own);
        // Last: it starts the child's own sampling.
        sampler::arm_child_after_fork();
    }

    /// In the fork section: a forked child that recorded nothing ends here, and leaves no file however it ends.
    #[unsafe(link_section = "mslprof_fork_text")]
    fn process_ending(&self, end: ProcessEnd) {
        if !fork_reset::pending() {
            self.end(end);
        }
    }
}

impl Lifecycle {
    /// The end of a process that recorded something: its profile.
    #[inline(never)]
    fn end(&self, end: ProcessEnd) {
        let (cause, signal) = match end {
            ProcessEnd::ExitFromThread => (IncompleteCause::ExitFromThread, 0),
            ProcessEnd::UnderscoreExit { .. } => (IncompleteCause::UnderscoreExit, 0),
            ProcessEnd::Signal { signal } => (IncompleteCause::Signal, signal as u32),
            ProcessEnd::Exec => (IncompleteCause::Exec, 0),
        };
        let Some(settings) = self.settings.get() else {
            return;
        };
        if !matches!(end, ProcessEnd::Signal { .. }) {
            // Not from a signal handler, whose mask may block SIGPROF whatever the program's.
            sampler::note_if_sigprof_blocked();
        }
        let pre_exec = matches!(end, ProcessEnd::Exec);
        // A child that only forked and execs (shells, make) recorded nothing: it leaves no file.
        if pre_exec && !recorded_anything() {
            return;
        }
        ENDING.record(cause, signal, pre_exec);
        if matches!(
            end,
            ProcessEnd::Signal { .. } | ProcessEnd::UnderscoreExit { .. }
        ) {
            // Possibly inside a signal handler that interrupted malloc: no heap from here on.
            dump::write_without_heap(settings);
            return;
        }
        sampler::attribute_parked_samples();
        let paused_before = mcount::is_paused();
        mcount::set_paused(true);
        dump::write_at_exit(settings);
        mcount::set_paused(paused_before);
        if pre_exec {
            // If the exec fails the image goes on: it counts on and dumps again, normally, at its end.
            ENDING.clear();
            DUMP.allow_another_dump();
            sampler::resume();
        }
    }
}

/// A forked child's drop of the parent's counts, keeping those of the forking thread (`own`), before its first
/// count (`fork_reset::settle`).
fn reset_counts_after_fork(own: ForkOwner) {
    ENDING.reset_after_fork();
    DUMP.restart_after_fork();
    sampler::SAMPLER.reset_counts_after_fork();
    modules::reset_samples_after_fork();
    crate::stacks::reset_after_fork();
    mcount::reset_counts_after_fork(own);
    if let Some(settings) = LIFECYCLE.settings.get() {
        DUMP.prepare_child_path(settings);
    }
}

/// Whether this image has counted a sample or a call since it started (or forked).
fn recorded_anything() -> bool {
    if fork_reset::pending() {
        return false;
    }
    sampler::SAMPLER.total_samples() != 0 || modules::all().iter().any(|m| !m.arcs.is_empty())
}
