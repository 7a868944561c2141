//! Per-module GNU gmon.out files (`gmon.NAME.out`, one per profiled module with a histogram) that GNU
//! gprof reads together with the module's file.
//!
//! A call into the module from another module (or from an unknown caller) has no caller address that
//! gprof could find in this module's symbols, and gprof drops such arcs with their counts. So each is
//! written as a call from the module's `_init` (the ELF init stub gcc links into every executable and
//! shared library; it is not compiled with `-pg` and calls nothing that is counted), and gprof's counts
//! for the module's functions are the same as mslprof's. A module without `_init` uses its
//! lowest-addressed function instead.

use mslprof_format::LinkAddress;
use std::path::{Path, PathBuf};

use mslprof_format::GnuTarget;
use mslprof_format::model::{Profile, module_flags};

use super::Prepared;
use crate::input::Error;

/// Write one GNU gmon.out per profiled module into `outdir`; returns `(module path, file written)`.
pub fn write(p: &Prepared, outdir: &Path) -> Result<Vec<(String, PathBuf)>, Error> {
    let merged = &p.profile;
    // The folder named is made if missing, but never its parents: a typo must not leave a tree of
    // folders behind.
    if !outdir.is_dir() {
        std::fs::create_dir(outdir).map_err(|e| Error::io(outdir, e))?;
    }
    let mut written = Vec::new();
    for (i, m) in merged.modules.iter().enumerate() {
        if m.flags & module_flags::PROFILED == 0 || m.histogram.is_none() || m.path.is_empty() {
            continue;
        }
        let mut module = m.clone();
        let key = module.key;
        module.key = 0;
        module.flags |= module_flags::MAIN_PROGRAM;
        let outside = outside_caller(p, i);
        for a in &mut module.arcs {
            if a.caller_key == key {
                a.caller_key = 0;
            } else if let Some(addr) = outside {
                a.caller_key = 0;
                a.caller_address = addr;
            }
        }
        let single = Profile {
            format: merged.format,
            header: merged.header.clone(),
            modules: vec![module],
        };
        let name = String::from_utf8_lossy(&m.name).into_owned();
        let out = outdir.join(format!("gmon.{name}.out"));
        let mut buf = Vec::new();
        mslprof_format::write_gnu(&single, GnuTarget::default(), &mut buf)
            .map_err(|e| Error::io(&out, e))?;
        std::fs::write(&out, buf).map_err(|e| Error::io(&out, e))?;
        written.push((String::from_utf8_lossy(&m.path).into_owned(), out));
    }
    Ok(written)
}

/// The link-time address that stands for every caller outside module `m`: its `_init`, else its first
/// function (`None` when its symbols are unknown).
fn outside_caller(p: &Prepared, m: usize) -> Option<LinkAddress> {
    let g = &p.analysis.graph;
    let syms = &g.syms[g.modules.get(m)?.syms.clone()];
    syms.iter()
        .find(|s| s.symbol.name == "_init")
        .or_else(|| syms.iter().find(|s| s.symbol.is_func))
        .map(|s| s.symbol.addr)
}
