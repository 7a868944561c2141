//! The suggested function order (`-r`, gprof's `cg_print_function_ordering`): never-called functions
//! last; first the functions most of the hottest arcs lead to (from many call sites), then chains built
//! greedily along the heaviest arcs, then the rest. For an mslprof profile there is one list per module
//! (a link order is per output file), each after a `#` line naming the module.

use std::fmt::Write as _;

use crate::gprof::graph::Graph;
use crate::gprof::style::Style;
use crate::output::Out;

const NONE: usize = usize::MAX;

/// Placement state of the symbols and arcs of one list.
struct State {
    placed: Vec<bool>,
    next: Vec<usize>,
    prev: Vec<usize>,
    nuses: Vec<u64>,
    arc_placed: Vec<bool>,
}

impl State {
    /// Nothing placed or chained yet.
    fn new(g: &Graph) -> State {
        let n = g.syms.len();
        State {
            placed: vec![false; n],
            next: vec![NONE; n],
            prev: vec![NONE; n],
            nuses: vec![0; n],
            arc_placed: vec![false; g.arcs.len()],
        }
    }
}

fn chain_end(st: &State, mut s: usize, forward: bool) -> (usize, usize) {
    let mut n = 0;
    loop {
        let step = if forward { st.next[s] } else { st.prev[s] };
        if step == NONE {
            return (s, n);
        }
        s = step;
        n += 1;
    }
}

/// gprof's `order_and_dump_functions_by_arcs`.
fn order_by_arcs(
    g: &Graph,
    st: &mut State,
    the_arcs: &[usize],
    all: bool,
    unplaced: &mut Vec<usize>,
    out: &mut String,
) {
    let total: u64 = if all {
        0
    } else {
        the_arcs.iter().map(|&a| g.arcs[a].count).sum()
    };
    let mut tmp = 0u64;
    for &a in the_arcs {
        tmp += g.arcs[a].count;
        if st.arc_placed[a] {
            continue;
        }
        let (mut child, mut parent) = (g.arcs[a].child, g.arcs[a].parent);
        if (!all && tmp as f64 / total as f64 > 0.99) || st.placed[child] || st.placed[parent] {
            unplaced.push(a);
            continue;
        }
        if st.next[parent] != NONE
            && st.prev[parent] != NONE
            && st.next[child] != NONE
            && st.prev[child] != NONE
        {
            unplaced.push(a);
            continue;
        }
        if st.next[parent] == NONE && st.prev[parent] == NONE {
            let (next, next_count) = chain_end(st, child, true);
            let (prev, prev_count) = chain_end(st, child, false);
            child = if next_count < prev_count { next } else { prev };
        } else if st.next[child] == NONE && st.prev[child] == NONE {
            let (next, next_count) = chain_end(st, parent, true);
            let (prev, prev_count) = chain_end(st, parent, false);
            parent = if prev_count < next_count { prev } else { next };
        } else {
            unplaced.push(a);
            continue;
        }
        let end_of = |s: usize| {
            if st.next[s] != NONE {
                chain_end(st, s, true).0
            } else {
                chain_end(st, s, false).0
            }
        };
        if end_of(parent) == child && end_of(child) == parent {
            unplaced.push(a);
            continue;
        }
        if st.next[parent] != NONE {
            if st.next[child] == NONE {
                st.prev[parent] = child;
                st.next[child] = parent;
                st.arc_placed[a] = true;
            }
        } else if st.prev[parent] != NONE {
            if st.prev[child] == NONE {
                st.next[parent] = child;
                st.prev[child] = parent;
                st.arc_placed[a] = true;
            }
        } else if st.prev[child] != NONE {
            st.prev[parent] = child;
            st.next[child] = parent;
            st.arc_placed[a] = true;
        } else {
            st.next[parent] = child;
            st.prev[child] = parent;
            st.arc_placed[a] = true;
        }
    }
    for &a in the_arcs {
        let (p, c) = (g.arcs[a].parent, g.arcs[a].child);
        if st.placed[p] || st.placed[c] {
            continue;
        }
        if st.next[p] == NONE && st.prev[p] == NONE {
            continue;
        }
        let mut s = chain_end(st, p, false).0;
        while s != NONE {
            st.placed[s] = true;
            let _ = writeln!(out, "{}", g.syms[s].symbol.name);
            s = st.next[s];
        }
    }
    if all {
        for &a in the_arcs {
            let (p, c) = (g.arcs[a].parent, g.arcs[a].child);
            if st.placed[p] || st.placed[c] {
                continue;
            }
            st.placed[p] = true;
            let _ = writeln!(out, "{}", g.syms[p].symbol.name);
        }
    }
}

/// The order of the symbols `syms` (ascending), using the arcs `arcs` (in the order they were made).
fn function_order(
    g: &Graph,
    syms: &[usize],
    arcs: &[usize],
    style: &Style,
    graph_printed: bool,
) -> String {
    let mut st = State::new(g);
    let (mut used, mut unused) = (Vec::new(), Vec::new());
    for &s in syms {
        if g.syms[s].ncalls == 0 {
            unused.push(s);
            st.placed[s] = true;
        } else {
            used.push(s);
        }
    }
    let mut sorted_arcs = arcs.to_vec();
    crate::qsort::msort(&mut sorted_arcs, &mut |&l, &r| {
        g.arcs[r].count.cmp(&g.arcs[l].count)
    });
    let total: u64 = sorted_arcs.iter().map(|&a| g.arcs[a].count).sum();
    let mut tmp = 0u64;
    for &a in &sorted_arcs {
        tmp += g.arcs[a].count;
        if tmp as f64 / total as f64 > 0.90 {
            break;
        }
        st.nuses[g.arcs[a].child] += 1;
    }
    let mut scratch_syms = used.clone();
    crate::qsort::msort(&mut scratch_syms, &mut |&l, &r| {
        st.nuses[r].cmp(&st.nuses[l])
    });
    let mut scratch_arcs: Vec<usize> = Vec::new();
    let mut scratch_index = 0;
    for (i, &s) in scratch_syms.iter().enumerate().take(used.len() / 80) {
        if st.nuses[s] == 5 {
            break;
        }
        // gprof walks its children and parents lists: newest arc first, or, once the call graph has
        // printed the function's entry, in the order printed there (gprof sorts the lists in place).
        let (children, parents) =
            if graph_printed && crate::gprof::callgraph::has_entry(&g.syms[s], style) {
                (
                    crate::gprof::callgraph::children_in_print_order(g, s),
                    crate::gprof::callgraph::parents_in_print_order(g, s),
                )
            } else {
                (
                    g.syms[s].children.iter().rev().copied().collect(),
                    g.syms[s].parents.iter().rev().copied().collect(),
                )
            };
        for &a in &children {
            if g.arcs[a].parent != g.arcs[a].child {
                scratch_arcs.push(a);
            }
            st.arc_placed[a] = true;
        }
        for &a in &parents {
            if g.arcs[a].parent != g.arcs[a].child {
                scratch_arcs.push(a);
            }
            st.arc_placed[a] = true;
        }
        scratch_index = i;
        st.placed[s] = true;
    }
    let mut high_arcs = Vec::new();
    for &a in &scratch_arcs {
        let (p, c) = (g.arcs[a].parent, g.arcs[a].child);
        if st.placed[c] && st.placed[p] {
            high_arcs.push(a);
            st.placed[c] = false;
            st.placed[p] = false;
        }
    }
    let mut out = String::new();
    for &s in &scratch_syms[..scratch_index] {
        if st.placed[s] {
            let _ = writeln!(out, "{}", g.syms[s].symbol.name);
        }
    }
    crate::qsort::msort(&mut high_arcs, &mut |&l, &r| {
        g.arcs[r].count.cmp(&g.arcs[l].count)
    });
    let mut unplaced = Vec::new();
    order_by_arcs(g, &mut st, &high_arcs, true, &mut unplaced, &mut out);
    order_by_arcs(g, &mut st, &sorted_arcs, false, &mut unplaced, &mut out);
    let mut rest = Vec::new();
    order_by_arcs(g, &mut st, &unplaced, true, &mut rest, &mut out);
    for &s in &used {
        if !st.placed[s] {
            let _ = writeln!(out, "{}", g.syms[s].symbol.name);
        }
    }
    for &s in &unused {
        let _ = writeln!(out, "{}", g.syms[s].symbol.name);
    }
    out
}

/// Print the suggested function order: gprof's single list for GNU input, one list per module (those
/// with symbols) for mslprof input. `graph_printed`: the call graph was printed before.
pub fn print(out: &mut Out, g: &Graph, style: &Style, graph_printed: bool) {
    let multi_module = style.multi_module;
    let all_arcs: Vec<usize> = (0..g.arcs.len()).collect();
    if !multi_module {
        let syms: Vec<usize> = (0..g.nsyms).collect();
        out.push_str(&function_order(g, &syms, &all_arcs, style, graph_printed));
        return;
    }
    let mut first = true;
    for (i, m) in g.modules.iter().enumerate() {
        if m.syms.is_empty() {
            continue;
        }
        let syms: Vec<usize> = m.syms.clone().collect();
        let arcs: Vec<usize> = all_arcs
            .iter()
            .copied()
            .filter(|&a| {
                g.syms[g.arcs[a].parent].module == i && g.syms[g.arcs[a].child].module == i
            })
            .collect();
        if !first {
            out.push('\n');
        }
        first = false;
        let _ = writeln!(
            out,
            "# function order for module {i}, {} ({})",
            m.name, m.path
        );
        out.push_str(&function_order(g, &syms, &arcs, style, graph_printed));
    }
}

/// Print the suggested link order of the object files of `-R`'s map (gprof's `cg_print_file_ordering`):
/// the files chained along the arcs between their functions, then the other files with functions in
/// the table, then the map's files without any.
pub fn print_file_order(out: &mut Out, g: &Graph, map: &crate::elf::filemap::FileMap) {
    let mut st = State::new(g);
    let mapped = |s: usize| g.syms[s].symbol.mapped;
    for (a, arc) in g.arcs.iter().enumerate() {
        if !mapped(arc.parent) || !mapped(arc.child) {
            st.arc_placed[a] = true;
        }
    }
    let arcs: Vec<usize> = (0..g.arcs.len()).collect();
    let mut text = String::new();
    let mut unplaced = Vec::new();
    order_by_arcs(g, &mut st, &arcs, false, &mut unplaced, &mut text);
    for s in 0..g.nsyms {
        if mapped(s) && !st.placed[s] {
            let _ = writeln!(text, "{}", g.syms[s].symbol.name);
        }
    }
    for f in map.files() {
        if !(0..g.nsyms).any(|s| mapped(s) && g.syms[s].symbol.name == f) {
            let _ = writeln!(text, "{f}");
        }
    }
    out.push_str(&text);
}
