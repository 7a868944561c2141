//! The whole analysis, from profile files and module files to the printed report: GNU input gives exactly
//! GNU gprof's report, mslprof input the multi-module one. Both are short adapters ([`gnu`], [`mslprof`])
//! over the same stages ([`crate::stages`]): load symbols, build the graph, tally arcs, assign samples,
//! render.

pub mod gnu;
pub mod mslprof;
mod outcome;
mod rate;

use std::path::{Path, PathBuf};

use mslprof_format::GnuTarget;

use crate::input::{Error, Files, elf_target};
use crate::options::Options;
use crate::output::Out;

pub use mslprof::Analysis;
pub use outcome::Outcome;

/// Read the profiles and run the right analysis: mslprof profiles need no executable (`exe` replaces the
/// main program's recorded path); GNU and BSD gmon.out are read against `exe` (default `a.out`).
pub fn analyse(
    opts: &Options,
    exe: Option<&Path>,
    profiles: &[PathBuf],
    out: &mut Out,
) -> Result<Outcome, Error> {
    let files = Files::open(profiles, exe, opts.file_format)?;
    if files.mslprof {
        let inputs = files.decode(GnuTarget::default(), opts.file_format, opts.file_info)?;
        mslprof::run(opts, exe, &inputs, out)
    } else {
        let exe = exe.unwrap_or(Path::new("a.out"));
        let target = elf_target(exe).unwrap_or_default();
        let (format, file_info) = (opts.file_format, opts.file_info);
        gnu::run(
            opts,
            exe,
            move || files.decode(target, format, file_info),
            out,
        )
    }
}
