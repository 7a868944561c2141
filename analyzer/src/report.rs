//! The whole analysis, from decoded profiles and module files to the printed report: GNU input gives
//! exactly GNU gprof's report, mslprof input the multi-module one (warnings and unprofiled modules at
//! the top, a module-index column in the flat profile, the module table at the end).

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mslprof_format::model::{
    Buckets, HistRange, Histogram, IncompleteCause, Profile, SourceFormat, UNKNOWN_KEY,
};

use crate::arcs::{RawArc, TallyStats, tally};
use crate::graph::{Graph, ModuleView, Sym};
use crate::histogram::{self, SampleTotals};
use crate::output::Out;
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
    /// gprof's `--file-format`: the layout GNU/BSD input is read in and `gmon.sum` is written in.
    pub file_format: mslprof_format::InputFormat,
    /// `-l`: charge samples to source lines instead of functions.
    pub line: bool,
    /// `-C`/`-Z`: the execution-count tally requested or suppressed.
    pub exec: Option<bool>,
    /// `-A`/`-J`: annotated source requested or suppressed, and how it is printed.
    pub anno: Option<bool>,
    pub annotate: crate::annotate::AnnotateOptions,
    /// `-r`: the suggested function order.
    pub function_order: bool,
    /// `-R map_file`: the suggested object-file order, from an nm-style map.
    pub file_order: Option<PathBuf>,
    /// mslprof input: no row for the profiler's own time.
    pub hide_overhead: bool,
    /// mslprof input: percentages of all samples of the process instead of the selected modules'.
    pub share_of_process: bool,
    /// mslprof input: list modules under 0.05 % one by one.
    pub all_modules: bool,
    /// `-c`: add the arcs of call instructions the run never took, with a zero count.
    pub static_calls: bool,
    /// `-d[num]`: gprof's debugging bits; mslprof prints 128 (symbols) and 256 (`-c`) to stderr.
    pub debug: u32,
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
            file_format: mslprof_format::InputFormat::Auto,
            line: false,
            exec: None,
            anno: None,
            annotate: crate::annotate::AnnotateOptions::default(),
            function_order: false,
            file_order: None,
            hide_overhead: false,
            share_of_process: false,
            all_modules: false,
            static_calls: false,
            debug: 0,
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
    /// `-l`: names carry `(file:line @ address)`.
    pub line_granularity: bool,
    pub multi_module: bool,
    pub first_output: Cell<bool>,
    /// mslprof input: what 100 % is, printed above the flat profile.
    pub share_note: Option<String>,
}

impl Style {
    /// Separate tables with a form feed, as gprof does.
    pub fn begin_section(&self, out: &mut Out) {
        if self.first_output.get() {
            self.first_output.set(false);
        } else {
            out.push_str("\u{c}\n");
        }
    }

    /// gprof's `granularity: each sample hit covers N byte(s)` line, completed when `time` (in samples) is
    /// positive by ` for P% of T <dimension>` and a blank line. Returns whether `time` was positive.
    pub fn write_granularity(&self, out: &mut Out, time: f64, dimension: &str) -> bool {
        let _ = write!(
            out,
            "\ngranularity: each sample hit covers {} byte(s)",
            self.granularity
        );
        if time > 0.0 {
            let _ = write!(
                out,
                " for {:.2}% of {:.2} {}\n\n",
                crate::cformat::CFloat(100.0 / time),
                crate::cformat::CFloat(time / self.hz),
                dimension
            );
        }
        time > 0.0
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
    /// How many records of each kind a GNU or BSD file holds (read only for `-i`).
    pub records: Option<mslprof_format::RecordCounts>,
}

/// Which output sections to print, by gprof's rule: sections the user did not mention are printed only
/// when nothing at all was requested.
fn sections(opts: &Options) -> (bool, bool) {
    let requested = opts.flat == Some(true)
        || opts.graph == Some(true)
        || opts.exec == Some(true)
        || opts.anno == Some(true)
        || opts.function_order
        || opts.file_order.is_some()
        || opts.sum
        || opts.file_info;
    if requested {
        (opts.flat == Some(true), opts.graph == Some(true))
    } else {
        (opts.flat.is_none(), opts.graph.is_none())
    }
}

/// Add histogram `h` into `ranges` as gprof does: records over the same range are summed, a record that
/// overlaps another one differently is an error. The first record of a range is kept as it is (no copy).
fn add_histogram(ranges: &mut Vec<HistRange>, h: Histogram) -> Result<(), String> {
    for r in h.ranges {
        let len = r.buckets.len();
        match ranges
            .iter()
            .position(|x| x.start == r.start && x.end == r.end)
        {
            Some(i) => {
                if ranges[i].buckets.len() != len {
                    return Err("histogram records for one range differ in size".into());
                }
                let mut sum: Vec<u32> =
                    match std::mem::replace(&mut ranges[i].buckets, Buckets::Dense32(Vec::new())) {
                        Buckets::Dense32(v) => v,
                        other => {
                            let mut v = vec![0u32; len as usize];
                            for (k, c) in other.nonzero() {
                                v[k as usize] = c;
                            }
                            v
                        }
                    };
                for (k, c) in r.buckets.nonzero() {
                    sum[k as usize] = sum[k as usize].saturating_add(c);
                }
                ranges[i].buckets = Buckets::Dense32(sum);
            }
            None => {
                if ranges.iter().any(|x| r.start < x.end && x.start < r.end) {
                    return Err("overlapping histogram records".into());
                }
                ranges.push(r);
            }
        }
    }
    Ok(())
}

/// The user's symspec filters plus gprof's own: the profiling routines (`mcount` and kin) are left out of
/// the flat profile, the call graph and time propagation.
fn filters_with_gprof_defaults(g: &Graph, user: &[(Table, String)]) -> Filters {
    let mut specs = user.to_vec();
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
    Filters::build(g, &specs)
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
            ..FunctionSymbol::default()
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
            symbol: s,
            module,
            ..Sym::default()
        });
    }
    g.modules[module].syms = start..g.syms.len();
}

/// The report for GNU (single-module) profiles, and the `gmon.sum` bytes when `-s` is given.
pub struct Outcome {
    pub warnings: Vec<String>,
    pub summary: Option<Vec<u8>>,
}

/// Analyse GNU gmon.out inputs against `exe`.
///
/// `read_inputs` decodes the profile files; it runs after the executable's symbols are loaded, so the
/// two big transient phases (symbol tables, histograms) do not add up.
pub fn run_gnu(
    opts: &Options,
    exe: &Path,
    read_inputs: impl FnOnce() -> Result<Vec<Input>, Failure>,
    out: &mut Out,
) -> Result<Outcome, Failure> {
    let mut warnings = Vec::new();
    let select = SelectOptions {
        no_static: opts.no_static,
        ignore_non_functions: opts.ignore_non_functions,
        keep_split_parts: false,
        lines: opts.line,
        exact_bounds: false,
    };
    let mut source_files = Vec::new();
    let mut file_map = None;
    let syms = if let Some(ext) = &opts.external_symbols {
        symbols::finalize(read_external_symbols(ext)?, 0)
    } else {
        file_map = match &opts.file_order {
            Some(p) => {
                Some(crate::filemap::FileMap::read(p).map_err(|e| Failure::new(p, e.to_string()))?)
            }
            None => None,
        };
        let ms = symbols::load_mapped(exe, select, file_map.as_ref())
            .map_err(|e| Failure::new(exe, e.to_string()))?;
        if ms.dynamic_only {
            warnings.push(format!(
                "{}: symbol table is stripped; only exported functions are known",
                exe.display()
            ));
        }
        source_files = ms.source_files;
        ms.symbols
    };
    let mut g = Graph::default();
    g.modules.push(ModuleView {
        name: file_name(&exe.to_string_lossy()),
        path: exe.display().to_string(),
        unit: 2,
        gnu_last_symbol: true,
        profiled: true,
        source_files,
        ..ModuleView::default()
    });
    push_module_syms(&mut g, 0, syms, opts.demangle);
    g.nsyms = g.syms.len();
    debug_symbols(&g, opts);

    let filters = filters_with_gprof_defaults(&g, &opts.specs);

    // Histograms summed over files, arcs tallied in file order.
    let mut ranges = Vec::new();
    let mut hz = 0u32;
    let mut dimension = String::from("seconds");
    let mut abbrev = 's';
    let mut have_hist = false;
    let mut have_arcs = false;
    let mut stats = TallyStats::default();
    let mut info = String::new();
    let mut inputs = read_inputs()?;
    for input in inputs.iter_mut() {
        let hist_taken = input.profile.modules[0].histogram.take();
        let m = &input.profile.modules[0];
        if opts.file_info {
            let counts = input.records.unwrap_or_default();
            let (version, nh, na, nb) = (
                counts.version,
                counts.histogram_records,
                counts.call_graph_records,
                counts.basic_block_records,
            );
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
        if let Some(h) = hist_taken {
            if !have_hist {
                hz = input.profile.header.hz;
                if hz == 0 && input.profile.format == SourceFormat::Bsd {
                    // Old BSD files carry no rate; gprof then uses the system clock rate, 100 Hz on Linux.
                    hz = 100;
                }
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
        out.push_str(&info);
        return Ok(Outcome {
            warnings,
            summary: None,
        });
    }
    let hist = Histogram {
        bucket_bits: 16,
        ranges,
    };
    if have_hist && opts.external_symbols.is_none() {
        check_belongs(&g, &hist, exe, &inputs)?;
    }
    let summary = if opts.sum {
        Some(match opts.file_format {
            mslprof_format::InputFormat::Bsd | mslprof_format::InputFormat::Bsd44 => {
                bsd_summary(&g, &hist, hz, opts.file_format)
            }
            _ => gnu_summary(&g, &hist, hz, &dimension, abbrev, &inputs),
        })
    } else {
        None
    };
    let (want_flat, want_graph) = sections(opts);
    let first_file = inputs.first().map(|i| i.path.clone()).unwrap_or_default();
    if opts.flat == Some(true) && !have_hist && !opts.sum {
        return Err(Failure::new(
            &first_file,
            "has no histogram, so there is no flat profile (-p)",
        ));
    }
    if opts.graph == Some(true) && !have_arcs && !opts.sum {
        return Err(Failure::new(
            &first_file,
            "has no call-graph records, so there is no call graph (-q)",
        ));
    }

    if opts.sum {
        return Ok(Outcome { warnings, summary });
    }
    histogram::scale_entries(&mut g);
    let mut totals = SampleTotals::default();
    if have_hist {
        histogram::assign(&mut g, 0, &hist, &filters, &mut totals);
    }
    let scale = hist
        .ranges
        .first()
        .map(|r| histogram::hist_scale(r.start, r.end, r.buckets.len(), 2))
        .unwrap_or(0.0);
    if opts.static_calls && have_arcs && opts.external_symbols.is_none() {
        let accept = |t: u64| hist.ranges.iter().any(|r| r.start <= t && t < r.end);
        static_arcs(&mut g, 0, exe, &accept, false, opts, &mut warnings);
    }
    // Samples are credited and arcs tallied: the raw data is no longer needed.
    drop(hist);
    drop(inputs);
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
        line_granularity: opts.line,
        multi_module: false,
        first_output: Cell::new(true),
        share_note: None,
    };
    warnings.extend(render(
        out,
        &mut g,
        &filters,
        &style,
        totals,
        have_hist && want_flat,
        have_arcs && want_graph,
        have_arcs,
        opts,
    ));
    if let Some(map) = &file_map {
        crate::ordering::print_file_order(out, &g, map);
    }
    Ok(Outcome { warnings, summary })
}

fn check_belongs(g: &Graph, hist: &Histogram, exe: &Path, inputs: &[Input]) -> Result<(), Failure> {
    let (Some(first), Some(last)) = (g.syms.first(), g.syms[..g.nsyms].last()) else {
        return Ok(());
    };
    let lo = first.symbol.addr;
    let hi = last.symbol.end_addr.max(last.symbol.addr);
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

#[allow(clippy::too_many_arguments)]
fn render(
    out: &mut Out,
    g: &mut Graph,
    filters: &Filters,
    style: &Style,
    totals: SampleTotals,
    want_flat: bool,
    want_graph: bool,
    have_arcs: bool,
    opts: &Options,
) -> Vec<String> {
    let (time_sorted, print_time) = if have_arcs {
        crate::callgraph::assemble(g, filters)
    } else {
        (Vec::new(), 0.0)
    };
    if style.bsd {
        if want_graph {
            crate::callgraph::print(out, g, &time_sorted, print_time, style);
        }
        if want_flat {
            crate::flat::print(out, g, totals.total_time, filters, style);
        }
    } else {
        if want_flat {
            crate::flat::print(out, g, totals.total_time, filters, style);
        }
        if want_graph {
            crate::callgraph::print(out, g, &time_sorted, print_time, style);
        }
    }
    if want_graph {
        crate::callgraph::print_index(out, g, style);
    }
    if opts.exec == Some(true) {
        crate::execcounts::print(out, g, filters, style);
    }
    let mut warnings = Vec::new();
    if opts.anno == Some(true) {
        warnings = crate::annotate::print(out, g, filters, style, &opts.annotate);
    }
    if opts.function_order {
        crate::ordering::print(out, g, style, want_graph);
    }
    warnings
}

/// gprof's `gmon.sum` for `--file-format=bsd|4.4bsd`: the 4.4BSD header when asked for or when the rate is
/// not the host's clock tick (100 Hz on Linux), else the old one; the summed samples of the (single) range and
/// one arc per pair of functions (symbol addresses, in the order of the GNU summary), little-endian 8-byte.
fn bsd_summary(
    g: &Graph,
    hist: &Histogram,
    hz: u32,
    format: mslprof_format::InputFormat,
) -> Vec<u8> {
    use mslprof_format::{BsdLayout, GnuTarget, Header, Module, Profile, SourceFormat};
    let layout = if format == mslprof_format::InputFormat::Bsd44 || hz != 100 {
        BsdLayout::Bsd44
    } else {
        BsdLayout::Old
    };
    let mut arcs = Vec::new();
    for s in 0..g.nsyms {
        for &a in g.syms[s].children.iter().rev() {
            let arc = &g.arcs[a];
            arcs.push(mslprof_format::Arc {
                caller_key: 0,
                caller_address: g.syms[arc.parent].symbol.addr,
                callee_address: g.syms[arc.child].symbol.addr,
                count: arc.count,
            });
        }
    }
    let profile = Profile {
        format: SourceFormat::Bsd,
        header: Header {
            hz,
            ..Header::default()
        },
        modules: vec![Module {
            histogram: Some(hist.clone()),
            arcs,
            ..Module::default()
        }],
    };
    let mut out = Vec::new();
    // Only fails on a profile the BSD layout cannot hold; BSD input has at most one histogram range.
    let _ = mslprof_format::write_bsd(&profile, GnuTarget::default(), layout, &mut out);
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
            out.extend_from_slice(&g.syms[arc.parent].symbol.addr.to_le_bytes());
            out.extend_from_slice(&g.syms[arc.child].symbol.addr.to_le_bytes());
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
    out: &mut Out,
) -> Result<Outcome, Failure> {
    let mut warnings: Vec<String> = Vec::new();
    let mut info = String::new();
    for input in inputs {
        let p = &input.profile;
        let h = &p.header;
        if h.flags & mslprof_format::model::header_flags::INCOMPLETE != 0 {
            let cause = match h.incomplete_cause {
                IncompleteCause::Signal => format!("killed by signal {}", h.incomplete_signal),
                IncompleteCause::UnderscoreExit => "_exit was called".into(),
                IncompleteCause::ExitFromThread => "exit from a thread while others ran".into(),
                IncompleteCause::Exec => "the program called execve".into(),
                IncompleteCause::InternalFault => {
                    "the runtime stopped profiling after a fault".into()
                }
                other => format!("cause {}", other.code()),
            };
            warnings.push(format!(
                "{}: profile is incomplete ({cause})",
                input.path.display()
            ));
        }
        if opts.file_info {
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
                    if m.flags & mslprof_format::model::module_flags::UNLOADED != 0 {
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
    }
    if opts.file_info {
        out.push_str(&info);
        return Ok(Outcome {
            warnings,
            summary: None,
        });
    }
    if let Some(map) = &opts.file_order {
        return Err(Failure::new(
            map,
            "-R (file ordering) applies to GNU gmon.out input; for mslprof profiles use -r, which orders each module",
        ));
    }
    let merged = crate::merge::merge(inputs, opts.separate_instances)?;
    if opts.sum {
        let mut bytes = Vec::new();
        mslprof_format::write(&merged.profile, &mut bytes)
            .map_err(|e| Failure::new("gmon.sum", e.to_string()))?;
        return Ok(Outcome {
            warnings,
            summary: Some(bytes),
        });
    }
    let profile = &merged.profile;
    let header = &profile.header;
    if header.dropped_arcs != 0 {
        warnings.push(format!(
            "{} arcs were dropped because an arc table was full; call counts are too low",
            header.dropped_arcs
        ));
    }

    let Analysis {
        graph: mut g,
        filters,
        mut totals,
        have_hist,
        have_arcs,
        granularity,
        hz,
    } = analyse_mslprof(opts, exe, profile, &mut warnings);
    let selected = totals.total_time;
    let process = header.total_samples as f64;
    let share_note = if opts.share_of_process {
        totals.total_time = process;
        format!(
            "Percentages are of all {} samples of the process ({:.2} s); the selected modules had {} ({:.2} s).",
            process,
            process / hz,
            selected.round(),
            selected / hz
        )
    } else {
        format!(
            "Percentages are of the {} samples in the selected modules ({:.2} s); the whole process had {} ({:.2} s; --share-of=process).",
            selected.round(),
            selected / hz,
            process,
            process / hz
        )
    };
    let share_note = match header.cpu_time {
        Some(cpu) => format!("{share_note}\n{}", crate::cputime::report_line(cpu)),
        None => share_note,
    };
    let style = Style {
        share_note: Some(share_note),
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
        line_granularity: opts.line,
        multi_module: true,
        first_output: Cell::new(true),
    };
    let (want_flat, want_graph) = sections(opts);
    for w in &warnings {
        let _ = writeln!(out, "mslprof: warning: {w}");
    }
    let total = header.total_samples.max(1) as f64;
    let unprofiled: Vec<_> = profile
        .modules
        .iter()
        .filter(|m| !m.is_profiled())
        .collect();
    if !unprofiled.is_empty() || header.unknown_samples != 0 {
        out.push_str("Modules loaded but not profiled, with their share of all samples:\n\n");
        let mut rows: Vec<crate::modtable::Row> = unprofiled
            .iter()
            .map(|m| crate::modtable::Row {
                index: None,
                samples: m.samples,
                name: String::from_utf8_lossy(&m.name).into_owned(),
                path: String::from_utf8_lossy(&m.path).into_owned(),
                note: String::new(),
                keep: false,
            })
            .collect();
        if header.unknown_samples != 0 {
            rows.push(crate::modtable::Row {
                index: None,
                samples: header.unknown_samples,
                name: "<outside any module>".into(),
                path: String::new(),
                note: String::new(),
                keep: false,
            });
        }
        crate::modtable::print(out, rows, total, opts.all_modules);
        out.push('\n');
    }
    if !warnings.is_empty() || !unprofiled.is_empty() || header.unknown_samples != 0 {
        style.first_output.set(false);
    }
    let listing_warnings = render(
        out,
        &mut g,
        &filters,
        &style,
        totals,
        have_hist && want_flat,
        have_arcs && want_graph,
        have_arcs,
        opts,
    );
    out.push_str("\u{c}\nModules\n\n");
    let rows = profile
        .modules
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut name = g.modules[i].name.clone();
            if !m.is_profiled() {
                name.push_str(" (not profiled)");
            } else if is_runtime(m) {
                name.push_str(" (profiling overhead)");
            }
            crate::modtable::Row {
                index: Some(i),
                samples: m.samples,
                name,
                path: g.modules[i].path.clone(),
                note: if merged.instances[i] > 1 {
                    format!("  ({} load instances)", merged.instances[i])
                } else {
                    String::new()
                },
                keep: m.is_profiled() && (m.samples > 0 || !m.arcs.is_empty()),
            }
        })
        .collect();
    crate::modtable::print(out, rows, total, opts.all_modules);
    Ok(Outcome {
        warnings: listing_warnings,
        summary: None,
    })
}

/// The analysis of a merged mslprof profile that the report and the exports share: every profiled
/// module's symbols, the arcs tallied between them and the samples credited to them (time is not yet
/// propagated: [`crate::callgraph::assemble`] does that).
pub struct Analysis {
    pub graph: Graph,
    pub filters: Filters,
    pub totals: SampleTotals,
    pub have_hist: bool,
    pub have_arcs: bool,
    /// Bytes covered by one histogram bucket (of the first histogram).
    pub granularity: i64,
    /// Samples per second.
    pub hz: f64,
}

/// Load the symbols of `profile`'s modules (`exe` replaces the main program's recorded path), tally its
/// arcs and credit its samples. Problems that do not stop the analysis are added to `warnings`.
pub fn analyse_mslprof(
    opts: &Options,
    exe: Option<&Path>,
    profile: &Profile,
    warnings: &mut Vec<String>,
) -> Analysis {
    let header = &profile.header;
    // Symbols of each profiled module.
    let select = SelectOptions {
        no_static: opts.no_static,
        ignore_non_functions: opts.ignore_non_functions,
        keep_split_parts: true,
        lines: opts.line,
        exact_bounds: true,
    };
    let mut g = Graph::default();
    for (i, m) in profile.modules.iter().enumerate() {
        let name = if m.name.is_empty() {
            file_name(&String::from_utf8_lossy(&m.path))
        } else {
            String::from_utf8_lossy(&m.name).into_owned()
        };
        let file: PathBuf = match (m.is_main_program(), exe) {
            (true, Some(e)) => e.to_path_buf(),
            _ => PathBuf::from(String::from_utf8_lossy(&m.path).into_owned()),
        };
        g.modules.push(ModuleView {
            name: name.clone(),
            path: file.display().to_string(),
            unit: 1,
            gnu_last_symbol: false,
            samples: m.samples,
            profiled: m.is_profiled(),
            ..ModuleView::default()
        });
        let s = g.syms.len();
        g.modules[i].syms = s..s;
        if m.saturated_buckets != 0 {
            warnings.push(format!(
                "{name}: {} histogram buckets saturated at 65535; its times are too low (use LD_PROFILEBUCKET_SIZE=32)",
                m.saturated_buckets
            ));
        }
        if m.dropped_arcs != 0 {
            warnings.push(format!(
                "{name}: {} arcs dropped (its arc table was full)",
                m.dropped_arcs
            ));
        }
        let is_vdso = m.flags & mslprof_format::model::module_flags::VDSO != 0 || m.path.is_empty();
        // A module LD_PROFILE did not select is read only to name the callers it holds (calls it made into
        // profiled functions): its functions get no entries of their own.
        let callers_only = !m.is_profiled();
        let holds_callers = || {
            profile
                .modules
                .iter()
                .any(|o| o.arcs.iter().any(|a| a.caller_key == m.key))
        };
        if is_vdso || (callers_only && !holds_callers()) {
            continue;
        }
        if is_runtime(m) {
            // The profiler's own time is one row, as the paper's `mcount`/`profil` rows were: a measure
            // of the profiling overhead.
            if !opts.hide_overhead {
                let whole = FunctionSymbol {
                    name: OVERHEAD_ROW.into(),
                    end_addr: u64::MAX - 1,
                    is_func: true,
                    ..FunctionSymbol::default()
                };
                push_module_syms(&mut g, i, vec![whole], Demangle::None);
            }
            continue;
        }
        // A module with neither samples nor calls adds nothing to the report: no need to read it (or to
        // warn about it).
        let has_data = m
            .histogram
            .as_ref()
            .is_some_and(|h| h.ranges.iter().any(|r| r.buckets.total() > 0))
            || !m.arcs.is_empty()
            || profile
                .modules
                .iter()
                .any(|o| o.arcs.iter().any(|a| a.caller_key == m.key));
        if !has_data {
            continue;
        }
        match symbols::load(&file, select) {
            Ok(ms) => {
                if !m.build_id.is_empty()
                    && ms
                        .build_id
                        .as_deref()
                        .is_some_and(|b| b != m.build_id.as_slice())
                {
                    warnings.push(format!(
                        "{}: build-id differs from the profiled one (rebuilt since the run?); its functions may be wrong",
                        file.display()
                    ));
                }
                if ms.dynamic_only && !callers_only {
                    warnings.push(format!(
                        "{}: symbol table is stripped; functions it does not export are named by address (fn_ADDR from its unwind table, MODULE+0xADDR where even that is missing)",
                        file.display()
                    ));
                }
                g.modules[i].source_files = ms.source_files;
                g.modules[i].plt_counted = !ms.counts_own_calls;
                push_module_syms(&mut g, i, ms.symbols, opts.demangle);
            }
            Err(e) => {
                warnings.push(format!(
                    "{}: {}; its time is not attributed to functions",
                    file.display(),
                    e
                ));
            }
        }
    }
    // Load instances shown separately share a file name: number them (`libplugin.so#2`).
    let mut seen: HashMap<String, u32> = HashMap::new();
    let total_of: HashMap<String, u32> = g.modules.iter().fold(HashMap::new(), |mut acc, m| {
        *acc.entry(m.name.clone()).or_insert(0) += 1;
        acc
    });
    for m in &mut g.modules {
        if total_of.get(&m.name).copied().unwrap_or(0) > 1 {
            let n = seen.entry(m.name.clone()).or_insert(0);
            *n += 1;
            m.name = format!("{}#{}", m.name, n);
        }
    }
    g.nsyms = g.syms.len();
    qualify_ambiguous(&mut g);
    debug_symbols(&g, opts);

    let filters = filters_with_gprof_defaults(&g, &opts.specs);
    let mut stats = TallyStats::default();
    let mut have_arcs = false;
    for (i, m) in profile.modules.iter().enumerate() {
        for a in &m.arcs {
            have_arcs = true;
            let caller_module = if a.caller_key == UNKNOWN_KEY {
                None
            } else {
                Some(a.caller_key as usize - 1)
            };
            tally(
                &mut g,
                RawArc {
                    caller_module,
                    caller_address: a.caller_address,
                    callee_module: i,
                    callee_address: a.callee_address,
                    count: a.count,
                },
                &filters,
                false,
                &mut stats,
            );
        }
    }
    if opts.static_calls && have_arcs {
        for i in 0..g.modules.len() {
            // Modules that were not profiled only name callers: no entries, so no static arcs.
            if g.modules[i].syms.is_empty() || !g.modules[i].profiled {
                continue;
            }
            let path = PathBuf::from(&g.modules[i].path);
            static_arcs(&mut g, i, &path, &|_| true, true, opts, warnings);
        }
    }
    histogram::scale_entries(&mut g);
    let mut totals = SampleTotals::default();
    let mut have_hist = false;
    let mut granularity = 0i64;
    for (i, m) in profile.modules.iter().enumerate() {
        let Some(h) = &m.histogram else { continue };
        if g.modules[i].syms.is_empty() {
            continue;
        }
        if !have_hist && let Some(r) = h.ranges.first() {
            granularity = ((r.end - r.start) / r.buckets.len().max(1)) as i64;
        }
        have_hist = true;
        histogram::assign(&mut g, i, h, &filters, &mut totals);
    }
    let hz = if header.sample_period_ns > 0 {
        1e9 / header.sample_period_ns as f64
    } else {
        f64::from(header.hz.max(1))
    };
    Analysis {
        graph: g,
        filters,
        totals,
        have_hist,
        have_arcs,
        granularity,
        hz,
    }
}

/// The flat-profile row of the profiler's own time.
pub const OVERHEAD_ROW: &str = "[mslprof_overhead]";

/// Whether `m` is the mslprof runtime itself.
fn is_runtime(m: &mslprof_format::model::Module) -> bool {
    let path = String::from_utf8_lossy(&m.path);
    file_name(&path).starts_with("libmslprof.so")
}

/// Give names that occur in more than one module a `@module` qualifier.
fn qualify_ambiguous(g: &mut Graph) {
    let mut seen: HashMap<&str, (usize, bool)> = HashMap::new();
    for s in &g.syms[..g.nsyms] {
        seen.entry(s.symbol.name.as_str())
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
        // Callers in modules that are not profiled always name their module (`work@liba.so`).
        if ambiguous.contains(&g.syms[s].symbol.name) || !g.modules[g.syms[s].module].profiled {
            let q = format!("@{}", g.modules[g.syms[s].module].name);
            g.syms[s].display.push_str(&q);
            g.syms[s].qualifier = q;
        } else if g.syms[s].symbol.synthetic {
            // `fn_1a2b40` says nothing without its module.
            let q = format!("@{}", g.modules[g.syms[s].module].name);
            g.syms[s].display.push_str(&q);
            g.syms[s].qualifier = q;
        }
    }
}

/// `-c` for one module: the zero-count arcs of its call instructions; `-d` bit 256 traces them on stderr.
fn static_arcs(
    g: &mut Graph,
    module: usize,
    path: &Path,
    accept: &dyn Fn(u64) -> bool,
    cross_module: bool,
    opts: &Options,
    warnings: &mut Vec<String>,
) {
    use std::io::Write as _;
    let mut lines = Vec::new();
    if let Err(e) =
        crate::staticcalls::add_static_arcs(g, module, path, accept, cross_module, &mut lines)
    {
        warnings.push(format!("{}: -c: {e}", path.display()));
    }
    if opts.debug & DEBUG_STATIC_CALLS != 0 {
        let mut stderr = std::io::stderr().lock();
        for l in lines {
            let _ = writeln!(stderr, "{l}");
        }
    }
}

/// `-d` bit 128: the symbols read, module by module, on stderr.
fn debug_symbols(g: &Graph, opts: &Options) {
    use std::io::Write as _;
    if opts.debug & DEBUG_SYMBOLS == 0 {
        return;
    }
    let mut stderr = std::io::stderr().lock();
    for m in &g.modules {
        for s in &g.syms[m.syms.clone()] {
            let _ = writeln!(
                stderr,
                "[symbols] {}: {:#x}-{:#x} {}",
                m.name, s.symbol.addr, s.symbol.end_addr, s.display
            );
        }
    }
}

/// gprof's `AOUTDEBUG` bit of `-d`: the symbol table.
pub const DEBUG_SYMBOLS: u32 = 128;
/// gprof's `CALLDEBUG` bit of `-d`: the static call graph (`-c`).
pub const DEBUG_STATIC_CALLS: u32 = 256;
