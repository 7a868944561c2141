//! gprof's analyses and their text: the call-graph model (`graph`), symspecs, histograms and arcs
//! as gprof assigns them, cycles, the flat profile, the call graph, orderings, annotated source,
//! execution counts, the static call graph, and gprof's formatting (`cformat`, `style`, `blurbs`).
//! Uses `elf`, `input`, `output`, `qsort` and `cputime`; never `stages`, `report` or `export`.

pub mod annotate;
pub mod arcs;
pub mod blurbs;
pub mod callgraph;
pub mod cformat;
pub mod cycles;
pub mod execcounts;
pub mod fileinfo;
pub mod flat;
pub mod graph;
pub mod histogram;
pub mod ordering;
pub mod staticcalls;
pub mod style;
pub mod summary;
pub mod symspec;
