//! `mslprof export`: the profile in the formats of the tools users already have (callgrind for
//! KCachegrind, pprof, a versioned JSON document, Graphviz DOT/SVG/PNG and per-module GNU gmon.out).
//! Every format is written from the same [`Prepared`] analysis the report uses: symbols, tallied arcs,
//! credited samples and gprof's time propagation are computed once, by [`crate::report::mslprof::analyse`].

pub mod callgrind;
pub mod dot;
pub mod gmon;
pub mod json;
pub mod pprof;

use std::path::PathBuf;

use mslprof_format::GnuTarget;
use mslprof_format::model::Profile;

use crate::input::{Error, Input, Refusal};
use crate::options::Options;
use crate::report::Analysis;

/// A merged profile and its analysis, with time propagated along the call graph.
pub struct Prepared {
    /// The profiles summed (as the report sums them).
    pub profile: Profile,
    /// Per module of `profile`, how many load instances went into it.
    pub instances: Vec<u32>,
    pub analysis: Analysis,
    /// Warnings of the analysis (symbols missing, build-id mismatches, ...).
    pub warnings: Vec<String>,
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
        let mut warnings = Vec::new();
        let opts = Options {
            binary_path: crate::binpath::from_environment(),
            ..Options::default()
        };
        let mut analysis =
            crate::report::mslprof::analyse(&opts, None, &merged.profile, &mut warnings);
        crate::callgraph::assemble(&mut analysis.graph, &analysis.filters);
        Ok(Prepared {
            profile: merged.profile,
            instances: merged.instances,
            analysis,
            warnings,
        })
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

    /// Indices of the real (non-cycle) functions that have samples or calls.
    pub fn active_functions(&self) -> impl Iterator<Item = usize> + '_ {
        let g = &self.analysis.graph;
        (0..g.nsyms).filter(move |&s| {
            let sym = &g.syms[s];
            sym.hist_time > 0.0 || !sym.parents.is_empty() || !sym.children.is_empty()
        })
    }
}
