//! Whether profiling is on in this process, and the settings it started with: the one record every part of
//! the runtime may consult (it depends on nothing but `config` and `sys`). The crate root moves it through
//! its states at start-up; an internal fault anywhere turns profiling off here.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::config::Settings;
use crate::sys;

pub const NOT_STARTED: u8 = 0;
pub const STARTING: u8 = 1;
pub const ACTIVE: u8 = 2;
pub const INERT: u8 = 3;
/// Linked into an executable as an rlib (the runtime's own tests): only an explicit start starts it.
pub const EMBEDDED: u8 = 4;

/// One of the states above.
pub static STATE: AtomicU8 = AtomicU8::new(NOT_STARTED);
static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// The settings read at start-up (`None` before, or when the runtime is inert).
pub fn settings() -> Option<&'static Settings> {
    SETTINGS.get()
}

/// The settings, read from the environment on first use (at start-up).
pub fn settings_from_environment() -> &'static Settings {
    SETTINGS.get_or_init(Settings::from_environment)
}

/// Whether profiling is active in this process.
pub fn is_active() -> bool {
    STATE.load(Ordering::Acquire) == ACTIVE
}

/// Marks profiling off after an internal error in `what`, with one stderr line (the caller stops whatever it
/// was running first). The program carries on.
pub fn turn_off(what: &[u8]) {
    STATE.store(INERT, Ordering::Release);
    sys::stderr_line(&[
        b"mslprof: internal error in ",
        what,
        b"; profiling is off\n",
    ]);
}
