//! The profile written at exit: a snapshot of every load instance, written atomically to the output file.
//!
//! The file is written to a new temporary file in the destination's directory (`O_CREAT | O_EXCL |
//! O_NOFOLLOW`, mode 0644 minus the umask) and renamed over the destination, so readers never see a partial
//! file and a symlink planted at the destination is replaced, never followed. A failure costs one stderr line;
//! the program's exit status is untouched.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};

use mslprof_format::model::{Arc, CpuTime, IncompleteCause, header_flags, module_flags};
use mslprof_format::stream::{
    self, ArcFeed, Counts, Encoding, HeaderDesc, HistogramDesc, IoSink, ModuleDesc, RangeDesc,
    Sink, StreamError,
};

use crate::config::Settings;
use crate::histogram::{BYTES_PER_BUCKET, BucketBits, Histogram};
use crate::modules::LiveModule;
use crate::{program_sigprof, sampler, sys};

static DUMPED: AtomicBool = AtomicBool::new(false);
static START_PID: AtomicU32 = AtomicU32::new(0);
static START_TIME_NS: AtomicI64 = AtomicI64::new(0);

/// Remembers who started profiling and when (called once at start-up).
pub fn note_start() {
    START_PID.store(sys::getpid(), Ordering::Relaxed);
    restart_clock();
}

/// Profiling starts now, for the header's start time: at start-up, and again in a forked child, whose
/// profile covers only the child.
pub fn restart_clock() {
    START_TIME_NS.store(sys::clock_ns(sys::CLOCK_REALTIME), Ordering::Relaxed);
}

/// When profiling started (wall clock, ns), for the header of either dump path.
pub fn start_time_ns() -> i64 {
    START_TIME_NS.load(Ordering::Relaxed)
}

/// Module flags of the format (SPEC.md §6) for one load instance.
fn module_flag_bits(module: &LiveModule) -> u32 {
    let info = &module.info;
    let mut flags = 0;
    for (set, bit) in [
        (module.histogram.is_some(), module_flags::PROFILED),
        (module.is_unloaded(), module_flags::UNLOADED),
        (info.is_main, module_flags::MAIN_PROGRAM),
        (info.is_vdso, module_flags::VDSO),
        (info.is_dynamic_linker, module_flags::DYNAMIC_LINKER),
        (!info.build_id.is_empty(), module_flags::HAS_BUILD_ID),
    ] {
        if set {
            flags |= bit;
        }
    }
    flags
}

/// Histograms bigger than this are written from their touched pages only (as sparse ranges), so the dump
/// neither scans nor faults in megabytes of buckets that were never hit (librustc_driver: 54 MB of them).
const SPARSE_FROM_BYTES: usize = 1 << 20;

/// Non-zero buckets as (index within the range, count), one list per histogram range.
type SparseRanges = Vec<Vec<(u64, u32)>>;

/// For a big histogram, its non-zero buckets per range (indices relative to the range); `None` otherwise.
fn sparse_entries(histogram: &Histogram) -> Option<SparseRanges> {
    let bytes = histogram.bucket_count() * usize::from(histogram.bucket_bits().bits() / 8);
    if bytes < SPARSE_FROM_BYTES {
        return None;
    }
    let entries = histogram.nonzero_buckets();
    let per_range = histogram
        .ranges()
        .iter()
        .map(|r| {
            let (first, last) = (
                r.first_bucket as u64,
                (r.first_bucket + r.bucket_count()) as u64,
            );
            let inside = entries.iter().filter(|(i, _)| (first..last).contains(i));
            inside.map(|&(i, c)| (i - first, c)).collect()
        })
        .collect();
    Some(per_range)
}

/// The histogram ranges of a module, borrowing its buckets (or their sparse entries, when given).
///
/// # Safety
/// Sampling must be stopped and quiesced (see [`sampler::stop_and_quiesce`]) while the result is alive.
unsafe fn range_descriptors<'a>(
    histogram: &'a Histogram,
    sparse: Option<&'a [Vec<(u64, u32)>]>,
) -> Vec<RangeDesc<'a>> {
    // SAFETY: the caller guarantees no handler writes the buckets meanwhile.
    let (sixteen, thirty_two) = unsafe {
        (
            histogram.quiescent_buckets16(),
            histogram.quiescent_buckets32(),
        )
    };
    histogram
        .ranges()
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let buckets = r.first_bucket..r.first_bucket + r.bucket_count();
            let counts = match (sparse.and_then(|s| s.get(index)), histogram.bucket_bits()) {
                (Some(entries), _) => Counts::Sparse {
                    len: r.bucket_count() as u64,
                    entries,
                },
                (None, BucketBits::Sixteen) => Counts::U16(&sixteen[buckets]),
                (None, BucketBits::ThirtyTwo) => Counts::U32(&thirty_two[buckets]),
            };
            RangeDesc {
                start: r.start,
                end: r.end,
                counts,
            }
        })
        .collect()
}

/// Distinct arcs of a module right now.
fn arc_count(module: &LiveModule) -> u64 {
    let mut count = 0;
    module.arcs.for_each(|_| count += 1);
    count
}

/// The file header of a dump of `modules`. `flags` gets the shared-SIGPROF flag and the ending's flags,
/// cause and signal ([`crate::lifecycle::ending_header`]) added. Allocates nothing: the signal-time dump uses
/// it too.
pub fn header_desc<'a>(
    settings: &'a Settings,
    modules: &[&'a LiveModule],
    mut flags: u32,
    start_time_ns: i64,
) -> HeaderDesc<'a> {
    if program_sigprof::SHARED.load(Ordering::Relaxed) {
        flags |= header_flags::SAMPLING_SHARED_TIMER;
    }
    let mut incomplete_cause = IncompleteCause::None;
    let mut incomplete_signal = 0;
    crate::lifecycle::ending_header(&mut flags, &mut incomplete_cause, &mut incomplete_signal);
    let program_path = modules
        .iter()
        .find(|m| m.info.is_main)
        .map_or(&[][..], |m| m.info.path.as_slice());
    HeaderDesc {
        flags,
        incomplete_cause: incomplete_cause.code(),
        incomplete_signal,
        pid: sys::getpid(),
        ppid: sys::getppid(),
        start_time_ns,
        end_time_ns: sys::clock_ns(sys::CLOCK_REALTIME),
        hz: settings.hz,
        sample_period_ns: sampler::measured_period_ns(),
        dimension: b"seconds",
        dimension_abbrev: b's',
        total_samples: sampler::TOTAL_SAMPLES.load(Ordering::Relaxed),
        unknown_samples: sampler::UNKNOWN_SAMPLES.load(Ordering::Relaxed),
        dropped_arcs: modules.iter().map(|m| m.arcs.dropped()).sum(),
        program_name: &settings.program_name,
        program_path,
        cpu_time: sys::process_cpu_ns().map(|(user_ns, system_ns)| CpuTime { user_ns, system_ns }),
        ..HeaderDesc::default()
    }
}

/// The descriptor of one load instance: its identity and counters, with the given histogram and arcs.
/// Allocates nothing: the signal-time dump uses it too.
pub fn module_desc<'a>(
    module: &'a LiveModule,
    histogram: Option<HistogramDesc<'a>>,
    arc_count: u64,
    arcs: Option<ArcFeed<'a>>,
) -> ModuleDesc<'a> {
    let info = &module.info;
    ModuleDesc {
        key: module.key,
        path: &info.path,
        name: &info.file_name,
        soname: &info.soname,
        build_id: &info.build_id,
        flags: module_flag_bits(module),
        load_order: module.load_order,
        unload_order: module.unload_order(),
        load_bias: module.bias as u64,
        samples: module.samples.load(Ordering::Relaxed),
        saturated_buckets: module
            .histogram
            .as_ref()
            .map_or(0, Histogram::saturated_buckets),
        dropped_arcs: module.arcs.dropped(),
        histogram,
        arc_count,
        arcs,
        ..ModuleDesc::default()
    }
}

/// Streams the whole process's profile into `sink`.
///
/// # Safety
/// Sampling must be stopped and quiesced for the duration of the call.
pub unsafe fn write_profile<S: Sink>(
    settings: &Settings,
    sink: &mut S,
) -> Result<(), StreamError<S::Error>> {
    let all = crate::lifecycle::modules_to_dump();
    let mut flags = 0;
    if sys::getpid() != START_PID.load(Ordering::Relaxed) {
        flags |= header_flags::FORKED_CHILD;
    }
    let header = header_desc(settings, &all, flags, start_time_ns());
    // Arc feeds: each visits the module's arc table without allocating; the count announced is the number of
    // distinct arcs now (arcs recorded by threads still running are cut or padded by the writer).
    let feeds: Vec<_> = all
        .iter()
        .map(|m| {
            move |emit: &mut dyn FnMut(Arc) -> bool| {
                m.arcs.for_each(|arc| {
                    emit(Arc {
                        caller_key: arc.caller_key,
                        caller_address: mslprof_format::LinkAddress(arc.caller_addr),
                        callee_address: mslprof_format::LinkAddress(arc.callee_addr),
                        count: arc.count,
                    });
                });
            }
        })
        .collect();
    let sparse: Vec<Option<SparseRanges>> = all
        .iter()
        .map(|m| m.histogram.as_ref().and_then(sparse_entries))
        .collect();
    let ranges: Vec<Vec<RangeDesc<'_>>> = all
        .iter()
        .zip(&sparse)
        .map(|(m, sparse)| match &m.histogram {
            // SAFETY: the caller keeps sampling quiesced while the descriptors are alive.
            Some(h) => unsafe { range_descriptors(h, sparse.as_deref()) },
            None => Vec::new(),
        })
        .collect();
    let descriptors: Vec<ModuleDesc<'_>> = all
        .iter()
        .zip(&ranges)
        .zip(&feeds)
        .map(|((module, ranges), feed)| {
            let histogram = module.histogram.as_ref().map(|h| HistogramDesc {
                bucket_bits: h.bucket_bits().bits(),
                bytes_per_bucket: BYTES_PER_BUCKET,
                ranges,
                encoding: Encoding::Auto,
            });
            module_desc(module, histogram, arc_count(module), Some(feed))
        })
        .collect();
    stream::write_profile(sink, &header, &descriptors).map(|_| ())
}

/// Lets [`write_at_exit`] write again (a forked child; an image whose exec failed after its pre-exec dump).
pub fn allow_another_dump() {
    DUMPED.store(false, Ordering::SeqCst);
}

/// Writes the profile once, at normal termination. Later calls do nothing.
pub fn write_at_exit(settings: &Settings) {
    if DUMPED.swap(true, Ordering::SeqCst) {
        return;
    }
    sampler::stop_and_quiesce();
    let pid = sys::getpid();
    let forked_child = pid != START_PID.load(Ordering::Relaxed);
    let pid_named = crate::lifecycle::writes_pid_named_file(forked_child);
    // Only the root process speaks about the selection: in a wrapper's helper processes (a pyenv shim, a
    // shell, `timeout`) a name matching nothing is expected, and they are many.
    if !pid_named {
        for name in settings.selection.unmatched() {
            sys::stderr_line(&[
                b"mslprof: LD_PROFILE name '",
                name,
                b"' matched no module\n",
            ]);
        }
    } else if !crate::lifecycle::recorded_in_selected_modules() {
        // A descendant with nothing in a selected module leaves no file.
        return;
    }
    let Some(path) = settings
        .output
        .path(pid, &settings.program_name, pid_named)
        .map(crate::lifecycle::output_path)
    else {
        return;
    };
    let path = Path::new(std::ffi::OsStr::from_bytes(&path));
    // SAFETY: sampling was stopped and quiesced above and is not resumed.
    let written = unsafe { write_file(settings, path) };
    if let Err(error) = written {
        let text = error.to_string();
        sys::stderr_line(&[
            b"mslprof: cannot write ",
            path.as_os_str().as_bytes(),
            b": ",
            text.as_bytes(),
            b"\n",
        ]);
    }
}

/// Writes the whole profile to `path` (through [`write_atomically`]).
///
/// # Safety
/// Sampling must be stopped and quiesced for the duration of the call.
pub unsafe fn write_file(settings: &Settings, path: &Path) -> std::io::Result<()> {
    write_atomically(path, |file| {
        // SAFETY: the caller keeps sampling quiesced.
        unsafe { write_profile(settings, &mut IoSink(file)) }.map_err(|e| match e {
            StreamError::Sink(io) => io,
            StreamError::Invalid(what) => {
                std::io::Error::new(std::io::ErrorKind::InvalidData, what)
            }
        })
    })
}

/// Whether the dump at exit has been written (no snapshot may follow it).
pub fn exit_dump_written() -> bool {
    DUMPED.load(Ordering::SeqCst)
}

/// Whether this process is a forked child of the one that started profiling.
pub fn in_forked_child() -> bool {
    sys::getpid() != START_PID.load(Ordering::Relaxed)
}

/// Writes a new file in `path`'s directory with `fill`, then renames it to `path`.
pub fn write_atomically(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let directory = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let base = path
        .file_name()
        .map(|n| n.as_bytes())
        .unwrap_or(b"gmon.out");
    let mut attempt = 0u32;
    let (temporary, file) = loop {
        let mut name = b".".to_vec();
        name.extend_from_slice(base);
        name.extend_from_slice(format!(".{}.{attempt}.tmp", sys::getpid()).as_bytes());
        let candidate = directory.join(std::ffi::OsStr::from_bytes(&name));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&candidate)
        {
            Ok(file) => break (candidate, file),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                attempt += 1
            }
            Err(e) => return Err(e),
        }
    };
    let mut writer = std::io::BufWriter::with_capacity(64 * 1024, file);
    let written = fill(&mut writer).and_then(|()| writer.flush());
    drop(writer);
    let result = written.and_then(|()| std::fs::rename(&temporary, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}
