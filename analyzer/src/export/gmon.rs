//! Per-module GNU gmon.out files (`gmon.NAME.out`, one per profiled module with a histogram) that GNU
//! gprof reads together with the module's file.

use std::path::{Path, PathBuf};

use mslprof_format::GnuTarget;
use mslprof_format::model::{Profile, module_flags};

use super::Prepared;

/// Write one GNU gmon.out per profiled module into `outdir`; returns `(module path, file written)`.
pub fn write(p: &Prepared, outdir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let merged = &p.profile;
    std::fs::create_dir_all(outdir).map_err(|e| format!("{}: {e}", outdir.display()))?;
    let mut written = Vec::new();
    for m in &merged.modules {
        if m.flags & module_flags::PROFILED == 0 || m.histogram.is_none() || m.path.is_empty() {
            continue;
        }
        let mut module = m.clone();
        // Arcs from other modules have no address in this one: GNU gprof shows them as spontaneous.
        let key = module.key;
        module.key = 0;
        module.flags |= module_flags::MAIN_PROGRAM;
        for a in &mut module.arcs {
            if a.caller_key == key {
                a.caller_key = 0;
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
            .map_err(|e| format!("{}: {e}", out.display()))?;
        std::fs::write(&out, buf).map_err(|e| format!("{}: {e}", out.display()))?;
        written.push((String::from_utf8_lossy(&m.path).into_owned(), out));
    }
    Ok(written)
}
