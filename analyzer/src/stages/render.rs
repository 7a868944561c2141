//! Stage 5, render: time propagated along the call graph (gprof's `cg_assemble`), then the tables the
//! options ask for, in gprof's order (BSD style: call graph before flat profile), and the multi-module
//! report's module tables. With sampled stacks, the call graph's times are measured instead
//! ([`Stacks::apply`]).

use std::fmt::Write as _;

use mslprof_format::model::Profile;

use crate::gprof::graph::Graph;
use crate::gprof::histogram::SampleTotals;
use crate::gprof::style::Style;
use crate::gprof::symspec::Filters;
use crate::modtable::Row;
use crate::options::Options;
use crate::output::Out;
use crate::stages::stacks::Stacks;
use crate::stages::symbols::is_runtime;

/// What the earlier stages found: which sections have data.
#[derive(Clone, Copy, Debug)]
pub struct Found<'a> {
    pub have_hist: bool,
    pub have_arcs: bool,
    /// Sampled stacks to measure the call graph's times from (`None`: gprof's estimate).
    pub measured: Option<&'a Stacks>,
}

/// Print the report's tables; returns the warnings annotating source gave.
pub fn tables(
    out: &mut Out,
    g: &mut Graph,
    filters: &Filters,
    style: &Style,
    totals: SampleTotals,
    found: Found,
    opts: &Options,
) -> Vec<String> {
    let (want_flat, want_graph) = opts.sections();
    let want_flat = found.have_hist && want_flat;
    // Stacks give a call graph even where no call was counted.
    let have_graph = found.have_arcs || found.measured.is_some();
    let want_graph = have_graph && want_graph;
    let (time_sorted, print_time) = match found.measured {
        Some(stacks) => {
            let print_time = crate::gprof::callgraph::propagate(g, filters);
            stacks.apply(g, filters);
            (crate::gprof::callgraph::sort_by_total(g), print_time)
        }
        None if found.have_arcs => crate::gprof::callgraph::assemble(g, filters),
        None => (Vec::new(), 0.0),
    };
    if style.bsd {
        if want_graph {
            crate::gprof::callgraph::print(out, g, &time_sorted, print_time, style);
        }
        if want_flat {
            crate::gprof::flat::print(out, g, totals.total_time, filters, style);
        }
    } else {
        if want_flat {
            crate::gprof::flat::print(out, g, totals.total_time, filters, style);
        }
        if want_graph {
            crate::gprof::callgraph::print(out, g, &time_sorted, print_time, style);
        }
    }
    if want_graph {
        crate::gprof::callgraph::print_index(out, g, style);
    }
    if opts.exec == Some(true) {
        crate::gprof::execcounts::print(out, g, filters, style);
    }
    let mut warnings = Vec::new();
    if opts.anno == Some(true) {
        warnings = crate::gprof::annotate::print(out, g, filters, style, &opts.annotate);
    }
    if opts.function_order {
        crate::gprof::ordering::print(out, g, style, want_graph);
    }
    warnings
}

/// The top of a multi-module report: the modules loaded but not profiled, with their share of all
/// samples. Returns whether anything was printed.
pub fn unprofiled_modules(out: &mut Out, profile: &Profile, opts: &Options) -> bool {
    let rows: Vec<Row> = profile
        .modules
        .iter()
        .filter(|m| !m.is_profiled())
        .map(|m| Row {
            index: None,
            samples: m.samples,
            name: String::from_utf8_lossy(&m.name).into_owned(),
            path: String::from_utf8_lossy(&m.path).into_owned(),
            note: String::new(),
            keep: false,
            overhead: false,
        })
        .collect();
    if rows.is_empty() {
        return false;
    }
    out.push_str("Modules loaded but not profiled, with their share of all samples:\n\n");
    crate::modtable::print(out, rows, all_samples(profile), opts.all_modules);
    out.push('\n');
    true
}

/// The end of a multi-module report: every module with its index, samples and load instances.
pub fn module_table(
    out: &mut Out,
    g: &Graph,
    profile: &Profile,
    instances: &[u32],
    opts: &Options,
) {
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
            Row {
                index: Some(i),
                samples: m.samples,
                name,
                path: g.modules[i].path.clone(),
                note: if instances[i] > 1 {
                    format!("  ({} load instances)", instances[i])
                } else {
                    String::new()
                },
                keep: m.is_profiled() && (m.samples > 0 || !m.arcs.is_empty()),
                overhead: is_runtime(m),
            }
        })
        .collect::<Vec<Row>>();
    let mut rows = rows;
    if profile.header.unknown_samples != 0 {
        // The runtime counts samples in its own stubs as its library's: these are in other anonymous code.
        rows.push(Row {
            index: None,
            samples: profile.header.unknown_samples,
            name: OUTSIDE_ANY_MODULE.into(),
            path: "(code in no mapped file: JIT-compiled code, trampolines)".into(),
            note: String::new(),
            keep: true,
            overhead: false,
        });
    }
    crate::modtable::print(out, rows, all_samples(profile), opts.all_modules);
    let mut numbered: Vec<&str> = g
        .modules
        .iter()
        .filter_map(|m| m.name.rsplit_once('#'))
        .filter(|(_, n)| n.parse::<u32>().is_ok())
        .map(|(base, _)| base)
        .collect();
    numbered.sort_unstable();
    numbered.dedup();
    for name in numbered {
        let _ = writeln!(
            out,
            "\n {name}#N: the Nth of several modules named {name}: different files (see the path), or\n \
             load instances of one file kept apart by --separate-instances."
        );
    }
}

/// The module-table row of the samples taken outside every module.
const OUTSIDE_ANY_MODULE: &str = "<outside any module>";

/// All samples of the process (at least 1, as a divisor).
fn all_samples(profile: &Profile) -> f64 {
    profile.header.total_samples.max(1) as f64
}
