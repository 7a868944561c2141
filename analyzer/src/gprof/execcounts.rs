//! The execution-count tally (`-C`/`-Z`, gprof's `print_exec_counts`): one line per symbol,
//! `file:line: (name:0xaddr) N executions`, sorted by file, line and address as gprof sorts them.
//! The counts are the symbols' call counts (GNU gmon.out files from glibc carry no basic-block records).

use std::cmp::Ordering;
use std::fmt::Write as _;

use crate::gprof::graph::Graph;
use crate::gprof::style::Style;
use crate::gprof::symspec::{Filters, Table};
use crate::output::Out;

/// gprof's `cmp_bb`: by file and line when both symbols have a file, then by address.
fn cmp_bb(g: &Graph, l: usize, r: usize) -> Ordering {
    let (a, b) = (&g.syms[l], &g.syms[r]);
    if let (Some(fa), Some(fb)) = (&a.symbol.file, &b.symbol.file) {
        let c = fa.as_bytes().cmp(fb.as_bytes());
        if c != Ordering::Equal {
            return c;
        }
        if a.symbol.line != b.symbol.line {
            return a.symbol.line.cmp(&b.symbol.line);
        }
    }
    a.symbol.addr.cmp(&b.symbol.addr)
}

/// Print the tally.
pub fn print(out: &mut Out, g: &Graph, filters: &Filters, style: &Style) {
    style.begin_section(out);
    let mut sorted: Vec<usize> = (0..g.nsyms)
        .filter(|&s| filters.selected(Table::InclExec, Table::ExclExec, s))
        .collect();
    if style.multi_module {
        // gprof's comparator is not a total order (symbols without a file compare by address only); over
        // several modules that scatters files, so mslprof profiles sort by file, line, module and address,
        // symbols without a file last.
        sorted.sort_by(|&l, &r| {
            let (a, b) = (&g.syms[l], &g.syms[r]);
            (
                a.symbol.file.is_none(),
                &a.symbol.file,
                a.symbol.line,
                a.module,
                a.symbol.addr,
            )
                .cmp(&(
                    b.symbol.file.is_none(),
                    &b.symbol.file,
                    b.symbol.line,
                    b.module,
                    b.symbol.addr,
                ))
        });
    } else {
        crate::qsort::msort(&mut sorted, &mut |&l, &r| cmp_bb(g, l, r));
    }
    for s in sorted {
        let sym = &g.syms[s];
        if sym.ncalls == 0 && style.ignore_zeros {
            continue;
        }
        let _ = writeln!(
            out,
            "{}:{}: ({}:0x{:x}) {} executions",
            sym.symbol.file.as_deref().unwrap_or("<unknown>"),
            sym.symbol.line,
            sym.raw_display(),
            sym.symbol.addr,
            sym.ncalls
        );
    }
}
