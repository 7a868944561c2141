//! The call graph: propagation of time from callees to callers along arcs (GNU gprof's `cg_assemble`)
//! and printing of the call-graph table and the index by function name in gprof's layout.

use std::cmp::Ordering;
use std::fmt::Write as _;

use crate::gprof::cformat::CFloat;
use crate::gprof::cycles;
use crate::gprof::graph::{Graph, NONE, Sym};
use crate::gprof::style::Style;
use crate::gprof::symspec::{Filters, Table};
use crate::output::Out;

/// Run gprof's whole call-graph analysis. Returns all symbols and cycles sorted for printing, and the
/// total propagated time (gprof's `print_time`).
pub fn assemble(g: &mut Graph, filters: &Filters) -> (Vec<usize>, f64) {
    let print_time = propagate(g, filters);
    (sort_by_total(g), print_time)
}

/// The first part of [`assemble`]: cycles found and numbered on the arcs, print flags and time propagated
/// (gprof's estimate). Returns the total propagated time (gprof's `print_time`).
pub fn propagate(g: &mut Graph, filters: &Filters) -> f64 {
    let n = g.nsyms;
    for s in 0..n {
        let self_arc = g.arc_index.get(&(s, s)).copied();
        let sym = &mut g.syms[s];
        sym.child_time = 0.0;
        match self_arc {
            Some(a) => {
                let c = g.arcs[a].count;
                sym.ncalls = sym.ncalls.wrapping_sub(c);
                sym.self_calls = c;
            }
            None => sym.self_calls = 0,
        }
        sym.prop_fract = 0.0;
        sym.prop_self = 0.0;
        sym.prop_child = 0.0;
        sym.print_flag = false;
        sym.top_order = crate::gprof::graph::DFN_NAN;
        sym.cyc_num = 0;
        sym.cyc_head = s;
        sym.cyc_next = NONE;
    }
    cycles::number(g);
    cycles::link(g);

    let mut top_sorted: Vec<usize> = (0..n).collect();
    top_sorted.sort_by_key(|&s| g.syms[s].top_order);

    let print_time = propagate_flags(g, &top_sorted, filters);
    cycle_time(g);
    for &s in &top_sorted {
        propagate_time(g, s);
    }
    print_time
}

/// The last part of [`assemble`]: every symbol and cycle sorted for printing, by decreasing total time
/// (self and children), and numbered in that order.
pub fn sort_by_total(g: &mut Graph) -> Vec<usize> {
    let mut time_sorted: Vec<usize> = (0..g.syms.len()).collect();
    time_sorted.sort_by(|&l, &r| cmp_total(&g.syms[l], &g.syms[r]));
    for (i, &s) in time_sorted.iter().enumerate() {
        g.syms[s].index = i + 1;
    }
    time_sorted
}

/// The print flag and propagation fraction a function (or a whole cycle) inherits from its callers
/// (gprof's `inherit_flags`): any printed caller makes it printed, and each caller passes on its own
/// fraction in proportion to the calls it makes. Self-calls and calls inside the cycle do not count.
fn inherit_flags(g: &mut Graph, child: usize) {
    let head = g.syms[child].cyc_head;
    let ncalls = g.syms[head].ncalls;
    let (mut flag, mut fract) = (false, 0.0);
    if child == head {
        inherit_from_callers(g, child, ncalls, |p| p == child, &mut flag, &mut fract);
        g.syms[child].print_flag = flag;
        g.syms[child].prop_fract = fract;
    } else {
        let mut m = g.syms[head].cyc_next;
        while m != NONE {
            let in_cycle = |p: usize| g.syms[p].cyc_head == head;
            inherit_from_callers(g, m, ncalls, in_cycle, &mut flag, &mut fract);
            m = g.syms[m].cyc_next;
        }
        let mut m = head;
        while m != NONE {
            g.syms[m].print_flag = flag;
            g.syms[m].prop_fract = fract;
            m = g.syms[m].cyc_next;
        }
    }
}

/// Adds to `flag` and `fract` what the callers of `callee` pass on, skipping those `skip` names; `ncalls`
/// are the calls of the function or cycle that inherits.
fn inherit_from_callers(
    g: &Graph,
    callee: usize,
    ncalls: u64,
    skip: impl Fn(usize) -> bool,
    flag: &mut bool,
    fract: &mut f64,
) {
    for &a in g.syms[callee].parents.iter().rev() {
        let arc = &g.arcs[a];
        if skip(arc.parent) {
            continue;
        }
        let parent = &g.syms[arc.parent];
        *flag |= parent.print_flag;
        if ncalls != 0 {
            *fract += parent.prop_fract * (arc.count as f64 / ncalls as f64);
        }
    }
}

fn propagate_flags(g: &mut Graph, top_sorted: &[usize], filters: &Filters) -> f64 {
    let mut print_time = 0.0;
    let mut old_head = NONE;
    for &child in top_sorted.iter().rev() {
        if g.syms[child].cyc_head != old_head {
            old_head = g.syms[child].cyc_head;
            inherit_flags(g, child);
        }
        let s = &mut g.syms[child];
        if !s.print_flag {
            if filters.selected(Table::InclGraph, Table::ExclGraph, child) {
                s.print_flag = true;
            }
        } else if !filters.has(Table::InclGraph, child) && filters.has(Table::ExclGraph, child) {
            s.print_flag = false;
        }
        if s.prop_fract == 0.0 {
            if filters.selected(Table::InclTime, Table::ExclTime, child) {
                s.prop_fract = 1.0;
            }
        } else if !filters.has(Table::InclTime, child) && filters.has(Table::ExclTime, child) {
            s.prop_fract = 0.0;
        }
        s.prop_self = s.hist_time * s.prop_fract;
        print_time += s.prop_self;
    }
    print_time
}

fn cycle_time(g: &mut Graph) {
    for num in 1..=g.num_cycles {
        let cyc = g.cycle(num);
        let mut t = g.syms[cyc].hist_time;
        let mut m = g.syms[cyc].cyc_next;
        while m != NONE {
            if g.syms[m].prop_fract != 0.0 {
                t += g.syms[m].hist_time;
            }
            m = g.syms[m].cyc_next;
        }
        g.syms[cyc].hist_time = t;
        g.syms[cyc].prop_self = g.syms[cyc].prop_fract * t;
    }
}

fn propagate_time(g: &mut Graph, parent: usize) {
    if g.syms[parent].prop_fract == 0.0 {
        return;
    }
    let children = g.syms[parent].children.clone();
    for &a in children.iter().rev() {
        let (count, mut child) = (g.arcs[a].count, g.arcs[a].child);
        if count == 0 || child == parent || g.syms[child].prop_fract == 0.0 {
            continue;
        }
        if g.syms[child].cyc_head != child {
            if g.syms[parent].cyc_num == g.syms[child].cyc_num {
                continue;
            }
            child = g.syms[child].cyc_head;
        } else if g.syms[parent].top_order <= g.syms[child].top_order {
            continue;
        }
        let c = &g.syms[child];
        if c.ncalls == 0 {
            continue;
        }
        let ratio = count as f64 / c.ncalls as f64;
        let time = c.hist_time * ratio;
        let child_time = c.child_time * ratio;
        let share = time + child_time;
        let p = &mut g.syms[parent];
        p.child_time += share;
        let prop_share = p.prop_fract * share;
        p.prop_child += prop_share;
        let fract = p.prop_fract;
        let head = p.cyc_head;
        g.arcs[a].time = time * fract;
        g.arcs[a].child_time = child_time * fract;
        if head != parent {
            g.syms[head].child_time += share;
            g.syms[head].prop_child += prop_share;
        }
    }
}

fn cmp_total(l: &Sym, r: &Sym) -> Ordering {
    let diff = (l.prop_self + l.prop_child) - (r.prop_self + r.prop_child);
    if diff < 0.0 {
        return Ordering::Greater;
    }
    if diff > 0.0 {
        return Ordering::Less;
    }
    match (l.is_cycle, r.is_cycle) {
        (true, true) => return l.cyc_num.cmp(&r.cyc_num),
        (true, false) => return Ordering::Less,
        (false, true) => return Ordering::Greater,
        _ => {}
    }
    let l0 = l.symbol.name.as_bytes().first() == Some(&b'_');
    let r0 = r.symbol.name.as_bytes().first() == Some(&b'_');
    if !l0 && r0 {
        return Ordering::Less;
    }
    if l0 && !r0 {
        return Ordering::Greater;
    }
    r.ncalls
        .cmp(&l.ncalls)
        .then_with(|| l.symbol.name.as_bytes().cmp(r.symbol.name.as_bytes()))
}

/// gprof's `print_name_only`: the printed name (demangled unless BSD style).
pub fn name_only(s: &Sym, style: &Style) -> String {
    let mut out = if style.bsd {
        s.raw_display()
    } else {
        s.display.clone()
    };
    if (style.inline_file_names || style.line_granularity)
        && let Some(f) = &s.symbol.file
    {
        let f = if style.print_path {
            f.as_str()
        } else {
            f.rsplit('/').next().unwrap_or(f)
        };
        if style.line_granularity {
            let _ = write!(out, " ({}:{} @ {:x})", f, s.symbol.line, s.symbol.addr);
        } else {
            let _ = write!(out, " ({}:{})", f, s.symbol.line);
        }
    }
    out
}

/// gprof's `print_name`: name, cycle and index.
pub fn name_full(s: &Sym, style: &Style) -> String {
    let mut out = name_only(s, style);
    if s.cyc_num != 0 {
        let _ = write!(out, " <cycle {}>", s.cyc_num);
    }
    if s.index != 0 {
        if s.print_flag {
            let _ = write!(out, " [{}]", s.index);
        } else {
            let _ = write!(out, " ({})", s.index);
        }
    }
    out
}

fn cmp_arc(g: &Graph, l: usize, r: usize) -> Ordering {
    let (la, ra) = (&g.arcs[l], &g.arcs[r]);
    if la.parent == la.child {
        return Ordering::Less;
    }
    if ra.parent == ra.child {
        return Ordering::Greater;
    }
    let in_cycle = |a: &crate::gprof::graph::CgArc| {
        let (p, c) = (&g.syms[a.parent], &g.syms[a.child]);
        p.cyc_num != 0 && c.cyc_num != 0 && p.cyc_num == c.cyc_num
    };
    match (in_cycle(la), in_cycle(ra)) {
        (true, true) => la.count.cmp(&ra.count),
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => {
            let lt = la.time + la.child_time;
            let rt = ra.time + ra.child_time;
            if lt < rt {
                Ordering::Less
            } else if lt > rt {
                Ordering::Greater
            } else {
                la.count.cmp(&ra.count)
            }
        }
    }
}

/// Print the call graph table (gprof's `cg_print`).
pub fn print(out: &mut Out, g: &mut Graph, time_sorted: &[usize], print_time: f64, style: &Style) {
    let mut print_time = print_time;
    if style.multi_module {
        number_entries(g, time_sorted, style);
    }
    let iw = style.index_width.get();
    if style.descriptions && style.bsd {
        match &style.measured {
            Some(stacks) => out.push_str(&crate::gprof::blurbs::bsd_call_graph_measured(stacks)),
            None => out.push_str(crate::gprof::blurbs::BSD_CALL_GRAPH),
        }
    }
    style.begin_section(out);
    if !style.bsd {
        if style.descriptions {
            out.push_str("\t\t     Call graph (explanation follows)\n\n");
        } else {
            out.push_str("\t\t\tCall graph\n\n");
        }
    }
    if !style.write_granularity(out, print_time, "seconds") {
        out.push_str(" no time propagated\n\n");
        print_time = 1.0;
    }
    if style.bsd {
        let _ = writeln!(
            out,
            "{:>iw$.iw$} {:>5.5} {:>7.7} {:>11.11} {:>7.7}/{:<7.7}     {:<8.8}",
            "", "", "", "", "called", "total", "parents"
        );
        let _ = writeln!(
            out,
            "{:<iw$.iw$} {:>5.5} {:>7.7} {:>11.11} {:>7.7}+{:<7.7} {:<8.8}\t{:>5.5}",
            "index", "%time", "self", "descendants", "called", "self", "name", "index"
        );
        let _ = writeln!(
            out,
            "{:>iw$.iw$} {:>5.5} {:>7.7} {:>11.11} {:>7.7}/{:<7.7}     {:<8.8}",
            "", "", "", "", "called", "total", "children"
        );
        out.push('\n');
    } else {
        let _ = writeln!(
            out,
            "{:<iw$}% time    self  children    called     name",
            "index"
        );
    }
    for &p in time_sorted {
        let s = &g.syms[p];
        if !has_entry(s, style) || callers_only(g, s) {
            continue;
        }
        if s.is_cycle {
            print_cycle(out, g, p, print_time, style);
        } else {
            print_parents(out, g, p, style);
            let s = &g.syms[p];
            write_primary_times(out, s, print_time, style);
            if s.ncalls.wrapping_add(s.self_calls) != 0 {
                let _ = write!(out, " {:>7}", s.ncalls);
                if s.self_calls != 0 {
                    let _ = write!(out, "+{:<7} ", s.self_calls);
                } else {
                    let _ = write!(out, " {:>7.7} ", "");
                }
            } else {
                let _ = write!(out, " {:>7.7} {:>7.7} ", "", "");
            }
            out.push_str(&name_full(s, style));
            out.push('\n');
            print_children(out, g, p, style);
        }
        if style.bsd {
            out.push('\n');
        }
        out.push_str("-----------------------------------------------\n");
        if style.bsd {
            out.push('\n');
        }
    }
    if style.descriptions && !style.bsd {
        match &style.measured {
            Some(stacks) => out.push_str(&crate::gprof::blurbs::call_graph_measured(stacks)),
            None => out.push_str(crate::gprof::blurbs::CALL_GRAPH),
        }
    }
}

/// Multi-module reports: number the functions with an entry 1, 2, … in the table's order and the others
/// after them (gprof numbers every function, so entries' numbers jump where functions without one are
/// left out), and make the index column as wide as the largest entry number needs.
fn number_entries(g: &mut Graph, time_sorted: &[usize], style: &Style) {
    let (entries, others): (Vec<usize>, Vec<usize>) = time_sorted
        .iter()
        .partition(|&&s| has_entry(&g.syms[s], style) && !callers_only(g, &g.syms[s]));
    for (i, &s) in entries.iter().chain(&others).enumerate() {
        g.syms[s].index = i + 1;
    }
    style
        .index_width
        .set(format!("[{}]", entries.len()).len().max(INDEX_WIDTH));
}

/// gprof's width of the index column.
pub const INDEX_WIDTH: usize = 6;

/// The first columns of a primary line (a function's or a whole cycle's): `[index]`, % time, self and
/// children seconds.
fn write_primary_times(out: &mut Out, s: &Sym, print_time: f64, style: &Style) {
    let iw = style.index_width.get();
    let kids_w = if style.bsd { 11 } else { 7 };
    let buf = format!("[{}]", s.index);
    let _ = write!(
        out,
        "{:<iw$.iw$} {:>5.1} {:>7.2} {:>kids_w$.2}",
        buf,
        CFloat(100.0 * (s.prop_self + s.prop_child) / print_time),
        CFloat(s.prop_self / style.hz),
        CFloat(s.prop_child / style.hz)
    );
}

fn print_cycle(out: &mut Out, g: &mut Graph, cyc: usize, print_time: f64, style: &Style) {
    let iw = style.index_width.get();
    let hz = style.hz;
    let kids_w = if style.bsd { 11 } else { 7 };
    let c = &g.syms[cyc];
    write_primary_times(out, c, print_time, style);
    let _ = write!(out, " {:>7}", c.ncalls);
    if c.self_calls != 0 {
        let _ = write!(out, "+{:<7}", c.self_calls);
    } else {
        let _ = write!(out, " {:>7.7}", "");
    }
    let _ = writeln!(out, " <cycle {} as a whole> [{}]", c.cyc_num, c.index);
    // Members, largest first (gprof's insertion sort keeps chain order among equals).
    let mut members = Vec::new();
    let mut m = g.syms[cyc].cyc_next;
    while m != NONE {
        members.push(m);
        m = g.syms[m].cyc_next;
    }
    members.sort_by(|&l, &r| {
        let (a, b) = (&g.syms[l], &g.syms[r]);
        let (at, bt) = (a.prop_self + a.prop_child, b.prop_self + b.prop_child);
        bt.partial_cmp(&at)
            .unwrap_or(Ordering::Equal)
            .then_with(|| (b.ncalls + b.self_calls).cmp(&(a.ncalls + a.self_calls)))
    });
    for &m in &members {
        let s = &g.syms[m];
        let _ = write!(
            out,
            "{:>iw$.iw$} {:>5.5} {:>7.2} {:>kids_w$.2} {:>7}",
            "",
            "",
            CFloat(s.prop_self / hz),
            CFloat(s.prop_child / hz),
            s.ncalls
        );
        if s.self_calls != 0 {
            let _ = write!(out, "+{:<7}", s.self_calls);
        } else {
            let _ = write!(out, " {:>7.7}", "");
        }
        out.push_str("     ");
        out.push_str(&name_full(s, style));
        out.push('\n');
    }
}

/// Whether the call graph has an entry for `s` (gprof's test in `cg_print`).
pub fn has_entry(s: &Sym, style: &Style) -> bool {
    !((style.ignore_zeros
        && s.ncalls == 0
        && s.self_calls == 0
        && s.prop_self == 0.0
        && s.prop_child == 0.0)
        || !s.print_flag
        || (style.line_granularity && !s.symbol.is_func))
}

/// The arcs into `child` in the order its call-graph entry lists them (ascending; among equals, the arc
/// seen first comes first).
pub fn parents_in_print_order(g: &Graph, child: usize) -> Vec<usize> {
    let mut arcs = g.syms[child].parents.clone();
    arcs.sort_by(|&l, &r| cmp_arc(g, l, r));
    arcs
}

/// The arcs out of `parent` in the order its call-graph entry lists them (descending; among equals, the
/// arc seen first comes first).
pub fn children_in_print_order(g: &Graph, parent: usize) -> Vec<usize> {
    let mut arcs = g.syms[parent].children.clone();
    arcs.sort_by(|&l, &r| cmp_arc(g, r, l));
    arcs
}

fn print_parents(out: &mut Out, g: &Graph, child: usize, style: &Style) {
    let iw = style.index_width.get();
    let kids_w = if style.bsd { 11 } else { 7 };
    let c = &g.syms[child];
    let head = c.cyc_head;
    if c.parents.is_empty() {
        let _ = writeln!(
            out,
            "{:>iw$.iw$} {:>5.5} {:>7.7} {:>kids_w$.kids_w$} {:>7.7} {:>7.7}     <spontaneous>",
            "", "", "", "", "", ""
        );
        return;
    }
    for a in parents_in_print_order(g, child) {
        let arc = &g.arcs[a];
        let parent = &g.syms[arc.parent];
        let in_cycle = arc.parent == child || (c.cyc_num != 0 && parent.cyc_num == c.cyc_num);
        print_arc_line(out, g, a, arc.parent, in_cycle, g.syms[head].ncalls, style);
    }
}

fn print_children(out: &mut Out, g: &Graph, parent: usize, style: &Style) {
    let p = &g.syms[parent];
    for a in children_in_print_order(g, parent) {
        let arc = &g.arcs[a];
        let child = &g.syms[arc.child];
        let in_cycle = arc.child == parent || (child.cyc_num != 0 && child.cyc_num == p.cyc_num);
        print_arc_line(
            out,
            g,
            a,
            arc.child,
            in_cycle,
            g.syms[child.cyc_head].ncalls,
            style,
        );
    }
}

/// One parent or child line of a call-graph entry, naming `other` (the arc's far end). An arc inside a
/// cycle (or a self-call) shows only its count; any other shows the time and child time it carries and
/// `count/calls`, `calls` being those of the callee (or of its cycle).
fn print_arc_line(
    out: &mut Out,
    g: &Graph,
    a: usize,
    other: usize,
    in_cycle: bool,
    calls: u64,
    style: &Style,
) {
    let hz = style.hz;
    let iw = style.index_width.get();
    let kids_w = if style.bsd { 11 } else { 7 };
    let arc = &g.arcs[a];
    if in_cycle {
        let _ = write!(
            out,
            "{:>iw$.iw$} {:>5.5} {:>7.7} {:>kids_w$.kids_w$} {:>7} {:>7.7}     ",
            "", "", "", "", arc.count, ""
        );
    } else {
        // An arc known only from sampled stacks has no counted call: 0, as gprof's `-c` prints the arcs it
        // found in the code (which gprof2dot and other readers of the text parse).
        let called = format!("{:>7}/{:<7}", arc.count, calls);
        let _ = write!(
            out,
            "{:>iw$.iw$} {:>5.5} {:>7.2} {:>kids_w$.2} {called}     ",
            "",
            "",
            CFloat(arc.time / hz),
            CFloat(arc.child_time / hz),
        );
    }
    out.push_str(&name_full(&g.syms[other], style));
    out.push('\n');
}

/// Print the index by function name (gprof's `cg_print_index`).
pub fn print_index(out: &mut Out, g: &Graph, style: &Style) {
    let iw = style.index_width.get();
    let mut names: Vec<usize> = (0..g.nsyms)
        .filter(|&s| !(style.ignore_zeros && g.syms[s].ncalls == 0 && g.syms[s].hist_time == 0.0))
        .collect();
    names.sort_by(|&l, &r| {
        g.syms[l]
            .symbol
            .name
            .as_bytes()
            .cmp(g.syms[r].symbol.name.as_bytes())
    });
    let nnames = names.len();
    for num in 1..=g.num_cycles {
        names.push(g.cycle(num));
    }
    let todo = names.len();
    out.push_str("\u{c}\nIndex by function name\n\n");
    let rows = todo.div_ceil(3);
    let column_width = (style.output_width.saturating_sub(1) / 3) as i64;
    for i in 0..rows {
        let mut col: i64 = 0;
        let mut starting_col: i64 = 0;
        let mut j = i;
        while j < todo {
            let s = &g.syms[names[j]];
            let buf = if s.print_flag {
                format!("[{}]", s.index)
            } else {
                format!("({})", s.index)
            };
            if style.bsd {
                if j < nnames {
                    let _ = write!(
                        out,
                        "{:>iw$.iw$} {:<19.19}",
                        buf,
                        trunc_chars(&s.raw_display(), 19)
                    );
                } else {
                    let _ = write!(out, "{:>iw$.iw$} ", buf);
                    let _ = write!(out, "{:<19.19}", format!("<cycle {}>", s.cyc_num));
                }
            } else {
                col += buf.len() as i64;
                while col < starting_col + 5 {
                    out.push(' ');
                    col += 1;
                }
                let _ = write!(out, " {buf} ");
                if j < nnames {
                    let name = name_only(s, style);
                    col += name.len() as i64;
                    out.push_str(&name);
                    if s.symbol.is_static
                        && !style.line_granularity
                        && let Some(f) = &s.symbol.file
                    {
                        let f = if style.print_path {
                            f.as_str()
                        } else {
                            f.rsplit('/').next().unwrap_or(f)
                        };
                        let _ = write!(out, " ({f})");
                        col += f.len() as i64 + 3;
                    }
                } else {
                    let c = format!("<cycle {}>", s.cyc_num);
                    col += c.len() as i64;
                    out.push_str(&c);
                }
            }
            starting_col += column_width;
            j += rows;
        }
        out.push('\n');
    }
}

fn trunc_chars(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// True for a function of a module that is not profiled: it appears only as a caller, without an entry.
/// Except the functions called from profiled modules through the PLT (a module with CALLEE_ARCS): those
/// get entries with their calls.
pub fn callers_only(g: &Graph, s: &Sym) -> bool {
    !s.is_cycle
        && g.modules
            .get(s.module)
            .is_some_and(|m| !(m.profiled || (m.callee_arcs && s.ncalls != 0)))
}
