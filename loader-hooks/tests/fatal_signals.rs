//! loader-hooks' fatal-signal path in a real process, without the runtime: a forked child installs the hooks
//! with an event handler that reports on a pipe, sets a program handler through the same entry the runtime's
//! `sigaction` interposer uses, and raises signals. The parent reads what happened and how the child ended.

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};

use mslprof_loader_hooks::signals;
use mslprof_loader_hooks::{LoadCause, LoaderEvents, LoaderScan, ProcessEnd};

/// The pipe's write end in the child.
static REPORT_FD: AtomicI32 = AtomicI32::new(-1);

fn report(bytes: &[u8]) {
    // SAFETY: a valid buffer; write(2) is async-signal-safe.
    unsafe {
        libc::write(
            REPORT_FD.load(Ordering::Relaxed),
            bytes.as_ptr().cast(),
            bytes.len(),
        )
    };
}

struct Recorder;

impl LoaderEvents for Recorder {
    fn modules_changed(&self, _: &LoaderScan, _: LoadCause) {}

    fn process_ending(&self, end: ProcessEnd) {
        if let ProcessEnd::Signal { signal } = end {
            report(&[b'E', signal as u8]);
        }
    }
}

static RECORDER: Recorder = Recorder;

extern "C" fn program_handler(_: c_int) {
    report(b"H");
}

/// The child: a one-shot SIGTERM handler (SA_RESETHAND), raised twice.
fn child() -> ! {
    assert!(mslprof_loader_hooks::install(&RECORDER));
    assert!(signals::is_watched(libc::SIGTERM));
    // SAFETY: all-zero is a valid sigaction.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = program_handler as *const () as usize;
    action.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
    // SAFETY: valid pointers, as the runtime's interposer passes them.
    let set = unsafe { signals::program_sigaction(libc::SIGTERM, &action, std::ptr::null_mut()) };
    assert_eq!(set, Some(0));
    // SAFETY: raising a signal has no memory preconditions.
    unsafe { libc::raise(libc::SIGTERM) };
    // SAFETY: all-zero is a valid sigaction.
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query: null action, valid old.
    unsafe { signals::program_sigaction(libc::SIGTERM, std::ptr::null(), &mut now) };
    // What the kernel reports after a one-shot delivery: SIG_DFL, the flags as they were.
    let reset = now.sa_sigaction == libc::SIG_DFL && now.sa_flags & libc::SA_RESETHAND != 0;
    report(if reset { b"R" } else { b"r" });
    // SAFETY: as above; this one takes the default action: the profile's event, then death by SIGTERM.
    unsafe { libc::raise(libc::SIGTERM) };
    report(b"survived");
    // SAFETY: ends the child without running the test harness's exit path.
    unsafe { libc::syscall(libc::SYS_exit_group, 0) };
    unreachable!()
}

#[test]
fn a_one_shot_program_handler_runs_once_then_the_signal_is_dumped_and_kills() {
    let mut fds = [0; 2];
    // SAFETY: a valid array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only runs `child`, which never returns.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        REPORT_FD.store(fds[1], Ordering::Relaxed);
        // A failed assertion must not unwind into the copy of the test harness.
        if std::panic::catch_unwind(|| child()).is_err() {
            // SAFETY: ends the child at once.
            unsafe { libc::syscall(libc::SYS_exit_group, 101) };
        }
    }
    // SAFETY: our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut status = 0;
    // SAFETY: valid pointer to our status.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    let mut seen = Vec::new();
    let mut buffer = [0u8; 64];
    loop {
        // SAFETY: reads into our buffer.
        let n = unsafe { libc::read(fds[0], buffer.as_mut_ptr().cast(), buffer.len()) };
        if n <= 0 {
            break;
        }
        seen.extend_from_slice(&buffer[..n as usize]);
    }
    assert_eq!(
        seen,
        [b'H', b'R', b'E', libc::SIGTERM as u8],
        "handler once, reset reported as the kernel does, then the signal's event: {}",
        String::from_utf8_lossy(&seen)
    );
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGTERM,
        "the child ended by SIGTERM, as without mslprof (status {status:#x})"
    );
}
