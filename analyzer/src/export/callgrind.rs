//! The callgrind profile format (as KCachegrind and `callgrind_annotate` read it), `positions: instr
//! line`: one `ob=` per module, `fn=` blocks with the self samples at the first whole instruction of each
//! histogram bucket and its source line (`fi=`/`fe=` where inlined code is in another file), and per call
//! site `cob=`/`cfi=`/`cfn=`/`calls=COUNT ENTRY LINE` followed by the callee's inclusive cost at the call
//! instruction's address and line: measured from the sampled stacks when the profile has them (then call
//! sites seen only on the stacks are written too, with `calls=0`: their calls were not counted), gprof's
//! propagated estimate otherwise. Line 0 where DWARF says nothing.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use super::{CallSite, Prepared};

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

/// The file that following cost lines are in: `fi=` for another file than the function's, `fe=` back.
struct CurrentFile {
    function_file: String,
    current: String,
}

impl CurrentFile {
    fn switch(&mut self, file: &str, names: &mut Names, out: &mut dyn Write) -> io::Result<()> {
        if file != self.current {
            let key = if file == self.function_file {
                "fe"
            } else {
                "fi"
            };
            writeln!(out, "{key}={}", names.get(file))?;
            self.current = file.to_string();
        }
        Ok(())
    }
}

/// Write `p` in callgrind format.
pub fn write(p: &Prepared, out: &mut dyn Write) -> io::Result<()> {
    let g = &p.analysis.graph;
    let h = &p.profile.header;
    let code = p.code();
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
    writeln!(out, "positions: instr line")?;
    writeln!(
        out,
        "event: Samples : CPU-time samples of {} ns",
        p.period_ns()
    )?;
    writeln!(out, "events: Samples")?;
    // Self samples per function, at the first whole instruction of each bucket: every bucket goes to the
    // function holding that instruction (the report splits straddling buckets; here costs stay whole).
    let mut own: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); g.nsyms];
    let mut total = 0u64;
    for c in p.costs(code) {
        *own[c.function].entry(c.address).or_insert(0) += c.samples;
        total += c.samples;
    }
    let mut sites: Vec<Vec<CallSite>> = vec![Vec::new(); g.nsyms];
    for c in p.call_sites(code) {
        sites[c.caller].push(c);
    }
    // With stacks, the samples under each call site, measured: a pair's total shared among its sites.
    let measured: Option<HashMap<(usize, u64, usize), u64>> = p.stacks().map(|stacks| {
        let mut at: HashMap<(usize, u64, usize), u64> = HashMap::new();
        for (pair, samples) in stacks.pair_sites(g.nsyms) {
            let site = code[pair.module].call_site(pair.address.0.saturating_add(1));
            let n = at.entry((pair.caller, site, pair.callee)).or_insert(0);
            *n = n.saturating_add(samples);
        }
        let mut stack_only: Vec<_> = at
            .keys()
            .filter(|(caller, site, callee)| {
                !sites[*caller]
                    .iter()
                    .any(|c| c.site == *site && c.callee == *callee)
            })
            .copied()
            .collect();
        stack_only.sort_unstable();
        for (caller, site, callee) in stack_only {
            sites[caller].push(CallSite {
                caller,
                caller_module: g.syms[caller].module,
                site,
                callee,
                count: 0,
            });
        }
        at
    });
    writeln!(out, "summary: {total}")?;
    writeln!(out, "totals: {total}")?;
    let mut obs = Names::default();
    let mut fns = Names::default();
    let mut fls = Names::default();
    let position = |m: usize, addr: u64| -> (String, u32) {
        code[m]
            .position(addr)
            .map_or(("???".to_string(), 0), |(f, l)| (f.to_string(), l))
    };
    // A function's file: the symbol's, else DWARF's for its entry (its outermost frame).
    let file_of = |s: usize| -> String {
        let sym = &g.syms[s];
        sym.symbol
            .file
            .clone()
            .or_else(|| {
                code[sym.module]
                    .frames(sym.symbol.addr.0)
                    .last()
                    .and_then(|f| f.file.clone())
            })
            .unwrap_or_else(|| "???".into())
    };
    for s in p.active_functions() {
        let sym = &g.syms[s];
        // A called function gets its block even with no samples and no callees: readers take a function's
        // object from its own block (callgrind_annotate prints a callee without one with no object).
        let on_stacks = p.measured.as_ref().is_some_and(|m| m.total[s] > 0);
        if own[s].is_empty() && sym.children.is_empty() && sym.parents.is_empty() && !on_stacks {
            continue;
        }
        let m = sym.module;
        writeln!(out)?;
        writeln!(out, "ob={}", obs.get(&g.modules[m].path))?;
        let function_file = file_of(s);
        writeln!(out, "fl={}", fls.get(&function_file))?;
        writeln!(out, "fn={}", fns.get(&sym.display))?;
        let mut file = CurrentFile {
            current: function_file.clone(),
            function_file,
        };
        for (&addr, count) in &own[s] {
            let (f, line) = position(m, addr);
            file.switch(&f, &mut fls, out)?;
            writeln!(out, "{addr:#x} {line} {count}")?;
        }
        for c in &sites[s] {
            let inclusive = match (&measured, g.arc_index.get(&(c.caller, c.callee))) {
                (Some(at), _) => at.get(&(c.caller, c.site, c.callee)).copied().unwrap_or(0),
                // gprof's estimate of the callee's time on behalf of this caller, shared among its call
                // sites by their counts.
                (None, Some(&a)) => {
                    let arc = &g.arcs[a];
                    let share = if arc.count > 0 {
                        c.count as f64 / arc.count as f64
                    } else {
                        1.0
                    };
                    ((arc.time + arc.child_time) * share).round() as u64
                }
                (None, None) => continue,
            };
            let callee = &g.syms[c.callee];
            let (f, line) = position(m, c.site);
            file.switch(&f, &mut fls, out)?;
            writeln!(out, "cob={}", obs.get(&g.modules[callee.module].path))?;
            writeln!(out, "cfi={}", fls.get(&file_of(c.callee)))?;
            writeln!(out, "cfn={}", fns.get(&callee.display))?;
            let entry = callee.symbol.addr.0;
            writeln!(
                out,
                "calls={} {entry:#x} {}",
                c.count,
                position(callee.module, entry).1
            )?;
            writeln!(out, "{:#x} {line} {inclusive}", c.site)?;
        }
    }
    Ok(())
}
