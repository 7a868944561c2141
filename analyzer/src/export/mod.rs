//! `mslprof export`: the profile in the formats of the tools users already have (callgrind for
//! KCachegrind, pprof, a versioned JSON document, Graphviz DOT/SVG/PNG and per-module GNU gmon.out).
//! Every format is written from the same [`Prepared`] analysis the report uses: symbols, tallied arcs,
//! credited samples and gprof's time propagation are computed once, by [`crate::report::mslprof::analyse`].

pub mod callgrind;
pub mod code;
pub mod dot;
pub mod flamegraph;
pub mod folded;
pub mod gmon;
pub mod json;
pub mod pprof;

use std::path::{Path, PathBuf};

use mslprof_format::GnuTarget;
use mslprof_format::LinkAddress;
use mslprof_format::model::{Profile, UNKNOWN_KEY};

use crate::input::{Error, Input, Refusal};
use crate::options::Options;
use crate::report::Analysis;
use crate::stages::stacks::{Frame, Measured, Stacks};
use code::{ModuleCode, Wanted};

/// A recorded call as the exports place it: at the call instruction in the caller's module.
#[derive(Clone, Copy, Debug)]
pub struct CallSite {
    /// The calling function and its module.
    pub caller: usize,
    pub caller_module: usize,
    /// The link-time address of the call instruction (the return address where it cannot be decoded).
    pub site: u64,
    pub callee: usize,
    pub count: u64,
}

/// Samples of one histogram bucket as the exports place them: at its first whole instruction.
#[derive(Clone, Copy, Debug)]
pub struct Cost {
    pub module: usize,
    pub function: usize,
    pub address: u64,
    pub samples: u64,
}

/// Functions longer than this are rows that stand for a whole module (`[mslprof_overhead]`), not code
/// to decode.
const MAX_DECODED_FUNCTION: u64 = 1 << 24;

/// A merged profile and its analysis, with time propagated along the call graph.
pub struct Prepared {
    /// The profiles summed (as the report sums them).
    pub profile: Profile,
    /// Per module of `profile`, how many load instances went into it.
    pub instances: Vec<u32>,
    pub analysis: Analysis,
    /// Warnings of the analysis (symbols missing, build-id mismatches, ...).
    pub warnings: Vec<String>,
    /// Samples per function and per caller→callee pair measured from the sampled stacks, when the profile
    /// has them.
    pub measured: Option<Measured>,
    /// The modules' code and source positions, read when first asked for ([`Prepared::code`]).
    code: std::sync::OnceLock<Vec<ModuleCode>>,
}

impl Prepared {
    /// Read, sum and analyse mslprof profiles.
    pub fn load(paths: &[PathBuf]) -> Result<Prepared, Error> {
        let mut inputs = Vec::new();
        for p in paths {
            let bytes = std::fs::read(p).map_err(|e| Error::io(p, e))?;
            if mslprof_format::detect(&bytes) != Some(mslprof_format::FileFormat::Mslprof) {
                return Err(Error::refused(p, Refusal::NotMslprofForExport));
            }
            let profile = mslprof_format::read(&bytes, GnuTarget::default()).map_err(|source| {
                Error::Format {
                    path: p.clone(),
                    source,
                }
            })?;
            inputs.push(Input {
                path: p.clone(),
                profile,
                records: None,
            });
        }
        let merged = crate::merge::merge(&inputs, false)?;
        Ok(Prepared::new(merged))
    }

    /// Analyse profiles already summed by [`crate::merge::merge`].
    pub fn new(merged: crate::merge::Merged) -> Prepared {
        let mut warnings = Vec::new();
        let opts = Options {
            binary_path: crate::elf::binpath::from_environment(),
            every_source: true,
            ..Options::default()
        };
        let mut analysis =
            crate::report::mslprof::analyse(&opts, None, &merged.profile, &mut warnings);
        crate::gprof::callgraph::assemble(&mut analysis.graph, &analysis.filters);
        let measured = analysis
            .stacks
            .as_ref()
            .map(|s| s.measure(analysis.graph.nsyms));
        Prepared {
            profile: merged.profile,
            instances: merged.instances,
            analysis,
            warnings,
            measured,
            code: std::sync::OnceLock::new(),
        }
    }

    /// Samples credited to function `s` itself.
    pub fn self_samples(&self, s: usize) -> f64 {
        self.analysis.graph.syms[s].hist_time
    }

    /// gprof's propagated estimate of the samples spent in function `s` and its callees.
    pub fn total_samples(&self, s: usize) -> f64 {
        let sym = &self.analysis.graph.syms[s];
        sym.hist_time + sym.child_time
    }

    /// The sampled stacks, resolved, when the profile has them.
    pub fn stacks(&self) -> Option<&Stacks> {
        self.analysis.stacks.as_ref()
    }

    /// Samples as seconds of CPU time.
    pub fn seconds(&self, samples: u64) -> f64 {
        samples as f64 * self.period_ns() as f64 / 1e9
    }

    /// Where a stack's frame is written: the sampled instruction for the leaf (`depth` 0), the call
    /// instruction for a caller (found from its return address, the frame's address + 1, as
    /// [`ModuleCode::call_site`] does for recorded calls).
    pub fn frame_address(&self, code: &[ModuleCode], depth: usize, frame: &Frame) -> u64 {
        match frame.module {
            Some(m) if depth > 0 => code[m].call_site(frame.address.0.saturating_add(1)),
            _ => frame.address.0,
        }
    }

    /// All samples credited to functions.
    pub fn function_samples(&self) -> f64 {
        self.analysis.totals.total_time
    }

    /// Hex of module `m`'s GNU build-id (empty when it has none).
    pub fn build_id(&self, m: usize) -> String {
        self.profile.modules[m]
            .build_id
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The width in bytes of module `m`'s histogram buckets (0 without a histogram).
    pub fn bucket_width(&self, m: usize) -> u64 {
        self.profile.modules[m]
            .histogram
            .as_ref()
            .and_then(|h| h.ranges.first())
            .map_or(0, |r| (r.end - r.start) / r.buckets.len().max(1))
    }

    /// The real sampling period in nanoseconds.
    pub fn period_ns(&self) -> u64 {
        let h = &self.profile.header;
        if h.sample_period_ns > 0 {
            h.sample_period_ns
        } else {
            1_000_000_000 / u64::from(h.hz.max(1))
        }
    }

    /// The call count of function `s`, or `None` where calls were not counted: a function without
    /// calls whose code does not count them (not built with -pg: a count there is one made at the PLT),
    /// a PLT stub, or a row that stands for more than a function.
    pub fn calls(&self, s: usize) -> Option<u64> {
        let sym = &self.analysis.graph.syms[s];
        let calls = sym.ncalls + sym.self_calls;
        if calls > 0 {
            return Some(calls);
        }
        let module = &self.analysis.graph.modules[sym.module];
        let counted = module.profiled
            && !module.plt_counted
            && !sym.symbol.synthetic
            && !sym.symbol.name.ends_with("@plt")
            && self.code()[sym.module]
                .counts_calls(sym.symbol.addr.0)
                .unwrap_or(false);
        counted.then_some(0)
    }

    /// Whether module `m` is the profiler's own (`libmslprof.so`, its PLT-counting audit module).
    pub fn is_profiler(&self, m: usize) -> bool {
        let path = String::from_utf8_lossy(&self.profile.modules[m].path);
        let name = path.rsplit('/').next().unwrap_or("");
        name.starts_with("libmslprof.so") || name.starts_with("libmslprof_audit.so")
    }

    /// The histogram buckets with samples, each in `(start, end)` of module `m`.
    fn buckets(&self, m: usize) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.profile.modules[m]
            .histogram
            .iter()
            .flat_map(|h| &h.ranges)
            .flat_map(|r| {
                let width = (r.end - r.start) / r.buckets.len().max(1);
                r.buckets.nonzero().map(move |(i, count)| {
                    (
                        (r.start + i * width).0,
                        (r.start + (i + 1) * width).0,
                        u64::from(count),
                    )
                })
            })
    }

    /// The recorded arcs whose caller is a known function, with the module of the caller and the
    /// return address: `(caller module, caller, return address, callee, count)`.
    fn raw_calls(&self) -> Vec<(usize, usize, u64, usize, u64)> {
        let g = &self.analysis.graph;
        let mut out = Vec::new();
        for (m, module) in self.profile.modules.iter().enumerate() {
            for a in &module.arcs {
                if a.caller_key == UNKNOWN_KEY {
                    continue;
                }
                let cm = a.caller_key as usize - 1;
                if let (Some(callee), Some(caller)) = (
                    g.lookup(m, a.callee_address),
                    g.lookup(cm, a.caller_address),
                ) {
                    out.push((cm, caller, a.caller_address.0, callee, a.count));
                }
            }
        }
        out
    }

    /// Decoded code and source positions of every module, for what the exports write.
    pub fn code(&self) -> &[ModuleCode] {
        self.code.get_or_init(|| self.read_code())
    }

    fn read_code(&self) -> Vec<ModuleCode> {
        let g = &self.analysis.graph;
        let mut wanted: Vec<Wanted> = (0..g.modules.len()).map(|_| Wanted::default()).collect();
        for s in self.active_functions() {
            let sym = &g.syms[s].symbol;
            let end = sym.end_addr.0.saturating_add(1);
            if end.saturating_sub(sym.addr.0) <= MAX_DECODED_FUNCTION {
                let w = &mut wanted[g.syms[s].module];
                w.functions.push((sym.addr.0, end));
                w.entries.push(sym.addr.0);
            }
        }
        for (m, w) in wanted.iter_mut().enumerate() {
            w.buckets = self
                .buckets(m)
                .map(|(start, end, _)| (start, end))
                .collect();
        }
        for (cm, _, ret, _, _) in self.raw_calls() {
            wanted[cm].returns.push(ret);
        }
        for stack in self.stacks().iter().flat_map(|s| &s.stacks) {
            for (depth, f) in stack.frames.iter().enumerate() {
                match f.module {
                    Some(m) if depth == 0 => wanted[m].entries.push(f.address.0),
                    Some(m) => wanted[m].returns.push(f.address.0.saturating_add(1)),
                    None => {}
                }
            }
        }
        wanted
            .iter()
            .enumerate()
            .map(|(m, w)| {
                if w.functions.is_empty()
                    && w.buckets.is_empty()
                    && w.returns.is_empty()
                    && w.entries.is_empty()
                {
                    ModuleCode::default()
                } else {
                    ModuleCode::load(Path::new(&g.modules[m].path), w)
                }
            })
            .collect()
    }

    /// The samples of every bucket that falls in a known function, at its first whole instruction.
    pub fn costs(&self, code: &[ModuleCode]) -> Vec<Cost> {
        let g = &self.analysis.graph;
        let mut out = Vec::new();
        for (m, module_code) in code.iter().enumerate() {
            for (start, end, samples) in self.buckets(m) {
                let address = module_code.cost_address(start, end);
                if let Some(function) = g.lookup(m, LinkAddress(address)) {
                    out.push(Cost {
                        module: m,
                        function,
                        address,
                        samples,
                    });
                }
            }
        }
        out
    }

    /// The recorded calls from known functions, at their call instructions (merged per site and callee).
    pub fn call_sites(&self, code: &[ModuleCode]) -> Vec<CallSite> {
        let mut merged: std::collections::BTreeMap<(usize, u64, usize), CallSite> =
            Default::default();
        for (cm, caller, ret, callee, count) in self.raw_calls() {
            let site = code[cm].call_site(ret);
            merged
                .entry((caller, site, callee))
                .or_insert(CallSite {
                    caller,
                    caller_module: cm,
                    site,
                    callee,
                    count: 0,
                })
                .count += count;
        }
        merged.into_values().collect()
    }

    /// Indices of the real (non-cycle) functions that have samples or calls, or are on a sampled stack.
    pub fn active_functions(&self) -> impl Iterator<Item = usize> + '_ {
        let g = &self.analysis.graph;
        (0..g.nsyms).filter(move |&s| {
            let sym = &g.syms[s];
            sym.hist_time > 0.0
                || !sym.parents.is_empty()
                || !sym.children.is_empty()
                || self.measured.as_ref().is_some_and(|m| m.total[s] > 0)
        })
    }
}
