//! Stage 5 (profiles with a STACKS section): each sampled call stack, its frames turned into the graph's
//! symbols, leaf first. The measured times of the report and the stacks of the exports start from here.

use mslprof_format::LinkAddress;
use mslprof_format::model::{Profile, StackFrame, UNKNOWN_KEY};

use crate::gprof::blurbs::StacksNote;
use crate::gprof::graph::Graph;
use crate::gprof::symspec::Filters;

/// One frame of a resolved stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The frame's module in [`Graph::modules`], `None` for an address in no known module.
    pub module: Option<usize>,
    /// The link-time address looked up: the sampled PC for the leaf, `return address - 1` above it (an
    /// address inside the call instruction, so a call that ends its function still names that function).
    pub address: LinkAddress,
    /// The function in [`Graph::syms`] that holds `address`, `None` where no symbol covers it.
    pub sym: Option<usize>,
}

impl Frame {
    /// The frame as the report names it: its function (module-qualified where the name is ambiguous),
    /// `module+0xADDR` for an address no symbol covers, `[unknown]` for an address in no known module.
    pub fn name(&self, g: &Graph) -> String {
        match (self.sym, self.module) {
            (Some(s), _) => g.syms[s].display.clone(),
            (None, Some(m)) => format!("{}+{:#x}", g.modules[m].name, self.address.0),
            (None, None) => "[unknown]".into(),
        }
    }
}

/// One distinct stack and how many samples had it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    pub count: u64,
    /// `mslprof_format::stack_flags`: whether the walk stopped before the stack's root, and why.
    pub flags: u32,
    /// Leaf first.
    pub frames: Vec<Frame>,
}

impl Stack {
    pub fn is_truncated(&self) -> bool {
        self.flags != 0
    }
}

/// The profile's stacks, resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stacks {
    pub stacks: Vec<Stack>,
    /// The depth limit the runtime used.
    pub max_depth: u32,
    /// Samples whose stack the runtime could not store (its table was full).
    pub dropped: u64,
    /// Samples with a stored stack (the sum of the counts).
    pub samples: u64,
}

/// Resolve the stacks of a merged mslprof profile (module keys are 1-based module indices, as
/// [`crate::merge`] numbers them) against `g`. `None` when the profile has no stacks.
pub fn resolve(g: &Graph, profile: &Profile) -> Option<Stacks> {
    let recorded = profile.stacks.as_ref()?;
    let stacks: Vec<Stack> = recorded
        .records
        .iter()
        .filter(|r| r.count != 0 && !r.frames.is_empty())
        .map(|r| Stack {
            count: r.count,
            flags: r.flags,
            frames: r
                .frames
                .iter()
                .enumerate()
                .map(|(depth, f)| frame(g, f, depth))
                .collect(),
        })
        .collect();
    Some(Stacks {
        samples: recorded.sample_count(),
        max_depth: recorded.max_depth,
        dropped: recorded.dropped,
        stacks,
    })
}

fn frame(g: &Graph, f: &StackFrame, depth: usize) -> Frame {
    let module = if f.key == UNKNOWN_KEY {
        None
    } else {
        (f.key as usize)
            .checked_sub(1)
            .filter(|m| *m < g.modules.len())
    };
    let address = if depth == 0 {
        f.address
    } else {
        LinkAddress(f.address.0.saturating_sub(1))
    };
    let sym = module.and_then(|m| g.lookup(m, address));
    Frame {
        module,
        address,
        sym,
    }
}

/// Time under one caller→callee pair, in samples: those whose stack holds the pair as adjacent frames,
/// each sample counted once however often the pair recurs in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairSamples {
    pub total: u64,
    /// Of `total`, the samples whose leaf is the callee (directly or through its own recursion): the
    /// callee's own time under this caller.
    pub callee_self: u64,
}

/// Measured time per function and per caller→callee pair, in samples, from the stacks. Counted once per
/// sample, so recursion is never double-counted. Frames without a symbol count for no function and break
/// the pairs they are part of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    /// Per symbol of [`Graph::syms`]: samples with the symbol anywhere on the stack (inclusive time).
    pub total: Vec<u64>,
    /// Per symbol: samples with the symbol as the leaf (self time).
    pub leaf: Vec<u64>,
    /// Per (caller, callee) symbol pair.
    pub pairs: std::collections::HashMap<(usize, usize), PairSamples>,
}

/// One caller→callee pair at one call site: the caller frame's module and looked-up address (the return
/// address - 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PairSite {
    pub caller: usize,
    pub callee: usize,
    pub module: usize,
    pub address: LinkAddress,
}

impl Stacks {
    /// Inclusive, self and per-pair sample counts for a graph of `nsyms` symbols.
    pub fn measure(&self, nsyms: usize) -> Measured {
        let mut m = Measured {
            total: vec![0; nsyms],
            leaf: vec![0; nsyms],
            pairs: Default::default(),
        };
        let mut seen_syms: std::collections::HashSet<usize> = Default::default();
        let mut seen_pairs: std::collections::HashSet<(usize, usize)> = Default::default();
        for stack in &self.stacks {
            seen_syms.clear();
            seen_pairs.clear();
            let leaf = stack.frames.first().and_then(|f| f.sym);
            if let Some(s) = leaf.filter(|s| *s < nsyms) {
                m.leaf[s] = m.leaf[s].saturating_add(stack.count);
            }
            for (i, f) in stack.frames.iter().enumerate() {
                let Some(callee) = f.sym.filter(|s| *s < nsyms) else {
                    continue;
                };
                if seen_syms.insert(callee) {
                    m.total[callee] = m.total[callee].saturating_add(stack.count);
                }
                let Some(caller) = stack.frames.get(i + 1).and_then(|c| c.sym) else {
                    continue;
                };
                if caller < nsyms && seen_pairs.insert((caller, callee)) {
                    let pair = m.pairs.entry((caller, callee)).or_default();
                    pair.total = pair.total.saturating_add(stack.count);
                    if leaf == Some(callee) {
                        pair.callee_self = pair.callee_self.saturating_add(stack.count);
                    }
                }
            }
        }
        m
    }

    /// [`Measured::pairs`]' totals split by call site: each sample counts once per caller→callee pair, at
    /// the pair's outermost occurrence (nearest the root), so a pair's sites add up to its total.
    pub fn pair_sites(&self, nsyms: usize) -> std::collections::HashMap<PairSite, u64> {
        let mut sites: std::collections::HashMap<PairSite, u64> = Default::default();
        let mut seen_pairs: std::collections::HashSet<(usize, usize)> = Default::default();
        for stack in &self.stacks {
            seen_pairs.clear();
            for pair in stack.frames.windows(2).rev() {
                let (callee, caller) = (&pair[0], &pair[1]);
                let (Some(callee_sym), Some(caller_sym), Some(module)) =
                    (callee.sym, caller.sym, caller.module)
                else {
                    continue;
                };
                if callee_sym < nsyms
                    && caller_sym < nsyms
                    && seen_pairs.insert((caller_sym, callee_sym))
                {
                    let site = PairSite {
                        caller: caller_sym,
                        callee: callee_sym,
                        module,
                        address: caller.address,
                    };
                    let n = sites.entry(site).or_insert(0);
                    *n = n.saturating_add(stack.count);
                }
            }
        }
        sites
    }

    /// Samples whose stack holds at least one symbol for which `member` is true (a cycle's inclusive time,
    /// for instance).
    pub fn samples_containing(&self, member: impl Fn(usize) -> bool) -> u64 {
        self.stacks
            .iter()
            .filter(|s| s.frames.iter().any(|f| f.sym.is_some_and(&member)))
            .fold(0u64, |sum, s| sum.saturating_add(s.count))
    }
}

impl Stacks {
    /// What the call graph's blurb says about these stacks.
    pub fn note(&self) -> StacksNote {
        StacksNote {
            samples: self.samples,
            truncated: self
                .stacks
                .iter()
                .filter(|s| s.is_truncated())
                .fold(0u64, |sum, s| sum.saturating_add(s.count)),
            dropped: self.dropped,
        }
    }

    /// Put the measured times into `g`, whose time gprof's way has just been propagated
    /// ([`crate::gprof::callgraph::propagate`]), in place of the estimates; in samples, as the histogram.
    ///
    /// - A function's children time is the samples with it anywhere on the stack less those with it as
    ///   the leaf (its self time stays the histogram's).
    /// - A cycle (found by gprof's rule, on the counted arcs only) has as children time the samples with
    ///   any member on the stack less those whose leaf is a member.
    /// - An arc's time is the samples whose stack holds that caller→callee pair: the callee's own time
    ///   under that caller (those with the callee as the leaf) as self, the rest as children.
    /// - A pair with no counted arc (its callee does not count its calls) becomes an arc without a count
    ///   ([`crate::gprof::graph::CgArc::stacks_only`]), unless `-k` excludes it; a function calling itself
    ///   adds no arc (its recursion is within its own time).
    ///
    /// Each figure counts a sample once, however often the function or pair recurs in its stack. Like
    /// gprof's estimate, times are scaled by each function's share of propagated time (`-n`/`-N`).
    pub fn apply(&self, g: &mut Graph, filters: &Filters) {
        let n = g.nsyms;
        let m = self.measure(n);
        for (s, sym) in g.syms[..n].iter_mut().enumerate() {
            sym.child_time = m.total[s].saturating_sub(m.leaf[s]) as f64;
            sym.prop_child = sym.prop_fract * sym.child_time;
        }
        for num in 1..=g.num_cycles {
            let cyc = g.cycle(num);
            let member = |s: usize| s < n && g.syms[s].cyc_num as usize == num;
            let total = self.samples_containing(member);
            let leaf = (0..n)
                .filter(|&s| member(s))
                .fold(0u64, |sum, s| sum.saturating_add(m.leaf[s]));
            let c = &mut g.syms[cyc];
            c.child_time = total.saturating_sub(leaf) as f64;
            c.prop_child = c.prop_fract * c.child_time;
        }
        let mut pairs: Vec<(usize, usize)> = m.pairs.keys().copied().collect();
        pairs.sort_unstable();
        for (caller, callee) in pairs {
            if caller != callee
                && !g.arc_index.contains_key(&(caller, callee))
                && filters.arc_kept(caller, callee)
            {
                g.add_arc(caller, callee, 0);
                let a = g.arc_index[&(caller, callee)];
                g.arcs[a].stacks_only = true;
            }
        }
        for arc in &mut g.arcs {
            let pair = m
                .pairs
                .get(&(arc.parent, arc.child))
                .copied()
                .unwrap_or_default();
            let fract = g.syms[arc.parent].prop_fract;
            arc.time = pair.callee_self as f64 * fract;
            arc.child_time = pair.total.saturating_sub(pair.callee_self) as f64 * fract;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(count: u64, syms: &[usize]) -> Stack {
        Stack {
            count,
            flags: 0,
            frames: syms
                .iter()
                .map(|s| Frame {
                    module: Some(0),
                    address: LinkAddress(0),
                    sym: Some(*s),
                })
                .collect(),
        }
    }

    #[test]
    fn recursion_counts_each_function_and_pair_once_per_sample() {
        // main(0) -> f(1) -> f -> f -> g(2), 3 samples; main -> f, 2 samples.
        let stacks = Stacks {
            stacks: vec![stack(3, &[2, 1, 1, 1, 0]), stack(2, &[1, 0])],
            ..Stacks::default()
        };
        let m = stacks.measure(3);
        assert_eq!(m.total, vec![5, 5, 3]);
        assert_eq!(m.leaf, vec![0, 2, 3]);
        assert_eq!(
            m.pairs[&(1, 1)],
            PairSamples {
                total: 3,
                callee_self: 0
            }
        );
        assert_eq!(
            m.pairs[&(0, 1)],
            PairSamples {
                total: 5,
                callee_self: 2
            }
        );
        assert_eq!(
            m.pairs[&(1, 2)],
            PairSamples {
                total: 3,
                callee_self: 3
            }
        );
        assert_eq!(stacks.samples_containing(|s| s == 2), 3);
    }

    #[test]
    fn a_pair_counts_once_per_sample_at_its_outermost_site() {
        // main(0) -> f(1) at 0x10, f -> f at 0x20, f -> f at 0x30: the (f, f) pair once, at 0x20.
        let mut s = stack(3, &[1, 1, 1, 0]);
        for (frame, address) in s.frames.iter_mut().zip([0x40, 0x30, 0x20, 0x10]) {
            frame.address = LinkAddress(address);
        }
        let stacks = Stacks {
            stacks: vec![s],
            ..Stacks::default()
        };
        let site = |caller, callee, address| PairSite {
            caller,
            callee,
            module: 0,
            address: LinkAddress(address),
        };
        let sites = stacks.pair_sites(2);
        assert_eq!(sites.len(), 2, "{sites:?}");
        assert_eq!(sites[&site(0, 1, 0x10)], 3);
        assert_eq!(sites[&site(1, 1, 0x20)], 3);
        let m = stacks.measure(2);
        assert_eq!(m.pairs[&(1, 1)].total, 3);
    }

    #[test]
    fn a_frame_without_symbol_breaks_the_pair_it_is_part_of() {
        let mut s = stack(4, &[2, 1, 0]);
        s.frames[1].sym = None;
        let stacks = Stacks {
            stacks: vec![s],
            ..Stacks::default()
        };
        let m = stacks.measure(3);
        assert_eq!(m.total, vec![4, 0, 4]);
        assert!(m.pairs.is_empty());
    }

    /// A graph of `names` (functions of one module, in this order) with the counted `arcs` (caller, callee,
    /// count) and `hist` samples of self time each, its time propagated gprof's way and then measured
    /// from `stacks`.
    fn measured_graph(
        names: &[&str],
        arcs: &[(usize, usize, u64)],
        hist: &[f64],
        stacks: &Stacks,
    ) -> Graph {
        let mut g = Graph {
            syms: names
                .iter()
                .zip(hist)
                .map(|(name, &hist_time)| crate::gprof::graph::Sym {
                    symbol: crate::elf::symtab::FunctionSymbol {
                        name: (*name).into(),
                        is_func: true,
                        ..Default::default()
                    },
                    display: (*name).into(),
                    hist_time,
                    ..Default::default()
                })
                .collect(),
            nsyms: names.len(),
            ..Graph::default()
        };
        for &(caller, callee, count) in arcs {
            g.syms[callee].ncalls += count;
            g.add_arc(caller, callee, count);
        }
        let filters = Filters::default();
        crate::gprof::callgraph::propagate(&mut g, &filters);
        stacks.apply(&mut g, &filters);
        g
    }

    fn arc(g: &Graph, caller: usize, callee: usize) -> &crate::gprof::graph::CgArc {
        &g.arcs[g.arc_index[&(caller, callee)]]
    }

    #[test]
    fn the_manuals_counter_example_charges_foo_to_the_caller_that_spent_it() {
        // main(0) calls a(1) and b(2); a calls foo(3) 1 000 000 times, b 20 times; every sample of
        // foo's 26 was taken under b.
        let stacks = Stacks {
            stacks: vec![stack(26, &[3, 2, 0]), stack(4, &[1, 0])],
            ..Stacks::default()
        };
        let g = measured_graph(
            &["main", "a", "b", "foo"],
            &[(0, 1, 1), (0, 2, 1), (1, 3, 1_000_000), (2, 3, 20)],
            &[0.0, 4.0, 0.0, 26.0],
            &stacks,
        );
        assert_eq!((arc(&g, 1, 3).time, arc(&g, 1, 3).child_time), (0.0, 0.0));
        assert_eq!((arc(&g, 2, 3).time, arc(&g, 2, 3).child_time), (26.0, 0.0));
        assert_eq!((arc(&g, 0, 2).time, arc(&g, 0, 2).child_time), (0.0, 26.0));
        assert_eq!((arc(&g, 0, 1).time, arc(&g, 0, 1).child_time), (4.0, 0.0));
        let children: Vec<f64> = g.syms.iter().map(|s| s.prop_child).collect();
        assert_eq!(children, vec![30.0, 0.0, 26.0, 0.0]);
        assert_eq!(g.syms[1].child_time, 0.0);
        assert!(g.arcs.iter().all(|a| !a.stacks_only));
    }

    #[test]
    fn an_uncounted_function_gets_its_callers_from_the_stacks() {
        // lib(2) counts no calls; main(0) -> work(1) is counted. Stacks: lib under work 5 times, lib
        // under main directly twice, lib calling itself under work once.
        let stacks = Stacks {
            stacks: vec![
                stack(5, &[2, 1, 0]),
                stack(2, &[2, 0]),
                stack(1, &[2, 2, 1, 0]),
            ],
            ..Stacks::default()
        };
        let g = measured_graph(
            &["main", "work", "lib"],
            &[(0, 1, 3)],
            &[0.0, 0.0, 8.0],
            &stacks,
        );
        let under_work = arc(&g, 1, 2);
        assert!(under_work.stacks_only);
        assert_eq!((under_work.count, under_work.time), (0, 6.0));
        assert_eq!(arc(&g, 0, 2).time, 2.0);
        assert!(!g.arc_index.contains_key(&(2, 2)));
        assert_eq!(g.syms[2].parents.len(), 2);
        assert!(!arc(&g, 0, 1).stacks_only);
        assert_eq!(arc(&g, 0, 1).child_time, 6.0);
        assert_eq!(g.syms[0].prop_child, 8.0);
    }

    #[test]
    fn a_cycle_counts_each_sample_once_with_any_member_on_the_stack() {
        // main(0) -> f(1) <-> g(2), g -> h(3).
        let stacks = Stacks {
            stacks: vec![
                stack(4, &[2, 1, 2, 1, 0]),
                stack(2, &[1, 0]),
                stack(3, &[3, 2, 1, 0]),
            ],
            ..Stacks::default()
        };
        let g = measured_graph(
            &["main", "f", "g", "h"],
            &[(0, 1, 1), (1, 2, 5), (2, 1, 4), (2, 3, 3)],
            &[0.0, 2.0, 4.0, 3.0],
            &stacks,
        );
        assert_eq!(g.num_cycles, 1);
        let cycle = &g.syms[g.cycle(1)];
        assert_eq!((cycle.prop_self, cycle.prop_child), (6.0, 3.0));
        // f is on 9 stacks and the leaf of 2; g on 7, the leaf of 4.
        assert_eq!((g.syms[1].child_time, g.syms[2].child_time), (7.0, 3.0));
        assert_eq!(g.syms[0].child_time, 9.0);
        assert_eq!((arc(&g, 2, 3).time, arc(&g, 2, 3).child_time), (3.0, 0.0));
    }
}
