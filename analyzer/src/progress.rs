//! A progress line for work that takes more than a second (reading the symbols of a rustc- or LLVM-sized
//! library takes several): shown on standard error only when it is a terminal and `CI` is not set, so pipes,
//! files and CI logs never see it. The line is cleared when the work ends.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long work runs before its progress is shown, and how often the line is redrawn.
const SHOW_AFTER: Duration = Duration::from_secs(1);
const REDRAW_EVERY: Duration = Duration::from_millis(200);

/// What the work is doing now, shared with the thread that draws it.
struct State {
    now: Mutex<String>,
    done: AtomicBool,
}

/// Progress of one piece of work; dropping it ends the line.
pub struct Progress {
    state: Arc<State>,
    drawer: Option<std::thread::JoinHandle<bool>>,
}

/// Whether progress may be drawn: standard error is a terminal and this is not a CI run.
pub fn wanted(stderr_is_terminal: bool, ci: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && ci.is_none_or(|value| value.is_empty())
}

impl Progress {
    /// Starts tracking work whose steps are named with [`Progress::now`].
    pub fn start() -> Progress {
        let state = Arc::new(State {
            now: Mutex::new(String::new()),
            done: AtomicBool::new(false),
        });
        let drawer = wanted(
            std::io::stderr().is_terminal(),
            std::env::var_os("CI").as_deref(),
        )
        .then(|| {
            let state = Arc::clone(&state);
            std::thread::spawn(move || draw(&state))
        });
        Progress { state, drawer }
    }

    /// The step the work is at (e.g. "reading the symbols of libLLVM.so.19 (3 of 13)").
    pub fn now(&self, step: String) {
        if self.drawer.is_some()
            && let Ok(mut now) = self.state.now.lock()
        {
            *now = step;
        }
    }
}

/// Draws the line from [`SHOW_AFTER`] on until the work is done; whether anything was drawn.
fn draw(state: &State) -> bool {
    let mut waited = Duration::ZERO;
    let mut drawn = false;
    while !state.done.load(Ordering::Acquire) {
        std::thread::sleep(REDRAW_EVERY);
        waited += REDRAW_EVERY;
        if waited < SHOW_AFTER || state.done.load(Ordering::Acquire) {
            continue;
        }
        let step = state.now.lock().map(|now| now.clone()).unwrap_or_default();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[Kmslprof: {step}");
        let _ = err.flush();
        drawn = true;
    }
    drawn
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.state.done.store(true, Ordering::Release);
        if let Some(drawer) = self.drawer.take()
            && drawer.join().unwrap_or(false)
        {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_drawn_only_on_a_terminal_outside_ci() {
        assert!(wanted(true, None));
        assert!(wanted(true, Some(std::ffi::OsStr::new(""))));
        assert!(!wanted(true, Some(std::ffi::OsStr::new("true"))));
        assert!(!wanted(false, None));
    }

    #[test]
    fn work_that_ends_at_once_draws_nothing() {
        let progress = Progress::start();
        progress.now("nothing".into());
        drop(progress);
    }
}
