//! The stages of an analysis, each a function over the previous one's result, shared by the GNU and the
//! mslprof report and by the exports: [`symbols`] (load each module's symbols), [`graph`] (one symbol
//! table and the symspec filters), [`arcs`] (tally the recorded calls), [`samples`] (credit the
//! histograms), [`stacks`] (resolve the sampled call stacks, when the profile has them) and [`render`]
//! (propagate time and print the tables).

pub mod arcs;
pub mod graph;
pub mod render;
pub mod samples;
pub mod stacks;
pub mod symbols;
