//! The call graph for Graphviz: one `subgraph cluster_N` per module, nodes labelled with the function,
//! its total and self share of the samples, edges with call counts; nodes and edges under the
//! thresholds are left out (as gprof2dot does), and nodes are coloured by their total share.

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
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            node: 0.5,
            edge: 0.1,
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

/// Write `p`'s call graph in DOT.
pub fn write(p: &Prepared, t: Thresholds, out: &mut dyn Write) -> io::Result<()> {
    let g = &p.analysis.graph;
    let all = p.function_samples().max(f64::MIN_POSITIVE);
    let share = |v: f64| 100.0 * v / all;
    // With no samples at all (a run with calls only), keep every node with calls.
    let no_time = p.function_samples() <= 0.0;
    let kept: HashSet<usize> = p
        .active_functions()
        .filter(|&s| no_time || share(p.total_samples(s)) >= t.node)
        .collect();
    writeln!(out, "digraph mslprof {{")?;
    writeln!(
        out,
        "  graph [fontname=Arial, nodesep=0.125, ranksep=0.25, label={}];",
        quote(&format!(
            "{} samples of {} ns",
            p.profile.header.total_samples,
            p.period_ns()
        ))
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
            let label = format!(
                "{}\n{total:.2}%\n({own:.2}%)\n{}\u{d7}",
                sym.display,
                sym.ncalls + sym.self_calls
            );
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
    }
    writeln!(out, "}}")
}
