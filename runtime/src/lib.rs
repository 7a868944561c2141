//! libmslprof.so: the sampler, the mcount family and the dump at exit.
//!
//! The runtime starts from an ELF constructor, or earlier from the first interposed call (`pthread_create`,
//! `sigaction`, `signal`) that another library's constructor makes, so it does not depend on the order in
//! which constructors run. See runtime/README.md for the environment variables.

pub mod config;
pub mod dump;
pub mod histogram;
mod interpose;
pub mod modules;
pub mod program_sigprof;
pub mod sampler;
pub mod selection;
mod sys;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use config::Settings;
use modules::ModulePolicy;

const NOT_STARTED: u8 = 0;
const STARTING: u8 = 1;
const ACTIVE: u8 = 2;
const INERT: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(NOT_STARTED);
static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// The settings read at start-up (`None` before, or when the runtime is inert).
pub fn settings() -> Option<&'static Settings> {
    SETTINGS.get()
}

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
pub fn ensure_started() -> bool {
    match STATE.load(Ordering::Acquire) {
        ACTIVE => return true,
        STARTING | INERT => return false,
        _ => {}
    }
    if STATE
        .compare_exchange(NOT_STARTED, STARTING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return STATE.load(Ordering::Acquire) == ACTIVE;
    }
    let started = std::panic::catch_unwind(|| start(false)).unwrap_or_else(|_| {
        sys::stderr_line(&[b"mslprof: internal error at start-up; profiling is off\n"]);
        false
    });
    STATE.store(if started { ACTIVE } else { INERT }, Ordering::Release);
    started
}

/// Starts profiling in a process that links the runtime statically (tests of the runtime itself); the
/// constructor leaves such processes alone.
pub fn start_explicitly() -> bool {
    if STATE
        .compare_exchange(NOT_STARTED, STARTING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return STATE.load(Ordering::Acquire) == ACTIVE;
    }
    let started = start(true);
    STATE.store(if started { ACTIVE } else { INERT }, Ordering::Release);
    started
}

fn start(explicit: bool) -> bool {
    if sys::is_secure_execution() {
        // setuid/setgid: never read the environment's choices, never write a file.
        return false;
    }
    let scan = mslprof_loader_hooks::scan();
    let here = ensure_started as *const () as usize;
    let inside_main_program = scan.modules.iter().any(|m| {
        m.is_main
            && m.exec_ranges
                .iter()
                .any(|r| (r.start..r.end).contains(&(here.wrapping_sub(m.bias) as u64)))
    });
    if inside_main_program && !explicit {
        // Linked into an executable as an rlib (the runtime's own tests): not a profiling session.
        return false;
    }
    let settings = SETTINGS.get_or_init(Settings::from_environment);
    let policy = ModulePolicy {
        selection: &settings.selection,
        bucket_bits: settings.bucket_bits,
    };
    modules::update(&policy, |table| {
        for info in scan.modules {
            table.add(info);
        }
    });
    dump::note_start();
    if !sampler::start(settings.hz) {
        sys::stderr_line(&[b"mslprof: cannot install the SIGPROF handler; profiling is off\n"]);
        return false;
    }
    sys::at_exit(dump_at_exit);
    true
}

extern "C" fn dump_at_exit() {
    let result = std::panic::catch_unwind(|| {
        if let Some(settings) = settings() {
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
    STATE.store(INERT, Ordering::Release);
    sys::stderr_line(&[
        b"mslprof: internal error in ",
        what,
        b"; profiling is off\n",
    ]);
}

extern "C" fn constructor() {
    ensure_started();
}

/// Runs [`constructor`] when the library is loaded, before `main`.
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = constructor;
