//! libmslprof.so: the sampler, the mcount family and the dump at exit.
//!
//! See runtime/README.md for the environment variables and how the runtime gets into a process.

pub mod arcs;
pub mod glibc_gmon;
pub mod histogram;
pub mod mcount;
pub mod modules;
pub mod selection;
#[allow(dead_code, unused_imports)] // filled in by the sampler and the dump (next commits)
mod sys;
