//! mslprof: gprof-compatible reports over multi-module profiles.

fn main() {}
