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

use mslprof_format::model::{self, header_flags, module_flags};

use crate::config::Settings;
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

/// The whole process's profile as the format-spec model.
pub fn snapshot(settings: &Settings) -> model::Profile {
    let pid = sys::getpid();
    let modules: Vec<model::Module> = modules::all().iter().map(|m| module_snapshot(m)).collect();
    let mut flags = 0;
    if program_sigprof::SHARED.load(Ordering::Relaxed) {
        flags |= header_flags::SAMPLING_SHARED_TIMER;
    }
    if pid != START_PID.load(Ordering::Relaxed) {
        flags |= header_flags::FORKED_CHILD;
    }
    let mut incomplete_cause = model::IncompleteCause::None;
    let mut incomplete_signal = 0;
    crate::lifecycle::ending_header(&mut flags, &mut incomplete_cause, &mut incomplete_signal);
    let program_path = modules::all()
        .iter()
        .find(|m| m.info.is_main)
        .map(|m| m.info.path.clone());
    model::Profile {
        format: model::SourceFormat::Mslprof { major: 1, minor: 0 },
        header: model::Header {
            flags,
            incomplete_cause,
            incomplete_signal,
            pid,
            ppid: sys::getppid(),
            start_time_ns: START_TIME_NS.load(Ordering::Relaxed),
            end_time_ns: sys::clock_ns(sys::CLOCK_REALTIME),
            hz: settings.hz,
            sample_period_ns: sampler::measured_period_ns(),
            dimension: b"seconds".to_vec(),
            dimension_abbrev: b's',
            total_samples: sampler::TOTAL_SAMPLES.load(Ordering::Relaxed),
            unknown_samples: sampler::UNKNOWN_SAMPLES.load(Ordering::Relaxed),
            program_name: settings.program_name.clone(),
            program_path: program_path.unwrap_or_default(),
            dropped_arcs: modules.iter().map(|m| m.dropped_arcs).sum(),
            ..model::Header::default()
        },
        modules,
    }
}

fn module_snapshot(module: &LiveModule) -> model::Module {
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
    let histogram = module.histogram.as_ref().map(|h| {
        let entries = h.nonzero_buckets();
        let ranges = h
            .ranges()
            .iter()
            .map(|r| {
                let first = r.first_bucket as u64;
                let len = r.bucket_count() as u64;
                let range_entries = entries
                    .iter()
                    .filter(|(i, _)| (first..first + len).contains(i))
                    .map(|&(i, c)| (i - first, c));
                model::HistRange {
                    start: r.start,
                    end: r.end,
                    buckets: model::Buckets::Sparse {
                        len,
                        entries: range_entries.collect(),
                    },
                }
            })
            .collect();
        model::Histogram {
            bucket_bits: h.bucket_bits().bits(),
            ranges,
        }
    });
    model::Module {
        key: module.key,
        path: info.path.clone(),
        name: info.file_name.clone(),
        soname: info.soname.clone(),
        build_id: info.build_id.clone(),
        flags,
        load_order: module.load_order,
        unload_order: module.unload_order(),
        load_bias: module.bias as u64,
        samples: module.samples.load(Ordering::Relaxed),
        saturated_buckets: module
            .histogram
            .as_ref()
            .map_or(0, |h| h.saturated_buckets()),
        histogram,
        dropped_arcs: module.arcs.dropped(),
        arcs: crate::mcount::arcs_snapshot(module),
        ..model::Module::default()
    }
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
    for name in settings.selection.unmatched() {
        sys::stderr_line(&[
            b"mslprof: LD_PROFILE name '",
            name,
            b"' matched no module\n",
        ]);
    }
    let pid = sys::getpid();
    let forked_child = pid != START_PID.load(Ordering::Relaxed);
    let pid_named = crate::lifecycle::writes_pid_named_file(forked_child);
    let Some(path) = settings
        .output
        .path(pid, &settings.program_name, pid_named)
        .map(crate::lifecycle::output_path)
    else {
        return;
    };
    let profile = snapshot(settings);
    let path = Path::new(std::ffi::OsStr::from_bytes(&path));
    if let Err(error) =
        write_atomically(path, |file| crate::encoding::write_profile(&profile, file))
    {
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
