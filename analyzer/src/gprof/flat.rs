//! The flat profile (GNU gprof's `hist_print`): functions by decreasing self time, with gprof's
//! automatic choice of the per-call unit; for multi-module input, a module-index column before the name.

use std::fmt::Write as _;

use crate::elf::symtab::OVERHEAD_ROW;
use crate::gprof::callgraph::{name_full, name_only};
use crate::gprof::cformat::CFloat;
use crate::gprof::graph::Graph;
use crate::gprof::style::Style;
use crate::gprof::symspec::{Filters, Table};
use crate::output::Out;

const SI: [(char, f64); 11] = [
    ('T', 1e-12),
    ('G', 1e-09),
    ('M', 1e-06),
    ('K', 1e-03),
    (' ', 1e-00),
    ('m', 1e+03),
    ('u', 1e+06),
    ('n', 1e+09),
    ('p', 1e+12),
    ('f', 1e+15),
    ('a', 1e+18),
];

fn cmp_time(g: &Graph, l: usize, r: usize) -> std::cmp::Ordering {
    let (a, b) = (&g.syms[l], &g.syms[r]);
    let diff = b.hist_time - a.hist_time;
    if diff > 0.0 {
        return std::cmp::Ordering::Greater;
    }
    if diff < 0.0 {
        return std::cmp::Ordering::Less;
    }
    b.ncalls
        .cmp(&a.ncalls)
        .then_with(|| a.symbol.name.as_bytes().cmp(b.symbol.name.as_bytes()))
}

/// Print the flat profile.
pub fn print(out: &mut Out, g: &Graph, total_time: f64, filters: &Filters, style: &Style) {
    style.begin_section(out);
    if style.bsd {
        if style.descriptions {
            out.push_str("\n\n\nflat profile:\n");
            out.push_str(crate::gprof::blurbs::FLAT);
        }
    } else {
        out.push_str("Flat profile:\n");
    }
    let hz = style.hz;
    let mut sorted: Vec<usize> = (0..g.nsyms).collect();
    sorted.sort_by(|&l, &r| cmp_time(g, l, r));

    let mut log_scale = 0usize;
    if style.bsd {
        log_scale = 5;
    } else {
        let mut top_time = 0.0f64;
        let mut found = false;
        for &s in &sorted {
            let sym = &g.syms[s];
            if sym.ncalls != 0 && !plt_counted(g, sym, style) {
                let call_time = (sym.hist_time + sym.child_time) / sym.ncalls as f64;
                if call_time > top_time {
                    top_time = call_time;
                    found = true;
                }
            }
        }
        if found && top_time > 0.0 {
            top_time /= hz;
            log_scale = SI.len();
            for (i, (_, scale)) in SI.iter().enumerate() {
                let v = scale * top_time;
                if (1.0..1000.0).contains(&v) {
                    log_scale = i;
                    break;
                }
            }
        }
    }
    let (prefix, scale) = if style.multi_module && !style.bsd && log_scale == 0 {
        // No function with counted calls has time: gprof's `Ts/call` (its first unit) would say nothing.
        (' ', 1.0)
    } else {
        SI.get(log_scale).copied().unwrap_or((' ', 0.0))
    };
    let mut total_time = total_time;

    // Header.
    let unit = format!("{}{}/call", prefix, style.dimension_abbrev);
    if style.bsd {
        style.write_granularity(out, total_time, &style.dimension);
    } else {
        let _ = write!(
            out,
            "\nEach sample counts as {} {}.\n",
            crate::gprof::cformat::g(1.0 / hz),
            style.dimension
        );
    }
    if let Some(note) = &style.share_note {
        let _ = writeln!(out, "{note}");
    }
    if total_time <= 0.0 {
        out.push_str(" no time accumulated\n\n");
        total_time = 1.0;
    }
    let module_col = style.multi_module;
    let _ = write!(
        out,
        "{:>5.5} {:>10.10} {:>8.8} {:>8.8} {:>8.8} {:>8.8}  ",
        "%  ", "cumulative", "self  ", "", "self  ", "total "
    );
    if module_col {
        let _ = write!(out, "{:>6.6}  ", "module");
    }
    let _ = writeln!(out, "{:<8.8}", "");
    let _ = write!(
        out,
        "{:>5.5} {:>9.9}  {:>8.8} {:>8.8} {:>8.8} {:>8.8}  ",
        "time", style.dimension, style.dimension, "calls", unit, unit
    );
    if module_col {
        let _ = write!(out, "{:>6.6}  ", "index");
    }
    let _ = writeln!(out, "{:<8.8}", "name");

    let mut accum = 0.0f64;
    let mut any_plt_counted = false;
    let mut any_unprofiled = false;
    let mut any_plt_stub = false;
    let mut any_overhead = false;
    for &s in &sorted {
        if !filters.selected(Table::InclFlat, Table::ExclFlat, s) {
            continue;
        }
        let sym = &g.syms[s];
        if crate::gprof::callgraph::callers_only(g, sym) {
            continue;
        }
        if style.ignore_zeros && sym.ncalls == 0 && sym.hist_time == 0.0 {
            continue;
        }
        accum += sym.hist_time;
        let pct = if total_time > 0.0 {
            100.0 * sym.hist_time / total_time
        } else {
            0.0
        };
        // gprof's `%5.1f %10.2f %8.2f` for -T, `%6.2f %9.2f %8.2f` otherwise.
        let (pct_w, pct_p, cum_w) = if style.bsd { (5, 1, 10) } else { (6, 2, 9) };
        let _ = write!(
            out,
            "{:>pct_w$.pct_p$} {:>cum_w$.2} {:>8.2}",
            CFloat(pct),
            CFloat(accum / hz),
            CFloat(sym.hist_time / hz)
        );
        let plt = plt_counted(g, sym, style);
        if plt {
            // The count covers only the calls from other modules, the time all calls: no per-call figure.
            let _ = write!(out, " {:>8} {:>8.8} {:>8.8}  ", sym.ncalls, "", "");
        } else if sym.ncalls != 0 {
            let n = sym.ncalls as f64;
            let _ = write!(
                out,
                " {:>8} {:>8.2} {:>8.2}  ",
                sym.ncalls,
                CFloat(scale * sym.hist_time / hz / n),
                CFloat(scale * (sym.hist_time + sym.child_time) / hz / n)
            );
        } else {
            let _ = write!(out, " {:>8.8} {:>8.8} {:>8.8}  ", "", "", "");
        }
        if module_col {
            let _ = write!(out, "{:>6}  ", sym.module);
        }
        if style.bsd {
            out.push_str(&name_full(sym, style));
        } else {
            out.push_str(&name_only(sym, style));
        }
        if style.multi_module {
            any_plt_stub |= sym.symbol.name.contains(PLT_STUB_SUFFIX);
            any_overhead |= sym.symbol.name == OVERHEAD_ROW;
        }
        if plt {
            out.push_str(PLT_MARK);
            any_plt_counted = true;
            any_unprofiled |= g.modules.get(sym.module).is_some_and(|m| !m.profiled);
        }
        out.push('\n');
    }
    if any_plt_counted {
        out.push_str(PLT_NOTE);
    }
    if any_unprofiled {
        out.push_str(UNPROFILED_NOTE);
    }
    if any_plt_stub {
        out.push_str(PLT_STUB_NOTE);
    }
    if any_overhead {
        out.push_str(OVERHEAD_NOTE);
    }
    if style.descriptions && !style.bsd {
        out.push_str(crate::gprof::blurbs::FLAT);
    }
}

/// Marks a row whose calls were counted at the PLT.
const PLT_MARK: &str = " (PLT)";
/// Printed under a flat profile with such rows.
const PLT_NOTE: &str = "\n (PLT) calls counted at the PLT: only the calls that entered the function from another module\n       (its calls from inside its own module are not counted), while its time is that of all its\n       calls; so no per-call figures are given.\n";

/// What marks a PLT stub's row (`sin@plt`), and what such a row is.
const PLT_STUB_SUFFIX: &str = "@plt";
const PLT_STUB_NOTE: &str = "\n NAME@plt: time in the module's PLT stub that jumps to NAME, not in NAME itself (no calls are\n       counted there).\n";

/// What the row of the profiler's own time is.
const OVERHEAD_NOTE: &str = "\n [mslprof_overhead]: time in the profiler itself (libmslprof.so), the cost of profiling;\n       --no-overhead leaves it out.\n";

/// Printed under a flat profile with rows of modules LD_PROFILE did not select (called from selected ones).
const UNPROFILED_NOTE: &str = "       In a module that is not profiled, only the calls from profiled modules are counted, and no time.\n";

/// True for a function with calls in a module that does not count its own calls (multi-module reports).
fn plt_counted(g: &Graph, sym: &crate::gprof::graph::Sym, style: &Style) -> bool {
    style.multi_module
        && sym.ncalls != 0
        && g.modules.get(sym.module).is_some_and(|m| m.plt_counted)
}
