//! Call stacks at samples: captured in the SIGPROF handler ([`record_interrupted`]), kept once per distinct
//! stack with a count ([`table`]), written as the STACKS section of the profile ([`write_section`]).
//!
//! Frames are (load-instance key, link-time address), computed at capture time, so a module later unloaded
//! keeps its key. `MSLPROF_STACK_DEPTH` bounds a walk (0: no stacks at all); `MSLPROF_STACK_TABLE_KB` bounds
//! the table.

pub mod table;
pub mod unwind;

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use mslprof_format::stream::Sink;

use crate::sys;
use table::Table;
use unwind::{Frame, Registers, StackBounds};

/// The default and largest `MSLPROF_STACK_DEPTH`.
pub const DEFAULT_DEPTH: u32 = 128;
pub const MAX_DEPTH: u32 = 4096;
/// The default `MSLPROF_STACK_TABLE_KB`.
pub const DEFAULT_TABLE_KB: u32 = 4096;
/// Bytes above the stack pointer copied when the stack is none the runtime knows (a coroutine's).
const COPY_WINDOW_BYTES: usize = 64 << 10;
/// Handlers that can walk at once; a further one drops its stack.
const SCRATCH_SLOTS: usize = 16;
/// The STACKS section's tag (SPEC.md).
const TAG_STACKS: u32 = 5;

struct Stacks {
    max_depth: u32,
    table: Table,
    /// SCRATCH_SLOTS × (frames for `max_depth`, then the copy window), claimed by `scratch_busy`.
    scratch: *mut u8,
    scratch_busy: [AtomicBool; SCRATCH_SLOTS],
    /// glibc's `__restore_rt`, the code signal handlers return into (0: unknown).
    restorer: AtomicUsize,
}

// SAFETY: the scratch memory is shared only through the claim flags (one handler per slot at a time).
unsafe impl Sync for Stacks {}
// SAFETY: as above.
unsafe impl Send for Stacks {}

static STACKS: OnceLock<Stacks> = OnceLock::new();
/// The depth configured, for modules added before [`start`] has made the table (0: stacks off).
static CONFIGURED_DEPTH: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's stack `[low, high)`, recorded when it started (0, 0: unknown). Const-initialised TLS:
    /// no allocation, usable from a signal handler.
    static THREAD_STACK: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

fn scratch_bytes(max_depth: u32) -> usize {
    (max_depth as usize * std::mem::size_of::<Frame>()).div_ceil(16) * 16 + COPY_WINDOW_BYTES
}

/// Takes the settings, before any module is added: whether modules copy their unwind tables.
pub fn configure(max_depth: u32) {
    CONFIGURED_DEPTH.store(max_depth, Ordering::Relaxed);
}

/// Whether stacks are captured in this process.
pub fn enabled() -> bool {
    CONFIGURED_DEPTH.load(Ordering::Relaxed) != 0
}

/// Reserves the table and the handlers' scratch memory (once, at start-up, before sampling starts); false
/// when stacks are off or the memory could not be mapped (then samples have no stacks).
pub fn start(table_kb: u32) -> bool {
    let max_depth = CONFIGURED_DEPTH.load(Ordering::Relaxed);
    if max_depth == 0 {
        return false;
    }
    if STACKS.get().is_some() {
        return true;
    }
    let table = Table::new(table_kb as usize * 1024);
    let scratch = sys::map_zeroed(scratch_bytes(max_depth) * SCRATCH_SLOTS);
    let (Some(table), Some(scratch)) = (table, scratch) else {
        CONFIGURED_DEPTH.store(0, Ordering::Relaxed);
        return false;
    };
    let _ = STACKS.set(Stacks {
        max_depth,
        table,
        scratch,
        scratch_busy: [const { AtomicBool::new(false) }; SCRATCH_SLOTS],
        restorer: AtomicUsize::new(0),
    });
    true
}

/// After the SIGPROF handler is installed: remembers the trampoline libc gave the kernel for it, which is
/// glibc's `__restore_rt`, the same for every handler installed through libc.
pub fn note_signal_restorer() {
    if let Some(stacks) = STACKS.get() {
        stacks
            .restorer
            .store(sys::signal_restorer(libc::SIGPROF), Ordering::Relaxed);
    }
}

/// Records the calling thread's stack bounds (at start-up for the starting thread, and as each thread the
/// runtime starts begins). Not async-signal-safe.
pub fn note_thread_stack() {
    if enabled()
        && let Some(bounds) = sys::current_thread_stack()
    {
        THREAD_STACK.with(|cell| cell.set(bounds));
    }
}

/// The stack bounds a walk in this thread's handler may use.
struct HandlerBounds;

impl StackBounds for HandlerBounds {
    fn thread_stack(&self) -> Option<(usize, usize)> {
        let (low, high) = THREAD_STACK.with(Cell::get);
        (low < high).then_some((low, high))
    }
    fn alternate_stack(&self) -> Option<(usize, usize)> {
        sys::alternate_signal_stack()
    }
    fn copy(&self, address: usize, buffer: &mut [u8]) -> usize {
        sys::read_own_memory(address, buffer)
    }
}

/// A claimed scratch slot, given back when dropped.
struct Scratch<'a> {
    busy: &'a AtomicBool,
    frames: &'a mut [Frame],
    window: &'a mut [u8],
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        self.busy.store(false, Ordering::Release);
    }
}

impl Stacks {
    fn claim_scratch(&self) -> Option<Scratch<'_>> {
        let index = self.scratch_busy.iter().position(|busy| {
            busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })?;
        let bytes = scratch_bytes(self.max_depth);
        let frame_bytes = bytes - COPY_WINDOW_BYTES;
        // SAFETY: slot `index` of the scratch mapping (SCRATCH_SLOTS × `bytes`), 16-aligned, ours alone until
        // the flag is released; Frame is plain data for which zeroed memory is valid.
        let (frames, window) = unsafe {
            let base = self.scratch.add(index * bytes);
            (
                std::slice::from_raw_parts_mut(base.cast::<Frame>(), self.max_depth as usize),
                std::slice::from_raw_parts_mut(base.add(frame_bytes), COPY_WINDOW_BYTES),
            )
        };
        Some(Scratch {
            busy: &self.scratch_busy[index],
            frames,
            window,
        })
    }
}

/// Captures and counts the call stack of the code the SIGPROF `context` interrupted. Async-signal-safe: no
/// allocation, no lock (the scratch slot is claimed with a CAS), errno left as it was (the handler saves it,
/// and the calls here preserve it too).
///
/// # Safety
/// `context` must be the ucontext pointer the kernel passed to the SA_SIGINFO handler, or null.
#[cfg(target_arch = "x86_64")]
pub unsafe fn record_interrupted(context: *const std::os::raw::c_void) {
    let Some(stacks) = STACKS.get() else {
        return;
    };
    if stacks.max_depth == 0 {
        return;
    }
    // SAFETY: as the caller guarantees.
    let (pc, sp, fp) = unsafe { sys::interrupted_registers(context) };
    let Some(scratch) = stacks.claim_scratch() else {
        stacks.table.note_dropped();
        return;
    };
    let Scratch { frames, window, .. } = &mut { scratch };
    let (depth, flags) = unwind::walk(
        Registers { pc, sp, fp },
        frames,
        &HandlerBounds,
        window,
        stacks.restorer.load(Ordering::Relaxed),
    );
    if let Some(stack) = frames.get(..depth)
        && depth != 0
    {
        stacks.table.insert(stack, flags);
    }
}

/// A forked child's fresh start: the parent's stacks are not the child's. Only while nothing inserts.
pub fn reset_after_fork() {
    if let Some(stacks) = STACKS.get() {
        stacks.table.clear();
        // Slots held by handlers of threads that do not exist in the child.
        for busy in &stacks.scratch_busy {
            busy.store(false, Ordering::Relaxed);
        }
    }
}

/// Bytes a [`write_section`] with `entries` entries of `frames` frames in all takes, header included.
fn section_bytes(entries: usize, frames: usize) -> u64 {
    16 + 16 + entries as u64 * 16 + frames as u64 * 12
}

/// Appends the STACKS section (SPEC.md, tag 5) to a profile whose last section was just written to `sink`
/// (it ends 8-aligned): the entries published when it is sized, with counts as they are when written (the
/// table may be inserted into meanwhile). Frames of a key `known` rejects (a load instance left out of the
/// file) are written as unknown. Nothing when stacks are off. Allocates nothing from the heap (one anonymous
/// mapping for the marks).
pub fn write_section<S: Sink>(sink: &mut S, known: &dyn Fn(u32) -> bool) -> Result<(), S::Error> {
    let Some(stacks) = STACKS.get() else {
        return Ok(());
    };
    if stacks.max_depth == 0 {
        return Ok(());
    }
    let table = &stacks.table;
    let Some(marks) = sys::map_zeroed(table.slot_count()) else {
        return Ok(());
    };
    // SAFETY: a fresh mapping of `slot_count` bytes, ours until unmapped below.
    let marks_slice = unsafe { std::slice::from_raw_parts_mut(marks, table.slot_count()) };
    let result = write_marked(sink, stacks, marks_slice, known);
    // SAFETY: the mapping made above; the slice is no longer used.
    unsafe { sys::unmap(marks, table.slot_count()) };
    result
}

fn write_marked<S: Sink>(
    sink: &mut S,
    stacks: &Stacks,
    marks: &mut [u8],
    known: &dyn Fn(u32) -> bool,
) -> Result<(), S::Error> {
    let table = &stacks.table;
    let (entries, frames) = table.mark(marks);
    let payload = section_bytes(entries, frames) - 16;
    let mut out = Buffered::new(sink);
    out.u32(TAG_STACKS)?;
    out.u32(0)?;
    out.u64(payload)?;
    out.u32(entries as u32)?;
    out.u32(stacks.max_depth)?;
    out.u64(table.dropped())?;
    let mut failure = None;
    table.visit(marks, |entry| {
        if failure.is_some() {
            return;
        }
        let written = (|| {
            out.u64(entry.count)?;
            out.u32(entry.flags)?;
            out.u32(entry.depth() as u32)?;
            for frame in entry.frames() {
                let frame = if known(frame.key) {
                    frame
                } else {
                    Frame {
                        key: mslprof_format::model::UNKNOWN_KEY,
                        address: 0,
                    }
                };
                out.u32(frame.key)?;
                out.u64(frame.address)?;
            }
            Ok(())
        })();
        if let Err(error) = written {
            failure = Some(error);
        }
    });
    if let Some(error) = failure {
        return Err(error);
    }
    while !out.written.is_multiple_of(8) {
        out.bytes(&[0])?;
    }
    out.flush()
}

/// A 1 KiB buffer on the stack in front of a sink.
struct Buffered<'s, S: Sink> {
    sink: &'s mut S,
    buffer: [u8; 1024],
    len: usize,
    written: u64,
}

impl<'s, S: Sink> Buffered<'s, S> {
    fn new(sink: &'s mut S) -> Self {
        Buffered {
            sink,
            buffer: [0; 1024],
            len: 0,
            written: 0,
        }
    }
    fn bytes(&mut self, bytes: &[u8]) -> Result<(), S::Error> {
        self.written += bytes.len() as u64;
        for &byte in bytes {
            if self.len == self.buffer.len() {
                self.flush()?;
            }
            self.buffer[self.len] = byte;
            self.len += 1;
        }
        Ok(())
    }
    fn u32(&mut self, value: u32) -> Result<(), S::Error> {
        self.bytes(&value.to_ne_bytes())
    }
    fn u64(&mut self, value: u64) -> Result<(), S::Error> {
        self.bytes(&value.to_ne_bytes())
    }
    fn flush(&mut self) -> Result<(), S::Error> {
        if self.len > 0 {
            self.sink.write_all(&self.buffer[..self.len])?;
            self.len = 0;
        }
        Ok(())
    }
}
