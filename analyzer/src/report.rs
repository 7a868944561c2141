//! The whole analysis, from decoded profiles and module files to the printed report: GNU input gives
//! exactly GNU gprof's report, mslprof input the multi-module one (warnings and unprofiled modules at
//! the top, a module-index column in the flat profile, the module table at the end).

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mslprof_format::model::{Buckets, HistRange, Histogram, Profile, SourceFormat, UNKNOWN_KEY};

use crate::arcs::{RawArc, TallyStats, tally};
use crate::graph::{Graph, ModuleView, Sym};
use crate::histogram::{self, SampleTotals};
use crate::symbols::{self, Demangle, FunctionSymbol, SelectOptions};
use crate::symspec::{Filters, Table};

/// Everything the command line decides about the report.
#[derive(Clone, Debug)]
pub struct Options {
    pub specs: Vec<(Table, String)>,
    /// Flat profile / call graph requested or suppressed (gprof's output_style and user_specified).
    pub flat: Option<bool>,
    pub graph: Option<bool>,
    pub brief: bool,
    pub ignore_zeros: bool,
    pub no_static: bool,
    pub ignore_non_functions: bool,
    pub bsd: bool,
    pub width: usize,
    pub print_path: bool,
    pub inline_file_names: bool,
    pub demangle: Demangle,
    pub sum: bool,
    pub file_info: bool,
    pub external_symbols: Option<PathBuf>,
    /// Show load instances of one file separately instead of merging them.
    pub separate_instances: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            specs: Vec::new(),
            flat: None,
            graph: None,
            brief: false,
            ignore_zeros: true,
            no_static: false,
            ignore_non_functions: false,
            bsd: false,
            width: 80,
            print_path: false,
            inline_file_names: false,
            demangle: Demangle::Auto,
            sum: false,
            file_info: false,
            external_symbols: None,
            separate_instances: false,
        }
    }
}

/// Printing parameters shared by the tables.
#[derive(Debug)]
pub struct Style {
    pub bsd: bool,
    pub descriptions: bool,
    pub ignore_zeros: bool,
    pub output_width: usize,
    pub hz: f64,
    pub granularity: i64,
    pub dimension: String,
    pub dimension_abbrev: char,
    pub print_path: bool,
    pub inline_file_names: bool,
    pub multi_module: bool,
    pub first_output: Cell<bool>,
}

impl Style {
    /// Separate tables with a form feed, as gprof does.
    pub fn begin_section(&self, out: &mut String) {
        if self.first_output.get() {
            self.first_output.set(false);
        } else {
            out.push_str("\u{c}\n");
        }
    }
}

/// A failure that stops the report: the file it concerns and what is wrong.
#[derive(Debug)]
pub struct Failure {
    pub file: String,
    pub problem: String,
}

impl Failure {
    fn new(file: impl AsRef<Path>, problem: impl Into<String>) -> Failure {
        Failure {
            file: file.as_ref().display().to_string(),
            problem: problem.into(),
        }
    }
}

/// One input profile file.
#[derive(Clone, Debug)]
pub struct Input {
    pub path: PathBuf,
    pub profile: Profile,
}

/// Which output sections to print, by gprof's rule: sections the user did not mention are printed only
/// when nothing at all was requested.
fn sections(opts: &Options) -> (bool, bool) {
    let requested =
        opts.flat == Some(true) || opts.graph == Some(true) || opts.sum || opts.file_info;
    if requested {
        (opts.flat == Some(true), opts.graph == Some(true))
    } else {
        (opts.flat.is_none(), opts.graph.is_none())
    }
}

/// Module merged over inputs (load instances of one file with one build-id).
#[derive(Clone, Debug, Default)]
struct MergedModule {
    name: String,
    path: String,
    build_id: Vec<u8>,
    profiled: bool,
    main: bool,
    samples: u64,
    saturated: u64,
    dropped_arcs: u64,
    instances: u32,
    ranges: Vec<(u64, u64, HashMap<u64, u64>, u64)>,
}

fn add_histogram(
    ranges: &mut Vec<(u64, u64, HashMap<u64, u64>, u64)>,
    h: &Histogram,
) -> Result<(), String> {
    for r in &h.ranges {
        let len = r.buckets.len();
        let idx = match ranges.iter().position(|x| x.0 == r.start && x.1 == r.end) {
            Some(i) => {
                if ranges[i].3 != len {
                    return Err("histogram records for one range differ in size".into());
                }
                i
            }
            None => {
                if ranges.iter().any(|x| r.start < x.1 && x.0 < r.end) {
                    return Err("overlapping histogram records".into());
                }
                ranges.push((r.start, r.end, HashMap::new(), len));
                ranges.len() - 1
            }
        };
        for (i, c) in r.buckets.nonzero() {
            *ranges[idx].2.entry(i).or_insert(0) += u64::from(c);
        }
    }
    Ok(())
}

fn ranges_to_histogram(ranges: &[(u64, u64, HashMap<u64, u64>, u64)]) -> Histogram {
    Histogram {
        bucket_bits: 32,
        ranges: ranges
            .iter()
            .map(|(start, end, map, len)| {
                let mut entries: Vec<(u64, u32)> = map
                    .iter()
                    .map(|(&i, &c)| (i, c.min(u64::from(u32::MAX)) as u32))
                    .collect();
                entries.sort_unstable();
                HistRange {
                    start: *start,
                    end: *end,
                    buckets: Buckets::Sparse { len: *len, entries },
                }
            })
            .collect(),
    }
}

fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

fn read_external_symbols(path: &Path) -> Result<Vec<FunctionSymbol>, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| Failure::new(path, e.to_string()))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(a), Some(t), Some(n)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if t != "t" && t != "T" {
            continue;
        }
        let Ok(addr) = u64::from_str_radix(a.trim_start_matches("0x"), 16) else {
            continue;
        };
        out.push(FunctionSymbol {
            name: n.to_string(),
            addr,
            end_addr: 0,
            is_func: true,
            is_static: t == "t",
            file: None,
            line: 0,
        });
    }
    if out.is_empty() {
        return Err(Failure::new(path, "has no symbols"));
    }
    Ok(out)
}

fn push_module_syms(g: &mut Graph, module: usize, syms: Vec<FunctionSymbol>, demangle: Demangle) {
    let start = g.syms.len();
    for s in syms {
        g.syms.push(Sym {
            display: symbols::demangle(&s.name, demangle),
            name: s.name,
            module,
            addr: s.addr,
            end_addr: s.end_addr,
            is_func: s.is_func,
            is_static: s.is_static,
            file: s.file,
            line: s.line,
            ..Sym::default()
        });
    }
    g.modules[module].syms = start..g.syms.len();
}

/// The report for GNU (single-module) profiles, and the `gmon.sum` bytes when `-s` is given.
pub struct Outcome {
    pub report: String,
    pub warnings: Vec<String>,
    pub summary: Option<Vec<u8>>,
}

/// Analyse GNU gmon.out inputs against `exe`.
pub fn run_gnu(opts: &Options, exe: &Path, inputs: &[Input]) -> Result<Outcome, Failure> {
    let mut warnings = Vec::new();
    let select = SelectOptions {
        no_static: opts.no_static,
        ignore_non_functions: opts.ignore_non_functions,
    };
    let (syms, text_end) = if let Some(ext) = &opts.external_symbols {
        (symbols::finalize(read_external_symbols(ext)?, 0), 0)
    } else {
        let ms = symbols::load(exe, select).map_err(|e| Failure::new(exe, e.to_string()))?;
        if ms.dynamic_only {
            warnings.push(format!(
                "{}: symbol table is stripped; only exported functions are known",
                exe.display()
            ));
        }
        let end = ms.symbols.last().map(|s| s.end_addr).unwrap_or(0);
        (ms.symbols, end)
    };
    let _ = text_end;
    let mut g = Graph::default();
    g.modules.push(ModuleView {
        name: file_name(&exe.to_string_lossy()),
        path: exe.display().to_string(),
        unit: 2,
        gnu_last_symbol: true,
        profiled: true,
        ..ModuleView::default()
    });
    push_module_syms(&mut g, 0, syms, opts.demangle);
    g.nsyms = g.syms.len();

    let mut specs = opts.specs.clone();
    for d in [
        "_gprof_mcount",
        "mcount",
        "_mcount",
        "__mcount",
        "__mcount_internal",
        "__mcleanup",
    ] {
        specs.push((Table::ExclTime, d.to_string()));
        specs.push((Table::ExclGraph, d.to_string()));
        specs.push((Table::ExclFlat, d.to_string()));
    }
    let filters = Filters::build(&g, &specs);

    // Histograms summed over files, arcs tallied in file order.
    let mut ranges = Vec::new();
    let mut hz = 0u32;
    let mut dimension = String::from("seconds");
    let mut abbrev = 's';
    let mut have_hist = false;
    let mut have_arcs = false;
    let mut stats = TallyStats::default();
    let mut info = String::new();
    for input in inputs {
        let m = &input.profile.modules[0];
        if opts.file_info {
            let version = match input.profile.format {
                SourceFormat::Gnu { version } => version,
                _ => 0,
            };
            let nh = m.histogram.as_ref().map_or(0, |h| h.ranges.len());
            let na = m.arcs.len();
            let nb = usize::from(!m.basic_blocks.is_empty());
            let _ = writeln!(
                info,
                "File `{}' (version {}) contains:",
                input.path.display(),
                version
            );
            let _ = writeln!(
                info,
                "\t{} histogram record{}",
                nh,
                if nh == 1 { "" } else { "s" }
            );
            let _ = writeln!(
                info,
                "\t{} call-graph record{}",
                na,
                if na == 1 { "" } else { "s" }
            );
            let _ = writeln!(
                info,
                "\t{} basic-block count record{}",
                nb,
                if nb == 1 { "" } else { "s" }
            );
        }
        if let Some(h) = &m.histogram {
            if !have_hist {
                hz = input.profile.header.hz;
                dimension = String::from_utf8_lossy(&input.profile.header.dimension).into_owned();
                abbrev = char::from(input.profile.header.dimension_abbrev);
            }
            have_hist |= !h.ranges.is_empty();
            add_histogram(&mut ranges, h).map_err(|e| Failure::new(&input.path, e))?;
        }
        for a in &m.arcs {
            have_arcs = true;
            tally(
                &mut g,
                RawArc {
                    caller_module: Some(0),
                    caller_address: a.caller_address,
                    callee_module: 0,
                    callee_address: a.callee_address,
                    count: a.count & 0xffff_ffff,
                },
                &filters,
                true,
                &mut stats,
            );
        }
    }
    if opts.file_info {
        return Ok(Outcome {
            report: info,
            warnings,
            summary: None,
        });
    }
    let hist = ranges_to_histogram(&ranges);
    if have_hist && opts.external_symbols.is_none() {
        check_belongs(&g, &hist, exe, inputs)?;
    }
    let summary = if opts.sum {
        Some(gnu_summary(&g, &hist, hz, &dimension, abbrev, inputs))
    } else {
        None
    };
    let (want_flat, want_graph) = sections(opts);
    if opts.sum {
        return Ok(Outcome {
            report: String::new(),
            warnings,
            summary,
        });
    }
    histogram::scale_entries(&mut g);
    let mut totals = SampleTotals::default();
    if have_hist {
        histogram::assign(&mut g, 0, &hist, &filters, &mut totals);
    }
    let scale = ranges
        .first()
        .map(|r| histogram::hist_scale(r.0, r.1, r.3, 2))
        .unwrap_or(0.0);
    let style = Style {
        bsd: opts.bsd,
        descriptions: !opts.brief,
        ignore_zeros: opts.ignore_zeros,
        output_width: opts.width,
        hz: f64::from(hz),
        granularity: (scale as i64).wrapping_mul(2),
        dimension,
        dimension_abbrev: abbrev,
        print_path: opts.print_path,
        inline_file_names: opts.inline_file_names,
        multi_module: false,
        first_output: Cell::new(true),
    };
    let report = render(
        &mut g,
        &filters,
        &style,
        totals,
        have_hist && want_flat,
        have_arcs && want_graph,
        have_arcs,
    );
    Ok(Outcome {
        report,
        warnings,
        summary,
    })
}

fn check_belongs(g: &Graph, hist: &Histogram, exe: &Path, inputs: &[Input]) -> Result<(), Failure> {
    let (Some(first), Some(last)) = (g.syms.first(), g.syms[..g.nsyms].last()) else {
        return Ok(());
    };
    let lo = first.addr;
    let hi = last.end_addr.max(last.addr);
    let overlaps = hist.ranges.iter().any(|r| r.start <= hi && lo < r.end);
    if !overlaps {
        let prof = inputs
            .first()
            .map(|i| i.path.display().to_string())
            .unwrap_or_default();
        return Err(Failure::new(
            exe,
            format!("does not belong to {prof}: its code is not where the profile's samples are"),
        ));
    }
    Ok(())
}

fn render(
    g: &mut Graph,
    filters: &Filters,
    style: &Style,
    totals: SampleTotals,
    want_flat: bool,
    want_graph: bool,
    have_arcs: bool,
) -> String {
    let mut out = String::new();
    let (time_sorted, print_time) = if have_arcs {
        crate::callgraph::assemble(g, filters)
    } else {
        (Vec::new(), 0.0)
    };
    if style.bsd {
        if want_graph {
            crate::callgraph::print(&mut out, g, &time_sorted, print_time, style);
        }
        if want_flat {
            crate::flat::print(&mut out, g, totals.total_time, filters, style);
        }
    } else {
        if want_flat {
            crate::flat::print(&mut out, g, totals.total_time, filters, style);
        }
        if want_graph {
            crate::callgraph::print(&mut out, g, &time_sorted, print_time, style);
        }
    }
    if want_graph {
        crate::callgraph::print_index(&mut out, g, style);
    }
    out
}

/// gprof's `gmon.sum`: GNU format, histograms then arcs (symbol addresses, per caller in table order).
fn gnu_summary(
    g: &Graph,
    hist: &Histogram,
    hz: u32,
    dim: &str,
    abbrev: char,
    inputs: &[Input],
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"gmon");
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 12]);
    for r in &hist.ranges {
        out.push(0);
        out.extend_from_slice(&r.start.to_le_bytes());
        out.extend_from_slice(&r.end.to_le_bytes());
        out.extend_from_slice(&(r.buckets.len() as u32).to_le_bytes());
        out.extend_from_slice(&hz.to_le_bytes());
        let mut d = [0u8; 15];
        for (i, b) in dim.bytes().take(15).enumerate() {
            d[i] = b;
        }
        out.extend_from_slice(&d);
        out.push(abbrev as u8);
        let mut dense = vec![0u16; r.buckets.len() as usize];
        for (i, c) in r.buckets.nonzero() {
            dense[i as usize] = c as u16;
        }
        for v in dense {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    for s in 0..g.nsyms {
        for &a in g.syms[s].children.iter().rev() {
            let arc = &g.arcs[a];
            out.push(1);
            out.extend_from_slice(&g.syms[arc.parent].addr.to_le_bytes());
            out.extend_from_slice(&g.syms[arc.child].addr.to_le_bytes());
            out.extend_from_slice(&(arc.count as u32).to_le_bytes());
        }
    }
    let bbs: Vec<_> = inputs
        .iter()
        .flat_map(|i| i.profile.modules[0].basic_blocks.iter().copied())
        .collect();
    if !bbs.is_empty() {
        out.push(2);
        out.extend_from_slice(&(bbs.len() as u32).to_le_bytes());
        for b in bbs {
            out.extend_from_slice(&b.address.to_le_bytes());
            out.extend_from_slice(&b.count.to_le_bytes());
        }
    }
    out
}

/// Analyse mslprof (multi-module) inputs. `exe` replaces the main program's recorded path.
pub fn run_mslprof(
    opts: &Options,
    exe: Option<&Path>,
    inputs: &[Input],
) -> Result<Outcome, Failure> {
    let mut warnings: Vec<String> = Vec::new();
    let mut merged: Vec<MergedModule> = Vec::new();
    let mut by_identity: HashMap<(Vec<u8>, Vec<u8>, u32), usize> = HashMap::new();
    let mut raw_arcs: Vec<RawArc> = Vec::new();
    let mut total_samples = 0u64;
    let mut unknown_samples = 0u64;
    let mut period_ns = 0u64;
    let mut hz_nominal = 0u32;
    let mut info = String::new();
    for (n, input) in inputs.iter().enumerate() {
        let p = &input.profile;
        let h = &p.header;
        if n == 0 {
            period_ns = h.sample_period_ns;
            hz_nominal = h.hz;
        }
        total_samples += h.total_samples;
        unknown_samples += h.unknown_samples;
        if h.flags & mslprof_format::model::header_flags::INCOMPLETE != 0 {
            warnings.push(format!(
                "{}: profile is incomplete (the process ended abnormally: {:?}{})",
                input.path.display(),
                h.incomplete_cause,
                if h.incomplete_signal != 0 {
                    format!(", signal {}", h.incomplete_signal)
                } else {
                    String::new()
                }
            ));
        }
        if h.dropped_arcs != 0 {
            warnings.push(format!(
                "{}: {} arcs were dropped because an arc table was full; call counts are low",
                input.path.display(),
                h.dropped_arcs
            ));
        }
        if opts.file_info {
            let _ = writeln!(
                info,
                "File `{}' (mslprof {}) pid {} program {}: {} modules, {} Hz, sample period {} ns, {} samples ({} outside any module)",
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
                h.unknown_samples
            );
        }
        let mut keymap: HashMap<u32, usize> = HashMap::new();
        for m in &p.modules {
            let path = String::from_utf8_lossy(&m.path).into_owned();
            let instance = if opts.separate_instances { m.key } else { 0 };
            let id_key = (m.path.clone(), m.build_id.clone(), instance);
            let id = *by_identity.entry(id_key).or_insert_with(|| {
                merged.push(MergedModule {
                    name: if m.name.is_empty() {
                        file_name(&path)
                    } else {
                        String::from_utf8_lossy(&m.name).into_owned()
                    },
                    path: path.clone(),
                    build_id: m.build_id.clone(),
                    main: m.is_main_program(),
                    ..MergedModule::default()
                });
                merged.len() - 1
            });
            keymap.insert(m.key, id);
            let mm = &mut merged[id];
            mm.instances += 1;
            mm.profiled |= m.is_profiled();
            mm.samples += m.samples;
            mm.saturated += m.saturated_buckets;
            mm.dropped_arcs += m.dropped_arcs;
            if opts.file_info {
                let _ = writeln!(
                    info,
                    "\tkey {} {} ({}){}: {}-bit buckets, {} ranges, {} samples, {} arcs, build-id {}",
                    m.key,
                    String::from_utf8_lossy(&m.name),
                    path,
                    if m.is_profiled() { "" } else { " not profiled" },
                    m.histogram.as_ref().map_or(0, |h| h.bucket_bits),
                    m.histogram.as_ref().map_or(0, |h| h.ranges.len()),
                    m.samples,
                    m.arcs.len(),
                    m.build_id
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                );
            }
            if let Some(hist) = &m.histogram {
                add_histogram(&mut merged[id].ranges, hist)
                    .map_err(|e| Failure::new(&input.path, e))?;
            }
        }
        for m in &p.modules {
            let callee_module = keymap[&m.key];
            for a in &m.arcs {
                let caller_module = if a.caller_key == UNKNOWN_KEY {
                    None
                } else {
                    keymap.get(&a.caller_key).copied()
                };
                raw_arcs.push(RawArc {
                    caller_module,
                    caller_address: a.caller_address,
                    callee_module,
                    callee_address: a.callee_address,
                    count: a.count,
                });
            }
        }
    }
    if opts.file_info {
        return Ok(Outcome {
            report: info,
            warnings,
            summary: None,
        });
    }
    if opts.sum {
        return Err(Failure::new(
            inputs.first().map(|i| i.path.clone()).unwrap_or_default(),
            "-s for mslprof profiles needs the format-spec writer, which is not merged yet",
        ));
    }

    // Symbols of each profiled module.
    let select = SelectOptions {
        no_static: opts.no_static,
        ignore_non_functions: opts.ignore_non_functions,
    };
    let mut g = Graph::default();
    for (i, mm) in merged.iter().enumerate() {
        let file: PathBuf = match (mm.main, exe) {
            (true, Some(e)) => e.to_path_buf(),
            _ => PathBuf::from(&mm.path),
        };
        g.modules.push(ModuleView {
            name: mm.name.clone(),
            path: file.display().to_string(),
            unit: 1,
            gnu_last_symbol: false,
            samples: mm.samples,
            profiled: mm.profiled,
            ..ModuleView::default()
        });
        if mm.saturated != 0 {
            warnings.push(format!(
                "{}: {} histogram buckets saturated at 65535; its times are too low (use LD_PROFILEBUCKET_SIZE=32)",
                mm.name, mm.saturated
            ));
        }
        if mm.dropped_arcs != 0 {
            warnings.push(format!(
                "{}: {} arcs dropped (arc table full)",
                mm.name, mm.dropped_arcs
            ));
        }
        if !mm.profiled {
            let s = g.syms.len();
            g.modules[i].syms = s..s;
            continue;
        }
        match symbols::load(&file, select) {
            Ok(ms) => {
                if !mm.build_id.is_empty()
                    && ms
                        .build_id
                        .as_deref()
                        .is_some_and(|b| b != mm.build_id.as_slice())
                {
                    warnings.push(format!(
                        "{}: build-id differs from the profiled one (rebuilt since the run?); its report may be wrong",
                        file.display()
                    ));
                }
                if ms.dynamic_only {
                    warnings.push(format!(
                        "{}: symbol table is chopped (stripped); only exported functions are known, callers inside it may be misattributed",
                        file.display()
                    ));
                }
                push_module_syms(&mut g, i, ms.symbols, opts.demangle);
            }
            Err(e) => {
                warnings.push(format!(
                    "{}: {}; its time is not attributed to functions",
                    file.display(),
                    e
                ));
                let s = g.syms.len();
                g.modules[i].syms = s..s;
            }
        }
    }
    g.nsyms = g.syms.len();
    qualify_ambiguous(&mut g);

    let mut specs = opts.specs.clone();
    for d in [
        "_gprof_mcount",
        "mcount",
        "_mcount",
        "__mcount",
        "__mcount_internal",
        "__mcleanup",
    ] {
        specs.push((Table::ExclTime, d.to_string()));
        specs.push((Table::ExclGraph, d.to_string()));
        specs.push((Table::ExclFlat, d.to_string()));
    }
    let filters = Filters::build(&g, &specs);
    let mut stats = TallyStats::default();
    let have_arcs = !raw_arcs.is_empty();
    for a in raw_arcs {
        tally(&mut g, a, &filters, false, &mut stats);
    }
    histogram::scale_entries(&mut g);
    let mut totals = SampleTotals::default();
    let mut have_hist = false;
    for (i, mm) in merged.iter().enumerate() {
        if mm.ranges.is_empty() || g.modules[i].syms.is_empty() {
            continue;
        }
        have_hist = true;
        let h = ranges_to_histogram(&mm.ranges);
        histogram::assign(&mut g, i, &h, &filters, &mut totals);
    }
    let granularity = merged
        .iter()
        .find_map(|m| m.ranges.first().map(|r| ((r.1 - r.0) / r.3.max(1)) as i64))
        .unwrap_or(0);
    let hz = if period_ns > 0 {
        1e9 / period_ns as f64
    } else {
        f64::from(hz_nominal.max(1))
    };
    let style = Style {
        bsd: opts.bsd,
        descriptions: !opts.brief,
        ignore_zeros: opts.ignore_zeros,
        output_width: opts.width,
        hz,
        granularity,
        dimension: "seconds".into(),
        dimension_abbrev: 's',
        print_path: opts.print_path,
        inline_file_names: opts.inline_file_names,
        multi_module: true,
        first_output: Cell::new(true),
    };
    let (want_flat, want_graph) = sections(opts);
    let mut out = String::new();
    for w in &warnings {
        let _ = writeln!(out, "mslprof: warning: {w}");
    }
    let total = total_samples.max(1) as f64;
    let unprofiled: Vec<_> = merged.iter().filter(|m| !m.profiled).collect();
    if !unprofiled.is_empty() || unknown_samples != 0 {
        out.push_str("Modules loaded but not profiled (share of all samples):\n");
        for m in &unprofiled {
            let _ = writeln!(
                out,
                "  {:6.2}%  {}  {}",
                100.0 * m.samples as f64 / total,
                m.name,
                m.path
            );
        }
        if unknown_samples != 0 {
            let _ = writeln!(
                out,
                "  {:6.2}%  <outside any module>",
                100.0 * unknown_samples as f64 / total
            );
        }
        out.push('\n');
    }
    let body = render(
        &mut g,
        &filters,
        &style,
        totals,
        have_hist && want_flat,
        have_arcs && want_graph,
        have_arcs,
    );
    out.push_str(&body);
    out.push_str("\u{c}\nModule table\n\n index  samples   module  path\n");
    for (i, m) in merged.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:>6}  {:6.2}%  {}{}  {}{}",
            i,
            100.0 * m.samples as f64 / total,
            m.name,
            if m.profiled { "" } else { " (not profiled)" },
            g.modules[i].path,
            if m.instances > 1 {
                format!("  ({} load instances)", m.instances)
            } else {
                String::new()
            }
        );
    }
    Ok(Outcome {
        report: out,
        warnings: Vec::new(),
        summary: None,
    })
}

/// Give names that occur in more than one module a `@module` qualifier.
fn qualify_ambiguous(g: &mut Graph) {
    let mut seen: HashMap<&str, (usize, bool)> = HashMap::new();
    for s in &g.syms[..g.nsyms] {
        seen.entry(s.name.as_str())
            .and_modify(|e| {
                if e.0 != s.module {
                    e.1 = true;
                }
            })
            .or_insert((s.module, false));
    }
    let ambiguous: std::collections::HashSet<String> = seen
        .into_iter()
        .filter(|(_, v)| v.1)
        .map(|(k, _)| k.to_string())
        .collect();
    for s in 0..g.nsyms {
        if ambiguous.contains(&g.syms[s].name) {
            let q = format!("@{}", g.modules[g.syms[s].module].name);
            g.syms[s].display.push_str(&q);
            g.syms[s].qualifier = q;
        }
    }
}
