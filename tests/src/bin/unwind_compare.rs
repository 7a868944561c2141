//! The runtime's stack walker against framehop (samply's unwinder), on the same live stacks, in one process,
//! outside any signal handler. The program recurses through distinct functions until its stack is DEPTH frames
//! deep (`main` and libc's start-up frames included), then at the bottom (a) calls the `test-hooks` runtime's
//! `mslprof_test_walk_here`, which walks the stack from its caller's registers with the SIGPROF handler's walk,
//! and (b) walks the same stack with framehop from the same registers, one framehop module per loaded object
//! (its `.eh_frame_hdr`, `.eh_frame` and code, read in place). Each walker walks with a cold rule cache and with
//! a warm one. The runtime's: its cache emptied before each walk (checked: no hit), then kept across walks (checked:
//! the walks after the first find rules cached). framehop's: two unwinders take turns over one cache, the first
//! not the one the warm walks use, so no rule a walk cached serves the next (checked from the cache's
//! statistics), then one unwinder, the cache kept across walks, as samply uses it. Every walk must give the
//! runtime's frames (same count, same addresses), and the runtime's walks must reach the outermost frame, or
//! nothing is timed.
//!
//! Run it with `LD_PRELOAD` naming the runtime built with `test-hooks` (stacks on, as by default) and `GPROFDIR=`
//! (no profile), as the bench's `unwinders` suite and `tests/tests/unwinders.rs` do.
//!
//! - `unwind_compare [--trials N] [--frames N] DEPTH...`: per depth and trial, one line
//!   `trial DEPTH FRAMES RUNTIME_COLD RUNTIME_WARM FRAMEHOP_COLD FRAMEHOP_WARM`, nanoseconds per walk, each the
//!   mean over `--frames` / DEPTH walks of that kind.
//! - `unwind_compare --check DEPTH`: two walks of each kind (so that the second warm walk finds the first's
//!   rules), then `agree DEPTH FRAMES`, the frames' addresses, and `runtime cache: cold HITS MISSES, warm HITS
//!   MISSES`, the runtime's rule cache hits and misses over its cold walks and over its warm ones.
//!
//! A disagreement prints both walkers' frames on stderr and exits with status 1.

#![no_main]

use std::ffi::{c_char, c_int};
use std::hint::black_box;
use std::marker::PhantomData;
use std::ops::Range;
use std::time::Instant;

use findshlibs::{Segment, SharedLibrary, TargetSharedLibrary};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, MustNotAllocateDuringUnwind, Unwinder};

/// `u64 mslprof_test_walk_here(u64 *frames, size_t capacity, u64 repeats, u64 report[7], u64 cold)`: the
/// runtime's test hook (runtime/README.md, "Safety rules"). `report` gets the caller's pc, sp and rbp, the frame
/// count, the walk's flags and the rule cache's hits and misses; it returns the nanoseconds the walks took,
/// `u64::MAX` when it could not walk.
type WalkHere = unsafe extern "C" fn(*mut u64, usize, u64, *mut u64, u64) -> u64;

/// Words of the hook's report.
const REPORT_WORDS: usize = 7;

/// framehop as it can run in a signal handler: no allocation during a walk.
type Framehop = UnwinderX86_64<&'static [u8], MustNotAllocateDuringUnwind>;
type FramehopCache = CacheX86_64<MustNotAllocateDuringUnwind>;

/// Room for the frames of one walk.
const MOST_FRAMES: usize = 256;

/// The registers both walkers start from: the bottom function's, as the runtime's hook saw them at its call.
#[derive(Clone, Copy, Debug)]
struct Start {
    pc: u64,
    sp: u64,
    fp: u64,
}

/// One measurement at the bottom of the stack: the frames both walkers agree on and nanoseconds per walk.
struct Measurement {
    frames: Vec<u64>,
    runtime_cold_ns: f64,
    runtime_warm_ns: f64,
    /// The runtime's rule cache hits and misses over its cold walks and over its warm ones.
    runtime_cache: [(u64, u64); 2],
    framehop_cold_ns: f64,
    framehop_warm_ns: f64,
}

/// What the bottom function needs: both walkers and how many walks to time.
struct Probe {
    walk_here: WalkHere,
    /// Two unwinders over the same modules, built apart (each has its own generation in framehop's cache).
    unwinders: [Framehop; 2],
    cache: FramehopCache,
    walks: u64,
    outcome: Result<Measurement, String>,
}

/// A level of the recursion: every `Above<T>` is a function of its own, so each frame has its own return
/// address (no walker sees the same address twice in one walk).
trait Level {
    fn descend(probe: &mut Probe, remaining: usize) -> u64;
}

struct Bottom;

struct Above<T>(PhantomData<T>);

impl Level for Bottom {
    #[inline(never)]
    fn descend(probe: &mut Probe, _remaining: usize) -> u64 {
        black_box(probe.at_bottom()).wrapping_add(1)
    }
}

impl<T: Level> Level for Above<T> {
    #[inline(never)]
    fn descend(probe: &mut Probe, remaining: usize) -> u64 {
        let below = if remaining == 0 {
            probe.at_bottom()
        } else {
            T::descend(black_box(probe), remaining - 1)
        };
        black_box(below).wrapping_add(1)
    }
}

type Ten<T> = Above<Above<Above<Above<Above<Above<Above<Above<Above<Above<T>>>>>>>>>>;
/// 120 levels above the bottom.
type Levels = Ten<Ten<Ten<Ten<Ten<Ten<Ten<Ten<Ten<Ten<Ten<Ten<Bottom>>>>>>>>>>>>;
const MOST_LEVELS: usize = 120;

impl Probe {
    /// Recurses `levels` frames deeper than the shallowest stack, measures there and returns the measurement.
    fn descend(&mut self, levels: usize) -> Result<Measurement, String> {
        black_box(Levels::descend(self, levels));
        std::mem::replace(&mut self.outcome, Err("not measured".into()))
    }

    /// The bottom of the recursion: the runtime walks from here (its hook's return address), cold cache then
    /// warm, then framehop from the same registers, over the same frames (this function's and its callers',
    /// unchanged meanwhile).
    #[inline(never)]
    fn at_bottom(&mut self) -> u64 {
        let mut runtime_frames = [[0u64; MOST_FRAMES]; 2];
        let mut reports = [[0u64; REPORT_WORDS]; 2];
        let mut nanoseconds = [0u64; 2];
        for (cold, ((frames, report), nanoseconds)) in [1, 0].into_iter().zip(
            runtime_frames
                .iter_mut()
                .zip(&mut reports)
                .zip(&mut nanoseconds),
        ) {
            // SAFETY: the hook's contract: MOST_FRAMES writable words and REPORT_WORDS for the report.
            *nanoseconds = unsafe {
                (self.walk_here)(
                    frames.as_mut_ptr(),
                    MOST_FRAMES,
                    self.walks,
                    report.as_mut_ptr(),
                    cold,
                )
            };
        }
        self.outcome = self.compare(&runtime_frames, &reports, nanoseconds);
        black_box(reports[0][3])
    }

    /// The runtime's walks (cold cache, then warm), each against framehop's from the same registers (the two
    /// calls of the hook may see different rbp), and framehop's timed walks from the warm walk's registers.
    fn compare(
        &mut self,
        runtime_frames: &[[u64; MOST_FRAMES]; 2],
        reports: &[[u64; REPORT_WORDS]; 2],
        nanoseconds: [u64; 2],
    ) -> Result<Measurement, String> {
        if nanoseconds.contains(&u64::MAX) {
            return Err("the runtime did not walk (profiling or stacks off?)".into());
        }
        let walks = self.walks.max(1);
        let [(cold_start, cold), (warm_start, warm)] = [0, 1].map(|walk| {
            let report = &reports[walk];
            let depth = (report[3] as usize).min(MOST_FRAMES);
            let start = Start {
                pc: report[0],
                sp: report[1],
                fp: report[2],
            };
            (start, &runtime_frames[walk][..depth])
        });
        for (report, frames, kind) in [(&reports[0], cold, "cold"), (&reports[1], warm, "warm")] {
            if report[4] != 0 {
                return Err(format!(
                    "the runtime's walk ({kind} cache) stopped early (flags {:#x}): {}",
                    report[4],
                    hex(frames)
                ));
            }
        }
        let runtime_cache = reports.map(|report| (report[5], report[6]));
        // Every frame looks its rule up once a walk: cold, never found; warm, found after the first walk but
        // where two of the stack's addresses share a cache entry.
        let lookups = walks * cold.len() as u64;
        if runtime_cache[0] != (0, lookups) {
            return Err(format!(
                "the runtime's cold walks made {} rule cache hits and {} misses, not 0 and {lookups}",
                runtime_cache[0].0, runtime_cache[0].1
            ));
        }
        let (warm_hits, warm_misses) = runtime_cache[1];
        if warm_hits + warm_misses != walks * warm.len() as u64 || walks > 1 && warm_hits == 0 {
            return Err(format!(
                "the runtime's warm walks made {warm_hits} rule cache hits and {warm_misses} misses in \
                 {walks} walks of {} frames",
                warm.len()
            ));
        }
        self.framehop_walks(cold_start, cold, 1, false)?;
        let framehop_cold_ns = self.framehop_walks(warm_start, warm, walks, true)?;
        let framehop_warm_ns = self.framehop_walks(warm_start, warm, walks, false)?;
        Ok(Measurement {
            frames: warm.to_vec(),
            runtime_cold_ns: nanoseconds[0] as f64 / walks as f64,
            runtime_warm_ns: nanoseconds[1] as f64 / walks as f64,
            runtime_cache,
            framehop_cold_ns,
            framehop_warm_ns,
        })
    }

    /// framehop's mean nanoseconds per walk over `walks` walks from `start`, its rule cache `cold` or warm; an
    /// error unless the last walk gives the runtime's frames `runtime`.
    fn framehop_walks(
        &mut self,
        start: Start,
        runtime: &[u64],
        walks: u64,
        cold: bool,
    ) -> Result<f64, String> {
        let stack_top = stack_top(start.sp)?;
        let mut framehop_frames = [0u64; MOST_FRAMES];
        let hits_before = self.cache.stats().hit_count;
        let began = Instant::now();
        let mut walked = Ok(0);
        for walk in 0..walks {
            // Cold walks start with the unwinder the last warm walks did not use, then take turns.
            let unwinder = &self.unwinders[usize::from(cold && walk % 2 == 0)];
            walked = framehop_walk(
                unwinder,
                &mut self.cache,
                black_box(start),
                stack_top,
                &mut framehop_frames,
            );
        }
        let elapsed = began.elapsed();
        let kind = if cold { "cold" } else { "warm" };
        let framehop = &framehop_frames[..walked?];
        if framehop != runtime {
            return Err(format!(
                "the walkers disagree (framehop, {kind} cache)\n  runtime:  {}\n  framehop: {}",
                hex(runtime),
                hex(framehop)
            ));
        }
        if cold && self.cache.stats().hit_count != hits_before {
            return Err("framehop's cache served a cold walk".into());
        }
        Ok(elapsed.as_nanos() as f64 / walks as f64)
    }
}

/// One framehop walk from `start` into `out`: the frame count, or why framehop stopped before the outermost
/// frame. Reads only the stack between `start.sp` and `stack_top`.
fn framehop_walk(
    unwinder: &Framehop,
    cache: &mut FramehopCache,
    start: Start,
    stack_top: u64,
    out: &mut [u64; MOST_FRAMES],
) -> Result<usize, String> {
    let mut read_stack = |address: u64| {
        if address < start.sp || address.checked_add(8).is_none_or(|end| end > stack_top) {
            return Err(());
        }
        // SAFETY: `[start.sp, stack_top)` is this thread's stack from the bottom function's frame up: the
        // frames of functions still running, mapped and unchanged while the walk reads them.
        Ok(unsafe { (address as *const u64).read_unaligned() })
    };
    let registers = UnwindRegsX86_64::new(start.pc, start.sp, start.fp);
    let mut frames = unwinder.iter_frames(start.pc, registers, cache, &mut read_stack);
    let mut count = 0;
    loop {
        match frames.next() {
            Ok(Some(frame)) => {
                let slot = out
                    .get_mut(count)
                    .ok_or_else(|| format!("framehop found more than {MOST_FRAMES} frames"))?;
                *slot = frame.address();
                count += 1;
            }
            Ok(None) => return Ok(count),
            Err(error) => return Err(format!("framehop stopped after {count} frames: {error}")),
        }
    }
}

/// An unwinder over every object loaded now, built as samply's in-process use would: one module per object,
/// its address range, load bias, code, `.eh_frame_hdr` and `.eh_frame`, all read where they are mapped.
fn framehop_unwinder() -> Framehop {
    let mut unwinder = Framehop::new();
    TargetSharedLibrary::each(|library| {
        if let Some(module) = framehop_module(library) {
            unwinder.add_module(module);
        }
    });
    unwinder
}

/// `range` (link-time addresses) of an object loaded with `bias`, where it is mapped.
fn mapped(bias: u64, range: &Range<u64>) -> &'static [u8] {
    // SAFETY: the callers pass ranges of an object's PT_LOAD or PT_GNU_EH_FRAME segments, which are mapped
    // readable while the object is loaded; this program unloads nothing.
    unsafe {
        std::slice::from_raw_parts(
            bias.wrapping_add(range.start) as *const u8,
            (range.end - range.start) as usize,
        )
    }
}

fn framehop_module(library: &TargetSharedLibrary<'_>) -> Option<Module<&'static [u8]>> {
    let bias = library.virtual_memory_bias().0 as u64;
    let range = |segment: &<TargetSharedLibrary<'_> as SharedLibrary>::Segment| {
        let start = segment.stated_virtual_memory_address().0 as u64;
        start..start + segment.len() as u64
    };
    let loads: Vec<(Range<u64>, bool)> = library
        .segments()
        .filter(|s| s.is_load())
        .map(|s| (range(&s), s.is_code()))
        .collect();
    let lowest = loads.iter().map(|(r, _)| r.start).min()?;
    let highest = loads.iter().map(|(r, _)| r.end).max()?;
    let text = loads.iter().find(|(_, code)| *code)?.0.clone();
    let eh_frame_hdr = library
        .segments()
        .find(|s| s.name() == "GNU_EH_FRAME")
        .map(|s| range(&s));
    // `.eh_frame` runs from where the header points to at most the end of the segment holding it.
    let eh_frame = eh_frame_hdr.as_ref().and_then(|header| {
        let start = eh_frame_start(mapped(bias, header), header.start)?;
        let (segment, _) = loads.iter().find(|(r, _)| r.contains(&start))?;
        Some(start..segment.end)
    });
    let name = library.name().to_string_lossy().into_owned();
    Some(Module::new(
        name,
        bias + lowest..bias + highest,
        bias,
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text: Some(mapped(bias, &text)),
            text_svma: Some(text),
            eh_frame_hdr: eh_frame_hdr.as_ref().map(|r| mapped(bias, r)),
            eh_frame_hdr_svma: eh_frame_hdr,
            eh_frame: eh_frame.as_ref().map(|r| mapped(bias, r)),
            eh_frame_svma: eh_frame,
            ..Default::default()
        },
    ))
}

/// The link-time address of `.eh_frame` from its search table's header at link-time `header_address`
/// (`eh_frame_ptr` encoded pc-relative, signed 4 bytes, as every linker writes it).
fn eh_frame_start(header: &[u8], header_address: u64) -> Option<u64> {
    const PCREL_SDATA4: u8 = 0x1b;
    if header.first() != Some(&1) || header.get(1) != Some(&PCREL_SDATA4) {
        return None;
    }
    let offset = i32::from_le_bytes(header.get(4..8)?.try_into().ok()?);
    Some((header_address + 4).wrapping_add_signed(i64::from(offset)))
}

/// The end of the mapping holding `sp` (this thread's stack), from `/proc/self/maps`.
fn stack_top(sp: u64) -> Result<u64, String> {
    let maps =
        std::fs::read_to_string("/proc/self/maps").map_err(|e| format!("/proc/self/maps: {e}"))?;
    maps.lines()
        .find_map(|line| {
            let (low, high) = line.split_whitespace().next()?.split_once('-')?;
            let low = u64::from_str_radix(low, 16).ok()?;
            let high = u64::from_str_radix(high, 16).ok()?;
            (low <= sp && sp < high).then_some(high)
        })
        .ok_or_else(|| format!("no mapping holds the stack pointer {sp:#x}"))
}

fn hex(frames: &[u64]) -> String {
    let all: Vec<String> = frames.iter().map(|a| format!("{a:#x}")).collect();
    format!("{} frames [{}]", frames.len(), all.join(" "))
}

struct Options {
    check: bool,
    trials: usize,
    frames: u64,
    depths: Vec<usize>,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        check: false,
        trials: 7,
        frames: 2_000_000,
        depths: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    let number = |value: Option<String>| -> Result<u64, String> {
        let value = value.ok_or("a number is missing")?;
        value.parse().map_err(|_| format!("not a number: {value}"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--check" => options.check = true,
            "--trials" => options.trials = number(args.next())? as usize,
            "--frames" => options.frames = number(args.next())?,
            _ => options.depths.push(number(Some(arg))? as usize),
        }
    }
    if options.depths.is_empty() {
        return Err("usage: unwind_compare [--check] [--trials N] [--frames N] DEPTH...".into());
    }
    Ok(options)
}

fn run() -> Result<(), String> {
    let options = options()?;
    let walk_here = mslprof_tests::global_symbol(c"mslprof_test_walk_here").ok_or(
        "mslprof_test_walk_here is not in this process: preload the runtime built with its test-hooks feature",
    )?;
    let mut probe = Probe {
        // SAFETY: the runtime's test hook has this signature (see `WalkHere`).
        walk_here: unsafe { std::mem::transmute::<usize, WalkHere>(walk_here) },
        unwinders: [framehop_unwinder(), framehop_unwinder()],
        cache: FramehopCache::new_in(),
        walks: 1,
        outcome: Err("not measured".into()),
    };
    // The shallowest stack this program measures: `main`, libc's start-up frames and a few of its own.
    let shallowest = probe.descend(0)?.frames.len();
    for &depth in &options.depths {
        let levels = depth
            .checked_sub(shallowest)
            .filter(|&levels| levels <= MOST_LEVELS)
            .ok_or_else(|| {
                format!(
                    "depth {depth} is out of reach: from {shallowest} to {} frames",
                    shallowest + MOST_LEVELS
                )
            })?;
        probe.walks = if options.check {
            2
        } else {
            (options.frames / depth as u64).max(1)
        };
        for _ in 0..if options.check { 1 } else { options.trials } {
            let measurement = probe.descend(levels)?;
            let frames = measurement.frames.len();
            if frames != depth {
                return Err(format!(
                    "both walkers found {frames} frames where the program made {depth}"
                ));
            }
            if options.check {
                let [(cold_hits, cold_misses), (warm_hits, warm_misses)] =
                    measurement.runtime_cache;
                println!("agree {depth} {frames}");
                println!("{}", hex(&measurement.frames));
                println!(
                    "runtime cache: cold {cold_hits} {cold_misses}, warm {warm_hits} {warm_misses}"
                );
            } else {
                println!(
                    "trial {depth} {frames} {:.1} {:.1} {:.1} {:.1}",
                    measurement.runtime_cold_ns,
                    measurement.runtime_warm_ns,
                    measurement.framehop_cold_ns,
                    measurement.framehop_warm_ns
                );
            }
        }
    }
    Ok(())
}

/// The C entry point itself (no Rust `main` and its start-up frames), so that the shallowest stack is small.
#[unsafe(no_mangle)]
pub extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    match run() {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("unwind_compare: {error}");
            1
        }
    }
}
