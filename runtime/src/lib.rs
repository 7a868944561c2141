//! libmslprof.so: the sampler, the mcount family and the dump at exit.
//!
//! The runtime starts from an ELF constructor, or earlier from the first interposed call (`pthread_create`,
//! `sigaction`, `signal`) that another library's constructor makes, so it does not depend on the order in
//! which constructors run. See runtime/README.md for the environment variables.

pub mod arcs;
pub mod config;
pub mod dump;
pub mod ending;
pub mod exports;
mod fork_reset;
pub mod glibc_gmon;
pub mod histogram;
pub mod lifecycle;
pub mod mcount;
pub mod modules;
pub mod on_demand;
mod page_marks;
mod perf_map;
pub mod program_sigprof;
mod reexec;
mod ring_drainer;
pub mod sampler;
pub mod selection;
pub mod smonitor;
pub mod stacks;
pub mod status;
mod sys;
mod task_clock;
mod unwind_tables;

use std::sync::atomic::Ordering;

use mslprof_format::{LinkAddress, RuntimeAddress};

use modules::ModulePolicy;
use status::{ACTIVE, EMBEDDED, INERT, NOT_STARTED, STARTING, STATE};
pub use status::{is_active, settings};

/// Fibonacci hashing's multiplier (2^64 / the golden ratio): the runtime's hash tables multiply by it to spread
/// addresses and keys over their slots.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

/// The policy for modules that join the table (start-up scan, and later loads).
pub fn module_policy() -> Option<ModulePolicy<'static>> {
    settings().map(|s| ModulePolicy {
        selection: &s.selection,
        bucket_bits: s.bucket_bits,
    })
}

/// Starts profiling once, unless the process must stay untouched. True when profiling is active.
/// Safe to call from any interposer: a call made while start-up is in progress (on this or another thread)
/// returns false at once instead of waiting.
///
/// Before libc's own initialiser has run (its `environ` still null) nothing starts: the environment, which
/// holds every setting, cannot be read yet. Calls that early come from code that ld.so runs while it relocates
/// (IFUNC resolvers calling through PLT-counting stubs under `LD_AUDIT`, rustc's libraries among them); the
/// next call after libc's initialiser, or the runtime's own constructor, starts the runtime.
pub fn ensure_started() -> bool {
    match STATE.load(Ordering::Acquire) {
        ACTIVE => return true,
        STARTING | INERT | EMBEDDED => return false,
        _ => {}
    }
    if !sys::environment_ready() {
        return false;
    }
    claim_start(&[NOT_STARTED], false)
}

/// Starts profiling in a process that links the runtime statically (tests of the runtime itself); the
/// constructor leaves such processes alone.
pub fn start_explicitly() -> bool {
    claim_start(&[NOT_STARTED, EMBEDDED], true)
}

/// Moves STATE from one of `from` to STARTING, starts, and stores the outcome. True when active.
fn claim_start(from: &[u8], explicit: bool) -> bool {
    let claimed = from.iter().any(|&state| {
        STATE
            .compare_exchange(state, STARTING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    });
    if !claimed {
        return STATE.load(Ordering::Acquire) == ACTIVE;
    }
    let outcome = std::panic::catch_unwind(|| start(explicit)).unwrap_or_else(|_| {
        sys::stderr_line(&[b"mslprof: internal error at start-up; profiling is off\n"]);
        INERT
    });
    STATE.store(outcome, Ordering::Release);
    outcome == ACTIVE
}

/// Starts profiling; returns the new state.
fn start(explicit: bool) -> u8 {
    if sys::is_secure_execution() {
        // setuid/setgid: never read the environment's choices, never write a file.
        return INERT;
    }
    let scan = mslprof_loader_hooks::scan();
    let here = RuntimeAddress::from_usize(ensure_started as *const () as usize);
    let inside_main_program = scan.modules.iter().any(|m| {
        let LinkAddress(here) = m.load_bias().link_address(here);
        m.is_main
            && m.exec_ranges
                .iter()
                .any(|r| (r.start..r.end).contains(&here))
    });
    if inside_main_program && !explicit {
        // Linked into an executable as an rlib (the runtime's own tests): not a profiling session.
        return EMBEDDED;
    }
    let settings = status::settings_from_environment();
    let policy = ModulePolicy {
        selection: &settings.selection,
        bucket_bits: settings.bucket_bits,
    };
    stacks::configure(settings.stack_depth);
    modules::update(&policy, |table| {
        for info in scan.modules {
            table.add(info);
        }
    });
    // Before the copy of `mcount` takes the main program's GOT entries: the sites are found by them.
    #[cfg(target_arch = "x86_64")]
    let looks_for_hot_functions = {
        use mcount::sites::Rewrite;
        let (pg_modules, rewrite) = match settings.site_stubs {
            config::SiteStubs::Off => (&[][..], Rewrite::WhenHot),
            config::SiteStubs::WhenHot => (modules::all(), Rewrite::WhenHot),
            config::SiteStubs::AtStartUp => (modules::all(), Rewrite::AtStartUp),
        };
        let plt_sites = settings.plt_sites && mcount::plt_counting_announced();
        let sites = mcount::install_site_stubs(pg_modules, rewrite, plt_sites);
        // Sites kept for the looks, or PLT sites to look for.
        (rewrite == Rewrite::WhenHot && sites > 0) || mcount::plt_sites::wanted()
    };
    #[cfg(target_arch = "x86_64")]
    if settings.near_mcount {
        mcount::near::redirect_main_program(modules::all());
    }
    perf_map::write_at_start_up();
    dump::DUMP.note_start();
    if stacks::start(settings.stack_table_kb) {
        stacks::note_thread_stack();
    }
    if sampler::wants_stack_rings(settings.hz) {
        ring_drainer::start();
    }
    if !sampler::start(settings.hz) {
        sys::stderr_line(&[b"mslprof: cannot install the SIGPROF handler; profiling is off\n"]);
        return INERT;
    }
    stacks::note_signal_restorer();
    #[cfg(target_arch = "x86_64")]
    if looks_for_hot_functions {
        sampler::start_look_timer();
    }
    sys::at_exit(dump_at_exit);
    lifecycle::install(settings);
    on_demand::start_from_environment();
    ACTIVE
}

extern "C" fn dump_at_exit() {
    let result = std::panic::catch_unwind(|| {
        if let Some(settings) = settings() {
            lifecycle::note_normal_exit();
            sampler::note_if_sigprof_blocked();
            dump::write_at_exit(settings);
        }
    });
    if result.is_err() {
        internal_fault(b"the dump at exit");
    }
}

/// Turns profiling off after an internal error: one stderr line, and the program carries on.
pub fn internal_fault(what: &[u8]) {
    sampler::stop_and_quiesce();
    status::turn_off(what);
}

/// glibc calls `.init_array` functions with the program's `argc`, `argv` and `envp`.
extern "C" fn constructor(
    _argc: std::os::raw::c_int,
    _argv: *const *const std::os::raw::c_char,
    envp: *mut *const std::os::raw::c_char,
) {
    // Only while not started may LD_PROFILE restart the program without glibc's own profiler (reexec.rs):
    // a timer of ours would survive the execve.
    let may_execute = STATE.load(Ordering::Acquire) == NOT_STARTED;
    if std::panic::catch_unwind(|| reexec::before_start(envp, may_execute)).is_err() {
        sys::stderr_line(&[b"mslprof: internal error in the LD_PROFILE restart; carrying on\n"]);
    }
    // libc (a dependency) is initialised by now, even if another constructor has emptied `environ` since.
    if STATE.load(Ordering::Acquire) == NOT_STARTED {
        claim_start(&[NOT_STARTED], false);
    }
    // Read at start-up (or not at all: inert or embedded), and for no other process.
    reexec::hide_variable(envp, config::SELECTION_OPTION.as_bytes());
}

/// Runs [`constructor`] when the library is loaded, before `main`.
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn(
    std::os::raw::c_int,
    *const *const std::os::raw::c_char,
    *mut *const std::os::raw::c_char,
) = constructor;
