//! `-i`: a summary of each profile file instead of a report (gprof's record counts for GNU and BSD files;
//! header, modules and their data for mslprof profiles).

use std::fmt::Write as _;

use mslprof_format::model::{SourceFormat, module_flags};

use crate::input::Input;

/// gprof's `-i` text for GNU or BSD files: how many records of each kind each file holds.
pub fn gnu(inputs: &[Input]) -> String {
    let mut info = String::new();
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    for input in inputs {
        let counts = input.records.unwrap_or_default();
        let (nh, na, nb) = (
            counts.histogram_records,
            counts.call_graph_records,
            counts.basic_block_records,
        );
        let _ = writeln!(
            info,
            "File `{}' (version {}) contains:",
            input.path.display(),
            counts.version
        );
        let _ = writeln!(info, "\t{nh} histogram record{}", plural(nh));
        let _ = writeln!(info, "\t{na} call-graph record{}", plural(na));
        let _ = writeln!(info, "\t{nb} basic-block count record{}", plural(nb));
    }
    info
}

/// `-i` for mslprof profiles: each file's header and one line per load instance.
pub fn mslprof(inputs: &[Input]) -> String {
    let mut info = String::new();
    for input in inputs {
        let p = &input.profile;
        let h = &p.header;
        let _ = writeln!(
            info,
            "File `{}' (mslprof {}) pid {} program {}: {} load instances, {} Hz, sample period {} ns, {} samples ({} outside any module), {} arcs dropped",
            input.path.display(),
            match p.format {
                SourceFormat::Mslprof { major, minor } => format!("{major}.{minor}"),
                _ => "?".into(),
            },
            h.pid,
            String::from_utf8_lossy(&h.program_name),
            p.modules.len(),
            h.hz,
            h.sample_period_ns,
            h.total_samples,
            h.unknown_samples,
            h.dropped_arcs
        );
        if let Some(cpu) = h.cpu_time {
            let _ = writeln!(info, "{}", crate::cputime::info_line(cpu));
        }
        for m in &p.modules {
            let _ = writeln!(
                info,
                "\tkey {} {} ({}){}{}: {}-bit buckets of {} bytes, {} ranges, {} samples, {} arcs, build-id {}",
                m.key,
                String::from_utf8_lossy(&m.name),
                String::from_utf8_lossy(&m.path),
                if m.is_profiled() { "" } else { " not profiled" },
                if m.flags & module_flags::UNLOADED != 0 {
                    " unloaded"
                } else {
                    ""
                },
                m.histogram.as_ref().map_or(0, |h| h.bucket_bits),
                m.histogram
                    .as_ref()
                    .and_then(|h| h.ranges.first())
                    .map_or(0, |r| (r.end - r.start) / r.buckets.len().max(1)),
                m.histogram.as_ref().map_or(0, |h| h.ranges.len()),
                m.samples,
                m.arcs.len(),
                m.build_id
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            );
        }
    }
    info
}
