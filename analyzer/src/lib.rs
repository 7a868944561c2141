//! mslprof's analyzer: reads GNU and mslprof profiles, maps each module's samples and arcs to that
//! module's ELF symbols and prints gprof-compatible reports.
//!
//! The folders: `elf/` reads the profiled binaries (symbols, DWARF lines, where a module's file is found);
//! `gprof/` holds gprof's analyses and their text; `stages/` is the pipeline from a profile to a report;
//! `report/` the report of a GNU and of an mslprof profile; `export/` the other formats. The files at this
//! level serve several of them: reading and summing profiles (`input`, `merge`), the options, the output
//! buffer, glibc's `qsort` (for gprof's orderings), the module table, the progress line of long work. The `mslprof` binary's command line is
//! `cli/` (not part of this library).

pub mod cputime;
pub mod elf;
pub mod export;
pub mod family;
pub mod gprof;
pub mod input;
pub mod merge;
pub mod modtable;
pub mod options;
pub mod output;
pub mod progress;
pub mod qsort;
pub mod report;
pub mod stages;
pub mod sys;
