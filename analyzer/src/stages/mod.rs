//! The stages of an analysis, each a function over the previous one's result, shared by the GNU and the
//! mslprof report and by the exports: [`symbols`] (load each module's symbols), [`graph`] (one symbol
//! table and the symspec filters), [`arcs`] (tally the recorded calls), [`samples`] (credit the
//! histograms) and [`render`] (propagate time and print the tables).

pub mod arcs;
pub mod graph;
pub mod render;
pub mod samples;
pub mod symbols;
