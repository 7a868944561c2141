//! Crediting histogram samples to functions with proportional overlap, exactly as GNU gprof's
//! `hist_assign_samples` does: a bucket that straddles two functions is split by the share of its
//! address range each one covers, with gprof's floating-point bucket boundaries.

use mslprof_format::LinkAddress;
use mslprof_format::model::Histogram;

use crate::gprof::graph::Graph;
use crate::gprof::symspec::{Filters, Table};

/// Per-run totals of sample assignment.
#[derive(Clone, Copy, Debug, Default)]
pub struct SampleTotals {
    /// Samples counted in the flat profile (gprof's `total_time`, in samples).
    pub total_time: f64,
}

/// The scale (in address units per bucket) gprof derives for one range.
pub fn hist_scale(start: LinkAddress, end: LinkAddress, buckets: u64, unit: u64) -> f64 {
    if buckets == 0 {
        return 0.0;
    }
    // gprof 2.40 divides the byte span by the unit in integers first, then by the bucket count in
    // floating point; with an odd span this differs from dividing in floating point throughout.
    (end.offset_from(start) / unit.max(1)) as f64 / buckets as f64
}

/// Compute each symbol's scaled address (gprof's `scale_and_align_entries`; no entry masks on the
/// architectures we support).
pub fn scale_entries(graph: &mut Graph) {
    for m in 0..graph.modules.len() {
        let unit = graph.modules[m].unit.max(1);
        for s in graph.modules[m].syms.clone() {
            graph.syms[s].scaled_addr = graph.syms[s].symbol.addr.0 / unit;
        }
    }
}

/// Credit one module's histogram to its symbols.
pub fn assign(
    graph: &mut Graph,
    module: usize,
    hist: &Histogram,
    filters: &Filters,
    totals: &mut SampleTotals,
) {
    let view = graph.modules[module].clone();
    let unit = view.unit.max(1);
    let base = view.syms.start;
    let len = view.syms.len();
    for range in &hist.ranges {
        let nbins = range.buckets.len();
        if nbins == 0 {
            continue;
        }
        let scale = hist_scale(range.start, range.end, nbins, unit);
        let lowpc = range.start.0 / unit;
        let mut k: usize = 1;
        for (i, count) in range.buckets.nonzero() {
            let bin_low = lowpc.wrapping_add((scale * i as f64) as u64);
            let bin_high = lowpc.wrapping_add((scale * (i + 1) as f64) as u64);
            let count_time = f64::from(count);
            totals.total_time += count_time;
            let mut j = k - 1;
            while j < len {
                let sym_low = graph.syms[base + j].scaled_addr;
                let sym_high = if j + 1 < len {
                    graph.syms[base + j + 1].scaled_addr
                } else if view.gnu_last_symbol {
                    0
                } else {
                    graph.syms[base + j].symbol.end_addr.wrapping_add(1).0 / unit
                };
                if bin_high < sym_low {
                    break;
                }
                if bin_low < sym_high {
                    let overlap = bin_high.min(sym_high).wrapping_sub(bin_low.max(sym_low));
                    if overlap > 0 {
                        let credit = overlap as f64 * count_time / scale;
                        if filters.selected(Table::InclFlat, Table::ExclFlat, base + j) {
                            graph.syms[base + j].hist_time += credit;
                        } else {
                            totals.total_time -= credit;
                        }
                    }
                }
                j += 1;
                k = j;
            }
        }
    }
}
