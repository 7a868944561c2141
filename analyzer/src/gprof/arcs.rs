//! Turning recorded arcs (call site → callee address, with a count) into arcs between symbols, as GNU
//! gprof's `cg_tally` does, across modules: the caller is looked up in the module of its load instance.

use mslprof_format::LinkAddress;
use mslprof_format::model::UNKNOWN_KEY;

use crate::gprof::graph::Graph;
use crate::gprof::symspec::Filters;

/// Outcome counters of tallying.
#[derive(Clone, Copy, Debug, Default)]
pub struct TallyStats {
    /// Arcs whose callee address is in no function.
    pub unmatched_callee: u64,
    /// Arcs whose caller address is in no function (dropped on GNU input, spontaneous otherwise).
    pub unmatched_caller: u64,
}

/// One recorded arc, already mapped to analysis module indices.
#[derive(Clone, Copy, Debug)]
pub struct RawArc {
    /// Analysis module of the caller, or `None` when unknown.
    pub caller_module: Option<usize>,
    pub caller_address: LinkAddress,
    pub callee_module: usize,
    pub callee_address: LinkAddress,
    pub count: u64,
}

/// The caller key used for "unknown".
pub const UNKNOWN: u32 = UNKNOWN_KEY;

/// Tally one arc. `gnu` selects gprof's rule of dropping arcs whose caller is unknown; otherwise such
/// calls still count for the callee (which then shows a `<spontaneous>` caller).
pub fn tally(graph: &mut Graph, arc: RawArc, filters: &Filters, gnu: bool, stats: &mut TallyStats) {
    let Some(mut child) = graph.lookup(arc.callee_module, arc.callee_address) else {
        stats.unmatched_callee += 1;
        return;
    };
    let parent = arc
        .caller_module
        .and_then(|m| graph.lookup(m, arc.caller_address));
    let first = graph.modules[arc.callee_module].syms.start;
    while !graph.syms[child].symbol.is_func {
        if child == first {
            return;
        }
        child -= 1;
    }
    match parent {
        Some(parent) => {
            if filters.arc_kept(parent, child) {
                graph.syms[child].ncalls += arc.count;
                graph.add_arc(parent, child, arc.count);
            }
        }
        None => {
            stats.unmatched_caller += 1;
            if !gnu {
                graph.syms[child].ncalls += arc.count;
            }
        }
    }
}
