//! The callgrind profile format (as KCachegrind and `callgrind_annotate` read it): one `ob=` per
//! module, `fn=` blocks with the self samples at the link-time addresses of the histogram buckets, and
//! per arc `cob=`/`cfi=`/`cfn=`/`calls=COUNT ADDRESS` followed by gprof's propagated inclusive estimate.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use mslprof_format::LinkAddress;

use super::Prepared;

/// Assigns `(id)` numbers for callgrind's name compression: the first use writes `(id) name`, later
/// uses `(id)` alone.
#[derive(Default)]
struct Names {
    ids: HashMap<String, usize>,
}

impl Names {
    fn get(&mut self, name: &str) -> String {
        if let Some(id) = self.ids.get(name) {
            return format!("({id})");
        }
        let id = self.ids.len() + 1;
        self.ids.insert(name.to_string(), id);
        format!("({id}) {name}")
    }
}

/// Write `p` in callgrind format.
pub fn write(p: &Prepared, out: &mut dyn Write) -> io::Result<()> {
    let g = &p.analysis.graph;
    let h = &p.profile.header;
    writeln!(out, "# callgrind format")?;
    writeln!(out, "version: 1")?;
    writeln!(out, "creator: mslprof {}", env!("CARGO_PKG_VERSION"))?;
    writeln!(out, "pid: {}", h.pid)?;
    writeln!(
        out,
        "cmd: {}",
        String::from_utf8_lossy(if h.program_path.is_empty() {
            &h.program_name
        } else {
            &h.program_path
        })
    )?;
    writeln!(out, "positions: instr")?;
    writeln!(out, "events: Samples")?;
    // Self samples per function, at bucket addresses: every bucket goes to the function holding its
    // first byte (the report splits straddling buckets; here costs stay whole samples).
    let mut own: Vec<BTreeMap<LinkAddress, u64>> = vec![BTreeMap::new(); g.nsyms];
    let mut total = 0u64;
    for (m, module) in p.profile.modules.iter().enumerate() {
        let Some(hist) = &module.histogram else {
            continue;
        };
        for r in &hist.ranges {
            let width = (r.end - r.start) / r.buckets.len().max(1);
            for (i, count) in r.buckets.nonzero() {
                let addr = r.start + i * width;
                if let Some(s) = g.lookup(m, addr) {
                    *own[s].entry(addr).or_insert(0) += u64::from(count);
                    total += u64::from(count);
                }
            }
        }
    }
    writeln!(out, "summary: {total}")?;
    writeln!(out, "totals: {total}")?;
    let mut obs = Names::default();
    let mut fns = Names::default();
    let mut fls = Names::default();
    for s in p.active_functions() {
        let sym = &g.syms[s];
        // A called function gets its block even with no samples and no callees: readers take a function's
        // object from its own block (callgrind_annotate prints a callee without one with no object).
        if own[s].is_empty() && sym.children.is_empty() && sym.parents.is_empty() {
            continue;
        }
        writeln!(out)?;
        writeln!(out, "ob={}", obs.get(&g.modules[sym.module].path))?;
        writeln!(
            out,
            "fl={}",
            fls.get(sym.symbol.file.as_deref().unwrap_or("???"))
        )?;
        writeln!(out, "fn={}", fns.get(&sym.display))?;
        for (addr, count) in &own[s] {
            writeln!(out, "{addr:#x} {count}")?;
        }
        for &a in &sym.children {
            let arc = &g.arcs[a];
            let callee = &g.syms[arc.child];
            writeln!(out, "cob={}", obs.get(&g.modules[callee.module].path))?;
            writeln!(
                out,
                "cfi={}",
                fls.get(callee.symbol.file.as_deref().unwrap_or("???"))
            )?;
            writeln!(out, "cfn={}", fns.get(&callee.display))?;
            writeln!(out, "calls={} {:#x}", arc.count, callee.symbol.addr)?;
            // gprof's estimate of the callee's time on behalf of this caller.
            let inclusive = (arc.time + arc.child_time).round() as u64;
            writeln!(out, "{:#x} {inclusive}", sym.symbol.addr)?;
        }
    }
    Ok(())
}
