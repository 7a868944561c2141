//! Per-module GNU gmon.out files (`gmon.NAME.out`, one per profiled module with a histogram) that GNU
//! gprof reads together with the module's file. The profiler's own modules are left out unless asked
//! for, and so are modules without a symbol table (gprof cannot read them).
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

/// What [`write`] did for one module.
pub enum Written {
    /// `(module path, file written)`.
    File(String, PathBuf),
    /// A module gprof cannot read: `(module path, why)`; no file written.
    Unreadable(String, String),
}

/// Why gprof cannot read the ELF file at `path`, if it cannot: gprof takes functions from `.symtab` only.
fn unreadable_by_gprof(path: &Path) -> Option<String> {
    use object::Object;
    let data = match crate::sys::map_file(path) {
        Ok(d) => d,
        Err(e) => return Some(e.to_string()),
    };
    match object::File::parse(&*data) {
        Ok(f) if f.symbols().next().is_none() => {
            Some("it has no symbol table (stripped), so gprof says \"has no symbols\"".into())
        }
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Write one GNU gmon.out per profiled module with a histogram into `outdir`, except the profiler's own
/// modules (unless `profiler_modules`) and modules gprof cannot read.
pub fn write(p: &Prepared, outdir: &Path, profiler_modules: bool) -> Result<Vec<Written>, Error> {
    let merged = &p.profile;
    // The folder named is made if missing, but never its parents: a typo must not leave a tree of
    // folders behind.
    if !outdir.is_dir() {
        std::fs::create_dir(outdir).map_err(|e| Error::io(outdir, e))?;
    }
    let mut written = Vec::new();
    for (i, m) in merged.modules.iter().enumerate() {
        if m.flags & module_flags::PROFILED == 0
            || m.histogram.is_none()
            || m.path.is_empty()
            || (p.is_profiler(i) && !profiler_modules)
        {
            continue;
        }
        let file = &p.analysis.graph.modules[i].path;
        if let Some(why) = unreadable_by_gprof(Path::new(file)) {
            written.push(Written::Unreadable(file.clone(), why));
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
            stacks: None,
        };
        let name = String::from_utf8_lossy(&m.name).into_owned();
        let out = outdir.join(format!("gmon.{name}.out"));
        let mut buf = Vec::new();
        mslprof_format::write_gnu(&single, GnuTarget::default(), &mut buf)
            .map_err(|e| Error::io(&out, e))?;
        std::fs::write(&out, buf).map_err(|e| Error::io(&out, e))?;
        written.push(Written::File(
            String::from_utf8_lossy(&m.path).into_owned(),
            out,
        ));
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
