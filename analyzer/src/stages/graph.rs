//! Stage 2, build the graph: the loaded modules' symbols in one process-wide table (module order, then
//! address order), load instances numbered and ambiguous names qualified with their module, and the
//! symspec filters resolved against that table.

use std::collections::{HashMap, HashSet};

use crate::elf::symbols;
use crate::gprof::graph::{Graph, Sym};
use crate::gprof::symspec::{Filters, Table};
use crate::options::{DEBUG_SYMBOLS, Options};
use crate::stages::symbols::LoadedModule;

/// Build the symbol table of `modules`. `multi_module` (mslprof input) numbers load instances of one file
/// (`libplugin.so#2`) and gives names found in more than one module a `@module` qualifier.
pub fn build(modules: Vec<LoadedModule>, opts: &Options, multi_module: bool) -> (Graph, Filters) {
    let mut g = Graph::default();
    for (i, m) in modules.into_iter().enumerate() {
        let start = g.syms.len();
        if let Some((syms, demangle)) = m.symbols {
            for s in syms {
                g.syms.push(Sym {
                    display: symbols::demangle(&s.name, demangle),
                    symbol: s,
                    module: i,
                    ..Sym::default()
                });
            }
        }
        g.modules.push(m.view);
        g.modules[i].syms = start..g.syms.len();
    }
    if multi_module {
        number_instances(&mut g);
    }
    g.nsyms = g.syms.len();
    if multi_module {
        qualify_ambiguous(&mut g);
    }
    debug_symbols(&g, opts);
    let filters = filters_with_gprof_defaults(&g, &opts.specs);
    (g, filters)
}

/// Load instances shown separately share a file name: number them (`libplugin.so#2`).
fn number_instances(g: &mut Graph) {
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
    let ambiguous: HashSet<String> = seen
        .into_iter()
        .filter(|(_, v)| v.1)
        .map(|(k, _)| k.to_string())
        .collect();
    for s in 0..g.nsyms {
        // Callers in modules that are not profiled always name their module (`work@liba.so`), and
        // `fn_1a2b40` says nothing without its module. Functions called through the PLT in such a module
        // (CALLEE_ARCS) are named like those of profiled modules.
        let module = &g.modules[g.syms[s].module];
        if ambiguous.contains(&g.syms[s].symbol.name)
            || !(module.profiled || module.callee_arcs)
            || g.syms[s].symbol.synthetic
        {
            let q = format!("@{}", g.modules[g.syms[s].module].name);
            g.syms[s].display.push_str(&q);
            g.syms[s].qualifier = q;
        }
    }
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
