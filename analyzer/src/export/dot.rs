//! The call graph for Graphviz: one `subgraph cluster_N` per module, nodes labelled with the function,
//! its total and self share of the samples, edges with call counts; nodes and edges under the
//! thresholds are left out (as gprof2dot does), as are all but the `max_nodes` largest; nodes are
//! coloured by their total share, and those without drawn edges are stacked in columns.

use std::collections::HashSet;
use std::io::{self, Write};

use super::Prepared;

/// What to leave out of the graph.
#[derive(Clone, Copy, Debug)]
pub struct Thresholds {
    /// Nodes whose total share is under this percentage are left out (gprof2dot's default 0.5).
    pub node: f64,
    /// Edges whose share (of the callee's time on behalf of the caller) is under this percentage are
    /// left out (gprof2dot's default 0.1).
    pub edge: f64,
    /// At most this many nodes: the functions with the largest total shares.
    pub max_nodes: usize,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            node: 0.5,
            edge: 0.1,
            max_nodes: 60,
        }
    }
}

fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                q.push('\\');
                q.push(c);
            }
            '\n' => q.push_str("\\n"),
            _ => q.push(c),
        }
    }
    q.push('"');
    q
}

/// A colour from dark blue (0) through green and yellow to red (1), as gprof2dot's default map runs.
fn colour(share: f64) -> String {
    let t = share.clamp(0.0, 1.0);
    // Hue 240° (blue) down to 0° (red), in HSV with full saturation and value.
    let hue = (1.0 - t) * 240.0;
    let x = 1.0 - ((hue / 60.0) % 2.0 - 1.0).abs();
    let (r, g, b) = match (hue / 60.0) as u32 {
        0 => (1.0, x, 0.0),
        1 => (x, 1.0, 0.0),
        2 => (0.0, 1.0, x),
        3 => (0.0, x, 1.0),
        _ => (x, 0.0, 1.0),
    };
    let byte = |v: f64| (v * 200.0).round() as u8;
    format!("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b))
}

/// Nodes stacked per column when they have no drawn edges: chained by invisible edges, they form
/// columns of this height instead of one long row.
const COLUMN: usize = 6;

/// Write `p`'s call graph in DOT.
pub fn write(p: &Prepared, t: Thresholds, out: &mut dyn Write) -> io::Result<()> {
    let g = &p.analysis.graph;
    let all = p.function_samples().max(f64::MIN_POSITIVE);
    let share = |v: f64| 100.0 * v / all;
    // With no samples at all (a run with calls only), keep every node with calls.
    let no_time = p.function_samples() <= 0.0;
    let mut candidates: Vec<usize> = p
        .active_functions()
        .filter(|&s| no_time || share(p.total_samples(s)) >= t.node)
        .collect();
    let active = p.active_functions().count();
    // The largest total shares first (a stable sort keeps the graph's order among equals).
    candidates.sort_by(|&a, &b| p.total_samples(b).total_cmp(&p.total_samples(a)));
    let capped = candidates.len() > t.max_nodes;
    candidates.truncate(t.max_nodes);
    let kept: HashSet<usize> = candidates.into_iter().collect();
    let seconds = p.profile.header.total_samples as f64 * p.period_ns() as f64 / 1e9;
    let mut label = format!(
        "{:.2} s of CPU time ({} samples of {:.2} ms); {} of {active} functions shown",
        seconds,
        p.profile.header.total_samples,
        p.period_ns() as f64 / 1e6,
        kept.len()
    );
    if !no_time {
        label.push_str(&format!(
            " (total share at least {}%{})",
            t.node,
            if capped {
                format!(", the largest {}", t.max_nodes)
            } else {
                String::new()
            }
        ));
    }
    writeln!(out, "digraph mslprof {{")?;
    writeln!(
        out,
        "  graph [fontname=Arial, rankdir=TB, nodesep=0.125, ranksep=0.25, labelloc=t, label={}];",
        quote(&label)
    )?;
    writeln!(
        out,
        "  node [fontname=Arial, shape=box, style=filled, fontcolor=white, width=0, height=0];"
    )?;
    writeln!(out, "  edge [fontname=Arial];")?;
    for (m, module) in g.modules.iter().enumerate() {
        let members: Vec<usize> = module.syms.clone().filter(|s| kept.contains(s)).collect();
        if members.is_empty() {
            continue;
        }
        writeln!(out, "  subgraph cluster_{m} {{")?;
        writeln!(out, "    label={};", quote(&module.name))?;
        for s in members {
            let sym = &g.syms[s];
            let total = share(p.total_samples(s));
            let own = share(p.self_samples(s));
            let mut label = format!("{}\n{total:.2}%\n({own:.2}%)", sym.display);
            if let Some(calls) = p.calls(s) {
                label.push_str(&format!("\n{calls}\u{d7}"));
            }
            let c = colour(if no_time { 0.0 } else { total / 100.0 });
            writeln!(
                out,
                "    f{s} [label={}, color={}, fillcolor={}];",
                quote(&label),
                quote(&c),
                quote(&c)
            )?;
        }
        writeln!(out, "  }}")?;
    }
    let mut connected = HashSet::new();
    for arc in &g.arcs {
        if !kept.contains(&arc.parent) || !kept.contains(&arc.child) {
            continue;
        }
        let estimate = share(arc.time + arc.child_time);
        if !no_time && estimate < t.edge && arc.parent != arc.child {
            continue;
        }
        let c = colour(if no_time { 0.0 } else { estimate / 100.0 });
        writeln!(
            out,
            "  f{} -> f{} [label={}, color={}, fontcolor={}];",
            arc.parent,
            arc.child,
            quote(&format!("{estimate:.2}%\n{}\u{d7}", arc.count)),
            quote(&c),
            quote(&c)
        )?;
        connected.extend([arc.parent, arc.child]);
    }
    // Functions without drawn edges would sit side by side in one row: stack them per module in
    // columns of COLUMN nodes.
    for module in &g.modules {
        let alone: Vec<usize> = module
            .syms
            .clone()
            .filter(|s| kept.contains(s) && !connected.contains(s))
            .collect();
        for (i, pair) in alone.windows(2).enumerate() {
            if (i + 1) % COLUMN != 0 {
                writeln!(out, "  f{} -> f{} [style=invis];", pair[0], pair[1])?;
            }
        }
    }
    writeln!(out, "}}")
}
