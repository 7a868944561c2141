//! Switches glibc's own single-module gmon off when the runtime is present.
//!
//! A program linked with `gcc -pg` gets `gcrt1.o`, whose start-up code calls `__monstartup` (which
//! allocates glibc's tables and starts `profil` sampling) and registers `_mcleanup` with `atexit`
//! (which writes glibc's `gmon.out`). These calls go through the dynamic linker, so the definitions
//! (exported in `exports.rs`), in a preloaded `libmslprof.so` or one linked before libc, take their place: glibc then
//! neither samples, counts, nor writes a file, and the runtime's dump is the only `gmon.out`.
//! `moncontrol(0)` / `moncontrol(1)` keep their classic meaning: pause and resume profiling (call
//! counting and sampling).
//!
//! Programs linked statically with `-pg` (`gcc -pg -static`) contain glibc's gmon and `mcount`
//! themselves and load no shared library: a preload cannot reach them, and they keep writing
//! glibc's `gmon.out`.

use crate::{mcount, sampler};

/// `moncontrol(mode)`: pauses (`resume` false) or resumes call counting and sampling.
pub fn moncontrol(resume: bool) {
    mcount::set_paused(!resume);
    if !resume {
        sampler::stop_and_quiesce();
    } else if sampler::is_started() {
        sampler::resume();
    }
}
