//! mslprof's analyzer: reads GNU and mslprof profiles, maps each module's samples and arcs to that
//! module's ELF symbols and prints gprof-compatible reports.

pub mod annotate;
pub mod arcs;
pub mod binpath;
pub mod blurbs;
pub mod bounds;
pub mod callgraph;
pub mod cformat;
pub mod cputime;
pub mod cycles;
pub mod execcounts;
pub mod export;
pub mod family;
pub mod fileinfo;
pub mod filemap;
pub mod flat;
pub mod graph;
pub mod histogram;
pub mod input;
pub mod lines;
pub mod merge;
pub mod modtable;
pub mod nearest_function;
pub mod options;
pub mod ordering;
pub mod output;
pub mod qsort;
pub mod report;
pub mod stages;
pub mod staticcalls;
pub mod style;
pub mod summary;
pub mod symbols;
pub mod symspec;
pub mod symtab;
pub mod sys;
