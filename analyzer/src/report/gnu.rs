//! The GNU adapter: GNU or BSD gmon.out files against one executable, giving exactly GNU gprof's report
//! (or its `-i` summary, or `gmon.sum`).

use mslprof_format::LinkAddress;
use std::cell::Cell;
use std::path::Path;

use crate::gprof::graph::Graph;
use crate::gprof::style::Style;
use crate::input::{Error, Input, Missing};
use crate::options::Options;
use crate::output::Out;
use crate::stages::render::Found;
use crate::stages::samples::GnuHistogram;
use crate::stages::{arcs, graph, render, samples, symbols};

use crate::report::outcome::Outcome;

/// Analyse GNU gmon.out inputs against `exe`.
///
/// `read_inputs` decodes the profile files; it runs after the executable's symbols are loaded, so the
/// two big transient phases (symbol tables, histograms) do not add up.
pub fn run(
    opts: &Options,
    exe: &Path,
    read_inputs: impl FnOnce() -> Result<Vec<Input>, Error>,
    out: &mut Out,
) -> Result<Outcome, Error> {
    let mut warnings = Vec::new();
    let (module, file_map) = symbols::gnu(opts, exe, &mut warnings)?;
    let (mut g, filters) = graph::build(vec![module], opts, false);

    let mut inputs = read_inputs()?;
    let sum = samples::sum_gnu(&mut inputs)?;
    let have_arcs = arcs::gnu(&mut g, &inputs, &filters);
    if opts.file_info {
        out.push_str(&crate::gprof::fileinfo::gnu(&inputs));
        return Ok(Outcome {
            warnings,
            summary: None,
        });
    }
    if sum.have_hist && opts.external_symbols.is_none() {
        check_belongs(&g, &sum, exe, &inputs)?;
    }
    let summary = opts.sum.then(|| gmon_sum(&g, &sum, &inputs, opts));
    let first_file = inputs.first().map(|i| i.path.clone()).unwrap_or_default();
    if opts.flat == Some(true) && !sum.have_hist && !opts.sum {
        return Err(Error::Missing {
            path: first_file,
            missing: Missing::Histogram,
        });
    }
    if opts.graph == Some(true) && !have_arcs && !opts.sum {
        return Err(Error::Missing {
            path: first_file,
            missing: Missing::CallGraph,
        });
    }
    if opts.sum {
        return Ok(Outcome { warnings, summary });
    }
    let credited = samples::assign_gnu(&mut g, &sum, &filters);
    if opts.static_calls && have_arcs && opts.external_symbols.is_none() {
        let accept = |t: LinkAddress| sum.hist.ranges.iter().any(|r| r.contains(t));
        arcs::static_arcs(&mut g, 0, exe, &accept, false, opts, &mut warnings);
    }
    // Samples are credited and arcs tallied: the raw data is no longer needed.
    drop(sum.hist);
    drop(inputs);
    let style = Style {
        bsd: opts.bsd,
        descriptions: !opts.brief,
        ignore_zeros: opts.ignore_zeros,
        output_width: opts.width,
        hz: f64::from(sum.hz),
        granularity: credited.granularity,
        dimension: sum.dimension,
        dimension_abbrev: sum.abbrev,
        print_path: opts.print_path,
        inline_file_names: opts.inline_file_names,
        line_granularity: opts.line,
        multi_module: false,
        first_output: Cell::new(true),
        index_width: Cell::new(crate::gprof::callgraph::INDEX_WIDTH),
        share_note: None,
        measured: None,
    };
    let found = Found {
        have_hist: credited.have_hist,
        have_arcs,
        measured: None,
    };
    warnings.extend(render::tables(
        out,
        &mut g,
        &filters,
        &style,
        credited.totals,
        found,
        opts,
    ));
    if let Some(map) = &file_map {
        crate::gprof::ordering::print_file_order(out, &g, map);
    }
    Ok(Outcome { warnings, summary })
}

/// `-s`: the `gmon.sum` bytes, in the layout `--file-format` names.
fn gmon_sum(g: &Graph, sum: &GnuHistogram, inputs: &[Input], opts: &Options) -> Vec<u8> {
    use mslprof_format::InputFormat;
    match opts.file_format {
        InputFormat::Bsd | InputFormat::Bsd44 => {
            crate::gprof::summary::bsd(g, &sum.hist, sum.hz, opts.file_format)
        }
        _ => crate::gprof::summary::gnu(g, &sum.hist, sum.hz, &sum.dimension, sum.abbrev, inputs),
    }
}

/// Refuse an executable whose functions lie nowhere near the profile's histogram.
fn check_belongs(g: &Graph, sum: &GnuHistogram, exe: &Path, inputs: &[Input]) -> Result<(), Error> {
    let (Some(first), Some(last)) = (g.syms.first(), g.syms[..g.nsyms].last()) else {
        return Ok(());
    };
    let lo = first.symbol.addr;
    let hi = last.symbol.end_addr.max(last.symbol.addr);
    let overlaps = sum.hist.ranges.iter().any(|r| r.start <= hi && lo < r.end);
    if !overlaps {
        return Err(Error::NotItsExecutable {
            exe: exe.to_path_buf(),
            profile: inputs.first().map(|i| i.path.clone()).unwrap_or_default(),
        });
    }
    Ok(())
}
