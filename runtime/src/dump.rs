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

use mslprof_format::model::{Arc, header_flags, module_flags};
use mslprof_format::stream::{
    self, Counts, Encoding, HeaderDesc, HistogramDesc, IoSink, ModuleDesc, RangeDesc, Sink,
    StreamError,
};

use crate::config::Settings;
use crate::histogram::{BYTES_PER_BUCKET, BucketBits, Histogram};
use crate::modules::{self, LiveModule};
use crate::{program_sigprof, sampler, sys};

static DUMPED: AtomicBool = AtomicBool::new(false);
static START_PID: AtomicU32 = AtomicU32::new(0);
static START_TIME_NS: AtomicI64 = AtomicI64::new(0);

/// Remembers who started profiling and when (called once at start-up).
pub fn note_start() {
    START_PID.store(sys::getpid(), Ordering::Relaxed);
    START_TIME_NS.store(sys::clock_ns(sys::CLOCK_REALTIME), Ordering::Relaxed);
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

/// The histogram ranges of a module, borrowing its buckets.
///
/// # Safety
/// Sampling must be stopped and quiesced (see [`sampler::stop_and_quiesce`]) while the result is alive.
unsafe fn range_descriptors(histogram: &Histogram) -> Vec<RangeDesc<'_>> {
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
        .map(|r| {
            let buckets = r.first_bucket..r.first_bucket + r.bucket_count();
            let counts = match histogram.bucket_bits() {
                BucketBits::Sixteen => Counts::U16(&sixteen[buckets]),
                BucketBits::ThirtyTwo => Counts::U32(&thirty_two[buckets]),
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

/// Streams the whole process's profile into `sink`.
///
/// # Safety
/// Sampling must be stopped and quiesced for the duration of the call.
pub unsafe fn write_profile<S: Sink>(
    settings: &Settings,
    sink: &mut S,
) -> Result<(), StreamError<S::Error>> {
    let all = modules::all();
    let pid = sys::getpid();
    let mut flags = 0;
    if program_sigprof::SHARED.load(Ordering::Relaxed) {
        flags |= header_flags::SAMPLING_SHARED_TIMER;
    }
    if pid != START_PID.load(Ordering::Relaxed) {
        flags |= header_flags::FORKED_CHILD;
    }
    let program_path = all
        .iter()
        .find(|m| m.info.is_main)
        .map_or(&[][..], |m| m.info.path.as_slice());
    let header = HeaderDesc {
        flags,
        pid,
        ppid: sys::getppid(),
        start_time_ns: START_TIME_NS.load(Ordering::Relaxed),
        end_time_ns: sys::clock_ns(sys::CLOCK_REALTIME),
        hz: settings.hz,
        sample_period_ns: sampler::measured_period_ns(),
        dimension: b"seconds",
        dimension_abbrev: b's',
        total_samples: sampler::TOTAL_SAMPLES.load(Ordering::Relaxed),
        unknown_samples: sampler::UNKNOWN_SAMPLES.load(Ordering::Relaxed),
        dropped_arcs: all.iter().map(|m| m.arcs.dropped()).sum(),
        program_name: &settings.program_name,
        program_path,
        ..HeaderDesc::default()
    };
    // Arc feeds: each visits the module's arc table without allocating; the count announced is the number of
    // distinct arcs now (arcs recorded by threads still running are cut or padded by the writer).
    let feeds: Vec<_> = all
        .iter()
        .map(|m| {
            move |emit: &mut dyn FnMut(Arc) -> bool| {
                m.arcs.for_each(|arc| {
                    emit(Arc {
                        caller_key: arc.caller_key,
                        caller_address: arc.caller_addr,
                        callee_address: arc.callee_addr,
                        count: arc.count,
                    });
                });
            }
        })
        .collect();
    let ranges: Vec<Vec<RangeDesc<'_>>> = all
        .iter()
        .map(|m| match &m.histogram {
            // SAFETY: the caller keeps sampling quiesced while the descriptors are alive.
            Some(h) => unsafe { range_descriptors(h) },
            None => Vec::new(),
        })
        .collect();
    let descriptors: Vec<ModuleDesc<'_>> = all
        .iter()
        .zip(&ranges)
        .zip(&feeds)
        .map(|((module, ranges), feed)| ModuleDesc {
            key: module.key,
            path: &module.info.path,
            name: &module.info.file_name,
            soname: &module.info.soname,
            build_id: &module.info.build_id,
            flags: module_flag_bits(module),
            load_order: module.load_order,
            unload_order: module.unload_order(),
            load_bias: module.bias as u64,
            samples: module.samples.load(Ordering::Relaxed),
            saturated_buckets: module
                .histogram
                .as_ref()
                .map_or(0, Histogram::saturated_buckets),
            histogram: module.histogram.as_ref().map(|h| HistogramDesc {
                bucket_bits: h.bucket_bits().bits(),
                bytes_per_bucket: BYTES_PER_BUCKET,
                ranges,
                encoding: Encoding::Auto,
            }),
            dropped_arcs: module.arcs.dropped(),
            arc_count: arc_count(module),
            arcs: Some(feed),
            ..ModuleDesc::default()
        })
        .collect();
    stream::write_profile(sink, &header, &descriptors).map(|_| ())
}

/// Writes the profile once, at normal termination. Later calls do nothing.
pub fn write_at_exit(settings: &Settings) {
    if DUMPED.swap(true, Ordering::SeqCst) {
        return;
    }
    sampler::stop_and_quiesce();
    for name in settings.selection.unmatched() {
        sys::stderr_line(&[
            b"mslprof: LD_PROFILE name '",
            name,
            b"' matched no module\n",
        ]);
    }
    let pid = sys::getpid();
    let forked_child = pid != START_PID.load(Ordering::Relaxed);
    let Some(path) = settings
        .output
        .path(pid, &settings.program_name, forked_child)
    else {
        return;
    };
    let path = Path::new(std::ffi::OsStr::from_bytes(&path));
    let written = write_atomically(path, |file| {
        // SAFETY: sampling was stopped and quiesced above and is not resumed.
        unsafe { write_profile(settings, &mut IoSink(file)) }.map_err(|e| match e {
            StreamError::Sink(io) => io,
            StreamError::Invalid(what) => {
                std::io::Error::new(std::io::ErrorKind::InvalidData, what)
            }
        })
    });
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
