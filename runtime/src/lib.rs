//! libmslprof.so: the sampler, the mcount family and the dump at exit.

pub mod arcs;
mod sys;
