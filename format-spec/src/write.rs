//! The owned writer: turns a [`Profile`] into stream descriptors and hands them to the one encoder in `stream`.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::{self, Write};

use crate::WriteOptions;
use crate::layout::fits_compact_record;
use crate::model::*;
use crate::mslprof::merge_arcs;
use crate::stream::{
    self, Counts, HeaderDesc, HistogramDesc, ModuleDesc, RangeDesc, StackRecordDesc, StacksDesc,
    StreamError,
};

fn invalid(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Text bytes per bucket of a histogram, derived from its ranges (all ranges must agree).
fn bytes_per_bucket(h: &Histogram) -> io::Result<u32> {
    let mut found: Option<u64> = None;
    for r in &h.ranges {
        let len = r.buckets.len();
        let span = r
            .end
            .0
            .checked_sub(r.start.0)
            .ok_or_else(|| invalid("histogram range ends before it starts"))?;
        if len == 0 {
            if span != 0 {
                return Err(invalid("an empty histogram range must have start == end"));
            }
            continue;
        }
        if span % len != 0 {
            return Err(invalid(
                "histogram range length is not a multiple of its bucket count",
            ));
        }
        let bpb = span / len;
        if found.is_some_and(|f| f != bpb) {
            return Err(invalid("histogram ranges with different bytes per bucket"));
        }
        found = Some(bpb);
    }
    let bpb = found.unwrap_or(1);
    u32::try_from(bpb).map_err(|_| invalid("bytes per bucket above 2^30"))
}

fn check_module(m: &Module, keys: &HashSet<u32>) -> io::Result<()> {
    if let Some(h) = &m.histogram
        && h.bucket_bits == 16
        && !h
            .ranges
            .iter()
            .all(|r| r.buckets.nonzero().all(|(_, c)| c <= u32::from(u16::MAX)))
    {
        return Err(invalid("a 16-bit histogram holds a count above 65535"));
    }
    if m.arcs
        .iter()
        .any(|a| a.caller_key != UNKNOWN_KEY && !keys.contains(&a.caller_key))
    {
        return Err(invalid("an arc's caller key is not a module key"));
    }
    Ok(())
}

/// `flags` with COMPACT_ARCS set exactly when the module has arcs and every address fits a compact record
/// (SPEC.md §7.1).
fn compact_arcs_flag(flags: u32, arcs: &[Arc]) -> u32 {
    if !arcs.is_empty() && arcs.iter().all(fits_compact_record) {
        flags | module_flags::COMPACT_ARCS
    } else {
        flags & !module_flags::COMPACT_ARCS
    }
}

fn check_stacks(stacks: &Stacks, keys: &HashSet<u32>) -> io::Result<()> {
    if stacks
        .records
        .iter()
        .flat_map(|r| &r.frames)
        .any(|f| f.key != UNKNOWN_KEY && !keys.contains(&f.key))
    {
        return Err(invalid("a stack frame's key is not a module key"));
    }
    Ok(())
}

/// Writes `profile` as an mslprof file in the given byte order. See [`crate::write()`].
pub(crate) fn write(profile: &Profile, options: WriteOptions, out: impl Write) -> io::Result<()> {
    let mut keys = HashSet::with_capacity(profile.modules.len());
    for m in &profile.modules {
        if !keys.insert(m.key) {
            return Err(invalid("two modules share a key"));
        }
    }
    let h = &profile.header;
    let header = HeaderDesc {
        flags: h.flags,
        incomplete_cause: h.incomplete_cause.code(),
        incomplete_signal: h.incomplete_signal,
        pid: h.pid,
        ppid: h.ppid,
        start_time_ns: h.start_time_ns,
        end_time_ns: h.end_time_ns,
        hz: h.hz,
        sampling_sources: h.sampling_sources,
        sample_period_ns: h.sample_period_ns,
        dimension: &h.dimension,
        dimension_abbrev: h.dimension_abbrev,
        total_samples: h.total_samples,
        unknown_samples: h.unknown_samples,
        dropped_arcs: h.dropped_arcs,
        dropped_samples: h.dropped_samples,
        program_name: &h.program_name,
        program_path: &h.program_path,
        cpu_time: h.cpu_time,
    };
    let mut ranges: Vec<Vec<RangeDesc<'_>>> = Vec::with_capacity(profile.modules.len());
    let mut arcs: Vec<Vec<Arc>> = Vec::with_capacity(profile.modules.len());
    let mut bpbs = Vec::with_capacity(profile.modules.len());
    for m in &profile.modules {
        check_module(m, &keys)?;
        let mut module_ranges = Vec::new();
        let mut bpb = 0;
        if let Some(hist) = &m.histogram {
            bpb = bytes_per_bucket(hist)?;
            for r in &hist.ranges {
                let counts = match &r.buckets {
                    Buckets::Dense16(v) => Counts::U16(v),
                    Buckets::Dense32(v) => Counts::U32(v),
                    Buckets::Sparse { len, entries } => Counts::Sparse { len: *len, entries },
                };
                module_ranges.push(RangeDesc {
                    start: r.start,
                    end: r.end,
                    counts,
                });
            }
        }
        ranges.push(module_ranges);
        bpbs.push(bpb);
        arcs.push(merge_arcs(
            m.arcs.iter().copied().filter(|a| a.count != 0).collect(),
        ));
    }
    let feeds: Vec<_> = arcs
        .iter()
        .map(|list| {
            move |emit: &mut dyn FnMut(Arc) -> bool| {
                for arc in list {
                    if !emit(*arc) {
                        break;
                    }
                }
            }
        })
        .collect();
    let mut descs = Vec::with_capacity(profile.modules.len());
    for (i, m) in profile.modules.iter().enumerate() {
        descs.push(ModuleDesc {
            key: m.key,
            path: &m.path,
            name: &m.name,
            soname: &m.soname,
            build_id: &m.build_id,
            flags: compact_arcs_flag(m.flags, &arcs[i]),
            load_order: m.load_order,
            unload_order: m.unload_order,
            load_bias: m.load_bias,
            samples: m.samples,
            saturated_buckets: m.saturated_buckets,
            dropped_arcs: m.dropped_arcs,
            histogram: m.histogram.as_ref().map(|hist| HistogramDesc {
                bucket_bits: hist.bucket_bits,
                bytes_per_bucket: bpbs[i],
                ranges: &ranges[i],
                encoding: options.encoding,
            }),
            arc_count: arcs[i].len() as u64,
            arcs: Some(&feeds[i]),
            plan: stream::Plan::default(),
            plan_slot: None,
        });
    }
    let stacks = match &profile.stacks {
        Some(stacks) => {
            check_stacks(stacks, &keys)?;
            let normal = stacks.records.iter().all(|r| r.count != 0)
                && stacks
                    .records
                    .windows(2)
                    .all(|w| (w[0].flags, &w[0].frames) < (w[1].flags, &w[1].frames));
            if normal {
                Some(Cow::Borrowed(stacks))
            } else {
                let mut stacks = stacks.clone();
                stacks.normalize();
                Some(Cow::Owned(stacks))
            }
        }
        None => None,
    };
    let feed_stacks = |emit: &mut dyn FnMut(&StackRecordDesc<'_>) -> bool| {
        for record in stacks.iter().flat_map(|s| &s.records) {
            let frame = |i: usize| record.frames[i];
            let desc = StackRecordDesc {
                count: record.count,
                flags: record.flags,
                depth: record.frames.len(),
                frame: &frame,
            };
            if !emit(&desc) {
                break;
            }
        }
    };
    let stacks_desc = stacks.as_ref().map(|s| StacksDesc {
        max_depth: s.max_depth,
        dropped: s.dropped,
        records: &feed_stacks,
    });
    let mut sink = stream::IoSink(io::BufWriter::new(out));
    match stream::write_profile_with_stacks(
        &mut sink,
        options.big_endian,
        &header,
        descs.as_slice(),
        stacks_desc.as_ref(),
    ) {
        Ok(_) => sink.0.flush(),
        Err(StreamError::Sink(e)) => Err(e),
        Err(StreamError::Invalid(what)) => Err(invalid(what)),
    }
}
