//! The program's view of its signal actions: for each signal that mslprof handles itself (the fatal ones in
//! signals.rs, SIGPROF in the runtime's `program_sigprof.rs`), the action the program last set with
//! `sigaction`/`signal`, or the one that was there when mslprof took the signal over.
//!
//! mslprof installs its own real action for those signals, and answers the program's `sigaction` queries from
//! here, so the program always sees the disposition it set; a delivery that is the program's is passed on
//! with [`ProgramAction::deliver`] and [`call_handler`], as the kernel would have. Readable from
//! a signal handler (atomics only). There is no per-process state: a forked child inherits its parent's
//! actions, as it does from the kernel.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::sys::{self, MASK_WORDS, SignalAction, SignalInfo, SignalMask};

/// Highest signal number (exclusive) kept: the classic signals, SIGPROF among them.
const MAX_SIGNAL: usize = 32;

/// One signal's action as the program believes it to be.
pub struct ProgramAction {
    handler: AtomicUsize,
    flags: AtomicI32,
    mask: [AtomicU64; MASK_WORDS],
}

/// What one delivery of a signal does under the program's action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// SIG_IGN: nothing.
    Ignore,
    /// SIG_DFL: the signal's default action.
    Default,
    /// The program's handler, with the flags it was installed with.
    Handler { handler: usize, flags: c_int },
}

static ACTIONS: [ProgramAction; MAX_SIGNAL] = [const { ProgramAction::new() }; MAX_SIGNAL];

/// The program's action for `signal` (None for signals this table does not keep).
pub fn of(signal: c_int) -> Option<&'static ProgramAction> {
    ACTIONS.get(usize::try_from(signal).ok()?)
}

impl ProgramAction {
    const fn new() -> Self {
        ProgramAction {
            handler: AtomicUsize::new(0),
            flags: AtomicI32::new(0),
            mask: [const { AtomicU64::new(0) }; MASK_WORDS],
        }
    }

    /// Records `action` as the program's.
    pub fn record(&self, action: &SignalAction) {
        self.handler.store(action.sa_sigaction, Ordering::Relaxed);
        self.flags.store(action.sa_flags, Ordering::Relaxed);
        for (slot, word) in self.mask.iter().zip(sys::mask_words(&action.sa_mask)) {
            slot.store(word, Ordering::Relaxed);
        }
    }

    /// The program's action, as `sigaction` reports it.
    pub fn current(&self) -> SignalAction {
        let mut action = sys::empty_action();
        action.sa_sigaction = self.handler.load(Ordering::Relaxed);
        action.sa_flags = self.flags.load(Ordering::Relaxed);
        action.sa_mask = self.mask();
        action
    }

    /// The program's handler value (`SIG_DFL`, `SIG_IGN` or a function).
    pub fn handler(&self) -> usize {
        self.handler.load(Ordering::Relaxed)
    }

    /// The mask the program's handler runs with (besides the signal itself).
    pub fn mask(&self) -> SignalMask {
        let mut words = [0u64; MASK_WORDS];
        for (word, slot) in words.iter_mut().zip(&self.mask) {
            *word = slot.load(Ordering::Relaxed);
        }
        sys::mask_from_words(&words)
    }

    /// `sigaction(2)` on the program's view: gives the current action through `old`, then records `action`.
    /// Returns whether a new action was recorded.
    ///
    /// # Safety
    /// `action` and `old` are null or valid, as for `sigaction(2)`.
    pub unsafe fn exchange(&self, action: *const SignalAction, old: *mut SignalAction) -> bool {
        // SAFETY: the caller passes null or a valid pointer.
        if let Some(old) = unsafe { old.as_mut() } {
            *old = self.current();
        }
        // SAFETY: the caller passes null or a valid pointer.
        match unsafe { action.as_ref() } {
            Some(action) => {
                self.record(action);
                true
            }
            None => false,
        }
    }

    /// What a delivery does now, deciding it as the kernel does: an SA_RESETHAND handler is reset to SIG_DFL
    /// (its flags stay) before it runs. Async-signal-safe.
    pub fn deliver(&self) -> Delivery {
        let handler = self.handler.load(Ordering::Relaxed);
        let flags = self.flags.load(Ordering::Relaxed);
        if handler == sys::SIG_IGN {
            Delivery::Ignore
        } else if handler == sys::SIG_DFL {
            Delivery::Default
        } else {
            if flags & sys::SA_RESETHAND != 0 {
                self.handler.store(sys::SIG_DFL, Ordering::Relaxed);
            }
            Delivery::Handler { handler, flags }
        }
    }
}

/// Calls the program's `handler` (from [`ProgramAction::deliver`]) in the form its flags say, SA_SIGINFO or
/// plain. The program's mask must already be in force.
///
/// # Safety
/// `handler` and `flags` come from [`Delivery::Handler`] for `signal`; `info` and `context` are the kernel's
/// for this delivery.
pub unsafe fn call_handler(
    handler: usize,
    flags: c_int,
    signal: c_int,
    info: *mut SignalInfo,
    context: *mut c_void,
) {
    // SAFETY: the program installed `handler` for `signal` with these flags (caller's guarantee).
    unsafe {
        sys::call_program_handler(handler, flags & sys::SA_SIGINFO != 0, signal, info, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn plain(_: c_int) {}

    /// [`plain`] as a handler value.
    fn plain_handler() -> usize {
        plain as *const () as usize
    }

    /// A handler value as the program would pass it.
    fn action(handler: usize, flags: c_int, blocked: c_int) -> SignalAction {
        let mut action = sys::empty_action();
        action.sa_sigaction = handler;
        action.sa_flags = flags;
        action.sa_mask = sys::mask_from_words(&{
            let mut words = [0u64; MASK_WORDS];
            words[0] = 1 << (blocked - 1);
            words
        });
        action
    }

    fn same(a: &SignalAction, b: &SignalAction) -> bool {
        a.sa_sigaction == b.sa_sigaction
            && a.sa_flags == b.sa_flags
            && sys::mask_words(&a.sa_mask) == sys::mask_words(&b.sa_mask)
    }

    #[test]
    fn exchange_answers_like_sigaction_and_keeps_handler_flags_and_mask() {
        let program = ProgramAction::new();
        let first = action(plain_handler(), sys::SA_RESTART, sys::SIGINT);
        let mut old = action(1234, 0, sys::SIGHUP);
        // SAFETY: valid pointers.
        assert!(unsafe { program.exchange(&first, &mut old) });
        assert!(
            same(&old, &sys::empty_action()),
            "SIG_DFL before anything was recorded"
        );
        // A query records nothing and reports what was set.
        // SAFETY: null action, valid old.
        assert!(!unsafe { program.exchange(std::ptr::null(), &mut old) });
        assert!(same(&old, &first));
        assert!(same(&program.current(), &first));
        assert_eq!(program.handler(), plain_handler());
        assert_eq!(
            sys::mask_words(&program.mask()),
            sys::mask_words(&first.sa_mask)
        );
    }

    #[test]
    fn deliver_decides_as_the_kernel_does() {
        let program = ProgramAction::new();
        assert_eq!(program.deliver(), Delivery::Default);
        program.record(&action(sys::SIG_IGN, 0, sys::SIGINT));
        assert_eq!(program.deliver(), Delivery::Ignore);
        let flags = sys::SA_RESTART | sys::SA_SIGINFO;
        program.record(&action(plain_handler(), flags, sys::SIGINT));
        for _ in 0..2 {
            let handler = plain_handler();
            assert_eq!(program.deliver(), Delivery::Handler { handler, flags });
        }
        // SA_RESETHAND: this delivery runs the handler, the next one gets the default action; the flags stay
        // (what `sigaction` reports afterwards without mslprof too).
        let flags = sys::SA_RESETHAND | sys::SA_RESTART;
        program.record(&action(plain_handler(), flags, sys::SIGINT));
        let handler = plain_handler();
        assert_eq!(program.deliver(), Delivery::Handler { handler, flags });
        assert_eq!(program.deliver(), Delivery::Default);
        assert_eq!(program.current().sa_flags, flags);
    }

    #[test]
    fn every_classic_signal_has_its_own_slot() {
        let term = of(sys::SIGTERM).unwrap();
        let prof = of(sys::SIGPROF).unwrap();
        assert!(!std::ptr::eq(term, prof));
        assert!(of(-1).is_none() && of(MAX_SIGNAL as c_int).is_none());
    }
}
