//! Stage 3, tally arcs: the recorded arcs become calls between the graph's symbols (gprof's `cg_tally`),
//! and `-c` adds the calls found in the machine code with a count of 0.

use std::path::Path;

use mslprof_format::LinkAddress;
use mslprof_format::model::{Profile, UNKNOWN_KEY};

use crate::gprof::arcs::{RawArc, TallyStats, tally};
use crate::gprof::graph::Graph;
use crate::gprof::symspec::Filters;
use crate::input::Input;
use crate::options::{DEBUG_STATIC_CALLS, Options};

/// GNU input: the arcs of every file, in file order. Counts are 32-bit in gmon.out; arcs whose caller is
/// in no function are dropped, as gprof drops them. Returns whether any file had arcs.
pub fn gnu(g: &mut Graph, inputs: &[Input], filters: &Filters) -> bool {
    let mut stats = TallyStats::default();
    let mut have_arcs = false;
    for input in inputs {
        for a in &input.profile.modules[0].arcs {
            have_arcs = true;
            let arc = RawArc {
                caller_module: Some(0),
                caller_address: a.caller_address,
                callee_module: 0,
                callee_address: a.callee_address,
                count: a.count & 0xffff_ffff,
            };
            tally(g, arc, filters, true, &mut stats);
        }
    }
    have_arcs
}

/// mslprof input: each module's arcs, the caller looked up in the module of its load instance (an
/// unknown caller still counts for the callee). Returns whether the profile has arcs.
pub fn mslprof(g: &mut Graph, profile: &Profile, filters: &Filters) -> bool {
    let mut stats = TallyStats::default();
    let mut have_arcs = false;
    for (i, m) in profile.modules.iter().enumerate() {
        for a in &m.arcs {
            have_arcs = true;
            let caller_module = if a.caller_key == UNKNOWN_KEY {
                None
            } else {
                Some(a.caller_key as usize - 1)
            };
            let arc = RawArc {
                caller_module,
                caller_address: a.caller_address,
                callee_module: i,
                callee_address: a.callee_address,
                count: a.count,
            };
            tally(g, arc, filters, false, &mut stats);
        }
    }
    have_arcs
}

/// `-c` for every profiled module of a multi-module graph (modules that were not profiled only name
/// callers: no entries, so no static arcs).
pub fn static_mslprof(g: &mut Graph, opts: &Options, warnings: &mut Vec<String>) {
    for i in 0..g.modules.len() {
        if g.modules[i].syms.is_empty() || !g.modules[i].profiled {
            continue;
        }
        let path = std::path::PathBuf::from(&g.modules[i].path);
        static_arcs(g, i, &path, &|_| true, true, opts, warnings);
    }
}

/// `-c` for one module: the zero-count arcs of its call instructions; `-d` bit 256 traces them on stderr.
pub fn static_arcs(
    g: &mut Graph,
    module: usize,
    path: &Path,
    accept: &dyn Fn(LinkAddress) -> bool,
    cross_module: bool,
    opts: &Options,
    warnings: &mut Vec<String>,
) {
    use std::io::Write as _;
    let mut lines = Vec::new();
    if let Err(e) = crate::gprof::staticcalls::add_static_arcs(
        g,
        module,
        path,
        accept,
        cross_module,
        &mut lines,
    ) {
        warnings.push(format!("{}: -c: {e}", path.display()));
    }
    if opts.debug & DEBUG_STATIC_CALLS != 0 {
        let mut stderr = std::io::stderr().lock();
        for l in lines {
            let _ = writeln!(stderr, "{l}");
        }
    }
}
