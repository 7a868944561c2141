//! Switches glibc's own single-module gmon off when the runtime is present.
//!
//! A program linked with `gcc -pg` gets `gcrt1.o`, whose start-up code calls `__monstartup` (which
//! allocates glibc's tables and starts `profil` sampling) and registers `_mcleanup` with `atexit`
//! (which writes glibc's `gmon.out`). These calls go through the dynamic linker, so the definitions
//! here, in a preloaded `libmslprof.so` or one linked before libc, take their place: glibc then
//! neither samples, counts, nor writes a file, and the runtime's dump is the only `gmon.out`.
//! `moncontrol(0)` / `moncontrol(1)` keep their classic meaning: pause and resume profiling (call
//! counting and sampling).
//!
//! Programs linked statically with `-pg` (`gcc -pg -static`) contain glibc's gmon and `mcount`
//! themselves and load no shared library: a preload cannot reach them, and they keep writing
//! glibc's `gmon.out`.

use core::ffi::{c_int, c_ulong};

/// glibc: `void __monstartup(u_long lowpc, u_long highpc)`. The runtime starts from its own
/// constructor and covers every module, so there is nothing to set up here.
#[unsafe(no_mangle)]
pub extern "C" fn __monstartup(_lowpc: c_ulong, _highpc: c_ulong) {}

/// glibc: `void monstartup(u_long lowpc, u_long highpc)`, the public name of [`__monstartup`].
#[unsafe(no_mangle)]
pub extern "C" fn monstartup(_lowpc: c_ulong, _highpc: c_ulong) {}

/// glibc: `void _mcleanup(void)`, registered with `atexit` by `gcrt1.o` to write glibc's
/// `gmon.out`. The runtime writes its own dump at exit, so this does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn _mcleanup() {}

/// glibc: `void moncontrol(int mode)`: 0 pauses profiling (call counting and sampling), anything
/// else resumes it.
#[unsafe(no_mangle)]
pub extern "C" fn moncontrol(mode: c_int) {
    let pause = mode == 0;
    crate::mcount::set_paused(pause);
    if pause {
        crate::sampler::stop_and_quiesce();
    } else if crate::sampler::is_started() {
        crate::sampler::resume();
    }
}
