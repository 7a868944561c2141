//! Call stacks at samples: captured in the SIGPROF handler ([`record_interrupted`]), kept once per distinct
//! stack with a count ([`table`]), written as the STACKS section of the profile ([`with_section`]).
//!
//! Frames are (load-instance key, link-time address), computed at capture time, so a module later unloaded
//! keeps its key. `MSLPROF_STACK_DEPTH` bounds a walk (0: no stacks at all); `MSLPROF_STACK_TABLE_KB` bounds
//! the table.

pub mod rule_cache;
pub mod table;
pub mod unwind;

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use mslprof_format::LinkAddress;
use mslprof_format::model::{StackFrame, UNKNOWN_KEY};
use mslprof_format::stream::{StackRecordDesc, StacksDesc};

use crate::sys;
use rule_cache::RuleCache;
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

struct Stacks {
    max_depth: u32,
    table: Table,
    /// SCRATCH_SLOTS × (frames for `max_depth`, the rule cache, the copy window), claimed by `scratch_busy`.
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

/// Bytes of one scratch slot's frames, and of its frames and rule cache (each part 16-aligned).
fn scratch_parts(max_depth: u32) -> (usize, usize) {
    let frames = (max_depth as usize * std::mem::size_of::<Frame>()).div_ceil(16) * 16;
    (
        frames,
        frames + std::mem::size_of::<RuleCache>().div_ceil(16) * 16,
    )
}

fn scratch_bytes(max_depth: u32) -> usize {
    scratch_parts(max_depth).1 + COPY_WINDOW_BYTES
}

/// Takes the settings, before any module is added: whether modules copy their unwind tables.
pub fn configure(max_depth: u32) {
    CONFIGURED_DEPTH.store(max_depth, Ordering::Relaxed);
    crate::unwind_tables::set_wanted(max_depth != 0);
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
    cache: &'a mut RuleCache,
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
        // SAFETY: slot `index`, ours alone until the flag is released.
        let (frames, cache, window) = unsafe { self.slot(index) };
        Some(Scratch {
            busy: &self.scratch_busy[index],
            frames,
            cache,
            window,
        })
    }

    /// Scratch slot `index`'s frames, rule cache and copy window.
    ///
    /// # Safety
    /// `index < SCRATCH_SLOTS`, and nothing else uses the slot while the borrows last (its flag is held, or no
    /// handler can run).
    #[allow(
        clippy::mut_from_ref,
        reason = "the slots are apart; the caller holds the slot"
    )]
    unsafe fn slot(&self, index: usize) -> (&mut [Frame], &mut RuleCache, &mut [u8]) {
        let bytes = scratch_bytes(self.max_depth);
        let (frame_bytes, window_at) = scratch_parts(self.max_depth);
        // SAFETY: slot `index` of the scratch mapping (SCRATCH_SLOTS × `bytes`), 16-aligned, its parts apart and
        // 16-aligned, ours as the caller guarantees; Frame and RuleCache are plain integers, for which zeroed
        // memory is valid (an empty cache).
        unsafe {
            let base = self.scratch.add(index * bytes);
            (
                std::slice::from_raw_parts_mut(base.cast::<Frame>(), self.max_depth as usize),
                &mut *base.add(frame_bytes).cast::<RuleCache>(),
                std::slice::from_raw_parts_mut(base.add(window_at), COPY_WINDOW_BYTES),
            )
        }
    }
}

/// Captures and counts the call stack of the code the SIGPROF `context` interrupted: the walk's reach, the bytes
/// of stack above the interrupted rsp it read (`usize::MAX` when it went on in another stack; 0 without a walk).
/// Async-signal-safe: no allocation, no lock (the scratch slot is claimed with a CAS), errno left as it was
/// (the handler saves it, and the calls here preserve it too).
///
/// # Safety
/// `context` must be the ucontext pointer the kernel passed to the SA_SIGINFO handler, or null.
#[cfg(target_arch = "x86_64")]
pub unsafe fn record_interrupted(context: *const std::os::raw::c_void) -> usize {
    let Some(stacks) = STACKS.get() else {
        return 0;
    };
    if stacks.max_depth == 0 {
        return 0;
    }
    // SAFETY: as the caller guarantees.
    let (pc, sp, fp) = unsafe { sys::interrupted_registers(context) };
    stacks
        .record_walk(Registers { pc, sp, fp }, &HandlerBounds)
        .1
}

/// Captures and counts the call stack of a sample a task-clock ring holds, from its registers and the copy of
/// its stack: frames whose return addresses lie above the copy are cut (the stack is flagged as truncated).
/// Returns whether the walk stopped for want of stack the copy lacks: the stack goes on above the copy, or a
/// signal frame leads to another stack (a handler on an alternate signal stack). Async-signal-safe, as
/// [`record_interrupted`]; also run by the drain thread.
#[cfg(target_arch = "x86_64")]
pub fn record_copied(pc: usize, stack: &crate::task_clock::CopiedStack<'_>) -> bool {
    let Some(stacks) = STACKS.get() else {
        return false;
    };
    if stacks.max_depth == 0 {
        return false;
    }
    let start = Registers {
        pc,
        sp: stack.sp,
        fp: stack.fp,
    };
    let bounds = CopiedBounds {
        stack,
        asked_outside: Cell::new(false),
    };
    let (flags, _) = stacks.record_walk(start, &bounds);
    flags & unwind::TRUNCATED_UNWIND != 0 && (stack.is_cut() || bounds.asked_outside.get())
}

/// The stack bounds of a walk over a sample's copy of its stack: no stack is read in place.
#[cfg(target_arch = "x86_64")]
struct CopiedBounds<'a> {
    stack: &'a crate::task_clock::CopiedStack<'a>,
    /// The walk asked for stack outside the copy.
    asked_outside: Cell<bool>,
}

#[cfg(target_arch = "x86_64")]
impl StackBounds for CopiedBounds<'_> {
    fn thread_stack(&self) -> Option<(usize, usize)> {
        None
    }
    fn alternate_stack(&self) -> Option<(usize, usize)> {
        None
    }
    fn copy(&self, address: usize, buffer: &mut [u8]) -> usize {
        let copied = self.stack.copy(address, buffer);
        if copied == 0 {
            self.asked_outside.set(true);
        }
        copied
    }
}

#[cfg(target_arch = "x86_64")]
impl Stacks {
    /// Walks the stack from `start` within `bounds` and counts it in the table (dropped, and counted as such,
    /// when every scratch slot is busy): the walk's flags and reach (`unwind::walk`; 0 and 0 when dropped).
    fn record_walk(&self, start: Registers, bounds: &impl StackBounds) -> (u32, usize) {
        let Some(scratch) = self.claim_scratch() else {
            self.table.note_dropped();
            return (0, 0);
        };
        let Scratch {
            frames,
            cache,
            window,
            ..
        } = &mut { scratch };
        let (depth, flags, reach) = unwind::walk(
            start,
            frames,
            bounds,
            window,
            cache,
            self.restorer.load(Ordering::Relaxed),
        );
        if let Some(stack) = frames.get(..depth)
            && depth != 0
        {
            self.table.insert(stack, flags);
        }
        (flags, reach)
    }
}

/// What the test hook's walks found and took.
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub struct TestWalks {
    /// Nanoseconds the walks took (CLOCK_MONOTONIC), emptying the cache excluded.
    pub nanoseconds: u64,
    /// The last walk's frame count and flags.
    pub depth: usize,
    pub flags: u32,
    /// Rule cache hits and misses over all the walks.
    pub hits: u64,
    pub misses: u64,
}

/// The test hook's walk (`mslprof_test_walk_here`, `test-hooks` builds): walks this thread's stack from `start`
/// `repeats` times as the SIGPROF handler does (its bounds, its trampoline address, a rule cache of its own that
/// starts empty and, when `cold`, is emptied before each walk), and writes the last walk's frames into
/// `frames_out` as runtime addresses (0 outside every module); `None` when stacks are off. Allocates (not for a
/// handler).
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub fn walk_for_test(
    start: Registers,
    frames_out: &mut [u64],
    repeats: u64,
    cold: bool,
) -> Option<TestWalks> {
    let stacks = STACKS.get().filter(|s| s.max_depth != 0)?;
    let mut frames = vec![Frame::default(); frames_out.len()];
    let mut window = vec![0u8; COPY_WINDOW_BYTES];
    let mut cache = RuleCache::boxed();
    let restorer = stacks.restorer.load(Ordering::Relaxed);
    let mut walk = |cache: &mut RuleCache| {
        unwind::walk(
            std::hint::black_box(start),
            &mut frames,
            &HandlerBounds,
            &mut window,
            cache,
            restorer,
        )
    };
    let mut walked = (0, 0, 0);
    let mut elapsed = 0;
    let (mut hits, mut misses) = (0, 0);
    if cold {
        for _ in 0..repeats {
            cache.clear();
            let began = sys::clock_ns(sys::CLOCK_MONOTONIC);
            walked = walk(&mut cache);
            elapsed += sys::clock_ns(sys::CLOCK_MONOTONIC) - began;
            let (walk_hits, walk_misses) = cache.counts();
            (hits, misses) = (hits + walk_hits, misses + walk_misses);
        }
    } else {
        let began = sys::clock_ns(sys::CLOCK_MONOTONIC);
        for _ in 0..repeats {
            walked = walk(&mut cache);
        }
        elapsed = sys::clock_ns(sys::CLOCK_MONOTONIC) - began;
        (hits, misses) = cache.counts();
    }
    let (depth, flags, _) = walked;
    for (out, frame) in frames_out.iter_mut().zip(&frames[..depth]) {
        *out = crate::modules::by_key(frame.key).map_or(0, |module| {
            module
                .load_bias
                .runtime_address(LinkAddress(frame.address))
                .0
        });
    }
    Some(TestWalks {
        nanoseconds: elapsed.max(0) as u64,
        depth,
        flags,
        hits,
        misses,
    })
}

/// A forked child's fresh start: the parent's stacks are not the child's. Only while nothing inserts.
pub fn reset_after_fork() {
    if let Some(stacks) = STACKS.get() {
        stacks.table.clear();
        // Slots held by handlers of threads that do not exist in the child; a rule cache such a handler was
        // writing may hold a torn entry, so it starts empty.
        for (index, busy) in stacks.scratch_busy.iter().enumerate() {
            if busy.swap(false, Ordering::Relaxed) {
                // SAFETY: a slot index; the child has one thread, outside any handler.
                unsafe { stacks.slot(index) }.1.clear();
            }
        }
    }
}

/// Runs `write` with the STACKS section's descriptor (SPEC.md §11) for the stream encoder, `None` when stacks
/// are off: the entries published when it is called, with counts as they are when written (the table may be
/// inserted into meanwhile; the encoder visits the records twice, sizing then writing). Allocates nothing from
/// the heap (one anonymous mapping for the marks).
pub fn with_section<R>(write: impl FnOnce(Option<&StacksDesc<'_>>) -> R) -> R {
    let Some(stacks) = STACKS.get().filter(|s| s.max_depth != 0) else {
        return write(None);
    };
    let table = &stacks.table;
    let Some(marks) = sys::map_zeroed(table.slot_count()) else {
        return write(None);
    };
    // SAFETY: a fresh mapping of `slot_count` bytes, ours until unmapped below.
    let marks_slice = unsafe { std::slice::from_raw_parts_mut(marks, table.slot_count()) };
    table.mark(marks_slice);
    let marks_read: &[u8] = marks_slice;
    let feed = |emit: &mut dyn FnMut(&StackRecordDesc<'_>) -> bool| {
        let mut open = true;
        table.visit(marks_read, |entry| {
            if !open {
                return;
            }
            let frame = |index: usize| {
                let frame = entry.frame(index).unwrap_or(Frame {
                    key: UNKNOWN_KEY,
                    address: 0,
                });
                StackFrame {
                    key: frame.key,
                    address: LinkAddress(frame.address),
                }
            };
            open = emit(&StackRecordDesc {
                count: entry.count,
                flags: entry.flags,
                depth: entry.depth(),
                frame: &frame,
            });
        });
    };
    let desc = StacksDesc {
        max_depth: stacks.max_depth,
        dropped: table.dropped(),
        records: &feed,
    };
    let result = write(Some(&desc));
    // SAFETY: the mapping made above; nothing borrows it any more.
    unsafe { sys::unmap(marks, table.slot_count()) };
    result
}
