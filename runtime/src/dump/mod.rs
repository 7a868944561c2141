//! The one dump pipeline: every mslprof file the runtime writes (at exit, before `exec`, on demand, from a
//! fatal signal or `_exit`) is a [`Moment`] of the process and its load instances, encoded by
//! [`build::encode`] into a temporary file renamed into place by [`file::write_through`].
//!
//! The entry points differ only in what they may do before that: [`write_at_exit`] and [`write_file`] build
//! the file name on the heap and report errors in words; [`write_without_heap`] (fatal signals and `_exit`,
//! which may interrupt code holding malloc's lock) uses the name prepared at start-up and after fork
//! ([`prepare_output_path`]) and nothing else. Which ending it was is read from [`crate::ending`].

pub mod build;
pub mod file;

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicUsize, Ordering};

use mslprof_format::model::{CpuTime, header_flags};

use crate::config::Settings;
use crate::ending::ENDING;
use crate::modules::{self, LiveModule};
use crate::{mcount, program_sigprof, sampler, sys};

pub use build::Moment;
use build::{EncodeError, Program};
use file::{FileError, PATH_BYTES};

/// An output path and its temporary name, both NUL-terminated, prepared while allocating is still fine (the
/// signal path cannot build them, and must not use much stack: it may run on a small alternate signal stack).
pub struct PreparedPath {
    final_path: UnsafeCell<[u8; PATH_BYTES]>,
    temporary: UnsafeCell<[u8; PATH_BYTES]>,
    /// Length of `final_path` without its NUL; 0: no file is to be written or nothing prepared yet.
    len: AtomicUsize,
    /// Length of `temporary` without its NUL.
    temporary_len: AtomicUsize,
}

// SAFETY: the buffers are written only by `prepare` (start-up, fork child: one thread at a time, after `len`
// was set to 0 and before it is published again with release ordering) and read after an acquire load of a
// non-zero `len`.
unsafe impl Sync for PreparedPath {}

impl PreparedPath {
    pub const fn new() -> PreparedPath {
        PreparedPath {
            final_path: UnsafeCell::new([0; PATH_BYTES]),
            temporary: UnsafeCell::new([0; PATH_BYTES]),
            len: AtomicUsize::new(0),
            temporary_len: AtomicUsize::new(0),
        }
    }

    /// Prepares `path` (none: no file) for process `pid`.
    pub fn prepare(&self, path: Option<&[u8]>, pid: u32) {
        match path {
            Some(path) => self.prepare_parts(Some(&[path]), pid),
            None => self.prepare_parts(None, pid),
        }
    }

    /// Prepares the path made of `parts` end to end (none: no file) for process `pid`. Allocates nothing.
    pub fn prepare_parts(&self, parts: Option<&[&[u8]]>, pid: u32) {
        self.len.store(0, Ordering::Release);
        let Some(parts) = parts else {
            return;
        };
        // SAFETY: see `PreparedPath`: `len` is 0, so no reader looks at the buffers until it is published.
        let (final_buffer, temporary_buffer) =
            unsafe { (&mut *self.final_path.get(), &mut *self.temporary.get()) };
        let mut len = 0;
        for part in parts {
            // Room for the NUL terminator.
            let Some(room) = final_buffer
                .get_mut(len..len + part.len())
                .filter(|_| len + part.len() < PATH_BYTES)
            else {
                return;
            };
            room.copy_from_slice(part);
            len += part.len();
        }
        let path = &final_buffer[..len];
        // A path with a NUL in it cannot be opened anyway.
        if path.is_empty() || path.contains(&0) {
            return;
        }
        let Some(temporary_len) = file::temporary_name(path, pid, 0, temporary_buffer) else {
            return;
        };
        final_buffer[len] = 0;
        self.temporary_len.store(temporary_len, Ordering::Relaxed);
        self.len.store(len, Ordering::Release);
    }

    /// The prepared (final, temporary) names with their NULs, if any.
    fn get(&self) -> Option<(&[u8], &[u8])> {
        let len = self.len.load(Ordering::Acquire);
        if len == 0 {
            return None;
        }
        let temporary_len = self.temporary_len.load(Ordering::Relaxed);
        // SAFETY: published before `len` (acquire above); rewritten only after a fork, in the child's own copy.
        Some(unsafe {
            (
                &(&*self.final_path.get())[..=len],
                &(&*self.temporary.get())[..=temporary_len],
            )
        })
    }
}

impl Default for PreparedPath {
    fn default() -> Self {
        PreparedPath::new()
    }
}

/// The dump's own state: who started profiling and when, whether the exit dump was written, and the output
/// path prepared for the signal path.
pub struct DumpRecord {
    dumped: AtomicBool,
    start_pid: AtomicU32,
    start_time_ns: AtomicI64,
    prepared: PreparedPath,
}

/// The time of the last fork (`CLOCK_REALTIME` ns), by [`DumpRecord::note_fork_time`]; with the state the fork
/// handlers write (loader-hooks' fork.rs).
#[unsafe(link_section = "mslprof_fork_data")]
static FORK_TIME_NS: AtomicI64 = AtomicI64::new(0);

/// The one dump record of this process.
pub static DUMP: DumpRecord = DumpRecord {
    dumped: AtomicBool::new(false),
    start_pid: AtomicU32::new(0),
    start_time_ns: AtomicI64::new(0),
    prepared: PreparedPath::new(),
};

impl DumpRecord {
    /// Remembers who started profiling and when (called once at start-up).
    pub fn note_start(&self) {
        self.start_pid.store(sys::getpid(), Ordering::Relaxed);
        self.restart_clock();
    }

    /// Profiling starts now, for the header's start time.
    fn restart_clock(&self) {
        self.start_time_ns
            .store(sys::clock_ns(sys::CLOCK_REALTIME), Ordering::Relaxed);
    }

    /// In the parent, just before it forks: the time a child made now starts at (read here, where the vDSO's
    /// page is mapped, rather than in the child, where it would be one more page fault).
    pub fn note_fork_time(&self) {
        FORK_TIME_NS.store(sys::clock_ns(sys::CLOCK_REALTIME), Ordering::Relaxed);
    }

    /// In a forked child, before its first count (`fork_reset`), whose profile covers only the child: its start
    /// time is the fork's, and it makes a dump of its own ([`DumpRecord::prepare_child_path`] names it).
    pub fn restart_after_fork(&self) {
        self.allow_another_dump();
        self.start_time_ns
            .store(FORK_TIME_NS.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// In a forked child, before its first count (`fork_reset`): its own pid-named path, put together without
    /// the heap (formatting it with `String`s was a fifth of the child's fork handler, most of it in the page
    /// faults of a first `malloc` in the child).
    pub fn prepare_child_path(&self, settings: &Settings) {
        let pid = sys::getpid();
        let mut digits = [0u8; 20];
        let pid_digits = file::decimal(u64::from(pid), &mut digits);
        match &settings.pid_named_parts {
            Some((before, after)) => self
                .prepared
                .prepare_parts(Some(&[before, pid_digits, after]), pid),
            None => self.prepared.prepare_parts(None, pid),
        }
    }

    /// Lets [`write_at_exit`] write again (an image whose exec failed after its pre-exec dump).
    pub fn allow_another_dump(&self) {
        self.dumped.store(false, Ordering::SeqCst);
    }

    /// Whether the dump at exit has been written (no snapshot may follow it).
    pub fn exit_dump_written(&self) -> bool {
        self.dumped.load(Ordering::SeqCst)
    }

    /// Whether this process is a forked child of the one that started profiling.
    pub fn in_forked_child(&self) -> bool {
        sys::getpid() != self.start_pid.load(Ordering::Relaxed)
    }

    /// Computes this process's output path for the signal path, now, while allocating is still fine.
    pub fn prepare_output_path(&self, settings: &Settings) {
        let pid = sys::getpid();
        let path = settings.output_path(pid, ENDING.writes_pid_named_file());
        self.prepared.prepare(path.as_deref(), pid);
    }
}

/// The header's view of the process now. Sampling should be stopped first (the sample period is measured up
/// to the stop).
pub fn moment() -> Moment {
    let ending = ENDING.header();
    let mut flags = ending.flags;
    if DUMP.in_forked_child() {
        flags |= header_flags::FORKED_CHILD;
    }
    if program_sigprof::shared() {
        flags |= header_flags::SAMPLING_SHARED_TIMER;
    }
    if sampler::sigprof_blocked() {
        flags |= header_flags::SIGPROF_BLOCKED;
    }
    Moment {
        pid: sys::getpid(),
        ppid: sys::getppid(),
        start_time_ns: DUMP.start_time_ns.load(Ordering::Relaxed),
        end_time_ns: sys::clock_ns(sys::CLOCK_REALTIME),
        sample_period_ns: sampler::measured_period_ns(),
        sampling_sources: sampler::sources(),
        total_samples: sampler::SAMPLER.total_samples(),
        unknown_samples: sampler::SAMPLER.unknown_samples(),
        cpu_time: sys::process_cpu_ns().map(|(user_ns, system_ns)| CpuTime { user_ns, system_ns }),
        flags,
        incomplete_cause: ending.cause,
        incomplete_signal: ending.signal,
    }
}

/// Whether a selected (profiled) module of this image has a sample or a call: a descendant that recorded
/// nothing in them (a wrapper's helper process) writes no file.
pub fn recorded_in_selected_modules() -> bool {
    !crate::fork_reset::pending()
        && modules::all()
            .iter()
            .any(|m| m.profiled && build::recorded(m))
}

fn program(settings: &Settings) -> Program<'_> {
    Program {
        name: &settings.program_name,
        hz: settings.hz,
    }
}

/// Encodes into an open temporary file; errno on failure.
///
/// # Safety
/// Sampling must be stopped and quiesced.
unsafe fn fill(
    program: Program<'_>,
    moment: &Moment,
    all: &[&'static LiveModule],
    sink: &mut file::FdSink,
) -> Result<(), i32> {
    // SAFETY: the caller keeps sampling quiesced.
    unsafe { build::encode(program, moment, all, sink) }.map_err(|error| match error {
        EncodeError::NoMemory => libc::ENOMEM,
        EncodeError::Stream(mslprof_format::stream::StreamError::Sink(errno)) => errno,
        EncodeError::Stream(mslprof_format::stream::StreamError::Invalid(_)) => libc::EINVAL,
    })
}

/// Writes the profile of `all` at `moment` to `path` (no NUL), through a fresh temporary file.
///
/// # Safety
/// Sampling must be stopped and quiesced.
pub unsafe fn write_named(
    program: Program<'_>,
    moment: &Moment,
    all: &[&'static LiveModule],
    path: &[u8],
) -> Result<(), FileError> {
    if path.is_empty() || path.len() >= PATH_BYTES || path.contains(&0) {
        return Err(FileError::Create(libc::ENAMETOOLONG));
    }
    let final_path = [path, &[0]].concat();
    let mut temporary = vec![0u8; PATH_BYTES];
    let mut attempt = 0;
    loop {
        let len = file::temporary_name(path, moment.pid, attempt, &mut temporary)
            .ok_or(FileError::Create(libc::ENAMETOOLONG))?;
        // SAFETY: the caller keeps sampling quiesced.
        let written = file::write_through(&final_path, &temporary[..=len], |sink| unsafe {
            fill(program, moment, all, sink)
        });
        match written {
            Err(FileError::Create(libc::EEXIST)) if attempt < 100 => attempt += 1,
            other => return other,
        }
    }
}

/// Writes the profile of `all` at `moment` to the prepared path. Allocates nothing from the heap.
///
/// # Safety
/// Sampling must be stopped and quiesced.
pub unsafe fn write_prepared(
    program: Program<'_>,
    moment: &Moment,
    all: &[&'static LiveModule],
    prepared: &PreparedPath,
) -> Option<Result<(), FileError>> {
    let (final_path, temporary) = prepared.get()?;
    // SAFETY: the caller keeps sampling quiesced.
    Some(file::write_through(final_path, temporary, |sink| unsafe {
        fill(program, moment, all, sink)
    }))
}

/// One stderr line naming the file and the reason. Allocates (not for the signal path).
fn report(path: &[u8], error: FileError) {
    let text = std::io::Error::from_raw_os_error(error.errno()).to_string();
    sys::stderr_line(&[
        b"mslprof: cannot write ",
        path,
        b": ",
        text.as_bytes(),
        b"\n",
    ]);
}

/// Writes the profile once, at normal termination (or before `exec`). Later calls do nothing.
pub fn write_at_exit(settings: &Settings) {
    if DUMP.dumped.swap(true, Ordering::SeqCst) {
        return;
    }
    sampler::stop_and_quiesce();
    let pid = sys::getpid();
    let pid_named = DUMP.in_forked_child() || ENDING.writes_pid_named_file();
    // Only the root process speaks about the selection: in a wrapper's helper processes (a pyenv shim, a
    // shell, `timeout`) a name matching nothing is expected, and they are many.
    if !pid_named {
        for name in settings.selection.unmatched() {
            sys::stderr_line(&[
                b"mslprof: ",
                &settings.selection_source,
                b" name '",
                name,
                b"' matched no module\n",
            ]);
        }
    } else if !recorded_in_selected_modules() {
        // A descendant with nothing in a selected module leaves no file.
        return;
    }
    let Some(path) = settings
        .output_path(pid, pid_named)
        .map(|p| ENDING.output_path(p))
    else {
        return;
    };
    // Counts still held in the threads' call caches go into the arc tables first; unless an exec follows
    // (which may fail, and the image count on), this is the process's last dump.
    mcount::publish_cached_counts(!ENDING.is_pre_exec());
    let moment = moment();
    // SAFETY: sampling was stopped and quiesced above and is not resumed.
    if let Err(error) = unsafe { write_named(program(settings), &moment, modules::all(), &path) } {
        report(&path, error);
    }
}

/// Writes the profile so far to `path` (a snapshot; counting goes on). Errno on failure.
///
/// # Safety
/// Sampling must be stopped and quiesced for the duration of the call.
pub unsafe fn write_file(settings: &Settings, path: &[u8]) -> Result<(), i32> {
    mcount::publish_cached_counts(false);
    let moment = moment();
    // SAFETY: the caller keeps sampling quiesced.
    unsafe { write_named(program(settings), &moment, modules::all(), path) }
        .map_err(FileError::errno)
}

/// Writes the profile without touching the heap (fatal signals, `_exit`), to the prepared path. Returns false
/// if nothing could be written. The header's cause comes from the ending the caller recorded. As at exit, a
/// forked child or descendant that recorded nothing in a selected module writes no file (a child forked only
/// to `_exit` at once: creating its file cost more than the fork itself, about 1.5 ms of 2.5).
pub fn write_without_heap(settings: &Settings) -> bool {
    if DUMP.prepared.get().is_none() {
        return false;
    }
    if crate::fork_reset::pending() {
        // A forked child that recorded nothing: no file, and nothing of the parent's touched.
        return true;
    }
    mcount::set_paused(true);
    sampler::stop_and_quiesce();
    mcount::publish_cached_counts(true);
    if (DUMP.in_forked_child() || ENDING.writes_pid_named_file()) && !recorded_in_selected_modules()
    {
        return true;
    }
    let moment = moment();
    // SAFETY: sampling was stopped and quiesced above.
    match unsafe { write_prepared(program(settings), &moment, modules::all(), &DUMP.prepared) } {
        Some(Ok(())) => true,
        Some(Err(error)) => {
            let path = DUMP
                .prepared
                .get()
                .map_or(&[][..], |(p, _)| &p[..p.len() - 1]);
            let mut digits = [0u8; 20];
            sys::stderr_line(&[
                b"mslprof: cannot write ",
                path,
                b": errno ",
                file::decimal(error.errno().unsigned_abs().into(), &mut digits),
                b"\n",
            ]);
            false
        }
        None => false,
    }
}
